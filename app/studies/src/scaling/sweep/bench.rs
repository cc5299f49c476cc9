//! The benchmark a sweep trains on ([`SweepBench`]): the demo benchmark of an image
//! architecture, or the text benchmark (all-MiniLM-L6-v2 and its text tasks). Loaded on the
//! sweep's device it is a [`Backend`], through which the one runner ([`super::run`]) fine-tunes
//! a cell's experts, scores them and finds what a model-level merge learns on, whichever
//! benchmark it is. Each backend fine-tunes through its benchmark's own door (the lab's
//! `fine_tune_with_snapshots` for the demo, the text build's `fine_tune_snapshots`) and scores
//! through the evaluator `mergescope eval` uses on it (the demo's `BackboneEvaluator`, the text
//! build's `suite.toml`).

use super::cells::{RunJob, expert_file};
use super::spec::{BenchKind, Hyper, SweepSpec};
use candle_core::Device;
use mergescope_engine::error::{EngineError, Result};
use mergescope_lab::data::{SplitKind, TaskData, benchmark_tasks};
use mergescope_lab::demo::{Benchmark, load_params, save_params};
use mergescope_lab::evaluator::Evaluator;
use mergescope_lab::evaluator::suite::Suite;
use mergescope_lab::family::bert::{HEAD_BIAS, HEAD_WEIGHT};
use mergescope_lab::nn::{Head, Params};
use mergescope_lab::run::TaskSource;
use mergescope_lab::text_bench::build::{Backbone, LinearHead, expert_stream, fine_tune_snapshots};
use mergescope_lab::text_bench::data::{Example, TextSplit, Tokenized, parse_split};
use mergescope_lab::text_bench::{TextBenchmark, TextRecipe, text_demo_dir};
use mergescope_lab::train::{
    BatchSize, Budget, Examples, STEPS_KEY, TrainConfig, TrainTask, fine_tune_with_snapshots, train_metadata,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The benchmark a sweep trains on: its base and frozen heads start every fine-tuning run, its
/// evaluator scores every cell.
#[derive(Clone, Copy)]
pub enum SweepBench<'a> {
    /// A built demo benchmark and the data of (at least) its tasks.
    Demo {
        /// The benchmark.
        bench: &'a Benchmark,
        /// Task data (see [`benchmark_tasks`]).
        tasks: &'a [TaskData],
    },
    /// A built text benchmark (`mergescope demo build --benchmark text`): its `base/`,
    /// `heads/`, `data/` and `suite.toml`.
    Text(&'a TextBenchmark),
}

impl<'a> SweepBench<'a> {
    /// The kind of benchmark.
    pub fn kind(&self) -> BenchKind {
        match self {
            SweepBench::Demo { bench, .. } => BenchKind::Demo(bench.manifest.arch),
            SweepBench::Text(_) => BenchKind::Text,
        }
    }

    /// Its folder.
    pub fn dir(&self) -> &'a Path {
        match self {
            SweepBench::Demo { bench, .. } => &bench.dir,
            SweepBench::Text(b) => &b.dir,
        }
    }

    /// Its tasks, in order: the pool task groups are drawn from.
    pub fn task_names(&self) -> Vec<String> {
        match self {
            SweepBench::Demo { bench, .. } => bench.task_names().iter().map(|s| (*s).to_owned()).collect(),
            SweepBench::Text(b) => b.manifest.tasks.iter().map(|t| t.name.clone()).collect(),
        }
    }

    /// The base checkpoint every expert starts from (the merges' base).
    pub fn base_path(&self) -> PathBuf {
        match self {
            SweepBench::Demo { bench, .. } => bench.base_path(),
            SweepBench::Text(b) => b.dir.join("base").join("model.safetensors"),
        }
    }

    /// The files linked into the sweep's models folder (paths relative to it), so that the
    /// folder's experts can be read against their base without the benchmark.
    pub(super) fn links(&self) -> Vec<(PathBuf, PathBuf)> {
        let mut out = vec![(self.base_path(), PathBuf::from("base.safetensors"))];
        match self {
            SweepBench::Demo { bench, .. } => out.push((bench.heads_path(), PathBuf::from("heads.safetensors"))),
            SweepBench::Text(b) => out.extend(b.manifest.tasks.iter().map(|t| {
                let file = format!("{}.safetensors", t.name);
                (b.dir.join("heads").join(&file), Path::new("heads").join(file))
            })),
        }
        out
    }

    /// Checks that `spec` can run on this benchmark; errors say what to change.
    pub(super) fn check(&self, spec: &SweepSpec) -> Result<()> {
        let dir = self.dir().display();
        match (spec.kind()?, self) {
            (BenchKind::Demo(arch), SweepBench::Demo { bench, tasks }) => {
                if arch != bench.manifest.arch {
                    return Err(EngineError::Param(format!(
                        "the sweep is for {} but the benchmark '{dir}' is {}",
                        spec.arch,
                        bench.manifest.arch.name()
                    )));
                }
                for name in bench.task_names() {
                    if !tasks.iter().any(|t| t.name == name) {
                        return Err(EngineError::Invalid(format!(
                            "no task data for the benchmark's task '{name}': add its file to the task folder"
                        )));
                    }
                }
                Ok(())
            }
            (BenchKind::Demo(arch), SweepBench::Text(_)) => Err(EngineError::Param(format!(
                "the sweep is for the {} demo benchmark but '{dir}' is a text benchmark: set arch = \"text\" in the specification (--arch text with a preset)",
                arch.name()
            ))),
            (BenchKind::Text, SweepBench::Demo { bench, .. }) => Err(EngineError::Param(format!(
                "the sweep is for the text benchmark (arch = \"text\") but '{dir}' is the {} demo benchmark: name a text build (`mergescope demo build --benchmark text` writes one) or set arch to mlp, cnn or vit",
                bench.manifest.arch.name()
            ))),
            (BenchKind::Text, SweepBench::Text(b)) => {
                if !b.is_current() {
                    return Err(EngineError::Invalid(format!(
                        "the text benchmark in '{dir}' was built by an older recipe (version {}): rebuild it with `mergescope demo build --benchmark text --force`",
                        b.manifest.recipe_version
                    )));
                }
                let bad = |what: String| Err(EngineError::Param(format!("sweep specification: {what}")));
                if let Some(h) = spec
                    .points()
                    .iter()
                    .find(|h| !h.optimizer.eq_ignore_ascii_case("adamw"))
                {
                    return bad(format!(
                        "optimizer '{}': the text benchmark's recipe fine-tunes with AdamW (warm-up, then linear decay) only; remove it from [grid] optimizer and [defaults]",
                        h.optimizer
                    ));
                }
                if spec.eval_examples.is_some() {
                    return bad(format!(
                        "eval_examples does not apply to the text benchmark, whose suite scores every test text of '{dir}': remove it, or build a reduced benchmark (`demo build --benchmark text --text-max-eval N`)"
                    ));
                }
                Ok(())
            }
        }
    }

    /// The benchmark loaded on `device` for `spec`'s runs.
    pub(super) fn load(&self, spec: &'a SweepSpec, device: &Device) -> Result<Box<dyn Backend + 'a>> {
        Ok(match *self {
            SweepBench::Demo { bench, tasks } => Box::new(DemoBackend::load(spec, bench, tasks, device)?),
            SweepBench::Text(bench) => Box::new(TextBackend::load(spec, bench, device)?),
        })
    }
}

/// A benchmark a sweep trains on, owned: what the CLI, a Slurm cell and the window open and
/// lend as a [`SweepBench`].
pub enum OpenBench {
    /// A demo benchmark and the task data.
    Demo {
        /// The benchmark.
        bench: Benchmark,
        /// Task data.
        tasks: Vec<TaskData>,
    },
    /// A text benchmark.
    Text(TextBenchmark),
}

impl OpenBench {
    /// The benchmark of `kind` in `dir` (a Slurm cell's, whose job file names the folder).
    pub fn open_dir(kind: BenchKind, dir: &Path) -> Result<OpenBench> {
        Ok(match kind {
            BenchKind::Demo(_) => OpenBench::Demo {
                bench: Benchmark::open(dir)?,
                tasks: benchmark_tasks(None)?,
            },
            BenchKind::Text => OpenBench::Text(open_text_benchmark(&dir.display().to_string())?),
        })
    }

    /// Lent to a sweep.
    pub fn as_sweep(&self) -> SweepBench<'_> {
        match self {
            OpenBench::Demo { bench, tasks } => SweepBench::Demo { bench, tasks },
            OpenBench::Text(b) => SweepBench::Text(b),
        }
    }
}

