//! The document of one window, without any UI: the inputs, the plugins, the method form, the queue of
//! runs and their results, and the project file that saves them. The egui views read and
//! change this; tests drive it directly too.
//!
//! Here: the session, plugins, runs and the job events. [`benchmarks`]: the benchmark or suite
//! merges are evaluated on, and its builds; [`recipe`]: recipes opened; [`project`]: saved
//! outputs and project files.

use crate::form::ParamForm;
use crate::inputs::Inputs;
use crate::jobs::{Event, Job, JobId, JobQueue, MergeJob, Notify};
use crate::runs::{Live, RunRecord, RunStatus};
use mergescope_engine::device::DeviceChoice;
use mergescope_engine::dtype::OutDType;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::plugin::{Approvals, Plugin, PluginDirs, PluginOrigin, Registry};
use mergescope_interop::request::MergeRequest;
use mergescope_lab::demo::{self, Benchmark};
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_lab::nn::Arch;
use mergescope_plugin_api::abi;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub mod benchmarks;
pub mod project;
pub mod recipe;

pub use benchmarks::{BuildKind, BuildState};
pub use project::{PROJECT_FORMAT, PROJECT_VERSION, Project};
pub use recipe::RecipeSettings;

/// How a session starts.
#[derive(Clone, Debug, Default)]
pub struct DocumentConfig {
    /// Extra plugin folders (as `--plugin-dir`).
    pub plugin_dirs: Vec<PathBuf>,
    /// Folder where merge outputs go until the user saves them (default: the cache's
    /// `runs/<start time>` folder).
    pub runs_dir: Option<PathBuf>,
    /// Benchmark to open (default: the built demo, or build it).
    pub benchmark: Option<PathBuf>,
    /// Build the demo benchmark when none is built (first launch).
    pub build_demo_if_missing: bool,
    /// Architecture of the demo built on first launch.
    pub demo_arch: Option<Arch>,
}

/// Severity of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Errors.
    Error,
    /// Warnings.
    Warn,
    /// Information.
    Info,
}

/// One line of the session log.
#[derive(Clone, Debug)]
pub struct LogLine {
    /// Seconds since the session started.
    pub at: f64,
    /// Severity.
    pub level: Level,
    /// Text.
    pub text: String,
}

/// The doc.
pub struct Document {
    /// Base and experts.
    pub inputs: Inputs,
    /// Benchmark the merges are evaluated on.
    pub benchmark: Option<Benchmark>,
    /// Suite file the merges are evaluated with, when no benchmark is open.
    pub suite: Option<PathBuf>,
    /// Loaded plugins, pending approvals and load failures.
    pub registry: Registry,
    /// Selected method (plugin id).
    pub method: Option<String>,
    /// Form of the selected method.
    pub form: Option<ParamForm>,
    /// Seed of the next run.
    pub seed: u64,
    /// Device of the next run.
    pub device: DeviceChoice,
    /// Output dtype of the next runs (an opened recipe's `dtype`); `None`: as the inputs.
    pub out_dtype: Option<OutDType>,
    /// An opened recipe's tokenizer settings, applied to the runs of its inputs.
    pub recipe_settings: Option<RecipeSettings>,
    /// All runs, oldest first.
    pub runs: Vec<RunRecord>,
    /// Demo build in progress.
    pub build: Option<BuildState>,
    /// Log.
    pub log: Vec<LogLine>,
    /// Project file this session was saved to or opened from.
    pub project_path: Option<PathBuf>,
    /// Whether there are changes since the last save.
    pub dirty: bool,
    /// The analysis panel: view, figure, computation in flight.
    pub analysis: crate::analysis::Analysis,
    /// The Experiments panel: the fine-tuning sweep being edited, run and plotted.
    pub experiments: crate::experiments::Experiments,
    notify: Notify,
    landscape_cache: Option<PathBuf>,
    runs_dir: PathBuf,
    jobs: JobQueue,
    job_runs: Vec<(JobId, u64)>,
    next_run: u64,
    started: Instant,
}

/// Where sweep folders go: `sweeps/` in the session's own runs folder when it has one
/// (scripts, tests), otherwise in the cache folder, shared across sessions so that a sweep
/// resumes in a later one.
fn sweeps_root(config: &DocumentConfig) -> PathBuf {
    match &config.runs_dir {
        Some(d) => d.join("sweeps"),
        None => demo::cache_dir()
            .unwrap_or_else(|_| std::env::temp_dir().join("mergescope"))
            .join("sweeps"),
    }
}

