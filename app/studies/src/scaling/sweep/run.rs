//! Runs a sweep: fine-tunes the experts of every sweep point (one run per setting, its
//! intermediate checkpoints serving the smaller step counts), merges each task group with each
//! method, evaluates every task, and appends the rows to the results file as cells finish.
//! Everything already on disk (checkpoints, finished cells) is reused, so a killed sweep
//! resumes where it stopped.

pub use super::bench::class_balanced_subset;
use super::bench::{Backend, SweepBench};
use super::cells::{
    Cell, RunJob, collapsed_rows, diverged_file, expert_file, plan_cells, rows_from_report, runs_needed,
};
use super::spec::{EXPERT, Hyper, SweepSpec};
use super::store::{ResultsFile, Row};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::merge::{ExecOptions, Observer, Progress};
use mergescope_engine::plugin::loader::Plugin;
use mergescope_interop::request::MergeRequest;
use mergescope_lab::evaluator::Evaluator;
use mergescope_lab::run;
use rayon::prelude::*;
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// The results file's name in a sweep folder.
pub const RESULTS_FILE: &str = "results.csv";
/// The specification's copy in a sweep folder.
pub const SPEC_FILE: &str = "sweep.toml";

/// Where a sweep stands.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepProgress {
    /// What runs now.
    pub stage: String,
    /// Cells finished (reused ones included).
    pub cells_done: usize,
    /// Cells in the sweep.
    pub cells: usize,
    /// Fine-tuning steps taken so far in this session.
    pub steps_done: usize,
    /// Fine-tuning steps this session has to take in all.
    pub steps: usize,
    /// Seconds since the start.
    pub elapsed: f64,
    /// Estimated seconds left, once there is a rate to estimate from.
    pub eta: Option<f64>,
}

impl SweepProgress {
    /// Fraction of the work done, steps and cells weighted by their measured cost.
    pub fn fraction(&self) -> f64 {
        match self.eta {
            Some(left) if self.elapsed + left > 0.0 => self.elapsed / (self.elapsed + left),
            _ if self.cells > 0 => self.cells_done as f64 / self.cells as f64,
            _ => 0.0,
        }
    }
}

/// What a sweep needs.
pub struct SweepInputs<'a> {
    /// The specification.
    pub spec: &'a SweepSpec,
    /// The benchmark whose base and heads start every run: the demo benchmark with its task
    /// data, or the text benchmark.
    pub bench: SweepBench<'a>,
    /// The method plugins (every plugin named by the specification).
    pub plugins: &'a [&'a Plugin],
    /// The sweep folder (created if missing; reused if it holds the same sweep).
    pub out_dir: &'a Path,
    /// How merges and evaluations run.
    pub opts: &'a ExecOptions,
}

/// A finished sweep.
#[derive(Clone, Debug)]
pub struct SweepSummary {
    /// Every row of the results file.
    pub rows: Vec<Row>,
    /// Cells in the sweep.
    pub cells: usize,
    /// Cells found finished in the folder.
    pub reused: usize,
    /// Fine-tuning runs made in this session.
    pub runs_trained: usize,
    /// Seconds this session took.
    pub seconds: f64,
    /// The results file.
    pub results: PathBuf,
}

/// Shared state of a running sweep.
struct Tracker<'a> {
    started: Instant,
    cells: usize,
    cells_done: AtomicUsize,
    steps: AtomicUsize,
    steps_done: AtomicUsize,
    train_seconds: Mutex<f64>,
    cell_seconds: Mutex<(f64, usize)>,
    progress: &'a (dyn Fn(&SweepProgress) + Sync),
}