/// Whether `dir` looks like a text build (its `suite.toml` and `base/` model folder), so that a
/// demo sweep pointed at one can say so.
pub fn is_text_build(dir: &Path) -> bool {
    dir.join("suite.toml").is_file() && dir.join("base").join("config.json").is_file()
}

/// The text benchmark a text sweep's `benchmark` names: `demo` or `text` (the cache's build of
/// seed 0, where `demo build --benchmark text` puts it), or a build folder (or its
/// `suite.toml`). Errors say what the folder lacks and how to make one.
pub fn open_text_benchmark(name: &str) -> Result<TextBenchmark> {
    let build = "build one with `mergescope demo build --benchmark text --backbone ~/.cache/mergescope/all-minilm-l6-v2` (scripts/fetch-minilm.sh fetches the model)";
    let dir = match name {
        "demo" | "text" => text_demo_dir(0)?,
        _ => {
            let p = PathBuf::from(name);
            match p.file_name() {
                Some(f) if f == "suite.toml" => p.parent().map(Path::to_path_buf).unwrap_or_default(),
                _ => p,
            }
        }
    };
    if !dir.is_dir() {
        return Err(EngineError::Param(format!(
            "the text benchmark '{}' does not exist: {build}, or point the sweep's benchmark (--benchmark) at a build folder",
            dir.display()
        )));
    }
    if !dir.join("manifest.json").is_file() || !dir.join("suite.toml").is_file() {
        return Err(EngineError::Param(format!(
            "'{}' is not a text benchmark build (it has no manifest.json and suite.toml beside base/, heads/ and data/): point --benchmark at the folder `demo build --benchmark text` wrote, or {build}",
            dir.display()
        )));
    }
    TextBenchmark::open(&dir).map_err(|e| {
        EngineError::Param(format!(
            "'{}' is not a usable text benchmark build ({e}); {build}",
            dir.display()
        ))
    })
}

