//! Choosing the evaluator a request names, once: a demo benchmark (by name, folder, or the
//! architecture of the checkpoint to evaluate) or a suite file. The CLI's `eval` and
//! `merge --eval` come through here; see [`crate::evaluator`] for the trait.

use crate::data::{SplitKind, benchmark_tasks};
use crate::demo::{Benchmark, resolve_benchmark};
use crate::evaluator::suite::{Suite, SuiteModels};
use crate::evaluator::{self, Evaluator};
use crate::nn::Arch;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::device::Device;
use mergescope_engine::error::{EngineError, Result};
use std::path::{Path, PathBuf};

/// What to evaluate on, as a user names it: the `--benchmark`, `--data`, `--tasks`, `--split`
/// and `--device` of the CLI.
#[derive(Clone, Debug)]
pub struct EvaluatorSpec {
    /// `demo`, `demo/<arch>`, `demo/<arch>-seed<N>`, a benchmark folder, or a suite file (`.toml`).
    pub benchmark: String,
    /// Folder of task files for a benchmark built with `demo build --data DIR`.
    pub data: Option<PathBuf>,
    /// Only these tasks.
    pub tasks: Option<Vec<String>>,
    /// Split evaluated (built-in benchmarks; an external command chooses its own data).
    pub split: SplitKind,
    /// Device the evaluation runs on.
    pub device: Device,
}

impl EvaluatorSpec {
    /// The test split of `benchmark` on `device`, every task.
    pub fn new(benchmark: impl Into<String>, device: &Device) -> EvaluatorSpec {
        EvaluatorSpec {
            benchmark: benchmark.into(),
            data: None,
            tasks: None,
            split: SplitKind::Test,
            device: device.clone(),
        }
    }
}

/// An evaluator chosen from a spec, and the benchmark behind it when it is a built-in one.
pub struct Opened {
    /// The evaluator.
    pub evaluator: Box<dyn Evaluator>,
    /// The demo benchmark it evaluates on (`None` for a suite).
    pub benchmark: Option<Benchmark>,
}

/// Chooses the evaluator `spec` names, once, for the checkpoint at `checkpoint` (whose
/// architecture picks among demo benchmarks when `spec` says only `demo`). A `.toml` file is a
/// suite ([`evaluator::suite::Suite`]); anything else a demo benchmark.
pub fn open(spec: &EvaluatorSpec, checkpoint: Option<&Path>) -> Result<Opened> {
    if evaluator::suite::is_suite_path(&spec.benchmark) {
        let suite = evaluator::suite::Suite::load(Path::new(&spec.benchmark))?;
        let evaluator = suite.evaluator(spec.tasks.as_deref(), &spec.device)?;
        return Ok(Opened {
            evaluator,
            benchmark: None,
        });
    }
    let arch = match checkpoint {
        Some(path) => detect_arch(path)?,
        None => None,
    };
    let bench = resolve_benchmark(&spec.benchmark, arch).map_err(|e| match (checkpoint, arch) {
        (Some(path), None) if spec.benchmark.starts_with("demo") => EngineError::Evaluator(format!(
            "'{}' is not a backbone of a demo architecture (mlp, cnn, vit), so the demo benchmark cannot \
             evaluate it; name a suite file (--benchmark suite.toml) whose evaluator knows this model ({e})",
            path.display()
        )),
        _ => e,
    })?;
    let all_tasks = benchmark_tasks(spec.data.as_deref())?;
    let evaluator = bench.evaluator(&all_tasks, spec.tasks.as_deref(), spec.split, &spec.device)?;
    Ok(Opened {
        evaluator: Box::new(evaluator),
        benchmark: Some(bench),
    })
}

/// The evaluator of a comparison of models against their experts (radar charts): `spec`'s
/// evaluator, chosen for `base`'s architecture; a suite's is normalised by `experts` (expert
/// `i` on task `i`) when there is one per task, as the demo benchmark's reports already are.
pub fn open_normalised(
    spec: &EvaluatorSpec,
    base: &Path,
    experts: &[PathBuf],
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Box<dyn Evaluator>> {
    if !evaluator::suite::is_suite_path(&spec.benchmark) {
        return Ok(open(spec, Some(base))?.evaluator);
    }
    let suite = Suite::load(Path::new(&spec.benchmark))?;
    let inner = suite.evaluator(spec.tasks.as_deref(), &spec.device)?;
    if experts.len() != suite.task_names().len() {
        return Ok(inner);
    }
    let references = suite.expert_references(experts, &spec.device, cancel)?;
    Ok(Box::new(evaluator::Normalised::new(inner, references)))
}

/// The base and experts of a run on `suite`: `base` and `experts` when given (the CLI's
/// --base/--expert), else the suite's `[models]` table; the error says how to give them.
pub fn suite_models(suite: &Suite, base: Option<&Path>, experts: &[PathBuf]) -> Result<SuiteModels> {
    match (base, suite.models()) {
        (Some(b), _) => Ok(SuiteModels {
            base: b.to_owned(),
            experts: experts.to_vec(),
        }),
        (None, Some(m)) => Ok(m),
        (None, None) => Err(EngineError::Param(format!(
            "suite '{}' names no models: give --base and --expert, or add [models] base = \"...\" and experts = [...] to it",
            suite.path.display()
        ))),
    }
}

/// The demo architecture whose tensor names and shapes the checkpoint at `path` matches, read
/// from its header only.
pub fn detect_arch(path: &Path) -> Result<Option<Arch>> {
    let c = Checkpoint::open(path)?;
    Ok(Arch::detect(
        c.tensors.iter().map(|(k, t)| (k.as_str(), t.shape.as_slice())),
    ))
}
