//! The document of one window, without any UI: the inputs, the plugins, the method form, the queue of
//! runs and their results, and the project file that saves them. The egui views read and
//! change this; tests drive it directly too.

use crate::form::ParamForm;
use crate::inputs::{InputRef, Inputs};
use crate::jobs::{BuildJob, Event, Job, JobId, JobQueue, MergeJob, Notify};
use crate::runs::{Live, RunRecord, RunStatus};
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::device::DeviceChoice;
use mergescope_engine::dtype::OutDType;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::hf_folder::FolderOutput;
use mergescope_engine::merge::MergeRequest;
use mergescope_engine::plugin::{Approvals, Plugin, PluginDirs, PluginOrigin, Registry};
use mergescope_lab::demo::{self, Benchmark};
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_lab::nn::Arch;
use mergescope_lab::text_bench::{TextBuildPlan, TextBuildRequest};
use mergescope_plugin_api::abi;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

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

/// What a benchmark build builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildKind {
    /// The image demo benchmark of an architecture.
    Demo(Arch),
    /// The text benchmark (a pretrained BERT-family backbone).
    Text,
}

impl BuildKind {
    /// How the window names it: "the CNN demo benchmark", "the text benchmark".
    pub fn title(self) -> String {
        match self {
            BuildKind::Demo(arch) => format!("the {} demo benchmark", arch.to_string().to_uppercase()),
            BuildKind::Text => "the text benchmark".to_owned(),
        }
    }
}

/// A benchmark build in progress (demo or text).
#[derive(Clone, Debug)]
pub struct BuildState {
    /// Its job.
    pub job: JobId,
    /// What is built.
    pub what: BuildKind,
    /// Progress.
    pub live: Live,
}

/// The tokenizer settings of an opened recipe (its `[tokenizer]` table and `chat_template`, or a
/// mergekit configuration's `tokenizer_source`, `tokenizer` and `chat_template`), which the
/// method form cannot show: the runs of the recipe's inputs align the inputs' vocabularies and
/// write a Hugging Face folder (weights, config, tokenizer, chat template), as `mergescope merge`
/// does with the recipe.
#[derive(Clone, Debug)]
pub struct RecipeTokenizer {
    /// The recipe file.
    pub recipe: PathBuf,
    /// Its base: the settings apply while the inputs are the recipe's.
    pub base: Option<PathBuf>,
    /// Its experts, in order.
    pub experts: Vec<PathBuf>,
    /// The folder output of its runs, as the recipe's merge request has it.
    pub folder: FolderOutput,
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
    pub recipe_tokenizer: Option<RecipeTokenizer>,
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
            recipe_tokenizer: None,
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
        let sha = mergescope_engine::plugin::discovery::file_sha256(&abs).unwrap_or_default();
        !approvals.is_approved(&abs, &sha)
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

    /// Makes the benchmark's base and experts the inputs (labels: task names).
    pub fn use_benchmark(&mut self, b: Benchmark) {
        self.inputs.clear();
        self.inputs.set_base(&b.base_path(), Some("base".into()));
        for (path, name) in b.expert_paths().iter().zip(b.task_names()) {
            self.inputs.add_expert(path, Some(name.to_owned()));
        }
        if let Some(f) = &mut self.form {
            f.fit_experts(self.inputs.experts.len());
        }
        self.note(
            Level::Info,
            format!(
                "benchmark: {} seed {} ({} tasks) in '{}'",
                b.manifest.arch,
                b.manifest.seed,
                b.manifest.tasks.len(),
                b.dir.display()
            ),
        );
        self.benchmark = Some(b);
        self.suite = None;
        self.dirty = true;
    }

    /// Opens a recipe: a mergescope TOML recipe or a mergekit YAML configuration. Its base and
    /// experts become the inputs, its method is selected and its parameters fill the form (the
    /// layer-wise ones are kept beside it); its tokenizer settings are kept for the runs of its
    /// inputs ([`RecipeTokenizer`]); what cannot be shown is an error in the log.
    pub fn open_recipe(&mut self, path: &Path) {
        match self.try_open_recipe(path) {
            Ok(method) => {
                self.note(
                    Level::Info,
                    format!("opened the recipe '{}' ({method})", path.display()),
                );
                self.dirty = true;
            }
            Err(e) => self.note(Level::Error, format!("cannot open the recipe: {e}")),
        }
    }

