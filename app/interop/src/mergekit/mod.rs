//! mergekit's YAML merge configurations, read and turned into mergescope recipes: what
//! `mergescope merge --config merge.yml`, `mergescope recipe convert merge.yml` and the window's
//! "Open recipe" do with a configuration copied from a Hugging Face model card.
//!
//! The supported subset is the one model cards use: `merge_method`, `base_model`, `models` (each
//! with `parameters`), or `slices` (layer ranges of several models, mergekit's frankenmerges),
//! shared `parameters` with filters and gradients, `dtype`, `out_dtype`, `tokenizer_source`
//! (`union`, `base` or a model), the `tokenizer` block (`source`, per-token `tokens`,
//! `pad_to_multiple_of`) and `chat_template` ([`crate::tokenizer_union`]), all kept in the recipe
//! (its `[tokenizer]` table and `chat_template`), and `modules`, per-module merges of multimodal
//! models ([`modules`]). Every key is checked: an unknown one, or one mergescope does not do
//! yet, is an error naming it. Each mergekit method maps to a mergescope plugin with the
//! parameters that reproduce it ([`methods`]).

mod methods;
mod models;
mod modules;
mod sliced;

pub use methods::{MERGEKIT_METHODS, plugin_for};
pub use models::resolve_model;

use crate::recipe::{Recipe, TokenOverride, TokenizerTable, VocabSource, params_to_toml};
use crate::slices::Slice;
use crate::tokenizer_union::{
    ChatTemplate, EmbeddingSource, Source, TokenEmbedding, TokenRef, TokenizerSpec, VocabPlan,
};
use mergescope_engine::dtype::OutDType;
use mergescope_engine::error::{EngineError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Keys of a mergekit configuration's top level that mergescope reads.
const TOP_KEYS: &[&str] = &[
    "merge_method",
    "base_model",
    "models",
    "slices",
    "modules",
    "parameters",
    "dtype",
    "out_dtype",
    "tokenizer_source",
    "tokenizer",
    "chat_template",
];

/// A mergekit configuration turned into a mergescope recipe.
#[derive(Clone, Debug)]
pub struct Converted {
    /// The recipe (paths resolved; output as given).
    pub recipe: Recipe,
    /// What the conversion dropped or chose (e.g. `int8_mask` ignored), for the user.
    pub notes: Vec<String>,
    /// The configuration's text, kept in the output folder as `mergekit_config.yml`.
    pub text: String,
    /// How messages name the configuration ("mergekit config 'merge.yml'").
    origin: String,
}

impl Converted {
    /// The merge request: the recipe's (its `[tokenizer]` table and `chat_template` included,
    /// so that a converted recipe runs the same merge), with the configuration kept in the
    /// output folder.
    pub fn to_request(&self, overwrite: bool) -> Result<crate::request::MergeRequest> {
        let mut req = self.recipe.to_request(overwrite)?;
        if let Some(folder) = req.folder.as_mut() {
            folder.source_recipe = Some(("mergekit_config.yml".to_owned(), self.text.clone()));
            if let Some(t) = folder.tokenizer.as_mut() {
                t.origin.clone_from(&self.origin);
            }
        }
        Ok(req)
    }
}

/// Adds the notes of `more` that `notes` does not hold yet.
fn add_new_notes(notes: &mut Vec<String>, more: Vec<String>) {
    for n in more {
        if !notes.contains(&n) {
            notes.push(n);
        }
    }
}

fn invalid(file: &Path, what: impl std::fmt::Display) -> EngineError {
    EngineError::Invalid(format!("mergekit config '{}': {what}", file.display()))
}

/// Whether `path` names a mergekit YAML configuration (by extension).
pub fn is_mergekit_config(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yml") || e.eq_ignore_ascii_case("yaml"))
}

/// Reads the mergekit configuration at `file` and converts it; `out` is the output folder.
pub fn load(file: &Path, out: &Path) -> Result<Converted> {
    load_with_plugins(file, out, &[])
}

/// [`load`], where `merge_method` may also name any of the loaded plugins `plugin_ids` by its
/// own id (see [`convert_with_plugins`]).
pub fn load_with_plugins(file: &Path, out: &Path, plugin_ids: &[&str]) -> Result<Converted> {
    let text = std::fs::read_to_string(file).map_err(|e| EngineError::io("cannot read", file, e))?;
    convert_with_plugins(&text, file, out, plugin_ids)
}

/// Converts the mergekit configuration `text` (read from `file`, whose folder relative model
/// paths may also be taken from) into a recipe writing a Hugging Face folder at `out`.
pub fn convert(text: &str, file: &Path, out: &Path) -> Result<Converted> {
    convert_with_plugins(text, file, out, &[])
}

/// [`convert`], where `merge_method` may also be the id of one of the loaded plugins
/// `plugin_ids` that is not one of mergekit's names (`merge_method: tsv-m`): its top-level
/// `parameters` go to the plugin as they are, a model's own `parameters` as one value per expert,
/// and `base_model` is its base. With `models` only (not `slices` or `modules`).
pub fn convert_with_plugins(text: &str, file: &Path, out: &Path, plugin_ids: &[&str]) -> Result<Converted> {
    let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| invalid(file, format!("is not valid YAML: {e}")))?;
    let Value::Object(top) = doc else {
        return Err(invalid(
            file,
            "is not a YAML mapping of keys such as merge_method and models",
        ));
    };
    for key in top.keys() {
        if !TOP_KEYS.contains(&key.as_str()) {
            return Err(invalid(
                file,
                format!("unknown key '{key}'; a mergekit config has {}", TOP_KEYS.join(", ")),
            ));
        }
    }
    let dir = file.parent().unwrap_or(Path::new(""));
    let method = top
        .get("merge_method")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(file, "has no merge_method (e.g. merge_method: ties)"))?;
    let (mapping, plugin) = match plugin_for(method) {
        Some(m) => (m, m.plugin),
        None if plugin_ids.contains(&method) => (&methods::PLUGIN_ID, method),
        None => {
            let plugins = if plugin_ids.is_empty() {
                String::new()
            } else {
                format!(", or a loaded plugin's id: {}", plugin_ids.join(", "))
            };
            return Err(invalid(
                file,
                format!(
                    "merge_method '{method}' is not one mergescope reproduces; it has {}{plugins}",
                    MERGEKIT_METHODS.join(", ")
                ),
            ));
        }
    };
    let plain_ref = |key: &str, v: &Value| -> Result<PathBuf> {
        let s = v.as_str().ok_or_else(|| {
            invalid(
                file,
                format!("'{key}' must be a model path or Hugging Face id, not {v}"),
            )
        })?;
        resolve_model(s, dir).map_err(|e| invalid(file, format!("'{key}': {e}")))
    };
    let base = top.get("base_model").map(|v| plain_ref("base_model", v)).transpose()?;
    // `model+adapter`: a LoRA adapter applied to its model, which must be the base (the
    // adapter stands as an expert and is applied to the base as the merge reads it).
    let model_ref = |key: &str, v: &Value| -> Result<PathBuf> {
        let Some((model, adapter)) = v.as_str().and_then(|s| s.split_once('+')) else {
            return plain_ref(key, v);
        };
        let model = plain_ref(key, &Value::from(model))?;
        let adapter = plain_ref(key, &Value::from(adapter))?;
        if !crate::lora::is_adapter(&adapter) {
            return Err(invalid(
                file,
                format!(
                    "'{key}': '{}' is not a LoRA adapter folder (no adapter_config.json)",
                    adapter.display()
                ),
            ));
        }
        if base.as_deref() != Some(model.as_path()) {
            return Err(invalid(
                file,
                format!(
                    "'{key}': the LoRA adapter '{}' is applied to '{}', which is not base_model; mergescope applies \
                     adapters to the base only: merge it into its model first (peft's merge_and_unload)",
                    adapter.display(),
                    model.display()
                ),
            ));
        }
        Ok(adapter)
    };

    let shared = match top.get("parameters") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(invalid(file, format!("'parameters' must be a mapping, not {other}"))),
    };
    let mut notes = Vec::new();
    // As in mergekit, an empty list or mapping counts as not given.
    let given = |k: &str| {
        top.get(k).filter(|v| match v {
            Value::Null => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        })
    };
    if mapping.is_plugin_id()
        && let Some(k) = ["slices", "modules"].into_iter().find(|k| given(k).is_some())
    {
        return Err(invalid(
            file,
            format!(
                "'{k}' with merge_method '{method}', a plugin's own id: mergescope converts slices and modules for \
                 mergekit's methods only; list the models under 'models', or write a recipe with [[slices]]"
            ),
        ));
    }
    let layout = match (given("models"), given("slices"), given("modules")) {
        (None, None, Some(m)) => {
            if let Some(k) = ["tokenizer_source", "tokenizer"]
                .into_iter()
                .find(|k| given(k).is_some())
            {
                return Err(invalid(
                    file,
                    format!(
                        "'{k}' with 'modules': mergescope does not build an output vocabulary for a per-module merge \
                         yet; remove {k} (the models must then share their tokenizer) or merge without modules"
                    ),
                ));
            }
            let plan = modules::convert(file, m, &shared, base.as_deref(), mapping, &model_ref, &mut notes)?;
            Layout {
                base: plan.base,
                experts: plan.experts,
                params: plan.params,
                slices: plan.slices,
                tokenizer: None,
            }
        }
        (Some(models), None, None) => {
            let entries = read_models(file, "models", models, &model_ref)?;
            models_layout(
                file,
                &top,
                mapping,
                base.as_deref(),
                &shared,
                entries,
                &model_ref,
                &mut notes,
            )?
        }
        (None, Some(slices), None) => {
            let defs = sliced::read(file, "slices", slices, &model_ref, false, &mut notes)?;
            let plan = sliced::plan(
                file,
                mapping,
                base.as_deref(),
                &shared,
                &defs,
                None,
                false,
                false,
                &mut notes,
            )?;
            // With slices, every model the slices name joins the vocabulary, and each input's
            // embeddings and output head are aligned with the model they come from
            // (`slices::align`).
            let listed: Vec<PathBuf> = defs
                .iter()
                .flat_map(|s| s.sources.iter().map(|src| src.model.clone()))
                .collect();
            Layout {
                base: plan.base,
                experts: plan.experts,
                params: plan.params,
                slices: plan.slices,
                tokenizer: read_tokenizer(file, &top, base.as_deref(), &listed, &model_ref)?,
            }
        }
        (None, None, None) => {
            return Err(invalid(
                file,
                "has none of 'models', 'slices' and 'modules'; list the models to merge",
            ));
        }
        _ => {
            return Err(invalid(
                file,
                "has more than one of 'models', 'slices' and 'modules'; give exactly one",
            ));
        }
    };
    let Layout {
        base: base_path,
        experts,
        params,
        slices,
        tokenizer,
    } = layout;

    let dtype = |key: &str| -> Result<Option<OutDType>> {
        top.get(key)
            .map(|v| {
                v.as_str()
                    .and_then(OutDType::parse)
                    .ok_or_else(|| invalid(file, format!("{key} {v} is not one of float32, float16, bfloat16")))
            })
            .transpose()
    };
    // mergekit computes in `dtype` and writes `out_dtype` (default: `dtype`); mergescope
    // computes in f32 with f64 sums and writes the output dtype.
    let out_dtype = match dtype("out_dtype")? {
        Some(d) => Some(d),
        None => dtype("dtype")?,
    };
    let chat_template = match top.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            Some(ChatTemplate::parse(s).map_err(|e| invalid(file, format!("chat_template: {e}")))?)
        }
        Some(other) => {
            return Err(invalid(
                file,
                format!("chat_template must be 'auto' or a Jinja template, not {other}"),
            ));
        }
    };
    let base_path_for_table = base_path.clone();
    let recipe = Recipe {
        method: plugin.to_owned(),
        base: base_path,
        experts,
        out: out.to_path_buf(),
        seed: 0,
        dtype: out_dtype,
        device: Default::default(),
        shard_size: None,
        on_missing: Default::default(),
        params: params_to_toml(&params),
        hf_folder: true,
        config_from: None,
        tokenizer_from: None,
        chat_template,
        tokenizer: tokenizer
            .as_ref()
            .map(|spec| tokenizer_table(spec, base_path_for_table.as_deref())),
        slices,
    };
    let origin = format!("mergekit config '{}'", file.display());
    if let Some(spec) = &tokenizer {
        // The recipe's table must stand for the configuration exactly: the YAML run and a
        // converted recipe's run both go through it. (With slices the models are listed in the
        // recipe's order of inputs, which decides the tokenizer base when there is no
        // base_model: the first input, slices[0]'s first source for a method without a base.)
        let survives = recipe.tokenizer_spec(&origin)?.is_some_and(|r| {
            let mut models = (r.models.clone(), spec.models.clone());
            if !recipe.slices.is_empty() {
                models.0.sort();
                models.1.sort();
            }
            models.0 == models.1
                && TokenizerSpec {
                    models: Vec::new(),
                    ..r
                } == TokenizerSpec {
                    models: Vec::new(),
                    ..spec.clone()
                }
        });
        if !survives {
            return Err(EngineError::Bug(format!(
                "{origin}: the tokenizer settings do not survive the conversion to a recipe's [tokenizer] table \
                 ({:?})",
                recipe.tokenizer
            )));
        }
        // Checked now, so that a tokenizer that cannot be read fails before any merge starts.
        let inputs: Vec<PathBuf> = recipe.base.iter().chain(recipe.experts.iter()).cloned().collect();
        VocabPlan::build(spec, &inputs)?;
    }
    Ok(Converted {
        recipe,
        notes,
        text: text.to_owned(),
        origin,
    })
}

