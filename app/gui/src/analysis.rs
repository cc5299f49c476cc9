//! The analysis views of the window, without egui: which view, on which inputs, computed on
//! a background thread that sends figures as they improve (landscapes fill in coarse to
//! fine) and can be cancelled. The numbers and figures come from `engine::analysis`, the
//! same code as `mergescope analyze`.

use crate::jobs::{Background, Notify, TaskMessage};
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::error::{EngineError, Result};
use mergescope_figures::Figure;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::{Benchmark, BuildProgress};
use mergescope_lab::evaluate::{EvaluatorSpec, open_normalised};
use mergescope_lab::evaluator::EvalReport;
use mergescope_lab::evaluator::Evaluator;
use mergescope_lab::text_bench::oracle::{OracleSettings, OracleText, run_oracle};
use mergescope_studies::analysis::landscape::{Metric, MetricKind};
use mergescope_studies::analysis::landscape_run::{LandscapeKind, LandscapeSource, LandscapeSpec, prepare_landscape};
use mergescope_studies::analysis::spectrum::{matrix_names, task_spectra};
use mergescope_studies::analysis::views::{
    Role, cosine_figure, oracle_figure, pca_figure, radar_figure, rank_curves_figure, spectrum_figure,
};
use mergescope_studies::analysis::{checkpoint_label, gram_of_files};
use mergescope_studies::scaling::views::{
    BoundSettings, Mask, bound_figure, bound_of_files, heterogeneity_figure, heterogeneity_of_files, train_facts,
    weights_figure,
};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// The views, in menu order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewKind {
    /// Base, experts, merges and trajectories on two principal components.
    Pca,
    /// Per-task normalised accuracy of the merges.
    Radar,
    /// Task-vector cosine similarity.
    Cosine,
    /// Singular values of the largest weight's task matrices.
    Spectrum,
    /// CART's R(k) and I(k).
    RankCurves,
    /// Task arithmetic's λ line.
    TaLine,
    /// CART's rank × λ grid.
    CartGrid,
    /// CART's best λ per rank.
    CartRank,
    /// The plane through the base and two experts.
    Plane,
    /// The plane of a trajectory's first two principal directions.
    TrajectoryPlane,
    /// Seed 002: the heterogeneity proxy before and after a TIES mask, with δ_i.
    Heterogeneity,
    /// Seed 002: effective task weights from the experts' step counts.
    Weights,
    /// Seed 002: the excess-risk bound's stability and optimisation parts.
    Bound,
    /// Seed 004: task vectors as gradients, ||θ_TA − θ_MT|| against η on the text benchmark.
    Oracle,
}

impl ViewKind {
    /// Every view.
    pub const ALL: [ViewKind; 14] = [
        ViewKind::Pca,
        ViewKind::Radar,
        ViewKind::Cosine,
        ViewKind::Spectrum,
        ViewKind::RankCurves,
        ViewKind::TaLine,
        ViewKind::CartGrid,
        ViewKind::CartRank,
        ViewKind::Plane,
        ViewKind::TrajectoryPlane,
        ViewKind::Heterogeneity,
        ViewKind::Weights,
        ViewKind::Bound,
        ViewKind::Oracle,
    ];

    /// Name in the view picker.
    pub fn label(self) -> &'static str {
        match self {
            ViewKind::Pca => "PCA",
            ViewKind::Radar => "Radar",
            ViewKind::Cosine => "Cosine",
            ViewKind::Spectrum => "Spectrum",
            ViewKind::RankCurves => "R(k) / I(k)",
            ViewKind::TaLine => "λ line",
            ViewKind::CartGrid => "CART rank × λ",
            ViewKind::CartRank => "CART rank",
            ViewKind::Plane => "Plane",
            ViewKind::TrajectoryPlane => "Trajectory plane",
            ViewKind::Heterogeneity => "Heterogeneity",
            ViewKind::Weights => "Task weights",
            ViewKind::Bound => "Bound",
            ViewKind::Oracle => "Oracle (text)",
        }
    }

    /// Whether the view draws the selected merges (or their trajectories), so it follows the
    /// selection.
    pub fn uses_merges(self) -> bool {
        matches!(
            self,
            ViewKind::Pca | ViewKind::Radar | ViewKind::Plane | ViewKind::TrajectoryPlane
        )
    }

    /// Whether the view evaluates models (landscapes), so it needs a benchmark.
    pub fn is_landscape(self) -> bool {
        matches!(
            self,
            ViewKind::TaLine | ViewKind::CartGrid | ViewKind::CartRank | ViewKind::Plane
        )
    }
}

