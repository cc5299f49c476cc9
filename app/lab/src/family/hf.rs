//! Hugging Face folders as users have them: where a checkpoint's `config.json` and
//! `tokenizer.json` are, reading a config with the library's defaults for keys older or newer
//! transformers versions leave out, the tokenizer, and a checkpoint's weights for
//! candle-transformers.

use crate::nn::load_params;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use mergescope_engine::error::{EngineError, Result};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// `file` in the Hugging Face folder of `checkpoint`: the folder itself, or the folder of a
/// `.safetensors` file; `None` when it is not there.
pub fn beside(checkpoint: &Path, file: &str) -> Option<PathBuf> {
    let folder = if checkpoint.is_dir() {
        checkpoint
    } else {
        checkpoint.parent()?
    };
    let p = folder.join(file);
    p.is_file().then_some(p)
}

/// The file a suite names under `key`, else the one beside `checkpoint`, else the one beside
/// `base` (the suite's base model, whose config and tokenizer serve merged files, which carry
/// none); the error says where it was looked for and which key to set.
pub fn locate(named: Option<&Path>, checkpoint: &Path, base: Option<&Path>, file: &str, key: &str) -> Result<PathBuf> {
    if let Some(p) = named {
        return if p.is_file() {
            Ok(p.to_owned())
        } else {
            Err(EngineError::evaluator(format!(
                "{key} = '{}' is not a file; point it at the model's {file}",
                p.display()
            )))
        };
    }
    beside(checkpoint, file).or_else(|| base.and_then(|b| beside(b, file))).ok_or_else(|| {
        EngineError::evaluator(format!(
            "no {file} beside '{}' (a merged file carries no config); name the base model's {file} as {key} = \"...\" in the suite's [model] table",
            checkpoint.display()
        ))
    })
}

/// A text model's `config.json` and `tokenizer.json` for models like `checkpoint`, each found as
/// [`locate`] finds it (the suite's `config`/`tokenizer` keys, beside the checkpoint, beside the
/// base).
pub fn locate_config_and_tokenizer(
    config: Option<&Path>,
    tokenizer: Option<&Path>,
    checkpoint: &Path,
    base: Option<&Path>,
) -> Result<(PathBuf, PathBuf)> {
    Ok((
        locate(config, checkpoint, base, "config.json", "config")?,
        locate(tokenizer, checkpoint, base, "tokenizer.json", "tokenizer")?,
    ))
}

/// Reads a `config.json` into `T`, first filling the keys it lacks from `defaults` (the
/// values transformers uses when a key is absent).
pub fn read_config<T: DeserializeOwned>(path: &Path, defaults: &[(&str, serde_json::Value)]) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    let mut value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::evaluator(format!("'{}' is not JSON: {e}", path.display())))?;
    let Some(map) = value.as_object_mut() else {
        return Err(EngineError::evaluator(format!(
            "'{}' is not a model config (a JSON object)",
            path.display()
        )));
    };
    for (k, v) in defaults {
        if map.get(*k).is_none_or(serde_json::Value::is_null) {
            map.insert((*k).to_owned(), v.clone());
        }
    }
    serde_json::from_value(value)
        .map_err(|e| EngineError::evaluator(format!("'{}' is not a config this family reads: {e}", path.display())))
}

/// The model type a `config.json` declares (`bert`, `clip`, `llama`, ...), if any.
pub fn model_type(path: &Path) -> Result<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Probe {
        model_type: Option<String>,
    }
    let p: Probe = read_config(path, &[])?;
    Ok(p.model_type)
}

/// Loads a `tokenizer.json`, truncating every encoding to `max_length` tokens and padding none
/// (callers pad each batch to its longest: a file's fixed padding, such as sentence-transformers'
/// 128 tokens, would multiply the work for short texts).
pub fn load_tokenizer(path: &Path, max_length: usize) -> Result<Tokenizer> {
    let mut t = Tokenizer::from_file(path).map_err(|e| {
        EngineError::evaluator(format!(
            "'{}' is not a tokenizer.json this version reads: {e}",
            path.display()
        ))
    })?;
    t.with_padding(None);
    t.with_truncation(Some(tokenizers::TruncationParams {
        max_length,
        ..Default::default()
    }))
    .map_err(|e| {
        EngineError::evaluator(format!(
            "'{}': cannot truncate to {max_length} tokens: {e}",
            path.display()
        ))
    })?;
    Ok(t)
}

/// Every float tensor of a checkpoint (file or shard folder) as f32 on `device`.
pub fn load_weights(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    Ok(load_params(path, device)?.into_iter().collect())
}

/// A variable builder over `weights` on `device`: in f32, or in f64 when every weight is f64
/// (the seed-004 oracle's gradient descent, whose gaps f32 rounding would hide).
pub fn var_builder(weights: HashMap<String, Tensor>, device: &Device) -> VarBuilder<'static> {
    let f64 = !weights.is_empty() && weights.values().all(|t| t.dtype() == DType::F64);
    VarBuilder::from_tensors(weights, if f64 { DType::F64 } else { DType::F32 }, device)
}