/// The inputs and parameters of the recipe a configuration becomes.
struct Layout {
    base: Option<PathBuf>,
    experts: Vec<PathBuf>,
    params: Map<String, Value>,
    slices: Vec<Slice>,
    tokenizer: Option<TokenizerSpec>,
}

/// The layout of a configuration with `models` (`entries`).
#[allow(clippy::too_many_arguments)]
fn models_layout(
    file: &Path,
    top: &Map<String, Value>,
    mapping: &methods::Mapping,
    base: Option<&Path>,
    shared: &Map<String, Value>,
    mut entries: Vec<Entry>,
    model_ref: &dyn Fn(&str, &Value) -> Result<PathBuf>,
    notes: &mut Vec<String>,
) -> Result<Layout> {
    // Roles: the base (when the method uses one and it is among the inputs) and the experts.
    mapping.add_unlisted_base(base, &mut entries, notes);
    let (base_entry, experts) = mapping.roles(file, base, &entries)?;
    let base_path = base_entry
        .map(|e| e.model.clone())
        .or_else(|| base.map(Path::to_path_buf).filter(|_| mapping.uses_base()));
    let params = mapping.params(file, shared, &experts, notes)?;
    let listed: Vec<PathBuf> = entries.iter().map(|e| e.model.clone()).collect();
    let tokenizer = read_tokenizer(file, top, base, &listed, model_ref)?;
    Ok(Layout {
        base: base_path,
        experts: experts.iter().map(|e| e.model.clone()).collect(),
        params,
        slices: Vec::new(),
        tokenizer,
    })
}