/// What a view is computed on, taken from the session when it starts.
#[derive(Clone, Debug, Default)]
pub struct AnalysisInputs {
    /// Base checkpoint.
    pub base: Option<PathBuf>,
    /// Experts: label and file.
    pub experts: Vec<(String, PathBuf)>,
    /// Selected merges: label, file, evaluation.
    pub merges: Vec<(String, PathBuf, Option<EvalReport>)>,
    /// Trajectory files of the selected merges.
    pub trajectories: Vec<PathBuf>,
    /// The benchmark (landscapes, base evaluation on the radar).
    pub benchmark: Option<Benchmark>,
    /// The base's evaluation, when known (radar).
    pub base_eval: Option<EvalReport>,
    /// Where landscapes are cached (default: the cache folder).
    pub cache_root: Option<PathBuf>,
    /// Float tensors of the base (the per-layer choices).
    pub tensors: Vec<String>,
    /// Task names of the benchmark (the per-task metric choices).
    pub tasks: Vec<String>,
    /// The suite models are evaluated with, when no benchmark is open (radar, landscapes).
    pub suite: Option<PathBuf>,
    /// The device the session's runs use; landscapes evaluate on it.
    pub device: DeviceChoice,
    /// The text benchmark build the oracle runs on (the open suite's, else the cache's).
    pub text_build: Option<PathBuf>,
}

impl AnalysisInputs {
    /// The suite's evaluator for these inputs, normalised by the experts (one per task).
    fn suite_evaluator(
        &self,
        base: &std::path::Path,
        experts: &[PathBuf],
        cancel: &AtomicBool,
    ) -> Result<Option<Box<dyn Evaluator>>> {
        let Some(suite) = &self.suite else {
            return Ok(None);
        };
        let (device, _) = open_device(self.device);
        let spec = EvaluatorSpec::new(suite.display().to_string(), &device);
        Ok(Some(open_normalised(&spec, base, experts, cancel)?))
    }
}

/// A figure as it improves (or none yet), with progress (landscape points, or the oracle's
/// steps).
type Update = (Option<Box<Figure>>, Option<(usize, usize)>);

/// The choices a view is computed with.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewOptions {
    /// Metric of landscapes.
    pub metric: MetricKind,
    /// Landscapes: one task's metric, or the mean over tasks (`None`).
    pub task: Option<String>,
    /// Plane: indices of the two experts it passes through.
    pub plane: (usize, usize),
    /// PCA: the components on the axes (1-based).
    pub pcs: (usize, usize),
    /// Cosine: one tensor (a layer), or the whole model (`None`).
    pub tensor: Option<String>,
    /// Heterogeneity: the TIES mask's density.
    pub density: f64,
    /// Bound: the constants the user chooses (the rest is measured).
    pub bound: BoundSettings,
    /// Oracle: train texts per task, learning rates, epochs and precision as typed in the form
    /// (`analyze oracle`'s options and defaults, parsed by the same door).
    pub oracle: OracleText,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            metric: MetricKind::Accuracy,
            task: None,
            plane: (0, 1),
            pcs: (1, 2),
            tensor: None,
            density: 0.2,
            bound: BoundSettings::default(),
            oracle: OracleText::default(),
        }
    }
}

