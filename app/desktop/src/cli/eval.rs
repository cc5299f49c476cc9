//! `mergescope eval`: per-task accuracy, loss and normalised accuracy of a backbone on a
//! benchmark (the same [`Evaluator`] the GUI and the merge methods use).

use anyhow::Context as _;
use clap::Args;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::device::Device;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_lab::data::{SplitKind, benchmark_tasks};
use mergescope_lab::demo::{Benchmark, resolve_benchmark};
use mergescope_lab::eval::EvalReport;
use mergescope_lab::nn::Arch;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Backbone checkpoint to evaluate (a merge result, an expert, the base).
    #[arg(long, value_name = "PATH")]
    pub checkpoint: PathBuf,
    /// `demo` (the built demo benchmark of the checkpoint's architecture), `demo/<arch>`,
    /// `demo/<arch>-seed<N>`, or a benchmark folder.
    #[arg(long, default_value = "demo", value_name = "SPEC")]
    pub benchmark: String,
    /// Only these tasks (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub tasks: Option<Vec<String>>,
    /// test, or calibration (the first 100 training examples of each task).
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Folder of task files, when the benchmark was built with `demo build --data DIR`.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Device to evaluate on: cpu, cuda or metal (falls back to the CPU with a warning when
    /// the build or the machine lacks it).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The architecture whose tensor names and shapes the checkpoint at `path` matches, read from
/// its header.
fn detect_arch(path: &Path) -> anyhow::Result<Option<Arch>> {
    let c = Checkpoint::open(path)?;
    Ok(Arch::detect(
        c.tensors.iter().map(|(k, t)| (k.as_str(), t.shape.as_slice())),
    ))
}

/// Evaluates the checkpoint at `path` on the benchmark `spec`, on `device`.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    path: &Path,
    spec: &str,
    tasks: Option<&[String]>,
    split: SplitKind,
    data: Option<&Path>,
    device: &Device,
) -> anyhow::Result<(Benchmark, EvalReport, f64)> {
    let arch = detect_arch(path)?;
    let bench = resolve_benchmark(spec, arch).with_context(|| {
        if arch.is_none() {
            format!(
                "'{}' is not a backbone of a demo architecture (mlp, cnn, vit); evaluation needs one mergescope knows",
                path.display()
            )
        } else {
            "no benchmark to evaluate on".to_owned()
        }
    })?;
    let all_tasks = benchmark_tasks(data)?;
    let started = Instant::now();
    let evaluator = bench.evaluator(&all_tasks, tasks, split, device)?;
    let report = evaluator
        .evaluate_file(path)
        .with_context(|| format!("cannot evaluate '{}' on '{}'", path.display(), bench.dir.display()))?;
    Ok((bench, report, started.elapsed().as_secs_f64()))
}

/// Prints a report as a table.
pub fn print_report(report: &EvalReport) {
    println!("  {:<16} {:>9} {:>8} {:>11}", "task", "accuracy", "loss", "normalised");
    let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}%", 100.0 * v));
    for t in &report.tasks {
        println!(
            "  {:<16} {:>9} {:>8.3} {:>11}",
            t.task,
            pct(Some(t.accuracy)),
            t.loss,
            pct(t.normalized)
        );
    }
    println!(
        "  {:<16} {:>9} {:>8.3} {:>11}",
        "mean",
        pct(Some(report.mean_accuracy)),
        report.mean_loss,
        pct(report.mean_normalized)
    );
}

pub fn run(args: &EvalArgs) -> anyhow::Result<ExitCode> {
    let split =
        SplitKind::parse(&args.split).with_context(|| format!("--split '{}': use test or calibration", args.split))?;
    let choice = DeviceChoice::parse(&args.device)
        .with_context(|| format!("--device '{}': use cpu, cuda or metal", args.device))?;
    let (device, note) = open_device(choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let (bench, report, seconds) = evaluate(
        &args.checkpoint,
        &args.benchmark,
        args.tasks.as_deref(),
        split,
        args.data.as_deref(),
        &device,
    )?;
    if args.json {
        let j = serde_json::json!({
            "checkpoint": args.checkpoint.display().to_string(),
            "benchmark": bench.dir.display().to_string(),
            "arch": bench.manifest.arch,
            "seconds": seconds,
            "report": report,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!(
            "{} on {} ({}, {} split, {:.2} s)",
            args.checkpoint.display(),
            bench.dir.display(),
            bench.manifest.arch,
            split.name(),
            seconds
        );
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}
