//! Layer slices, mergekit's `slices`: a model built from layer ranges of several models, the
//! layers renumbered in order (frankenmerges with passthrough, or slice-wise merges).
//!
//! A sliced merge has one source per input in every slice (base first when there is one, then
//! the experts) unless it is merged slice by slice (below). Input k of the merge is assembled as
//! one checkpoint: output layer o (counted
//! across the slices) is layer `first + i` of slice s's k-th model; tensors outside the
//! numbered layers come from the first slice's model when they stand before the layers
//! ([`is_pre_layer`]: embeddings, a vision tower's patch convolution and pre-norm), else (final
//! norm, output head) from the last slice's, as mergekit gathers its pre-layer weights from
//! `slices[0]`'s sources and its post-layer weights from `slices[-1]`'s
//! (`MergePlanner.plan_module`). A module without layers (a projector) takes every tensor from
//! its first slice (mergekit's architectures list them as its pre-layer weights).
//!
//! With an output vocabulary (mergekit's `tokenizer_source` or `tokenizer:` block, built from
//! every model the slices name), [`align`] permutes the rows of each input's embeddings with the
//! tokenizer of the first slice's model they came from, and those of its output head with the
//! last slice's model's.
//!
//! Slices may each be scoped to a [`ModuleScope`], a part of a multimodal model (mergekit's
//! `modules`: a text decoder, a vision tower, a projector), known by the prefixes of its tensor
//! names. The slices of one module stand together; each module is assembled as above on its own
//! tensors only (its layers numbered from 0, its tensors outside the layers from its first and
//! last slice), and the tensors of no listed module are left out, as mergekit writes only the
//! modules a configuration lists.
//!
//! **Slice by slice.** When a slice lists another number of models than the merge has inputs, or
//! any slice gives its own `params`, every slice is merged on its own, as mergekit does
//! (`MergePlanner.plan_slice`): the slice's sources are its inputs (its base first when the merge
//! has a base, then the models it merges, as many as it likes), its tensors are merged by
//! instances of the method created for its own number of models, with the recipe's parameters
//! overlaid by the slice's `params`, and its output layers are written into the one output
//! ([`per_slice`]); a slice of the base alone keeps the base's tensors. A slice's parameters are
//! resolved on its own layers: a gradient runs over the
//! slice (layer i of n at t = i / (n − 1), 1 for a one-layer slice) and restarts in the next,
//! the weights before the layers take the first slice's parameters and those after them the
//! last's, both at t = 0, as mergekit's do; a filter matches the tensor's name with its layer
//! numbered within the slice. Slices scoped to modules are merged so within their module: its
//! layers numbered from 0, its tensors outside the layers from its own first and last slice.

mod per_slice;

pub(crate) use per_slice::merge_files as merge_slice_by_slice;

use crate::tokenizer_union::{TokenizerSpec, VocabPlan};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::layered::layer_position;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One output slice: a source for each input of the merge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slice {
    /// One source per input: the base first when the merge has one, then the experts.
    pub sources: Vec<SliceSource>,
    /// The module of a multimodal model the slice builds (all slices have one, or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleScope>,
    /// The method parameters of this slice's tensors, over the recipe's `params` (key by key);
    /// with them every slice is merged on its own (see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<toml::Table>,
}

/// The tensors of one module of a model (mergekit's architecture modules): those whose names
/// start with one of `prefixes` but with none of `except` (the prefixes of modules nested in
/// it, e.g. a projector inside `visual.`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleScope {
    /// The module's name (mergekit's, e.g. `text_decoder`).
    pub name: String,
    /// Tensor-name prefixes of the module.
    pub prefixes: Vec<String>,
    /// Tensor-name prefixes inside `prefixes` that belong to other modules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<String>,
}