/// The analysis panel's state: the view shown, its figure, and the computation in flight.
pub struct Analysis {
    /// Whether the panel is open.
    pub open: bool,
    /// View shown.
    pub kind: ViewKind,
    /// The choices of the views.
    pub options: ViewOptions,
    /// The latest figure.
    pub figure: Option<Figure>,
    /// Landscape progress (cells done, total).
    pub progress: Option<(usize, usize)>,
    /// Why the last computation failed.
    pub error: Option<String>,
    /// Seconds the last computation took.
    pub seconds: Option<f64>,
    /// Inputs of the figure shown.
    pub inputs: AnalysisInputs,
    /// The runs (ids) whose merges the figure shows, and whether they are every finished run
    /// because none was selected; the window redraws when the selection changes them.
    pub runs: (Vec<u64>, bool),
    task: Background<Update, ()>,
}

impl Default for Analysis {
    fn default() -> Self {
        Analysis {
            open: false,
            kind: ViewKind::Pca,
            options: ViewOptions::default(),
            figure: None,
            progress: None,
            error: None,
            seconds: None,
            inputs: AnalysisInputs::default(),
            runs: (Vec::new(), false),
            task: Background::default(),
        }
    }
}

impl Analysis {
    /// Starts computing `kind` on `inputs` (cancelling any computation in flight).
    pub fn start(&mut self, kind: ViewKind, inputs: AnalysisInputs, notify: Notify) {
        self.open = true;
        self.kind = kind;
        self.error = None;
        self.progress = None;
        self.figure = None;
        self.seconds = None;
        self.inputs = inputs.clone();
        let options = self.options.clone();
        let started = self.task.start(
            "mergescope-analysis",
            notify,
            "the analysis panicked; please report it with the log",
            move |cancel, send| compute(kind, &inputs, &options, cancel, &mut |f, p| send((f.map(Box::new), p))),
        );
        if let Err(e) = started {
            self.error = Some(format!("cannot start the analysis thread: {e}"));
        }
    }

    /// Asks the computation in flight to stop (landscapes keep what they computed in the cache).
    pub fn cancel(&mut self) {
        self.task.cancel();
    }

    /// Whether a computation is in flight.
    pub fn running(&self) -> bool {
        self.task.since().is_some()
    }

    /// When the computation in flight started.
    pub fn running_since(&self) -> Option<Instant> {
        self.task.since()
    }

    /// Applies the thread's messages; returns whether anything changed.
    pub fn pump(&mut self) -> bool {
        let messages = self.task.messages();
        let changed = !messages.is_empty();
        for m in messages {
            match m {
                TaskMessage::Update((f, p)) => {
                    if let Some(f) = f {
                        self.figure = Some(*f);
                    }
                    self.progress = p;
                }
                TaskMessage::Done(r) => {
                    self.seconds = self.task.finish();
                    if let Err(e) = r {
                        self.error = Some(e.to_string());
                    }
                }
            }
        }
        changed
    }
}

