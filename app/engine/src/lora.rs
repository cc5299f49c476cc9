//! PEFT LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`) as merge inputs: an
//! adapter stands for its base model with each adapted weight W replaced by
//! W + s·B·A (s = lora_alpha / r, or lora_alpha / √r with rsLoRA), formed per tensor range while
//! the merge streams, never for the whole model at once; and the reverse, a LoRA adapter
//! extracted from the difference of two models by truncated SVD ([`extract`]).

use crate::checkpoint::{Checkpoint, LowRank, TensorEntry};
use crate::error::{EngineError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The adapter's configuration file.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights file.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The prefix PEFT gives every tensor of a saved adapter.
const PEFT_PREFIX: &str = "base_model.model.";

pub use crate::checkpoint::is_lora_adapter as is_adapter;

#[derive(Deserialize)]
struct AdapterConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    alpha_pattern: BTreeMap<String, f64>,
}

/// What one adapter tensor is.
enum Part {
    A(String),
    B(String),
    EmbeddingA(String),
    EmbeddingB(String),
    Full(String),
}

fn classify(name: &str) -> Part {
    let n = name.strip_prefix(PEFT_PREFIX).unwrap_or(name).replace(".default", "");
    for (suffix, make) in [
        (".lora_A.weight", Part::A as fn(String) -> Part),
        (".lora_B.weight", Part::B),
        (".lora_embedding_A", Part::EmbeddingA),
        (".lora_embedding_B", Part::EmbeddingB),
    ] {
        if let Some(module) = n.strip_suffix(suffix) {
            return make(module.to_owned());
        }
    }
    Part::Full(n)
}

/// alpha for `module`: the alpha_pattern entry whose key ends the module name (as PEFT matches
/// them), else lora_alpha.
fn alpha_for(config: &AdapterConfig, module: &str) -> f64 {
    config
        .alpha_pattern
        .iter()
        .find(|(k, _)| module == k.as_str() || module.ends_with(&format!(".{k}")))
        .map_or(config.lora_alpha, |(_, a)| *a)
}