impl ModuleScope {
    /// Whether tensor `name` belongs to the module.
    pub fn contains(&self, name: &str) -> bool {
        self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
            && !self.except.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// The slices grouped by module: one group of all slices when none is scoped, else each run of
/// slices of the same module. Errors when only some slices are scoped or a module's slices are
/// apart.
fn module_groups(slices: &[Slice]) -> Result<Vec<&[Slice]>> {
    let scoped = slices.iter().filter(|s| s.module.is_some()).count();
    if scoped == 0 {
        return Ok(vec![slices]);
    }
    if scoped != slices.len() {
        return Err(EngineError::Invalid(
            "some slices name a module and some do not; give every slice a module (mergekit's `modules`) or none"
                .to_owned(),
        ));
    }
    let mut groups: Vec<&[Slice]> = Vec::new();
    let mut start = 0;
    for i in 1..=slices.len() {
        let name = |j: usize| slices[j].module.as_ref().map(|m| m.name.as_str());
        if i == slices.len() || name(i) != name(start) {
            if groups
                .iter()
                .any(|g| g[0].module.as_ref().map(|m| m.name.as_str()) == name(start))
            {
                return Err(EngineError::Invalid(format!(
                    "the slices of module '{}' are not together; list each module's slices one after another",
                    name(start).unwrap_or_default()
                )));
            }
            groups.push(&slices[start..i]);
            start = i;
        }
    }
    Ok(groups)
}

/// Layers `[first, end)` of a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceSource {
    /// Checkpoint file or folder.
    pub model: PathBuf,
    /// First layer and one past the last.
    pub layers: [usize; 2],
}

/// Whether a tensor outside the layers stands before them, as mergekit 0.1.5's architecture
/// definitions (`mergekit/_data/architectures/*.json`) list their `pre_weights`: token, position
/// and patch embeddings (not GPT-NeoX's output head `embed_out`, a post-layer weight there), a
/// vision tower's patch convolution and pre-norm (Pixtral's `patch_conv`, `ln_pre`; Llama 4's
/// `layernorm_pre`), ChatGLM's rotary frequencies and Jais's position slopes.
pub(crate) fn is_pre_layer(name: &str) -> bool {
    const PRE: &[&str] = &[
        "embed",
        "wte",
        "wpe",
        "patch_conv",
        "ln_pre",
        "layernorm_pre",
        "rotary_pos_emb",
        "relative_pe",
    ];
    PRE.iter().any(|k| name.contains(k)) && !name.contains("embed_out")
}

/// Whether a tensor outside the layers of a module is taken from (and its parameters resolved
/// with) the module's first slice rather than its last: a pre-layer weight, or any tensor of a
/// module without layers.
pub(crate) fn from_first_slice(name: &str, layerless: bool) -> bool {
    layerless || is_pre_layer(name)
}

/// Number of output layers of a sliced merge (with modules: of the first module, the one whose
/// layer count a configuration's top-level `num_hidden_layers` holds, when it has one).
pub fn layer_count(slices: &[Slice]) -> usize {
    let first = module_groups(slices)
        .ok()
        .and_then(|g| g.first().copied())
        .unwrap_or(slices);
    first
        .iter()
        .map(|s| s.sources.first().map_or(0, |src| src.layers[1] - src.layers[0]))
        .sum()
}

/// Whether a sliced merge with `inputs` inputs is merged slice by slice (see the module doc):
/// some slice lists another number of sources, or gives its own `params`.
pub fn is_slice_by_slice(slices: &[Slice], inputs: usize) -> bool {
    slices.iter().any(|s| s.params.is_some() || s.sources.len() != inputs)
}

/// Checks the shape of a sliced merge with a base or not and `experts` experts: every slice has
/// one source per input (or, merged slice by slice, its base when the merge has one and at
/// least one model besides), and the sources of a slice span the same number of layers.
pub fn check(slices: &[Slice], has_base: bool, experts: usize) -> Result<()> {
    module_groups(slices)?;
    let inputs = usize::from(has_base) + experts;
    let each = is_slice_by_slice(slices, inputs);
    for (i, s) in slices.iter().enumerate() {
        if each && s.sources.is_empty() {
            return Err(EngineError::Invalid(format!(
                "slices[{i}].sources lists no source; give the slice {}",
                if has_base {
                    "its base first, then the models to merge (or the base alone to keep its layers)"
                } else {
                    "the models to merge"
                }
            )));
        }
        if !each && s.sources.len() != inputs {
            return Err(EngineError::Bug(format!(
                "slice {i} has {} sources but the merge has {inputs} inputs",
                s.sources.len()
            )));
        }
        for src in &s.sources {
            let [first, end] = src.layers;
            // A module may have no layers (a projector): its slice takes layers [0, 0).
            if first > end || (first == end && (s.module.is_none() || first != 0)) {
                return Err(EngineError::Invalid(format!(
                    "slice {i}: layers [{first}, {end}) of '{}' is empty; write [first, end) with first < end",
                    src.model.display()
                )));
            }
            if end - first != s.sources[0].layers[1] - s.sources[0].layers[0] {
                return Err(EngineError::Invalid(format!(
                    "slice {i}: its sources span different numbers of layers ({:?} and {:?}); the layers of a slice are \
                     merged one to one",
                    s.sources[0].layers, src.layers
                )));
            }
        }
    }
    Ok(())
}

/// Opens input `k` of a sliced merge as one checkpoint (see the module doc).
pub fn open_input(slices: &[Slice], k: usize) -> Result<Checkpoint> {
    let Some(first) = slices.first() else {
        return Err(EngineError::Invalid(
            "a sliced merge needs at least one slice".to_owned(),
        ));
    };
    // Each model opened once; its (output name, source name) pairs collected across slices.
    let mut opened: Opened = BTreeMap::new();
    for group in module_groups(slices)? {
        let scope = group[0].module.as_ref();
        assemble(
            group,
            None,
            k,
            &|name| scope.is_none_or(|m| m.contains(name)),
            &mut opened,
        )?;
    }
    let parts: Vec<(Checkpoint, Vec<(String, String)>)> = opened.into_values().collect();
    Checkpoint::assemble(first.sources[k].model.clone(), parts)
}

/// Models opened for an input, each with its (output name, source name) pairs.
type Opened = BTreeMap<PathBuf, (Checkpoint, Vec<(String, String)>)>;

/// Input `k` of slice `si` merged on its own (see the module doc): its layers numbered as in
/// the output, the tensors before the layers when it is the first slice and those after them
/// when it is the last. Returns it with the output layer of the slice's first layer.
pub(crate) fn open_slice_input(slices: &[Slice], si: usize, k: usize) -> Result<(Checkpoint, usize)> {
    let Some(slice) = slices.get(si) else {
        return Err(EngineError::Bug(format!("no slice {si}")));
    };
    let Some(src) = slice.sources.get(k) else {
        return Err(EngineError::Bug(format!("slices[{si}] has no source {k}")));
    };
    // The slice within its module's slices (all slices when none is scoped): the module's
    // layers are numbered from 0 and its tensors outside the layers come from its own first and
    // last slice.
    let mut start = 0;
    for group in module_groups(slices)? {
        if si < start + group.len() {
            let local = si - start;
            let scope = group[0].module.as_ref();
            let mut opened: Opened = BTreeMap::new();
            let offset = group[..local].iter().map(span).sum();
            assemble(
                group,
                Some(local),
                k,
                &|name| scope.is_none_or(|m| m.contains(name)),
                &mut opened,
            )?;
            let parts: Vec<(Checkpoint, Vec<(String, String)>)> = opened.into_values().collect();
            return Ok((Checkpoint::assemble(src.model.clone(), parts)?, offset));
        }
        start += group.len();
    }
    Err(EngineError::Bug(format!("slice {si} is in no module group")))
}

/// The number of layers a slice makes.
fn span(s: &Slice) -> usize {
    s.sources.first().map_or(0, |src| src.layers[1] - src.layers[0])
}

/// Collects input `k`'s tensors of `slices` (one module's, or all) among the tensors `wanted`;
/// with `only`, of that slice alone (the others only number the layers).
fn assemble(
    slices: &[Slice],
    only: Option<usize>,
    k: usize,
    wanted: &dyn Fn(&str) -> bool,
    opened: &mut Opened,
) -> Result<()> {
    let (Some(first), Some(last)) = (slices.first(), slices.last()) else {
        return Ok(());
    };
    let mut out_layer = 0usize;
    for (si, slice) in slices.iter().enumerate() {
        if only.is_some_and(|o| o != si) {
            out_layer += span(slice);
            continue;
        }
        let Some(src) = slice.sources.get(k) else {
            return Err(EngineError::Bug(format!("slices[{si}] has no source {k}")));
        };
        if !opened.contains_key(&src.model) {
            opened.insert(src.model.clone(), (Checkpoint::open(&src.model)?, Vec::new()));
        }
        let Some((ckpt, names)) = opened.get_mut(&src.model) else {
            continue;
        };
        let available = ckpt
            .tensors
            .keys()
            .filter(|n| wanted(n))
            .filter_map(|n| layer_position(&n.split('.').collect::<Vec<_>>()).map(|(_, l)| l))
            .max()
            .map_or(0, |m| m + 1);
        let [from, end] = src.layers;
        if end > available {
            let what = slice
                .module
                .as_ref()
                .map_or_else(String::new, |m| format!(" (module '{}')", m.name));
            return Err(EngineError::Invalid(format!(
                "slice {si}{what}: layers [{from}, {end}) of '{}', which has {available} layers; take layers below \
                 {available}",
                src.model.display()
            )));
        }
        for name in ckpt.tensors.keys().filter(|n| wanted(n)) {
            let parts: Vec<&str> = name.split('.').collect();
            let Some((at, layer)) = layer_position(&parts) else {
                continue;
            };
            if (from..end).contains(&layer) {
                let mut renamed: Vec<String> = parts.iter().map(|p| (*p).to_owned()).collect();
                renamed[at] = (out_layer + layer - from).to_string();
                names.push((renamed.join("."), name.clone()));
            }
        }
        out_layer += end - from;
    }
    // Tensors outside the layers: pre-layer weights from the first slice's model, the rest from
    // the last's (a module without layers: all from the first).
    let layerless = out_layer == 0;
    let ends: Vec<(&Slice, bool)> = match only {
        None => vec![(first, true), (last, false)],
        Some(o) => [(0, true), (slices.len() - 1, false)]
            .into_iter()
            .filter(|(end, _)| *end == o)
            .map(|(_, first_slice)| (&slices[o], first_slice))
            .collect(),
    };
    for (slice, first_slice) in ends {
        let Some(src) = slice.sources.get(k) else {
            return Err(EngineError::Bug(format!("a slice has no source {k}")));
        };
        let Some((ckpt, names)) = opened.get_mut(&src.model) else {
            continue;
        };
        let outside: Vec<String> = ckpt
            .tensors
            .keys()
            .filter(|n| {
                wanted(n)
                    && layer_position(&n.split('.').collect::<Vec<_>>()).is_none()
                    && from_first_slice(n, layerless) == first_slice
            })
            .cloned()
            .collect();
        names.extend(outside.into_iter().map(|n| (n.clone(), n)));
    }
    Ok(())
}

/// Aligns the vocabulary tensors of a sliced merge's `inputs` (from [`open_input`], in order)
/// to the output vocabulary of `spec` (see the module doc).
pub fn align(slices: &[Slice], spec: &TokenizerSpec, inputs: &mut [Checkpoint]) -> Result<()> {
    let (Some(first), Some(last)) = (slices.first(), slices.last()) else {
        return Ok(());
    };
    if let Some(m) = &first.module {
        return Err(EngineError::Invalid(format!(
            "slices scoped to modules (here '{}') cannot be merged on an output vocabulary yet; remove the \
             [tokenizer] table (mergekit's tokenizer_source) or merge the model without modules",
            m.name
        )));
    }
    for (slice, first_slice) in [(first, true), (last, false)] {
        let models: Vec<PathBuf> = slice.sources.iter().map(|s| s.model.clone()).collect();
        if models.len() != inputs.len() {
            return Err(EngineError::Bug(format!(
                "a slice has {} sources for {} inputs",
                models.len(),
                inputs.len()
            )));
        }
        if let Some(plan) = VocabPlan::build(spec, &models)? {
            let mut all: Vec<&mut Checkpoint> = inputs.iter_mut().collect();
            plan.align_where(&mut all, |name| is_pre_layer(name) == first_slice)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_engine::dtype::DType;
    use mergescope_engine::writer::{OutputTensor, OutputWriter};

    fn write(path: &std::path::Path, layers: usize, value: f32) {
        let mut names = vec!["model.embed_tokens.weight".to_owned(), "model.norm.weight".to_owned()];
        for l in 0..layers {
            names.push(format!("model.layers.{l}.mlp.up_proj.weight"));
        }
        let specs: Vec<OutputTensor> = names
            .iter()
            .map(|n| OutputTensor {
                name: n.clone(),
                dtype: DType::F32,
                shape: vec![2],
            })
            .collect();
        let w = OutputWriter::create(path, &specs, &BTreeMap::new(), None, false).unwrap();
        for n in &names {
            let layer = layer_position(&n.split('.').collect::<Vec<_>>()).map_or(-1.0, |(_, l)| l as f32);
            w.write_values(n, 0, &[value, layer]).unwrap();
        }
        w.commit().unwrap();
    }

    #[test]
    fn pre_layer_weights_are_mergekits() {
        for name in [
            "model.embed_tokens.weight",
            "transformer.wte.weight",
            "vision_tower.patch_conv.weight",
            "vision_tower.ln_pre.weight",
            "vision_model.layernorm_pre.bias",
        ] {
            assert!(is_pre_layer(name), "{name}");
        }
        for name in [
            "embed_out.weight",
            "lm_head.weight",
            "model.norm.weight",
            "vision_model.layernorm_post.weight",
        ] {
            assert!(!is_pre_layer(name), "{name}");
        }
        assert!(from_first_slice("multi_modal_projector.norm.weight", true));
        assert!(!from_first_slice("multi_modal_projector.norm.weight", false));
    }

    #[test]
    fn a_frankenmerge_renumbers_layers_and_takes_embeddings_first_and_norm_last() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
        write(&a, 4, 1.0);
        write(&b, 4, 2.0);
        let slices = vec![
            Slice {
                sources: vec![SliceSource {
                    model: a.clone(),
                    layers: [0, 3],
                }],
                module: None,
                params: None,
            },
            Slice {
                sources: vec![SliceSource {
                    model: b.clone(),
                    layers: [1, 4],
                }],
                module: None,
                params: None,
            },
        ];
        check(&slices, false, 1).unwrap();
        assert_eq!(layer_count(&slices), 6);
        let c = open_input(&slices, 0).unwrap();
        let read = |n: &str| c.read_f32(&c.tensors[n]).unwrap();
        assert_eq!(c.tensors.len(), 8);
        assert_eq!(read("model.embed_tokens.weight"), [1.0, -1.0]);
        assert_eq!(read("model.norm.weight"), [2.0, -1.0]);
        // Output layers 0..3 are a's 0..3; 3..6 are b's 1..4.
        for (o, (model, layer)) in [(1.0, 0.0), (1.0, 1.0), (1.0, 2.0), (2.0, 1.0), (2.0, 2.0), (2.0, 3.0)]
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                read(&format!("model.layers.{o}.mlp.up_proj.weight")),
                [model, layer],
                "layer {o}"
            );
        }
        // Layers beyond the model, and a slice without a source per input, are errors.
        let bad = vec![Slice {
            sources: vec![SliceSource {
                model: a.clone(),
                layers: [2, 6],
            }],
            module: None,
            params: None,
        }];
        let e = open_input(&bad, 0).unwrap_err().to_string();
        assert!(e.contains("[2, 6)") && e.contains("has 4 layers"), "{e}");
        // With a base, a slice of one source is the base alone (it keeps the base's layers); a
        // slice without sources is an error.
        assert!(is_slice_by_slice(&slices, 2));
        check(&slices, true, 1).unwrap();
        check(&slices, false, 2).unwrap();
        let mut empty = slices.clone();
        empty[0].sources.clear();
        let e = check(&empty, true, 1).unwrap_err().to_string();
        assert!(
            e.contains("slices[0].sources lists no source") && e.contains("base first"),
            "{e}"
        );
    }

