//! The Experiments panel's state, without egui: a fine-tuning sweep being edited (seed 002's
//! `paper-002` preset for the open benchmark to start; the benchmark may also be a demo build
//! of another architecture or a text benchmark build, [`known_text_builds`]), the folder it
//! runs in, the sweep on a background thread (progress, cancel; Resume starts it again on the
//! same folder, which reuses every finished cell), and the scaling results read back from the folder's results
//! file whenever cells finish, so the plots fill in while it runs. The work is
//! `engine::scaling::sweep`, the same code as `mergescope sweep`. The cells run in this
//! process (the local executor) or as one Slurm array job ([`ExecutorKind::Slurm`], the lab's
//! [`SlurmSweep`], the same door as `mergescope sweep --executor slurm`), whose state the
//! window follows. The executor choice and the Slurm fields ([`ExecutorSettings`]) are
//! remembered in the settings between launches.

use crate::jobs::{Background, Notify, TaskMessage};
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::{Plugin, PluginOrigin, Registry};
use mergescope_figures::Figure;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::{Benchmark, resolve_benchmark};
use mergescope_lab::nn::Arch;
use mergescope_lab::text_bench::{TextBenchmark, text_demo_dir};
use mergescope_lab::train::OptimizerKind;
pub use mergescope_studies::grid::ExecutorKind;
use mergescope_studies::grid::slurm::{SlurmOptions, SlurmProgress};
use mergescope_studies::scaling::sweep::executor::{SlurmSweep, SlurmSweepSettings, mergescope_env};
use mergescope_studies::scaling::sweep::plots::PLOTS_DIR;
use mergescope_studies::scaling::sweep::run::RESULTS_FILE;
use mergescope_studies::scaling::sweep::spec::{BenchKind, Grid, MethodSpec};
use mergescope_studies::scaling::sweep::store::{Row, read_rows};
use mergescope_studies::scaling::sweep::{
    SweepBench, SweepInputs, SweepProgress, SweepSpec, Variable, VariableResult, analyse, figures, is_text_build,
    open_text_benchmark, run_sweep, write_plots,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Size of the PNG plots written into the sweep folder when a sweep finishes (as the CLI).
const PLOT_SIZE: (u32, u32) = (1100, 760);

/// The name of `var` in the form ("steps K").
pub fn short_label(var: Variable) -> &'static str {
    match var {
        Variable::Steps => "steps K",
        Variable::Batch => "batch size b",
        Variable::LearningRate => "learning rate η",
        Variable::DataRatio => "data ratio α",
        Variable::Optimizer => "optimiser",
        Variable::Tasks => "tasks N",
    }
}

fn join<T: ToString>(values: &[T]) -> String {
    values.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The values the grid tries for `var`, as the form shows them ("50, 100, 200").
pub fn grid_text(grid: &Grid, var: Variable) -> String {
    match var {
        Variable::Steps => join(&grid.steps),
        Variable::Batch => join(&grid.batch),
        Variable::LearningRate => join(&grid.lr),
        Variable::DataRatio => join(&grid.data_ratio),
        Variable::Optimizer => grid.optimizer.join(", "),
        Variable::Tasks => join(&grid.tasks),
    }
}

/// Why an item of the grid of `var` does not parse, naming the field and how to write it.
fn not_a(var: Variable, item: &str, what: &str, example: &str) -> EngineError {
    EngineError::Param(format!(
        "{}: '{item}' is not {what}; write the values separated by commas, e.g. {example}",
        short_label(var)
    ))
}

fn whole_numbers(var: Variable, items: &[&str], example: &str) -> Result<Vec<usize>> {
    items
        .iter()
        .map(|s| s.parse::<usize>().map_err(|_| not_a(var, s, "a whole number", example)))
        .collect()
}

fn numbers(var: Variable, items: &[&str], example: &str) -> Result<Vec<f64>> {
    items
        .iter()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| not_a(var, s, "a number", example))
        })
        .collect()
}