/// `base` with the adapter at `dir` applied (see the module doc). Every adapter tensor must
/// fit a tensor of the base; a mismatch is an error naming both.
pub fn apply(base: Checkpoint, dir: &Path) -> Result<Checkpoint> {
    let config_path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path).map_err(|e| EngineError::io("cannot read", &config_path, e))?;
    let config: AdapterConfig = serde_json::from_str(&text)
        .map_err(|e| EngineError::bad(&config_path, format!("is not a PEFT LoRA configuration ({e})")))?;
    if config.peft_type.as_deref().is_some_and(|t| t != "LORA") {
        return Err(EngineError::bad(
            &config_path,
            format!(
                "is a {} adapter; mergescope applies LoRA adapters only",
                config.peft_type.as_deref().unwrap_or_default()
            ),
        ));
    }
    if config.use_dora {
        return Err(EngineError::bad(
            &config_path,
            "is a DoRA adapter (use_dora), which mergescope does not apply yet; merge it into its model with peft's \
             merge_and_unload and use that folder",
        ));
    }
    if config.r == 0 {
        return Err(EngineError::bad(&config_path, "has r = 0"));
    }
    let weights = dir.join(WEIGHTS_FILE);
    if !weights.is_file() {
        return Err(EngineError::Invalid(format!(
            "the adapter '{}' has no {WEIGHTS_FILE}{}; save it with safe_serialization=True",
            dir.display(),
            if dir.join("adapter_model.bin").is_file() {
                " (only a pickled adapter_model.bin, which mergescope does not read)"
            } else {
                ""
            }
        )));
    }
    let adapter = Checkpoint::open(&weights)?;
    let offset = base.files.len();
    let moved = |e: &TensorEntry| TensorEntry {
        file: e.file + offset,
        ..e.clone()
    };
    let mut halves: BTreeMap<String, (Option<TensorEntry>, Option<TensorEntry>, bool)> = BTreeMap::new();
    let mut tensors = base.tensors.clone();
    for (name, entry) in &adapter.tensors {
        match classify(name) {
            Part::A(m) => halves.entry(format!("{m}.weight")).or_default().0 = Some(moved(entry)),
            Part::B(m) => halves.entry(format!("{m}.weight")).or_default().1 = Some(moved(entry)),
            Part::EmbeddingA(m) => {
                let h = halves.entry(format!("{m}.weight")).or_default();
                (h.0, h.2) = (Some(moved(entry)), true);
            }
            Part::EmbeddingB(m) => {
                let h = halves.entry(format!("{m}.weight")).or_default();
                (h.1, h.2) = (Some(moved(entry)), true);
            }
            Part::Full(target) => {
                // modules_to_save: a full replacement of a base tensor.
                let Some(old) = base.tensors.get(&target) else {
                    return Err(unfitting(dir, name, &format!("the base has no tensor '{target}'")));
                };
                if old.shape != entry.shape {
                    return Err(unfitting(
                        dir,
                        name,
                        &format!("shape {:?}, but the base's '{target}' is {:?}", entry.shape, old.shape),
                    ));
                }
                tensors.insert(
                    target.clone(),
                    TensorEntry {
                        name: target,
                        ..moved(entry)
                    },
                );
            }
        }
    }
    let mut deltas = BTreeMap::new();
    for (target, (a, b, embedding)) in halves {
        let (Some(a), Some(b)) = (a, b) else {
            return Err(unfitting(
                dir,
                &target,
                "it has only one of the two LoRA factors (A and B)",
            ));
        };
        let Some(w) = base.tensors.get(&target) else {
            return Err(unfitting(dir, &target, "the base has no such weight"));
        };
        let transposed = embedding || config.fan_in_fan_out;
        let (&[ra, a_cols], &[b_rows, rb], &[rows, cols]) =
            (a.shape.as_slice(), b.shape.as_slice(), w.shape.as_slice())
        else {
            return Err(unfitting(
                dir,
                &target,
                "its factors or the base weight are not matrices",
            ));
        };
        let fits = ra == rb
            && if transposed {
                (a_cols, b_rows) == (rows, cols)
            } else {
                (b_rows, a_cols) == (rows, cols)
            };
        if !fits {
            return Err(unfitting(
                dir,
                &target,
                &format!(
                    "A is {:?} and B {:?}, which do not make the base's {:?}",
                    a.shape, b.shape, w.shape
                ),
            ));
        }
        let module = target.strip_suffix(".weight").unwrap_or(&target);
        let alpha = alpha_for(&config, module);
        let scale = if config.use_rslora {
            alpha / (ra as f64).sqrt()
        } else {
            alpha / ra as f64
        };
        deltas.insert(
            target,
            LowRank {
                a,
                b,
                scale,
                transposed,
            },
        );
    }
    let sharded = base.is_sharded();
    let mut files = base.files;
    files.extend(adapter.files);
    Ok(Checkpoint::with_deltas(
        dir.to_path_buf(),
        files,
        tensors,
        deltas,
        sharded,
    ))
}

fn unfitting(dir: &Path, tensor: &str, why: &str) -> EngineError {
    EngineError::Invalid(format!(
        "the LoRA adapter '{}' does not fit the base: '{tensor}': {why}; give the base model the adapter was trained on \
         (adapter_config.json names it as base_model_name_or_path)",
        dir.display()
    ))
}

/// What [`extract`] wrote.
#[derive(Clone, Debug)]
pub struct Extracted {
    /// Weights given a LoRA pair.
    pub adapted: usize,
    /// Tensors that differ between the models but are not in the adapter (embeddings, norms, the
    /// output head: not layer matrices).
    pub left_out: Vec<String>,
    /// The adapter folder.
    pub out: PathBuf,
}

/// Whether `name` is a matrix of a transformer layer that LoRA adapts (`layers.N. … .weight`).
fn adaptable(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2 && name.ends_with(".weight") && crate::layered::layer_index(name).is_some()
}