fn compute(
    kind: ViewKind,
    inputs: &AnalysisInputs,
    options: &ViewOptions,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(Option<Figure>, Option<(usize, usize)>),
) -> Result<()> {
    if kind == ViewKind::Oracle {
        return oracle(inputs, &options.oracle, cancel, emit);
    }
    let mut emit = |f: Figure, p: Option<(usize, usize)>| emit(Some(f), p);
    let base = inputs
        .base
        .clone()
        .ok_or_else(|| EngineError::invalid("add a base checkpoint first (the analyses measure from it)"))?;
    let experts: Vec<PathBuf> = inputs.experts.iter().map(|(_, p)| p.clone()).collect();
    match kind {
        ViewKind::Pca => {
            let mut files = vec![base];
            let mut roles = vec![Role::Base];
            files.extend(experts.iter().cloned());
            roles.extend(experts.iter().map(|_| Role::Expert));
            files.extend(inputs.merges.iter().map(|(_, p, _)| p.clone()));
            roles.extend(inputs.merges.iter().map(|_| Role::Merge));
            let points = gram_of_files(&files, &inputs.trajectories, None, None)?;
            let names: Vec<String> = inputs.trajectories.iter().map(|p| checkpoint_label(p)).collect();
            let (a, b) = options.pcs;
            emit(pca_figure(&points, &roles, &names, (a.max(1) - 1, b.max(1) - 1))?, None);
        }
        ViewKind::Radar => {
            let mut models: Vec<(String, EvalReport)> = Vec::new();
            let base_eval = match (&inputs.base_eval, inputs.suite_evaluator(&base, &experts, cancel)?) {
                (Some(b), _) => Some(b.clone()),
                (None, Some(ev)) => Some(ev.evaluate_file(&base, cancel)?),
                (None, None) => None,
            };
            if let Some(b) = &base_eval {
                models.push(("base".into(), b.clone()));
            }
            models.extend(
                inputs
                    .merges
                    .iter()
                    .filter_map(|(l, _, e)| Some((l.clone(), e.clone()?))),
            );
            if models.len() <= usize::from(base_eval.is_some()) {
                return Err(EngineError::invalid(
                    "no evaluated merge to draw yet: merge with a benchmark or a suite open, and the merge is \
                     evaluated and drawn here",
                ));
            }
            emit(radar_figure(&models)?, None);
        }
        ViewKind::Cosine => {
            let tensor = options.tensor.as_deref();
            let points = gram_of_files(&experts, &[], Some(&base), tensor)?;
            let scope = tensor.map_or("whole model".to_owned(), |t| format!("tensor {t}"));
            let title = format!("Cosine similarity of task vectors θ − θ_base ({scope})");
            emit(cosine_figure(&points, &title), None);
        }
        ViewKind::Spectrum | ViewKind::RankCurves => {
            let tensor = matrix_names(&base)?
                .into_iter()
                .max_by_key(|(_, (r, c))| r * c)
                .map(|(n, _)| n)
                .ok_or_else(|| EngineError::invalid("the base has no 2-D weights"))?;
            let s = task_spectra(&base, &experts, &tensor)?;
            emit(
                if kind == ViewKind::Spectrum {
                    spectrum_figure(&s)
                } else {
                    rank_curves_figure(&s)
                },
                None,
            );
        }
        ViewKind::Heterogeneity => {
            let mask = Mask::Ties {
                density: options.density,
            };
            let h = heterogeneity_of_files(&base, &experts, None, mask)?;
            let names: Vec<String> = inputs.experts.iter().map(|(l, _)| l.clone()).collect();
            emit(heterogeneity_figure(&names, &h, mask), None);
        }
        ViewKind::Weights => {
            let steps: Vec<f64> = train_facts(&experts)?.iter().map(|f| f.steps).collect();
            let names: Vec<String> = inputs.experts.iter().map(|(l, _)| l.clone()).collect();
            emit(weights_figure(&names, &steps), None);
        }
        ViewKind::Bound => {
            let bench = inputs.benchmark.as_ref().ok_or_else(|| {
                EngineError::invalid("the bound measures gradients on calibration data: open a benchmark first")
            })?;
            let tasks = benchmark_tasks(None)?;
            let r = bound_of_files(bench, &tasks, &base, &experts, &options.bound, cancel)?;
            emit(bound_figure(&r.variants), None);
        }
        // Drawn above: it needs no base.
        ViewKind::Oracle => {}
        ViewKind::TaLine | ViewKind::CartGrid | ViewKind::CartRank | ViewKind::Plane | ViewKind::TrajectoryPlane => {
            let suite_ev = inputs.suite_evaluator(&base, &experts, cancel)?;
            let bench = match (&inputs.benchmark, &suite_ev) {
                (Some(b), _) => Some(b),
                (None, Some(_)) => None,
                (None, None) => {
                    return Err(EngineError::invalid(
                        "landscapes evaluate models: open a benchmark or a suite (File ▸ Open suite…) first",
                    ));
                }
            };
            let lk = match kind {
                ViewKind::TaLine => LandscapeKind::TaLine,
                ViewKind::CartGrid => LandscapeKind::Cart,
                ViewKind::CartRank => LandscapeKind::CartRank,
                ViewKind::TrajectoryPlane => LandscapeKind::TrajectoryPlane,
                _ => LandscapeKind::Plane,
            };
            let mut spec = LandscapeSpec::defaults(lk);
            spec.metric = Metric {
                kind: options.metric,
                task: options.task.clone(),
            };
            spec.cache_root = inputs.cache_root.clone();
            spec.trajectories = inputs.trajectories.clone();
            if lk == LandscapeKind::TrajectoryPlane && spec.trajectories.is_empty() {
                return Err(EngineError::invalid(
                    "select a run of a model-level method (it leaves a trajectory) first",
                ));
            }
            if lk == LandscapeKind::Plane {
                let (i, j) = options.plane;
                let (a, b) = (experts.get(i).cloned(), experts.get(j).cloned());
                let (Some(a), Some(b), true) = (a, b, i != j) else {
                    return Err(EngineError::invalid("a plane passes through two different experts"));
                };
                spec.through = Some((a, b));
            }
            let (device, _) = open_device(inputs.device);
            let tasks = benchmark_tasks(None)?;
            let source = match (bench, &suite_ev, &inputs.suite) {
                (Some(b), _, _) => LandscapeSource::Benchmark(b, &tasks),
                (None, Some(ev), Some(suite)) => LandscapeSource::Evaluator(ev.as_ref(), vec![suite.clone()]),
                _ => return Err(EngineError::Bug("a landscape without a benchmark or a suite".into())),
            };
            let prepared = prepare_landscape(source, &base, &experts, &spec, &device)?;
            let mut grid = prepared.initial_grid(true);
            let total = grid.cells.len();
            emit(prepared.figure(&grid, &device)?, Some((grid.done(), total)));
            let mut last = Instant::now();
            // The worker fills `grid`; a shadow copy takes each new cell so pictures can be
            // drawn while it runs: at most every 0.3 s, and for each of the first coarse points.
            let mut shadow = grid.clone();
            let nx = shadow.xs.len();
            let result = prepared.fill(
                &mut grid,
                &mut |r, c, report, done, total| {
                    shadow.cells[r * nx + c] = Some(report.clone());
                    if (done <= 4 || last.elapsed().as_secs_f64() > 0.3) && done < total {
                        if let Ok(f) = prepared.figure(&shadow, &device) {
                            emit(f, Some((done, total)));
                        }
                        last = Instant::now();
                    }
                },
                cancel,
            );
            match result {
                Ok(()) | Err(EngineError::Cancelled) => {}
                Err(e) => return Err(e),
            }
            emit(prepared.figure(&grid, &device)?, Some((grid.done(), total)));
        }
    }
    Ok(())
}