    #[test]
    fn a_slice_merged_on_its_own_takes_its_layers_and_its_end_of_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
        write(&a, 4, 1.0);
        write(&b, 4, 2.0);
        let src = |model: &std::path::Path, layers: [usize; 2]| SliceSource {
            model: model.to_path_buf(),
            layers,
        };
        let slices = vec![
            Slice {
                sources: vec![src(&a, [0, 3])],
                module: None,
                params: None,
            },
            Slice {
                sources: vec![src(&b, [1, 4]), src(&a, [1, 4])],
                module: None,
                params: None,
            },
        ];
        assert!(is_slice_by_slice(&slices, 1));
        check(&slices, false, 1).unwrap();
        // Slice 0: the embeddings and output layers 0..3, not the final norm.
        let (first, offset) = open_slice_input(&slices, 0, 0).unwrap();
        assert_eq!(offset, 0);
        let names: Vec<&str> = first.tensors.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "model.embed_tokens.weight",
                "model.layers.0.mlp.up_proj.weight",
                "model.layers.1.mlp.up_proj.weight",
                "model.layers.2.mlp.up_proj.weight"
            ]
        );
        // Slice 1's second source: a's layers 1..4 as output layers 3..6, and a's final norm.
        let (second, offset) = open_slice_input(&slices, 1, 1).unwrap();
        assert_eq!(offset, 3);
        let read = |n: &str| second.read_f32(&second.tensors[n]).unwrap();
        assert_eq!(second.tensors.len(), 4);
        assert_eq!(read("model.layers.3.mlp.up_proj.weight"), [1.0, 1.0]);
        assert_eq!(read("model.layers.5.mlp.up_proj.weight"), [1.0, 3.0]);
        assert_eq!(read("model.norm.weight"), [1.0, -1.0]);
    }
}