impl Tracker<'_> {
    fn report(&self, stage: &str) {
        let steps = self.steps.load(Ordering::Relaxed);
        let steps_done = self.steps_done.load(Ordering::Relaxed);
        let cells_done = self.cells_done.load(Ordering::Relaxed);
        let train = *self.train_seconds.lock().unwrap_or_else(|e| e.into_inner());
        let (cell_s, cell_n) = *self.cell_seconds.lock().unwrap_or_else(|e| e.into_inner());
        let per_step = (steps_done > 0).then(|| train / steps_done as f64);
        let per_cell = (cell_n > 0).then(|| cell_s / cell_n as f64);
        let left_steps = steps.saturating_sub(steps_done) as f64;
        let left_cells = self.cells.saturating_sub(cells_done) as f64;
        let eta = match (per_step, per_cell) {
            (Some(s), Some(c)) => Some(left_steps * s + left_cells * c),
            (Some(s), None) if left_cells == 0.0 => Some(left_steps * s),
            (None, Some(c)) if left_steps == 0.0 => Some(left_cells * c),
            _ => None,
        };
        (self.progress)(&SweepProgress {
            stage: stage.to_owned(),
            cells_done,
            cells: self.cells,
            steps_done,
            steps,
            elapsed: self.started.elapsed().as_secs_f64(),
            eta,
        });
    }
}

/// Runs (or resumes) the sweep; `progress` hears about every step and cell.
pub fn run_sweep(
    inputs: &SweepInputs<'_>,
    progress: &(dyn Fn(&SweepProgress) + Sync),
    cancel: &AtomicBool,
) -> Result<SweepSummary> {
    let SweepInputs {
        spec, bench, out_dir, ..
    } = *inputs;
    let pool = bench.task_names();
    check_inputs(inputs, &pool)?;
    prepare_folder(spec, bench, out_dir)?;
    let models = out_dir.join("models");

    let cells = plan_cells(spec, &pool);
    let results = out_dir.join(RESULTS_FILE);
    let (mut file, mut rows) = ResultsFile::open(&results, &rows_per_cell)?;
    let done: BTreeSet<String> = rows.iter().map(Row::cell).collect();
    let is_done = |c: &Cell| done.contains(&c.key(spec, &pool));
    let reused = cells.iter().filter(|c| is_done(c)).count();
    let needed = runs_needed(spec, &pool, cells.iter().filter(|c| !is_done(c)), &models);
    let tracker = Tracker {
        started: Instant::now(),
        cells: cells.len(),
        cells_done: AtomicUsize::new(reused),
        steps: AtomicUsize::new(needed.values().map(|j| j.snapshots.last().copied().unwrap_or(0)).sum()),
        steps_done: AtomicUsize::new(0),
        train_seconds: Mutex::new(0.0),
        cell_seconds: Mutex::new((0.0, 0)),
        progress,
    };
    tracker.report(if reused > 0 { "resuming" } else { "starting" });

    let mut run = SweepRun::new(inputs, &pool, &models, &tracker, cancel)?;
    let mut runs_trained = 0;
    for cell in cells.iter().filter(|c| !is_done(c)) {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let (trained, new_rows) = run.run_cell(cell)?;
        runs_trained += trained;
        file.append(&new_rows)?;
        rows.extend(new_rows);
        tracker.cells_done.fetch_add(1, Ordering::Relaxed);
        tracker.report("cell finished");
    }
    tracker.report("done");
    Ok(SweepSummary {
        rows,
        cells: cells.len(),
        reused,
        runs_trained,
        seconds: tracker.started.elapsed().as_secs_f64(),
        results,
    })
}

/// Rows a finished cell has in the results file: one for an expert, one per group task for a
/// merge (a cell with fewer rows was cut off and is run again).
pub(super) fn rows_per_cell(r: &Row) -> Option<usize> {
    if r.method == EXPERT {
        Some(1)
    } else {
        Some(r.group_tasks.split('+').count())
    }
}

/// Checks the specification against the benchmark and the plugins, as [`run_sweep`] does first
/// (before the folder is touched): a front end calls it to name the specification's file in
/// the error.
pub fn check_sweep(inputs: &SweepInputs<'_>) -> Result<()> {
    check_inputs(inputs, &inputs.bench.task_names())
}