    fn try_open_recipe(&mut self, path: &Path) -> Result<String> {
        // The merge request the recipe describes is what `mergescope merge` runs; its folder
        // output carries the tokenizer settings the form cannot show.
        let (recipe, notes, request) = if mergescope_engine::mergekit::is_mergekit_config(path) {
            let c = mergescope_engine::mergekit::load(path, &self.runs_dir)?;
            let request = c.to_request(false)?;
            (c.recipe, c.notes, request)
        } else {
            let r = mergescope_engine::recipe::Recipe::load(path)?;
            let request = r.to_request(false)?;
            (r, Vec::new(), request)
        };
        if !recipe.slices.is_empty() {
            return Err(EngineError::Invalid(format!(
                "'{}' builds the model from layer slices, which the window does not show yet; run it with \
                 `mergescope merge {} --out FOLDER`",
                path.display(),
                path.display()
            )));
        }
        if !self.registry.plugins.iter().any(|p| p.id() == recipe.method) {
            return Err(EngineError::Invalid(format!(
                "the recipe's method '{}' is not loaded; load its plugin (File > Load plugin…) and open the recipe again",
                recipe.method
            )));
        }
        self.inputs.clear();
        if let Some(b) = &recipe.base {
            self.inputs.set_base(b, None);
        }
        for e in &recipe.experts {
            self.inputs.add_expert(e, None);
        }
        self.select_method(&recipe.method);
        let n = self.inputs.experts.len();
        if let (Some(form), Value::Object(params)) = (&mut self.form, recipe.params_json()) {
            form.set_json(&params);
            form.fit_experts(n);
        }
        self.seed = recipe.seed;
        self.out_dtype = recipe.dtype;
        self.recipe_tokenizer = request
            .folder
            .filter(|f| f.tokenizer.is_some() || f.chat_template.is_some())
            .map(|folder| RecipeTokenizer {
                recipe: path.to_path_buf(),
                base: recipe.base.clone(),
                experts: recipe.experts.clone(),
                folder,
            });
        if let Some(t) = &self.recipe_tokenizer {
            let what = match (&t.folder.tokenizer, &t.folder.chat_template) {
                (Some(spec), _) => format!(
                    "its vocabularies are aligned to the {} tokenizer{}",
                    match &spec.source {
                        mergescope_engine::tokenizer_union::Source::Union => "union".to_owned(),
                        mergescope_engine::tokenizer_union::Source::Base => "base's".to_owned(),
                        mergescope_engine::tokenizer_union::Source::Model(m) => format!("'{}'", m.display()),
                    },
                    if t.folder.chat_template.is_some() {
                        " and the chat template is set"
                    } else {
                        ""
                    }
                ),
                (None, _) => "the chat template is set".to_owned(),
            };
            self.note(
                Level::Info,
                format!(
                    "the recipe's tokenizer settings apply to its runs from this window: {what}, and each run writes \
                     a Hugging Face folder (weights, config, tokenizer) while the inputs are the recipe's"
                ),
            );
        }
        if let Some(d) = recipe.dtype {
            self.note(
                Level::Info,
                format!("the recipe's runs write {} tensors", d.dtype().name()),
            );
        }
        for n in notes {
            self.note(Level::Info, n);
        }
        Ok(recipe.method)
    }

    /// Evaluates merges with the suite at `path` (its [models] table, when it has one, become
    /// the inputs, the experts labelled with the task names when there is one per task).
    pub fn use_suite(&mut self, path: &Path) {
        let suite = match Suite::load(path) {
            Ok(s) => s,
            Err(e) => {
                self.note(Level::Error, format!("cannot open the suite: {e}"));
                return;
            }
        };
        if let Some(m) = suite.models() {
            self.inputs.clear();
            self.inputs.set_base(&m.base, Some("base".into()));
            let tasks = suite.task_names();
            let named = tasks.len() == m.experts.len();
            for (i, e) in m.experts.iter().enumerate() {
                self.inputs.add_expert(e, named.then(|| tasks[i].clone()));
            }
            if let Some(f) = &mut self.form {
                f.fit_experts(self.inputs.experts.len());
            }
        }
        self.note(
            Level::Info,
            format!(
                "suite '{}' ({} tasks: {}) in '{}': merges are evaluated with it",
                suite.name,
                suite.task_names().len(),
                suite.task_names().join(", "),
                path.display()
            ),
        );
        self.benchmark = None;
        self.suite = Some(path.to_owned());
        self.dirty = true;
    }

