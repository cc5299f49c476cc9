//! mergekit's `modules`: a multimodal model merged module by module (its text decoder, vision
//! tower, projector), each module with its own `models` or `slices` and `parameters`.
//!
//! As mergekit 0.1.5 defines it (`OutputModuleDefinition`): a module has exactly one of `models`
//! and `slices`, and optional `parameters`; `merge_method` and `base_model` are the top level's
//! for every module. A model's parameters come first, then its module's, then the top level's
//! (a filter list that matches no tensor falls through to the next). The modules are those of
//! the models' architecture in mergekit (`mergekit/_data/architectures/*.json`), known here by
//! the prefixes of their tensor names ([`ARCHITECTURES`]); any other architecture is one module,
//! `default`. A module the configuration does not list is not written, as in mergekit.
//!
//! The modules become one recipe: slices scoped to each module ([`crate::slices::ModuleScope`]),
//! so that input k of the merge is assembled from the k-th model of every module, and one
//! parameter table whose values differ by module through `{filter, value}` lists of the
//! modules' prefixes. Where the modules (or a module's slices) merge different numbers of models,
//! every slice carries its own parameters instead and is merged on its own, within its module
//! ([`crate::slices`], "Slice by slice").

use super::methods::Mapping;
use super::sliced::{self, SliceDef, SourceDef, chain};
use super::{add_new_notes, check_keys, invalid, params_of, read_models};
use crate::slices::{ModuleScope, Slice};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::Result;
use mergescope_engine::layered::layer_index;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One module of an architecture: mergekit's name and the prefixes of its tensor names.
struct ModuleDef {
    name: &'static str,
    prefixes: &'static [&'static str],
}

