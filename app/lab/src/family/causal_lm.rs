//! Causal language models (`model_type` `llama`, `mistral` — Llama's architecture —, `qwen2`
//! and `gpt2`, see [`super::gpt2`]), run with candle-transformers, for what their evaluation
//! needs: the log-probability the model gives each token of a sequence after the ones before it
//! (multiple-choice log-likelihood, perplexity, next-token accuracy).

use super::gpt2::{self, Gpt2, Gpt2Config};
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
    /// GPT-2.
    Gpt2(Gpt2Config),
}

impl LmConfig {
    /// Layers of the model.
    fn layers(&self) -> usize {
        match self {
            LmConfig::Llama(c) => c.num_hidden_layers,
            LmConfig::Qwen2(c) => c.num_hidden_layers,
            LmConfig::Gpt2(c) => c.layers,
        }
    }

    /// Longest sequence the model takes.
    pub fn max_positions(&self) -> usize {
        match self {
            LmConfig::Llama(c) => c.max_position_embeddings,
            LmConfig::Qwen2(c) => c.max_position_embeddings,
            LmConfig::Gpt2(c) => c.positions,
        }
    }
}

/// Reads a causal LM's `config.json`, with newer transformers' `rope_parameters` and the
/// defaults older ones leave out; other model types are refused with the ones it reads.
pub fn read_config(path: &Path) -> Result<LmConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    let mut v: Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::evaluator(format!("'{}' is not JSON: {e}", path.display())))?;
    let Some(map) = v.as_object_mut() else {
        return Err(EngineError::evaluator(format!(
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
        EngineError::evaluator(format!(
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
        "gpt2" => Ok(LmConfig::Gpt2(gpt2::read_config(path, map)?)),
        other => Err(EngineError::evaluator(format!(
            "'{}' is a '{other}' model; the causal-lm family reads model_type llama, mistral, qwen2 and gpt2",
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
    /// Qwen2 (or a Llama loaded for gradients, see [`CausalLm::load_for_gradients`]): every
    /// position's hidden state in one pass, then the output head.
    Qwen2 {
        /// The decoder.
        model: Box<qwen2::Model>,
        /// The output head (tied to the embeddings when the checkpoint has none).
        lm_head: Linear,
    },
    /// GPT-2: every position's logits in one pass.
    Gpt2(Box<Gpt2>),
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
        if let LmConfig::Gpt2(c) = config {
            return Ok(CausalLm::Gpt2(Box::new(Gpt2::load(c, &weights, device, source)?)));
        }
        let missing: Vec<String> = (0..config.layers())
            .flat_map(|i| LAYER_TENSORS.iter().map(move |t| format!("model.layers.{i}.{t}")))
            .chain(["model.embed_tokens.weight".to_owned(), "model.norm.weight".to_owned()])
            .filter(|n| !weights.contains_key(n))
            .collect();
        if let Some(first) = missing.first() {
            return Err(EngineError::evaluator(format!(
                "'{}' lacks {} tensor(s) its config needs, e.g. '{first}': is it the model of this config (layers: {})?",
                source.display(),
                missing.len(),
                config.layers()
            )));
        }
        let bad = |e: candle_core::Error| {
            EngineError::evaluator(format!("'{}' does not match its config: {e}", source.display()))
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
                        EngineError::evaluator(format!(
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
            LmConfig::Gpt2(_) => Err(EngineError::Bug("GPT-2 is loaded above".into())),
        }
    }

    /// [`CausalLm::load`] for differentiating every position's log-probabilities: a Llama or
    /// Mistral without rope scaling runs as candle's Qwen2 (the same decoder, given zero
    /// attention biases) so that [`CausalLm::logits`] takes one pass, and its autograd graph
    /// holds one pass's activations rather than a key-value cache copied at every token.
    /// Llama 3's rope scaling, which only candle's Llama computes, keeps the stepped model.
    pub fn load_for_gradients(
        config: &LmConfig,
        mut weights: HashMap<String, Tensor>,
        device: &Device,
        source: &Path,
    ) -> Result<CausalLm> {
        let LmConfig::Llama(c) = config else {
            return Self::load(config, weights, device, source);
        };
        if c.rope_scaling
            .as_ref()
            .is_some_and(|r| !matches!(r.rope_type, llama::Llama3RopeType::Default))
        {
            return Self::load(config, weights, device, source);
        }
        let head_dim = c.hidden_size / c.num_attention_heads.max(1);
        for i in 0..c.num_hidden_layers {
            for (proj, heads) in [
                ("q_proj", c.num_attention_heads),
                ("k_proj", c.num_key_value_heads),
                ("v_proj", c.num_key_value_heads),
            ] {
                let name = format!("model.layers.{i}.self_attn.{proj}.bias");
                if let std::collections::hash_map::Entry::Vacant(e) = weights.entry(name) {
                    e.insert(Tensor::zeros(heads * head_dim, DType::F32, device)?);
                }
            }
        }
        let one_pass = qwen2::Config {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads: c.num_key_value_heads,
            max_position_embeddings: c.max_position_embeddings,
            // candle's Llama attends to every earlier position.
            sliding_window: c.max_position_embeddings.max(1 << 20),
            max_window_layers: 0,
            tie_word_embeddings: c.tie_word_embeddings,
            rope_theta: f64::from(c.rope_theta),
            rms_norm_eps: c.rms_norm_eps,
            use_sliding_window: false,
            hidden_act: candle_nn::Activation::Silu,
        };
        Self::load(&LmConfig::Qwen2(one_pass), weights, device, source)
    }

    /// The logits `[batch, len - first, vocab]` (f32) that positions `first..len` of `tokens`
    /// `[batch, len]` give for the token after them, in one differentiable pass (Qwen2, GPT-2,
    /// and Llamas from [`CausalLm::load_for_gradients`]) or stepped through the key-value cache from
    /// `first` on (candle's Llama gives the last position's logits only). Attention is causal,
    /// so sequences padded on the right score their own tokens as if alone. Tensors the model
    /// was built from that track gradients give logits that do.
    pub fn logits(&self, tokens: &Tensor, first: usize) -> Result<Tensor> {
        let (_, len) = tokens.dims2()?;
        if first >= len {
            return Err(EngineError::Bug(format!("logits from position {first} of {len}")));
        }
        match self {
            CausalLm::Llama { model, config, device } => {
                let mut cache = llama::Cache::new(true, DType::F32, config, device)?;
                let mut rows = Vec::with_capacity(len - first);
                rows.push(model.forward(&tokens.narrow(1, 0, first + 1)?, 0, &mut cache)?);
                for i in first + 1..len {
                    rows.push(model.forward(&tokens.narrow(1, i, 1)?, i, &mut cache)?);
                }
                Ok(Tensor::stack(&rows, 1)?)
            }
            CausalLm::Qwen2 { model, lm_head } => {
                // A copy (its tensors shared) with its own, fresh key-value cache.
                let mut model = (**model).clone();
                let hidden = model.forward(tokens, 0, None)?.narrow(1, first, len - first)?;
                Ok(lm_head.forward(&hidden)?.to_dtype(DType::F32)?)
            }
            CausalLm::Gpt2(model) => Ok(model.forward(tokens)?.narrow(1, first, len - first)?),
        }
    }

    /// For each position `i` in `from..tokens.len()` (`from` ≥ 1): the log-probability of
    /// `tokens[i]` after `tokens[..i]`, and whether it was the most likely token (from
    /// [`CausalLm::logits`]).
    pub fn score_tokens(&mut self, tokens: &[u32], from: usize) -> Result<Vec<(f64, bool)>> {
        if from == 0 || from > tokens.len() {
            return Err(EngineError::Bug(format!(
                "scoring from {from} of {} tokens",
                tokens.len()
            )));
        }
        if from == tokens.len() {
            return Ok(Vec::new());
        }
        let device = match self {
            CausalLm::Llama { device, .. } => device.clone(),
            CausalLm::Qwen2 { lm_head, .. } => lm_head.weight().device().clone(),
            CausalLm::Gpt2(model) => model.device().clone(),
        };
        // Position i - 1 predicts token i.
        let input = Tensor::new(&tokens[..tokens.len() - 1], &device)?.unsqueeze(0)?;
        let log_p = candle_nn::ops::log_softmax(&self.logits(&input, from - 1)?.squeeze(0)?, D::Minus1)?;
        let targets = Tensor::new(&tokens[from..], &device)?;
        let picked = log_p.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.to_vec1::<f32>()?;
        let best = log_p.argmax(D::Minus1)?.to_vec1::<u32>()?;
        Ok(picked
            .iter()
            .zip(&best)
            .zip(&tokens[from..])
            .map(|((lp, b), t)| (f64::from(*lp), b == t))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(arch: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/families/{arch}-tiny"))
    }

    /// A tiny Llama loaded for gradients (one pass, as Qwen2 with zero attention biases) gives
    /// the logits of candle's Llama stepped through its cache, for two sequences padded on the
    /// right, and the log-probabilities `score_tokens` reports.
    #[test]
    fn a_llama_in_one_pass_gives_the_stepped_logits() {
        let dir = fixture("llama");
        let dev = Device::Cpu;
        let config = read_config(&dir.join("config.json")).unwrap();
        let weights = hf::load_weights(&dir, &dev).unwrap();
        let mut stepped = CausalLm::load(&config, weights.clone(), &dev, &dir).unwrap();
        let one_pass = CausalLm::load_for_gradients(&config, weights, &dev, &dir).unwrap();
        assert!(matches!(stepped, CausalLm::Llama { .. }) && matches!(one_pass, CausalLm::Qwen2 { .. }));
        let seqs: [[u32; 7]; 2] = [[1, 5, 9, 3, 7, 2, 4], [1, 6, 8, 0, 0, 0, 0]];
        let tokens = Tensor::new(&seqs, &dev).unwrap();
        for first in [0, 3] {
            let a = stepped.logits(&tokens, first).unwrap();
            let b = one_pass.logits(&tokens, first).unwrap();
            assert_eq!(a.dims(), [2, 7 - first, 34]);
            let diff = crate::nn::max_abs_diff(&a, &b);
            println!("first {first}: max |Δ logit| {diff:.1e}");
            assert!(diff < 1e-4, "first {first}: max |Δ logit| {diff}");
        }
        let log_p = candle_nn::ops::log_softmax(&one_pass.logits(&tokens, 0).unwrap(), D::Minus1).unwrap();
        let want = stepped.score_tokens(&seqs[0], 1).unwrap();
        for (i, (lp, _)) in want.iter().enumerate() {
            let got = f64::from(
                log_p
                    .get(0)
                    .unwrap()
                    .get(i)
                    .unwrap()
                    .get(seqs[0][i + 1] as usize)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap(),
            );
            assert!((got - lp).abs() < 1e-5, "token {}: {got} vs {lp}", i + 1);
        }
    }
}
