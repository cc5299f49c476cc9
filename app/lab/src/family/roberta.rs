//! RoBERTa and XLM-RoBERTa (`model_type: "roberta"`, `"xlm-roberta"`: one architecture) in the
//! bert family, computed as transformers' `RobertaForSequenceClassification` does: encoder,
//! the `<s>` token's hidden state, `classifier.dense`, tanh, `classifier.out_proj` (the head is
//! [`super::head::ClassifierHead`]).
//!
//! The encoder is candle-transformers' `models::xlm_roberta::XLMRobertaModel`, which computes
//! positions as transformers' `create_position_ids_from_input_ids` does (`padding_idx + 1`
//! onwards over tokens, `padding_idx` at padding) and masks padded keys additively with the f32
//! minimum, as transformers does. RoBERTa's tokenizers give no token types (transformers feeds
//! zeros), so [`RobertaEncoder::hidden_states`] passes zeros whatever the tokenizer returned.

use super::bert::TokenBatch;
use super::hf;
use candle_core::{Device, Tensor};
use candle_transformers::models::xlm_roberta::{Config, XLMRobertaModel};
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::Path;

/// Keys of a RoBERTa `config.json` that transformers fills in when they are absent.
fn config_defaults() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("hidden_act", json!("gelu")),
        ("hidden_dropout_prob", json!(0.1)),
        ("attention_probs_dropout_prob", json!(0.1)),
        ("max_position_embeddings", json!(512)),
        ("type_vocab_size", json!(2)),
        ("layer_norm_eps", json!(1e-12)),
        ("pad_token_id", json!(1)),
        ("position_embedding_type", json!("absolute")),
    ]
}

/// Reads a RoBERTa or XLM-RoBERTa `config.json`; only absolute position embeddings are run.
pub fn read_config(path: &Path) -> Result<Config> {
    let c: Config = hf::read_config(path, &config_defaults())?;
    if c.position_embedding_type != "absolute" {
        return Err(EngineError::evaluator(format!(
            "'{}': position_embedding_type {:?} is not run by this version; RoBERTa models with \"absolute\" positions are",
            path.display(),
            c.position_embedding_type
        )));
    }
    Ok(c)
}

/// The most tokens a RoBERTa input may have: positions start at `pad_token_id + 1`.
pub fn max_tokens(config: &Config) -> usize {
    config
        .max_position_embeddings
        .saturating_sub(config.pad_token_id as usize + 1)
}

/// A RoBERTa encoder loaded from one checkpoint's weights.
pub struct RobertaEncoder {
    model: XLMRobertaModel,
}

impl RobertaEncoder {
    /// Builds the encoder of `config` from `weights` (names as transformers saves them, with or
    /// without the `roberta.` prefix of the task models); `source` names the checkpoint in errors.
    pub fn load(config: &Config, weights: HashMap<String, Tensor>, device: &Device, source: &Path) -> Result<Self> {
        let prefixed = weights.contains_key("roberta.embeddings.word_embeddings.weight");
        let vb = hf::var_builder(weights, device);
        let vb = if prefixed { vb.pp("roberta") } else { vb };
        let model = XLMRobertaModel::new(config, vb).map_err(|e| {
            EngineError::evaluator(format!(
                "'{}' is not a RoBERTa encoder of its config (hidden {}, {} layers): {e}",
                source.display(),
                config.hidden_size,
                config.num_hidden_layers
            ))
        })?;
        Ok(RobertaEncoder { model })
    }

    /// The last hidden states, `[batch, length, hidden]` (token types all zero).
    pub fn hidden_states(&self, batch: &TokenBatch) -> Result<Tensor> {
        let types = batch.ids.zeros_like()?;
        Ok(self.model.forward(&batch.ids, &batch.mask, &types, None, None, None)?)
    }
}