fn default_runs_dir() -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let root = demo::cache_dir().unwrap_or_else(|_| std::env::temp_dir().join("mergescope"));
    root.join("runs").join(format!("{stamp}-{}", std::process::id()))
}

impl Document {
    /// Starts a session: finds plugins, opens the benchmark (or queues its build).
    pub fn new(config: &DocumentConfig, notify: Notify) -> Document {
        let mut s = Document {
            inputs: Inputs::default(),
            benchmark: None,
            suite: None,
            registry: Registry::default(),
            method: None,
            form: None,
            seed: 0,
            device: DeviceChoice::Cpu,
            out_dtype: None,
            recipe_settings: None,
            runs: Vec::new(),
            build: None,
            log: Vec::new(),
            project_path: None,
            dirty: false,
            analysis: crate::analysis::Analysis::default(),
            experiments: crate::experiments::Experiments::new(sweeps_root(config)),
            notify: notify.clone(),
            // With a runs folder of its own (scripts, tests) the session keeps its landscape
            // cache there; otherwise in the user's cache folder, shared across sessions.
            landscape_cache: config.runs_dir.clone(),
            runs_dir: config.runs_dir.clone().unwrap_or_else(default_runs_dir),
            jobs: JobQueue::start(notify),
            job_runs: Vec::new(),
            next_run: 1,
            started: Instant::now(),
        };
        if let Some(crash) = crate::crash_marker::take_last(&s.runs_dir) {
            s.note(Level::Error, crash);
        }
        s.discover_plugins(&config.plugin_dirs);
        let default_method = ["task-arithmetic", "weight-average"]
            .into_iter()
            .find(|m| s.registry.plugins.iter().any(|p| p.id() == *m))
            .map(str::to_owned)
            .or_else(|| s.registry.plugins.first().map(|p| p.id().to_owned()));
        if let Some(m) = default_method {
            s.select_method(&m);
        }
        match &config.benchmark {
            Some(path) if is_suite_path(&path.to_string_lossy()) => s.use_suite(path),
            Some(dir) => match Benchmark::open(dir) {
                Ok(b) => s.use_benchmark(b),
                Err(e) => s.note(Level::Error, format!("cannot open the benchmark: {e}")),
            },
            None => match demo::resolve_benchmark("demo", config.demo_arch) {
                Ok(b) if b.is_current() => s.use_benchmark(b),
                _ if config.build_demo_if_missing => s.build_demo(config.demo_arch.unwrap_or(Arch::Cnn), 0),
                Ok(b) => s.use_benchmark(b),
                Err(_) => s.note(
                    Level::Info,
                    "no demo benchmark is built yet: use the Benchmark menu (Build demo), or add checkpoints",
                ),
            },
        }
        s.dirty = false;
        s
    }

    /// Adds a line to the log.
    pub fn note(&mut self, level: Level, text: impl std::fmt::Display) {
        let text = text.to_string();
        self.log.push(LogLine {
            at: self.started.elapsed().as_secs_f64(),
            level,
            text,
        });
    }

    /// Finds plugins next to the executable, in the user's folder and in `extra`.
    pub fn discover_plugins(&mut self, extra: &[PathBuf]) {
        let approvals = match Approvals::load() {
            Ok(a) => a,
            Err(e) => {
                self.note(Level::Error, e);
                Approvals::default()
            }
        };
        self.registry = Registry::discover(&PluginDirs::standard(extra.to_vec()), &approvals);
        let failures: Vec<String> = self
            .registry
            .failures
            .iter()
            .map(|f| format!("plugin '{}' not loaded: {}", f.path.display(), f.error))
            .collect();
        for f in failures {
            self.note(Level::Warn, f);
        }
        let n = self.registry.plugins.len();
        self.note(Level::Info, format!("{n} merge methods loaded"));
    }

    /// Whether a plugin file outside the app's folder needs the user's approval first.
    pub fn needs_approval(&self, path: &Path) -> bool {
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let exe_dir = PluginDirs::standard(Vec::new()).exe_dir;
        let bundled = exe_dir
            .and_then(|d| std::fs::canonicalize(d).ok())
            .is_some_and(|d| abs.parent() == Some(d.as_path()));
        if bundled {
            return false;
        }
        let approvals = Approvals::load().unwrap_or_default();
        approvals.state(&abs) != mergescope_engine::plugin::discovery::ApprovalState::Approved
    }

