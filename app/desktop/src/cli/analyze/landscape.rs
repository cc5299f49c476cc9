//! `mergescope analyze landscape`: a metric over task arithmetic's λ line, CART's rank × λ grid
//! (or its best-λ accuracy against rank) or the plane through the base and two checkpoints,
//! evaluated coarse to fine, cached, resumable after Ctrl-C.

use super::{Common, short_name};
use crate::cli::{cancel_on_ctrl_c, progress_bar};
use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use mergescope_engine::analysis::landscape::{
    AffineFamily, LandscapeGrid, Metric, cache_key, cart_families, fill_grid, load_cached, save_cached,
};
use mergescope_engine::analysis::read_iterates;
use mergescope_engine::analysis::views::{LandscapeLabels, landscape_figure, line_figure};
use mergescope_engine::data::{SplitKind, benchmark_tasks};
use mergescope_engine::demo::load_params;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::error::EngineError;
use mergescope_figures::{Path as FigPath, Point};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Kind {
    /// θ0 + λ·Σ_t τ_t over --lambdas.
    TaLine,
    /// CART: θ̄ + λ·Σ_t SVD_k(θ_t − θ̄) over --ranks × --lambdas.
    Cart,
    /// CART: the metric at the best λ of each rank, against the rank.
    CartRank,
    /// θ0 + α·(A − θ0) + β·(B − θ0) over --range², through the checkpoints of --through.
    Plane,
}

