//! The one evaluation door: an [`Evaluator`] scores a saved checkpoint on its tasks and gives
//! an [`EvalReport`]. Every caller (CLI `eval` and `merge --eval`, the window's jobs, `compare`,
//! sweeps, analyses) gets its evaluator from [`crate::evaluate::open`] (or from a benchmark it
//! already holds)
//! and calls [`Evaluator::evaluate_file`].
//!
//! Implementations: [`BackboneEvaluator`] (the demo benchmark's networks with their frozen
//! heads, in candle on the requested device; it also evaluates models held in memory) and
//! [`CommandEvaluator`] (an external command that prints per-task metrics as JSON, named by a
//! suite file). Data-driven merge methods need loss and gradients on calibration data: that is
//! the [`calibration::CalibrationTasks`] trait, which evaluators with a differentiable model
//! provide through [`Evaluator::calibration`].

/// The [`ScoresWeights`] accessors of a family evaluator with the fields `name` (the suite's),
/// `tasks` (each with a `name`) and `device`: [`ScoresWeights::suite_name`],
/// [`ScoresWeights::task_names`] and [`ScoresWeights::device`].
macro_rules! suite_accessors {
    () => {
        fn suite_name(&self) -> &str {
            &self.name
        }

        fn task_names(&self) -> Vec<String> {
            self.tasks.iter().map(|t| t.name.clone()).collect()
        }

        fn device(&self) -> &candle_core::Device {
            &self.device
        }
    };
}

mod backbone;
pub mod calibration;
mod command;
pub(crate) mod family_calibration;
mod image_classifier;
mod language_model;
mod reference;
mod report;
pub mod suite;
mod text_classifier;

pub(crate) use backbone::score;
pub use backbone::{BackboneEvaluator, EvalTask};
pub use command::{CommandEvaluator, parse_metrics_json};
pub use image_classifier::{ClipModelSpec, ImageClassifierEvaluator, ImageTask};
pub use language_model::{LmEvaluator, LmModelSpec, LmTask, LmTaskData, Question, read_lm_task};
pub use reference::{Normalised, References};
pub use report::{ACCURACY, EvalReport, TaskScore, summarise};
pub use text_classifier::{TextClassifierEvaluator, TextModelSpec, TextTask};

use crate::nn::Params;
use candle_core::Tensor;
use mergescope_engine::error::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// Scores checkpoints on a fixed list of tasks.
pub trait Evaluator: Send + Sync {
    /// What is evaluated, for messages and reports (a benchmark folder, a suite's name).
    fn describe(&self) -> String;
    /// The tasks, in report order.
    fn task_names(&self) -> Vec<String>;
    /// Scores the checkpoint at `path` (a file or a shard folder) on every task. `cancel` stops
    /// a long evaluation with [`EngineError::Cancelled`].
    fn evaluate_file(&self, path: &Path, cancel: &AtomicBool) -> Result<EvalReport>;
    /// A scorer of models held in memory (landscapes), keeping at most `samples` examples of
    /// each task, evenly spaced through it (0: all); `like` is a checkpoint of the same model
    /// (the base) for what tensors do not carry (config, tokenizer). `None` when the evaluator
    /// only scores saved files (an external command).
    fn in_memory(&self, like: &Path, samples: usize) -> Result<Option<Box<dyn InMemoryEvaluator>>> {
        let _ = (like, samples);
        Ok(None)
    }
}

/// Scores models held in memory, without writing them out.
pub trait InMemoryEvaluator: Send + Sync {
    /// Scores `model` (tensors by name, on the evaluator's device) on every task.
    fn evaluate(&self, model: &Params) -> Result<EvalReport>;
}

/// A family evaluator's scoring of a model given as named tensors, with what the tensors do not
/// carry (`Inputs`: a config, a tokenizer) resolved from a checkpoint like it: once per file,
/// or once for all the models of a landscape (the blanket [`Evaluator`] impl below).
pub(crate) trait ScoresWeights: Clone + Send + Sync + 'static {
    /// Config, tokenizer: whatever scoring needs besides the tensors.
    type Inputs: Send + Sync + 'static;
    /// The model family (`bert`, `clip`, `causal-lm`), for messages.
    const FAMILY: &'static str;
    /// The suite's name.
    fn suite_name(&self) -> &str;
    /// The tasks, in report order.
    fn task_names(&self) -> Vec<String>;
    /// Keeps at most `samples` examples of each task (see [`Evaluator::in_memory`]); may also
    /// prepare what every in-memory model reuses (decoded images).
    fn subsample(&mut self, like: &Path, samples: usize) -> Result<()>;
    /// The inputs for models like the checkpoint at `like`.
    fn inputs_for(&self, like: &Path) -> Result<Self::Inputs>;
    /// The device the tensors are loaded on.
    fn device(&self) -> &candle_core::Device;
    /// Scores the model `weights` (`source` names it in errors).
    fn score_weights(
        &self,
        inputs: &Self::Inputs,
        weights: HashMap<String, Tensor>,
        source: &Path,
        cancel: &AtomicBool,
    ) -> Result<EvalReport>;
}