    /// Queues a build of the demo benchmark for `arch` (into the cache).
    pub fn build_demo(&mut self, arch: Arch, seed: u64) {
        if self.build.is_some() {
            self.note(Level::Warn, "a demo build is already running");
            return;
        }
        let dir = match demo::demo_dir(arch, seed) {
            Ok(d) => d,
            Err(e) => {
                self.note(Level::Error, format!("cannot build the demo: {e}"));
                return;
            }
        };
        if dir.exists() {
            match Benchmark::open(&dir) {
                Ok(b) if b.is_current() => {
                    self.use_benchmark(b);
                    return;
                }
                // Outdated (another recipe version): rebuilt, and replaced once complete.
                Ok(_) => {}
                Err(e) => {
                    self.note(
                        Level::Error,
                        format!(
                            "'{}' is not a usable demo build ({e}); remove it, or rebuild it with \
                             `mergescope demo build --arch {arch} --force`",
                            dir.display()
                        ),
                    );
                    return;
                }
            }
        }
        let job = self.jobs.submit(Job::Build(BuildJob { arch, seed, dir }));
        self.build = Some(BuildState {
            job,
            what: BuildKind::Demo(arch),
            live: Live {
                started: Instant::now(),
                fraction: 0.0,
                stage: "queued".into(),
            },
        });
        self.note(Level::Info, format!("building the {arch} demo benchmark (seed {seed})"));
    }

    /// Queues the text benchmark's build as `request` asks (the window asks for every task on
    /// the chosen backbone with the default recipe, into the cache); when it is done its suite
    /// becomes the window's, as opening it does. A build by the same recipe already in the
    /// folder is opened at once. The lab checks the backbone folder before it builds, and a
    /// folder that is not a BERT model fails the build with what to choose instead. Errs (and
    /// logs) when the request is refused; `Ok(false)` when the suite was opened without a build.
    pub fn build_text_benchmark(&mut self, request: &TextBuildRequest) -> Result<bool> {
        if self.build.is_some() {
            let e = EngineError::invalid("a benchmark build is already running: wait for it, or cancel it");
            self.note(Level::Warn, &e);
            return Err(e);
        }
        let plan = request.plan().map_err(|e| {
            let e = EngineError::invalid(format!("cannot build the text benchmark: {}", text_build_words(&e)));
            self.note(Level::Error, &e);
            e
        })?;
        let build = match plan {
            TextBuildPlan::Built(b) => {
                self.note(
                    Level::Info,
                    format!("the text benchmark is already built in '{}'", b.dir.display()),
                );
                self.use_suite(&b.suite_path());
                return Ok(false);
            }
            TextBuildPlan::Build(build) => build,
        };
        self.note(
            Level::Info,
            format!(
                "building the text benchmark on '{}' into '{}' ({} tasks)",
                build.backbone.display(),
                build.dir.display(),
                build.tasks.len()
            ),
        );
        let job = self.jobs.submit(Job::BuildText(Box::new(build)));
        self.build = Some(BuildState {
            job,
            what: BuildKind::Text,
            live: Live {
                started: Instant::now(),
                fraction: 0.0,
                stage: "queued".into(),
            },
        });
        Ok(true)
    }

    /// The opened recipe's tokenizer settings when the inputs are still the recipe's.
    fn applied_recipe_tokenizer(&self) -> Option<&RecipeTokenizer> {
        let t = self.recipe_tokenizer.as_ref()?;
        let base = self.inputs.base.as_ref().map(|b| &b.path);
        let experts = self.inputs.experts.iter().map(|e| &e.path);
        (base == t.base.as_ref() && experts.eq(t.experts.iter())).then_some(t)
    }

    /// Whether the inputs can be merged once the recipe's tokenizer settings align their
    /// vocabularies: as [`Inputs::ready`], but the vocabulary tensors may differ in size.
    fn ready_with_aligned_vocabularies(&self) -> Result<()> {
        use mergescope_engine::tokenizer_union::VOCAB_TENSORS;
        if self.inputs.experts.is_empty() {
            return Err(EngineError::invalid("add at least one expert checkpoint"));
        }
        let all: Vec<_> = self.inputs.base.iter().chain(&self.inputs.experts).collect();
        let mut descs = Vec::with_capacity(all.len());
        for f in &all {
            let summary = f
                .summary
                .as_ref()
                .map_err(|_| EngineError::Invalid(format!("'{}' cannot be read; remove or replace it", f.label)))?;
            let mut desc = summary.desc.clone();
            desc.retain(|name, _| !VOCAB_TENSORS.contains(&name.as_str()));
            descs.push(desc);
        }
        let labels: Vec<String> = all.iter().map(|f| f.label.clone()).collect();
        let others: Vec<_> = descs.iter().skip(1).collect();
        if let Some(reference) = descs.first() {
            mergescope_engine::compat::check(&labels, reference, &others, MissingPolicy::Error)
                .map_err(EngineError::Incompatible)?;
        }
        Ok(())
    }