/// Checks the specification against the benchmark (of `pool`'s tasks) and plugins.
fn check_inputs(inputs: &SweepInputs<'_>, pool: &[String]) -> Result<()> {
    let SweepInputs {
        spec, bench, plugins, ..
    } = *inputs;
    let ids: Vec<&str> = plugins.iter().map(|p| p.id()).collect();
    spec.validate(pool.len(), &ids)?;
    bench.check(spec)
}

/// One cell of a sweep run on its own, as a Slurm array task runs it.
#[derive(Clone, Debug)]
pub struct CellRun {
    /// The cell's key in the results file.
    pub key: String,
    /// The cell's rows.
    pub rows: Vec<Row>,
    /// Fine-tuning runs this cell made (0 when another cell had made them).
    pub runs_trained: usize,
}

/// The keys of the sweep's cells in run order (the order of the results file), after checking
/// the inputs and preparing `out_dir` as [`run_sweep`] does (the specification is written there,
/// the base and heads linked), for an executor that runs the cells elsewhere.
pub fn prepare_cells(inputs: &SweepInputs<'_>) -> Result<Vec<String>> {
    let pool = inputs.bench.task_names();
    check_inputs(inputs, &pool)?;
    prepare_folder(inputs.spec, inputs.bench, inputs.out_dir)?;
    Ok(plan_cells(inputs.spec, &pool)
        .iter()
        .map(|c| c.key(inputs.spec, &pool))
        .collect())
}

/// Runs cell `index` of the sweep alone (through the same code as [`run_sweep`]) and returns
/// its rows without touching the results file; the folder must have been prepared by
/// [`prepare_cells`]. Several cells may run at once on one shared folder: each fine-tuning run
/// is made under a file lock by the first cell that needs it, and each cell merges into its
/// own file. `expected_key` (the key the cell had when the grid was submitted) guards against
/// a specification changed in between.
pub fn run_one_cell(
    inputs: &SweepInputs<'_>,
    index: usize,
    expected_key: &str,
    progress: &(dyn Fn(&SweepProgress) + Sync),
    cancel: &AtomicBool,
) -> Result<CellRun> {
    let SweepInputs {
        spec, bench, out_dir, ..
    } = *inputs;
    let pool = bench.task_names();
    check_inputs(inputs, &pool)?;
    check_folder(spec, out_dir)?;
    let cells = plan_cells(spec, &pool);
    let cell = cells.get(index).ok_or_else(|| {
        EngineError::Param(format!(
            "cell {index} is out of range: the sweep in '{}' has {} cells; submit the grid again",
            out_dir.display(),
            cells.len()
        ))
    })?;
    let key = cell.key(spec, &pool);
    if key != expected_key {
        return Err(EngineError::Param(format!(
            "cell {index} of the sweep in '{}' is now '{key}', not '{expected_key}' as submitted: the specification changed; submit the grid again",
            out_dir.display()
        )));
    }
    let models = out_dir.join("models");
    let tracker = Tracker {
        started: Instant::now(),
        cells: 1,
        cells_done: AtomicUsize::new(0),
        steps: AtomicUsize::new(0),
        steps_done: AtomicUsize::new(0),
        train_seconds: Mutex::new(0.0),
        cell_seconds: Mutex::new((0.0, 0)),
        progress,
    };
    let mut run = SweepRun::new(inputs, &pool, &models, &tracker, cancel)?;
    run.shared = true;
    run.merge_file = out_dir.join("merges").join(format!("cell-{index}.safetensors"));
    let (runs_trained, rows) = run.run_cell(cell)?;
    Ok(CellRun {
        key,
        rows,
        runs_trained,
    })
}

/// What the cells of a running sweep share.
struct SweepRun<'a, 'i> {
    inputs: &'a SweepInputs<'i>,
    pool: &'a [String],
    models: &'a Path,
    /// The benchmark loaded on the sweep's device.
    backend: Box<dyn Backend + 'i>,
    /// Test evaluators by the pool indices of their tasks (their data is read once).
    evaluators: HashMap<Vec<usize>, Box<dyn Evaluator>>,
    tracker: &'a Tracker<'a>,
    cancel: &'a AtomicBool,
    /// Other processes may run cells of the same folder: fine-tuning runs are made under locks.
    shared: bool,
    /// Where merges are written (and deleted once evaluated).
    merge_file: PathBuf,
}

