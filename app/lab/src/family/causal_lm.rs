//! Causal language models (`model_type` `llama`, `mistral` — Llama's architecture — and
//! `qwen2`), run with candle-transformers, for what their evaluation needs: the log-probability
//! the model gives each token of a sequence after the ones before it (multiple-choice
//! log-likelihood, perplexity, next-token accuracy).

use super::hf;
use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Linear, Module};
use candle_transformers::models::{llama, qwen2};
use mergescope_engine::error::{EngineError, Result};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// A causal LM's settings, by architecture.
#[derive(Clone, Debug)]
pub enum LmConfig {
    /// Llama and Mistral.
    Llama(llama::Config),
    /// Qwen2 (Llama with biases on the attention projections).
    Qwen2(qwen2::Config),
}

impl LmConfig {
    /// Layers of the model.
    fn layers(&self) -> usize {
        match self {
            LmConfig::Llama(c) => c.num_hidden_layers,
            LmConfig::Qwen2(c) => c.num_hidden_layers,
        }
    }

    /// Longest sequence the model takes.
    pub fn max_positions(&self) -> usize {
        match self {
            LmConfig::Llama(c) => c.max_position_embeddings,
            LmConfig::Qwen2(c) => c.max_position_embeddings,
        }
    }
}

/// Reads a causal LM's `config.json`, with newer transformers' `rope_parameters` and the
/// defaults older ones leave out; other model types are refused with the ones it reads.
pub fn read_config(path: &Path) -> Result<LmConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    let mut v: Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::invalid(format!("'{}' is not JSON: {e}", path.display())))?;
    let Some(map) = v.as_object_mut() else {
        return Err(EngineError::invalid(format!(
            "'{}' is not a model config",
            path.display()
        )));
    };
    // transformers 5 moved rope_theta into rope_parameters.
    if map.get("rope_theta").is_none_or(Value::is_null)
        && let Some(theta) = map.get("rope_parameters").and_then(|r| r.get("rope_theta")).cloned()
    {
        map.insert("rope_theta".into(), theta);
    }
    let model_type = map
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let bad = |e: serde_json::Error| {
        EngineError::invalid(format!(
            "'{}' is not a {model_type} config this family reads: {e}",
            path.display()
        ))
    };
    match model_type.as_str() {
        "llama" | "mistral" => {
            for (k, d) in [("rope_theta", json!(10000.0)), ("max_position_embeddings", json!(4096))] {
                if map.get(k).is_none_or(Value::is_null) {
                    map.insert(k.into(), d);
                }
            }
            // Llama 3's rope scaling is read; other scalings are not computed by candle.
            if map
                .get("rope_scaling")
                .is_some_and(|r| r.get("rope_type").and_then(Value::as_str) != Some("llama3"))
            {
                map.insert("rope_scaling".into(), Value::Null);
            }
            let c: llama::LlamaConfig = serde_json::from_value(v).map_err(bad)?;
            Ok(LmConfig::Llama(c.into_config(false)))
        }
        "qwen2" => {
            let max = map
                .get("max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(32768);
            let sliding = map.get("use_sliding_window").and_then(Value::as_bool).unwrap_or(false);
            // candle's Qwen2 always masks beyond `sliding_window`: without a window, none.
            if !sliding || map.get("sliding_window").is_none_or(Value::is_null) {
                map.insert("sliding_window".into(), json!(max.max(1 << 20)));
            }
            for (k, d) in [
                ("max_window_layers", json!(0)),
                ("use_sliding_window", json!(false)),
                ("tie_word_embeddings", json!(false)),
                ("rope_theta", json!(10000.0)),
                ("hidden_act", json!("silu")),
                ("max_position_embeddings", json!(max)),
            ] {
                if map.get(k).is_none_or(Value::is_null) {
                    map.insert(k.into(), d);
                }
            }
            Ok(LmConfig::Qwen2(serde_json::from_value(v).map_err(bad)?))
        }
        other => Err(EngineError::invalid(format!(
            "'{}' is a '{other}' model; the causal-lm family reads model_type llama, mistral and qwen2",
            path.display()
        ))),
    }
}

/// A loaded causal LM.
pub enum CausalLm {
    /// Llama or Mistral, stepped one token at a time with its key-value cache (candle's Llama
    /// gives the logits of the last position only).
    Llama {
        /// The model.
        model: Box<llama::Llama>,
        /// Its settings (for fresh caches).
        config: Box<llama::Config>,
        /// Where it runs.
        device: Device,
    },
    /// Qwen2: every position's hidden state in one pass, then the output head.
    Qwen2 {
        /// The decoder.
        model: Box<qwen2::Model>,
        /// The output head (tied to the embeddings when the checkpoint has none).
        lm_head: Linear,
    },
}