    /// Checks what a run needs; the message says what to fix.
    pub fn can_run(&self) -> Result<()> {
        self.plugin().ok_or_else(|| EngineError::invalid("choose a method"))?;
        if self
            .applied_recipe_tokenizer()
            .is_some_and(|t| t.folder.tokenizer.is_some())
        {
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
        let folder = self.applied_recipe_tokenizer().map(|t| t.folder.clone());
        if folder.is_none()
            && let Some(t) = self.recipe_tokenizer.take()
        {
            self.note(
                Level::Warn,
                format!(
                    "run {id} and the next ones do not apply the tokenizer settings of the recipe '{}': its inputs \
                     were changed; open the recipe again to apply them",
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
            log: Vec::new(),
            live: None,
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
                    Some(Err(msg)) => {
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
            Event::Failed(_, msg) => {
                r.status = RunStatus::Failed;
                r.live = None;
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

    fn apply_build(&mut self, e: Event) {
        match e {
            Event::Started(_) => {
                if let Some(b) = &mut self.build {
                    b.live.started = Instant::now();
                    b.live.stage = "starting".into();
                }
            }
            Event::Progress { fraction, stage, .. } => {
                if let Some(b) = &mut self.build {
                    b.live.fraction = fraction;
                    b.live.stage = stage;
                }
            }
            Event::Log { text, .. } => self.note(Level::Info, text),
            Event::Built(_, bench) => {
                self.build = None;
                self.note(Level::Info, "demo benchmark built");
                self.use_benchmark(*bench);
            }
            Event::BuiltText(_, bench) => {
                self.build = None;
                self.note(
                    Level::Info,
                    format!("text benchmark built in '{}'", bench.dir.display()),
                );
                self.use_suite(&bench.suite_path());
            }
            Event::Failed(_, msg) => {
                let what = self.build.take().map(|b| b.what);
                match what {
                    Some(BuildKind::Text) => self.note(
                        Level::Error,
                        format!("text benchmark build failed: {}", text_build_words(&msg)),
                    ),
                    _ => self.note(Level::Error, format!("demo build failed: {msg}")),
                }
            }
            Event::Cancelled(_) => {
                let what = self.build.take().map(|b| b.what);
                let name = if what == Some(BuildKind::Text) {
                    "text benchmark"
                } else {
                    "demo"
                };
                self.note(Level::Info, format!("{name} build cancelled"));
            }
            Event::Merged(..) => {}
        }
    }

    /// Run `id`.
    pub fn run_record(&self, id: u64) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.id == id)
    }

    /// Copies run `id`'s output to `dest` (atomically, never over an input) and writes the
    /// recipe that repeats it next to it (`<dest>.recipe.toml`).
    pub fn save_output(&mut self, id: u64, dest: &Path) -> Result<PathBuf> {
        let r = self
            .run_record(id)
            .ok_or_else(|| EngineError::invalid("no such run"))?
            .clone();
        if r.status != RunStatus::Done {
            return Err(EngineError::Invalid(format!(
                "{} has no output to save ({})",
                r.title(),
                r.status.label()
            )));
        }
        let inputs = r.base.iter().chain(&r.experts);
        if inputs.clone().any(|i| same_file(&i.path, dest)) {
            return Err(EngineError::Invalid(format!(
                "'{}' is one of the inputs; mergescope never writes over an input",
                dest.display()
            )));
        }
        if r.output.is_dir() {
            return Err(EngineError::Invalid(format!(
                "{} wrote a Hugging Face model folder (its recipe's tokenizer settings): copy the folder '{}' itself, \
                 or run the recipe with `mergescope merge RECIPE --out FOLDER`",
                r.title(),
                r.output.display()
            )));
        }
        let bytes = std::fs::read(&r.output).map_err(|e| {
            EngineError::invalid(format!(
                "cannot read the merge output '{}' ({e}); run the merge again",
                r.output.display()
            ))
        })?;
        mergescope_engine::writer::write_atomic(dest, &bytes)?;
        let recipe = mergescope_engine::recipe::Recipe {
            method: r.method.clone(),
            base: r.base.as_ref().map(|b| b.path.clone()),
            experts: r.experts.iter().map(|e| e.path.clone()).collect(),
            out: dest.to_path_buf(),
            seed: r.seed,
            dtype: None,
            device: r.device,
            shard_size: None,
            on_missing: MissingPolicy::Error,
            params: mergescope_engine::recipe::params_to_toml(&r.params),
            ..mergescope_engine::recipe::Recipe::default()
        };
        let recipe_path = PathBuf::from(format!("{}.recipe.toml", dest.display()));
        let text = toml::to_string_pretty(&recipe)
            .map_err(|e| EngineError::Bug(format!("the recipe of a run cannot be written as TOML: {e}")))?;
        mergescope_engine::writer::write_atomic(&recipe_path, text.as_bytes())?;
        self.note(
            Level::Info,
            format!(
                "{} saved to '{}' (recipe: '{}')",
                r.title(),
                dest.display(),
                recipe_path.display()
            ),
        );
        Ok(recipe_path)
    }

    /// The project file contents.
    pub fn to_project(&self) -> Project {
        let (base, experts) = self.inputs.refs();
        Project {
            format: PROJECT_FORMAT.into(),
            version: PROJECT_VERSION,
            benchmark: self.benchmark.as_ref().map(|b| b.dir.clone()),
            suite: self.suite.clone(),
            base,
            experts,
            method: self.method.clone(),
            params: self.form.as_ref().map(ParamForm::to_json).unwrap_or_default(),
            seed: self.seed,
            device: self.device,
            runs: self.runs.iter().filter(|r| !r.status.is_active()).cloned().collect(),
        }
    }

    /// Saves the project to `path` (atomically).
    pub fn save_project(&mut self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.to_project())
            .map_err(|e| EngineError::Bug(format!("the project cannot be written as JSON: {e}")))?;
        mergescope_engine::writer::write_atomic(path, text.as_bytes())?;
        self.project_path = Some(path.to_path_buf());
        self.dirty = false;
        self.note(Level::Info, format!("project saved to '{}'", path.display()));
        Ok(())
    }

    /// Replaces the session's inputs, method and runs by those of the project at `path`.
    pub fn open_project(&mut self, path: &Path) -> Result<()> {
        if self.busy() {
            return Err(EngineError::invalid(
                "runs are still going: wait for them or cancel them first",
            ));
        }
        let p = Project::load(path)?;
        self.benchmark = None;
        self.suite = None;
        if let Some(dir) = &p.benchmark {
            match Benchmark::open(dir) {
                Ok(b) => self.benchmark = Some(b),
                Err(e) => self.note(Level::Warn, format!("the project's benchmark cannot be opened: {e}")),
            }
        } else if let Some(suite) = &p.suite {
            // The suite as the project left it; the project's own inputs replace its [models].
            self.use_suite(suite);
        }
        self.inputs.load_refs(p.base.as_ref(), &p.experts);
        if let Some(m) = &p.method {
            if self.registry.plugins.iter().any(|q| q.id() == m) {
                self.select_method(m);
                if let Some(f) = &mut self.form {
                    f.set_json(&p.params);
                }
            } else {
                self.note(
                    Level::Warn,
                    format!("the project uses method '{m}', which is not loaded; load its plugin"),
                );
            }
        }
        self.seed = p.seed;
        self.device = p.device;
        self.runs = p.runs;
        self.job_runs.clear();
        self.next_run = self.runs.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        self.project_path = Some(path.to_path_buf());
        self.dirty = false;
        self.note(Level::Info, format!("opened project '{}'", path.display()));
        Ok(())
    }
}

/// The lab's text-benchmark messages, written for the command line, worded for the window.
fn text_build_words(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .replace("point --backbone at", "choose")
        .replace(
            "choose another --out or pass --force to replace it",
            "remove it, or rebuild it with `mergescope demo build --benchmark text --backbone DIR --force`",
        )
        .replace(
            "rebuild it with `mergescope demo build --benchmark text --force`",
            "remove it, or rebuild it with `mergescope demo build --benchmark text --backbone DIR --force`",
        )
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// `format` field of project files.
pub const PROJECT_FORMAT: &str = "mergescope-project";
/// Version of the project file format.
pub const PROJECT_VERSION: u32 = 1;

/// A saved session: inputs, the method being edited, and every finished run with its results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Project {
    /// Always [`PROJECT_FORMAT`].
    pub format: String,
    /// [`PROJECT_VERSION`] when written.
    pub version: u32,
    /// Benchmark folder.
    pub benchmark: Option<PathBuf>,
    /// Suite file merges are evaluated with (when no benchmark is open); absent in projects
    /// written before suites could be opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<PathBuf>,
    /// Base.
    pub base: Option<InputRef>,
    /// Experts.
    pub experts: Vec<InputRef>,
    /// Selected method.
    pub method: Option<String>,
    /// Its non-default parameters.
    pub params: Map<String, Value>,
    /// Seed.
    pub seed: u64,
    /// Device.
    pub device: DeviceChoice,
    /// Runs.
    pub runs: Vec<RunRecord>,
}

impl Project {
    /// Reads and checks a project file.
    pub fn load(path: &Path) -> Result<Project> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
        let p: Project = serde_json::from_str(&text)
            .map_err(|e| EngineError::invalid(format!("'{}' is not a mergescope project ({e})", path.display())))?;
        if p.format != PROJECT_FORMAT {
            return Err(EngineError::Invalid(format!(
                "'{}' is not a mergescope project file",
                path.display()
            )));
        }
        if p.version > PROJECT_VERSION {
            return Err(EngineError::Invalid(format!(
                "'{}' was written by a newer mergescope (format {}, this one reads {PROJECT_VERSION}); update mergescope",
                path.display(),
                p.version
            )));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` as the project file `name` in `dir` and loads it.
    fn load_text(dir: &Path, name: &str, text: &str) -> Result<Project> {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        Project::load(&p)
    }

    #[test]
    fn project_files_are_checked_before_use() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Project {
            format: PROJECT_FORMAT.into(),
            version: PROJECT_VERSION,
            benchmark: None,
            suite: None,
            base: None,
            experts: vec![InputRef {
                path: "/m/a.safetensors".into(),
                label: "a".into(),
            }],
            method: Some("ties".into()),
            params: Map::new(),
            seed: 3,
            device: DeviceChoice::Cpu,
            runs: Vec::new(),
        };
        let back = load_text(dir.path(), "ok.msproj", &serde_json::to_string(&ok).unwrap()).unwrap();
        assert_eq!((back.seed, back.experts[0].label.as_str()), (3, "a"));

        let mut newer = serde_json::to_value(&ok).unwrap();
        newer["version"] = Value::from(PROJECT_VERSION + 1);
        let e = load_text(dir.path(), "newer.msproj", &newer.to_string()).unwrap_err();
        assert!(e.to_string().contains("newer mergescope"));

        let mut other = serde_json::to_value(&ok).unwrap();
        other["format"] = Value::from("something-else");
        let e = load_text(dir.path(), "other.msproj", &other.to_string()).unwrap_err();
        assert!(e.to_string().contains("not a mergescope project"));

        let e = load_text(dir.path(), "junk.msproj", "{ not json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("junk.msproj") && e.contains("not a mergescope project"),
            "{e}"
        );
        let e = Project::load(&dir.path().join("missing.msproj"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
    }

    #[test]
    fn parameters_become_typed_toml_in_recipes() {
        let params: Map<String, Value> = serde_json::from_str(
            r#"{"lambda": 0.5, "k": 3, "normalize": true, "trim_scope": "global", "w": [0.5, 1]}"#,
        )
        .unwrap();
        let t = mergescope_engine::recipe::params_to_toml(&params);
        assert_eq!(t["lambda"], toml::Value::Float(0.5));
        assert_eq!(t["k"], toml::Value::Integer(3));
        assert_eq!(t["normalize"], toml::Value::Boolean(true));
        assert_eq!(t["trim_scope"], toml::Value::String("global".into()));
        assert_eq!(
            t["w"],
            toml::Value::Array(vec![toml::Value::Float(0.5), toml::Value::Float(1.0)])
        );
        // Layer-wise values from an opened recipe are kept, as the recipe gave them.
        let layered: Map<String, Value> =
            serde_json::from_str(r#"{"t": [{"filter": "mlp", "value": [0, 1]}, {"value": 0.5}]}"#).unwrap();
        let t = mergescope_engine::recipe::params_to_toml(&layered);
        let back = toml::Value::Table(t).to_string();
        assert!(
            back.contains("filter = \"mlp\"") && back.contains("value = [0.0, 1.0]"),
            "{back}"
        );
    }
}