#[derive(Args, Debug)]
pub struct LandscapeArgs {
    #[command(flatten)]
    pub common: Common,
    /// Which landscape.
    #[arg(long, value_enum, default_value = "ta-line")]
    pub kind: Kind,
    /// λ values as START:END:COUNT (default 0:1.5:16 for ta-line, 0:2:11 for cart).
    #[arg(long, value_name = "A:B:N")]
    pub lambdas: Option<String>,
    /// CART rank fractions (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0.02,0.04,0.08,0.16,0.32,0.64,1")]
    pub ranks: Vec<f64>,
    /// Plane: the two checkpoints spanning it with the base: expert task names or paths.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub through: Vec<String>,
    /// Plane: coefficients of both directions as START:END:COUNT.
    #[arg(long, default_value = "-0.5:1.5:21", value_name = "A:B:N")]
    pub range: String,
    /// Plane: trajectories drawn on it, projected orthogonally (repeatable).
    #[arg(long = "trajectory", value_name = "PATH")]
    pub trajectories: Vec<PathBuf>,
    /// loss, accuracy or normalized.
    #[arg(long, default_value = "accuracy")]
    pub metric: String,
    /// The metric of one task (default: the mean over tasks).
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Test examples per task at each point, evenly spaced through the split (0: all).
    #[arg(long, default_value_t = 100)]
    pub samples: usize,
    /// Recompute instead of reusing (or resuming) the cached grid.
    #[arg(long)]
    pub no_cache: bool,
    /// Folder of task files, when the benchmark was built with `demo build --data DIR`.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// START:END:COUNT as COUNT evenly spaced values.
fn linspace(spec: &str, what: &str) -> anyhow::Result<Vec<f64>> {
    let parts: Vec<&str> = spec.split(':').collect();
    let parse = || -> Option<Vec<f64>> {
        let [a, b, n] = parts.as_slice() else { return None };
        let (a, b): (f64, f64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        let n: usize = n.trim().parse().ok()?;
        if !(a.is_finite() && b.is_finite()) || n == 0 || n > 201 {
            return None;
        }
        Some(if n == 1 {
            vec![a]
        } else {
            (0..n).map(|i| a + (b - a) * i as f64 / (n - 1) as f64).collect()
        })
    };
    parse().with_context(|| format!("{what} '{spec}': write START:END:COUNT with 1 ≤ COUNT ≤ 201, e.g. 0:2:11"))
}

pub fn run(a: &LandscapeArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let metric = Metric::parse(&a.metric, a.task.as_deref())?;
    if let Some(r) = a.ranks.iter().find(|r| !(0.0..=1.0).contains(*r)) {
        bail!("--ranks: {r} is not a fraction in [0, 1]");
    }
    let bench = a.common.benchmark()?;
    let models = a.common.models()?;
    let (device, _) = open_device(DeviceChoice::Cpu);
    let tasks = benchmark_tasks(a.data.as_deref())?;
    if let Some(t) = &a.task
        && !bench.task_names().contains(&t.as_str())
    {
        bail!(
            "--task '{t}' is not a task of this benchmark; it has: {}",
            bench.task_names().join(", ")
        );
    }
    let evaluator = bench
        .evaluator(&tasks, None, SplitKind::Test, &device)?
        .subsample(a.samples)?;
    let base = load_params(&models.base, &device)?;
    let experts = models
        .experts
        .iter()
        .map(|p| load_params(p, &device))
        .collect::<Result<Vec<_>, EngineError>>()?;

    let mut inputs = vec![models.base.clone()];
    inputs.extend(models.experts.iter().cloned());
    let (families, xs, ys, labels, marks, through_files) = match a.kind {
        Kind::TaLine => {
            let xs = linspace(a.lambdas.as_deref().unwrap_or("0:1.5:16"), "--lambdas")?;
            let fam = AffineFamily::task_arithmetic(&base, &experts)?;
            (
                vec![fam],
                xs,
                vec![0.0],
                labels("Task arithmetic θ0 + λ·Σ_t τ_t", "λ", ""),
                vec![],
                vec![],
            )
        }
        Kind::Cart | Kind::CartRank => {
            let xs = linspace(a.lambdas.as_deref().unwrap_or("0:2:11"), "--lambdas")?;
            let fams = cart_families(&experts, &a.ranks, &device)?;
            let l = labels(
                "CART: θ_mean + λ·Σ_t SVD_k(θ_t − θ_mean)",
                "λ",
                "rank kept, % of min(m, n)",
            );
            (fams, xs, a.ranks.clone(), l, vec![], vec![])
        }
        Kind::Plane => {
            let [first, second] = a.through.as_slice() else {
                bail!("--kind plane needs --through A,B: two expert task names or checkpoint paths");
            };
            let resolve = |s: &str| -> anyhow::Result<PathBuf> {
                if let Some(p) = models.experts.iter().find(|p| short_name(p) == s) {
                    return Ok(p.clone());
                }
                let p = PathBuf::from(s);
                if p.exists() {
                    return Ok(p);
                }
                let names: Vec<String> = models.experts.iter().map(|p| short_name(p)).collect();
                bail!(
                    "--through '{s}' is neither a checkpoint file nor an expert ({})",
                    names.join(", ")
                )
            };
            let (pa, pb) = (resolve(first)?, resolve(second)?);
            let fam = AffineFamily::plane(&base, &load_params(&pa, &device)?, &load_params(&pb, &device)?)?;
            let g = linspace(&a.range, "--range")?;
            let (na, nb) = (short_name(&pa), short_name(&pb));
            let l = labels(
                &format!("Plane θ0 + α·(θ_{na} − θ0) + β·(θ_{nb} − θ0)"),
                &format!("α ({na})"),
                &format!("β ({nb})"),
            );
            let marks = vec![mark(0.0, 0.0, "base"), mark(1.0, 0.0, &na), mark(0.0, 1.0, &nb)];
            (vec![fam], g.clone(), g, l, marks, vec![pa, pb])
        }
    };
    inputs.extend(through_files);
    // The rank × λ grid serves both CART views.
    let family = match a.kind {
        Kind::CartRank => Kind::Cart,
        k => k,
    };
    let description = format!(
        "{family:?} xs={xs:?} ys={:?} samples={} arch={}",
        ys, a.samples, bench.manifest.arch
    );
    let key = cache_key(&description, &inputs);
    let mut grid = (!a.no_cache)
        .then(|| load_cached(&key))
        .flatten()
        .filter(|g: &LandscapeGrid| g.xs == xs && g.ys == ys)
        .unwrap_or_else(|| LandscapeGrid::new(xs.clone(), ys.clone()));
    let cached = grid.done();
    let model = |r: usize, c: usize| -> mergescope_engine::error::Result<_> {
        match a.kind {
            Kind::Plane => families[0].at(&[xs[c], ys[r]]),
            Kind::TaLine => families[0].at(&[xs[c]]),
            Kind::Cart | Kind::CartRank => families[r].at(&[xs[c]]),
        }
    };
    let bar = progress_bar(a.quiet);
    bar.set_length(grid.cells.len() as u64);
    bar.set_position(cached as u64);
    bar.set_message("landscape");
    let started = Instant::now();
    let mut first_preview: Option<f64> = None;
    let coarse = 4.min(grid.cells.len());
    let result = fill_grid(
        &mut grid,
        &evaluator,
        &model,
        &mut |_, _, _, done, _| {
            bar.set_position(done as u64);
            if done >= coarse && first_preview.is_none() {
                first_preview = Some(started.elapsed().as_secs_f64());
            }
        },
        cancel_on_ctrl_c(),
    );
    bar.finish_and_clear();
    save_cached(&key, &grid)?;
    if let Err(e) = result {
        if matches!(e, EngineError::Cancelled) {
            bail!(
                "cancelled after {} of {} points; they are cached, and the same command resumes from there",
                grid.done(),
                grid.cells.len()
            );
        }
        return Err(e.into());
    }
    let computed = grid.done() - cached;
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{} points ({} computed, {} from the cache) in {seconds:.1} s ({:.3} s per point; first coarse picture after {:.2} s)",
        grid.cells.len(),
        computed,
        cached,
        if computed > 0 { seconds / computed as f64 } else { 0.0 },
        first_preview.unwrap_or(0.0),
    );
    let figure = match a.kind {
        Kind::TaLine => {
            let refs = reference_lines(&bench, &metric);
            line_figure(
                &grid,
                &metric,
                "Task arithmetic: θ0 + λ·Σ_t τ_t",
                "λ",
                &|_| metric.label(),
                &refs,
            )
        }
        Kind::CartRank => rank_curve(&grid, &metric),
        Kind::Cart => {
            // Ranks are geometric: one row each, named by their percentage.
            let mut fig = landscape_figure(&grid, &metric, &labels, vec![], vec![]);
            if let mergescope_figures::Figure::Heatmap(h) = &mut fig {
                h.y = mergescope_figures::Axis::Categories(
                    grid.ys
                        .iter()
                        .map(|r| format!("{}%", mergescope_figures::format_number(100.0 * r)))
                        .collect(),
                );
            }
            fig
        }
        Kind::Plane => {
            let mut overlay = Vec::new();
            for t in &a.trajectories {
                let iterates = read_iterates(t, &device)?;
                let points = iterates
                    .iter()
                    .map(|(_, p)| families[0].project(p))
                    .collect::<Result<Vec<_>, _>>()?;
                overlay.push(FigPath {
                    label: short_name(t),
                    points,
                });
            }
            landscape_figure(&grid, &metric, &labels, overlay, marks)
        }
    };
    a.common.write(&figure)
}

fn labels(title: &str, x: &str, y: &str) -> LandscapeLabels {
    LandscapeLabels {
        title: title.to_owned(),
        x: x.to_owned(),
        y: y.to_owned(),
    }
}

fn mark(x: f64, y: f64, label: &str) -> Point {
    Point {
        x,
        y,
        label: label.to_owned(),
        group: "checkpoint".into(),
        info: vec![],
    }
}

/// Dashed reference levels from the manifest: the base's and the experts' mean test accuracy
/// (accuracy metrics only; other metrics have no stored reference).
fn reference_lines(bench: &mergescope_engine::demo::Benchmark, metric: &Metric) -> Vec<(String, f64)> {
    use mergescope_engine::analysis::landscape::MetricKind;
    let tasks = &bench.manifest.tasks;
    let pick = |t: &&mergescope_engine::demo::BenchmarkTask| metric.task.as_ref().is_none_or(|n| *n == t.name);
    let chosen: Vec<_> = tasks.iter().filter(pick).collect();
    if chosen.is_empty() {
        return vec![];
    }
    let mean = |f: &dyn Fn(&mergescope_engine::demo::BenchmarkTask) -> f64| {
        chosen.iter().map(|t| f(t)).sum::<f64>() / chosen.len() as f64
    };
    match metric.kind {
        MetricKind::Accuracy => vec![
            (
                "base (full test split)".into(),
                mean(&|t| t.base_accuracy.get(SplitKind::Test)),
            ),
            (
                "experts (full test split)".into(),
                mean(&|t| t.expert_accuracy.get(SplitKind::Test)),
            ),
        ],
        MetricKind::Normalized => vec![("experts".into(), 1.0)],
        MetricKind::Loss => vec![],
    }
}

/// The best value over λ of each rank, against the rank fraction.
fn rank_curve(grid: &LandscapeGrid, metric: &Metric) -> mergescope_figures::Figure {
    let values = grid.values(metric);
    let lower = metric.lower_is_better();
    let best: Vec<[f64; 2]> = grid
        .ys
        .iter()
        .zip(&values)
        .map(|(k, row)| {
            let b = row
                .iter()
                .copied()
                .filter(|v| v.is_finite())
                .reduce(|x, y| if (y < x) == lower { y } else { x })
                .unwrap_or(f64::NAN);
            [*k, b]
        })
        .collect();
    mergescope_figures::Figure::Lines(mergescope_figures::Lines {
        title: "CART: accuracy at the best λ of each rank (seed 001 Fig. 5 left)".into(),
        x_label: "rank fraction k / min(m, n)".into(),
        y_label: metric.label(),
        y2_label: None,
        log_x: true,
        log_y: false,
        series: vec![mergescope_figures::Series {
            label: format!("{} at the best λ", metric.label()),
            points: best,
            side: mergescope_figures::Side::Left,
            dashed: false,
            color: None,
        }],
        better: Some(if lower {
            mergescope_figures::Better::Lower
        } else {
            mergescope_figures::Better::Higher
        }),
    })
}
