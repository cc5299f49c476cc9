//! `mergescope eval`: per-task accuracy, loss and normalised accuracy of a backbone on a
//! benchmark (the same [`Evaluator`] the GUI and the merge methods use).

use anyhow::Context as _;
use clap::Args;
use mergescope_engine::device::device_name;
use mergescope_lab::data::SplitKind;
use mergescope_lab::evaluate::{self, EvaluatorSpec};
use mergescope_lab::evaluator::{ACCURACY, EvalReport};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Backbone checkpoint to evaluate (a merge result, an expert, the base).
    #[arg(long, value_name = "PATH")]
    pub checkpoint: PathBuf,
    /// `demo` (the built demo benchmark of the checkpoint's architecture), `demo/<arch>`,
    /// `demo/<arch>-seed<N>`, a benchmark folder, or a suite file (`.toml`, e.g. an external
    /// evaluator command; see docs/suites.md).
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

/// What a checkpoint was evaluated on, for messages: the benchmark folder and architecture, or
/// the suite.
pub struct Evaluated {
    /// The benchmark folder or suite file.
    pub on: String,
    /// The demo architecture, for a demo benchmark.
    pub arch: Option<String>,
    /// The scores.
    pub report: EvalReport,
    /// Wall time of the evaluation.
    pub seconds: f64,
    /// The device the evaluation ran on (`cpu`, `cuda`, `metal`): the one asked for, or the
    /// CPU where that was unavailable.
    pub device: &'static str,
}

/// Evaluates the checkpoint at `path` as `spec` says (the one evaluator door of the lab).
pub fn evaluate(path: &Path, spec: &EvaluatorSpec) -> anyhow::Result<Evaluated> {
    let opened = evaluate::open(spec, Some(path))?;
    let on = match &opened.benchmark {
        Some(b) => b.dir.display().to_string(),
        None => spec.benchmark.clone(),
    };
    let started = Instant::now();
    let report = opened
        .evaluator
        .evaluate_file(path, &AtomicBool::new(false))
        .with_context(|| format!("cannot evaluate '{}' on '{on}'", path.display()))?;
    Ok(Evaluated {
        on,
        arch: opened.benchmark.map(|b| b.manifest.arch.to_string()),
        report,
        seconds: started.elapsed().as_secs_f64(),
        device: device_name(&spec.device),
    })
}

/// Prints a report as a table.
/// An evaluation as JSON, the same from `eval --json` and `merge --eval --json`:
/// `{"tasks": {"<task>": {"<metric>": value}}, "average": {...}, "checkpoint", "benchmark",
/// "arch", "device", "seconds", "report"}`.
pub fn evaluation_json(checkpoint: &Path, e: &Evaluated) -> anyhow::Result<serde_json::Value> {
    let mut j = e.report.metrics_json();
    j["checkpoint"] = serde_json::json!(checkpoint.display().to_string());
    j["benchmark"] = serde_json::json!(e.on);
    j["arch"] = serde_json::json!(e.arch);
    j["device"] = serde_json::json!(e.device);
    j["seconds"] = serde_json::json!(e.seconds);
    j["report"] = serde_json::to_value(&e.report)?;
    Ok(j)
}

/// Prints a report as a table.
pub fn print_report(report: &EvalReport) {
    let metric = report.tasks.first().map_or("accuracy", |t| t.metric.as_str());
    println!("  {:<16} {:>9} {:>8} {:>11}", "task", metric, "loss", "normalised");
    let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}%", 100.0 * v));
    let loss = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
    let headline = |v: f64| {
        if metric == ACCURACY {
            pct(Some(v))
        } else {
            format!("{v:.4}")
        }
    };
    for t in &report.tasks {
        println!(
            "  {:<16} {:>9} {:>8} {:>11}",
            t.task,
            headline(t.accuracy),
            loss(t.loss),
            pct(t.normalized)
        );
    }
    println!(
        "  {:<16} {:>9} {:>8} {:>11}",
        "mean",
        headline(report.mean_accuracy),
        loss(report.mean_loss),
        pct(report.mean_normalized)
    );
}

/// The line above a report: what was evaluated on what.
pub fn print_header(checkpoint: &Path, e: &Evaluated, split: SplitKind) {
    let what = match &e.arch {
        Some(arch) => format!("{arch}, {} split", split.name()),
        None => "suite".to_owned(),
    };
    println!(
        "{} on {} ({what}, {}, {:.2} s)",
        checkpoint.display(),
        e.on,
        e.device,
        e.seconds
    );
}

pub fn run(args: &EvalArgs) -> anyhow::Result<ExitCode> {
    let split =
        SplitKind::parse(&args.split).with_context(|| format!("--split '{}': use test or calibration", args.split))?;
    let device = super::open_device_named(&args.device)?;
    let spec = EvaluatorSpec {
        benchmark: args.benchmark.clone(),
        data: args.data.clone(),
        tasks: args.tasks.clone(),
        split,
        device,
    };
    let e = evaluate(&args.checkpoint, &spec)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&evaluation_json(&args.checkpoint, &e)?)?
        );
    } else {
        print_header(&args.checkpoint, &e, split);
        print_report(&e.report);
    }
    Ok(ExitCode::SUCCESS)
}