/// A [`TokenizerSpec`] read from a configuration as a recipe's `[tokenizer]` table (whose
/// [`Recipe::tokenizer_spec`] gives it back): `base` only where mergekit's `base_model` is not
/// the recipe's base.
fn tokenizer_table(spec: &TokenizerSpec, recipe_base: Option<&Path>) -> TokenizerTable {
    TokenizerTable {
        source: match &spec.source {
            Source::Union => VocabSource::Union,
            Source::Base => VocabSource::Base,
            Source::Model(m) => VocabSource::Model(m.clone()),
        },
        base: spec.base_model.clone().filter(|b| Some(b.as_path()) != recipe_base),
        pad_to_multiple_of: spec.pad_to_multiple_of,
        tokens: spec
            .tokens
            .iter()
            .map(|(token, e)| {
                (
                    token.clone(),
                    TokenOverride {
                        source: e.source.clone(),
                        force: e.force,
                    },
                )
            })
            .collect(),
    }
}

/// The `tokenizer_source` or `tokenizer` block, as a [`TokenizerSpec`] over the configuration's
/// models (the base first, then the `listed` ones in the configuration's order).
fn read_tokenizer(
    file: &Path,
    top: &Map<String, Value>,
    base: Option<&Path>,
    listed: &[PathBuf],
    model_ref: &dyn Fn(&str, &Value) -> Result<PathBuf>,
) -> Result<Option<TokenizerSpec>> {
    let given = |k: &str| top.get(k).filter(|v| !v.is_null());
    let source_of = |key: &str, v: &Value| -> Result<Source> {
        match v {
            Value::String(s) if s == "union" => Ok(Source::Union),
            Value::String(s) if s == "base" => Ok(Source::Base),
            Value::String(_) => Ok(Source::Model(model_ref(key, v)?)),
            other => Err(invalid(
                file,
                format!("{key} must be union, base or a model, not {other}"),
            )),
        }
    };
    let (source, tokens, pad) = match (given("tokenizer_source"), given("tokenizer")) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(invalid(
                file,
                "has both tokenizer_source and tokenizer; give one (tokenizer: {source: ...} holds the source)",
            ));
        }
        (Some(v), None) => (source_of("tokenizer_source", v)?, Vec::new(), None),
        (None, Some(block)) => {
            let obj = block.as_object().ok_or_else(|| {
                invalid(
                    file,
                    format!("'tokenizer' must be a mapping with source, tokens, pad_to_multiple_of, not {block}"),
                )
            })?;
            check_keys(file, "tokenizer", obj, &["source", "tokens", "pad_to_multiple_of"])?;
            let source = match obj.get("source").filter(|v| !v.is_null()) {
                None => Source::Union,
                Some(v) => source_of("tokenizer.source", v)?,
            };
            let pad = match obj.get("pad_to_multiple_of").filter(|v| !v.is_null()) {
                None => None,
                Some(v) => Some(v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                    invalid(
                        file,
                        format!("tokenizer.pad_to_multiple_of must be a positive integer, not {v}"),
                    )
                })? as usize),
            };
            let tokens = match obj.get("tokens").filter(|v| !v.is_null()) {
                None => Vec::new(),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(tok, cfg)| Ok((tok.clone(), token_embedding(file, tok, cfg, model_ref)?)))
                    .collect::<Result<Vec<_>>>()?,
                Some(other) => {
                    return Err(invalid(
                        file,
                        format!("tokenizer.tokens must be a mapping of token to {{source, force}}, not {other}"),
                    ));
                }
            };
            (source, tokens, pad)
        }
    };
    if source == Source::Base && base.is_none() {
        return Err(invalid(file, "tokenizer_source: base needs a base_model"));
    }
    let mut models: Vec<PathBuf> = base.iter().map(|b| b.to_path_buf()).collect();
    for m in listed {
        if !models.contains(m) {
            models.push(m.clone());
        }
    }
    Ok(Some(TokenizerSpec {
        source,
        tokens,
        pad_to_multiple_of: pad,
        base_model: base.map(Path::to_path_buf),
        models,
        origin: format!("mergekit config '{}'", file.display()),
    }))
}

