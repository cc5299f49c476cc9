//! BERT (`model_type: "bert"`: BERT, MiniLM and their fine-tunes) for sequence
//! classification, computed as transformers' `BertForSequenceClassification` does: the
//! candle-transformers encoder, the pooler (tanh of a linear map of the first token's hidden
//! state) and a per-task linear head; and what the whole bert family shares: tokenising
//! ([`encode`]) and the heads ([`ClassifierHead`]). The family's other model types
//! (`distilbert`, `roberta`, `xlm-roberta`) are read through [`super::encoder`].
//!
//! The network itself is `bert::net` (candle-transformers' `BertModel`, op for op), whose
//! layers' linear maps take one parameter, [`Linears`]: as loaded, or frozen with LoRA's
//! low-rank side paths (`bert::lowrank`), which the text benchmark's LoRA experts train through.

use super::hf;
use candle_core::{D, DType, Device, IndexOp, Tensor};
use candle_nn::{Linear, Module};
use candle_transformers::models::bert::Config;
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::Path;
use tokenizers::{EncodeInput, Tokenizer};

pub use super::head::{ClassifierHead, HEAD_BIAS, HEAD_WEIGHT};
pub use lowrank::{Linears, SidePath};

mod lowrank;
mod net;

/// Keys of a BERT `config.json` that transformers fills in when they are absent.
fn config_defaults() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("hidden_act", json!("gelu")),
        ("hidden_dropout_prob", json!(0.1)),
        ("max_position_embeddings", json!(512)),
        ("type_vocab_size", json!(2)),
        ("initializer_range", json!(0.02)),
        ("layer_norm_eps", json!(1e-12)),
        ("pad_token_id", json!(0)),
        ("model_type", json!("bert")),
    ]
}

/// Reads a BERT `config.json`; another model type is refused with the types the family reads
/// ([`super::encoder::EncoderConfig::read`] reads them all).
pub fn read_config(path: &Path) -> Result<Config> {
    if let Some(t) = hf::model_type(path)?
        && t != "bert"
    {
        return Err(super::kind::unknown_model_type(path, &t));
    }
    hf::read_config(path, &config_defaults())
}

/// A padded batch of token ids, token types and attention mask (`[batch, length]`, u32).
pub struct TokenBatch {
    /// Token ids, padded with the pad id.
    pub ids: Tensor,
    /// Segment ids (0 for the first sentence, 1 for the second).
    pub type_ids: Tensor,
    /// 1 for tokens, 0 for padding.
    pub mask: Tensor,
}

/// Tokenises `(text, pair)` inputs with the model's tokenizer (special tokens added,
/// truncated as the tokenizer says) and pads them to the longest with `pad_id`.
pub fn encode<'a>(
    tokenizer: &Tokenizer,
    inputs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    pad_id: u32,
    device: &Device,
) -> Result<TokenBatch> {
    let inputs: Vec<EncodeInput> = inputs
        .into_iter()
        .map(|(a, b)| match b {
            Some(b) => (a, b).into(),
            None => a.into(),
        })
        .collect();
    let n = inputs.len();
    let encodings = tokenizer
        .encode_batch(inputs, true)
        .map_err(|e| EngineError::evaluator(format!("the tokenizer failed: {e}")))?;
    let len = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
    let (mut ids, mut types, mut mask) = (vec![pad_id; n * len], vec![0u32; n * len], vec![0u32; n * len]);
    for (row, e) in encodings.iter().enumerate() {
        let at = row * len;
        let k = e.get_ids().len();
        ids[at..at + k].copy_from_slice(e.get_ids());
        types[at..at + k].copy_from_slice(e.get_type_ids());
        mask[at..at + k].copy_from_slice(e.get_attention_mask());
    }
    Ok(TokenBatch {
        ids: Tensor::from_vec(ids, (n, len), device)?,
        type_ids: Tensor::from_vec(types, (n, len), device)?,
        mask: Tensor::from_vec(mask, (n, len), device)?,
    })
}

/// A BERT encoder with its pooler, loaded from one checkpoint's weights.
pub struct BertEncoder {
    encoder: net::BertNet,
    pooler: Option<Linear>,
}

impl BertEncoder {
    /// Builds the encoder of `config` from `weights` (names as transformers saves them, with or
    /// without the `bert.` prefix of the task models); `source` names the checkpoint in errors.
    pub fn load(config: &Config, weights: HashMap<String, Tensor>, device: &Device, source: &Path) -> Result<Self> {
        Self::load_with(config, weights, &Linears::AsLoaded, device, source)
    }

    /// [`BertEncoder::load`] with the layers' linear maps computed as `linears` says (frozen,
    /// with low-rank side paths, for LoRA training); the pooler is always as loaded.
    pub fn load_with(
        config: &Config,
        weights: HashMap<String, Tensor>,
        linears: &Linears,
        device: &Device,
        source: &Path,
    ) -> Result<Self> {
        let prefix = if weights.contains_key("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let pooler = match (
            weights.get(&format!("{prefix}pooler.dense.weight")),
            weights.get(&format!("{prefix}pooler.dense.bias")),
        ) {
            (Some(w), Some(b)) => Some(Linear::new(w.clone(), Some(b.clone()))),
            _ => None,
        };
        let vb = hf::var_builder(weights, device);
        let encoder = net::BertNet::load(vb, config, linears).map_err(|e| {
            EngineError::evaluator(format!(
                "'{}' is not a BERT encoder of its config (hidden {}, {} layers): {e}",
                source.display(),
                config.hidden_size,
                config.num_hidden_layers
            ))
        })?;
        Ok(BertEncoder { encoder, pooler })
    }

    /// The last hidden states, `[batch, length, hidden]`.
    pub fn hidden_states(&self, batch: &TokenBatch) -> Result<Tensor> {
        Ok(self.encoder.forward(&batch.ids, &batch.type_ids, Some(&batch.mask))?)
    }

    /// The pooled representation `tanh(W h[CLS] + b)`, `[batch, hidden]`; `None` when the
    /// checkpoint has no pooler (sentence-embedding models).
    pub fn pooled(&self, batch: &TokenBatch) -> Result<Option<Tensor>> {
        let Some(pooler) = &self.pooler else {
            return Ok(None);
        };
        let first = self.hidden_states(batch)?.i((.., 0))?;
        // cuBLAS multiplies only row-contiguous operands (the first tokens are every length-th
        // row); the CPU's matmul reads the strided view as it is, with the same bits as ever.
        let first = if first.device().is_cpu() {
            first
        } else {
            first.contiguous()?
        };
        Ok(Some(pooler.forward(&first)?.tanh()?))
    }

    /// Mean of the hidden states over the attention mask, `[batch, hidden]` (the
    /// sentence-transformers pooling).
    pub fn mean_pooled(&self, batch: &TokenBatch) -> Result<Tensor> {
        let h = self.hidden_states(batch)?;
        let m = batch.mask.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?;
        let sum = h.broadcast_mul(&m)?.sum(1)?;
        let count = m.sum(1)?.clamp(1e-9, f64::MAX)?;
        Ok(sum.broadcast_div(&count)?)
    }

    /// True when the checkpoint has a pooler, which classification needs.
    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }
}