/// A sweep's benchmark loaded on its device: how one fine-tuning run is made, how a group of
/// tasks is scored, and what a model-level merge of a group learns on.
pub(super) trait Backend: Sync {
    /// Fine-tunes pool task `task` for `job`, writing the snapshot of each of its step counts to
    /// `models/`[`expert_file`] atomically; `on_step` after every step. A run whose loss stops
    /// being finite ends with [`EngineError::Diverged`].
    fn train(
        &self,
        job: &RunJob,
        task: usize,
        models: &Path,
        on_step: &(dyn Fn() + Sync),
        cancel: &AtomicBool,
    ) -> Result<()>;

    /// The test-split evaluator of the tasks `names`.
    fn evaluator(&self, names: &[String]) -> Result<Box<dyn Evaluator>>;

    /// What a model-level method merging the experts of `names` at `hyper` (in `models`)
    /// learns on.
    fn source(&self, names: &[String], hyper: &Hyper, models: &Path) -> Result<GroupSource<'_>>;
}

/// The tasks a model-level merge of a group learns on, owned for the merge's time.
pub(super) enum GroupSource<'a> {
    /// The demo benchmark restricted to the group, its experts the sweep's.
    Demo {
        /// The group's benchmark.
        bench: Box<Benchmark>,
        /// Task data.
        tasks: &'a [TaskData],
    },
    /// A suite of the group's tasks.
    Suite(Box<Suite>),
}

