//! PEFT LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`) as merge inputs: an
//! adapter stands for its base model with each adapted weight W replaced by
//! W + s·B·A (s = lora_alpha / r, or lora_alpha / √r with rsLoRA), and with PEFT's
//! `lora_bias=True` the layer's bias b + s·lora_B.bias, formed per tensor range while
//! the merge streams, never for the whole model at once; and the reverse, a LoRA adapter
//! extracted from the difference of two models by truncated SVD ([`extract`]).

use mergescope_engine::checkpoint::{Checkpoint, LowRank, TensorEntry};
use mergescope_engine::error::{EngineError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The adapter's configuration file.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights file.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// PEFT's name of one LoRA factor (`half`: "A" or "B") of the weight `weight` of the model:
/// `base_model.model.<module>.lora_A.weight`, or `…lora_embedding_A` for an embedding.
pub fn peft_factor_name(weight: &str, half: &str, embedding: bool) -> String {
    let module = weight.strip_suffix(".weight").unwrap_or(weight);
    if embedding {
        format!("{PEFT_PREFIX}{module}.lora_embedding_{half}")
    } else {
        format!("{PEFT_PREFIX}{module}.lora_{half}.weight")
    }
}
/// The prefix PEFT gives every tensor of a saved adapter.
const PEFT_PREFIX: &str = "base_model.model.";

pub use mergescope_engine::checkpoint::is_lora_adapter as is_adapter;

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
    /// `lora_B.bias` (PEFT's `lora_bias=True`): the update of the module's bias.
    BBias(String),
    EmbeddingA(String),
    EmbeddingB(String),
    Full(String),
}

