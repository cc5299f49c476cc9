//! A task's sequence-classification head, as each encoder architecture of the bert family
//! saves it in its `*ForSequenceClassification` checkpoint:
//!
//! | architecture | tensors | computes, from the encoder's [`features`](super::encoder::SequenceEncoder::features) |
//! |---|---|---|
//! | BERT, MiniLM | `classifier.{weight,bias}` | `classifier(pooled)` |
//! | DistilBERT | `pre_classifier.*`, `classifier.*` | `classifier(relu(pre_classifier(h[0])))` |
//! | RoBERTa, XLM-R | `classifier.dense.*`, `classifier.out_proj.*` | `out_proj(tanh(dense(h[0])))` |
//!
//! A head is read from a fine-tuned checkpoint or from a file holding just those tensors; the
//! tensors present say which architecture it belongs to.

use super::kind::EncoderKind;
use candle_core::{DType, Device, Tensor};
use candle_nn::{Linear, Module};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::Path;

/// The tensor names of the head in a `BertForSequenceClassification` checkpoint (also the
/// output layer of DistilBERT's head).
pub const HEAD_WEIGHT: &str = "classifier.weight";
/// See [`HEAD_WEIGHT`].
pub const HEAD_BIAS: &str = "classifier.bias";
/// DistilBERT's hidden layer before [`HEAD_WEIGHT`].
const DISTILBERT_PRE: &str = "pre_classifier";
/// RoBERTa's hidden layer and output layer.
const ROBERTA_DENSE: &str = "classifier.dense";
const ROBERTA_OUT: &str = "classifier.out_proj";

/// A task's classification head (see the module documentation for the three layouts).
#[derive(Clone)]
pub struct ClassifierHead {
    kind: EncoderKind,
    hidden_layer: Option<Linear>,
    output: Linear,
    classes: usize,
    hidden: usize,
}

fn missing_head(path: &Path, name: &str) -> EngineError {
    EngineError::evaluator(format!(
        "'{}' has no tensor '{name}'; a task's head is the classifier of its fine-tuned *ForSequenceClassification checkpoint (or a file with just those tensors): \
         {HEAD_WEIGHT}/.bias for BERT, {DISTILBERT_PRE}.* and {HEAD_WEIGHT}/.bias for DistilBERT, {ROBERTA_DENSE}.* and {ROBERTA_OUT}.* for RoBERTa",
        path.display()
    ))
}

/// Reads tensors by name; `None` when absent.
type Lookup<'a> = dyn Fn(&str) -> Result<Option<Tensor>> + 'a;

impl ClassifierHead {
    /// Reads the head from a checkpoint (a fine-tuned task model, or a file holding just the
    /// head's tensors); only those tensors are read.
    pub fn load(path: &Path, device: &Device) -> Result<ClassifierHead> {
        let c = Checkpoint::open(path)?;
        let read = |name: &str| -> Result<Option<Tensor>> {
            match c.tensors.get(name) {
                Some(t) => Ok(Some(Tensor::from_vec(c.read_f32(t)?, t.shape.clone(), device)?)),
                None => Ok(None),
            }
        };
        Self::from_lookup(&read, path)
    }

    /// The head among a model's weights held in memory (`source` names the model in errors).
    pub fn from_weights(weights: &HashMap<String, Tensor>, source: &Path) -> Result<ClassifierHead> {
        Self::from_lookup(&|name: &str| Ok(weights.get(name).cloned()), source)
    }

    fn from_lookup(get: &Lookup<'_>, source: &Path) -> Result<ClassifierHead> {
        let linear = |prefix: &str| -> Result<Option<(Linear, usize, usize)>> {
            let (wn, bn) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
            let Some(w) = get(&wn)? else { return Ok(None) };
            let b = get(&bn)?.ok_or_else(|| missing_head(source, &bn))?;
            let (ws, bs) = (w.dims().to_vec(), b.dims().to_vec());
            if ws.len() != 2 || bs != [ws[0]] {
                return Err(EngineError::evaluator(format!(
                    "'{}': {wn} {ws:?} and {bn} {bs:?} are not a [outputs, inputs] weight and an [outputs] bias",
                    source.display()
                )));
            }
            let l = Linear::new(w.to_dtype(DType::F32)?, Some(b.to_dtype(DType::F32)?));
            Ok(Some((l, ws[0], ws[1])))
        };
        let (kind, hidden_layer, (output, classes, out_in)) = if let Some(dense) = linear(ROBERTA_DENSE)? {
            let out = linear(ROBERTA_OUT)?.ok_or_else(|| missing_head(source, &format!("{ROBERTA_OUT}.weight")))?;
            (EncoderKind::Roberta, Some(dense), out)
        } else if let Some(pre) = linear(DISTILBERT_PRE)? {
            let out = linear("classifier")?.ok_or_else(|| missing_head(source, HEAD_WEIGHT))?;
            (EncoderKind::DistilBert, Some(pre), out)
        } else {
            let out = linear("classifier")?.ok_or_else(|| missing_head(source, HEAD_WEIGHT))?;
            (EncoderKind::Bert, None, out)
        };
        let hidden = match &hidden_layer {
            Some((_, outputs, _)) if *outputs != out_in => {
                return Err(EngineError::evaluator(format!(
                    "'{}': the head's hidden layer gives {outputs} features but its output layer reads {out_in}",
                    source.display()
                )));
            }
            Some((_, _, inputs)) => *inputs,
            None => out_in,
        };
        Ok(ClassifierHead {
            kind,
            hidden_layer: hidden_layer.map(|(l, _, _)| l),
            output,
            classes,
            hidden,
        })
    }

    /// Number of classes (rows of the output weight).
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Width of the representation it reads.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The architecture whose head layout this is.
    pub fn kind(&self) -> EncoderKind {
        self.kind
    }

    /// Logits `[batch, classes]` of the encoder's features `[batch, hidden]` (the pooled
    /// output for BERT, the first token's hidden state for DistilBERT and RoBERTa).
    pub fn logits(&self, features: &Tensor) -> Result<Tensor> {
        let x = match (&self.hidden_layer, self.kind) {
            (None, _) => features.clone(),
            (Some(l), EncoderKind::DistilBert) => l.forward(features)?.relu()?,
            (Some(l), _) => l.forward(features)?.tanh()?,
        };
        Ok(self.output.forward(&x)?)
    }
}
