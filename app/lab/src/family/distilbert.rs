//! DistilBERT (`model_type: "distilbert"`) in the bert family, computed as transformers'
//! `DistilBertForSequenceClassification` does: encoder, first token's hidden state,
//! `pre_classifier`, ReLU, `classifier` (the head is [`super::head::ClassifierHead`]).
//!
//! The encoder runs on the BERT network ([`super::bert`], computed op for op as candle-transformers'
//! `models::bert::BertModel`) with the DistilBERT tensors under BERT's names, not on
//! `models::distilbert`: candle 0.11.1's
//! DistilBERT applies `Tensor::gelu`, the tanh approximation, where transformers applies
//! DistilBERT's `activation: "gelu"` as the exact (erf) GELU, which candle's BERT network does.
//! A DistilBERT block is a BERT layer without token types or pooler (post-norm attention with
//! `sa_layer_norm`, post-norm feed-forward with `output_layer_norm`, every LayerNorm at
//! eps 1e-12, positions 0..n), so the renaming below is exact; token types are a single zero
//! embedding.

use super::hf;
use candle_core::{Device, Tensor};
use candle_transformers::models::bert::{Config, HiddenAct, PositionEmbeddingType};
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::Path;

/// A DistilBERT `config.json`, as transformers' `DistilBertConfig` names its keys.
#[derive(serde::Deserialize)]
struct DistilBertConfig {
    vocab_size: usize,
    dim: usize,
    n_layers: usize,
    n_heads: usize,
    hidden_dim: usize,
    activation: String,
    max_position_embeddings: usize,
    dropout: f64,
    pad_token_id: usize,
}

/// Keys of a DistilBERT `config.json` that transformers fills in when they are absent.
fn config_defaults() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("vocab_size", json!(30522)),
        ("dim", json!(768)),
        ("n_layers", json!(6)),
        ("n_heads", json!(12)),
        ("hidden_dim", json!(3072)),
        ("activation", json!("gelu")),
        ("max_position_embeddings", json!(512)),
        ("dropout", json!(0.1)),
        ("pad_token_id", json!(0)),
    ]
}

/// LayerNorm epsilon of every DistilBERT norm (fixed in transformers, not in the config).
const LAYER_NORM_EPS: f64 = 1e-12;

/// Reads a DistilBERT `config.json` as the BERT config of the same network.
pub fn read_config(path: &Path) -> Result<Config> {
    let c: DistilBertConfig = hf::read_config(path, &config_defaults())?;
    let hidden_act = match c.activation.as_str() {
        "gelu" => HiddenAct::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => HiddenAct::GeluApproximate,
        "relu" => HiddenAct::Relu,
        other => {
            return Err(EngineError::evaluator(format!(
                "'{}': DistilBERT activation {other:?} is not one this version runs; it runs \"gelu\", \"gelu_new\" and \"relu\"",
                path.display()
            )));
        }
    };
    Ok(Config {
        vocab_size: c.vocab_size,
        hidden_size: c.dim,
        num_hidden_layers: c.n_layers,
        num_attention_heads: c.n_heads,
        intermediate_size: c.hidden_dim,
        hidden_act,
        hidden_dropout_prob: c.dropout,
        max_position_embeddings: c.max_position_embeddings,
        type_vocab_size: 1,
        initializer_range: 0.02,
        layer_norm_eps: LAYER_NORM_EPS,
        pad_token_id: c.pad_token_id,
        position_embedding_type: PositionEmbeddingType::Absolute,
        use_cache: false,
        classifier_dropout: None,
        model_type: None,
    })
}

/// DistilBERT's names within a layer and BERT's for the same tensor (each with `.weight` and
/// `.bias`).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attention.q_lin", "attention.self.query"),
    ("attention.k_lin", "attention.self.key"),
    ("attention.v_lin", "attention.self.value"),
    ("attention.out_lin", "attention.output.dense"),
    ("sa_layer_norm", "attention.output.LayerNorm"),
    ("ffn.lin1", "intermediate.dense"),
    ("ffn.lin2", "output.dense"),
    ("output_layer_norm", "output.LayerNorm"),
];

/// The encoder tensors of a DistilBERT checkpoint (with or without the `distilbert.` prefix of
/// the task models) under the names of candle-transformers' BERT network, plus a zero
/// token-type embedding. The tensors are the same (shared, not copied), so gradients taken
/// through the BERT network reach the DistilBERT weights. A missing tensor is named as
/// DistilBERT names it.
pub fn bert_weights(
    weights: &HashMap<String, Tensor>,
    config: &Config,
    device: &Device,
    source: &Path,
) -> Result<HashMap<String, Tensor>> {
    let prefix = if weights.contains_key("distilbert.embeddings.word_embeddings.weight") {
        "distilbert."
    } else {
        ""
    };
    let mut out = HashMap::new();
    let mut take = |from: String, to: String| -> Result<()> {
        let t = weights.get(&from).ok_or_else(|| {
            EngineError::evaluator(format!(
                "'{}' has no tensor '{from}', which a DistilBERT encoder of its config ({} layers) has; evaluate a DistilBertForSequenceClassification checkpoint or its merge",
                source.display(),
                config.num_hidden_layers
            ))
        })?;
        out.insert(to, t.clone());
        Ok(())
    };
    for name in [
        "word_embeddings.weight",
        "position_embeddings.weight",
        "LayerNorm.weight",
        "LayerNorm.bias",
    ] {
        take(format!("{prefix}embeddings.{name}"), format!("embeddings.{name}"))?;
    }
    for i in 0..config.num_hidden_layers {
        for (distil, bert) in LAYER_NAMES {
            for p in ["weight", "bias"] {
                take(
                    format!("{prefix}transformer.layer.{i}.{distil}.{p}"),
                    format!("encoder.layer.{i}.{bert}.{p}"),
                )?;
            }
        }
    }
    out.insert(
        "embeddings.token_type_embeddings.weight".to_owned(),
        Tensor::zeros((1, config.hidden_size), candle_core::DType::F32, device)?,
    );
    Ok(out)
}