/// One `tokenizer.tokens` entry: `{source: ..., force: ...}`.
fn token_embedding(
    file: &Path,
    token: &str,
    cfg: &Value,
    model_ref: &dyn Fn(&str, &Value) -> Result<PathBuf>,
) -> Result<TokenEmbedding> {
    let what = format!("tokenizer.tokens['{token}']");
    let obj = match cfg {
        Value::Null => {
            return Ok(TokenEmbedding {
                source: None,
                force: false,
            });
        }
        Value::Object(o) => o,
        other => {
            return Err(invalid(
                file,
                format!("{what} must be a mapping with source and force, not {other}"),
            ));
        }
    };
    check_keys(file, &what, obj, &["source", "force"])?;
    let force = match obj.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(invalid(
                file,
                format!("{what}.force must be true or false, not {other}"),
            ));
        }
    };
    let source = match obj.get("source") {
        None | Some(Value::Null) => None,
        Some(v @ Value::String(_)) => Some(EmbeddingSource::Model(model_ref(&format!("{what}.source"), v)?)),
        Some(Value::Object(src)) => {
            let kind = src.get("kind").and_then(Value::as_str);
            match kind {
                Some("zero") => {
                    check_keys(file, &format!("{what}.source"), src, &["kind"])?;
                    Some(EmbeddingSource::Zero)
                }
                Some("model_token") => {
                    check_keys(
                        file,
                        &format!("{what}.source"),
                        src,
                        &["kind", "model", "token_id", "token"],
                    )?;
                    let model = src
                        .get("model")
                        .ok_or_else(|| invalid(file, format!("{what}.source (model_token) has no 'model'")))?;
                    let model = model_ref(&format!("{what}.source.model"), model)?;
                    let token = match (src.get("token_id"), src.get("token")) {
                        (Some(id), None) => TokenRef::Id(id.as_u64().ok_or_else(|| {
                            invalid(file, format!("{what}.source.token_id must be a row number, not {id}"))
                        })? as usize),
                        (None, Some(Value::String(t))) => TokenRef::Text(t.clone()),
                        _ => {
                            return Err(invalid(
                                file,
                                format!(
                                    "{what}.source (model_token) needs exactly one of token_id and token (a string)"
                                ),
                            ));
                        }
                    };
                    Some(EmbeddingSource::ModelToken { model, token })
                }
                _ => {
                    return Err(invalid(
                        file,
                        format!(
                            "{what}.source: kind must be model_token or zero (or give a model path), not {}",
                            src.get("kind").map_or_else(|| "missing".to_owned(), Value::to_string)
                        ),
                    ));
                }
            }
        }
        Some(other) => {
            return Err(invalid(
                file,
                format!("{what}.source must be a model, {{kind: model_token, ...}} or {{kind: zero}}, not {other}"),
            ));
        }
    };
    Ok(TokenEmbedding { source, force })
}