fn classify(name: &str) -> Part {
    let n = name.strip_prefix(PEFT_PREFIX).unwrap_or(name).replace(".default", "");
    for (suffix, make) in [
        (".lora_A.weight", Part::A as fn(String) -> Part),
        (".lora_B.weight", Part::B),
        (".lora_B.bias", Part::BBias),
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
        return Err(EngineError::input(
            dir,
            format!(
                "the adapter '{}' has no {WEIGHTS_FILE}{}; save it with safe_serialization=True",
                dir.display(),
                if dir.join("adapter_model.bin").is_file() {
                    " (only a pickled adapter_model.bin, which mergescope does not read)"
                } else {
                    ""
                }
            ),
        ));
    }
    let adapter = Checkpoint::open(&weights)?;
    let offset = base.files.len();
    let moved = |e: &TensorEntry| TensorEntry {
        file: e.file + offset,
        ..e.clone()
    };
    let mut halves: BTreeMap<String, (Option<TensorEntry>, Option<TensorEntry>, bool)> = BTreeMap::new();
    // lora_B.bias by module.
    let mut bias_updates: BTreeMap<String, TensorEntry> = BTreeMap::new();
    let mut tensors = base.tensors.clone();
    for (name, entry) in &adapter.tensors {
        match classify(name) {
            Part::A(m) => halves.entry(format!("{m}.weight")).or_default().0 = Some(moved(entry)),
            Part::B(m) => halves.entry(format!("{m}.weight")).or_default().1 = Some(moved(entry)),
            Part::BBias(m) => {
                bias_updates.insert(m, moved(entry));
            }
            Part::EmbeddingA(m) => {
                let h = halves.entry(format!("{m}.weight")).or_default();
                (h.0, h.2) = (Some(moved(entry)), true);
            }
            Part::EmbeddingB(m) => {
                let h = halves.entry(format!("{m}.weight")).or_default();
                (h.1, h.2) = (Some(moved(entry)), true);
            }
            Part::Full(target) => {
                // modules_to_save: a full replacement of a base tensor (with as many rows as
                // the adapter's vocabulary, for a vocabulary-indexed tensor of a resized one).
                let Some(old) = base.tensors.get(&target) else {
                    return Err(unfitting(dir, name, &format!("the base has no tensor '{target}'")));
                };
                if old.shape != entry.shape && !vocab_resized(&target, &entry.shape, &old.shape) {
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
        let module = target.strip_suffix(".weight").unwrap_or(&target).to_owned();
        let alpha = alpha_for(&config, &module);
        let scale = if config.use_rslora {
            alpha / (ra as f64).sqrt()
        } else {
            alpha / ra as f64
        };
        if let Some(bias) = bias_updates.remove(&module) {
            // PEFT's merge: bias += lora_B.bias · scaling (LoRA layers only; PEFT refuses
            // lora_bias for embeddings).
            let name = format!("{module}.bias");
            let Some(base_bias) = base.tensors.get(&name) else {
                return Err(unfitting(
                    dir,
                    &format!("{module}.lora_B.bias"),
                    &format!(
                        "the adapter updates the bias '{name}' (PEFT's lora_bias=True), but the base has no such \
                         tensor (its layer has no bias)"
                    ),
                ));
            };
            let out = if transposed { cols } else { rows };
            if embedding || bias.shape != [out] || base_bias.shape != [out] {
                return Err(unfitting(
                    dir,
                    &format!("{module}.lora_B.bias"),
                    &format!(
                        "it is {:?} and the base's '{name}' {:?}, but the layer has {out} outputs",
                        bias.shape, base_bias.shape
                    ),
                ));
            }
            deltas.insert(
                name,
                LowRank {
                    a: bias.clone(),
                    b: bias,
                    scale,
                    transposed: false,
                },
            );
        }
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
    if let Some(module) = bias_updates.keys().next() {
        return Err(unfitting(
            dir,
            &format!("{module}.lora_B.bias"),
            "it is a lora_B.bias without lora_A and lora_B weights for its module",
        ));
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
    EngineError::input(
        dir,
        format!(
            "the LoRA adapter '{}' does not fit the base: '{tensor}': {why}; give the base model the adapter was trained on \
         (adapter_config.json names it as base_model_name_or_path)",
            dir.display()
        ),
    )
}

/// What [`extract_with`] does besides the rank (mergekit-extract-lora's flags).
#[derive(Clone, Debug, Default)]
pub struct ExtractOptions {
    /// LoRA rank r (matrices smaller than r keep their full rank).
    pub rank: usize,
    /// LoRA for the input embeddings (`lora_embedding_A/B`) and the output head (a linear pair)
    /// instead of saving them whole (`--embed-lora`); ignored, with a note, when the vocabulary
    /// sizes of the models differ.
    pub embed_lora: bool,
    /// Modules saved whole whatever they are (`--modules-to-save`), matched as PEFT matches
    /// `modules_to_save`: a module whose name ends with one of these.
    pub modules_to_save: Vec<String>,
    /// Singular values at or below this are dropped (`--sv-epsilon`, mergekit's: a matrix's rank
    /// is min(rank, #singular values > sv_epsilon)); a matrix with none above it is left out of
    /// the adapter, with a note. 0 (the default) keeps every one up to the rank.
    pub sv_epsilon: f64,
    /// Only modules whose name (a tensor's name without `.weight`/`.bias`) one of these regular
    /// expressions finds somewhere in (`--include-regex`, Python's `re.search` as
    /// mergekit-extract-lora uses it); empty: every module.
    pub include_regex: Vec<String>,
    /// Modules such an expression finds in are neither extracted nor saved whole
    /// (`--exclude-regex`); this also drops the embeddings that are otherwise saved whole.
    pub exclude_regex: Vec<String>,
    /// All of each singular value on `lora_A` and none on `lora_B` (`--no-distribute-scale`,
    /// mergekit's); the default puts √σ on each. The adapter's product is the same either way.
    pub keep_scale_on_a: bool,
    /// Replace `out` if it is an adapter folder.
    pub overwrite: bool,
}

/// Compiles `--include-regex`/`--exclude-regex` patterns, naming the bad one and the fix.
fn compile_patterns(patterns: &[String], flag: &str) -> Result<Vec<regex::Regex>> {
    patterns
        .iter()
        .map(|p| {
            regex::Regex::new(p).map_err(|e| {
                EngineError::Param(format!(
                    "{flag} '{p}' is not a regular expression this tool reads: {e}. Write it as for Python's re without \
                     look-around or back-references, e.g. 'self_attn\\.(q|v)_proj' or 'layers\\.(0|1)\\.'"
                ))
            })
        })
        .collect()
}

/// A tensor's module: its name without `.weight` or `.bias`.
fn module_name(tensor: &str) -> &str {
    tensor
        .strip_suffix(".weight")
        .or_else(|| tensor.strip_suffix(".bias"))
        .unwrap_or(tensor)
}

/// What [`extract`] wrote.
#[derive(Clone, Debug)]
pub struct Extracted {
    /// Weights given a LoRA pair (layer matrices; with `embed_lora`, also the embeddings and the
    /// output head).
    pub adapted: usize,
    /// The weights among them given PEFT's embedding layout (`lora_embedding_A/B`).
    pub embedding_lora: Vec<String>,
    /// Tensors saved whole in the adapter (PEFT's modules_to_save): every tensor that differs
    /// from the base and has no LoRA pair, and every tensor of a module named to save.
    pub saved_in_full: Vec<String>,
    /// The adapter_config.json `modules_to_save` list.
    pub modules_to_save: Vec<String>,
    /// Tensors that differ but cannot be in a PEFT adapter (not inside a module: a bare
    /// top-level parameter), so the adapter leaves them out.
    pub left_out: Vec<String>,
    /// What the extraction decided that the user should know (a vocabulary change, a module
    /// saved whole because its bias changed).
    pub notes: Vec<String>,
    /// The adapter folder.
    pub out: PathBuf,
}

/// Whether `name` is a matrix of a transformer layer that LoRA adapts (`layers.N. … .weight`).
fn adaptable(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2 && name.ends_with(".weight") && mergescope_engine::layered::layer_index(name).is_some()
}

/// Output heads: linear layers from the hidden size to the vocabulary.
const OUTPUT_HEADS: &[&str] = &[
    "lm_head.weight",
    "embed_out.weight",
    "output.weight",
    "transformer.output_layer.weight",
    "lm_head.decoder.weight",
    "lm_head.linear.weight",
    "vocab_projector.weight",
    "cls.predictions.decoder.weight",
];

fn is_output_head(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2 && OUTPUT_HEADS.contains(&name)
}

/// Whether `name` is an embedding table outside the layers (token or position embeddings:
/// PEFT's `nn.Embedding` LoRA).
fn is_input_embedding(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2
        && name.ends_with(".weight")
        && !is_output_head(name, shape)
        && mergescope_engine::layered::layer_index(name).is_none()
        && mergescope_engine::role::role_of(name, shape) == mergescope_plugin_api::abi::ROLE_EMBEDDING
}

/// Whether a tensor of these shapes is the same vocabulary-indexed tensor with another number
/// of tokens (rows).
fn vocab_resized(name: &str, model: &[usize], base: &[usize]) -> bool {
    (crate::tokenizer_union::VOCAB_TENSORS.contains(&name)
        || is_input_embedding(name, model)
        || is_output_head(name, model))
        && model.len() == base.len()
        && !model.is_empty()
        && model[1..] == base[1..]
}

/// The module a tensor belongs to (its name less the last part), if any.
fn module_of(name: &str) -> Option<&str> {
    name.rsplit_once('.').map(|(m, _)| m)
}

/// Whether PEFT's modules_to_save `names` wrap a module holding `tensor`: PEFT wraps every
/// module whose name ends with one of the names, and saves all of its tensors.
fn saved_by(tensor: &str, names: &[String]) -> bool {
    tensor
        .match_indices('.')
        .map(|(i, _)| &tensor[..i])
        .any(|module| names.iter().any(|n| module.ends_with(n.as_str())))
}

/// Whether two tensors of one length hold the same values (read a block at a time).
fn same_values(model: &Checkpoint, t: &TensorEntry, base: &Checkpoint, b: &TensorEntry) -> Result<bool> {
    const BLOCK: usize = 1 << 20;
    let n = t.numel();
    let mut from = 0;
    while from < n {
        let len = BLOCK.min(n - from);
        if model.read_f32_range(t, from, len)? != base.read_f32_range(b, from, len)? {
            return Ok(false);
        }
        from += len;
    }
    Ok(true)
}

/// How one tensor goes into the adapter.
#[derive(Clone, Copy, PartialEq)]
enum How {
    /// A LoRA pair of rank k (`embedding`: PEFT's lora_embedding_A/B layout).
    Lora { k: usize, embedding: bool },
    /// Saved whole (modules_to_save).
    Full,
}

/// [`extract_with`] with rank `rank`, the default options and `overwrite`.
pub fn extract(base: &Checkpoint, model: &Checkpoint, rank: usize, out: &Path, overwrite: bool) -> Result<Extracted> {
    extract_with(
        base,
        model,
        out,
        &ExtractOptions {
            rank,
            overwrite,
            ..ExtractOptions::default()
        },
    )
}

/// Extracts a rank-r LoRA adapter of `model` over `base` into the folder `out`
/// (mergekit-extract-lora's job). For every layer matrix (and, with `embed_lora`, the input
/// embeddings and the output head) the task vector Δ = W_model − W_base is truncated by SVD to
/// U_r S_r V_rᵀ and written as B = U_r √S_r, A = √S_r V_rᵀ (for an embedding, PEFT's
/// lora_embedding_A = √S_r U_rᵀ, lora_embedding_B = V_r √S_r: the transposed layout) with
/// lora_alpha = r (scale 1), in the model's dtype. Every other tensor that differs from the base
/// (embeddings, output head, norms, biases), and every tensor of a module named in
/// `modules_to_save`, is saved whole as PEFT saves modules_to_save (`base_model.model.NAME`),
/// its module listed in adapter_config.json's `modules_to_save`; a module with a LoRA pair whose
/// other tensors (a bias) changed is saved whole instead. Tensors equal to the base's are left
/// out. One matrix is in memory at a time.
pub fn extract_with(base: &Checkpoint, model: &Checkpoint, out: &Path, options: &ExtractOptions) -> Result<Extracted> {
    use mergescope_engine::plugin::host_ext::linalg::truncated_svd;
    use mergescope_engine::writer::{OutputTensor, OutputWriter};
    let rank = options.rank;
    if rank == 0 {
        return Err(EngineError::Param("--rank must be at least 1".to_owned()));
    }
    let mut notes = Vec::new();
    // Names to save whole as PEFT matches them: module names, not tensor names.
    let mut names: Vec<String> = Vec::new();
    for given in &options.modules_to_save {
        let n = given
            .strip_prefix(PEFT_PREFIX)
            .unwrap_or(given)
            .trim_end_matches(".weight")
            .trim_end_matches(".bias")
            .to_owned();
        if n.is_empty() || !model.tensors.keys().any(|t| saved_by(t, std::slice::from_ref(&n))) {
            return Err(EngineError::Param(format!(
                "--modules-to-save '{given}' names no module of '{}'; give a module name as PEFT takes it, such as \
                 lm_head, embed_tokens or model.layers.0.input_layernorm (a tensor's name without .weight)",
                model.path.display()
            )));
        }
        if !names.contains(&n) {
            names.push(n);
        }
    }
    // Shapes: one architecture, or a vocabulary of another size.
    let mut resized = Vec::new();
    let mut pairs = Vec::new();
    for (name, t) in &model.tensors {
        let Some(b) = base.tensors.get(name) else {
            return Err(EngineError::input(
                &model.path,
                format!(
                    "'{}' has tensor '{name}' that the base '{}' lacks; extract from a model fine-tuned from this base",
                    model.path.display(),
                    base.path.display()
                ),
            ));
        };
        if b.shape != t.shape {
            if !vocab_resized(name, &t.shape, &b.shape) {
                return Err(EngineError::input(
                    &model.path,
                    format!(
                        "tensor '{name}' is {:?} in '{}' but {:?} in the base; the models must have one architecture",
                        t.shape,
                        model.path.display(),
                        b.shape
                    ),
                ));
            }
            resized.push(format!("'{name}' {:?} -> {:?}", b.shape, t.shape));
        }
        pairs.push((name, t, b));
    }
    let mut embed_lora = options.embed_lora;
    if !resized.is_empty() {
        notes.push(format!(
            "the vocabulary size differs from the base's ({}): those tensors are saved whole{}; load the adapter on \
             the base after resizing its token embeddings (PEFT: model.resize_token_embeddings)",
            resized.join(", "),
            if embed_lora {
                ", not as LoRA (--embed-lora is ignored, as mergekit-extract-lora does)"
            } else {
                ""
            }
        ));
        embed_lora = false;
    }
    // mergekit-extract-lora's `_should_extract`: an include list, then an exclude list, searched
    // in the module name. Embeddings and the output head that are saved whole (no --embed-lora)
    // are kept unless an exclude pattern names them, as mergekit keeps them.
    let include = compile_patterns(&options.include_regex, "--include-regex")?;
    let exclude = compile_patterns(&options.exclude_regex, "--exclude-regex")?;
    let excluded = |module: &str| exclude.iter().any(|r| r.is_match(module));
    let filtered_out = |name: &str, shape: &[usize]| {
        let module = module_name(name);
        if excluded(module) {
            return true;
        }
        let included = include.is_empty() || include.iter().any(|r| r.is_match(module));
        !included && (embed_lora || !(is_input_embedding(name, shape) || is_output_head(name, shape)))
    };
    let mut filtered = std::collections::BTreeSet::new();
    // What each tensor becomes; modules of differing tensors without LoRA join `names`.
    let named = names.len();
    let mut plan: Vec<(&String, &TensorEntry, &TensorEntry, How)> = Vec::new();
    let mut left_out = Vec::new();
    for &(name, t, b) in &pairs {
        let k = || rank.min(t.shape[0]).min(t.shape[1]);
        let how = if saved_by(name, &names[..named]) {
            How::Full
        } else if filtered_out(name, &t.shape) {
            filtered.insert(module_name(name));
            continue;
        } else if adaptable(name, &t.shape) || (embed_lora && is_output_head(name, &t.shape)) {
            How::Lora {
                k: k(),
                embedding: false,
            }
        } else if embed_lora && is_input_embedding(name, &t.shape) {
            How::Lora {
                k: k(),
                embedding: true,
            }
        } else if t.shape == b.shape && same_values(model, t, base, b)? {
            continue;
        } else if let Some(module) = module_of(name) {
            if !names.iter().any(|n| n == module) {
                names.push(module.to_owned());
            }
            How::Full
        } else {
            left_out.push(name.clone());
            continue;
        };
        plan.push((name, t, b, how));
    }
    // PEFT saves every tensor of a wrapped module: a LoRA-adapted module whose bias changed is
    // saved whole, and every tensor a name reaches is saved.
    for (name, _, _, how) in &mut plan {
        if *how != How::Full && saved_by(name, &names) {
            notes.push(format!(
                "'{name}' is saved whole, not as LoRA: another tensor of its module (a bias) differs from the base, \
                 and PEFT saves a module whole or not at all"
            ));
            *how = How::Full;
        }
    }
    let listed: std::collections::BTreeSet<&String> = plan.iter().map(|p| p.0).collect();
    for &(name, t, b) in &pairs {
        if !listed.contains(name) && saved_by(name, &names) {
            plan.push((name, t, b, How::Full));
        }
    }
    plan.sort_by(|x, y| x.0.cmp(y.0));
    if !filtered.is_empty() {
        notes.push(format!(
            "{} module(s) left out by --include-regex/--exclude-regex (neither extracted nor saved whole), e.g. {}",
            filtered.len(),
            filtered.iter().take(3).copied().collect::<Vec<_>>().join(", ")
        ));
    }
    if !plan.iter().any(|p| matches!(p.3, How::Lora { .. })) {
        let hint = if filtered.is_empty() {
            String::new()
        } else {
            format!(
                "; --include-regex/--exclude-regex left out {} module(s): loosen them (a pattern is searched in \
                 module names such as model.layers.0.self_attn.q_proj)",
                filtered.len()
            )
        };
        return Err(EngineError::input(
            &model.path,
            format!(
                "'{}' has no layer matrices (names with layers.N and .weight) to extract a LoRA adapter from{hint}",
                model.path.display()
            ),
        ));
    }
    if !(options.sv_epsilon >= 0.0 && options.sv_epsilon.is_finite()) {
        return Err(EngineError::Param(format!(
            "--sv-epsilon {} is not a threshold; give a singular value (0, the default, keeps every one up to the \
             rank)",
            options.sv_epsilon
        )));
    }
    // The LoRA factors, one task vector in memory at a time; the factors (the adapter's size) are
    // kept until the output's shapes, which --sv-epsilon decides, are known.
    let mut factors: BTreeMap<&String, (Vec<f32>, Vec<f32>)> = BTreeMap::new();
    let mut below_epsilon = Vec::new();
    for (name, t, b, how) in &mut plan {
        let How::Lora { k, embedding } = how else {
            continue;
        };
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let mut delta = model.read_f32(t)?;
        for (d, x) in delta.iter_mut().zip(base.read_f32(b)?) {
            *d -= x;
        }
        let (u, s, vt) =
            truncated_svd(&delta, rows, cols, *k).map_err(|e| EngineError::Invalid(format!("tensor '{name}': {e}")))?;
        drop(delta);
        let full = *k;
        // mergekit: rank = min(#(s > sv_epsilon), rank) when sv_epsilon > 0.
        if options.sv_epsilon > 0.0 {
            *k = s.iter().filter(|x| **x > options.sv_epsilon).count().min(full);
        }
        let k = *k;
        if k == 0 {
            below_epsilon.push((*name).clone());
            continue;
        }
        // mergekit's distribute_scale: √S on each side (the default), or all of S on A.
        let (sa, sb): (Vec<f64>, Vec<f64>) = if options.keep_scale_on_a {
            (s.clone(), vec![1.0; s.len()])
        } else {
            let root: Vec<f64> = s.iter().map(|x| x.sqrt()).collect();
            (root.clone(), root)
        };
        let (a, bm): (Vec<f32>, Vec<f32>) = if *embedding {
            // Δᵀ = V S Uᵀ: A = √S Uᵀ (k × rows), B = V √S (cols × k).
            (
                (0..k * rows)
                    .map(|x| (sa[x / rows] * u[(x % rows) * full + x / rows]) as f32)
                    .collect(),
                (0..cols * k)
                    .map(|x| (vt[(x % k) * cols + x / k] * sb[x % k]) as f32)
                    .collect(),
            )
        } else {
            (
                (0..k * cols).map(|x| (sa[x / cols] * vt[x]) as f32).collect(),
                (0..rows * k)
                    .map(|x| (u[(x / k) * full + x % k] * sb[x % k]) as f32)
                    .collect(),
            )
        };
        factors.insert(*name, (a, bm));
    }
    if !below_epsilon.is_empty() {
        notes.push(format!(
            "{} matrices have no singular value above --sv-epsilon {}, so the adapter leaves them out (their \
             difference from the base is that small): {}",
            below_epsilon.len(),
            options.sv_epsilon,
            below_epsilon.join(", ")
        ));
        plan.retain(|p| !below_epsilon.contains(p.0));
    }
    if !plan.iter().any(|p| matches!(p.3, How::Lora { .. })) {
        return Err(EngineError::Invalid(format!(
            "every layer matrix of '{}' has its singular values at or below --sv-epsilon {}, so there is nothing to \
             extract; give a smaller --sv-epsilon",
            model.path.display(),
            options.sv_epsilon
        )));
    }
    let mut specs = Vec::new();
    for (name, t, _, how) in &plan {
        match *how {
            How::Full => specs.push(OutputTensor {
                name: format!("{PEFT_PREFIX}{name}"),
                dtype: t.dtype,
                shape: t.shape.clone(),
            }),
            How::Lora { k, embedding } => {
                let (rows, cols) = (t.shape[0], t.shape[1]);
                let (a, b) = if embedding {
                    (vec![k, rows], vec![cols, k])
                } else {
                    (vec![k, cols], vec![rows, k])
                };
                for (half, shape) in [("A", a), ("B", b)] {
                    specs.push(OutputTensor {
                        name: peft_factor_name(name, half, embedding),
                        dtype: t.dtype,
                        shape,
                    });
                }
            }
        }
    }
    if out.exists() && !(options.overwrite && is_adapter(out)) {
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
    let mut adapted_modules = Vec::new();
    let (mut saved_in_full, mut embedding_lora) = (Vec::new(), Vec::new());
    // mergekit's r: the largest rank written (rank_pattern lists the others).
    let max_rank = plan
        .iter()
        .filter_map(|p| match p.3 {
            How::Lora { k, .. } => Some(k),
            How::Full => None,
        })
        .max()
        .unwrap_or(rank);
    for (name, t, _, how) in &plan {
        let How::Lora { k, embedding } = *how else {
            writer.write(&format!("{PEFT_PREFIX}{name}"), 0, &model.raw_bytes(t)?)?;
            saved_in_full.push((*name).clone());
            continue;
        };
        let Some((a, bm)) = factors.remove(name) else {
            return Err(EngineError::Bug(format!("no LoRA factors for '{name}'")));
        };
        writer.write_values(&peft_factor_name(name, "A", embedding), 0, &a)?;
        writer.write_values(&peft_factor_name(name, "B", embedding), 0, &bm)?;
        let module = name.strip_suffix(".weight").unwrap_or(name);
        if k != max_rank {
            ranks.insert(module.to_owned(), k);
        }
        if let Some(last) = module.rsplit('.').next() {
            targets.insert(last.to_owned());
        }
        adapted_modules.push(module.to_owned());
        if embedding {
            embedding_lora.push((*name).clone());
        }
    }
    writer.commit()?;
    // PEFT puts LoRA on every module whose name ends with a target; where a short target would
    // also reach a module saved whole, name the adapted modules in full.
    let clashes = saved_in_full
        .iter()
        .filter_map(|n| module_of(n))
        .any(|m| targets.iter().any(|t| m == t || m.ends_with(&format!(".{t}"))));
    let target_modules: Vec<String> = if clashes {
        adapted_modules.clone()
    } else {
        targets.into_iter().collect()
    };
    let config = serde_json::json!({
        "base_model_name_or_path": base.path.display().to_string(),
        "peft_type": "LORA",
        "use_rslora": false,
        "target_modules": target_modules,
        "modules_to_save": names,
        "task_type": "CAUSAL_LM",
        "r": max_rank,
        "lora_alpha": max_rank,
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
        adapted: adapted_modules.len(),
        embedding_lora,
        saved_in_full,
        modules_to_save: names,
        left_out,
        notes,
        out: out.to_path_buf(),
    })
}