/// How the window tells the user to make a text benchmark for the oracle.
pub const ORACLE_NEEDS_TEXT: &str = "the oracle (seed 004) runs on the text benchmark: make one with Benchmark > Build text benchmark (or open a text build's suite.toml)";

/// Seed 004's oracle on the text build with the form's settings, checked as the CLI checks
/// them (`mergescope analyze oracle --text-bench DIR --examples N --lr η,η --epochs E,E
/// --precision P`; the other options at their defaults): progress per gradient step and model
/// scored (at most every 0.1 s), then the figure.
fn oracle(
    inputs: &AnalysisInputs,
    form: &OracleText,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(Option<Figure>, Option<(usize, usize)>),
) -> Result<()> {
    let dir = inputs
        .text_build
        .as_ref()
        .ok_or_else(|| EngineError::invalid(ORACLE_NEEDS_TEXT))?;
    let settings = form.settings(OracleSettings::default())?;
    let (device, _) = open_device(inputs.device);
    let mut last: Option<Instant> = None;
    let mut progress = |p: &BuildProgress| {
        if last.is_none_or(|t| t.elapsed().as_secs_f64() > 0.1) || p.done == p.total {
            emit(None, Some((p.done, p.total)));
            last = Some(Instant::now());
        }
    };
    let report = run_oracle(dir, &settings, &device, &mut progress, cancel).map_err(|e| match e {
        EngineError::Cancelled => {
            EngineError::invalid("the oracle was cancelled (nothing is kept): ▶ Run oracle runs it again")
        }
        e => EngineError::invalid(format!("the oracle on '{}': {e}", dir.display())),
    })?;
    emit(Some(oracle_figure(&report)), None);
    Ok(())
}