impl<'a, 'i> SweepRun<'a, 'i> {
    fn new(
        inputs: &'a SweepInputs<'i>,
        pool: &'a [String],
        models: &'a Path,
        tracker: &'a Tracker<'a>,
        cancel: &'a AtomicBool,
    ) -> Result<Self> {
        Ok(SweepRun {
            inputs,
            pool,
            models,
            backend: inputs.bench.load(inputs.spec, &inputs.opts.device)?,
            evaluators: HashMap::new(),
            tracker,
            cancel,
            shared: false,
            merge_file: inputs.out_dir.join("merges").join("current.safetensors"),
        })
    }

    /// The one door every executor runs a cell through: makes the fine-tuning runs the cell
    /// still needs (as the checkpoints on disk say; under a lock per run when the folder is
    /// shared), then evaluates the cell. Returns the runs made and the cell's rows.
    fn run_cell(&mut self, cell: &Cell) -> Result<(usize, Vec<Row>)> {
        let SweepInputs { spec, .. } = *self.inputs;
        let locks = if self.shared { self.lock_runs(cell)? } else { Vec::new() };
        let jobs: Vec<(usize, RunJob)> = runs_needed(spec, self.pool, std::iter::once(cell), self.models)
            .into_iter()
            .map(|((_, t), j)| (t, j))
            .collect();
        let trained = self.train(cell.hyper(), &jobs)?;
        drop(locks);
        let t0 = Instant::now();
        let rows = self.cell_rows(cell, t0)?;
        let mut c = self.tracker.cell_seconds.lock().unwrap_or_else(|e| e.into_inner());
        c.0 += t0.elapsed().as_secs_f64();
        c.1 += 1;
        Ok((trained, rows))
    }

    /// Locks (blocking, in one global order, so cells never deadlock) the fine-tuning runs of
    /// `cell`'s tasks: a second cell needing a run waits for the first to make it, then finds
    /// its checkpoints on disk.
    fn lock_runs(&self, cell: &Cell) -> Result<Vec<std::fs::File>> {
        let dir = self.models.join("locks");
        std::fs::create_dir_all(&dir).map_err(|e| EngineError::io("cannot create", &dir, e))?;
        let mut names: Vec<String> = cell
            .task_names(self.pool)
            .iter()
            .map(|t| format!("{}.{t}.lock", cell.hyper().run_id()))
            .collect();
        names.sort();
        names
            .iter()
            .map(|n| {
                let path = dir.join(n);
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(|e| EngineError::io("cannot open the lock file", &path, e))?;
                f.lock().map_err(|e| {
                    EngineError::io(
                        "cannot lock (the sweep folder must be on a file system with locks, e.g. NFSv4 or Lustre)",
                        &path,
                        e,
                    )
                })?;
                Ok(f)
            })
            .collect()
    }

    /// Fine-tunes the runs `jobs` of `hyper` (one per task, in parallel); returns how many.
    fn train(&self, hyper: &Hyper, jobs: &[(usize, RunJob)]) -> Result<usize> {
        if jobs.is_empty() {
            return Ok(0);
        }
        let t0 = Instant::now();
        let stage = format!("fine-tuning {} ({})", hyper.run_id(), jobs.len());
        self.tracker.report(&stage);
        let backend = &*self.backend;
        jobs.par_iter()
            .map(|(t, job)| {
                train_expert(
                    backend,
                    *t,
                    &self.pool[*t],
                    job,
                    self.models,
                    &|| {
                        self.tracker.steps_done.fetch_add(1, Ordering::Relaxed);
                        self.tracker.report(&stage);
                    },
                    self.cancel,
                )
            })
            .collect::<Result<Vec<()>>>()?;
        *self.tracker.train_seconds.lock().unwrap_or_else(|e| e.into_inner()) += t0.elapsed().as_secs_f64();
        Ok(jobs.len())
    }