/// Sets the grid of `var` from `text` (values separated by commas; empty: only the default).
/// The error names the field and the value that does not parse, and leaves `grid` unchanged.
pub fn set_grid(grid: &mut Grid, var: Variable, text: &str) -> Result<()> {
    let items: Vec<&str> = text
        .split([',', ';'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    match var {
        Variable::Steps => grid.steps = whole_numbers(var, &items, "50, 100, 200")?,
        Variable::Batch => grid.batch = whole_numbers(var, &items, "16, 32, 64")?,
        Variable::Tasks => grid.tasks = whole_numbers(var, &items, "2, 3, 4")?,
        Variable::LearningRate => grid.lr = numbers(var, &items, "0.0002, 0.0005, 0.002")?,
        Variable::DataRatio => grid.data_ratio = numbers(var, &items, "0.25, 0.5, 1")?,
        Variable::Optimizer => {
            if let Some(bad) = items.iter().find(|s| OptimizerKind::parse(s).is_none()) {
                return Err(not_a(var, bad, "an optimiser", "sgd, momentum, adamw"));
            }
            grid.optimizer = items.iter().map(|s| s.to_ascii_lowercase()).collect();
        }
    }
    Ok(())
}

/// One grid of the form: the text as typed, and why it does not parse.
#[derive(Clone, Debug, PartialEq)]
pub struct GridField {
    /// The hyperparameter.
    pub variable: Variable,
    /// Values separated by commas.
    pub text: String,
    /// Why the text does not parse (the specification keeps its last good grid meanwhile).
    pub error: Option<String>,
}

/// How the last sweep of the window ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every cell is in the results file.
    Finished {
        /// Cells in the sweep.
        cells: usize,
        /// Cells found finished in the folder.
        reused: usize,
        /// Fine-tuning runs made.
        runs_trained: usize,
        /// Seconds it took.
        seconds: f64,
        /// The plots folder written, or why it could not be.
        plots: std::result::Result<PathBuf, String>,
    },
    /// The Slurm executor's run ended (every cell finished, or some failed).
    OnSlurm {
        /// Cells in the sweep.
        cells: usize,
        /// Cells without a result.
        missing: usize,
        /// How many cells ran where, as `mergescope sweep` says it.
        summary: String,
        /// The plots folder written, or why it could not be.
        plots: std::result::Result<PathBuf, String>,
    },
    /// Cancelled; the finished cells stay in the results file.
    Cancelled {
        /// Cells finished.
        cells_done: usize,
        /// Cells in the sweep.
        cells: usize,
    },
}

impl Outcome {
    /// One line for the window and the log.
    pub fn text(&self) -> String {
        match self {
            Outcome::Finished {
                cells,
                reused,
                runs_trained,
                seconds,
                ..
            } => format!(
                "done: {cells} cells ({reused} reused from the folder), {runs_trained} fine-tuning runs in {}",
                crate::text::duration_text(*seconds)
            ),
            Outcome::OnSlurm {
                missing: 0, summary, ..
            } => format!("done on Slurm: {summary}"),
            Outcome::OnSlurm { cells, missing, .. } => format!(
                "{missing} of {cells} cells have no result: fix what their logs say (below) and Resume: only they are submitted"
            ),
            Outcome::Cancelled { cells_done, cells } => format!(
                "cancelled at {cells_done} of {cells} cells: the finished ones stay in {RESULTS_FILE}; Resume continues from there"
            ),
        }
    }
}

/// The benchmark a sweep of the window trains on.
pub enum JobBench {
    /// A demo benchmark of an image architecture.
    Demo(Box<Benchmark>),
    /// A text benchmark build (all-MiniLM-L6-v2 and its text tasks).
    Text(Box<TextBenchmark>),
}

/// How the window tells the user to make a text benchmark.
pub const BUILD_TEXT_HINT: &str = "make one with Benchmark > Build text benchmark (it asks for the all-MiniLM-L6-v2 model folder; scripts/fetch-minilm.sh fetches it), then choose it here";

/// The folder a text sweep's `benchmark` names: `demo` or `text` (the cache's build of seed 0),
/// a build folder, or its `suite.toml`; `None` when the cache cannot be found.
pub fn text_build_dir(name: &str) -> Option<PathBuf> {
    match name {
        "demo" | "text" => text_demo_dir(0).ok(),
        _ => {
            let p = PathBuf::from(name);
            Some(match p.file_name() {
                Some(f) if f == "suite.toml" => p.parent().map(Path::to_path_buf).unwrap_or_default(),
                _ => p,
            })
        }
    }
}

/// The text benchmark builds the window knows, in order, each once: the folder of the open
/// suite when it is a text build (Benchmark > Build text benchmark opens the one it made), then
/// the cache's build of seed 0 (`~/.cache/mergescope/demo/text-minilm-seed0`).
pub fn known_text_builds(suite: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let open = suite.and_then(|s| text_build_dir(&s.display().to_string()));
    for dir in open.into_iter().chain(text_demo_dir(0).ok()) {
        if is_text_build(&dir) && !out.iter().any(|d| same_dir(d, &dir)) {
            out.push(dir);
        }
    }
    out
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

/// Everything a sweep runs on, gathered on the UI thread when it starts.
pub struct SweepJob {
    /// The specification.
    pub spec: SweepSpec,
    /// The benchmark whose base and heads start every run.
    pub benchmark: JobBench,
    /// The method plugins, one per method of the specification.
    pub plugins: Vec<Arc<Plugin>>,
    /// The sweep folder.
    pub folder: PathBuf,
    /// Where tensors live.
    pub device: DeviceChoice,
    /// On Slurm: how the array job is asked for and what the cells run; `None`: locally.
    pub slurm: Option<(SlurmOptions, SlurmSweepSettings)>,
}

/// The Slurm executor's fields as the window edits them (remembered between launches in the
/// [`Settings`](crate::settings::Settings), every field optional so that older settings load).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlurmForm {
    /// `--partition`; empty: the cluster's default.
    pub partition: String,
    /// Time limit per cell as sbatch takes it (`00:30:00`); empty: the partition's.
    pub time: String,
    /// CPUs per cell.
    pub cpus_per_cell: usize,
    /// GPUs per cell; 0: none.
    pub gpus_per_cell: u32,
    /// At most this many cells at once; 0: no limit.
    pub max_parallel: usize,
    /// The shared work folder; empty: `<sweep folder>/slurm`.
    pub workdir: String,
    /// A shell line each cell runs first (`module load cuda`); empty: none.
    pub setup: String,
    /// Seconds between two looks at the queue.
    pub poll_seconds: f64,
    /// The `mergescope` binary the nodes run; `None`: the one beside this executable (not
    /// remembered: the window does not show it).
    #[serde(skip)]
    pub bin: Option<PathBuf>,
}

/// [`ExecutorKind`] as the settings file writes it (`"Local"`, `"Slurm"`).
#[derive(Serialize, Deserialize)]
#[serde(remote = "ExecutorKind")]
enum ExecutorKindDef {
    Local,
    Slurm,
}

/// The Experiments window's executor choice and Slurm fields, as the settings remember them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ExecutorSettings {
    /// Where the cells run.
    #[serde(with = "ExecutorKindDef")]
    pub executor: ExecutorKind,
    /// The Slurm executor's fields.
    pub slurm: SlurmForm,
}

impl Default for SlurmForm {
    fn default() -> Self {
        SlurmForm {
            partition: String::new(),
            time: String::new(),
            cpus_per_cell: 1,
            gpus_per_cell: 0,
            max_parallel: 0,
            workdir: String::new(),
            setup: String::new(),
            poll_seconds: 2.0,
            bin: None,
        }
    }
}

fn non_empty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

