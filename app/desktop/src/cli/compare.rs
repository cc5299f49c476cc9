//! `mergescope compare`: every installed method (or those named) on a benchmark, written as a
//! Markdown and a CSV table of per-task, average and normalised test accuracy.

use super::inputs::ModelArgs;
use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::loader::Plugin;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::resolve_benchmark;
use mergescope_lab::evaluate::suite_models;
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_plugin_api::abi;
use mergescope_studies::compare::{CompareConfig, CompareInputs, compare, default_lambda_grid};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Which models, and the tasks they are scored on.
    #[command(flatten)]
    pub models: ModelArgs,
    /// Only these methods (plugin ids, comma-separated), in this order; default: every
    /// installed method.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub methods: Option<Vec<String>>,
    /// λ values searched on calibration data for methods with a `lambda` parameter
    /// (comma-separated; default 0.1, 0.2, …, 2.0 within each method's range). `none` keeps
    /// every method's default λ.
    #[arg(long, value_delimiter = ',', value_name = "L1,L2")]
    pub lambda_grid: Option<Vec<String>>,
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
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
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

pub fn run(plugin_dirs: &[PathBuf], args: CompareArgs) -> anyhow::Result<ExitCode> {
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
    {
        leave_out(
            &mut plugins,
            Plugin::is_model_level,
            &format!("model-level methods: {why}"),
        );
    }
    if plugins.is_empty() {
        bail!("no method plugins found; see `mergescope plugins list`");
    }
    let md_path = args.out_dir.join("results.md");
    let csv_path = args.out_dir.join("results.csv");
    for p in [&md_path, &csv_path] {
        if p.exists() && !args.overwrite {
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
    if args.methods.is_none() && inputs.experts.len() != 1 {
        let why = format!(
            "they merge the base with exactly one expert and there are {}",
            inputs.experts.len()
        );
        leave_out(&mut plugins, |p| p.has_capability(abi::CAP_ONE_EXPERT), &why);
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
    let cfg = CompareConfig {
        out_dir: args.out_dir.clone(),
        overwrite: args.overwrite,
        lambda_grid,
        seed: args.seed,
    };
    let bar = super::progress_bar(args.quiet);
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
    for r in &table.rows {
        match &r.outcome {
            Ok(_) => eprintln!("{}: {:.1} s -> {}", r.id, r.seconds, r.output.display()),
            Err(e) => eprintln!("{}: failed: {e}", r.id),
        }
    }
    let markdown = table.markdown();
    write_atomic(&md_path, &markdown)?;
    write_atomic(&csv_path, &table.csv())?;
    println!(
        "{} on '{}' (test data; {})\n",
        table.arch,
        table.benchmark.display(),
        if inputs.calibration.is_some() {
            "λ chosen on calibration data"
        } else {
            "default λ"
        }
    );
    println!("{markdown}");
    eprintln!("tables: {} and {}", md_path.display(), csv_path.display());
    Ok(if table.rows.iter().any(|r| r.outcome.is_err()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Writes `text` to a temporary file next to `path` and renames it into place.
fn write_atomic(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write '{}'", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move '{}' into place", path.display()))?;
    Ok(())
}

/// Leaves out of `plugins` those `drop` selects (methods not asked for by name that cannot run
/// on these inputs), naming them and `why` on stderr.
fn leave_out(plugins: &mut Vec<&Plugin>, drop: impl Fn(&Plugin) -> bool, why: &str) {
    let skipped: Vec<&str> = plugins.iter().filter(|p| drop(p)).map(|p| p.id()).collect();
    if !skipped.is_empty() {
        eprintln!("note: not run ({}): {why}", skipped.join(", "));
        plugins.retain(|p| !drop(p));
    }
}
