//! `mergescope search`: CMA-ES over a per-tensor method's coefficients (per-task weights, λ,
//! or λ across layer groups), each candidate merged and scored on calibration data by the
//! benchmark's or suite's evaluator (an external command such as lm-evaluation-harness
//! included); the best is merged into --out, and every candidate with the search's mean path is
//! written beside it as JSON.

use super::inputs::{ModelArgs, Models};
use super::merge::parse_params;
use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::executor::{ExecOptions, Observer};
use mergescope_engine::writer::write_atomic;
use mergescope_interop::request::MergeRequest;
use mergescope_lab::data::{SplitKind, benchmark_tasks};
use mergescope_lab::evaluator::Evaluator;
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_lab::run;
use mergescope_studies::search::coefficients::{SearchSpec, Searched, search_coefficients};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// Method id (a per-tensor method, see `mergescope plugins list`).
    #[arg(long)]
    pub method: String,
    /// Parameter to search (repeatable): `lambda`, `task_weights` (one value per expert), or
    /// `lambda:layers=4` (4 anchors interpolated across the layers).
    #[arg(long = "search", value_name = "PARAM", required = true)]
    pub search: Vec<String>,
    /// Which models, and the tasks they are scored on.
    #[command(flatten)]
    pub models: ModelArgs,
    /// Every coefficient stays in LO:HI (and in its parameter's own range).
    #[arg(long, default_value = "0:1.5", value_name = "LO:HI")]
    pub range: String,
    /// Candidates to merge and evaluate in all.
    #[arg(long, default_value_t = 60)]
    pub budget: usize,
    /// Candidates per generation (default 4 + ⌊3 ln n⌋ for n coefficients).
    #[arg(long)]
    pub population: Option<usize>,
    /// Fixed method parameter `name=value` (repeatable).
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
    /// Seed of the search and of every merge.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The best merge goes here; `<out>.search.json` beside it lists every candidate.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out and its search file if they exist.
    #[arg(long)]
    pub overwrite: bool,
    /// cpu, cuda or metal (merges and evaluation).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress line per candidate.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `<out>.search.json` beside the output (`best.safetensors` → `best.search.json`).
fn search_file(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".safetensors").unwrap_or(&name);
    out.with_file_name(format!("{stem}.search.json"))
}

fn parse_range(text: &str) -> anyhow::Result<(f64, f64)> {
    let parsed = text
        .split_once(':')
        .and_then(|(a, b)| Some((a.trim().parse::<f64>().ok()?, b.trim().parse::<f64>().ok()?)));
    parsed.with_context(|| format!("--range '{text}': write LO:HI, e.g. 0:1.5"))
}

pub fn run(plugin_dirs: &[PathBuf], args: SearchArgs) -> anyhow::Result<ExitCode> {
    let record = search_file(&args.out);
    for p in [&args.out, &record] {
        if p.exists() && !args.overwrite {
            bail!(
                "'{}' exists; pass --overwrite to replace it or choose another --out",
                p.display()
            );
        }
    }
    let params = args
        .search
        .iter()
        .map(|s| Searched::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let range = parse_range(&args.range)?;
    let registry = super::registry(plugin_dirs)?;
    let plugin = registry.find(&args.method).map_err(anyhow::Error::msg)?;
    let device = super::open_device_named(&args.device)?;
    // The models and what scores a candidate.
    let Models { base, experts } = args.models.paths()?;
    let evaluator: Box<dyn Evaluator> = if is_suite_path(&args.models.benchmark) {
        let suite = Suite::load(Path::new(&args.models.benchmark))?;
        match suite.calibration_evaluator(&device)? {
            Some(e) => e,
            None => {
                eprintln!(
                    "note: suite '{}' has no calibration files, so candidates are scored by its evaluator as it is; \
                     keep the data it scores apart from the data you report",
                    suite.name
                );
                suite.evaluator(None, &device)?
            }
        }
    } else {
        let bench = args.models.benchmark()?;
        let tasks = benchmark_tasks(None)?;
        Box::new(bench.evaluator(&tasks, None, SplitKind::Calibration, &device)?)
    };
    if experts.is_empty() {
        bail!("no experts to merge: give --expert (one or more)");
    }
    let spec = SearchSpec {
        params,
        range,
        budget: args.budget,
        population: args.population,
        seed: args.seed,
        fixed: parse_params(&args.params)?,
    };
    let opts = ExecOptions {
        device,
        ..ExecOptions::default()
    };
    let scratch = args.out.with_file_name(format!(
        ".{}.candidate.safetensors",
        args.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let cancel = super::cancel_on_ctrl_c();
    let started = std::time::Instant::now();
    let quiet = args.quiet;
    let mut progress = |p: &mergescope_studies::search::coefficients::SearchProgress<'_>| {
        if !quiet {
            let c = p.candidate;
            let what = match &c.error {
                Some(e) => format!("failed: {e}"),
                None => format!("{:.4}", c.score),
            };
            eprintln!(
                "[{}/{}] gen {} {} -> {what} (best {:.4})",
                p.done, p.budget, c.generation, c.params, p.best.score
            );
        }
    };
    let outcome = search_coefficients(
        &plugin,
        &base,
        &experts,
        &spec,
        evaluator.as_ref(),
        &scratch,
        &opts,
        &mut progress,
        cancel,
    )?;
    // The best candidate, merged once more into --out (same parameters and seed: same bytes).
    let req = MergeRequest::new(experts.clone(), &args.out)
        .with_base(Some(base.clone()))
        .with_params(outcome.best.params.clone())
        .with_seed(args.seed)
        .overwriting(args.overwrite);
    run::merge(
        &plugin,
        &req,
        None,
        &opts,
        Observer::silent(),
        &std::sync::atomic::AtomicBool::new(false),
    )?;
    let summary = serde_json::json!({
        "method": plugin.id(),
        "evaluator": evaluator.describe(),
        "searched": spec.params,
        "range": [range.0, range.1],
        "budget": spec.budget,
        "seed": spec.seed,
        "evaluated": outcome.history.len(),
        "cancelled": outcome.cancelled,
        "seconds": started.elapsed().as_secs_f64(),
        "best": outcome.best,
        "out": args.out.display().to_string(),
        "means": outcome.means,
        "history": outcome.history,
    });
    write_atomic(&record, serde_json::to_string_pretty(&summary)?.as_bytes())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "best of {} candidates{}: mean {:.4} with {}",
            outcome.history.len(),
            if outcome.cancelled { " (cancelled)" } else { "" },
            outcome.best.score,
            outcome.best.params
        );
        for (task, s) in &outcome.best.tasks {
            println!("  {task:<16} {s:.4}");
        }
        println!(
            "merged into {}; every candidate in {}",
            args.out.display(),
            record.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