    /// The rows of `cell`, whose experts are trained: NaN rows when one of them collapsed,
    /// else the expert's (or the group's merge's) evaluation on each task.
    fn cell_rows(&mut self, cell: &Cell, t0: Instant) -> Result<Vec<Row>> {
        let spec = self.inputs.spec;
        let cancel = self.cancel;
        let template = cell.template(spec, self.pool);
        if cell.collapsed(self.models, self.pool) {
            return Ok(collapsed_rows(&template, &cell.task_names(self.pool)));
        }
        let report = match cell {
            Cell::Expert { hyper, task } => {
                let name = &self.pool[*task];
                self.tracker
                    .report(&format!("evaluating the {name} expert of {}", hyper.run_id()));
                let path = self.models.join(expert_file(hyper, name, hyper.steps));
                self.evaluator(cell.tasks())?.evaluate_file(&path, cancel)?
            }
            Cell::Merge {
                hyper, group, method, ..
            } => {
                let out = self.merge_group(hyper, *group, cell, *method)?;
                let report = self.evaluator(cell.tasks())?.evaluate_file(&out, cancel)?;
                for p in [out.clone(), out.with_extension("trajectory.safetensors")] {
                    let _ = std::fs::remove_file(p);
                }
                report
            }
        };
        Ok(rows_from_report(&template, &report, t0.elapsed().as_secs_f64()))
    }

    /// Merges the experts of `cell`'s group at `hyper` with method `method` of the
    /// specification; returns the merged file.
    fn merge_group(&self, hyper: &Hyper, group: usize, cell: &Cell, method: usize) -> Result<PathBuf> {
        let SweepInputs {
            spec,
            bench,
            plugins,
            opts,
            ..
        } = *self.inputs;
        let m = &spec.methods[method];
        let stage = format!(
            "{} on group {group} of N={} at {}",
            m.name(),
            hyper.tasks,
            hyper.run_id()
        );
        self.tracker.report(&stage);
        let plugin = plugins.iter().find(|p| p.id() == m.plugin).ok_or_else(|| {
            EngineError::Param(format!(
                "method plugin '{}' is not installed; install it or remove the method from the sweep",
                m.plugin
            ))
        })?;
        let names = cell.task_names(self.pool);
        let experts: Vec<PathBuf> = names
            .iter()
            .map(|n| self.models.join(expert_file(hyper, n, hyper.steps)))
            .collect();
        let out = self.merge_file.clone();
        let req = MergeRequest::new(experts, out.clone())
            .with_base(Some(bench.base_path()))
            .with_params(m.params_for(names.len()))
            .with_seed(spec.seed)
            .overwriting(true);
        let on_progress = |p: &Progress| {
            if p.total > 0 {
                self.tracker.report(&format!("{stage}: {}", p.tensor));
            }
        };
        let observer = Observer {
            progress: &on_progress,
            log: Observer::silent().log,
        };
        let failed = |e: EngineError| match e {
            EngineError::Cancelled => EngineError::Cancelled,
            e => EngineError::Invalid(format!(
                "{} on tasks {} at {} (K={}): {e}",
                m.name(),
                names.join("+"),
                hyper.run_id(),
                hyper.steps
            )),
        };
        // Only a model-level method learns on the group's tasks.
        let source = if plugin.is_model_level() {
            Some(self.backend.source(&names, hyper, self.models).map_err(failed)?)
        } else {
            None
        };
        run::merge(
            plugin,
            &req,
            source.as_ref().map(|s| s.get()),
            opts,
            observer,
            self.cancel,
        )
        .map_err(failed)?;
        Ok(out)
    }

