//! `mergescope analyze oracle --text-bench DIR`: seed 004's task-vectors-as-gradients oracle
//! on a built text benchmark (mergescope_lab::text_bench::oracle), as a table on stdout, the
//! rows as CSV and the gap over η as a log-log PNG.

use super::{Output, open_device_named};
use crate::cli::{cancel_on_ctrl_c, progress_bar};
use clap::{Args, ValueEnum};
use mergescope_engine::writer::write_atomic;
use mergescope_lab::demo::BuildProgress;
use mergescope_lab::text_bench::oracle::{OracleText, Precision};
use mergescope_lab::text_bench::{OracleReport, OracleSettings, run_oracle};
use mergescope_studies::analysis::views::oracle_figure;
use std::path::PathBuf;
use std::time::Instant;

/// The floating-point type of the gradient descent.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PrecisionArg {
    F32,
    F64,
}

#[derive(Args, Debug)]
pub struct OracleArgs {
    /// A built text benchmark: the folder `demo build --benchmark text` writes (base/, heads/,
    /// data/, suite.toml; e.g. ~/.cache/mergescope/demo/text-minilm-seed0), or its suite.toml.
    #[arg(long, value_name = "DIR")]
    pub text_bench: PathBuf,
    /// Only these tasks of the build, in this order (comma-separated; default: all).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// Train texts per task (the first ones of its train split): the full batch of every
    /// gradient step (default 32; no more than any task has).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub examples: Option<String>,
    /// Learning rates η of the task runs (comma-separated; default 2.5e-6,5e-6,1e-5,2e-5, where
    /// MiniLM's gap is still second order); the multi-task run steps αη.
    #[arg(long, value_name = "η,η", allow_hyphen_values = true)]
    pub lr: Vec<String>,
    /// Epoch counts E, one full-batch step each (comma-separated; default 1,2,4); the longest
    /// run gives the shorter ones on the way.
    #[arg(long, value_name = "E,E", allow_hyphen_values = true)]
    pub epochs: Vec<String>,
    /// Task arithmetic's α: θ_TA = θ0 + α Σ τ_t, against multi-task steps of αη on Σ_t L_t.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub alpha: f64,
    /// Tokens kept per text (default: the build's).
    #[arg(long, value_name = "N")]
    pub max_length: Option<usize>,
    /// Test texts per task both models are scored on (0: no scoring).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub eval_examples: usize,
    /// Run gradient descent in f64 (default) or f32. In f32 the rounding of the weights (about
    /// 1e-5 on MiniLM) hides the η² gap at every η small enough for the expansion to hold.
    #[arg(long, value_enum, default_value = "f64")]
    pub precision: PrecisionArg,
    /// Where the picture (log-log gap over η) and the rows (CSV) go.
    #[command(flatten)]
    pub output: Output,
    /// Device: cpu, cuda or metal (falls back to the CPU with a warning).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The settings of the options, through the lab's one door (the window's oracle form goes
/// through it too): `--examples`, `--lr` and `--epochs` as typed, the rest as parsed.
fn settings(a: &OracleArgs) -> anyhow::Result<OracleSettings> {
    let mut text = OracleText::default();
    if let Some(n) = &a.examples {
        text.examples = n.clone();
    }
    // Repeated options add to the list, as commas do.
    if !a.lr.is_empty() {
        text.lrs = a.lr.join(",");
    }
    if !a.epochs.is_empty() {
        text.epochs = a.epochs.join(",");
    }
    text.precision = match a.precision {
        PrecisionArg::F32 => Precision::F32,
        PrecisionArg::F64 => Precision::F64,
    };
    let rest = OracleSettings {
        tasks: a.tasks.clone(),
        alpha: a.alpha,
        max_length: a.max_length,
        eval_examples: a.eval_examples,
        ..OracleSettings::default()
    };
    Ok(text.settings(rest)?)
}

pub fn run(a: &OracleArgs) -> anyhow::Result<()> {
    let settings = settings(a)?;
    a.output.check_outputs()?;
    let device = open_device_named(&a.device)?;
    let bar = progress_bar(a.quiet);
    let mut on_progress = |p: &BuildProgress| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        let loss = p.loss.map(|l| format!(" loss {l:.4}")).unwrap_or_default();
        bar.set_message(format!("{}{loss}", p.stage));
    };
    let clock = Instant::now();
    let report = run_oracle(&a.text_bench, &settings, &device, &mut on_progress, cancel_on_ctrl_c());
    bar.finish_and_clear();
    let report = report?;
    print_report(&report, clock.elapsed().as_secs_f64());
    if let Some(p) = &a.output.csv {
        write_atomic(p, report.to_csv().as_bytes())?;
        eprintln!("numbers: {}", p.display());
    }
    a.output.write_png(&oracle_figure(&report))
}

