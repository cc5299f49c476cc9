//! Text classification with the bert family (BERT, MiniLM, DistilBERT, RoBERTa, XLM-RoBERTa,
//! by `config.json`'s model type): each task's examples are tokenised, encoded by the
//! checkpoint under evaluation and classified by the task's head (from its fine-tuned model),
//! in batches on the evaluator's device, so memory holds the model and one batch of
//! activations.

use super::{ClassifierFamily, EvalReport, ScoresWeights, evenly, score_classifier};
use crate::family::bert::{self, ClassifierHead};
use crate::family::encoder::{EncoderConfig, SequenceEncoder};
use crate::family::hf;
use crate::family::text_data::TextExample;
use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use tokenizers::Tokenizer;

/// One task: its examples and the head that classifies them.
#[derive(Clone)]
pub struct TextTask {
    /// Task name.
    pub name: String,
    /// Where the examples came from (for messages).
    pub data: PathBuf,
    /// The examples.
    pub examples: Vec<TextExample>,
    /// The task's head; `None`: the evaluated checkpoint's own `classifier.*`.
    pub head: Option<ClassifierHead>,
}

/// How the encoder's inputs are found and batched.
#[derive(Clone, Debug)]
pub struct TextModelSpec {
    /// `config.json` to use; `None`: the one beside each evaluated checkpoint.
    pub config: Option<PathBuf>,
    /// `tokenizer.json` to use; `None`: the one beside each evaluated checkpoint.
    pub tokenizer: Option<PathBuf>,
    /// Tokens kept per example.
    pub max_length: usize,
    /// Examples per forward pass.
    pub batch_size: usize,
    /// The suite's base model: its config and tokenizer serve checkpoints with none beside them.
    pub base: Option<PathBuf>,
}

/// Evaluates bert-family checkpoints (BERT, MiniLM, DistilBERT, RoBERTa, XLM-RoBERTa) on
/// text-classification tasks.
#[derive(Clone)]
pub struct TextClassifierEvaluator {
    name: String,
    model: TextModelSpec,
    tasks: Vec<TextTask>,
    device: Device,
}

impl TextClassifierEvaluator {
    /// An evaluator named `name` (a suite's) of `tasks`; every head's labels are checked
    /// against its data here, before any model is loaded.
    pub fn new(name: String, model: TextModelSpec, tasks: Vec<TextTask>, device: &Device) -> Result<Self> {
        if model.batch_size == 0 || model.max_length < 2 {
            return Err(EngineError::Param(format!(
                "suite '{name}': [model] batch_size must be at least 1 and max_length at least 2 (they are {} and {})",
                model.batch_size, model.max_length
            )));
        }
        for t in &tasks {
            if let Some(h) = &t.head {
                check_labels(t, h)?;
            }
        }
        Ok(TextClassifierEvaluator {
            name,
            model,
            tasks,
            device: device.clone(),
        })
    }
}

/// Every label of `task` must be a row of `head`.
fn check_labels(task: &TextTask, head: &ClassifierHead) -> Result<()> {
    let top = task.examples.iter().map(|e| e.label).max().unwrap_or(0);
    if top >= head.classes() {
        return Err(EngineError::evaluator(format!(
            "task '{}': '{}' has label {top} but the task's head has {} classes; give the head of the model fine-tuned on this data",
            task.name,
            task.data.display(),
            head.classes()
        )));
    }
    Ok(())
}

impl ScoresWeights for TextClassifierEvaluator {
    type Inputs = (EncoderConfig, Tokenizer);
    const FAMILY: &'static str = "bert";

    suite_accessors!();

    fn subsample(&mut self, _like: &Path, samples: usize) -> Result<()> {
        for t in &mut self.tasks {
            t.examples = evenly(&t.examples, samples);
        }
        Ok(())
    }

    /// The config and tokenizer for models like `checkpoint` (the suite's, or those beside it).
    fn inputs_for(&self, checkpoint: &Path) -> Result<(EncoderConfig, Tokenizer)> {
        let (config, tokenizer) = hf::locate_config_and_tokenizer(
            self.model.config.as_deref(),
            self.model.tokenizer.as_deref(),
            checkpoint,
            self.model.base.as_deref(),
        )?;
        Ok((
            EncoderConfig::read(&config)?,
            hf::load_tokenizer(&tokenizer, self.model.max_length)?,
        ))
    }

    fn score_weights(
        &self,
        inputs: &(EncoderConfig, Tokenizer),
        weights: HashMap<String, Tensor>,
        source: &Path,
        cancel: &AtomicBool,
    ) -> Result<EvalReport> {
        score_classifier(self, inputs, weights, source, cancel)
    }
}

/// An encoder of the family with the head of every task.
pub(crate) struct TextNet {
    encoder: SequenceEncoder,
    heads: Vec<ClassifierHead>,
}

impl ClassifierFamily for TextClassifierEvaluator {
    type Net = TextNet;

    fn build(
        &self,
        (config, _): &(EncoderConfig, Tokenizer),
        weights: HashMap<String, Tensor>,
        source: &Path,
    ) -> Result<TextNet> {
        let own_head = if self.tasks.iter().any(|t| t.head.is_none()) {
            Some(ClassifierHead::from_weights(&weights, source)?)
        } else {
            None
        };
        let encoder = SequenceEncoder::load(config, weights, &self.device, source)?;
        let heads = self
            .tasks
            .iter()
            .map(|task| {
                let head = match (&task.head, &own_head) {
                    (Some(h), _) => h.clone(),
                    (None, Some(h)) => {
                        check_labels(task, h)?;
                        h.clone()
                    }
                    (None, None) => return Err(EngineError::Bug("a task without a head reached scoring".into())),
                };
                if head.kind() != encoder.kind() {
                    return Err(EngineError::evaluator(format!(
                        "the head of task '{}' is a {} classifier but '{}' is a {} model; the head must come from a fine-tune of this model",
                        task.name,
                        head.kind(),
                        source.display(),
                        encoder.kind()
                    )));
                }
                if head.hidden() != config.hidden_size() {
                    return Err(EngineError::evaluator(format!(
                        "the head of task '{}' reads {} features but the model's hidden size is {}; the head must come from a fine-tune of this model",
                        task.name,
                        head.hidden(),
                        config.hidden_size()
                    )));
                }
                Ok(head)
            })
            .collect::<Result<_>>()?;
        Ok(TextNet { encoder, heads })
    }

    fn examples(&self, task: usize) -> usize {
        self.tasks[task].examples.len()
    }

    fn batch_size(&self) -> usize {
        self.model.batch_size
    }

    fn logits(
        &self,
        (config, tokenizer): &(EncoderConfig, Tokenizer),
        net: &TextNet,
        task: usize,
        indices: &[usize],
    ) -> Result<(Tensor, Vec<usize>)> {
        let examples = &self.tasks[task].examples;
        let chosen: Vec<&TextExample> = indices.iter().map(|&i| &examples[i]).collect();
        let tokens = bert::encode(
            tokenizer,
            chosen.iter().map(|e| (e.text.as_str(), e.pair.as_deref())),
            config.pad_id(),
            &self.device,
        )?;
        let features = net.encoder.features(&tokens)?;
        Ok((
            net.heads[task].logits(&features)?,
            chosen.iter().map(|e| e.label).collect(),
        ))
    }
}
