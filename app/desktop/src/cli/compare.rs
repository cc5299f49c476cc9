//! `mergescope compare`: every installed method (or those named) on a benchmark, written as a
//! Markdown and a CSV table of per-task, average and normalised test accuracy; in this process
//! (`--executor local`) or as a grid of cells on Slurm (`--executor slurm`: each λ candidate and
//! each method's final merge one array task, gathered into the same tables).

use super::inputs::ModelArgs;
use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::loader::Plugin;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::Benchmark;
use mergescope_lab::demo::resolve_benchmark;
use mergescope_lab::evaluate::suite_models;
use mergescope_lab::evaluator::References;
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_studies::compare::{
    CompareConfig, CompareInputs, CompareTable, compare, default_lambda_grid, leave_out, leave_out_one_expert,
};
use mergescope_studies::grid::compare::{CompareCell, CompareJob, CompareModels, CompareOnSlurm, compare_on_slurm};
use mergescope_studies::grid::{ExecutorKind, GridJob, JOB_FILE};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args, Debug)]
#[command(mut_arg("executor", |a| a.help(
    "Where the merges run: `local` (this process, one after another) or `slurm` (one Slurm array job, a task per λ candidate and per final merge; see docs/slurm.md)"
)))]
pub struct CompareArgs {
    /// Which models, and the tasks they are scored on.
    #[command(flatten)]
    pub models: ModelArgs,
    /// Only these methods (plugin ids, comma-separated), in this order; default: every
    /// installed method.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub methods: Option<Vec<String>>,
    /// λ values searched on calibration data for methods with a `lambda` parameter
    /// (comma-separated; default 0.1, 0.2, …, 2.0 within each method's range; when 2.0 is the
    /// best, continued by 0.1 until three points above the best did not beat it, at most 20).
    /// A grid given here is tried as given (unless --extend-lambda). `none` keeps every
    /// method's default λ.
    #[arg(long, value_delimiter = ',', value_name = "L1,L2")]
    pub lambda_grid: Option<Vec<String>>,
    /// Continue a --lambda-grid above its top as the default grid is: when its best λ is its
    /// largest, by its top spacing until three points above the best did not beat it.
    #[arg(long)]
    pub extend_lambda: bool,
    /// Folder for the merged checkpoints and the tables.
    #[arg(long, default_value = "compare", value_name = "DIR")]
    pub out_dir: PathBuf,
    /// Replace checkpoints and tables left in --out-dir by an earlier run.
    #[arg(long)]
    pub overwrite: bool,
    /// Seed of every merge.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// cpu, cuda or metal.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Where the merges run, and how (its --executor help is this command's, above).
    #[command(flatten)]
    pub run: super::sweep_slurm::GridRunArgs,
}

impl CompareArgs {
    /// Whether λ searches go on above their grid: always for the default grid, for a given
    /// one with --extend-lambda.
    fn extends_lambda_search(&self) -> bool {
        self.lambda_grid.is_none() || self.extend_lambda
    }
}

fn grid(args: &CompareArgs) -> anyhow::Result<Vec<f64>> {
    match &args.lambda_grid {
        None => Ok(default_lambda_grid()),
        Some(v) if v.len() == 1 && v[0].trim() == "none" => Ok(Vec::new()),
        Some(v) => {
            v.iter()
                .map(|s| {
                    s.trim().parse::<f64>().ok().filter(|x| x.is_finite()).with_context(|| {
                        format!("--lambda-grid: '{s}' is not a number (write e.g. 0.1,0.3,0.5 or none)")
                    })
                })
                .collect()
        }
    }
}

/// The comparison's settings: the output folder, the λ grid searched, the seed.
fn config(args: &CompareArgs, lambda_grid: Vec<f64>) -> CompareConfig {
    CompareConfig {
        out_dir: args.out_dir.clone(),
        overwrite: args.overwrite,
        lambda_grid,
        extend_lambda: args.extends_lambda_search(),
        seed: args.seed,
    }
}

