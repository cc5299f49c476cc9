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

mod backbone;
pub mod calibration;
mod command;
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
/// carry (`Inputs`: a config, a tokenizer) resolved once from a checkpoint like it.
pub(crate) trait ScoresWeights: Send + Sync + 'static {
    /// Config, tokenizer: whatever scoring needs besides the tensors.
    type Inputs: Send + Sync + 'static;
    /// Scores the model `weights` (`source` names it in errors).
    fn score_weights(
        &self,
        inputs: &Self::Inputs,
        weights: HashMap<String, Tensor>,
        source: &Path,
        cancel: &AtomicBool,
    ) -> Result<EvalReport>;
}

/// Any [`ScoresWeights`] on models held in memory (landscapes).
pub(crate) struct WeightsInMemory<E: ScoresWeights> {
    /// The evaluator, its tasks subsampled.
    pub ev: E,
    /// Its inputs, resolved from `like`.
    pub inputs: E::Inputs,
    /// The checkpoint the models are like (named in errors).
    pub like: PathBuf,
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