/// A classification family (BERT, CLIP; causal LMs, whose multiple-choice questions are
/// classified by their choices' log-likelihoods and texts token by token): a network built from
/// one model's weights gives logits for any examples of a task. Scoring ([`score_classifier`])
/// and the data-driven methods' losses, gradients and fine-tuning ([`family_calibration`]) are
/// both computed from it.
pub(crate) trait ClassifierFamily: ScoresWeights {
    /// The network of one model: encoder and the tasks' heads.
    type Net;
    /// Builds the network from `weights` (`source` names the model in errors). Tensors are
    /// used as given, so weights that track gradients give logits that do.
    fn build(&self, inputs: &Self::Inputs, weights: HashMap<String, Tensor>, source: &Path) -> Result<Self::Net>;
    /// Readies what [`ClassifierFamily::examples`] and [`ClassifierFamily::logits`] read for
    /// models like the checkpoint at `like` (a causal LM's tasks are tokenised here); called once
    /// before either.
    fn prepare(&mut self, like: &Path) -> Result<()> {
        let _ = like;
        Ok(())
    }
    /// Examples of task `task`.
    fn examples(&self, task: usize) -> usize;
    /// Rows of logits the examples `indices` of task `task` give: what its mean loss averages
    /// over (one per example, except a causal LM's text windows: one per predicted token).
    fn rows(&self, task: usize, indices: &[usize]) -> usize {
        let _ = task;
        indices.len()
    }
    /// Examples per forward pass.
    fn batch_size(&self) -> usize;
    /// Logits `[n, classes]` of the examples `indices` of task `task`, and their labels.
    fn logits(
        &self,
        inputs: &Self::Inputs,
        net: &Self::Net,
        task: usize,
        indices: &[usize],
    ) -> Result<(Tensor, Vec<usize>)>;
}

/// Accuracy and cross-entropy of the model `weights` on every task of `ev`, batch by batch.
pub(crate) fn score_classifier<E: ClassifierFamily>(
    ev: &E,
    inputs: &E::Inputs,
    weights: HashMap<String, Tensor>,
    source: &Path,
    cancel: &AtomicBool,
) -> Result<EvalReport> {
    let net = ev.build(inputs, weights, source)?;
    let names = ScoresWeights::task_names(ev);
    let mut scores = Vec::with_capacity(names.len());
    for (t, name) in names.iter().enumerate() {
        let mut tally = backbone::Tally::default();
        for indices in batches(ev.examples(t), ev.batch_size()) {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(mergescope_engine::error::EngineError::Cancelled);
            }
            let (logits, labels) = ev.logits(inputs, &net, t, &indices)?;
            tally.add(&logits, labels)?;
        }
        scores.push(tally.score(name));
    }
    Ok(summarise(crate::data::SplitKind::Test, scores))
}

/// The indices `0..n` in consecutive batches of at most `size`.
pub(crate) fn batches(n: usize, size: usize) -> impl Iterator<Item = Vec<usize>> {
    let size = size.max(1);
    (0..n)
        .step_by(size)
        .map(move |start| (start..(start + size).min(n)).collect())
}

/// Every family evaluator is an [`Evaluator`]: a file is loaded on its device and scored; models
/// in memory are scored by a copy with subsampled tasks and inputs resolved once.
impl<E: ScoresWeights> Evaluator for E {
    fn describe(&self) -> String {
        let tasks = ScoresWeights::task_names(self).len();
        format!("suite '{}' ({} family, {tasks} tasks)", self.suite_name(), E::FAMILY)
    }

    fn task_names(&self) -> Vec<String> {
        ScoresWeights::task_names(self)
    }

    fn evaluate_file(&self, path: &Path, cancel: &AtomicBool) -> Result<EvalReport> {
        let inputs = self.inputs_for(path)?;
        let weights = crate::family::hf::load_weights(path, self.device())?;
        self.score_weights(&inputs, weights, path, cancel)
    }

    fn in_memory(&self, like: &Path, samples: usize) -> Result<Option<Box<dyn InMemoryEvaluator>>> {
        let mut copy = self.clone();
        copy.subsample(like, samples)?;
        Ok(Some(Box::new(WeightsInMemory {
            inputs: self.inputs_for(like)?,
            ev: copy,
            like: like.to_owned(),
        })))
    }
}

/// Any [`ScoresWeights`] on models held in memory (landscapes).
struct WeightsInMemory<E: ScoresWeights> {
    /// The evaluator, its tasks subsampled.
    ev: E,
    /// Its inputs, resolved from `like`.
    inputs: E::Inputs,
    /// The checkpoint the models are like (named in errors).
    like: PathBuf,
}

impl<E: ScoresWeights> InMemoryEvaluator for WeightsInMemory<E> {
    fn evaluate(&self, model: &Params) -> Result<EvalReport> {
        // Tensors are shared, not copied: the map only names them for the model.
        let weights = model.iter().map(|(k, t)| (k.clone(), t.detach())).collect();
        self.ev
            .score_weights(&self.inputs, weights, &self.like, &AtomicBool::new(false))
    }
}

/// At most `samples` of `items`, evenly spaced through them (every part represented); all of
/// them when `samples` is 0 or not fewer than there are.
pub(crate) fn evenly<T: Clone>(items: &[T], samples: usize) -> Vec<T> {
    let n = items.len();
    if samples == 0 || samples >= n {
        return items.to_vec();
    }
    (0..samples).map(|i| items[i * n / samples].clone()).collect()
}
