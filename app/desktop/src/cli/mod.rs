//! Command-line parsing and dispatch. Each subcommand lives in its own module.

mod analyze;
mod bench;
mod compare;
pub mod demo;
mod eval;
mod extract_lora;
mod grid;
mod gui;
mod inputs;
mod inspect;
mod merge;
mod plugin_new;
mod plugins;
mod recipe;
mod search;
mod sweep;
mod sweep_slurm;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use mergescope_engine::device::{Device, DeviceChoice, open_device};
use mergescope_engine::plugin::{Approvals, PluginDirs, Registry};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

/// mergescope: merge fine-tuned checkpoints with plugin methods, in the desktop window (no
/// subcommand) or headless (the subcommands below).
#[derive(Parser, Debug)]
#[command(name = "mergescope", version, about, long_about = None)]
pub struct Cli {
    /// Extra folder to search for method plugins (repeatable). Plugins found there must be
    /// approved once with `mergescope plugins approve PATH`.
    #[arg(long = "plugin-dir", global = true, value_name = "DIR")]
    pub plugin_dirs: Vec<PathBuf>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Merge a base and expert checkpoints with a method (or run a TOML recipe).
    Merge(merge::MergeArgs),
    /// List, inspect and approve method plugins.
    Plugins {
        #[command(subcommand)]
        command: plugins::PluginsCommand,
    },
    /// Convert recipes: a mergekit YAML configuration into a mergescope recipe.
    Recipe {
        #[command(subcommand)]
        command: recipe::RecipeCommand,
    },
    /// Extract a PEFT LoRA adapter of a fine-tuned model over its base (truncated SVD).
    ExtractLora(extract_lora::ExtractLoraArgs),
    /// Show the tensors, dtypes, shapes and metadata of a checkpoint.
    Inspect(inspect::InspectArgs),
    /// Benchmark merge methods on synthetic LLM-shaped checkpoints.
    Bench(bench::BenchArgs),
    /// Build or list the demo benchmark (base, heads and experts on seven real tasks).
    Demo {
        #[command(subcommand)]
        command: demo::DemoCommand,
    },
    /// Evaluate a backbone checkpoint per task on a benchmark.
    Eval(eval::EvalArgs),
    /// Run every method on a benchmark and write a results table (Markdown and CSV).
    Compare(compare::CompareArgs),
    /// Search a method's coefficients (per task, λ, λ across layers) with CMA-ES, each
    /// candidate merged and scored on calibration data; the best is merged into --out.
    Search(search::SearchArgs),
    /// Analysis views headless: PCA, cosine, spectrum, radar, landscape (PNG and CSV).
    Analyze {
        #[command(subcommand)]
        command: analyze::AnalyzeCommand,
    },
    /// Fine-tuning sweeps of seed 002: experts over a hyperparameter grid, merged per task
    /// group, evaluated, with the scaling laws fitted (resumable).
    Sweep(sweep::SweepArgs),
    /// Grids run with `--executor slurm` (sweeps, comparisons, landscapes): `grid run-cell`
    /// is what each array task runs.
    Grid {
        #[command(subcommand)]
        command: grid::GridCommand,
    },
    /// Open the desktop window (the default when no subcommand is given).
    Gui(gui::GuiArgs),
}

/// The device `name` (cpu, cuda or metal) of a --device option, opened (a fallback is
/// announced on stderr).
pub fn open_device_named(name: &str) -> anyhow::Result<Device> {
    let choice = DeviceChoice::parse(name).with_context(|| format!("--device '{name}': use cpu, cuda or metal"))?;
    let (device, note) = open_device(choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    Ok(device)
}

/// Finds plugins next to the executable, in the user's folder and in `--plugin-dir`s.
pub fn registry(extra: &[PathBuf]) -> anyhow::Result<Registry> {
    // A damaged approvals file must not block the bundled methods, which need no approval.
    let approvals = Approvals::load().unwrap_or_else(|e| {
        eprintln!("warning: {e}; until then, plugins outside mergescope's own folder are not loaded");
        Approvals::default()
    });
    Ok(Registry::discover(&PluginDirs::standard(extra.to_vec()), &approvals))
}

/// A progress bar on stderr (hidden with `--quiet`); callers set its length and position.
pub fn progress_bar(quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(1000);
    let style = ProgressStyle::with_template("{spinner} {msg:<34} [{bar:30}] {percent:>3}% {elapsed} (eta {eta})")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// A cancel flag that Ctrl-C (or SIGTERM) sets, so jobs stop cleanly and remove their
/// temporary output; a second Ctrl-C exits at once.
pub fn cancel_on_ctrl_c() -> &'static AtomicBool {
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    if let Err(e) = ctrlc::set_handler(|| {
        if cancel.swap(true, std::sync::atomic::Ordering::Relaxed) {
            std::process::exit(130);
        }
    }) {
        eprintln!("warning: Ctrl-C will not cancel cleanly ({e})");
    }
    cancel
}

/// Parses the command line and runs it.
pub fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Merge(_) | Command::Bench(_))) {
        // Merges run one worker per core; training and evaluation use candle's own threads.
        mergescope_engine::sys::single_threaded_tensor_ops();
    }
    match cli.command {
        Some(Command::Merge(args)) => merge::run(&cli.plugin_dirs, args),
        Some(Command::Plugins { command }) => plugins::run(&cli.plugin_dirs, command),
        Some(Command::Recipe { command }) => recipe::run(&cli.plugin_dirs, command),
        Some(Command::ExtractLora(args)) => extract_lora::run(&args),
        Some(Command::Inspect(args)) => inspect::run(&args),
        Some(Command::Bench(args)) => bench::run(&cli.plugin_dirs, args),
        Some(Command::Demo { command }) => demo::run(command),
        Some(Command::Eval(args)) => eval::run(&args),
        Some(Command::Compare(args)) => compare::run(&cli.plugin_dirs, args),
        Some(Command::Search(args)) => search::run(&cli.plugin_dirs, args),
        Some(Command::Analyze { command }) => analyze::run(&command),
        Some(Command::Sweep(args)) => sweep::run(&cli.plugin_dirs, args),
        Some(Command::Grid { command }) => grid::run_grid(&cli.plugin_dirs, &command),
        Some(Command::Gui(args)) => gui::run(&cli.plugin_dirs, &args),
        None => gui::run(&cli.plugin_dirs, &gui::GuiArgs::default()),
    }
}