/// One input model as the configuration lists it.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Resolved path (for slices: the model of the first slice at this input).
    pub model: PathBuf,
    /// Its `parameters` (for slices: resolved over the slices, `sliced`).
    pub params: Map<String, Value>,
}

fn params_of(file: &Path, what: &str, v: Option<&Value>) -> Result<Map<String, Value>> {
    match v {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(invalid(
            file,
            format!("{what}: 'parameters' must be a mapping, not {other}"),
        )),
    }
}

fn check_keys(file: &Path, what: &str, obj: &Map<String, Value>, allowed: &[&str]) -> Result<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(invalid(
            file,
            format!("{what}: unknown key '{k}'; an entry has {}", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

fn read_models(
    file: &Path,
    key: &str,
    models: &Value,
    model_ref: &dyn Fn(&str, &Value) -> Result<PathBuf>,
) -> Result<Vec<Entry>> {
    let list = models.as_array().ok_or_else(|| {
        invalid(
            file,
            format!("'{key}' must be a list of {{model: ..., parameters: ...}}"),
        )
    })?;
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let what = format!("{key}[{i}]");
            let (model, params) = match m {
                Value::String(_) => (model_ref(&what, m)?, Map::new()),
                Value::Object(obj) => {
                    check_keys(file, &what, obj, &["model", "parameters"])?;
                    let model = obj
                        .get("model")
                        .ok_or_else(|| invalid(file, format!("{what} has no 'model'")))?;
                    (model_ref(&what, model)?, params_of(file, &what, obj.get("parameters"))?)
                }
                other => {
                    return Err(invalid(
                        file,
                        format!("{what} must be a mapping with 'model', not {other}"),
                    ));
                }
            };
            Ok(Entry { model, params })
        })
        .collect()
}
