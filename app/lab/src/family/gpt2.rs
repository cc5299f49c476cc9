//! GPT-2 (`model_type` `gpt2`) in the causal-lm family, run on candle-transformers' Whisper
//! text decoder (`models::whisper::model::TextDecoder`) with GPT-2's tensors under Whisper's
//! names.
//!
//! candle-transformers 0.11.1 has no GPT-2, and its GPTBigCode (`models::bigcode`), GPT-2's
//! architecture with multi-query attention, cannot run GPT-2's multi-head attention: with
//! `multi_query: false` it reshapes the packed projections to `[.., hidden, 3 × head_dim]`
//! (hidden where transformers has heads), which fails for every batch size, and it returns the
//! last position's logits only. Whisper's decoder is GPT-2's network: learned absolute
//! positions, pre-norm blocks (LayerNorm eps 1e-5), causal multi-head attention scaled by
//! 1/√head_dim, an MLP of 4 × hidden with `Tensor::gelu` (the tanh approximation, GPT-2's
//! `gelu_new`) and a final LayerNorm; the output head is a linear layer over the final
//! hidden states (the token embeddings when tied). Two differences are removed exactly:
//! - each block's cross-attention gets all-zero weights (one shared zero tensor) and a
//!   one-position zero encoder output, so it adds exactly zero to the residual stream;
//! - Whisper's key projection has no bias: the key part of GPT-2's `c_attn.bias` adds the
//!   same `q · b` to every score of a query, which the softmax cancels, so it is dropped (its
//!   gradient is zero in GPT-2 too).
//!
//! GPT-2's `Conv1D` weights are stored `[in, out]`; they are handed over transposed (views of
//! the same tensors, so gradients reach them; the packed `c_attn` is split into copies).
//! The `attn.bias` / `attn.masked_bias` buffers of older checkpoints are not read.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Linear, Module};
use candle_transformers::models::whisper::{self, model::TextDecoder};
use mergescope_engine::error::{EngineError, Result};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

/// A GPT-2 model's settings, from its `config.json`.
#[derive(Clone, Debug)]
pub struct Gpt2Config {
    /// Tokens in the vocabulary (`vocab_size`).
    pub vocab_size: usize,
    /// Hidden size (`n_embd`).
    pub hidden: usize,
    /// Blocks (`n_layer`).
    pub layers: usize,
    /// Attention heads (`n_head`).
    pub heads: usize,
    /// Learned positions, the longest sequence (`n_positions`).
    pub positions: usize,
    /// Whether the output head is the token embeddings (`tie_word_embeddings`).
    pub tied: bool,
}

/// Reads the GPT-2 keys of `config.json` (`path`, parsed as `map`) with transformers'
/// defaults; options this network does not compute are refused, naming the key and what runs.
pub fn read_config(path: &Path, map: &Map<String, Value>) -> Result<Gpt2Config> {
    let file = path.display();
    let get = |key: &str| map.get(key).filter(|v| !v.is_null());
    let size = |key: &str, default: usize| -> Result<usize> {
        match get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .filter(|n| *n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| EngineError::evaluator(format!("'{file}': {key} = {v} is not a positive integer"))),
        }
    };
    let flag = |key: &str, default: bool| -> Result<bool> {
        match get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| EngineError::evaluator(format!("'{file}': {key} = {v} is not true or false"))),
        }
    };
    let hidden = size("n_embd", 768)?;
    let heads = size("n_head", 12)?;
    let c = Gpt2Config {
        vocab_size: size("vocab_size", 50257)?,
        hidden,
        layers: size("n_layer", 12)?,
        heads,
        positions: size("n_positions", size("n_ctx", 1024)?)?,
        tied: flag("tie_word_embeddings", true)?,
    };
    let refuse = |key: &str, v: &Value, runs: &str| {
        Err(EngineError::evaluator(format!(
            "'{file}': GPT-2 {key} = {v} is not supported; the causal-lm family runs GPT-2 with {runs}"
        )))
    };
    if hidden % heads != 0 {
        return Err(EngineError::evaluator(format!(
            "'{file}': n_embd = {hidden} is not a multiple of n_head = {heads}"
        )));
    }
    if let Some(v) = get("activation_function")
        && !matches!(v.as_str(), Some("gelu_new" | "gelu_pytorch_tanh"))
    {
        return refuse(
            "activation_function",
            v,
            "activation_function \"gelu_new\" (or \"gelu_pytorch_tanh\")",
        );
    }
    if let Some(v) = get("layer_norm_epsilon")
        && v.as_f64() != Some(1e-5)
    {
        return refuse("layer_norm_epsilon", v, "layer_norm_epsilon 1e-5");
    }
    if let Some(v) = get("n_inner")
        && v.as_u64() != Some(4 * hidden as u64)
    {
        return refuse("n_inner", v, "n_inner null (4 × n_embd)");
    }
    if flag("scale_attn_by_inverse_layer_idx", false)? {
        return refuse("scale_attn_by_inverse_layer_idx", &Value::Bool(true), "it false");
    }
    if !flag("scale_attn_weights", true)? {
        return refuse("scale_attn_weights", &Value::Bool(false), "it true");
    }
    // `reorder_and_upcast_attn` computes the same scores in float32, as this family does.
    flag("reorder_and_upcast_attn", false)?;
    Ok(c)
}