pub fn run(plugin_dirs: &[PathBuf], args: CompareArgs) -> anyhow::Result<ExitCode> {
    let executor = args.run.executor(&[])?;
    let arch = args.models.arch()?;
    let lambda_grid = grid(&args)?;
    let device_choice = DeviceChoice::parse(&args.device)
        .with_context(|| format!("--device '{}': use cpu, cuda or metal", args.device))?;
    let registry = super::registry(plugin_dirs)?;
    let chosen: Vec<Arc<Plugin>> = match &args.methods {
        Some(ids) => ids
            .iter()
            .map(|id| registry.find(id.trim()).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?,
        None => registry.plugins.clone(),
    };
    let suite = if is_suite_path(&args.models.benchmark) {
        Some(Suite::load(Path::new(&args.models.benchmark))?)
    } else {
        if args.models.base.is_some() {
            bail!("--base/--expert go with a suite (--benchmark suite.toml); a demo benchmark brings its own models");
        }
        None
    };
    let mut plugins: Vec<&Plugin> = chosen.iter().map(|p| &**p).collect();
    if let Some(why) = suite.as_ref().and_then(Suite::model_level_unavailable)
        && args.methods.is_none()
        && let Some(note) = leave_out(
            &mut plugins,
            Plugin::is_model_level,
            &format!("model-level methods: {why}"),
        )
    {
        eprintln!("{note}");
    }
    if plugins.is_empty() {
        bail!("no method plugins found; see `mergescope plugins list`");
    }
    let md_path = args.out_dir.join("results.md");
    let csv_path = args.out_dir.join("results.csv");
    let workdir = args
        .run
        .slurm
        .workdir
        .clone()
        .unwrap_or_else(|| args.out_dir.join("slurm"));
    // A comparison on Slurm run again resumes: its tables are rewritten with every cell.
    let resuming = executor == ExecutorKind::Slurm && workdir.join(JOB_FILE).exists();
    for p in [&md_path, &csv_path] {
        if p.exists() && !args.overwrite && !resuming {
            bail!(
                "'{}' exists from an earlier comparison; pass --overwrite to replace it or choose another --out-dir",
                p.display()
            );
        }
    }
    let (device, note) = open_device(device_choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let cancel = super::cancel_on_ctrl_c();
    if executor == ExecutorKind::Slurm {
        let models = match &suite {
            Some(suite) => CompareModels::Suite {
                suite,
                base: args.models.base.as_deref(),
                experts: &args.models.experts,
            },
            None => CompareModels::Demo {
                benchmark: &args.models.benchmark,
                arch,
            },
        };
        let slurm = args.run.slurm.settings();
        let run = CompareOnSlurm {
            plugins,
            named: args.methods.is_some(),
            models,
            config: config(&args, lambda_grid),
            plugin_dirs,
            device: &args.device,
            workdir,
            resuming,
            slurm: &slurm,
        };
        let shown = super::sweep_slurm::shown(args.run.quiet);
        let Some(ran) = compare_on_slurm(run, &device, &shown, cancel)? else {
            return Ok(ExitCode::SUCCESS);
        };
        let grid = &ran.outcome.grid;
        if !grid.cancelled {
            match &ran.outcome.table {
                Some(table) => write_tables(table, &args.out_dir, ran.calibration)?,
                None => eprintln!("no table: the pretrained cell (0) has no result"),
            }
        }
        return Ok(ExitCode::from(grid.exit_status()));
    }
    let bench;
    let tasks;
    let inputs = match &suite {
        Some(suite) => {
            let m = suite_models(suite, args.models.base.as_deref(), &args.models.experts)?;
            CompareInputs::of_suite(suite, m.base, m.experts, &device, cancel)?
        }
        None => {
            bench = resolve_benchmark(&args.models.benchmark, Some(arch))?;
            tasks = benchmark_tasks(None)?;
            CompareInputs::of_benchmark(&bench, &tasks, &device)?
        }
    };
    if args.methods.is_none()
        && let Some(note) = leave_out_one_expert(&mut plugins, inputs.experts.len())
    {
        eprintln!("{note}");
    }
    if inputs.calibration.is_none() && !lambda_grid.is_empty() {
        eprintln!(
            "note: {} has no calibration data (give every [[task]] a calibration file), so λ keeps each method's default",
            inputs.kind
        );
    }
    let opts = ExecOptions {
        device,
        ..ExecOptions::default()
    };
    let cfg = config(&args, lambda_grid);
    let bar = super::progress_bar(args.run.quiet);
    bar.set_length(plugins.len() as u64);
    let ids: Vec<String> = plugins.iter().map(|p| p.id().to_owned()).collect();
    let progress = |msg: &str| {
        if let Some(i) = ids.iter().position(|id| msg.starts_with(&format!("{id}:"))) {
            bar.set_position(i as u64);
        }
        bar.set_message(msg.to_owned());
    };
    let table = compare(&plugins, &inputs, &cfg, &opts, &progress, cancel);
    bar.finish_and_clear();
    let table = table?;
    write_tables(&table, &args.out_dir, inputs.calibration.is_some())?;
    Ok(if table.rows.iter().any(|r| r.outcome.is_err()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Prints each method's line and the table, and writes `results.md`, `results.csv` and (when λ
/// was searched) `lambda_search.csv` into `out_dir` (atomically).
fn write_tables(table: &CompareTable, out_dir: &Path, calibration: bool) -> anyhow::Result<()> {
    let md_path = out_dir.join("results.md");
    let csv_path = out_dir.join("results.csv");
    let lambda_path = out_dir.join("lambda_search.csv");
    for r in &table.rows {
        match &r.outcome {
            Ok(_) => eprintln!("{}: {:.1} s -> {}", r.id, r.seconds, r.output.display()),
            Err(e) => eprintln!("{}: failed: {e}", r.id),
        }
    }
    let markdown = table.markdown();
    write_atomic(&md_path, &markdown)?;
    write_atomic(&csv_path, &table.csv())?;
    if table.rows.iter().any(|r| r.lambda.is_some()) {
        write_atomic(&lambda_path, &table.lambda_csv())?;
        eprintln!("λ searches (calibration accuracy per λ): {}", lambda_path.display());
    }
    println!(
        "{} on '{}' (test data; {})\n",
        table.arch,
        table.benchmark.display(),
        if calibration {
            "λ chosen on calibration data"
        } else {
            "default λ"
        }
    );
    println!("{markdown}");
    eprintln!("tables: {} and {}", md_path.display(), csv_path.display());
    Ok(())
}

/// `mergescope grid run-cell` of a comparison: one λ candidate, final merge or the base's
/// evaluation on this node; its result is written, and what it did returned.
pub fn run_cell(plugin_dirs: &[PathBuf], job: &CompareJob, index: usize) -> anyhow::Result<String> {
    let cell = job.cells.get(index).with_context(|| {
        format!(
            "cell {index} is out of range: the comparison has {} cells",
            job.cells.len()
        )
    })?;
    let mut dirs = plugin_dirs.to_vec();
    dirs.extend(job.plugin_dirs.iter().cloned());
    let chosen = match cell {
        CompareCell::Pretrained => None,
        CompareCell::Lambda { method, .. } | CompareCell::Final { method } => {
            let id = &job
                .methods
                .get(*method)
                .context("the job file names a method it lacks")?
                .id;
            Some(super::registry(&dirs)?.find(id).map_err(anyhow::Error::msg)?)
        }
    };
    let choice =
        DeviceChoice::parse(&job.device).with_context(|| format!("device '{}': use cpu, cuda or metal", job.device))?;
    let (device, note) = open_device(choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let cancel = super::cancel_on_ctrl_c();
    let suite;
    let bench;
    let tasks;
    let inputs = if job.is_suite() {
        suite = Suite::load(Path::new(&job.benchmark))?;
        let m = suite_models(&suite, job.base.as_deref(), &job.experts)?;
        match cell {
            CompareCell::Pretrained => CompareInputs::of_suite(&suite, m.base, m.experts, &device, cancel)?,
            // Candidates are scored on calibration data, which no reference normalises.
            CompareCell::Lambda { .. } => {
                CompareInputs::of_suite_with(&suite, m.base, m.experts, References(Default::default()), &device)?
            }
            CompareCell::Final { .. } => {
                CompareInputs::of_suite_with(&suite, m.base, m.experts, job.references()?, &device)?
            }
        }
    } else {
        bench = Benchmark::open(Path::new(&job.benchmark))?;
        tasks = benchmark_tasks(None)?;
        CompareInputs::of_benchmark(&bench, &tasks, &device)?
    };
    let opts = ExecOptions {
        device,
        ..ExecOptions::default()
    };
    let last = std::sync::Mutex::new(String::new());
    let progress = |stage: &str| {
        let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
        if *l != stage {
            eprintln!("  {stage}");
            stage.clone_into(&mut l);
        }
    };
    let result = job.run_cell(index, chosen.as_deref(), &inputs, &opts, &progress, cancel)?;
    job.write_result(index, &result)?;
    Ok(job.key(index))
}

/// Writes `text` to a temporary file next to `path` and renames it into place.
fn write_atomic(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write '{}'", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move '{}' into place", path.display()))?;
    Ok(())
}