    /// The (cached) test evaluator of the tasks `members` of the pool.
    fn evaluator(&mut self, members: &[usize]) -> Result<&dyn Evaluator> {
        match self.evaluators.entry(members.to_vec()) {
            Entry::Occupied(e) => Ok(&**e.into_mut()),
            Entry::Vacant(v) => {
                let names: Vec<String> = members.iter().map(|&t| self.pool[t].clone()).collect();
                Ok(&**v.insert(self.backend.evaluator(&names)?))
            }
        }
    }
}

/// Checks that `out_dir` is empty or holds the same sweep (same benchmark, seed, evaluation and
/// methods: a grid may grow), writes the specification there, and links the base and heads.
fn prepare_folder(spec: &SweepSpec, bench: SweepBench<'_>, out_dir: &Path) -> Result<()> {
    let models = out_dir.join("models");
    std::fs::create_dir_all(models.join("experts")).map_err(|e| EngineError::io("cannot create", &models, e))?;
    std::fs::create_dir_all(out_dir.join("merges")).map_err(|e| EngineError::io("cannot create", out_dir, e))?;
    let spec_path = out_dir.join(SPEC_FILE);
    if spec_path.exists() {
        check_folder(spec, out_dir)?;
    } else if std::fs::read_dir(out_dir)
        .map(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name() != "models" && e.file_name() != "merges")))
        .unwrap_or(false)
    {
        return Err(EngineError::Param(format!(
            "'{}' is not empty and holds no sweep; choose an empty or new --out folder",
            out_dir.display()
        )));
    }
    mergescope_engine::writer::write_atomic(&spec_path, spec.to_toml()?.as_bytes())?;
    for (from, name) in bench.links() {
        let to = models.join(name);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
        }
        if !to.exists() && std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(|e| EngineError::io("cannot copy", &from, e))?;
        }
    }
    Ok(())
}

/// Checks that the sweep in `out_dir` is `spec`'s (same benchmark, seed, evaluation and methods:
/// a grid may grow), so its results can be reused.
fn check_folder(spec: &SweepSpec, out_dir: &Path) -> Result<()> {
    let spec_path = out_dir.join(SPEC_FILE);
    let text = std::fs::read_to_string(&spec_path).map_err(|e| EngineError::io("cannot read", &spec_path, e))?;
    let old = SweepSpec::from_toml(&text)?;
    let differs = [
        ("arch", old.arch != spec.arch),
        ("benchmark", old.benchmark != spec.benchmark),
        ("seed", old.seed != spec.seed),
        ("eval_examples", old.eval_examples != spec.eval_examples),
        ("methods", old.methods != spec.methods),
    ];
    if let Some((what, _)) = differs.iter().find(|(_, d)| *d) {
        return Err(EngineError::Param(format!(
            "'{}' holds a sweep with a different {what}; its results cannot be reused: choose another --out folder",
            out_dir.display()
        )));
    }
    Ok(())
}

/// Makes the fine-tuning run `job` of pool task `task` (`name`) through `backend`. A run that
/// diverges is a result, not a failure: its marker (the step, then the error) lands beside its
/// snapshots, and the sweep records its experts from that step on as collapsed.
fn train_expert(
    backend: &dyn Backend,
    task: usize,
    name: &str,
    job: &RunJob,
    models: &Path,
    on_step: &(dyn Fn() + Sync),
    cancel: &AtomicBool,
) -> Result<()> {
    let h = &job.hyper;
    match backend.train(job, task, models, on_step, cancel) {
        Ok(()) => Ok(()),
        Err(EngineError::Cancelled) => Err(EngineError::Cancelled),
        Err(e @ EngineError::Diverged { step, .. }) => {
            let marker = models.join(diverged_file(h, name));
            if let Some(dir) = marker.parent() {
                std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
            }
            mergescope_engine::writer::write_atomic(&marker, format!("{step}\n{e}\n").as_bytes())
        }
        Err(e) => Err(EngineError::Invalid(format!(
            "fine-tuning '{name}' at {}: {e}",
            h.run_id()
        ))),
    }
}
