//! `mergescope analyze landscape`: a metric over task arithmetic's λ line, CART's rank × λ grid
//! (or its best-λ accuracy against rank) or the plane through the base and two checkpoints,
//! evaluated coarse to fine, cached, resumable after Ctrl-C; in this process (`--executor
//! local`) or as a grid of cells on Slurm (`--executor slurm`: a few points per array task,
//! gathered into the same cache entry and figure).

use super::{Common, short_name};
use crate::cli::sweep_slurm::{GridRunArgs, shown};
use crate::cli::{cancel_on_ctrl_c, progress_bar};
use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use mergescope_engine::error::EngineError;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::evaluator::suite::is_suite_path;
use mergescope_studies::analysis::landscape::Metric;
use mergescope_studies::analysis::landscape_run::{LandscapeKind, LandscapeSource, LandscapeSpec, prepare_landscape};
use mergescope_studies::grid::drive::drive;
use mergescope_studies::grid::landscape::{LandscapeJob, SlurmLandscape};
use mergescope_studies::grid::{ExecutorKind, mergescope_env};
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
    /// The plane of the first two principal directions of --trajectory's iterates.
    TrajectoryPlane,
}

#[derive(Args, Debug)]
#[command(mut_arg("executor", |a| a.help(
    "Where the points are evaluated: `local` (this process) or `slurm` (one Slurm array job, a few points per task; see docs/slurm.md)"
)))]
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
    /// Plane: coefficients of both directions as START:END:COUNT (trajectory plane: only
    /// COUNT is used; the extent follows the trajectory).
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
    #[arg(long, default_value_t = 64)]
    pub samples: usize,
    /// Recompute instead of reusing (or resuming) the cached grid.
    #[arg(long)]
    pub no_cache: bool,
    /// Folder of task files, when the benchmark was built with `demo build --data DIR`.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Where the points are evaluated, and how (its --executor help is this command's, above).
    #[command(flatten)]
    pub run: GridRunArgs,
    /// Slurm: points per array task, consecutive row by row (default: a row of the grid; one
    /// point for a one-row landscape such as the TA line).
    #[arg(long, value_name = "N")]
    pub points_per_cell: Option<usize>,
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
    let executor = a.run.executor(&[("--points-per-cell", a.points_per_cell.is_some())])?;
    if a.points_per_cell == Some(0) {
        bail!("--points-per-cell must be at least 1");
    }
    a.common.check_outputs()?;
    let kind = match a.kind {
        Kind::TaLine => LandscapeKind::TaLine,
        Kind::Cart => LandscapeKind::Cart,
        Kind::CartRank => LandscapeKind::CartRank,
        Kind::Plane => LandscapeKind::Plane,
        Kind::TrajectoryPlane => LandscapeKind::TrajectoryPlane,
    };
    let models = a.common.models.paths()?;
    let mut spec = LandscapeSpec::defaults(kind);
    if let Some(l) = &a.lambdas {
        spec.lambdas = linspace(l, "--lambdas")?;
    }
    spec.ranks = a.ranks.clone();
    spec.range = linspace(&a.range, "--range")?;
    spec.trajectories = a.trajectories.clone();
    spec.metric = Metric::parse(&a.metric, a.task.as_deref())?;
    spec.samples = a.samples;
    if kind == LandscapeKind::Plane {
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
        spec.through = Some((resolve(first)?, resolve(second)?));
    }
    let device = a.common.device()?;
    if executor == ExecutorKind::Slurm {
        return run_on_slurm(a, spec, models, &device);
    }
    let prepared = if is_suite_path(&a.common.models.benchmark) {
        let evaluator = a.common.evaluator(&models, None)?;
        let source = LandscapeSource::Evaluator(evaluator.as_ref(), vec![PathBuf::from(&a.common.models.benchmark)]);
        prepare_landscape(source, &models.base, &models.experts, &spec, &device)?
    } else {
        let bench = a.common.models.benchmark()?;
        let tasks = benchmark_tasks(a.data.as_deref())?;
        prepare_landscape(
            LandscapeSource::Benchmark(&bench, &tasks),
            &models.base,
            &models.experts,
            &spec,
            &device,
        )?
    };
    let mut grid = prepared.initial_grid(!a.no_cache);
    let cached = grid.done();
    let bar = progress_bar(a.run.quiet);
    bar.set_length(grid.cells.len() as u64);
    bar.set_position(cached as u64);
    bar.set_message("landscape");
    let started = Instant::now();
    let mut first_preview: Option<f64> = None;
    let coarse = 4.min(grid.cells.len());
    let result = prepared.fill(
        &mut grid,
        &mut |_, _, _, done, _| {
            bar.set_position(done as u64);
            if done >= coarse && first_preview.is_none() {
                first_preview = Some(started.elapsed().as_secs_f64());
            }
        },
        cancel_on_ctrl_c(),
    );
    bar.finish_and_clear();
    match result {
        Err(EngineError::Cancelled) => bail!(
            "cancelled after {} of {} points; they are cached, and the same command resumes from there",
            grid.done(),
            grid.cells.len()
        ),
        other => other?,
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
    a.common.write(&prepared.figure(&grid, &device)?)
}