const fn module(name: &'static str, prefixes: &'static [&'static str]) -> ModuleDef {
    ModuleDef { name, prefixes }
}

/// Text decoder, projector and vision tower under `language_model.`, `multi_modal_projector.`
/// and `vision`.
const LLAVA_LIKE: &[ModuleDef] = &[
    module("text_decoder", &["language_model."]),
    module("multi_modal_projector", &["multi_modal_projector."]),
    module("vision_tower", &["vision_tower."]),
];
const QWEN2_VL: &[ModuleDef] = &[
    module("text_decoder", &["model.", "lm_head."]),
    module("multi_modal_projector", &["visual.merger."]),
    module("vision_tower", &["visual."]),
];
const QWEN3_VL: &[ModuleDef] = &[
    module("text_decoder", &["model.language_model.", "lm_head."]),
    module(
        "multi_modal_projector",
        &["model.visual.merger.", "model.visual.deepstack_merger_list."],
    ),
    module("vision_tower", &["model.visual."]),
];

/// mergekit 0.1.5's modular architectures (by `config.json` `architectures[0]`), their modules
/// as its JSON definitions prefix their weights; the first module holds the layer count a
/// top-level `num_hidden_layers` gives. (T5 and Whisper, also modular there, are not listed: T5's
/// layers are `block.N`, which mergescope does not number, and mergekit's Whisper prefix lacks
/// its dot.)
const ARCHITECTURES: &[(&str, &[ModuleDef])] = &[
    ("Mistral3ForConditionalGeneration", LLAVA_LIKE),
    (
        "Gemma3ForConditionalGeneration",
        &[
            module("text_decoder", &["language_model."]),
            module("multi_modal_projector", &["multi_modal_projector."]),
            module("vision_tower", &["vision_tower.vision_model."]),
        ],
    ),
    (
        "Llama4ForConditionalGeneration",
        &[
            module("text_decoder", &["language_model."]),
            module("multi_modal_projector", &["multi_modal_projector."]),
            module("vision_model", &["vision_model."]),
        ],
    ),
    ("Qwen2VLForConditionalGeneration", QWEN2_VL),
    ("Qwen2_5_VLForConditionalGeneration", QWEN2_VL),
    ("Qwen3VLForConditionalGeneration", QWEN3_VL),
    ("Qwen3VLMoeForConditionalGeneration", QWEN3_VL),
];

const DEFAULT_MODULE: &[ModuleDef] = &[module("default", &[""])];

/// Keys a module definition has.
const MODULE_KEYS: &[&str] = &["models", "slices", "parameters"];

/// The module scopes of architecture `defs` (each with the longer prefixes of the others that
/// fall inside its own as exceptions).
fn scopes(defs: &[ModuleDef]) -> Vec<ModuleScope> {
    defs.iter()
        .map(|d| ModuleScope {
            name: d.name.to_owned(),
            prefixes: d.prefixes.iter().map(|p| (*p).to_owned()).collect(),
            except: defs
                .iter()
                .filter(|o| o.name != d.name)
                .flat_map(|o| o.prefixes.iter())
                .filter(|o| d.prefixes.iter().any(|p| o.len() > p.len() && o.starts_with(p)))
                .map(|o| (*o).to_owned())
                .collect(),
        })
        .collect()
}

/// `architectures[0]` of the model's `config.json`, when it has one.
fn architecture(model: &Path) -> Option<String> {
    let text = std::fs::read_to_string(model.join("config.json")).ok()?;
    let config: Value = serde_json::from_str(&text).ok()?;
    config.get("architectures")?.get(0)?.as_str().map(str::to_owned)
}

/// One listed module, converted.
struct Converted {
    scope: ModuleScope,
    base: Option<PathBuf>,
    experts: Vec<PathBuf>,
    slices: Vec<Slice>,
    params: Map<String, Value>,
    /// What the module was planned from: its parameters chained over the top level's, and its
    /// slices (to plan it again slice by slice).
    shared: Map<String, Value>,
    defs: Vec<SliceDef>,
}

/// What a configuration with `modules` becomes: the recipe's base, experts, slices and
/// parameters.
pub(crate) struct Plan {
    pub base: Option<PathBuf>,
    pub experts: Vec<PathBuf>,
    pub slices: Vec<Slice>,
    pub params: Map<String, Value>,
}

/// Layer counts of modules in models, read from their tensor names once per model.
#[derive(Default)]
struct Layers {
    names: BTreeMap<PathBuf, Vec<String>>,
}

impl Layers {
    fn names(&mut self, model: &Path) -> Result<&[String]> {
        if !self.names.contains_key(model) {
            let ckpt = Checkpoint::open(model)?;
            self.names
                .insert(model.to_path_buf(), ckpt.tensors.keys().cloned().collect());
        }
        Ok(self.names.get(model).map_or(&[][..], Vec::as_slice))
    }

    fn count(&mut self, model: &Path, scope: &ModuleScope) -> Result<usize> {
        Ok(self
            .names(model)?
            .iter()
            .filter(|n| scope.contains(n))
            .filter_map(|n| layer_index(n))
            .max()
            .map_or(0, |m| m + 1))
    }
}

/// Converts `modules` (the value of the top-level key) with the top-level `shared` parameters.
#[allow(clippy::too_many_arguments)]
pub(crate) fn convert(
    file: &Path,
    modules: &Value,
    shared: &Map<String, Value>,
    base: Option<&Path>,
    mapping: &Mapping,
    model_ref: &dyn Fn(&str, &Value) -> Result<PathBuf>,
    notes: &mut Vec<String>,
) -> Result<Plan> {
    let listed = modules.as_object().filter(|m| !m.is_empty()).ok_or_else(|| {
        invalid(
            file,
            "'modules' must be a mapping of module name to {models: [...]} or {slices: [...]} (e.g. \
                 text_decoder, vision_tower)",
        )
    })?;
    // The architecture: the base's, else the first model's of the first module.
    let first_model = match base {
        Some(b) => b.to_path_buf(),
        None => {
            let (name, def) = listed
                .iter()
                .next()
                .ok_or_else(|| invalid(file, "'modules' is empty"))?;
            let first = def
                .get("models")
                .and_then(|m| m.get(0))
                .map(|m| m.get("model").unwrap_or(m))
                .or_else(|| {
                    def.get("slices")
                        .and_then(|s| s.get(0)?.get("sources")?.get(0)?.get("model"))
                })
                .ok_or_else(|| invalid(file, format!("modules.{name} lists no model")))?;
            model_ref(&format!("modules.{name}"), first)?
        }
    };
    let arch = architecture(&first_model);
    let defs = arch
        .as_deref()
        .and_then(|a| ARCHITECTURES.iter().find(|(n, _)| *n == a))
        .map_or(DEFAULT_MODULE, |(_, d)| *d);
    let all = scopes(defs);
    let arch_name = arch
        .clone()
        .unwrap_or_else(|| "unknown (no config.json architectures)".to_owned());

    let mut layers = Layers::default();
    let mut converted: Vec<Converted> = Vec::new();
    for (name, def) in listed {
        let what = format!("modules.{name}");
        let Some(scope) = all.iter().find(|s| &s.name == name).cloned() else {
            let names: Vec<&str> = defs.iter().map(|d| d.name).collect();
            let hint = if defs.len() == 1 {
                format!(
                    "; mergescope knows no modules of architecture {arch_name} and merges it as one module, 'default' \
                     (or use top-level models or slices)"
                )
            } else {
                String::new()
            };
            return Err(invalid(
                file,
                format!(
                    "'{what}': architecture {arch_name} (of '{}') has the modules {}{hint}",
                    first_model.display(),
                    names.join(", ")
                ),
            ));
        };
        let obj = def.as_object().ok_or_else(|| {
            invalid(
                file,
                format!("'{what}' must be a mapping with models or slices (and parameters)"),
            )
        })?;
        if let Some(k) = obj.keys().find(|k| {
            matches!(
                k.as_str(),
                "merge_method" | "base_model" | "dtype" | "out_dtype" | "tokenizer_source"
            )
        }) {
            return Err(invalid(
                file,
                format!(
                    "'{what}.{k}': a module has only models or slices, and parameters; mergekit 0.1.5 merges every \
                     module with the top-level {k} (it ignores a module's own): move it to the top level, or merge \
                     the modules in separate configurations"
                ),
            ));
        }
        check_keys(file, &what, obj, MODULE_KEYS)?;
        let module_params = params_of(file, &what, obj.get("parameters"))?;
        let defs: Vec<SliceDef> = match (
            obj.get("models").filter(|v| !v.is_null()),
            obj.get("slices").filter(|v| !v.is_null()),
        ) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(invalid(
                    file,
                    format!(
                        "'{what}' must have exactly one of models and slices (mergekit: 'Must specify either output slices or models to merge')"
                    ),
                ));
            }
            (Some(models), None) => {
                let mut entries = read_models(file, &format!("{what}.models"), models, model_ref)?;
                // mergekit adds a base_model the models do not list, after them.
                if let Some(b) = base
                    && !entries.iter().any(|e| e.model == b)
                {
                    mapping.append_unlisted_base(&format!("{what}: "), b, &mut entries, notes);
                }
                // One slice of every model's layers of the module (mergekit's normalize_config).
                let mut sources = Vec::with_capacity(entries.len());
                for (i, e) in entries.into_iter().enumerate() {
                    let n = layers.count(&e.model, &scope)?;
                    sources.push(SourceDef {
                        model: e.model,
                        layers: [0, n],
                        params: e.params,
                        what: format!("{what}.models[{i}]"),
                    });
                }
                vec![SliceDef {
                    sources,
                    params: Map::new(),
                    base: None,
                    what: format!("{what}.models"),
                }]
            }
            (None, Some(slices)) => {
                let defs = sliced::read(file, &format!("{what}.slices"), slices, model_ref, true, notes)?;
                // Output layer counts stay as the models have them (config.json is not rewritten
                // per module).
                let total: usize = defs
                    .iter()
                    .map(|s| s.sources.first().map_or(0, |src| src.layers[1] - src.layers[0]))
                    .sum();
                if let Some(src) = defs.first().and_then(|s| s.sources.first()) {
                    let n = layers.count(&src.model, &scope)?;
                    if total != n {
                        return Err(invalid(
                            file,
                            format!(
                                "'{what}.slices' make {total} layers of module {name}, which has {n} in '{}'; \
                                 mergescope keeps each module's layer count (it does not rewrite \
                                 text_config.num_hidden_layers and the like): slice the module into {n} layers",
                                src.model.display()
                            ),
                        ));
                    }
                }
                defs
            }
        };
        // Precedence: the model's (or slice source's), the slice's, the module's, the top
        // level's (filter lists fall through).
        let mut module_shared = shared.clone();
        for (k, v) in &module_params {
            if let Some(chained) = chain(Some(v), shared.get(k)) {
                module_shared.insert(k.clone(), chained);
            }
        }
        // With several modules every gradient is evaluated per slice of its module (the host
        // would count the layers over all modules).
        let plan = sliced::plan(
            file,
            mapping,
            base,
            &module_shared,
            &defs,
            Some(&scope),
            listed.len() > 1,
            false,
            notes,
        )?;
        converted.push(Converted {
            scope,
            base: plan.base,
            experts: plan.experts,
            slices: plan.slices,
            params: plan.params,
            shared: module_shared,
            defs,
        });
    }
    // Every module is one part of the same inputs where they merge as many models; otherwise
    // (or where a module's own slices differ) every slice of every module is merged on its own
    // with its own parameters, as mergekit plans each slice.
    let first = &converted[0];
    let slice_by_slice = converted.iter().any(|c| {
        c.base.is_some() != first.base.is_some()
            || c.experts.len() != first.experts.len()
            || c.slices.iter().any(|s| s.params.is_some())
    });
    if slice_by_slice {
        for c in &mut converted {
            let mut own = Vec::new();
            let plan = sliced::plan(
                file,
                mapping,
                base,
                &c.shared,
                &c.defs,
                Some(&c.scope),
                false,
                true,
                &mut own,
            )?;
            add_new_notes(notes, own);
            c.slices = plan.slices;
            c.params = plan.params;
        }
    }
    for d in defs {
        if !converted.iter().any(|c| c.scope.name == d.name) {
            notes.push(format!(
                "module {} is not listed in 'modules': its tensors are not written, as mergekit does",
                d.name
            ));
        }
    }
    // The first module of the architecture first (its layer count is the one a top-level
    // num_hidden_layers holds, which the output's config.json keeps).
    converted.sort_by_key(|c| defs.iter().position(|d| d.name == c.scope.name));
    if converted[0].scope.name != defs[0].name && top_level_layers(&first_model) {
        return Err(invalid(
            file,
            format!(
                "'modules' leaves out {}, whose layer count '{}/config.json' keeps at its top level; list {} too (its \
                 models unchanged) or merge the model without modules",
                defs[0].name,
                first_model.display(),
                defs[0].name
            ),
        ));
    }
    let params = if slice_by_slice {
        Map::new()
    } else {
        let names = layers.names(&first_model)?.to_vec();
        fold_params(file, mapping, &converted, &names)?
    };
    // The recipe's inputs: those of the first module that merges something.
    let Some(first) = converted.iter().find(|c| !c.experts.is_empty()) else {
        return Err(invalid(
            file,
            "every module lists only the base: there is nothing to merge",
        ));
    };
    Ok(Plan {
        base: first.base.clone(),
        experts: first.experts.clone(),
        slices: converted.iter().flat_map(|c| c.slices.iter().cloned()).collect(),
        params,
    })
}

