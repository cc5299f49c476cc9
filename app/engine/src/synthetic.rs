//! Synthetic LLM-shaped checkpoints for the merge benchmark: a Llama-like layout (embedding,
//! grouped-query attention, gated MLP, norms, untied head) with a base and experts that are
//! the base plus small noise, as the anchors' measurements of mergekit used.

use crate::dtype::{DType, encode_f32};
use crate::error::{EngineError, Result};
use crate::rng::{fnv1a, uniform};
use crate::writer::{OutputTensor, OutputWriter};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Shape of the synthetic models.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyntheticConfig {
    /// Hidden size.
    pub hidden: usize,
    /// MLP intermediate size.
    pub intermediate: usize,
    /// Key/value projection width (grouped-query attention).
    pub kv_dim: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Stored dtype name (F32, F16, BF16).
    pub dtype: String,
    /// Shards per checkpoint.
    pub shards: usize,
    /// Number of experts besides the base.
    pub experts: usize,
    /// Standard deviation of the experts' difference from the base.
    pub noise: f32,
}

impl Default for SyntheticConfig {
    /// Hidden 2048, 16 layers, 32k vocabulary, bf16, two shards: 835,782,656 parameters.
    fn default() -> Self {
        SyntheticConfig {
            hidden: 2048,
            intermediate: 5632,
            kv_dim: 256,
            layers: 16,
            vocab: 32000,
            dtype: "BF16".into(),
            shards: 2,
            experts: 3,
            noise: 0.002,
        }
    }
}

impl SyntheticConfig {
    /// The tensors of one model.
    pub fn tensors(&self) -> Result<Vec<OutputTensor>> {
        let dtype = DType::parse(&self.dtype)
            .filter(|d| d.is_float())
            .ok_or_else(|| EngineError::Invalid(format!("dtype '{}' must be F32, F16 or BF16", self.dtype)))?;
        let (h, i, kv) = (self.hidden, self.intermediate, self.kv_dim);
        let t = |name: String, shape: Vec<usize>| OutputTensor { name, dtype, shape };
        let mut v = vec![
            t("model.embed_tokens.weight".into(), vec![self.vocab, h]),
            t("model.norm.weight".into(), vec![h]),
            t("lm_head.weight".into(), vec![self.vocab, h]),
        ];
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            v.push(t(format!("{p}.self_attn.q_proj.weight"), vec![h, h]));
            v.push(t(format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
            v.push(t(format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
            v.push(t(format!("{p}.self_attn.o_proj.weight"), vec![h, h]));
            v.push(t(format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
            v.push(t(format!("{p}.mlp.up_proj.weight"), vec![i, h]));
            v.push(t(format!("{p}.mlp.down_proj.weight"), vec![h, i]));
            v.push(t(format!("{p}.input_layernorm.weight"), vec![h]));
            v.push(t(format!("{p}.post_attention_layernorm.weight"), vec![h]));
        }
        Ok(v)
    }

    /// Parameters of one model.
    pub fn param_count(&self) -> Result<u64> {
        Ok(self
            .tensors()?
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum())
    }
}

/// Value of element `j` of tensor `name` in model `model` (0 = base).
fn value(name_hash: u64, j: u64, model: usize, noise: f32) -> f32 {
    let base = (uniform(name_hash, j) as f32 - 0.5) * 0.04;
    if model == 0 {
        return base;
    }
    // Uniform noise scaled to standard deviation `noise`.
    let u = uniform(name_hash ^ (model as u64).wrapping_mul(0x9E37_79B9), j) as f32 - 0.5;
    base + u * noise * 12f32.sqrt()
}

fn write_model(dir: &Path, cfg: &SyntheticConfig, model: usize, tensors: &[OutputTensor]) -> Result<()> {
    let total: u64 = tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64 * t.dtype.size() as u64)
        .sum();
    // A limit of total/shards plus the largest tensor gives at most `shards` shards, greedily.
    let largest = tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64 * t.dtype.size() as u64)
        .max();
    let shard = (cfg.shards > 1).then(|| total / cfg.shards as u64 + largest.unwrap_or(0));
    let meta: BTreeMap<String, String> = [("format".to_owned(), "pt".to_owned())].into();
    let writer = OutputWriter::create(dir, tensors, &meta, shard.or(Some(u64::MAX)), false)?;
    let threads = crate::sys::available_cores();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut bytes = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(t) = tensors.get(i) else { return };
                    let n = t.shape.iter().product::<usize>();
                    let h = fnv1a(&t.name);
                    const CHUNK: usize = 1 << 20;
                    let mut from = 0;
                    while from < n {
                        let len = CHUNK.min(n - from);
                        let vals: Vec<f32> = (from..from + len)
                            .map(|j| value(h, j as u64, model, cfg.noise))
                            .collect();
                        encode_f32(t.dtype, &vals, &mut bytes);
                        if let Err(e) = writer.write(&t.name, (from * t.dtype.size()) as u64, &bytes) {
                            if let Ok(mut v) = errors.lock() {
                                v.push(e);
                            }
                            return;
                        }
                        from += len;
                    }
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().ok().and_then(|mut v| v.pop()) {
        return Err(e);
    }
    writer.commit()?;
    Ok(())
}

/// Creates (or reuses) the base and expert checkpoints under `dir`; returns their folders,
/// base first. `progress(done, total)` counts models.
pub fn generate(dir: &Path, cfg: &SyntheticConfig, progress: &dyn Fn(usize, usize)) -> Result<Vec<PathBuf>> {
    let tensors = cfg.tensors()?;
    let marker = dir.join("config.json");
    let cfg_json = serde_json::to_string_pretty(cfg).map_err(|e| EngineError::Invalid(e.to_string()))?;
    let names: Vec<PathBuf> = (0..=cfg.experts)
        .map(|m| {
            dir.join(if m == 0 {
                "base".to_owned()
            } else {
                format!("expert{m}")
            })
        })
        .collect();
    if std::fs::read_to_string(&marker).is_ok_and(|t| t == cfg_json) && names.iter().all(|p| p.is_dir()) {
        progress(names.len(), names.len());
        return Ok(names);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| EngineError::io("cannot clear", dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
    for (m, p) in names.iter().enumerate() {
        progress(m, names.len());
        write_model(p, cfg, m, &tensors)?;
    }
    std::fs::write(&marker, cfg_json).map_err(|e| EngineError::io("cannot write", &marker, e))?;
    progress(names.len(), names.len());
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;

    #[test]
    fn default_size_matches_the_anchor_measurement() {
        assert_eq!(SyntheticConfig::default().param_count().unwrap(), 835_782_656);
    }

    #[test]
    fn tiny_models_are_sharded_and_close_to_the_base() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SyntheticConfig {
            hidden: 8,
            intermediate: 16,
            kv_dim: 4,
            layers: 2,
            vocab: 10,
            experts: 2,
            ..Default::default()
        };
        let paths = generate(&dir.path().join("m"), &cfg, &|_, _| {}).unwrap();
        assert_eq!(paths.len(), 3);
        let base = Checkpoint::open(&paths[0]).unwrap();
        let e1 = Checkpoint::open(&paths[1]).unwrap();
        assert_eq!(base.files.len(), 2);
        assert_eq!(base.tensors.len(), 3 + 9 * 2);
        let name = "model.layers.1.mlp.up_proj.weight";
        let (b, e) = (
            base.read_f32(&base.tensors[name]).unwrap(),
            e1.read_f32(&e1.tensors[name]).unwrap(),
        );
        let max_diff = b.iter().zip(&e).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(max_diff > 0.0 && max_diff < 0.005, "{max_diff}");
    }
}