/// A loaded GPT-2: Whisper's text decoder and the output head.
#[derive(Clone)]
pub struct Gpt2 {
    decoder: TextDecoder,
    lm_head: Linear,
    hidden: usize,
    device: Device,
}

/// The names of GPT-2's tensors, within `transformer.` (`GPT2LMHeadModel`) or not (`GPT2Model`).
struct Names<'a> {
    weights: &'a HashMap<String, Tensor>,
    prefix: &'static str,
    source: &'a Path,
    layers: usize,
}

impl Names<'_> {
    fn get(&self, name: &str) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        self.weights.get(&full).cloned().ok_or_else(|| {
            EngineError::evaluator(format!(
                "'{}' has no tensor '{full}', which a GPT-2 of its config ({} layers) has; is it the model of this config?",
                self.source.display(),
                self.layers
            ))
        })
    }
}

impl Gpt2 {
    /// Builds the model of `config` from `weights` (transformers' names, with or without
    /// `transformer.`; `lm_head.weight` only when the head is not tied); `source` names the
    /// checkpoint in errors.
    pub fn load(
        config: &Gpt2Config,
        weights: &HashMap<String, Tensor>,
        device: &Device,
        source: &Path,
    ) -> Result<Gpt2> {
        let names = Names {
            weights,
            prefix: if weights.contains_key("transformer.wte.weight") {
                "transformer."
            } else {
                ""
            },
            source,
            layers: config.layers,
        };
        let d = config.hidden;
        let bad = |e: candle_core::Error| {
            EngineError::evaluator(format!("'{}' does not match its GPT-2 config: {e}", source.display()))
        };
        let shaped = |t: Tensor, dims: &[usize], name: &str| -> Result<Tensor> {
            if t.dims() == dims {
                Ok(t)
            } else {
                Err(EngineError::evaluator(format!(
                    "'{}': tensor '{}{name}' is {:?}, its config makes it {dims:?}",
                    source.display(),
                    names.prefix,
                    t.dims()
                )))
            }
        };
        let wte = shaped(names.get("wte.weight")?, &[config.vocab_size, d], "wte.weight")?;
        let mut w: HashMap<String, Tensor> = HashMap::new();
        let zeros_dd = Tensor::zeros((d, d), DType::F32, device)?;
        let zeros_d = Tensor::zeros(d, DType::F32, device)?;
        let dec = "model.decoder";
        w.insert(format!("{dec}.embed_tokens.weight"), wte.clone());
        w.insert(
            format!("{dec}.embed_positions.weight"),
            shaped(names.get("wpe.weight")?, &[config.positions, d], "wpe.weight")?,
        );
        for p in ["weight", "bias"] {
            w.insert(format!("{dec}.layer_norm.{p}"), names.get(&format!("ln_f.{p}"))?);
        }
        for i in 0..config.layers {
            let h = format!("h.{i}");
            let at = format!("{dec}.layers.{i}");
            let conv = |name: &str, inp: usize, out: usize| -> Result<(Tensor, Tensor)> {
                let wn = format!("{h}.{name}.weight");
                let bn = format!("{h}.{name}.bias");
                Ok((
                    shaped(names.get(&wn)?, &[inp, out], &wn)?,
                    shaped(names.get(&bn)?, &[out], &bn)?,
                ))
            };
            let (qkv_w, qkv_b) = conv("attn.c_attn", d, 3 * d)?;
            for (k, proj) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                let weight = qkv_w.narrow(1, k * d, d)?.contiguous()?.t()?;
                w.insert(format!("{at}.self_attn.{proj}.weight"), weight);
                if *proj != "k_proj" {
                    w.insert(format!("{at}.self_attn.{proj}.bias"), qkv_b.narrow(0, k * d, d)?);
                }
            }
            for (gpt2, whisper, inp, out) in [
                ("attn.c_proj", "self_attn.out_proj", d, d),
                ("mlp.c_fc", "fc1", d, 4 * d),
                ("mlp.c_proj", "fc2", 4 * d, d),
            ] {
                let (weight, bias) = conv(gpt2, inp, out)?;
                w.insert(format!("{at}.{whisper}.weight"), weight.t()?);
                w.insert(format!("{at}.{whisper}.bias"), bias);
            }
            for (gpt2, whisper) in [("ln_1", "self_attn_layer_norm"), ("ln_2", "final_layer_norm")] {
                for p in ["weight", "bias"] {
                    w.insert(format!("{at}.{whisper}.{p}"), names.get(&format!("{h}.{gpt2}.{p}"))?);
                }
            }
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                w.insert(format!("{at}.encoder_attn.{proj}.weight"), zeros_dd.clone());
                w.insert(format!("{at}.encoder_attn.{proj}.bias"), zeros_d.clone());
            }
            w.insert(format!("{at}.encoder_attn_layer_norm.weight"), zeros_d.clone());
            w.insert(format!("{at}.encoder_attn_layer_norm.bias"), zeros_d.clone());
        }
        // Whisper's audio encoder, loaded with the decoder and never run: no layers, zeros.
        let enc = "model.encoder";
        w.insert(
            format!("{enc}.conv1.weight"),
            Tensor::zeros((d, 1, 3), DType::F32, device)?,
        );
        w.insert(
            format!("{enc}.conv2.weight"),
            Tensor::zeros((d, d, 3), DType::F32, device)?,
        );
        for name in ["conv1.bias", "conv2.bias", "layer_norm.weight", "layer_norm.bias"] {
            w.insert(format!("{enc}.{name}"), zeros_d.clone());
        }
        let head = if config.tied {
            wte
        } else {
            let t = weights.get("lm_head.weight").cloned().ok_or_else(|| {
                EngineError::evaluator(format!(
                    "'{}' has no 'lm_head.weight', which its config's tie_word_embeddings = false asks for",
                    source.display()
                ))
            })?;
            shaped(t, &[config.vocab_size, d], "lm_head.weight")?
        };
        let whisper_config = whisper::Config {
            num_mel_bins: 1,
            max_source_positions: 1,
            d_model: d,
            encoder_attention_heads: config.heads,
            encoder_layers: 0,
            vocab_size: config.vocab_size,
            max_target_positions: config.positions,
            decoder_attention_heads: config.heads,
            decoder_layers: config.layers,
            suppress_tokens: Vec::new(),
        };
        let vb = super::hf::var_builder(w, device);
        let model = whisper::model::Whisper::load(&vb, whisper_config).map_err(bad)?;
        Ok(Gpt2 {
            decoder: model.decoder,
            lm_head: Linear::new(head, None),
            hidden: d,
            device: device.clone(),
        })
    }

    /// The logits `[batch, len, vocab]` of every position of `tokens` `[batch, len]` (causal:
    /// sequences padded on the right score their own tokens as if alone), differentiable.
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let (batch, _) = tokens.dims2()?;
        // A copy (tensors shared) whose cross-attention caches nothing between calls.
        let mut decoder = self.decoder.clone();
        let encoder_out = Tensor::zeros((batch, 1, self.hidden), DType::F32, &self.device)?;
        let hidden = decoder.forward(tokens, &encoder_out, true)?;
        Ok(self.lm_head.forward(&hidden)?)
    }

    /// Where it runs.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::hf;
    use std::path::PathBuf;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/gpt2-tiny")
    }

    fn config_with(edit: &[(&str, Value)]) -> (tempfile::TempDir, PathBuf, Map<String, Value>) {
        let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
        let mut map: Map<String, Value> = serde_json::from_str(&text).unwrap();
        for (k, v) in edit {
            map.insert((*k).to_owned(), v.clone());
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        (dir, path, map)
    }

    /// Options the network does not compute are refused with the file, the key and what runs.
    #[test]
    fn unsupported_options_name_the_file_and_key() {
        use serde_json::json;
        for (key, value, runs) in [
            ("scale_attn_by_inverse_layer_idx", json!(true), "false"),
            ("scale_attn_weights", json!(false), "true"),
            ("activation_function", json!("relu"), "gelu_new"),
            ("layer_norm_epsilon", json!(1e-6), "1e-5"),
            ("n_inner", json!(100), "4 × n_embd"),
        ] {
            let (_dir, path, map) = config_with(&[(key, value)]);
            let e = read_config(&path, &map).unwrap_err().to_string();
            assert!(e.contains("config.json") && e.contains(key) && e.contains(runs), "{e}");
        }
        let (_dir, path, map) = config_with(&[("reorder_and_upcast_attn", json!(true))]);
        let c = read_config(&path, &map).unwrap();
        assert_eq!(
            (c.hidden, c.layers, c.heads, c.positions, c.vocab_size),
            (32, 2, 4, 64, 300)
        );
    }

    /// A checkpoint saved without `transformer.` (GPT2Model) loads; one lacking a block's
    /// tensor is refused with that tensor's name; an untied head is read from `lm_head.weight`.
    #[test]
    fn prefixes_and_missing_tensors() {
        let dir = fixture();
        let (_d, path, map) = config_with(&[]);
        let config = read_config(&path, &map).unwrap();
        let weights = hf::load_weights(&dir, &Device::Cpu).unwrap();
        let bare: HashMap<String, Tensor> = weights
            .iter()
            .map(|(k, t)| (k.trim_start_matches("transformer.").to_owned(), t.clone()))
            .collect();
        let tokens = Tensor::new(&[[5u32, 9, 3]], &Device::Cpu).unwrap();
        let logits = |c: &Gpt2Config, w: &HashMap<String, Tensor>| {
            Gpt2::load(c, w, &Device::Cpu, &dir).unwrap().forward(&tokens).unwrap()
        };
        let max_diff = crate::nn::max_abs_diff;
        let a = logits(&config, &weights);
        assert_eq!(max_diff(&a, &logits(&config, &bare)), 0.0);
        let mut broken = weights.clone();
        broken.remove("transformer.h.1.mlp.c_fc.bias");
        let e = Gpt2::load(&config, &broken, &Device::Cpu, &dir)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("transformer.h.1.mlp.c_fc.bias"), "{e}");
        // An untied head is `lm_head.weight`, which must then be there.
        let untied = Gpt2Config { tied: false, ..config };
        let e = Gpt2::load(&untied, &weights, &Device::Cpu, &dir)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("lm_head.weight") && e.contains("tie_word_embeddings"), "{e}");
        let mut with_head = weights.clone();
        let doubled = (&weights["transformer.wte.weight"] * 2.0).unwrap();
        with_head.insert("lm_head.weight".into(), doubled);
        let twice = (&a * 2.0).unwrap();
        assert!(max_diff(&logits(&untied, &with_head), &twice) < 1e-5);
    }
}