impl GroupSource<'_> {
    /// As the merge door takes it.
    pub(super) fn get(&self) -> TaskSource<'_> {
        match self {
            GroupSource::Demo { bench, tasks } => TaskSource::Benchmark {
                bench: bench.as_ref(),
                tasks,
            },
            GroupSource::Suite(s) => TaskSource::Suite(s),
        }
    }
}

/// The indices of the first `ratio` of each class's examples (at least one of each class
/// present), in their order: a deterministic class-balanced subset.
fn balanced_indices(labels: &[usize], ratio: f64) -> Vec<usize> {
    let mut per_class: BTreeMap<usize, usize> = BTreeMap::new();
    for &l in labels {
        *per_class.entry(l).or_default() += 1;
    }
    let mut left: BTreeMap<usize, usize> = per_class
        .iter()
        .map(|(&c, &n)| (c, ((n as f64 * ratio).round() as usize).clamp(1, n)))
        .collect();
    labels
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let n = left.get_mut(l)?;
            (*n > 0).then(|| {
                *n -= 1;
                i
            })
        })
        .collect()
}

/// The first `ratio` of each class's training examples, in their order (a deterministic
/// class-balanced subset; at least one example of each class present).
pub fn class_balanced_subset(data: &TaskData, ratio: f64) -> (Vec<u8>, Vec<u8>) {
    let side = data.image_size.0 * data.image_size.1;
    let labels: Vec<usize> = data.train.labels.iter().map(|&l| usize::from(l)).collect();
    let (mut images, mut out_labels) = (Vec::new(), Vec::new());
    for i in balanced_indices(&labels, ratio) {
        images.extend_from_slice(&data.train.images[i * side..(i + 1) * side]);
        out_labels.push(data.train.labels[i]);
    }
    (images, out_labels)
}

/// Creates the folder `path` goes in.
fn parent_dir(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e)),
        None => Ok(()),
    }
}

/// Writes one fine-tuning snapshot to `path` (atomically), creating its folder: the step both
/// backends' `train` hand their fine-tuning loops.
fn save_snapshot(path: &Path, params: &Params, meta: &BTreeMap<String, String>) -> Result<()> {
    parent_dir(path)?;
    save_params(path, params, meta)
}

/// The demo benchmark loaded: base, heads, the pool's task data.
struct DemoBackend<'a> {
    spec: &'a SweepSpec,
    bench: &'a Benchmark,
    tasks: &'a [TaskData],
    base: Params,
    heads: BTreeMap<String, Head>,
    device: Device,
}

impl<'a> DemoBackend<'a> {
    fn load(spec: &'a SweepSpec, bench: &'a Benchmark, tasks: &'a [TaskData], device: &Device) -> Result<Self> {
        Ok(DemoBackend {
            spec,
            bench,
            tasks,
            base: load_params(&bench.base_path(), device)?,
            heads: bench.heads(device)?,
            device: device.clone(),
        })
    }
}