    /// Approves (when asked) and loads a plugin file; selects its method.
    pub fn load_plugin_file(&mut self, path: &Path, approve: bool) -> Result<String> {
        if approve {
            let mut approvals = Approvals::load().map_err(EngineError::Invalid)?;
            approvals.approve(path).map_err(EngineError::Invalid)?;
        }
        let p = self
            .registry
            .load_file(path, PluginOrigin::Extra)
            .map_err(EngineError::Invalid)?;
        self.registry.pending.retain(|q| q.path != p.path);
        let id = p.id().to_owned();
        self.note(
            Level::Info,
            format!("loaded plugin '{id}' {} from '{}'", p.version(), p.path.display()),
        );
        self.select_method(&id);
        Ok(id)
    }

    /// The selected plugin.
    pub fn plugin(&self) -> Option<Arc<Plugin>> {
        let m = self.method.as_deref()?;
        self.registry.plugins.iter().find(|p| p.id() == m).cloned()
    }

    /// Selects a method and resets its form to the defaults.
    pub fn select_method(&mut self, id: &str) {
        let Some(p) = self.registry.plugins.iter().find(|p| p.id() == id) else {
            return;
        };
        let mut form = ParamForm::new(p.id(), p.schema());
        form.fit_experts(self.inputs.experts.len());
        self.form = Some(form);
        self.method = Some(id.to_owned());
    }

    /// Checks what a run needs; the message says what to fix.
    pub fn can_run(&self) -> Result<()> {
        self.plugin().ok_or_else(|| EngineError::invalid("choose a method"))?;
        let applied = self.applied_recipe_settings();
        if applied.is_some_and(|t| !t.slices.is_empty()) {
            // The slices assemble each input from layer ranges of several models: the engine
            // checks the assembled inputs when the run starts.
            self.inputs.readable()?;
        } else if applied.is_some_and(|t| t.folder.as_ref().is_some_and(|f| f.tokenizer.is_some())) {
            self.ready_with_aligned_vocabularies()?;
        } else {
            self.inputs.ready()?;
        }
        if let Some(f) = &self.form {
            f.validate(self.inputs.experts.len())?;
        }
        Ok(())
    }

    /// Queues a merge of the current inputs with the selected method and form.
    pub fn run(&mut self) -> Result<u64> {
        self.can_run()?;
        let plugin = self.plugin().ok_or_else(|| EngineError::invalid("choose a method"))?;
        let params = self.form.as_ref().map(ParamForm::to_json).unwrap_or_default();
        let id = self.next_run;
        self.next_run += 1;
        // An opened recipe's tokenizer settings: a Hugging Face folder, as `mergescope merge`
        // writes it from the recipe.
        let (folder, slices) = match self.applied_recipe_settings() {
            Some(t) => (t.folder.clone(), t.slices.clone()),
            None => (None, Vec::new()),
        };
        if self.applied_recipe_settings().is_none()
            && let Some(t) = self.recipe_settings.take()
        {
            self.note(
                Level::Warn,
                format!(
                    "run {id} and the next ones do not apply the {} of the recipe '{}': its inputs were changed; \
                     open the recipe again to apply them",
                    if t.slices.is_empty() {
                        "tokenizer settings"
                    } else {
                        "layer slices and tokenizer settings"
                    },
                    t.recipe.display()
                ),
            );
        }
        let output = match &folder {
            Some(_) => self.runs_dir.join(format!("merge-{id:03}-{}", plugin.id())),
            None => self.runs_dir.join(format!("merge-{id:03}-{}.safetensors", plugin.id())),
        };
        std::fs::create_dir_all(&self.runs_dir)
            .map_err(|e| EngineError::io("cannot create the runs folder", &self.runs_dir, e))?;
        let (base, experts) = self.inputs.refs();
        let mut request = MergeRequest::new(experts.iter().map(|e| e.path.clone()).collect(), output.clone())
            .with_base(base.as_ref().map(|b| b.path.clone()))
            .with_params(Value::Object(params.clone()))
            .with_seed(self.seed);
        request.out_dtype = self.out_dtype;
        request.folder = folder;
        request.slices = slices.clone();
        let job = self.jobs.submit(Job::Merge(Box::new(MergeJob {
            plugin: plugin.clone(),
            request,
            device: self.device,
            benchmark: self.benchmark.clone(),
            suite: self.suite.clone(),
        })));
        self.job_runs.push((job, id));
        self.runs.push(RunRecord {
            id,
            method: plugin.id().to_owned(),
            plugin_version: plugin.version().to_owned(),
            params,
            resolved: Value::Null,
            seed: self.seed,
            device: self.device,
            device_used: None,
            base,
            experts,
            output,
            benchmark: self.benchmark.as_ref().map(|b| b.dir.clone()),
            status: RunStatus::Queued,
            seconds: None,
            eval: None,
            eval_note: None,
            error: None,
            error_kind: None,
            log: Vec::new(),
            live: None,
            slices,
        });
        self.dirty = true;
        Ok(id)
    }