impl SlurmForm {
    /// The array job's options; the error names the field to fix.
    pub fn options(&self) -> Result<SlurmOptions> {
        if !(self.poll_seconds.is_finite() && self.poll_seconds > 0.0) {
            return Err(EngineError::Param(format!(
                "Slurm poll interval {}: give a positive number of seconds",
                self.poll_seconds
            )));
        }
        if let Some(t) = non_empty(&self.time)
            && !t.chars().all(|c| c.is_ascii_digit() || c == ':' || c == '-')
        {
            return Err(EngineError::Param(format!(
                "Slurm time limit '{t}': write it as sbatch takes it, e.g. 00:30:00 or 1-00:00:00"
            )));
        }
        Ok(SlurmOptions {
            partition: non_empty(&self.partition),
            time: non_empty(&self.time),
            cpus_per_task: self.cpus_per_cell.max(1),
            gpus: (self.gpus_per_cell > 0).then_some(self.gpus_per_cell),
            array_parallelism: (self.max_parallel > 0).then_some(self.max_parallel),
            poll: Duration::from_secs_f64(self.poll_seconds),
            job_name: "mergescope-sweep".to_owned(),
            setup: non_empty(&self.setup).into_iter().collect(),
            ..SlurmOptions::default()
        })
    }

    /// The work folder for the sweep in `folder`.
    pub fn workdir(&self, folder: &Path) -> PathBuf {
        non_empty(&self.workdir).map_or_else(|| folder.join("slurm"), PathBuf::from)
    }
}

/// The `mergescope` binary beside this executable: this executable when it is `mergescope`
/// (the window runs as `mergescope gui`), else one named so in its folder or the folder above
/// (a test binary in `target/<profile>/deps`).
pub fn mergescope_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| EngineError::Invalid(format!("cannot find this executable's path ({e})")))?;
    if exe.file_stem().is_some_and(|s| s == "mergescope") {
        return Ok(exe);
    }
    let name = format!("mergescope{}", std::env::consts::EXE_SUFFIX);
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            EngineError::Invalid(format!(
                "no '{name}' binary beside '{}' for the Slurm nodes to run: build it (cargo build -p mergescope) or run the window as 'mergescope gui'",
                exe.display()
            ))
        })
}

/// Whether `sbatch` is on `PATH`; otherwise what to do.
pub fn sbatch_missing() -> Option<String> {
    let name = format!("sbatch{}", std::env::consts::EXE_SUFFIX);
    let found = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&name).is_file()));
    (!found).then(|| {
        "sbatch is not on PATH: install Slurm's client tools (or run the window where they are), or choose Local"
            .to_owned()
    })
}

fn device_name(d: DeviceChoice) -> &'static str {
    match d {
        DeviceChoice::Cpu => "cpu",
        DeviceChoice::Cuda => "cuda",
        DeviceChoice::Metal => "metal",
    }
}

/// Where the Slurm job of the running (or last) sweep stands, as the window shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlurmStatus {
    /// The array jobs submitted, in order (one per retry round).
    pub jobs: Vec<String>,
    /// Cells in the sweep.
    pub cells: usize,
    /// Cells found finished before the run.
    pub reused: usize,
    /// Cells finished (reused ones included).
    pub done: usize,
    /// Cells running now.
    pub running: usize,
    /// Cells waiting in the queue.
    pub pending: usize,
    /// Cells submitted again after the scheduler killed them.
    pub retried: usize,
    /// The executor's events (submissions, retries), oldest first.
    pub events: Vec<String>,
    /// The cells that did not finish: key, Slurm state, error and log, as the CLI prints them.
    pub failures: Vec<String>,
    /// Seconds from the first submission to the first cell's result.
    pub first_result: Option<f64>,
}

/// What the sweep thread reports while it runs.
enum Update {
    Progress(SweepProgress),
    Results(Vec<Row>, Vec<VariableResult>),
    Slurm(SlurmStatus),
}

/// The Experiments panel's state: the sweep being edited, its folder, the job in flight and
/// the results read from the folder.
pub struct Experiments {
    /// Whether the window is open.
    pub open: bool,
    /// The preset the specification started from, or the TOML file's stem.
    pub name: String,
    /// The sweep being edited (the grids hold the last text that parsed).
    pub spec: SweepSpec,
    /// The grids as typed, in [`Variable::ALL`] order.
    pub grids: Vec<GridField>,
    /// The sweep folder: results.csv, the checkpoints, plots/ and fits.md.
    pub folder: PathBuf,
    /// Whether the user picked the folder (otherwise it follows the name and the arch).
    pub folder_chosen: bool,
    /// Where the running (or last) sweep stands.
    pub progress: Option<SweepProgress>,
    /// Why the last sweep, or the last action, failed.
    pub error: Option<String>,
    /// How the last sweep ended.
    pub outcome: Option<Outcome>,
    /// The rows of the folder's results file, as last read.
    pub rows: Vec<Row>,
    /// The results along every swept variable.
    pub results: Vec<VariableResult>,
    /// The accuracy and loss figures of each result, in the same order.
    pub figures: Vec<[(String, Figure); 2]>,
    /// The variable whose plots are shown.
    pub variable: Option<Variable>,
    /// Where the cells run.
    pub executor: ExecutorKind,
    /// The Slurm executor's fields.
    pub slurm: SlurmForm,
    /// Why the Slurm executor cannot run here (no `sbatch`), checked when it is chosen.
    pub slurm_warning: Option<String>,
    /// The Slurm job of the running (or last) sweep.
    pub slurm_status: Option<SlurmStatus>,
    sweeps_root: PathBuf,
    configured: bool,
    notes: Vec<(bool, String)>,
    task: Background<Update, Outcome>,
}