/// Evaluates the landscape's points as a grid of cells on Slurm, gathers them into the cache
/// and writes the figure as the local run does.
fn run_on_slurm(
    a: &LandscapeArgs,
    spec: LandscapeSpec,
    models: crate::cli::inputs::Models,
    device: &mergescope_engine::device::Device,
) -> anyhow::Result<()> {
    let output = a.common.output.png.as_ref().or(a.common.output.csv.as_ref());
    let workdir = match (&a.run.slurm.workdir, output) {
        (Some(w), _) => w.clone(),
        (None, Some(out)) => {
            let stem = out
                .file_stem()
                .map_or("landscape".into(), |s| s.to_string_lossy().into_owned());
            out.with_file_name(format!("{stem}.slurm"))
        }
        (None, None) => bail!(
            "--executor slurm writes the figure to a file: give --png or --csv (or --workdir DIR, a folder every node sees, for the job's files)"
        ),
    };
    let benchmark = if is_suite_path(&a.common.models.benchmark) {
        a.common.models.benchmark.clone()
    } else {
        a.common.models.benchmark()?.dir.to_string_lossy().into_owned()
    };
    let job = LandscapeJob {
        workdir,
        benchmark,
        data: a.data.clone(),
        base: models.base,
        experts: models.experts,
        device: a.common.device.clone(),
        spec,
        points_per_cell: a.points_per_cell.unwrap_or(0),
        key: String::new(),
        nx: 0,
        ny: 0,
    };
    let cancel = cancel_on_ctrl_c();
    let results = output.cloned().unwrap_or_else(|| PathBuf::from("(stdout)"));
    let slurm = a.run.slurm.settings();
    let plan = SlurmLandscape::prepare(
        job,
        &slurm.node_binary()?,
        mergescope_env(),
        !a.no_cache,
        results,
        cancel,
    )?;
    let opts = slurm.options("mergescope-landscape")?;
    let headline = format!(
        "landscape of {} points in {} cells",
        plan.job.nx * plan.job.ny,
        plan.cells()
    );
    let shown = shown(a.run.quiet);
    let Some((outcome, grid)) = drive(&plan, &opts, slurm.dry_run, &headline, &shown, cancel)? else {
        return Ok(());
    };
    if grid.cancelled {
        bail!("cancelled: the finished cells stay, and the same command resumes from there");
    }
    a.common.write(&plan.prepared().figure(&outcome.landscape, device)?)?;
    if !grid.missing.is_empty() {
        bail!(
            "{} of {} cells have no result (the figure leaves their points empty); run the same command again: only they are submitted",
            grid.missing.len(),
            grid.cells
        );
    }
    Ok(())
}