impl Backend for DemoBackend<'_> {
    fn train(
        &self,
        job: &RunJob,
        task: usize,
        models: &Path,
        on_step: &(dyn Fn() + Sync),
        cancel: &AtomicBool,
    ) -> Result<()> {
        let (spec, bench) = (self.spec, self.bench);
        let names = bench.task_names();
        let name = names
            .get(task)
            .ok_or_else(|| EngineError::Bug(format!("task {task} is not in the pool")))?;
        let data = self
            .tasks
            .iter()
            .find(|d| d.name == *name)
            .ok_or_else(|| EngineError::Invalid(format!("no task data for '{name}'")))?;
        let h = &job.hyper;
        let steps = job.snapshots.last().copied().unwrap_or(h.steps);
        let cfg = TrainConfig {
            optim: h.optim()?,
            batch: BatchSize::Size(h.batch),
            budget: Budget::Steps(steps),
            seed: spec.seed.wrapping_add(task as u64),
            augment_shift: bench.manifest.recipe.expert.augment_shift,
        };
        let head = self
            .heads
            .get(&data.name)
            .ok_or_else(|| EngineError::Invalid(format!("the benchmark has no head for task '{}'", data.name)))?;
        let (images, labels) = class_balanced_subset(data, h.data_ratio);
        let train = TrainTask {
            data: Examples {
                images: &images,
                labels: &labels,
            },
            head,
        };
        let arch = bench.manifest.arch;
        let mut save = |k: usize, params: Params| -> Result<()> {
            let mut meta = mergescope_lab::demo::checkpoint_metadata(arch, spec.seed, "expert");
            meta.insert("mergescope.demo.task".to_owned(), data.name.clone());
            meta.insert("mergescope.train.data_ratio".to_owned(), h.data_ratio.to_string());
            meta.extend(train_metadata(&cfg, k, labels.len()));
            save_snapshot(&models.join(expert_file(h, &data.name, k)), &params, &meta)
        };
        fine_tune_with_snapshots(
            arch,
            &self.base,
            &[train],
            &cfg,
            &self.device,
            &job.snapshots,
            &mut save,
            &mut |_| on_step(),
            cancel,
        )
        .map(|_| ())
    }

    fn evaluator(&self, names: &[String]) -> Result<Box<dyn Evaluator>> {
        let mut ev = self
            .bench
            .evaluator(self.tasks, Some(names), SplitKind::Test, &self.device)?;
        if let Some(n) = self.spec.eval_examples {
            ev = ev.subsample(n)?;
        }
        Ok(Box::new(ev))
    }

    fn source(&self, names: &[String], hyper: &Hyper, models: &Path) -> Result<GroupSource<'_>> {
        let mut manifest = self.bench.manifest.clone();
        manifest.tasks.retain(|t| names.contains(&t.name));
        for t in &mut manifest.tasks {
            t.expert = expert_file(hyper, &t.name, hyper.steps);
        }
        Ok(GroupSource::Demo {
            bench: Box::new(Benchmark {
                dir: models.to_path_buf(),
                manifest,
            }),
            tasks: self.tasks,
        })
    }
}

/// The text benchmark loaded: its encoder (base/), the frozen heads and the train texts of the
/// pool's tasks, and its suite.
struct TextBackend<'a> {
    spec: &'a SweepSpec,
    bench: &'a TextBenchmark,
    suite: Suite,
    backbone: Backbone,
    heads: Vec<LinearHead>,
    train: Vec<Vec<Example>>,
    device: Device,
}

impl<'a> TextBackend<'a> {
    fn load(spec: &'a SweepSpec, bench: &'a TextBenchmark, device: &Device) -> Result<Self> {
        let dir = &bench.dir;
        let rebuild = "rebuild the benchmark (`mergescope demo build --benchmark text --force`)";
        let backbone = Backbone::load(&dir.join("base"), bench.manifest.recipe.max_length, device)?;
        let mut heads = Vec::new();
        let mut train = Vec::new();
        for t in &bench.manifest.tasks {
            let path = dir.join("heads").join(format!("{}.safetensors", t.name));
            let p = load_params(&path, device)?;
            let get = |k: &str| {
                p.get(k)
                    .cloned()
                    .ok_or_else(|| EngineError::Invalid(format!("'{}' has no tensor '{k}': {rebuild}", path.display())))
            };
            heads.push(LinearHead {
                weight: get(HEAD_WEIGHT)?,
                bias: get(HEAD_BIAS)?,
            });
            let path = dir.join("data").join(format!("{}.train.jsonl", t.name));
            let text = std::fs::read_to_string(&path).map_err(|e| EngineError::io("cannot read", &path, e))?;
            let examples = parse_split(&t.name, TextSplit::Train, &text, &t.classes)
                .map_err(|e| EngineError::Invalid(format!("'{}': {e}", path.display())))?;
            train.push(examples);
        }
        Ok(TextBackend {
            spec,
            bench,
            suite: Suite::load(&bench.suite_path())?,
            backbone,
            heads,
            train,
            device: device.clone(),
        })
    }