    fn job_of(&self, run: u64) -> Option<JobId> {
        self.job_runs.iter().find(|(_, r)| *r == run).map(|(j, _)| *j)
    }

    /// Cancels run `id` if it is queued or running.
    pub fn cancel(&mut self, id: u64) {
        if let Some(job) = self.job_of(id) {
            self.jobs.cancel(job);
        }
    }

    /// Cancels the running run (or the demo build), if any.
    pub fn cancel_current(&mut self) {
        if let Some(r) = self.runs.iter().find(|r| r.status == RunStatus::Running) {
            let id = r.id;
            self.cancel(id);
        } else if let Some(b) = &self.build {
            self.jobs.cancel(b.job);
        }
    }

    /// Opens the analysis panel on `kind`, computed on the inputs, the benchmark and the runs
    /// in `selected` (their merges, evaluations and trajectories).
    pub fn analyze(&mut self, kind: crate::analysis::ViewKind, selected: &std::collections::BTreeSet<u64>) {
        let runs = self.analysis_runs(selected);
        let merges: Vec<&RunRecord> = self.runs.iter().filter(|r| runs.0.contains(&r.id)).collect();
        let trajectories = merges
            .iter()
            .map(|r| r.output.with_extension("trajectory.safetensors"))
            .filter(|p| p.exists())
            .collect();
        let base_eval = self.benchmark.as_ref().map(|b| {
            let tasks = b
                .manifest
                .tasks
                .iter()
                .map(|t| {
                    let mut score = mergescope_lab::evaluator::TaskScore::classification(
                        t.name.clone(),
                        t.base_accuracy.test,
                        f64::NAN,
                        Some(t.expert_accuracy.test),
                        0,
                    );
                    // The manifest records accuracies only.
                    score.loss = None;
                    score
                })
                .collect();
            mergescope_lab::evaluator::summarise(mergescope_lab::data::SplitKind::Test, tasks)
        });
        let inputs = crate::analysis::AnalysisInputs {
            base: self.inputs.base.as_ref().map(|b| b.path.clone()),
            experts: self
                .inputs
                .experts
                .iter()
                .map(|e| (e.label.clone(), e.path.clone()))
                .collect(),
            merges: merges
                .iter()
                .map(|r| {
                    (
                        format!("{} {}", r.title(), r.params_summary()),
                        r.output.clone(),
                        r.eval.clone(),
                    )
                })
                .collect(),
            trajectories,
            benchmark: self.benchmark.clone(),
            base_eval,
            cache_root: self.landscape_cache.clone(),
            tensors: self
                .inputs
                .base
                .as_ref()
                .and_then(|b| mergescope_engine::checkpoint::Checkpoint::open(&b.path).ok())
                .map(|c| {
                    c.tensors
                        .iter()
                        .filter(|(_, t)| t.dtype.is_float())
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default(),
            tasks: match (&self.benchmark, &self.suite) {
                (Some(b), _) => b.task_names().iter().map(|t| t.to_string()).collect(),
                (None, Some(s)) => Suite::load(s).map(|s| s.task_names()).unwrap_or_default(),
                (None, None) => Vec::new(),
            },
            suite: self.suite.clone(),
            device: self.device,
            text_build: crate::experiments::known_text_builds(self.suite.as_deref())
                .into_iter()
                .next(),
        };
        self.analysis.start(kind, inputs, self.notify.clone());
        self.analysis.runs = runs;
    }

    /// The finished runs an analysis draws for the selection `selected`: the selected ones, or
    /// every finished run when none is selected (then `true`).
    pub fn analysis_runs(&self, selected: &std::collections::BTreeSet<u64>) -> (Vec<u64>, bool) {
        let done = self.runs.iter().filter(|r| r.status == RunStatus::Done);
        if selected.is_empty() {
            (done.map(|r| r.id).collect(), true)
        } else {
            (done.filter(|r| selected.contains(&r.id)).map(|r| r.id).collect(), false)
        }
    }

    /// Opens the Experiments window (on the `paper-002` preset for the open benchmark the
    /// first time).
    pub fn open_experiments(&mut self) {
        let installed: Vec<&str> = self.registry.plugins.iter().map(|p| p.id()).collect();
        self.experiments.configure(self.benchmark.as_ref(), &installed);
        self.experiments.open = true;
    }

    /// Starts (or resumes: finished cells in the folder are reused) the sweep being edited;
    /// a refusal is shown in the Experiments window.
    pub fn start_sweep(&mut self) {
        match self
            .experiments
            .prepare(&self.registry, self.benchmark.as_ref(), self.device)
        {
            Ok(job) => {
                self.note(
                    Level::Info,
                    format!("sweep '{}' into '{}'", self.experiments.name, job.folder.display()),
                );
                self.experiments.start(job, self.notify.clone());
            }
            Err(e) => self.experiments.error = Some(e.to_string()),
        }
    }

    /// Whether any run or build is queued or running.
    pub fn busy(&self) -> bool {
        self.build.is_some() || self.runs.iter().any(|r| r.status.is_active())
    }

    /// Applies the worker's events; returns whether anything changed.
    pub fn pump(&mut self) -> bool {
        let events = self.jobs.poll();
        let changed = !events.is_empty() | self.analysis.pump() | self.experiments.pump();
        for (error, text) in self.experiments.take_notes() {
            self.note(if error { Level::Error } else { Level::Info }, text);
        }
        for e in events {
            self.apply(e);
        }
        changed
    }

    /// Waits for the worker's events until nothing is queued or running, or `timeout`.
    pub fn wait_idle(&mut self, timeout: std::time::Duration) -> bool {
        let until = Instant::now() + timeout;
        while self.busy() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if let Some(e) = self.jobs.wait(left) {
                self.apply(e);
            }
        }
        true
    }

    fn apply(&mut self, e: Event) {
        let id = e.id();
        if self.build.as_ref().is_some_and(|b| b.job == id) {
            self.apply_build(e);
            return;
        }
        let Some(run_id) = self.job_runs.iter().find(|(j, _)| *j == id).map(|(_, r)| *r) else {
            return;
        };
        let mut notes = Vec::new();
        let Some(r) = self.runs.iter_mut().find(|r| r.id == run_id) else {
            return;
        };
        match e {
            Event::Started(_) => {
                r.status = RunStatus::Running;
                r.live = Some(Live {
                    started: Instant::now(),
                    fraction: 0.0,
                    stage: "starting".into(),
                });
            }
            Event::Progress { fraction, stage, .. } => {
                if let Some(l) = &mut r.live {
                    l.fraction = fraction;
                    l.stage = stage;
                }
            }
            Event::Log { level, text, .. } => {
                let lvl = match level {
                    abi::LOG_ERROR => Level::Error,
                    abi::LOG_WARN => Level::Warn,
                    _ => Level::Info,
                };
                r.log.push(text.clone());
                notes.push((lvl, format!("{}: {text}", r.title())));
            }
            Event::Merged(_, out) => {
                r.status = RunStatus::Done;
                r.live = None;
                r.seconds = Some(out.report.seconds);
                r.resolved = out.report.params.clone();
                r.device_used = Some(out.device.clone());
                r.log.extend(out.report.notes.iter().cloned());
                match out.eval {
                    Some(Ok(rep)) => {
                        let norm = rep
                            .mean_normalized
                            .map(|n| format!(", normalised {:.1} %", 100.0 * n))
                            .unwrap_or_default();
                        notes.push((
                            Level::Info,
                            format!(
                                "{} done in {:.2} s: mean accuracy {:.1} %{norm}",
                                r.title(),
                                out.report.seconds,
                                100.0 * rep.mean_accuracy
                            ),
                        ));
                        r.eval = Some(rep);
                    }
                    Some(Err(e)) => {
                        let msg = format!("not evaluated: {e}");
                        notes.push((Level::Warn, format!("{}: {msg}", r.title())));
                        r.eval_note = Some(msg);
                    }
                    None => {
                        r.eval_note = Some("no benchmark or suite to evaluate on".into());
                        notes.push((
                            Level::Info,
                            format!("{} done in {:.2} s", r.title(), out.report.seconds),
                        ));
                    }
                }
            }
            Event::Failed(_, msg, kind) => {
                r.status = RunStatus::Failed;
                r.live = None;
                r.error_kind = Some(kind.label().to_owned());
                notes.push((Level::Error, format!("{} failed: {msg}", r.title())));
                r.error = Some(msg);
            }
            Event::Cancelled(_) => {
                r.status = RunStatus::Cancelled;
                r.live = None;
                notes.push((Level::Info, format!("{} cancelled", r.title())));
            }
            Event::Built(..) | Event::BuiltText(..) => {}
        }
        for (lvl, text) in notes {
            self.note(lvl, text);
        }
        self.dirty = true;
    }

    /// Run `id`.
    pub fn run_record(&self, id: u64) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.id == id)
    }
}
