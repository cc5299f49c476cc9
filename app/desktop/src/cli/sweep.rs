//! `mergescope sweep`: seed 002's fine-tuning sweeps: fine-tune experts over a grid of
//! hyperparameters, merge seeded task groups with several methods, evaluate every task, write
//! the results as they come (a killed sweep resumes), and draw the scaling plots with the laws
//! fitted.

use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::resolve_benchmark;
use mergescope_lab::nn::Arch;
use mergescope_studies::grid::ExecutorKind;
use mergescope_studies::scaling::sweep::executor::drive_on_slurm;
use mergescope_studies::scaling::sweep::run::{RESULTS_FILE, SPEC_FILE};
use mergescope_studies::scaling::sweep::spec::TEXT_ARCH;
use mergescope_studies::scaling::sweep::store::{Row, read_rows};
use mergescope_studies::scaling::sweep::{
    BenchKind, OpenBench, SweepInputs, SweepProgress, SweepSpec, analyse, check_sweep, fits_markdown, is_text_build,
    open_text_benchmark, run_sweep, write_plots,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
#[command(mut_arg("executor", |a| a.help(
    "Where the cells run: `local` (this process, one after another) or `slurm` (one Slurm array job, a task per missing cell; see docs/slurm.md)"
)))]
pub struct SweepArgs {
    #[command(subcommand)]
    pub command: Option<SweepCommand>,
    /// The sweep's TOML specification (see `--print-spec` for a commented starting point).
    #[arg(value_name = "SPEC.toml", conflicts_with = "preset")]
    pub spec: Option<PathBuf>,
    /// A built-in sweep: `paper-002` (seed 002's protocol scaled to the demo benchmark, or
    /// with --arch text to the text benchmark).
    #[arg(long)]
    pub preset: Option<String>,
    /// What a preset fine-tunes: mlp, cnn or vit (the demo benchmark's backbone), or text
    /// (all-MiniLM-L6-v2 on the text benchmark: docs/text-benchmark.md).
    #[arg(long, default_value = "mlp")]
    pub arch: String,
    /// The benchmark the sweep trains on, instead of the specification's: `demo`, a demo
    /// benchmark folder, or (with arch text) a text build folder (`demo build --benchmark
    /// text` writes one; default ~/.cache/mergescope/demo/text-minilm-seed0) or its suite.toml.
    #[arg(long, value_name = "NAME|DIR")]
    pub benchmark: Option<String>,
    /// Sweep folder: results.csv, plots/, fits.md, the checkpoints. Running the same command
    /// again resumes a killed sweep. Default: sweeps/<preset or spec name>-<arch>.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the specification (of --preset or SPEC.toml) as TOML and exit.
    #[arg(long)]
    pub print_spec: bool,
    /// Only redraw the plots from the folder's results (also while a sweep runs).
    #[arg(long)]
    pub plots_only: bool,
    /// Size of the PNG plots, WIDTHxHEIGHT.
    #[arg(long, default_value = "1100x760")]
    pub size: String,
    /// cpu, cuda or metal.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Where the cells run, and how (its --executor help is this command's, above).
    #[command(flatten)]
    pub run: super::sweep_slurm::GridRunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum SweepCommand {
    /// Run one cell of a grid submitted with `--executor slurm`: the same as
    /// `mergescope grid run-cell` (what each array task runs), kept for earlier scripts.
    RunCell {
        /// The grid's job file (`grid.json` in the work folder).
        #[arg(value_name = "GRID.json")]
        job: PathBuf,
        /// The cell's index (the array task id).
        index: usize,
    },
}

fn spec_of(args: &SweepArgs) -> anyhow::Result<(SweepSpec, String)> {
    match (&args.spec, &args.preset) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read '{}'", path.display()))?;
            let spec = SweepSpec::from_toml(&text).with_context(|| format!("in '{}'", path.display()))?;
            let stem = path
                .file_stem()
                .map_or("sweep".into(), |s| s.to_string_lossy().into_owned());
            Ok((spec, stem))
        }
        (None, Some(name)) => {
            let kind = if args.arch == TEXT_ARCH {
                BenchKind::Text
            } else {
                BenchKind::Demo(Arch::parse(&args.arch).with_context(|| {
                    format!(
                        "--arch '{}': use mlp, cnn or vit (the demo benchmark) or text (the text benchmark)",
                        args.arch
                    )
                })?)
            };
            Ok((SweepSpec::preset_for(name, kind)?, name.clone()))
        }
        (None, None) => bail!("give a specification file or --preset paper-002 (see `mergescope sweep --help`)"),
    }
}

fn size(s: &str) -> anyhow::Result<(u32, u32)> {
    s.split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)))
        .filter(|(w, h): &(u32, u32)| (300..=8000).contains(w) && (200..=8000).contains(h))
        .with_context(|| format!("--size '{s}': write WIDTHxHEIGHT in pixels, e.g. 1100x760"))
}

fn minutes(s: f64) -> String {
    if s < 90.0 {
        format!("{s:.0} s")
    } else {
        format!("{:.1} min", s / 60.0)
    }
}

/// Draws the plots of the sweep in `out` from `rows` (default: its results file); prints the
/// fits.
fn plots(out: &Path, spec: &SweepSpec, rows: Option<&[Row]>, (w, h): (u32, u32)) -> anyhow::Result<()> {
    let read;
    let rows = match rows {
        Some(r) => r,
        None => {
            read = read_rows(&out.join(RESULTS_FILE))?;
            &read
        }
    };
    let results = analyse(spec, rows);
    let written = write_plots(out, &results, w, h)?;
    println!("{}", fits_markdown(&results));
    eprintln!(
        "plots: {} ({} files), fits: {}",
        out.join("plots").display(),
        written.len() - 1,
        out.join("fits.md").display()
    );
    Ok(())
}