/// Whether the model's `config.json` has a layer count at its top level.
fn top_level_layers(model: &Path) -> bool {
    std::fs::read_to_string(model.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|c| {
            ["num_hidden_layers", "n_layer", "num_layers"]
                .iter()
                .any(|k| c.get(*k).is_some())
        })
}

/// The modules' parameters as one table: a value all modules share as it is, else a
/// `{filter, value}` list of the modules' prefixes (longest first); per-model values per
/// expert. `names` (the tensors of a model) check that each tensor takes its own module's entry.
fn fold_params(file: &Path, mapping: &Mapping, modules: &[Converted], names: &[String]) -> Result<Map<String, Value>> {
    let mut filters: Vec<(&str, usize)> = modules
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.scope.prefixes.iter().map(move |p| (p.as_str(), i)))
        .collect();
    filters.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    // A filter matches anywhere in a name: every tensor must meet its own module's first.
    for n in names {
        let Some(own) = modules.iter().position(|c| c.scope.contains(n)) else {
            continue;
        };
        let hit = filters.iter().find(|(p, _)| n.contains(p)).map(|(_, i)| *i);
        if hit != Some(own) {
            return Err(invalid(
                file,
                format!(
                    "'modules': the parameters of module {} cannot be told apart by tensor name on '{n}'; give the \
                     modules the same parameters",
                    modules[own].scope.name
                ),
            ));
        }
    }
    let by_module = |values: &[Value]| -> Value {
        Value::Array(
            filters
                .iter()
                .map(|(p, i)| json!({ "filter": p, "value": values[*i] }))
                .collect(),
        )
    };
    let keys: std::collections::BTreeSet<&String> = modules.iter().flat_map(|c| c.params.keys()).collect();
    let mut out = Map::new();
    for key in keys {
        let mut values = Vec::with_capacity(modules.len());
        for c in modules {
            let v = c.params.get(key).ok_or_else(|| {
                invalid(
                    file,
                    format!(
                        "'modules': '{key}' is set for some modules but not for {}; give it there too (or at the top \
                         level)",
                        c.scope.name
                    ),
                )
            })?;
            values.push(v.clone());
        }
        if values.iter().all(|v| *v == values[0]) {
            out.insert(key.clone(), values[0].clone());
            continue;
        }
        let numeric = |v: &Value| match v {
            Value::Number(_) => true,
            Value::Array(items) => items.iter().all(|i| i.is_number() || i.is_array() || i.is_object()),
            _ => false,
        };
        if !values.iter().all(numeric) {
            return Err(invalid(
                file,
                format!(
                    "'modules': the modules give '{key}' different values ({}); mergescope varies only numeric \
                     parameters by module: give them the same",
                    values.iter().map(Value::to_string).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if mapping.is_per_model(key) && values.iter().any(Value::is_array) {
            let experts = modules[0].experts.len();
            let per_expert: Vec<Value> = (0..experts)
                .map(|j| {
                    let vals: Vec<Value> = values
                        .iter()
                        .map(|v| match v {
                            Value::Array(items) => items.get(j).cloned().unwrap_or(Value::Null),
                            other => other.clone(),
                        })
                        .collect();
                    if vals.iter().all(|v| *v == vals[0]) {
                        vals[0].clone()
                    } else {
                        by_module(&vals)
                    }
                })
                .collect();
            out.insert(key.clone(), Value::Array(per_expert));
        } else {
            out.insert(key.clone(), by_module(&values));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_modules_except_the_longer_prefixes_of_the_others() {
        let s = scopes(QWEN2_VL);
        let vision = s.iter().find(|m| m.name == "vision_tower").unwrap();
        assert_eq!(vision.except, ["visual.merger."]);
        assert!(vision.contains("visual.blocks.0.attn.qkv.weight"));
        assert!(!vision.contains("visual.merger.mlp.0.weight"));
        assert!(s[0].contains("lm_head.weight") && !s[0].contains("visual.blocks.0.norm1.weight"));
    }
}