    /// The build's recipe with `hyper`'s learning rate and batch, `steps` steps and the sweep's
    /// seed; the warm-up keeps the build's share of the run (10 % by default), so the build's
    /// own settings give the build's own experts.
    fn recipe(&self, hyper: &Hyper, steps: usize) -> TextRecipe {
        let build = &self.bench.manifest.recipe;
        let share = build.expert_steps.max(1);
        TextRecipe {
            lr: hyper.lr,
            batch_size: hyper.batch,
            expert_steps: steps,
            warmup_steps: (steps * build.warmup_steps + share / 2) / share,
            seed: self.spec.seed,
            ..build.clone()
        }
    }
}

impl Backend for TextBackend<'_> {
    fn train(
        &self,
        job: &RunJob,
        task: usize,
        models: &Path,
        on_step: &(dyn Fn() + Sync),
        cancel: &AtomicBool,
    ) -> Result<()> {
        let (Some(t), Some(examples), Some(head)) = (
            self.bench.manifest.tasks.get(task),
            self.train.get(task),
            self.heads.get(task),
        ) else {
            return Err(EngineError::Bug(format!("task {task} is not in the pool")));
        };
        let h = &job.hyper;
        let labels: Vec<usize> = examples.iter().map(|e| e.label).collect();
        let subset: Vec<Example> = balanced_indices(&labels, h.data_ratio)
            .into_iter()
            .map(|i| examples[i].clone())
            .collect();
        let tok = Tokenized::new(&self.backbone.tokenizer, &subset)?;
        let steps = job.snapshots.last().copied().unwrap_or(h.steps);
        let recipe = self.recipe(h, steps);
        let mut save = |k: usize, params: Params| -> Result<()> {
            let meta: BTreeMap<String, String> = [
                ("format", "pt".to_owned()),
                ("mergescope.version", env!("CARGO_PKG_VERSION").to_owned()),
                ("mergescope.text_bench.role", format!("expert {}", t.name)),
                ("mergescope.demo.task", t.name.clone()),
                (STEPS_KEY, k.to_string()),
                ("mergescope.train.lr", h.lr.to_string()),
                ("mergescope.train.batch", h.batch.to_string()),
                ("mergescope.train.optimizer", "adamw".to_owned()),
                ("mergescope.train.examples", subset.len().to_string()),
                ("mergescope.train.data_ratio", h.data_ratio.to_string()),
                (
                    "mergescope.train.schedule",
                    format!("warmup {} of {steps}, linear decay", recipe.warmup_steps),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            save_snapshot(&models.join(expert_file(h, &t.name, k)), &params, &meta)
        };
        fine_tune_snapshots(
            &self.backbone,
            head,
            &tok,
            &recipe,
            expert_stream(task),
            &self.device,
            &job.snapshots,
            &mut save,
            &mut |_| on_step(),
            cancel,
        )
        .map(|_| ())
    }

    fn evaluator(&self, names: &[String]) -> Result<Box<dyn Evaluator>> {
        self.suite.evaluator(Some(names), &self.device)
    }

    fn source(&self, names: &[String], _hyper: &Hyper, models: &Path) -> Result<GroupSource<'_>> {
        let path = models.join("suites").join(format!("{}.toml", names.join("+")));
        if !path.is_file() {
            parent_dir(&path)?;
            let text = group_suite(&self.bench.suite_path(), names)?;
            mergescope_engine::writer::write_atomic(&path, text.as_bytes())?;
        }
        Ok(GroupSource::Suite(Box::new(Suite::load(&path)?)))
    }
}

