//! The bert family's encoders for sequence classification, one door for every model type it
//! reads: [`EncoderConfig::read`] dispatches on `config.json`'s `model_type` and
//! [`SequenceEncoder`] gives what that architecture's classification head reads
//! ([`super::head::ClassifierHead`]).
//!
//! | `model_type` | transformers class | features |
//! |---|---|---|
//! | `bert` (BERT, MiniLM) | `BertForSequenceClassification` | pooler: `tanh(W h[CLS] + b)` |
//! | `distilbert` | `DistilBertForSequenceClassification` | `h[0]` ([`super::distilbert`]) |
//! | `roberta`, `xlm-roberta` | `RobertaForSequenceClassification` | `h[<s>]` ([`super::roberta`]) |

use super::bert::{self, BertEncoder, TokenBatch};
use super::{distilbert, hf, roberta};
use candle_core::{Device, IndexOp, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::Path;

pub(crate) use super::kind::unknown_model_type;
pub use super::kind::{EncoderKind, MODEL_TYPES};

/// A `config.json` of the bert family, by architecture.
#[derive(Clone, Debug)]
pub enum EncoderConfig {
    /// `model_type: "bert"` (or none).
    Bert(candle_transformers::models::bert::Config),
    /// `model_type: "distilbert"`, as the BERT config of the same network.
    DistilBert(candle_transformers::models::bert::Config),
    /// `model_type: "roberta"` or `"xlm-roberta"`.
    Roberta(candle_transformers::models::xlm_roberta::Config),
}

impl EncoderConfig {
    /// Reads a `config.json` by its `model_type` (none: BERT); another type is refused with
    /// the file, the type and the types the family reads.
    pub fn read(path: &Path) -> Result<EncoderConfig> {
        match hf::model_type(path)?.as_deref() {
            None | Some("bert") => Ok(EncoderConfig::Bert(bert::read_config(path)?)),
            Some("distilbert") => Ok(EncoderConfig::DistilBert(distilbert::read_config(path)?)),
            Some("roberta" | "xlm-roberta") => Ok(EncoderConfig::Roberta(roberta::read_config(path)?)),
            Some(other) => Err(unknown_model_type(path, other)),
        }
    }

    /// The architecture.
    pub fn kind(&self) -> EncoderKind {
        match self {
            EncoderConfig::Bert(_) => EncoderKind::Bert,
            EncoderConfig::DistilBert(_) => EncoderKind::DistilBert,
            EncoderConfig::Roberta(_) => EncoderKind::Roberta,
        }
    }

    /// Width of the hidden states (what heads read).
    pub fn hidden_size(&self) -> usize {
        match self {
            EncoderConfig::Bert(c) | EncoderConfig::DistilBert(c) => c.hidden_size,
            EncoderConfig::Roberta(c) => c.hidden_size,
        }
    }

    /// The token id batches are padded with.
    pub fn pad_id(&self) -> u32 {
        match self {
            EncoderConfig::Bert(c) | EncoderConfig::DistilBert(c) => c.pad_token_id as u32,
            EncoderConfig::Roberta(c) => c.pad_token_id,
        }
    }

    /// The most tokens one input may have (the position embeddings there are).
    pub fn max_tokens(&self) -> usize {
        match self {
            EncoderConfig::Bert(c) | EncoderConfig::DistilBert(c) => c.max_position_embeddings,
            EncoderConfig::Roberta(c) => roberta::max_tokens(c),
        }
    }
}

enum Net {
    Bert(BertEncoder),
    DistilBert(BertEncoder),
    Roberta(roberta::RobertaEncoder),
}

/// An encoder of the bert family loaded from one checkpoint, giving the features its
/// architecture's classification head reads.
pub struct SequenceEncoder {
    net: Net,
    max_tokens: usize,
}

impl SequenceEncoder {
    /// Builds the encoder of `config` from `weights` (names as transformers saves them);
    /// `source` names the checkpoint in errors. A BERT checkpoint must have its pooler.
    pub fn load(
        config: &EncoderConfig,
        weights: HashMap<String, Tensor>,
        device: &Device,
        source: &Path,
    ) -> Result<SequenceEncoder> {
        let net = match config {
            EncoderConfig::Bert(c) => {
                let e = BertEncoder::load(c, weights, device, source)?;
                if !e.has_pooler() {
                    return Err(EngineError::evaluator(format!(
                        "'{}' has no pooler (pooler.dense.weight), which sequence classification reads; evaluate a BertForSequenceClassification checkpoint or its merge",
                        source.display()
                    )));
                }
                Net::Bert(e)
            }
            EncoderConfig::DistilBert(c) => {
                let renamed = distilbert::bert_weights(&weights, c, device, source)?;
                Net::DistilBert(BertEncoder::load(c, renamed, device, source)?)
            }
            EncoderConfig::Roberta(c) => Net::Roberta(roberta::RobertaEncoder::load(c, weights, device, source)?),
        };
        Ok(SequenceEncoder {
            net,
            max_tokens: config.max_tokens(),
        })
    }

    /// The architecture.
    pub fn kind(&self) -> EncoderKind {
        match self.net {
            Net::Bert(_) => EncoderKind::Bert,
            Net::DistilBert(_) => EncoderKind::DistilBert,
            Net::Roberta(_) => EncoderKind::Roberta,
        }
    }

    /// What the head reads, `[batch, hidden]`: BERT's pooled output, or the first token's last
    /// hidden state for DistilBERT and RoBERTa.
    pub fn features(&self, batch: &TokenBatch) -> Result<Tensor> {
        let len = batch.ids.dim(1)?;
        if len > self.max_tokens {
            return Err(EngineError::evaluator(format!(
                "an input of {len} tokens is longer than the model's {} positions; set [model] max_length = {} or less in the suite",
                self.max_tokens, self.max_tokens
            )));
        }
        match &self.net {
            Net::Bert(e) => e
                .pooled(batch)?
                .ok_or_else(|| EngineError::Bug("the pooler vanished after loading".into())),
            Net::DistilBert(e) => {
                // DistilBERT has no token types: the zero embedding for every token.
                let untyped = TokenBatch {
                    ids: batch.ids.clone(),
                    type_ids: batch.ids.zeros_like()?,
                    mask: batch.mask.clone(),
                };
                Ok(e.hidden_states(&untyped)?.i((.., 0))?)
            }
            Net::Roberta(e) => Ok(e.hidden_states(batch)?.i((.., 0))?),
        }
    }
}
