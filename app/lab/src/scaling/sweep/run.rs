//! Runs a sweep: fine-tunes the experts of every sweep point (one run per setting, its
//! intermediate checkpoints serving the smaller step counts), merges each task group with each
//! method, evaluates every task, and appends the rows to the results file as cells finish.
//! Everything already on disk (checkpoints, finished cells) is reused, so a killed sweep
//! resumes where it stopped.

use super::spec::{EXPERT, Hyper, SweepSpec, task_groups};
use super::store::{ResultsFile, Row, cell_key, expert_cell_key};
use crate::data::{SplitKind, TaskData};
use crate::demo::{Benchmark, load_params, save_params};
use crate::evaluator::{BackboneEvaluator, Evaluator};
use crate::nn::Params;
use crate::run::{self, TaskSource};
use crate::train::{BatchSize, Budget, Examples, TrainConfig, TrainTask, fine_tune_with_snapshots, train_metadata};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::merge::{ExecOptions, MergeRequest, Observer, Progress};
use mergescope_engine::plugin::loader::Plugin;
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// The benchmark whose base and heads start every run.
    pub bench: &'a Benchmark,
    /// Task data of the benchmark's tasks.
    pub tasks: &'a [TaskData],
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

/// One (run, task) fine-tuning job: its folder, the steps it checkpoints.
struct RunJob {
    hyper: Hyper,
    snapshots: Vec<usize>,
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

/// The checkpoint of task `task` after `steps` steps of the run of `hyper`, relative to the
/// sweep's models folder.
pub fn expert_file(hyper: &Hyper, task: &str, steps: usize) -> String {
    format!("experts/{}/{task}.k{steps}.safetensors", hyper.run_id())
}

/// The marker a diverged run leaves beside its snapshots: the step whose loss was not
/// finite, then the error. The snapshots from that step on do not exist: those experts, and
/// every merge that needs one, are recorded as collapsed (accuracy and loss NaN).
pub fn diverged_file(hyper: &Hyper, task: &str) -> String {
    format!("experts/{}/{task}.diverged", hyper.run_id())
}

/// The step at which the run of `hyper` on `task` diverged, if it did.
fn diverged_at(models: &Path, hyper: &Hyper, task: &str) -> Option<usize> {
    std::fs::read_to_string(models.join(diverged_file(hyper, task)))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether the expert of `task` at `hyper` (its `steps`) collapsed: its run diverged first.
fn collapsed(models: &Path, hyper: &Hyper, task: &str) -> bool {
    diverged_at(models, hyper, task).is_some_and(|step| step <= hyper.steps)
}

/// The rows of a collapsed cell: one per task, accuracy and loss NaN.
fn collapsed_rows(template: &Row, tasks: &[String]) -> Vec<Row> {
    tasks
        .iter()
        .map(|t| Row {
            task: t.clone(),
            ..template.clone()
        })
        .collect()
}

/// The first `ratio` of each class's training examples, in their order (a deterministic
/// class-balanced subset; at least one example of each class present).
pub fn class_balanced_subset(data: &TaskData, ratio: f64) -> (Vec<u8>, Vec<u8>) {
    let side = data.image_size.0 * data.image_size.1;
    let labels = &data.train.labels;
    let mut per_class: BTreeMap<u8, usize> = BTreeMap::new();
    for &l in labels {
        *per_class.entry(l).or_default() += 1;
    }
    let keep: BTreeMap<u8, usize> = per_class
        .iter()
        .map(|(&c, &n)| (c, ((n as f64 * ratio).round() as usize).clamp(1, n)))
        .collect();
    let mut taken: BTreeMap<u8, usize> = BTreeMap::new();
    let (mut images, mut out_labels) = (Vec::new(), Vec::new());
    for (i, &l) in labels.iter().enumerate() {
        let t = taken.entry(l).or_default();
        if *t < keep[&l] {
            *t += 1;
            images.extend_from_slice(&data.train.images[i * side..(i + 1) * side]);
            out_labels.push(l);
        }
    }
    (images, out_labels)
}

/// Runs (or resumes) the sweep; `progress` hears about every step and cell.
pub fn run_sweep(
    inputs: &SweepInputs<'_>,
    progress: &(dyn Fn(&SweepProgress) + Sync),
    cancel: &AtomicBool,
) -> Result<SweepSummary> {
    let SweepInputs {
        spec,
        bench,
        tasks,
        plugins,
        out_dir,
        opts,
    } = *inputs;
    let pool: Vec<String> = bench.task_names().iter().map(|s| (*s).to_owned()).collect();
    let ids: Vec<&str> = plugins.iter().map(|p| p.id()).collect();
    spec.validate(pool.len(), &ids)?;
    if spec.arch()? != bench.manifest.arch {
        return Err(EngineError::Param(format!(
            "the sweep is for {} but the benchmark '{}' is {}",
            spec.arch,
            bench.dir.display(),
            bench.manifest.arch.name()
        )));
    }
    let data: Vec<&TaskData> = pool
        .iter()
        .map(|name| {
            tasks
                .iter()
                .find(|t| &t.name == name)
                .ok_or_else(|| EngineError::Invalid(format!("no task data for the benchmark's task '{name}'")))
        })
        .collect::<Result<_>>()?;
    prepare_folder(spec, bench, out_dir)?;
    let models = out_dir.join("models");

    let cells = plan_cells(spec, &pool);
    let expected = |r: &Row| -> Option<usize> {
        if r.method == EXPERT {
            Some(1)
        } else {
            Some(r.group_tasks.split('+').count())
        }
    };
    let results = out_dir.join(RESULTS_FILE);
    let (mut file, mut rows) = ResultsFile::open(&results, &expected)?;
    let done: BTreeSet<String> = rows.iter().map(Row::cell).collect();
    let is_done = |c: &Cell| match c {
        Cell::Expert { hyper, task } => done.contains(&expert_cell_key(hyper, &pool[*task])),
        Cell::Merge {
            hyper, group, method, ..
        } => done.contains(&cell_key(hyper, Some(*group), spec.methods[*method].name())),
    };
    let reused = cells.iter().filter(|c| is_done(c)).count();

    let mut needed = runs_needed(spec, &pool, cells.iter().filter(|c| !is_done(c)), &models);
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

    let device = &opts.device;
    let base = load_params(&bench.base_path(), device)?;
    let heads = bench.heads(device)?;
    let mut evaluators: HashMap<Vec<usize>, BackboneEvaluator> = HashMap::new();
    let mut runs_trained = 0;
    for cell in &cells {
        if is_done(cell) {
            continue;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let (hyper, ts) = match cell {
            Cell::Expert { hyper, task } => (hyper, vec![*task]),
            Cell::Merge { hyper, tasks, .. } => (hyper, tasks.clone()),
        };
        // Train what this cell needs, the group's tasks in parallel.
        let jobs: Vec<(usize, RunJob)> = ts
            .iter()
            .filter_map(|&t| needed.remove(&(hyper.run_id(), t)).map(|j| (t, j)))
            .collect();
        if !jobs.is_empty() {
            let t0 = Instant::now();
            let stage = format!("fine-tuning {} ({})", hyper.run_id(), jobs.len());
            tracker.report(&stage);
            jobs.par_iter()
                .map(|(t, job)| {
                    train_expert(
                        spec,
                        bench,
                        data[*t],
                        &base,
                        &heads,
                        job,
                        &models,
                        device,
                        &|| {
                            tracker.steps_done.fetch_add(1, Ordering::Relaxed);
                            tracker.report(&stage);
                        },
                        cancel,
                    )
                })
                .collect::<Result<Vec<()>>>()?;
            *tracker.train_seconds.lock().unwrap_or_else(|e| e.into_inner()) += t0.elapsed().as_secs_f64();
            runs_trained += jobs.len();
        }
        let t0 = Instant::now();
        let new_rows = match cell {
            Cell::Expert { hyper, task } if collapsed(&models, hyper, &pool[*task]) => collapsed_rows(
                &Row {
                    hyper: Hyper {
                        tasks: 0,
                        ..hyper.clone()
                    },
                    group: None,
                    group_tasks: String::new(),
                    method: EXPERT.to_owned(),
                    task: String::new(),
                    accuracy: f64::NAN,
                    loss: f64::NAN,
                    examples: 0,
                    seconds: 0.0,
                },
                &[pool[*task].clone()],
            ),
            Cell::Merge {
                hyper,
                group,
                tasks: members,
                method,
            } if members.iter().any(|&t| collapsed(&models, hyper, &pool[t])) => {
                let names: Vec<String> = members.iter().map(|&t| pool[t].clone()).collect();
                collapsed_rows(
                    &Row {
                        hyper: hyper.clone(),
                        group: Some(*group),
                        group_tasks: names.join("+"),
                        method: spec.methods[*method].name().to_owned(),
                        task: String::new(),
                        accuracy: f64::NAN,
                        loss: f64::NAN,
                        examples: 0,
                        seconds: 0.0,
                    },
                    &names,
                )
            }
            Cell::Expert { hyper, task } => {
                tracker.report(&format!("evaluating the {} expert of {}", pool[*task], hyper.run_id()));
                let ev = evaluator(&mut evaluators, spec, bench, tasks, &pool, &[*task], device)?;
                let report = ev.evaluate_file(&models.join(expert_file(hyper, &pool[*task], hyper.steps)), cancel)?;
                let expert_hyper = Hyper {
                    tasks: 0,
                    ..hyper.clone()
                };
                report
                    .tasks
                    .iter()
                    .map(|s| Row {
                        hyper: expert_hyper.clone(),
                        group: None,
                        group_tasks: String::new(),
                        method: EXPERT.to_owned(),
                        task: s.task.clone(),
                        accuracy: s.accuracy,
                        loss: s.loss.unwrap_or(f64::NAN),
                        examples: s.examples,
                        seconds: t0.elapsed().as_secs_f64(),
                    })
                    .collect::<Vec<_>>()
            }
            Cell::Merge {
                hyper,
                group,
                tasks: members,
                method,
            } => {
                let m = &spec.methods[*method];
                let stage = format!(
                    "{} on group {} of N={} at {}",
                    m.name(),
                    group,
                    hyper.tasks,
                    hyper.run_id()
                );
                tracker.report(&stage);
                let plugin = plugins.iter().find(|p| p.id() == m.plugin).ok_or_else(|| {
                    EngineError::Invalid(format!("method plugin '{}' was not handed to the sweep", m.plugin))
                })?;
                let names: Vec<String> = members.iter().map(|&t| pool[t].clone()).collect();
                let group_bench = group_benchmark(bench, &models, hyper, &names);
                let out = out_dir.join("merges").join("current.safetensors");
                let req = MergeRequest::new(group_bench.expert_paths(), out.clone())
                    .with_base(Some(bench.base_path()))
                    .with_params(m.params_for(members.len()))
                    .with_seed(spec.seed)
                    .overwriting(true);
                let on_progress = |p: &Progress| {
                    if p.total > 0 {
                        tracker.report(&format!("{stage}: {}", p.tensor));
                    }
                };
                let observer = Observer {
                    progress: &on_progress,
                    log: Observer::silent().log,
                };
                let source = TaskSource {
                    bench: &group_bench,
                    tasks,
                };
                let merged = run::merge(plugin, &req, Some(source), opts, observer, cancel).map(|_| ());
                merged.map_err(|e| match e {
                    EngineError::Cancelled => EngineError::Cancelled,
                    e => EngineError::Invalid(format!(
                        "{} on tasks {} at {} (K={}): {e}",
                        m.name(),
                        names.join("+"),
                        hyper.run_id(),
                        hyper.steps
                    )),
                })?;
                let ev = evaluator(&mut evaluators, spec, bench, tasks, &pool, members, device)?;
                let report = ev.evaluate_file(&out, cancel)?;
                for p in [out.clone(), out.with_extension("trajectory.safetensors")] {
                    let _ = std::fs::remove_file(p);
                }
                let seconds = t0.elapsed().as_secs_f64();
                report
                    .tasks
                    .iter()
                    .map(|s| Row {
                        hyper: hyper.clone(),
                        group: Some(*group),
                        group_tasks: names.join("+"),
                        method: m.name().to_owned(),
                        task: s.task.clone(),
                        accuracy: s.accuracy,
                        loss: s.loss.unwrap_or(f64::NAN),
                        examples: s.examples,
                        seconds,
                    })
                    .collect()
            }
        };
        file.append(&new_rows)?;
        rows.extend(new_rows);
        {
            let mut c = tracker.cell_seconds.lock().unwrap_or_else(|e| e.into_inner());
            c.0 += t0.elapsed().as_secs_f64();
            c.1 += 1;
        }
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

/// A unit of work with its own rows.
enum Cell {
    /// An expert on its own task.
    Expert { hyper: Hyper, task: usize },
    /// A merge of a task group with a method, on each of the group's tasks.
    Merge {
        hyper: Hyper,
        group: usize,
        tasks: Vec<usize>,
        method: usize,
    },
}

/// Every cell of the sweep, in order: each point's task groups, the experts of a group (each
/// (point, task) once, whatever groups it is in) before the group's merges, one per method.
fn plan_cells(spec: &SweepSpec, pool: &[String]) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Vec::new();
    let mut seen = BTreeSet::new();
    for h in &spec.points() {
        for (g, group) in task_groups(pool.len(), h.tasks, spec.groups, spec.seed)
            .into_iter()
            .enumerate()
        {
            for &t in &group {
                if seen.insert(expert_cell_key(h, &pool[t])) {
                    cells.push(Cell::Expert {
                        hyper: h.clone(),
                        task: t,
                    });
                }
            }
            for m in 0..spec.methods.len() {
                cells.push(Cell::Merge {
                    hyper: h.clone(),
                    group: g,
                    tasks: group.clone(),
                    method: m,
                });
            }
        }
    }
    cells
}

/// The fine-tuning runs that `cells` still need: one per (run, task) whose snapshots are not
/// all in `models` (a diverged run is not asked for the snapshots from its divergence on).
fn runs_needed<'c>(
    spec: &SweepSpec,
    pool: &[String],
    cells: impl Iterator<Item = &'c Cell>,
    models: &Path,
) -> BTreeMap<(String, usize), RunJob> {
    let snapshots = spec.snapshots();
    let mut needed: BTreeMap<(String, usize), RunJob> = BTreeMap::new();
    for c in cells {
        let (hyper, ts) = match c {
            Cell::Expert { hyper, task } => (hyper, vec![*task]),
            Cell::Merge { hyper, tasks, .. } => (hyper, tasks.clone()),
        };
        for t in ts {
            let snaps = snapshots.get(&hyper.run_id()).cloned().unwrap_or_default();
            let stop = diverged_at(models, hyper, &pool[t]).unwrap_or(usize::MAX);
            if snaps
                .iter()
                .any(|&k| k < stop && !models.join(expert_file(hyper, &pool[t], k)).is_file())
            {
                needed.entry((hyper.run_id(), t)).or_insert(RunJob {
                    hyper: hyper.clone(),
                    snapshots: snaps,
                });
            }
        }
    }
    needed
}

/// Checks that `out_dir` is empty or holds the same sweep (same benchmark, seed, evaluation and
/// methods: a grid may grow), writes the specification there, and links the base and heads.
fn prepare_folder(spec: &SweepSpec, bench: &Benchmark, out_dir: &Path) -> Result<()> {
    let models = out_dir.join("models");
    std::fs::create_dir_all(models.join("experts")).map_err(|e| EngineError::io("cannot create", &models, e))?;
    std::fs::create_dir_all(out_dir.join("merges")).map_err(|e| EngineError::io("cannot create", out_dir, e))?;
    let spec_path = out_dir.join(SPEC_FILE);
    if spec_path.exists() {
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
    for (from, name) in [
        (bench.base_path(), "base.safetensors"),
        (bench.heads_path(), "heads.safetensors"),
    ] {
        let to = models.join(name);
        if !to.exists() && std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(|e| EngineError::io("cannot copy", &from, e))?;
        }
    }
    Ok(())
}

/// The benchmark `bench` restricted to `names`, with the experts of `hyper` from the sweep's
/// models folder.
fn group_benchmark(bench: &Benchmark, models: &Path, hyper: &Hyper, names: &[String]) -> Benchmark {
    let mut manifest = bench.manifest.clone();
    manifest.tasks.retain(|t| names.contains(&t.name));
    for t in &mut manifest.tasks {
        t.expert = expert_file(hyper, &t.name, hyper.steps);
    }
    Benchmark {
        dir: models.to_path_buf(),
        manifest,
    }
}

/// The (cached) test evaluator of the tasks `members` of the pool.
fn evaluator<'e>(
    cache: &'e mut HashMap<Vec<usize>, BackboneEvaluator>,
    spec: &SweepSpec,
    bench: &Benchmark,
    tasks: &[TaskData],
    pool: &[String],
    members: &[usize],
    device: &candle_core::Device,
) -> Result<&'e BackboneEvaluator> {
    if !cache.contains_key(members) {
        let names: Vec<String> = members.iter().map(|&t| pool[t].clone()).collect();
        let mut ev = bench.evaluator(tasks, Some(&names), SplitKind::Test, device)?;
        if let Some(n) = spec.eval_examples {
            ev = ev.subsample(n)?;
        }
        cache.insert(members.to_vec(), ev);
    }
    cache
        .get(members)
        .ok_or_else(|| EngineError::Invalid("evaluator cache lost an entry".into()))
}

/// Fine-tunes the expert of `data` for `job`, writing each of its snapshots atomically.
#[allow(clippy::too_many_arguments)]
fn train_expert(
    spec: &SweepSpec,
    bench: &Benchmark,
    data: &TaskData,
    base: &Params,
    heads: &BTreeMap<String, crate::nn::Head>,
    job: &RunJob,
    models: &Path,
    device: &candle_core::Device,
    on_step: &(dyn Fn() + Sync),
    cancel: &AtomicBool,
) -> Result<()> {
    let h = &job.hyper;
    let steps = job.snapshots.last().copied().unwrap_or(h.steps);
    let index = bench.task_names().iter().position(|n| *n == data.name).unwrap_or(0) as u64;
    let cfg = TrainConfig {
        optim: h.optim()?,
        batch: BatchSize::Size(h.batch),
        budget: Budget::Steps(steps),
        seed: spec.seed.wrapping_add(index),
        augment_shift: bench.manifest.recipe.expert.augment_shift,
    };
    let head = heads
        .get(&data.name)
        .ok_or_else(|| EngineError::Invalid(format!("the benchmark has no head for task '{}'", data.name)))?;
    let (images, labels) = class_balanced_subset(data, h.data_ratio);
    let task = TrainTask {
        data: Examples {
            images: &images,
            labels: &labels,
        },
        head,
    };
    let arch = bench.manifest.arch;
    let mut save = |k: usize, params: Params| -> Result<()> {
        let path = models.join(expert_file(h, &data.name, k));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
        }
        let mut meta = crate::demo::checkpoint_metadata(arch, spec.seed, "expert");
        meta.insert("mergescope.demo.task".to_owned(), data.name.clone());
        meta.insert("mergescope.train.data_ratio".to_owned(), h.data_ratio.to_string());
        meta.extend(train_metadata(&cfg, k, labels.len()));
        save_params(&path, &params, &meta)
    };
    match fine_tune_with_snapshots(
        arch,
        base,
        &[task],
        &cfg,
        device,
        &job.snapshots,
        &mut save,
        &mut |_| on_step(),
        cancel,
    ) {
        Ok(_) => Ok(()),
        Err(EngineError::Cancelled) => Err(EngineError::Cancelled),
        // A diverged run is a result, not a failure: the sweep records its experts from the
        // divergence on as collapsed.
        Err(e @ EngineError::Diverged { step, .. }) => {
            let marker = models.join(diverged_file(h, &data.name));
            if let Some(dir) = marker.parent() {
                std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
            }
            mergescope_engine::writer::write_atomic(&marker, format!("{step}\n{e}\n").as_bytes())
        }
        Err(e) => Err(EngineError::Invalid(format!(
            "fine-tuning '{}' at {}: {e}",
            data.name,
            h.run_id()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Arch;

    /// The Experiments window test's tiny sweep: K ∈ {2, 4} around 6, N ∈ {2, 3} around 2,
    /// two groups, task arithmetic and TIES, on three tasks.
    fn tiny_spec() -> (SweepSpec, Vec<String>) {
        let mut spec = SweepSpec::paper_002(Arch::Mlp);
        spec.methods.truncate(2);
        spec.grid.steps = vec![2, 4];
        spec.grid.lr.clear();
        spec.grid.batch.clear();
        spec.grid.data_ratio.clear();
        spec.grid.optimizer.clear();
        spec.grid.tasks = vec![2, 3];
        spec.defaults.steps = 6;
        spec.defaults.batch = 16;
        spec.defaults.tasks = 2;
        spec.groups = 2;
        let pool = ["fashion_mnist", "letters", "mnist"].map(str::to_owned).to_vec();
        (spec, pool)
    }

    fn expert_tasks(cells: &[Cell], steps: usize) -> BTreeSet<usize> {
        cells
            .iter()
            .filter_map(|c| match c {
                Cell::Expert { hyper, task } if hyper.steps == steps => Some(*task),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn cells_are_each_expert_once_then_the_merges_that_need_them() {
        let (spec, pool) = tiny_spec();
        let cells = plan_cells(&spec, &pool);
        // By hand: K = 6, 2, 4 with N = 2 each give two 2-subsets of 3 tasks, which cover all 3
        // (3 experts + 2 groups × 2 methods = 7 cells each); N = 3 at K = 6 has one group and
        // reuses K = 6's experts (2 merges): 7 + 7 + 7 + 2 = 23.
        assert_eq!(cells.len(), 23);
        for k in [2, 4, 6] {
            assert_eq!(expert_tasks(&cells, k), BTreeSet::from([0, 1, 2]), "K = {k}");
        }
        let experts = cells.iter().filter(|c| matches!(c, Cell::Expert { .. })).count();
        assert_eq!(experts, 9);
        // Every merge comes after the expert cells of its group's tasks at its step count.
        for (i, c) in cells.iter().enumerate() {
            if let Cell::Merge {
                hyper, tasks, method, ..
            } = c
            {
                assert!(*method < 2);
                for t in tasks {
                    let before = cells[..i]
                        .iter()
                        .any(|e| matches!(e, Cell::Expert { hyper: h, task } if task == t && h.steps == hyper.steps));
                    assert!(before, "merge {i} ({:?}) before its expert of task {t}", hyper.run_id());
                }
            }
        }
    }

    #[test]
    fn runs_needed_are_the_runs_with_a_missing_snapshot_before_any_divergence() {
        let (spec, pool) = tiny_spec();
        let cells = plan_cells(&spec, &pool);
        let models = tempfile::tempdir().unwrap();
        let h = spec.defaults.clone();
        let needed = |models: &Path| runs_needed(&spec, &pool, cells.iter(), models);
        // One run per task (the steps are snapshots of one run), each saving K = 2, 4 and 6.
        let all = needed(models.path());
        assert_eq!(all.len(), 3);
        assert!(all.values().all(|j| j.snapshots == [2, 4, 6]));
        let touch = |rel: String, text: &str| {
            let p = models.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        // Task 0 has every snapshot: not needed any more.
        for k in [2, 4, 6] {
            touch(expert_file(&h, &pool[0], k), "");
        }
        // Task 1 diverged at step 3 and has its K = 2 snapshot: nothing it can still give.
        touch(diverged_file(&h, &pool[1]), "3 loss NaN");
        touch(expert_file(&h, &pool[1], 2), "");
        let left = needed(models.path());
        assert_eq!(left.keys().map(|(_, t)| *t).collect::<Vec<_>>(), [2]);
        // Without its K = 2 snapshot the diverged run is needed again (for K = 2 only).
        std::fs::remove_file(models.path().join(expert_file(&h, &pool[1], 2))).unwrap();
        assert_eq!(needed(models.path()).len(), 2);
    }
}