/// The suite at `suite` restricted to the tasks `names`, every path made absolute (so the
/// file can live in the sweep's folder) and its `[models]` reduced to the base.
fn group_suite(suite: &Path, names: &[String]) -> Result<String> {
    let text = std::fs::read_to_string(suite).map_err(|e| EngineError::io("cannot read", suite, e))?;
    let mut doc: toml::Table =
        toml::from_str(&text).map_err(|e| EngineError::Invalid(format!("'{}': {e}", suite.display())))?;
    let dir = std::path::absolute(suite.parent().unwrap_or(Path::new(".")))
        .map_err(|e| EngineError::io("cannot resolve", suite, e))?;
    let abs = |v: &mut toml::Value| {
        if let toml::Value::String(s) = v {
            *s = dir.join(&*s).display().to_string();
        }
    };
    if let Some(toml::Value::Array(tasks)) = doc.get_mut("task") {
        tasks.retain(|t| {
            t.get("name")
                .and_then(toml::Value::as_str)
                .is_some_and(|n| names.iter().any(|m| m == n))
        });
        for t in tasks.iter_mut() {
            if let toml::Value::Table(t) = t {
                for key in ["data", "calibration", "train", "head"] {
                    if let Some(v) = t.get_mut(key) {
                        abs(v);
                    }
                }
            }
        }
    }
    if let Some(toml::Value::Table(m)) = doc.get_mut("models") {
        m.remove("experts");
        if let Some(v) = m.get_mut("base") {
            abs(v);
        }
    }
    toml::to_string(&doc).map_err(|e| EngineError::Bug(format!("cannot write a group suite: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_balanced_subset_takes_the_first_share_of_each_class() {
        let labels = [0, 0, 1, 0, 1, 1, 0, 2];
        assert_eq!(balanced_indices(&labels, 1.0), (0..8).collect::<Vec<_>>());
        // Half of 4, 3 and 1 examples: 2, 2 (1.5 rounds up) and at least 1.
        assert_eq!(balanced_indices(&labels, 0.5), [0, 1, 2, 4, 7]);
    }

    #[test]
    fn a_group_suite_keeps_its_tasks_with_absolute_paths() {
        let dir = tempfile::tempdir().unwrap();
        let suite = dir.path().join("suite.toml");
        std::fs::write(
            &suite,
            "name = \"s\"\n[model]\nfamily = \"bert\"\nmax_length = 16\n\n[[task]]\nname = \"a\"\ndata = \"data/a.test.jsonl\"\ncalibration = \"data/a.calibration.jsonl\"\nhead = \"heads/a.safetensors\"\nlabels = [\"x\", \"y\"]\n\n[[task]]\nname = \"b\"\ndata = \"data/b.test.jsonl\"\n\n[models]\nbase = \"base\"\nexperts = [\"experts/a\", \"experts/b\"]\n",
        )
        .unwrap();
        let text = group_suite(&suite, &["a".to_owned()]).unwrap();
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let tasks = doc["task"].as_array().unwrap();
        assert_eq!(tasks.len(), 1);
        let root = std::path::absolute(dir.path()).unwrap();
        assert_eq!(
            tasks[0]["head"].as_str().unwrap(),
            root.join("heads/a.safetensors").display().to_string()
        );
        assert_eq!(
            doc["models"]["base"].as_str().unwrap(),
            root.join("base").display().to_string()
        );
        assert!(doc["models"].get("experts").is_none());
        assert_eq!(doc["model"]["max_length"].as_integer(), Some(16));
        // The suite reader takes it, from anywhere: its paths are absolute.
        let elsewhere = dir.path().join("sweep/models/suites/a.toml");
        std::fs::create_dir_all(elsewhere.parent().unwrap()).unwrap();
        std::fs::write(&elsewhere, &text).unwrap();
        let read = Suite::load(&elsewhere).unwrap();
        assert_eq!(read.task_names(), ["a"]);
        assert_eq!(read.models().unwrap().base, root.join("base"));
    }

    #[test]
    fn a_folder_that_is_not_a_text_build_says_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere").display().to_string();
        let e = open_text_benchmark(&missing).unwrap_err().to_string();
        assert!(
            e.contains("does not exist") && e.contains("demo build --benchmark text"),
            "{e}"
        );
        let e = open_text_benchmark(&dir.path().display().to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is not a text benchmark build") && e.contains("--benchmark"),
            "{e}"
        );
        assert!(!is_text_build(dir.path()));
    }
}