/// The tensors every decoder layer must have (candle's Llama loader does not report a missing
/// one as an error).
const LAYER_TENSORS: &[&str] = &[
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
];

impl CausalLm {
    /// Builds the model of `config` from `weights` (Hugging Face names: `model.layers.N...`,
    /// `lm_head.weight`); `source` names the checkpoint in errors.
    pub fn load(
        config: &LmConfig,
        weights: HashMap<String, Tensor>,
        device: &Device,
        source: &Path,
    ) -> Result<CausalLm> {
        let missing: Vec<String> = (0..config.layers())
            .flat_map(|i| LAYER_TENSORS.iter().map(move |t| format!("model.layers.{i}.{t}")))
            .chain(["model.embed_tokens.weight".to_owned(), "model.norm.weight".to_owned()])
            .filter(|n| !weights.contains_key(n))
            .collect();
        if let Some(first) = missing.first() {
            return Err(EngineError::invalid(format!(
                "'{}' lacks {} tensor(s) its config needs, e.g. '{first}': is it the model of this config (layers: {})?",
                source.display(),
                missing.len(),
                config.layers()
            )));
        }
        let bad = |e: candle_core::Error| {
            EngineError::invalid(format!("'{}' does not match its config: {e}", source.display()))
        };
        match config {
            LmConfig::Llama(c) => {
                let mut c = c.clone();
                if !weights.contains_key("lm_head.weight") {
                    c.tie_word_embeddings = true;
                }
                let vb = hf::var_builder(weights, device);
                // The tensors were checked above; a panic here would be a shape mismatch.
                let model = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| llama::Llama::load(vb, &c)))
                    .map_err(|_| {
                        EngineError::invalid(format!(
                            "'{}': a tensor's shape does not match its config",
                            source.display()
                        ))
                    })?
                    .map_err(bad)?;
                Ok(CausalLm::Llama {
                    model: Box::new(model),
                    config: Box::new(c),
                    device: device.clone(),
                })
            }
            LmConfig::Qwen2(c) => {
                let head = weights
                    .get("lm_head.weight")
                    .or_else(|| weights.get("model.embed_tokens.weight"))
                    .cloned()
                    .ok_or_else(|| EngineError::Bug("the embeddings were checked".into()))?;
                let vb = hf::var_builder(weights, device);
                let model = qwen2::Model::new(c, vb).map_err(bad)?;
                Ok(CausalLm::Qwen2 {
                    model: Box::new(model),
                    lm_head: Linear::new(head, None),
                })
            }
        }
    }

    /// For each position `i` in `from..tokens.len()` (`from` ≥ 1): the log-probability of
    /// `tokens[i]` after `tokens[..i]`, and whether it was the most likely token.
    pub fn score_tokens(&mut self, tokens: &[u32], from: usize) -> Result<Vec<(f64, bool)>> {
        if from == 0 || from > tokens.len() {
            return Err(EngineError::Bug(format!(
                "scoring from {from} of {} tokens",
                tokens.len()
            )));
        }
        let pick = |row: &Tensor, target: u32| -> Result<(f64, bool)> {
            let lp = candle_nn::ops::log_softmax(&row.to_dtype(DType::F32)?, D::Minus1)?.to_vec1::<f32>()?;
            let best = lp
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |b, (i, v)| if *v > b.1 { (i, *v) } else { b })
                .0;
            Ok((f64::from(lp[target as usize]), best == target as usize))
        };
        let mut out = Vec::with_capacity(tokens.len() - from);
        match self {
            CausalLm::Llama { model, config, device } => {
                let mut cache = llama::Cache::new(true, DType::F32, config, device)?;
                let input = Tensor::new(&tokens[..from], device)?.unsqueeze(0)?;
                let mut logits = model.forward(&input, 0, &mut cache)?;
                for i in from..tokens.len() {
                    out.push(pick(&logits.squeeze(0)?, tokens[i])?);
                    if i + 1 < tokens.len() {
                        let next = Tensor::new(&tokens[i..i + 1], device)?.unsqueeze(0)?;
                        logits = model.forward(&next, i, &mut cache)?;
                    }
                }
            }
            CausalLm::Qwen2 { model, lm_head } => {
                let input = Tensor::new(tokens, lm_head.weight().device())?.unsqueeze(0)?;
                let hidden = model.forward(&input, 0, None);
                model.clear_kv_cache();
                let logits = lm_head.forward(&hidden?.squeeze(0)?)?;
                for (i, t) in tokens.iter().enumerate().skip(from) {
                    out.push(pick(&logits.get(i - 1)?, *t)?);
                }
            }
        }
        Ok(out)
    }
}
