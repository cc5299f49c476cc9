//! A landscape from a specification to a figure, shared by `mergescope analyze landscape` and
//! the GUI: load the models, build the family (TA line, CART rank × λ, plane), reuse or
//! resume the cached grid, fill it coarse to fine, and draw the figure of any state of it.

use super::landscape::{
    AffineFamily, LandscapeGrid, Metric, MetricKind, cache_key, cart_families, fill_grid, load_cached, save_cached,
};
use super::points::{checkpoint_label, read_iterates};
use super::views::{LandscapeLabels, landscape_figure, line_figure};
use candle_core::Device;
use mergescope_engine::error::{EngineError, Result};
use mergescope_figures::{
    Axis, Better, Figure, Lines, Path as FigPath, Point, Series, Side, finite_range, format_number,
};
use mergescope_lab::data::{SplitKind, TaskData};
use mergescope_lab::demo::{Benchmark, load_params};
use mergescope_lab::evaluator::{EvalReport, Evaluator, InMemoryEvaluator};
use mergescope_lab::nn::Params;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// Which landscape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LandscapeKind {
    /// θ0 + λ·Σ_t τ_t over the λ values.
    TaLine,
    /// CART's rank × λ grid.
    Cart,
    /// CART: the metric at the best λ of each rank (the same grid).
    CartRank,
    /// θ0 + α·(A − θ0) + β·(B − θ0).
    Plane,
    /// The plane of a trajectory's first two principal directions, around its mean.
    TrajectoryPlane,
}

/// Everything that defines a landscape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LandscapeSpec {
    /// Which landscape.
    pub kind: LandscapeKind,
    /// λ values (TA line, CART).
    pub lambdas: Vec<f64>,
    /// CART rank fractions.
    pub ranks: Vec<f64>,
    /// Plane coefficients of both directions.
    pub range: Vec<f64>,
    /// Plane: the two checkpoints spanning it with the base.
    pub through: Option<(PathBuf, PathBuf)>,
    /// Plane: trajectories projected onto it.
    pub trajectories: Vec<PathBuf>,
    /// What is shown.
    pub metric: Metric,
    /// Test examples per task at each point (0: all).
    pub samples: usize,
    /// Where grids are cached (default: the cache folder's `landscapes/`).
    pub cache_root: Option<PathBuf>,
}

impl LandscapeSpec {
    /// Defaults of `kind`: λ 0..1.5 (16) for the TA line, 0..2 (11) for CART, ranks 2 %…100 %,
    /// plane −0.5..1.5 (21 × 21); mean accuracy on 64 test images per task (evenly spaced).
    pub fn defaults(kind: LandscapeKind) -> LandscapeSpec {
        let linspace = |a: f64, b: f64, n: usize| (0..n).map(|i| a + (b - a) * i as f64 / (n - 1) as f64).collect();
        LandscapeSpec {
            kind,
            lambdas: if kind == LandscapeKind::TaLine {
                linspace(0.0, 1.5, 16)
            } else {
                linspace(0.0, 2.0, 11)
            },
            ranks: vec![0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0],
            range: linspace(-0.5, 1.5, 21),
            through: None,
            trajectories: Vec::new(),
            metric: Metric {
                kind: MetricKind::Accuracy,
                task: None,
            },
            samples: 64,
            cache_root: None,
        }
    }
}

/// A landscape ready to compute: models loaded, family built, cache key known.
pub struct PreparedLandscape {
    spec: LandscapeSpec,
    families: Vec<AffineFamily>,
    evaluator: Box<dyn InMemoryEvaluator>,
    xs: Vec<f64>,
    ys: Vec<f64>,
    labels: LandscapeLabels,
    marks: Vec<Point>,
    key: String,
    references: Vec<(String, f64)>,
    /// The trajectory drawn on a trajectory plane, in its coordinates.
    own_path: Option<FigPath>,
}