fn pct(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!("{:.1}", 100.0 * v.iter().sum::<f64>() / v.len() as f64)
}

fn print_report(r: &OracleReport, seconds: f64) {
    let examples = r
        .examples
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "seed 004 oracle: {} ({examples} train texts, full batch), max length {}, α = {}, {} parameters, gradient descent in {}",
        r.tasks.join(", "),
        r.max_length,
        r.alpha,
        r.parameters,
        r.precision.name()
    );
    println!(
        "\n| η | E | ‖θ_TA − θ_MT‖ | relative gap | ‖θ_MT − θ0‖ | ‖θ_TA − θ0‖ | ‖ulp(θ_MT)‖ | TA acc % | MT acc % |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for x in &r.rows {
        println!(
            "| {:e} | {} | {:.3e} | {:.3e} | {:.4e} | {:.4e} | {:.2e} | {} | {} |",
            x.lr,
            x.epochs,
            x.gap,
            x.relative(),
            x.moved,
            x.ta_moved,
            x.ulp,
            pct(&x.ta_accuracy),
            pct(&x.mt_accuracy)
        );
    }
    if !r.base_accuracy.is_empty() {
        let mut counts = r.eval_examples.clone();
        counts.dedup();
        let scored = counts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        println!("\nTest accuracy (%), first {scored} test texts per task:\n");
        println!("| model | {} | mean |", r.tasks.join(" | "));
        println!("|---|{}---:|", "---:|".repeat(r.tasks.len()));
        let line = |name: String, acc: &[f64]| {
            let cells: Vec<String> = acc.iter().map(|a| format!("{:.1}", 100.0 * a)).collect();
            println!("| {name} | {} | {} |", cells.join(" | "), pct(acc));
        };
        line("base".into(), &r.base_accuracy);
        for x in &r.rows {
            line(format!("TA η={:e} E={}", x.lr, x.epochs), &x.ta_accuracy);
            line(format!("MT η={:e} E={}", x.lr, x.epochs), &x.mt_accuracy);
        }
    }
    println!("\nlog-log slopes over η (expected for E ≥ 2: ≈ 2 for the gap, ≈ 1 for the relative gap):");
    for s in r.slopes() {
        let f = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.3}"));
        let note = if s.epochs == 1 {
            " (E = 1 is rounding only: Theorem 1)"
        } else {
            ""
        };
        println!(
            "  E = {}: gap {}, relative gap {}{note}",
            s.epochs,
            f(s.absolute),
            f(s.relative)
        );
    }
    if let Some(worst) = r
        .rows
        .iter()
        .filter(|x| x.epochs == 1)
        .map(|x| x.gap / x.ulp)
        .reduce(f64::max)
    {
        println!(
            "  E = 1: ‖θ_TA − θ_MT‖ ≤ {worst:.2} × ‖ulp(θ_MT)‖ (the {} spacing of the entries that moved)",
            r.precision.name()
        );
    }
    println!(
        "time: {seconds:.0} s ({:.0} s gradient descent, {:.0} s scoring)",
        r.train_seconds, r.eval_seconds
    );
}