pub fn run(plugin_dirs: &[PathBuf], args: SweepArgs) -> anyhow::Result<ExitCode> {
    if let Some(SweepCommand::RunCell { job, index }) = &args.command {
        return super::grid::run_grid_cell(plugin_dirs, job, *index);
    }
    let executor = args.run.executor(&[])?;
    let wh = size(&args.size)?;
    if args.plots_only {
        let Some(out) = &args.out else {
            bail!("--plots-only needs --out DIR (the sweep folder)");
        };
        let path = out.join(SPEC_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("'{}' holds no sweep (no {SPEC_FILE})", out.display()))?;
        plots(out, &SweepSpec::from_toml(&text)?, None, wh)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (mut spec, name) = spec_of(&args)?;
    if let Some(b) = &args.benchmark {
        spec.benchmark.clone_from(b);
    }
    if args.print_spec {
        print!("{}", spec.to_toml()?);
        return Ok(ExitCode::SUCCESS);
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("sweeps").join(format!("{name}-{}", spec.arch)));
    let device_choice = DeviceChoice::parse(&args.device)
        .with_context(|| format!("--device '{}': use cpu, cuda or metal", args.device))?;
    // The plugins are found before anything long starts (a typo fails at once).
    let registry = super::registry(plugin_dirs)?;
    for m in &spec.methods {
        registry.find(&m.plugin).map_err(anyhow::Error::msg)?;
    }
    let (device, note) = open_device(device_choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let cancel = super::cancel_on_ctrl_c();
    let bench = match spec.kind()? {
        BenchKind::Text => OpenBench::Text(open_text_benchmark(&spec.benchmark)?),
        BenchKind::Demo(arch) => {
            if is_text_build(Path::new(&spec.benchmark)) {
                bail!(
                    "'{}' is a text benchmark build: sweep it with --arch text (or arch = \"text\" in the specification)",
                    spec.benchmark
                );
            }
            let tasks = benchmark_tasks(None)?;
            let bench = match resolve_benchmark(&spec.benchmark, Some(arch)) {
                Ok(b) => b,
                // A fresh machine: build the demo the sweep starts from (as the window does).
                Err(e) if spec.benchmark == "demo" => {
                    eprintln!("no {arch} demo benchmark built yet: building it first ({e})");
                    let dir = mergescope_lab::demo::demo_dir(arch, 0)?;
                    // On the CPU, as every build of the shared demo is: the same bytes everywhere.
                    let cpu = mergescope_engine::device::Device::Cpu;
                    super::demo::build_with_bar(arch, 0, &dir, &tasks, &cpu, args.run.quiet, cancel)?
                }
                Err(e) => return Err(e.into()),
            };
            OpenBench::Demo { bench, tasks }
        }
    };
    let parts = super::sweep_slurm::SweepParts {
        spec: &spec,
        bench: bench.as_sweep(),
        out_dir: &out,
    };
    super::sweep_slurm::with_sweep_inputs(plugin_dirs, &parts, device, |inputs| {
        run_with(&args, executor, plugin_dirs, &name, wh, inputs, cancel)
    })?
}

/// Runs the sweep `inputs` with `executor`, then draws its plots.
#[allow(clippy::too_many_arguments)]
fn run_with(
    args: &SweepArgs,
    executor: ExecutorKind,
    plugin_dirs: &[PathBuf],
    name: &str,
    wh: (u32, u32),
    inputs: &SweepInputs<'_>,
    cancel: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<ExitCode> {
    let (out, spec) = (inputs.out_dir, inputs.spec);
    // The specification's mistakes, named with its file, before anything is written.
    if let Err(e) = check_sweep(inputs) {
        return Err(match &args.spec {
            Some(path) => anyhow::Error::new(e).context(format!("in '{}'", path.display())),
            None => e.into(),
        });
    }
    if executor == ExecutorKind::Slurm {
        let shown = super::sweep_slurm::shown(args.run.quiet);
        let slurm = args.run.slurm.settings();
        let ran = drive_on_slurm(inputs, &slurm, plugin_dirs, &args.device, name, &shown, cancel)?;
        let Some(outcome) = ran else {
            return Ok(ExitCode::SUCCESS);
        };
        if !outcome.cancelled {
            plots(out, spec, Some(&outcome.rows), wh)?;
        }
        return Ok(ExitCode::from(outcome.grid().exit_status()));
    }
    let bar = super::progress_bar(args.run.quiet);
    let progress = |p: &SweepProgress| {
        bar.set_position((p.fraction() * 1000.0) as u64);
        let eta = p.eta.map_or(String::new(), |s| format!(", {} left", minutes(s)));
        bar.set_message(format!("{}/{} cells{eta}: {}", p.cells_done, p.cells, p.stage));
    };
    eprintln!("sweep '{}' into {}", name, out.display());
    let outcome = run_sweep(inputs, &progress, cancel);
    bar.finish_and_clear();
    match outcome {
        Ok(s) => {
            eprintln!(
                "{} cells ({} reused from an earlier run), {} fine-tuning runs, {} -> {}",
                s.cells,
                s.reused,
                s.runs_trained,
                minutes(s.seconds),
                s.results.display()
            );
            plots(out, spec, Some(&s.rows), wh)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(mergescope_engine::error::EngineError::Cancelled) => {
            eprintln!(
                "cancelled: the finished cells are in {}; run the same command again to resume",
                out.join(RESULTS_FILE).display()
            );
            if out.join(RESULTS_FILE).exists() {
                plots(out, spec, None, wh)?;
            }
            Ok(ExitCode::from(130))
        }
        Err(e) => Err(e.into()),
    }
}