/// `p` with only the tensors `base` has.
fn like(mut p: Params, base: &Params) -> Params {
    p.retain(|k, _| base.contains_key(k));
    p
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

fn labels(title: &str, x: &str, y: &str) -> LandscapeLabels {
    LandscapeLabels {
        title: title.to_owned(),
        x: x.to_owned(),
        y: y.to_owned(),
    }
}

/// Dashed reference levels from the manifest: the base's and the experts' mean test accuracy
/// (accuracy metrics; the experts' 100 % for normalised accuracy).
fn reference_lines(bench: &Benchmark, metric: &Metric) -> Vec<(String, f64)> {
    let chosen: Vec<_> = bench
        .manifest
        .tasks
        .iter()
        .filter(|t| metric.task.as_ref().is_none_or(|n| *n == t.name))
        .collect();
    if chosen.is_empty() {
        return vec![];
    }
    let n = chosen.len() as f64;
    match metric.kind {
        MetricKind::Accuracy => vec![
            (
                "base (full test split)".into(),
                chosen.iter().map(|t| t.base_accuracy.get(SplitKind::Test)).sum::<f64>() / n,
            ),
            (
                "experts (full test split)".into(),
                chosen
                    .iter()
                    .map(|t| t.expert_accuracy.get(SplitKind::Test))
                    .sum::<f64>()
                    / n,
            ),
        ],
        MetricKind::Normalized => vec![("experts".into(), 1.0)],
        MetricKind::Loss => vec![],
    }
}

/// What scores a landscape's points.
pub enum LandscapeSource<'a> {
    /// A demo benchmark's test splits of `tasks`, with its manifest's reference levels.
    Benchmark(&'a Benchmark, &'a [TaskData]),
    /// Any evaluator that scores models in memory (a suite's family); `files` are what it reads
    /// besides the models (the suite file), for the cache key.
    Evaluator(&'a dyn Evaluator, Vec<PathBuf>),
}

/// Loads the models and builds the landscape of `spec` (base and experts given as files),
/// scored by `source` on its test data.
pub fn prepare_landscape(
    source: LandscapeSource<'_>,
    base_path: &Path,
    expert_paths: &[PathBuf],
    spec: &LandscapeSpec,
    device: &Device,
) -> Result<PreparedLandscape> {
    if let Some(r) = spec.ranks.iter().find(|r| !(0.0..=1.0).contains(*r)) {
        return Err(EngineError::Param(format!("rank fraction {r} is not in [0, 1]")));
    }
    let mut inputs = vec![base_path.to_path_buf()];
    inputs.extend(expert_paths.iter().cloned());
    let (evaluator, task_names, identity, references): (Box<dyn InMemoryEvaluator>, Vec<String>, String, _) =
        match source {
            LandscapeSource::Benchmark(bench, tasks) => (
                Box::new(
                    bench
                        .evaluator(tasks, None, SplitKind::Test, device)?
                        .subsample(spec.samples)?,
                ),
                bench.task_names().iter().map(|t| (*t).to_owned()).collect(),
                format!("arch={}", bench.manifest.arch),
                reference_lines(bench, &spec.metric),
            ),
            LandscapeSource::Evaluator(ev, files) => {
                let scorer = ev.in_memory(base_path, spec.samples)?.ok_or_else(|| {
                    EngineError::Param(format!(
                        "{} scores only saved files (an external command), so it cannot draw a landscape of thousands of models; use a suite with a built-in [model] family",
                        ev.describe()
                    ))
                })?;
                inputs.extend(files);
                (scorer, ev.task_names(), format!("evaluator={}", ev.describe()), vec![])
            }
        };
    if let Some(t) = &spec.metric.task
        && !task_names.contains(t)
    {
        return Err(EngineError::Param(format!(
            "task '{t}' is not a task of this benchmark; it has: {}",
            task_names.join(", ")
        )));
    }
    // Only the tensors every model has are interpolated: task heads that the experts carry and
    // the base lacks (a text or image model's classifier) come from the evaluator's tasks.
    let mut base = load_params(base_path, device)?;
    let experts: Vec<Params> = expert_paths
        .iter()
        .map(|p| load_params(p, device))
        .collect::<Result<_>>()?;
    base.retain(|k, t| experts.iter().all(|e| e.get(k).is_some_and(|o| o.dims() == t.dims())));
    if base.is_empty() {
        return Err(EngineError::Incompatible(format!(
            "'{}' and the experts share no tensor of the same name and shape",
            base_path.display()
        )));
    }
    let experts: Vec<Params> = experts.into_iter().map(|e| like(e, &base)).collect();
    let mut own_path = None;
    let (families, xs, ys, labels, marks) = match spec.kind {
        LandscapeKind::TaLine => (
            vec![AffineFamily::task_arithmetic(&base, &experts)?],
            spec.lambdas.clone(),
            vec![0.0],
            labels("Task arithmetic: θ0 + λ·Σ_t τ_t", "λ", ""),
            vec![],
        ),
        LandscapeKind::Cart | LandscapeKind::CartRank => (
            cart_families(&experts, &spec.ranks, device)?,
            spec.lambdas.clone(),
            spec.ranks.clone(),
            labels(
                "CART: θ_mean + λ·Σ_t SVD_k(θ_t − θ_mean)",
                "λ",
                "rank kept, % of min(m, n)",
            ),
            vec![],
        ),
        LandscapeKind::Plane => {
            let (pa, pb) = spec.through.clone().ok_or_else(|| {
                EngineError::Param("a plane needs two checkpoints (experts or merges) to pass through".into())
            })?;
            let fam = AffineFamily::plane(
                &base,
                &like(load_params(&pa, device)?, &base),
                &like(load_params(&pb, device)?, &base),
            )?;
            let (na, nb) = (checkpoint_label(&pa), checkpoint_label(&pb));
            let l = labels(
                &format!("Plane θ0 + α·(θ_{na} − θ0) + β·(θ_{nb} − θ0)"),
                &format!("α ({na})"),
                &format!("β ({nb})"),
            );
            inputs.extend([pa, pb]);
            let marks = vec![mark(0.0, 0.0, "base"), mark(1.0, 0.0, &na), mark(0.0, 1.0, &nb)];
            (vec![fam], spec.range.clone(), spec.range.clone(), l, marks)
        }
        LandscapeKind::TrajectoryPlane => {
            let path = spec.trajectories.first().cloned().ok_or_else(|| {
                EngineError::Param("a trajectory plane needs a trajectory (a model-level method's run)".into())
            })?;
            let iterates: Vec<Params> = read_iterates(&path, device)?
                .into_iter()
                .map(|(_, p)| like(p, &base))
                .collect();
            let (fam, coords) = AffineFamily::principal_plane(&iterates)?;
            let n = spec.range.len().max(2);
            // The grid spans the trajectory with half its extent again on each side.
            let axis = |k: usize| -> Vec<f64> {
                let (lo, hi) = finite_range(coords.iter().map(|c| c[k])).unwrap_or((0.0, 0.0));
                let span = (hi - lo).max(1e-6);
                let (a, b) = (lo - 0.5 * span, hi + 0.5 * span);
                (0..n).map(|i| a + (b - a) * i as f64 / (n - 1) as f64).collect()
            };
            let (xs, ys) = (axis(0), axis(1));
            let inside = |p: &[f64; 2]| (xs[0]..=xs[n - 1]).contains(&p[0]) && (ys[0]..=ys[n - 1]).contains(&p[1]);
            let mut marks = Vec::new();
            let b = fam.project(&base)?;
            if inside(&b) {
                marks.push(mark(b[0], b[1], "base"));
            }
            for (e, p) in experts.iter().zip(expert_paths) {
                let q = fam.project(e)?;
                if inside(&q) {
                    marks.push(mark(q[0], q[1], &checkpoint_label(p)));
                }
            }
            let name = checkpoint_label(&path);
            own_path = Some(FigPath {
                label: name.clone(),
                points: coords,
            });
            inputs.push(path);
            let l = labels(
                &format!("Around the trajectory of {name}: its first two principal directions"),
                "PC1 of the iterates (parameter distance)",
                "PC2 of the iterates (parameter distance)",
            );
            (vec![fam], xs, ys, l, marks)
        }
    };
    // The rank × λ grid serves both CART views.
    let family = if spec.kind == LandscapeKind::CartRank {
        LandscapeKind::Cart
    } else {
        spec.kind
    };
    let description = format!("{family:?} xs={xs:?} ys={ys:?} samples={} {identity}", spec.samples);
    Ok(PreparedLandscape {
        references,
        own_path,
        spec: spec.clone(),
        families,
        evaluator,
        xs,
        ys,
        labels,
        marks,
        key: cache_key(&description, &inputs),
    })
}

impl PreparedLandscape {
    /// The grid to start from: the cached one (complete or partial) or an empty one.
    pub fn initial_grid(&self, use_cache: bool) -> LandscapeGrid {
        use_cache
            .then(|| load_cached(self.spec.cache_root.as_deref(), &self.key))
            .flatten()
            .filter(|g| g.xs == self.xs && g.ys == self.ys)
            .unwrap_or_else(|| LandscapeGrid::new(self.xs.clone(), self.ys.clone()))
    }

    /// Computes the missing cells coarse to fine (see [`fill_grid`]), then caches the grid,
    /// also when cancelled or failed, so the next run resumes.
    pub fn fill(
        &self,
        grid: &mut LandscapeGrid,
        on_cell: &mut dyn FnMut(usize, usize, &EvalReport, usize, usize),
        cancel: &AtomicBool,
    ) -> Result<()> {
        let model = |r: usize, c: usize| self.model(r, c);
        let result = fill_grid(grid, self.evaluator.as_ref(), &model, on_cell, cancel);
        self.save(grid)?;
        result
    }

    /// The model at row `r`, column `c` of the grid.
    fn model(&self, r: usize, c: usize) -> Result<Params> {
        match self.spec.kind {
            LandscapeKind::Plane | LandscapeKind::TrajectoryPlane => self.families[0].at(&[self.xs[c], self.ys[r]]),
            LandscapeKind::TaLine => self.families[0].at(&[self.xs[c]]),
            LandscapeKind::Cart | LandscapeKind::CartRank => self.families[r].at(&[self.xs[c]]),
        }
    }

    /// Evaluates the points `(row, col)` (a cell of a grid run elsewhere), side by side on the
    /// worker threads, in the order given.
    pub fn evaluate_points(&self, points: &[(usize, usize)], cancel: &AtomicBool) -> Result<Vec<EvalReport>> {
        use rayon::prelude::*;
        let (nx, ny) = (self.xs.len(), self.ys.len());
        if let Some((r, c)) = points.iter().find(|(r, c)| *r >= ny || *c >= nx) {
            return Err(EngineError::Param(format!(
                "point ({r}, {c}) is outside the {ny} × {nx} grid"
            )));
        }
        let width = rayon::current_num_threads().max(1);
        let mut out = Vec::with_capacity(points.len());
        for chunk in points.chunks(width) {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(EngineError::Cancelled);
            }
            let reports: Vec<Result<EvalReport>> = chunk
                .par_iter()
                .map(|&(r, c)| self.evaluator.evaluate(&self.model(r, c)?))
                .collect();
            for r in reports {
                out.push(r?);
            }
        }
        Ok(out)
    }

    /// Caches `grid` (complete or partial) under this landscape's key.
    pub fn save(&self, grid: &LandscapeGrid) -> Result<()> {
        save_cached(self.spec.cache_root.as_deref(), &self.key, grid)
    }

    /// The cache key: what the landscape is and the identity of every input file.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The grid's columns and rows.
    pub fn shape(&self) -> (usize, usize) {
        (self.xs.len(), self.ys.len())
    }

    /// The figure of `grid` in any state (previews while it fills in).
    pub fn figure(&self, grid: &LandscapeGrid, device: &Device) -> Result<Figure> {
        let metric = &self.spec.metric;
        Ok(match self.spec.kind {
            LandscapeKind::TaLine => line_figure(
                grid,
                metric,
                &self.labels.title,
                &self.labels.x,
                &|_| metric.label(),
                &self.references,
            ),
            LandscapeKind::CartRank => rank_curve(grid, metric),
            LandscapeKind::Cart => {
                // Ranks are geometric: one row each, named by their percentage.
                let mut fig = landscape_figure(grid, metric, &self.labels, vec![], vec![]);
                if let Figure::Heatmap(h) = &mut fig {
                    h.y = Axis::Categories(
                        grid.ys
                            .iter()
                            .map(|r| format!("{}%", format_number(100.0 * r)))
                            .collect(),
                    );
                }
                fig
            }
            LandscapeKind::TrajectoryPlane => {
                let overlay = self.own_path.clone().into_iter().collect();
                landscape_figure(grid, metric, &self.labels, overlay, self.marks.clone())
            }
            LandscapeKind::Plane => {
                let mut overlay = Vec::new();
                for t in &self.spec.trajectories {
                    let points = read_iterates(t, device)?
                        .iter()
                        .map(|(_, p)| self.families[0].project(p))
                        .collect::<Result<Vec<_>>>()?;
                    overlay.push(FigPath {
                        label: checkpoint_label(t),
                        points,
                    });
                }
                landscape_figure(grid, metric, &self.labels, overlay, self.marks.clone())
            }
        })
    }
}

/// The best value over λ of each rank, against the rank fraction (seed 001 Fig. 5 left).
fn rank_curve(grid: &LandscapeGrid, metric: &Metric) -> Figure {
    let lower = metric.lower_is_better();
    let best: Vec<[f64; 2]> = grid
        .ys
        .iter()
        .zip(grid.values(metric))
        .map(|(k, row)| {
            let b = row
                .into_iter()
                .filter(|v| v.is_finite())
                .reduce(|x, y| if (y < x) == lower { y } else { x })
                .unwrap_or(f64::NAN);
            [*k, b]
        })
        .collect();
    Figure::Lines(Lines {
        title: "CART: accuracy at the best λ of each rank (seed 001 Fig. 5 left)".into(),
        x_label: "rank fraction k / min(m, n)".into(),
        y_label: metric.label(),
        y2_label: None,
        log_x: true,
        log_y: false,
        series: vec![Series {
            label: format!("{} at the best λ", metric.label()),
            points: best,
            side: Side::Left,
            dashed: false,
            color: None,
            errors: Vec::new(),
        }],
        better: Some(if lower { Better::Lower } else { Better::Higher }),
        notes: Vec::new(),
    })
}