/// Extracts a rank-`rank` LoRA adapter of `model` over `base` into the folder `out`
/// (mergekit-extract-lora's job): for every layer matrix, the task vector Δ = W_model − W_base is
/// truncated by SVD to U_r S_r V_rᵀ and written as B = U_r √S_r, A = √S_r V_rᵀ with
/// lora_alpha = r (scale 1), in the model's dtype. One matrix is in memory at a time.
pub fn extract(base: &Checkpoint, model: &Checkpoint, rank: usize, out: &Path, overwrite: bool) -> Result<Extracted> {
    use crate::plugin::host_ext::linalg::truncated_svd;
    use crate::writer::{OutputTensor, OutputWriter};
    if rank == 0 {
        return Err(EngineError::Invalid("--rank must be at least 1".to_owned()));
    }
    let mut plan = Vec::new();
    let mut left_out = Vec::new();
    for (name, t) in &model.tensors {
        let Some(b) = base.tensors.get(name) else {
            return Err(EngineError::Invalid(format!(
                "'{}' has tensor '{name}' that the base '{}' lacks; extract from a model fine-tuned from this base",
                model.path.display(),
                base.path.display()
            )));
        };
        if b.shape != t.shape {
            return Err(EngineError::Invalid(format!(
                "tensor '{name}' is {:?} in '{}' but {:?} in the base; the models must have one architecture",
                t.shape,
                model.path.display(),
                b.shape
            )));
        }
        if adaptable(name, &t.shape) {
            let k = rank.min(t.shape[0]).min(t.shape[1]);
            plan.push((name.clone(), t.clone(), b.clone(), k));
        } else if model.read_f32(t)? != base.read_f32(b)? {
            left_out.push(name.clone());
        }
    }
    if plan.is_empty() {
        return Err(EngineError::Invalid(format!(
            "'{}' has no layer matrices (names with layers.N and .weight) to extract a LoRA adapter from",
            model.path.display()
        )));
    }
    let mut specs = Vec::new();
    for (name, t, _, k) in &plan {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        specs.push(OutputTensor {
            name: format!("{PEFT_PREFIX}{module}.lora_A.weight"),
            dtype: t.dtype,
            shape: vec![*k, t.shape[1]],
        });
        specs.push(OutputTensor {
            name: format!("{PEFT_PREFIX}{module}.lora_B.weight"),
            dtype: t.dtype,
            shape: vec![t.shape[0], *k],
        });
    }
    if out.exists() && !(overwrite && is_adapter(out)) {
        return Err(EngineError::Invalid(format!(
            "'{}' already exists; choose another --out{}",
            out.display(),
            if is_adapter(out) { " or pass --overwrite" } else { "" }
        )));
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".lora-partial-")
        .tempdir_in(parent)
        .map_err(|e| EngineError::io("cannot create a folder in", parent, e))?;
    let metadata = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    let writer = OutputWriter::create(&tmp.path().join(WEIGHTS_FILE), &specs, &metadata, None, false)?;
    let mut ranks = BTreeMap::new();
    let mut targets = std::collections::BTreeSet::new();
    for (name, t, b, k) in &plan {
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let mut delta = model.read_f32(t)?;
        for (d, x) in delta.iter_mut().zip(base.read_f32(b)?) {
            *d -= x;
        }
        let (u, s, vt) =
            truncated_svd(&delta, rows, cols, *k).map_err(|e| EngineError::Invalid(format!("tensor '{name}': {e}")))?;
        drop(delta);
        let root: Vec<f64> = s.iter().map(|x| x.sqrt()).collect();
        let a: Vec<f32> = (0..k * cols).map(|x| (root[x / cols] * vt[x]) as f32).collect();
        let bm: Vec<f32> = (0..rows * k).map(|x| (u[x] * root[x % k]) as f32).collect();
        let module = name.strip_suffix(".weight").unwrap_or(name);
        writer.write_values(&format!("{PEFT_PREFIX}{module}.lora_A.weight"), 0, &a)?;
        writer.write_values(&format!("{PEFT_PREFIX}{module}.lora_B.weight"), 0, &bm)?;
        if *k != rank {
            ranks.insert(module.to_owned(), *k);
        }
        if let Some(last) = module.rsplit('.').next() {
            targets.insert(last.to_owned());
        }
    }
    writer.commit()?;
    let config = serde_json::json!({
        "base_model_name_or_path": base.path.display().to_string(),
        "peft_type": "LORA",
        "use_rslora": false,
        "target_modules": targets,
        "modules_to_save": null,
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "rank_pattern": ranks,
        "alpha_pattern": ranks,
        "lora_dropout": 0.0,
        "fan_in_fan_out": false,
        "inference_mode": true,
    });
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| EngineError::Invalid(format!("cannot encode {CONFIG_FILE}: {e}")))?;
    let config_path = tmp.path().join(CONFIG_FILE);
    std::fs::write(&config_path, text).map_err(|e| EngineError::io("cannot write", &config_path, e))?;
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| EngineError::io("cannot replace", out, e))?;
    }
    let kept = tmp.keep();
    std::fs::rename(&kept, out).map_err(|e| EngineError::io("cannot move the adapter to", out, e))?;
    Ok(Extracted {
        adapted: plan.len(),
        left_out,
        out: out.to_path_buf(),
    })
}