/// The benchmark's name in a specification: its folder.
pub fn benchmark_id(b: &Benchmark) -> String {
    b.dir.display().to_string()
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

impl Experiments {
    /// A closed panel whose sweep folders go under `sweeps_root`.
    pub fn new(sweeps_root: PathBuf) -> Experiments {
        let mut e = Experiments {
            open: false,
            name: SweepSpec::PRESETS[0].to_owned(),
            spec: preset_spec(SweepSpec::PRESETS[0], Arch::Cnn),
            grids: Vec::new(),
            folder: PathBuf::new(),
            folder_chosen: false,
            progress: None,
            error: None,
            outcome: None,
            rows: Vec::new(),
            results: Vec::new(),
            figures: Vec::new(),
            variable: None,
            executor: ExecutorKind::Local,
            slurm: SlurmForm::default(),
            slurm_warning: None,
            slurm_status: None,
            sweeps_root,
            configured: false,
            notes: Vec::new(),
            task: Background::default(),
        };
        e.grids = fields(&e.spec.grid);
        e.folder = e.default_folder();
        e
    }

    /// The folder sweep folders go under by default.
    pub fn sweeps_root(&self) -> &Path {
        &self.sweeps_root
    }

    /// Starts from the first preset for `bench` the first time the panel opens.
    pub fn configure(&mut self, bench: Option<&Benchmark>, installed: &[&str]) {
        if !self.configured {
            self.reset_to_preset(SweepSpec::PRESETS[0], bench, installed);
            self.configured = true;
        }
    }

    /// Replaces the specification by preset `name` for `bench`'s architecture (CNN without
    /// one), keeping the methods whose plugins are installed.
    /// A text sweep stays on its text build.
    pub fn reset_to_preset(&mut self, name: &str, bench: Option<&Benchmark>, installed: &[&str]) {
        if self.is_text() {
            let mut spec = text_preset(name, installed);
            spec.benchmark = self.spec.benchmark.clone();
            self.name = name.to_owned();
            self.set_spec(spec);
            return;
        }
        let arch = bench.map_or(Arch::Cnn, |b| b.manifest.arch);
        let mut spec = preset_spec(name, arch);
        spec.methods.retain(|m| installed.contains(&m.plugin.as_str()));
        if let Some(b) = bench {
            spec.benchmark = benchmark_id(b);
        }
        self.name = name.to_owned();
        self.set_spec(spec);
    }

    /// Whether the sweep is on the text benchmark (`arch = "text"`).
    pub fn is_text(&self) -> bool {
        matches!(self.spec.kind(), Ok(BenchKind::Text))
    }

    /// Sweeps the text benchmark in `dir` (a build folder, or `demo` for the cache's): the
    /// preset for the text benchmark (`paper-002` when the name is no preset), with the
    /// installed methods, unless the sweep already is on the text benchmark (then only its
    /// benchmark changes).
    pub fn use_text_benchmark(&mut self, dir: &str, installed: &[&str]) {
        let mut spec = if self.is_text() {
            self.spec.clone()
        } else {
            if SweepSpec::preset_for(&self.name, BenchKind::Text).is_err() {
                SweepSpec::PRESETS[0].clone_into(&mut self.name);
            }
            text_preset(&self.name, installed)
        };
        spec.benchmark = dir.to_owned();
        self.error = None;
        self.set_spec(spec);
    }

    /// Sweeps the demo benchmark `bench` (the open one), or the cache's build of `arch`: the
    /// preset for that architecture when the sweep is on another one (or on the text
    /// benchmark), else only the benchmark changes.
    pub fn use_demo_benchmark(&mut self, arch: Arch, bench: Option<&Benchmark>, installed: &[&str]) {
        let arch = bench.map_or(arch, |b| b.manifest.arch);
        let id = bench.map_or_else(|| "demo".to_owned(), benchmark_id);
        if self.spec.arch().ok() == Some(arch) {
            let mut spec = self.spec.clone();
            spec.benchmark = id;
            self.set_spec(spec);
        } else {
            let name = self.name.clone();
            let mut spec = preset_spec(&name, arch);
            spec.methods.retain(|m| installed.contains(&m.plugin.as_str()));
            spec.benchmark = id;
            self.set_spec(spec);
        }
        self.error = None;
    }

    /// The text build folder the sweep names, when it is a text sweep.
    pub fn text_dir(&self) -> Option<PathBuf> {
        if self.is_text() {
            text_build_dir(&self.spec.benchmark)
        } else {
            None
        }
    }

    /// The preset's own entry for `plugin` (its label and parameters), if it has one.
    pub fn preset_method(&self, plugin: &str) -> Option<MethodSpec> {
        let kind = self.spec.kind().unwrap_or(BenchKind::Demo(Arch::Cnn));
        SweepSpec::PRESETS
            .iter()
            .filter_map(|p| SweepSpec::preset_for(p, kind).ok())
            .flat_map(|s| s.methods)
            .find(|m| m.plugin == plugin)
    }

    /// Uses `spec`: the form's grids follow it, the folder too unless the user chose one, and
    /// the results there are read back.
    pub fn set_spec(&mut self, spec: SweepSpec) {
        self.spec = spec;
        self.grids = fields(&self.spec.grid);
        if !self.folder_chosen {
            self.folder = self.default_folder();
        }
        self.reload();
    }

    /// `sweeps/<name>-<arch>` under the sweeps root.
    pub fn default_folder(&self) -> PathBuf {
        self.sweeps_root
            .join(format!("{}-{}", file_safe(&self.name), file_safe(&self.spec.arch)))
    }

    /// The folder as the window shows it: `sweeps/…` when under the sweeps root.
    pub fn folder_label(&self) -> String {
        match self.folder.strip_prefix(&self.sweeps_root) {
            Ok(rest) => Path::new("sweeps").join(rest).display().to_string(),
            Err(_) => self.folder.display().to_string(),
        }
    }

    /// Runs the sweep in `folder` from now on; its results are read back.
    pub fn set_folder(&mut self, folder: PathBuf) {
        self.folder = folder;
        self.folder_chosen = true;
        self.reload();
    }

    /// The folder's results file.
    pub fn results_file(&self) -> PathBuf {
        self.folder.join(RESULTS_FILE)
    }

    /// Whether the folder holds results (a sweep to resume or to look at).
    pub fn has_results(&self) -> bool {
        self.results_file().is_file()
    }

    /// Reads the folder's results again (none when it has no results file).
    pub fn reload(&mut self) {
        let path = self.results_file();
        self.rows = if path.is_file() {
            match read_rows(&path) {
                Ok(rows) => rows,
                Err(e) => {
                    self.error = Some(format!("{e}; pick another sweep folder (Folder…)"));
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        self.reanalyse();
    }

    /// Recomputes the results and figures from the rows for the current specification.
    pub fn reanalyse(&mut self) {
        let results = analyse(&self.spec, &self.rows);
        self.set_results(results);
    }

    fn set_results(&mut self, results: Vec<VariableResult>) {
        self.figures = results.iter().map(figures).collect();
        self.results = results;
        if !self
            .variable
            .is_some_and(|v| self.results.iter().any(|r| r.variable == v))
        {
            self.variable = self.results.first().map(|r| r.variable);
        }
    }

    /// The index of the shown variable's result (and figures).
    pub fn shown(&self) -> Option<usize> {
        let v = self.variable?;
        self.results.iter().position(|r| r.variable == v)
    }

    /// Applies the text of grid field `i`; returns whether the specification changed.
    pub fn apply_grid_text(&mut self, i: usize) -> bool {
        let Some(field) = self.grids.get_mut(i) else {
            return false;
        };
        let before = self.spec.grid.clone();
        match set_grid(&mut self.spec.grid, field.variable, &field.text) {
            Ok(()) => field.error = None,
            Err(e) => field.error = Some(e.to_string()),
        }
        self.spec.grid != before
    }

    /// Adds (with the preset's label and parameters when it has them) or removes the method
    /// of `plugin`.
    pub fn set_method(&mut self, plugin: &str, on: bool) {
        let has = self.spec.methods.iter().any(|m| m.plugin == plugin);
        if on && !has {
            let m = self.preset_method(plugin).unwrap_or_else(|| MethodSpec {
                plugin: plugin.to_owned(),
                label: None,
                params: Default::default(),
            });
            self.spec.methods.push(m);
        } else if !on {
            self.spec.methods.retain(|m| m.plugin != plugin);
        }
    }

    /// The open benchmark when the specification names it.
    fn matching<'b>(&self, open: Option<&'b Benchmark>) -> Option<&'b Benchmark> {
        open.filter(|b| benchmark_id(b) == self.spec.benchmark)
    }

    /// Whether the sweep can run: every grid parses and the specification is valid for the
    /// open benchmark (when it is the sweep's) and the installed plugins.
    /// A text sweep needs its build: without one the error says how to make it.
    pub fn check(&self, open: Option<&Benchmark>, installed: &[&str]) -> Result<()> {
        if let Some(e) = self.grids.iter().find_map(|g| g.error.clone()) {
            return Err(EngineError::Param(e));
        }
        if self.is_text() {
            let dir = self.text_dir().unwrap_or_default();
            if !is_text_build(&dir) {
                return Err(EngineError::Param(format!(
                    "no text benchmark build in '{}': {BUILD_TEXT_HINT}",
                    dir.display()
                )));
            }
            if self.spec.eval_examples.is_some() {
                return Err(EngineError::Param(
                    "eval examples / task: the text benchmark's suite scores every test text; tick 'all'".to_owned(),
                ));
            }
            if let Some(h) = self
                .spec
                .points()
                .into_iter()
                .find(|h| !h.optimizer.eq_ignore_ascii_case("adamw"))
            {
                return Err(EngineError::Param(format!(
                    "optimiser '{}': the text benchmark fine-tunes with AdamW only; choose adamw",
                    h.optimizer
                )));
            }
        }
        let pool = self.matching(open).map_or(usize::MAX, |b| b.manifest.tasks.len());
        self.spec.validate(pool, installed)
    }

    /// Reads a specification from a TOML file; the folder follows its name.
    pub fn load_toml(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
        let spec =
            SweepSpec::from_toml(&text).map_err(|e| EngineError::Param(format!("in '{}': {e}", path.display())))?;
        self.name = path
            .file_stem()
            .map_or("sweep".to_owned(), |s| s.to_string_lossy().into_owned());
        self.error = None;
        self.set_spec(spec);
        Ok(())
    }

    /// Writes the specification as TOML (atomically).
    pub fn save_toml(&self, path: &Path) -> Result<()> {
        let text = self.spec.to_toml()?;
        mergescope_engine::writer::write_atomic(path, text.as_bytes())
    }

    /// What the sweep needs, from the registry, the open benchmark (or the one the
    /// specification names) and the device; the error says what to fix.
    pub fn prepare(&self, registry: &Registry, open: Option<&Benchmark>, device: DeviceChoice) -> Result<SweepJob> {
        let installed: Vec<&str> = registry.plugins.iter().map(|p| p.id()).collect();
        self.check(open, &installed)?;
        let benchmark = if self.is_text() {
            let b = open_text_benchmark(&self.spec.benchmark)
                .map_err(|e| EngineError::Invalid(format!("the sweep's text benchmark: {e}; or {BUILD_TEXT_HINT}")))?;
            JobBench::Text(Box::new(b))
        } else {
            JobBench::Demo(Box::new(match self.matching(open) {
                Some(b) => b.clone(),
                None => resolve_benchmark(&self.spec.benchmark, self.spec.arch().ok()).map_err(|e| {
                    EngineError::Invalid(format!("the sweep's benchmark '{}': {e}", self.spec.benchmark))
                })?,
            }))
        };
        let plugins = self
            .spec
            .methods
            .iter()
            .map(|m| registry.find(&m.plugin).map_err(EngineError::Param))
            .collect::<Result<Vec<_>>>()?;
        let slurm = match self.executor {
            ExecutorKind::Local => None,
            ExecutorKind::Slurm => {
                let opts = self.slurm.options()?;
                let bin = match &self.slurm.bin {
                    Some(b) => b.clone(),
                    None => mergescope_binary()?,
                };
                // Bundled plugins and the user's folder are found by the cells as here; the
                // folders given with --plugin-dir travel with the job.
                let mut plugin_dirs: Vec<PathBuf> = Vec::new();
                for p in plugins.iter().filter(|p| p.origin == PluginOrigin::Extra) {
                    if let Some(d) = p.path.parent()
                        && !plugin_dirs.iter().any(|x| x == d)
                    {
                        plugin_dirs.push(d.to_path_buf());
                    }
                }
                let settings = SlurmSweepSettings {
                    workdir: Some(self.slurm.workdir(&self.folder)),
                    bin,
                    plugin_dirs,
                    device: device_name(device).to_owned(),
                    env: mergescope_env(),
                };
                Some((opts, settings))
            }
        };
        Ok(SweepJob {
            spec: self.spec.clone(),
            benchmark,
            plugins,
            folder: self.folder.clone(),
            device,
            slurm,
        })
    }

    /// Runs the cells with `executor` from now on; choosing Slurm checks that `sbatch` is
    /// there.
    pub fn set_executor(&mut self, executor: ExecutorKind) {
        self.executor = executor;
        self.slurm_warning = match executor {
            ExecutorKind::Local => None,
            ExecutorKind::Slurm => sbatch_missing(),
        };
    }

    /// The executor choice and the Slurm fields, for the settings.
    pub fn executor_settings(&self) -> ExecutorSettings {
        ExecutorSettings {
            executor: self.executor,
            slurm: self.slurm.clone(),
        }
    }

    /// Takes up remembered executor settings (the binary the nodes run is kept: the settings
    /// do not hold it).
    pub fn restore_executor(&mut self, settings: &ExecutorSettings) {
        let bin = self.slurm.bin.take();
        self.slurm = SlurmForm {
            bin,
            ..settings.slurm.clone()
        };
        self.set_executor(settings.executor);
    }

    /// Starts `job` on a background thread (after cancelling any sweep in flight); `notify`
    /// wakes the window on progress.
    pub fn start(&mut self, job: SweepJob, notify: Notify) {
        self.error = None;
        self.outcome = None;
        self.progress = None;
        self.slurm_status = None;
        let started = self.task.start(
            "mergescope-sweep",
            notify,
            "the sweep panicked; please report it with the log",
            move |cancel, send| match job.slurm.clone() {
                None => work(&job, cancel, send),
                Some((opts, settings)) => work_on_slurm(&job, &opts, &settings, cancel, send),
            },
        );
        if let Err(e) = started {
            self.error = Some(format!("cannot start the sweep thread: {e}"));
        }
    }

    /// Asks the sweep in flight to stop after the step or cell it is on.
    pub fn cancel(&mut self) {
        self.task.cancel();
    }

    /// Whether a sweep is in flight.
    pub fn running(&self) -> bool {
        self.task.since().is_some()
    }

    /// Applies the thread's messages; returns whether anything changed.
    pub fn pump(&mut self) -> bool {
        let messages = self.task.messages();
        let changed = !messages.is_empty();
        for m in messages {
            match m {
                TaskMessage::Update(Update::Progress(p)) => self.progress = Some(p),
                TaskMessage::Update(Update::Slurm(s)) => self.slurm_status = Some(s),
                TaskMessage::Update(Update::Results(rows, results)) => {
                    self.rows = rows;
                    self.set_results(results);
                }
                TaskMessage::Done(r) => {
                    self.task.finish();
                    match r {
                        Ok(outcome) => {
                            self.notes.push((false, format!("sweep: {}", outcome.text())));
                            if let Outcome::Finished { plots: Err(e), .. } | Outcome::OnSlurm { plots: Err(e), .. } =
                                &outcome
                            {
                                self.notes.push((true, format!("sweep plots not written: {e}")));
                            }
                            for f in self.slurm_status.iter().flat_map(|s| &s.failures) {
                                self.notes.push((true, format!("sweep {f}")));
                            }
                            self.outcome = Some(outcome);
                        }
                        Err(e) => {
                            self.notes.push((true, format!("sweep failed: {e}")));
                            self.error = Some(e.to_string());
                        }
                    }
                    break;
                }
            }
        }
        changed
    }

    /// The log lines of finished sweeps since the last call (`true`: an error).
    pub fn take_notes(&mut self) -> Vec<(bool, String)> {
        std::mem::take(&mut self.notes)
    }
}

/// The preset `name` for the text benchmark (`paper-002` when the name is unknown), with the
/// installed methods.
fn text_preset(name: &str, installed: &[&str]) -> SweepSpec {
    let mut spec = SweepSpec::preset_for(name, BenchKind::Text).unwrap_or_else(|_| SweepSpec::paper_002_text());
    spec.methods.retain(|m| installed.contains(&m.plugin.as_str()));
    spec
}

/// The preset `name` for `arch` (`paper-002` when the name is unknown).
fn preset_spec(name: &str, arch: Arch) -> SweepSpec {
    SweepSpec::preset(name, arch).unwrap_or_else(|_| SweepSpec::paper_002(arch))
}

fn fields(grid: &Grid) -> Vec<GridField> {
    Variable::ALL
        .into_iter()
        .map(|v| GridField {
            variable: v,
            text: grid_text(grid, v),
            error: None,
        })
        .collect()
}

/// Engine messages written for the CLI, worded for the window.
fn for_window(e: &EngineError) -> String {
    e.to_string()
        .replace("choose another --out folder", "pick another sweep folder (Folder…)")
        .replace(
            "choose an empty or new --out folder",
            "pick an empty or new sweep folder (Folder…)",
        )
        .replace("or use --executor local", "or choose the Local executor")
        .replace("give --mergescope-bin", "run the window as 'mergescope gui'")
}

/// What the progress callback has already passed on.
struct Relay {
    sent: Instant,
    cells_read: Option<usize>,
    last: Option<SweepProgress>,
}

/// Reads the results file and sends the rows and their analysis.
fn send_results(job: &SweepJob, send: &(dyn Fn(Update) + Sync)) -> Option<Vec<VariableResult>> {
    let rows = read_rows(&job.folder.join(RESULTS_FILE)).ok()?;
    let results = analyse(&job.spec, &rows);
    send(Update::Results(rows, results.clone()));
    Some(results)
}

/// Runs the sweep, passing on progress (at most every 0.1 s, and every new stage) and the
/// results whenever a cell finishes.
fn work(job: &SweepJob, cancel: &AtomicBool, send: &(dyn Fn(Update) + Sync)) -> Result<Outcome> {
    with_inputs(job, |inputs| work_local(job, inputs, cancel, send))
}

/// Calls `f` with the sweep's inputs.
fn with_inputs<T>(job: &SweepJob, f: impl FnOnce(&SweepInputs<'_>) -> Result<T>) -> Result<T> {
    let tasks = match &job.benchmark {
        JobBench::Demo(_) => benchmark_tasks(None)?,
        JobBench::Text(_) => Vec::new(),
    };
    let (device, _) = open_device(job.device);
    let opts = ExecOptions {
        device,
        ..ExecOptions::default()
    };
    let plugins: Vec<&Plugin> = job.plugins.iter().map(|p| &**p).collect();
    let inputs = SweepInputs {
        spec: &job.spec,
        bench: match &job.benchmark {
            JobBench::Demo(bench) => SweepBench::Demo { bench, tasks: &tasks },
            JobBench::Text(b) => SweepBench::Text(b),
        },
        plugins: &plugins,
        out_dir: &job.folder,
        opts: &opts,
    };
    f(&inputs)
}

fn work_local(
    job: &SweepJob,
    inputs: &SweepInputs<'_>,
    cancel: &AtomicBool,
    send: &(dyn Fn(Update) + Sync),
) -> Result<Outcome> {
    let relay = Mutex::new(Relay {
        sent: Instant::now(),
        cells_read: None,
        last: None,
    });
    let progress = |p: &SweepProgress| {
        let mut r = relay.lock().unwrap_or_else(|e| e.into_inner());
        r.last = Some(p.clone());
        let new_cells = r.cells_read != Some(p.cells_done);
        if new_cells {
            r.cells_read = Some(p.cells_done);
            send_results(job, send);
        }
        if new_cells || r.sent.elapsed() >= Duration::from_millis(100) {
            r.sent = Instant::now();
            send(Update::Progress(p.clone()));
        }
    };
    let outcome = run_sweep(inputs, &progress, cancel);
    let last = relay.into_inner().unwrap_or_else(|e| e.into_inner()).last;
    if let Some(p) = &last {
        send(Update::Progress(p.clone()));
    }
    let results = send_results(job, send);
    match outcome {
        Ok(s) => {
            let plots = plots_of(job, &results.unwrap_or_default());
            Ok(Outcome::Finished {
                cells: s.cells,
                reused: s.reused,
                runs_trained: s.runs_trained,
                seconds: s.seconds,
                plots,
            })
        }
        Err(EngineError::Cancelled) => Ok(Outcome::Cancelled {
            cells_done: last.as_ref().map_or(0, |p| p.cells_done),
            cells: last.as_ref().map_or(0, |p| p.cells),
        }),
        Err(e) => Err(EngineError::Invalid(for_window(&e))),
    }
}

fn plots_of(job: &SweepJob, results: &[VariableResult]) -> std::result::Result<PathBuf, String> {
    write_plots(&job.folder, results, PLOT_SIZE.0, PLOT_SIZE.1)
        .map(|_| job.folder.join(PLOTS_DIR))
        .map_err(|e| e.to_string())
}

/// Runs the sweep's missing cells as a Slurm array job (the lab's [`SlurmSweep`], as
/// `mergescope sweep --executor slurm`), passing on the job's state and, whenever cells
/// finish, the gathered results.
fn work_on_slurm(
    job: &SweepJob,
    opts: &SlurmOptions,
    settings: &SlurmSweepSettings,
    cancel: &AtomicBool,
    send: &(dyn Fn(Update) + Sync),
) -> Result<Outcome> {
    let started = Instant::now();
    let sweep = with_inputs(job, |inputs| SlurmSweep::prepare(inputs, settings))
        .map_err(|e| EngineError::Invalid(for_window(&e)))?;
    let cells = sweep.cells();
    let status = Mutex::new((
        SlurmStatus {
            cells,
            reused: sweep.reused(),
            done: sweep.reused(),
            pending: sweep.todo.len(),
            ..SlurmStatus::default()
        },
        sweep.reused(),
    ));
    let stage = |s: &SlurmStatus| SweepProgress {
        stage: match s.jobs.last() {
            Some(j) => format!("Slurm job {j}: {} running, {} pending", s.running, s.pending),
            None if sweep.todo.is_empty() => "every cell is finished".to_owned(),
            None => "submitting to Slurm".to_owned(),
        },
        cells_done: s.done,
        cells,
        steps_done: 0,
        steps: 0,
        elapsed: started.elapsed().as_secs_f64(),
        eta: None,
    };
    {
        let s = &status.lock().unwrap_or_else(|e| e.into_inner()).0;
        send(Update::Progress(stage(s)));
        send(Update::Slurm(s.clone()));
    }
    let progress = |p: &SlurmProgress| {
        let mut guard = status.lock().unwrap_or_else(|e| e.into_inner());
        let (s, base) = &mut *guard;
        // A retry round counts its own cells: the ones finished before it are the base.
        if s.jobs.last() != Some(&p.job) {
            s.jobs.push(p.job.clone());
            *base = s.done;
        }
        let done = *base + p.done;
        if done != s.done
            && let Ok((rows, _)) = sweep.gather()
        {
            let results = analyse(&job.spec, &rows);
            send(Update::Results(rows, results));
        }
        s.done = done;
        s.running = p.running;
        s.pending = p.pending;
        if let Some(e) = &p.event {
            if e.contains("submitting it again") {
                s.retried += 1;
            }
            s.events.push(e.clone());
        }
        send(Update::Progress(stage(s)));
        send(Update::Slurm(s.clone()));
    };
    let outcome = sweep
        .run(opts, &progress, cancel)
        .map_err(|e| EngineError::Invalid(for_window(&e)))?;
    let results = analyse(&job.spec, &outcome.rows);
    send(Update::Results(outcome.rows.clone(), results.clone()));
    let mut s = status.into_inner().unwrap_or_else(|e| e.into_inner()).0;
    s.done = cells - outcome.missing.len();
    s.running = 0;
    s.pending = 0;
    if let Some(run) = &outcome.run {
        s.retried = run.retried;
        s.first_result = run.first_result;
        for j in &run.jobs {
            if !s.jobs.contains(j) {
                s.jobs.push(j.clone());
            }
        }
    }
    s.failures = outcome.failures();
    send(Update::Progress(SweepProgress {
        stage: if outcome.cancelled {
            "cancelled".to_owned()
        } else {
            "finished".to_owned()
        },
        ..stage(&s)
    }));
    send(Update::Slurm(s));
    if outcome.cancelled {
        return Ok(Outcome::Cancelled {
            cells_done: cells - outcome.missing.len(),
            cells,
        });
    }
    Ok(Outcome::OnSlurm {
        cells,
        missing: outcome.missing.len(),
        summary: outcome.summary(),
        plots: plots_of(job, &results),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slurm_fields_make_the_array_jobs_options_and_name_what_is_wrong() {
        let mut f = SlurmForm::default();
        let o = f.options().unwrap();
        assert_eq!(
            (o.partition, o.time, o.gpus, o.array_parallelism),
            (None, None, None, None)
        );
        assert!(o.setup.is_empty());
        f.partition = " gpu ".into();
        f.time = "1-00:00:00".into();
        f.gpus_per_cell = 2;
        f.max_parallel = 8;
        f.setup = "module load cuda".into();
        let o = f.options().unwrap();
        assert_eq!(o.partition.as_deref(), Some("gpu"));
        assert_eq!((o.gpus, o.array_parallelism), (Some(2), Some(8)));
        assert_eq!(o.setup, ["module load cuda"]);
        assert_eq!(f.workdir(Path::new("/s")), Path::new("/s/slurm"));
        f.workdir = "/shared/w".into();
        assert_eq!(f.workdir(Path::new("/s")), Path::new("/shared/w"));
        f.time = "30 min".into();
        let e = f.options().unwrap_err().to_string();
        assert!(e.contains("'30 min'") && e.contains("00:30:00"), "{e}");
        let mut x = Experiments::new(PathBuf::from("sweeps"));
        x.set_executor(ExecutorKind::Slurm);
        assert_eq!(x.slurm_warning, sbatch_missing());
        x.set_executor(ExecutorKind::Local);
        assert_eq!(x.slurm_warning, None);
    }

    #[test]
    fn grids_parse_from_text_and_name_the_field_that_does_not() {
        let mut g = Grid::default();
        set_grid(&mut g, Variable::Steps, " 50, 100,200 ,").unwrap();
        assert_eq!(g.steps, [50, 100, 200]);
        set_grid(&mut g, Variable::LearningRate, "2e-4; 0.001").unwrap();
        assert_eq!(g.lr, [2e-4, 1e-3]);
        set_grid(&mut g, Variable::Optimizer, "SGD, adamw").unwrap();
        assert_eq!(g.optimizer, ["sgd", "adamw"]);
        assert_eq!(grid_text(&g, Variable::Steps), "50, 100, 200");
        let e = set_grid(&mut g, Variable::Steps, "50, 1o0").unwrap_err().to_string();
        assert!(e.starts_with("steps K: '1o0' is not a whole number"), "{e}");
        assert_eq!(g.steps, [50, 100, 200], "a bad text leaves the grid as it was");
        let e = set_grid(&mut g, Variable::DataRatio, "0.5, half")
            .unwrap_err()
            .to_string();
        assert!(e.contains("data ratio α") && e.contains("'half'"), "{e}");
        let e = set_grid(&mut g, Variable::Optimizer, "lion").unwrap_err().to_string();
        assert!(e.contains("sgd, momentum, adamw"), "{e}");
        set_grid(&mut g, Variable::Tasks, "").unwrap();
        assert!(g.tasks.is_empty(), "empty: only the default");
    }

    #[test]
    fn the_preset_keeps_installed_methods_and_the_folder_follows_its_name() {
        let root = tempfile::tempdir().unwrap();
        let mut e = Experiments::new(root.path().join("sweeps"));
        e.reset_to_preset("paper-002", None, &["ties", "task-arithmetic"]);
        let plugins: Vec<&str> = e.spec.methods.iter().map(|m| m.plugin.as_str()).collect();
        assert_eq!(plugins, ["task-arithmetic", "ties"]);
        assert_eq!(e.folder, root.path().join("sweeps").join("paper-002-cnn"));
        assert_eq!(
            e.folder_label(),
            Path::new("sweeps").join("paper-002-cnn").display().to_string()
        );
        e.set_method("ties", false);
        e.set_method("dare", true);
        assert_eq!(e.spec.methods[1].name(), "DARE", "the preset's label and parameters");
        e.grids[0].text = "10, x".into();
        assert!(!e.apply_grid_text(0));
        let why = e.check(None, &["task-arithmetic", "dare"]).unwrap_err().to_string();
        assert!(why.starts_with("steps K"), "{why}");
        e.grids[0].text = "10, 20".into();
        assert!(e.apply_grid_text(0));
        e.check(None, &["task-arithmetic", "dare"]).unwrap();
        let path = root.path().join("mine.toml");
        e.save_toml(&path).unwrap();
        let mut back = Experiments::new(root.path().join("sweeps"));
        back.load_toml(&path).unwrap();
        assert_eq!(back.spec, e.spec);
        assert_eq!(back.folder, root.path().join("sweeps").join("mine-cnn"));
        std::fs::write(&path, "arch = 3").unwrap();
        let err = back.load_toml(&path).unwrap_err().to_string();
        assert!(err.contains("mine.toml"), "{err}");
    }
}
