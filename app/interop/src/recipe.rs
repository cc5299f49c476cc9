//! Recipes: a merge written down as TOML (inputs, method, parameters, seed, output, device),
//! the unit the GUI saves and `mergescope merge RECIPE.toml` runs. Relative paths are taken
//! from the recipe's folder, so a recipe travels with its checkpoints.
//!
//! ```toml
//! method = "ties"
//! base = "base.safetensors"
//! experts = ["math.safetensors", "code.safetensors"]
//! out = "merged.safetensors"
//! seed = 0
//! dtype = "bf16"        # optional: f32 | f16 | bf16 (default: as the inputs)
//! device = "cpu"        # optional: cpu | cuda | metal
//! shard_size = "2GB"    # optional: split the output into shards of at most this size
//! on_missing = "error"  # optional: error | use-reference | skip
//! hf_folder = true      # optional: write a Hugging Face model folder (config, tokenizer, card)
//! config_from = "base"  # optional: the folder whose config.json goes with it (default: the base's)
//! [params]
//! density = 0.2
//! lambda = 1.0
//! ```
//!
//! A frankenmerge (mergekit's `slices`) lists layer ranges instead of taking whole models; each
//! slice has one source per input, the base first:
//!
//! ```toml
//! method = "passthrough"
//! experts = ["a"]
//! out = "merged"
//! hf_folder = true
//! [[slices]]
//! sources = [{ model = "a", layers = [0, 24] }]
//! [[slices]]
//! sources = [{ model = "b", layers = [8, 32] }]
//! ```
//!
//! Slices may also merge different models, as mergekit's do: a slice listing another number of
//! sources (its base first when the recipe has one, then its own models), or giving its own
//! `params` (over the recipe's `[params]`, e.g. `params = { lambda = 0.9 }`), makes every slice
//! a merge of its own, its gradients restarting in it ([`crate::slices`], "Slice by slice").
//!
//! Models whose tokenizers differ are merged on an output vocabulary built from their
//! `tokenizer.json` files, as mergekit's `tokenizer_source`, `tokenizer:` block and
//! `chat_template` do (docs/mergekit.md, "Tokenizers"; [`crate::tokenizer_union`]). Either key
//! makes the output a Hugging Face folder, as `hf_folder = true`:
//!
//! ```toml
//! chat_template = "auto"   # optional: "auto" (the template most inputs share), a name (chatml, …) or a Jinja template
//! [tokenizer]
//! source = "union"         # union (default) | base | the path of a model (its vocabulary)
//! base = "base"            # optional: mergekit's base_model when it is not the recipe's base
//!                          # (the tokenizer base and the row donor of last resort)
//! pad_to_multiple_of = 64  # optional: round the vocabulary rows up to a multiple of this
//! [tokenizer.tokens."<|im_start|>"]   # optional, per token (added when no tokenizer has it)
//! source = "hermes"        # this model's row of the token where a model lacks it
//! force = true             # optional: that row for every model, even those that have the token
//! [tokenizer.tokens."<|im_end|>"]
//! source = { kind = "model_token", model = "hermes", token = "</s>" }   # or token_id = 2
//! [tokenizer.tokens."<pad>"]
//! source = { kind = "zero" }
//! ```
//!
//! Tokens missing from every tokenizer are added in the order of their keys (sorted), as a
//! converted mergekit configuration adds them. `source = "base"` needs a base (the recipe's or
//! `[tokenizer] base`); the tokenizer files of a `base` or model source are those copied when the
//! vocabulary does not change (`tokenizer_from`, when given, overrides that folder). With
//! `[[slices]]`, the vocabulary is built from every model the slices name, and each input's
//! embeddings and output head are aligned with the tokenizer of the model they come from
//! ([`crate::slices::align`]).

use crate::hf_folder::FolderOutput;
use crate::request::MergeRequest;
use crate::slices::Slice;
use crate::tokenizer_union::{ChatTemplate, EmbeddingSource, Source, TokenEmbedding, TokenRef, TokenizerSpec};
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::device::DeviceChoice;
use mergescope_engine::dtype::OutDType;
use mergescope_engine::error::{EngineError, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// A merge recipe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Plugin id.
    pub method: String,
    /// Base checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<PathBuf>,
    /// Expert checkpoints.
    pub experts: Vec<PathBuf>,
    /// Output path.
    pub out: PathBuf,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
    /// Output dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<OutDType>,
    /// Device.
    #[serde(default)]
    pub device: DeviceChoice,
    /// Largest output shard, e.g. "2GB" or a byte count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_size: Option<String>,
    /// Policy for tensors that not every input has.
    #[serde(default)]
    pub on_missing: MissingPolicy,
    /// Method parameters.
    #[serde(default)]
    pub params: toml::Table,
    /// Write a Hugging Face model folder at `out` (config, tokenizer and model card beside the
    /// weights) instead of a bare checkpoint.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hf_folder: bool,
    /// The folder whose `config.json` (and `generation_config.json`) the folder output takes;
    /// default: the base's, else the first expert's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_from: Option<PathBuf>,
    /// The folder whose tokenizer files the folder output takes; default: the `[tokenizer]`
    /// source's (a `base` or model source), else `config_from`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_from: Option<PathBuf>,
    /// The output tokenizer's chat template (mergekit's `chat_template`): `"auto"`, a named one or a Jinja
    /// template.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "chat_template_text")]
    pub chat_template: Option<ChatTemplate>,
    /// The output vocabulary built from the inputs' tokenizers (mergekit's `tokenizer_source` and
    /// `tokenizer:` block; see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerTable>,
    /// Layer slices of several models instead of whole models (see the module doc).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<Slice>,
}

/// A recipe's `[tokenizer]` table: what output vocabulary to build from the inputs' tokenizers
/// (turned into a [`TokenizerSpec`] by [`Recipe::tokenizer_spec`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerTable {
    /// `"union"` (default), `"base"` or the path of a model.
    #[serde(default)]
    pub source: VocabSource,
    /// mergekit's `base_model` when it is not the recipe's base (a method without a base role):
    /// the tokenizer the vocabulary starts from, and the row donor of last resort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<PathBuf>,
    /// Round the vocabulary's rows up to a multiple of this (padding rows: each model's mean row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_to_multiple_of: Option<usize>,
    /// Per-token row sources, by token (mergekit's `tokenizer.tokens`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tokens: BTreeMap<String, TokenOverride>,
}

/// One `[tokenizer.tokens."TOKEN"]` entry (mergekit's `{source, force}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenOverride {
    /// Where the token's row comes from where a model lacks it (`None`: mergekit's defaults; the
    /// token is only added).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "row_source")]
    pub source: Option<EmbeddingSource>,
    /// Take the source's row for every model, even those that have the token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// Where a recipe's output vocabulary comes from (`[tokenizer] source`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum VocabSource {
    /// Every input's tokens: the base's tokenizer plus the others' tokens it lacks.
    #[default]
    Union,
    /// The base's vocabulary.
    Base,
    /// This model's vocabulary.
    Model(PathBuf),
}

impl Serialize for VocabSource {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            VocabSource::Union => s.serialize_str("union"),
            VocabSource::Base => s.serialize_str("base"),
            VocabSource::Model(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for VocabSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) if s == "union" => Ok(VocabSource::Union),
            toml::Value::String(s) if s == "base" => Ok(VocabSource::Base),
            toml::Value::String(s) if !s.trim().is_empty() => Ok(VocabSource::Model(PathBuf::from(s))),
            other => Err(D::Error::custom(format!(
                "[tokenizer] source must be \"union\", \"base\" or the path of a model, not {other}"
            ))),
        }
    }
}

/// `chat_template` as its text: `"auto"`, the template's name, or the template.
mod chat_template_text {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<ChatTemplate>, s: S) -> std::result::Result<S::Ok, S::Error> {
        match t {
            Some(ChatTemplate::Auto) => s.serialize_str("auto"),
            Some(ChatTemplate::Literal(text)) => s.serialize_str(text),
            Some(ChatTemplate::Named(name)) => s.serialize_str(name),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<ChatTemplate>, D::Error> {
        use serde::de::Error as _;
        match toml::Value::deserialize(d)? {
            toml::Value::String(text) => ChatTemplate::parse(&text)
                .map(Some)
                .map_err(|e| D::Error::custom(format!("chat_template: {e}"))),
            other => Err(D::Error::custom(format!(
                "chat_template must be \"auto\", a named template or a Jinja template (a string), not {other}"
            ))),
        }
    }
}

/// A `[tokenizer.tokens]` entry's `source`: a model path, `{ kind = "model_token", model,
/// token | token_id }` or `{ kind = "zero" }`.
mod row_source {
    use super::*;
    use serde::de::Error as _;

    pub fn serialize<S: Serializer>(src: &Option<EmbeddingSource>, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut t = toml::Table::new();
        match src {
            None => return s.serialize_none(),
            Some(EmbeddingSource::Model(p)) => return p.serialize(s),
            Some(EmbeddingSource::Zero) => {
                t.insert("kind".into(), "zero".into());
            }
            Some(EmbeddingSource::ModelToken { model, token }) => {
                t.insert("kind".into(), "model_token".into());
                let model = model
                    .to_str()
                    .ok_or_else(|| serde::ser::Error::custom(format!("'{}' is not UTF-8", model.display())))?;
                t.insert("model".into(), model.into());
                match token {
                    TokenRef::Text(text) => t.insert("token".into(), text.as_str().into()),
                    TokenRef::Id(id) => t.insert("token_id".into(), toml::Value::Integer(*id as i64)),
                };
            }
        }
        t.serialize(s)
    }

    const KINDS: &str = "a model path, { kind = \"model_token\", model = \"...\", token = \"...\" } (or token_id = N) \
                         or { kind = \"zero\" }";

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<EmbeddingSource>, D::Error> {
        let table = match toml::Value::deserialize(d)? {
            toml::Value::String(p) if !p.trim().is_empty() => {
                return Ok(Some(EmbeddingSource::Model(PathBuf::from(p))));
            }
            toml::Value::Table(t) => t,
            other => {
                return Err(D::Error::custom(format!(
                    "a token's source must be {KINDS}, not {other}"
                )));
            }
        };
        let allowed: &[&str] = match table.get("kind").and_then(toml::Value::as_str) {
            Some("zero") => &["kind"],
            Some("model_token") => &["kind", "model", "token", "token_id"],
            other => {
                return Err(D::Error::custom(format!(
                    "a token's source kind must be \"model_token\" or \"zero\", not {}; write {KINDS}",
                    other.map_or_else(|| "missing".to_owned(), |k| format!("\"{k}\""))
                )));
            }
        };
        if let Some(k) = table.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(D::Error::custom(format!(
                "unknown key `{k}` in a token's source; it has {}",
                allowed.join(", ")
            )));
        }
        if table.get("kind").and_then(toml::Value::as_str) == Some("zero") {
            return Ok(Some(EmbeddingSource::Zero));
        }
        let model = table
            .get("model")
            .and_then(toml::Value::as_str)
            .filter(|m| !m.trim().is_empty())
            .ok_or_else(|| D::Error::custom("a model_token source needs model = \"<path of a merged model>\""))?;
        let token = match (table.get("token"), table.get("token_id")) {
            (Some(toml::Value::String(t)), None) => TokenRef::Text(t.clone()),
            (None, Some(toml::Value::Integer(i))) if *i >= 0 => TokenRef::Id(*i as usize),
            _ => {
                return Err(D::Error::custom(
                    "a model_token source needs exactly one of token = \"<token>\" and token_id = <row number>",
                ));
            }
        };
        Ok(Some(EmbeddingSource::ModelToken {
            model: PathBuf::from(model),
            token,
        }))
    }
}

/// Whether two paths name the same model: equal once `.` components are dropped, or the same
/// file on disk.
fn same_model(a: &Path, b: &Path) -> bool {
    let plain = |p: &Path| p.components().filter(|c| *c != Component::CurDir).collect::<PathBuf>();
    if plain(a) == plain(b) {
        return true;
    }
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// Parses sizes such as `2GB`, `500MiB`, `123456` (bytes).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    (n >= 0.0).then_some((n * mult) as u64)
}

/// Method parameters (a JSON object) as a recipe's `[params]` table: numbers keep their kind
/// (integers stay integers) except inside lists, whose numbers are floats (per-task values,
/// gradient anchors); filter entries become tables, nested lists (per-expert layer-wise values)
/// stay lists; nulls are left out.
pub fn params_to_toml(params: &serde_json::Map<String, serde_json::Value>) -> toml::Table {
    params
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), json_to_toml(v, false)?)))
        .collect()
}

fn json_to_toml(v: &serde_json::Value, in_list: bool) -> Option<toml::Value> {
    use serde_json::Value;
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) if n.is_i64() && !in_list => toml::Value::Integer(n.as_i64()?),
        Value::Number(n) => toml::Value::Float(n.as_f64()?),
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(a) => toml::Value::Array(a.iter().filter_map(|x| json_to_toml(x, true)).collect()),
        Value::Object(o) => toml::Value::Table(
            o.iter()
                .filter_map(|(k, x)| Some((k.clone(), json_to_toml(x, false)?)))
                .collect(),
        ),
    })
}

pub(crate) fn toml_to_json(v: &toml::Value) -> serde_json::Value {
    match v {
        toml::Value::String(s) => s.clone().into(),
        toml::Value::Integer(i) => (*i).into(),
        toml::Value::Float(f) => (*f).into(),
        toml::Value::Boolean(b) => (*b).into(),
        toml::Value::Datetime(d) => d.to_string().into(),
        toml::Value::Array(a) => a.iter().map(toml_to_json).collect::<Vec<_>>().into(),
        toml::Value::Table(t) => t
            .iter()
            .map(|(k, v)| (k.clone(), toml_to_json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    }
}

impl Recipe {
    /// Reads a recipe file; relative paths are resolved against its folder.
    pub fn load(path: &Path) -> Result<Recipe> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read recipe", path, e))?;
        let mut r: Recipe = toml::from_str(&text).map_err(|e| {
            let hint = if e.to_string().contains("unknown field `chat_template`") {
                "\n(chat_template is a top-level key of the recipe: write it above the [tokenizer] table)"
            } else {
                ""
            };
            EngineError::Invalid(format!("recipe '{}' is invalid: {e}{hint}", path.display()))
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        };
        if let Some(b) = r.base.as_mut() {
            fix(b);
        }
        r.experts.iter_mut().for_each(fix);
        fix(&mut r.out);
        r.config_from.iter_mut().for_each(fix);
        r.tokenizer_from.iter_mut().for_each(fix);
        r.slices
            .iter_mut()
            .flat_map(|s| s.sources.iter_mut())
            .for_each(|src| fix(&mut src.model));
        if let Some(t) = r.tokenizer.as_mut() {
            if let VocabSource::Model(m) = &mut t.source {
                fix(m);
            }
            t.base.iter_mut().for_each(fix);
            for o in t.tokens.values_mut() {
                match &mut o.source {
                    Some(EmbeddingSource::Model(m) | EmbeddingSource::ModelToken { model: m, .. }) => fix(m),
                    Some(EmbeddingSource::Zero) | None => {}
                }
            }
        }
        Ok(r)
    }

    /// The `[tokenizer]` table as the [`TokenizerSpec`] a merge aligns vocabularies with
    /// (`origin` names the recipe in messages); `None` without the table. Paths naming an input
    /// (even written differently, `./a` for `a`) are taken as that input's.
    pub fn tokenizer_spec(&self, origin: &str) -> Result<Option<TokenizerSpec>> {
        let Some(t) = &self.tokenizer else {
            return Ok(None);
        };
        let inputs: Vec<&PathBuf> = self.base.iter().chain(self.experts.iter()).collect();
        let as_input = |p: &Path| -> PathBuf {
            inputs
                .iter()
                .find(|i| same_model(i, p))
                .map_or_else(|| p.to_path_buf(), |i| (*i).clone())
        };
        let base_model = t.base.as_deref().map(as_input).or_else(|| self.base.clone());
        let source = match &t.source {
            VocabSource::Union => Source::Union,
            VocabSource::Base if base_model.is_none() => {
                return Err(EngineError::Invalid(format!(
                    "{origin}: source = \"base\" needs a base model: set the recipe's base, or [tokenizer] base = \
                     \"<path>\" (mergekit's base_model), or name the model whose vocabulary to take"
                )));
            }
            VocabSource::Base => Source::Base,
            VocabSource::Model(m) => Source::Model(as_input(m)),
        };
        if t.pad_to_multiple_of == Some(0) {
            return Err(EngineError::Invalid(format!(
                "{origin}: pad_to_multiple_of must be a positive integer (e.g. 64), not 0; remove it to keep the \
                 vocabulary's size"
            )));
        }
        let tokens = t
            .tokens
            .iter()
            .map(|(token, o)| {
                let source = o.source.as_ref().map(|s| match s {
                    EmbeddingSource::Model(m) => EmbeddingSource::Model(as_input(m)),
                    EmbeddingSource::ModelToken { model, token } => EmbeddingSource::ModelToken {
                        model: as_input(model),
                        token: token.clone(),
                    },
                    EmbeddingSource::Zero => EmbeddingSource::Zero,
                });
                (token.clone(), TokenEmbedding { source, force: o.force })
            })
            .collect();
        let mut models: Vec<PathBuf> = Vec::new();
        let sliced = self.slices.iter().flat_map(|s| s.sources.iter().map(|src| &src.model));
        for m in base_model.iter().chain(inputs.iter().copied()).chain(sliced) {
            if !models.contains(m) {
                models.push(m.clone());
            }
        }
        Ok(Some(TokenizerSpec {
            source,
            tokens,
            pad_to_multiple_of: t.pad_to_multiple_of,
            base_model,
            models,
            origin: origin.to_owned(),
        }))
    }

    /// The recipe as TOML text, as `recipe convert` and the window write it (paths as they are
    /// held: [`Recipe::load`] resolves relative ones against the file's folder).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| {
            EngineError::Invalid(format!(
                "the recipe cannot be written as TOML: {e}; its paths and tokens must be UTF-8 text"
            ))
        })
    }

    /// The parameters as a JSON object.
    pub fn params_json(&self) -> serde_json::Value {
        toml_to_json(&toml::Value::Table(self.params.clone()))
    }

    /// The merge request this recipe describes.
    pub fn to_request(&self, overwrite: bool) -> Result<MergeRequest> {
        let shard_bytes = match &self.shard_size {
            None => None,
            Some(s) => Some(parse_size(s).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "shard_size '{s}' is not a size; write e.g. \"2GB\" or \"500MiB\""
                ))
            })?),
        };
        let mut req = MergeRequest::new(self.experts.clone(), self.out.clone())
            .with_base(self.base.clone())
            .with_params(self.params_json())
            .with_seed(self.seed)
            .overwriting(overwrite);
        req.out_dtype = self.dtype;
        req.shard_bytes = shard_bytes;
        req.on_missing = self.on_missing;
        let tokenizer = self.tokenizer_spec("the recipe's [tokenizer] table")?;
        // A `base` or model source's files are the ones copied when the vocabulary is unchanged.
        let tokenizer_from = self.tokenizer_from.clone().or_else(|| match &tokenizer {
            Some(TokenizerSpec {
                source: Source::Base,
                base_model,
                ..
            }) => base_model.clone(),
            Some(TokenizerSpec {
                source: Source::Model(m),
                ..
            }) => Some(m.clone()),
            _ => None,
        });
        if self.hf_folder
            || self.config_from.is_some()
            || tokenizer_from.is_some()
            || tokenizer.is_some()
            || self.chat_template.is_some()
        {
            req.folder = Some(FolderOutput {
                config_from: self.config_from.clone(),
                tokenizer_from,
                tokenizer,
                chat_template: self.chat_template.clone(),
                ..FolderOutput::default()
            });
        }
        req.slices = self.slices.clone();
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_recipe_with_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        std::fs::write(
            &p,
            "method = \"ties\"\nbase = \"b.safetensors\"\nexperts = [\"e1.safetensors\", \"/abs/e2.safetensors\"]\n\
             out = \"m.safetensors\"\nseed = 7\ndtype = \"bf16\"\nshard_size = \"2GB\"\n[params]\ndensity = 0.3\n",
        )
        .unwrap();
        let r = Recipe::load(&p).unwrap();
        assert_eq!(r.base.as_deref(), Some(dir.path().join("b.safetensors").as_path()));
        assert_eq!(r.experts[1], PathBuf::from("/abs/e2.safetensors"));
        let req = r.to_request(false).unwrap();
        assert_eq!(req.seed, 7);
        assert_eq!(req.shard_bytes, Some(2_000_000_000));
        assert_eq!(req.out_dtype, Some(OutDType::Bf16));
        assert_eq!(req.params["density"], 0.3);
    }

    #[test]
    fn unknown_fields_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        std::fs::write(&p, "method = \"ties\"\nexperts = []\nout = \"m\"\nlamda = 1\n").unwrap();
        let e = Recipe::load(&p).unwrap_err().to_string();
        assert!(e.contains("lamda"), "{e}");
    }

    const TOKENIZER_RECIPE: &str = "method = \"task-arithmetic\"\nbase = \"b\"\nexperts = [\"e1\", \"./e2\"]\n\
        out = \"m\"\nchat_template = \"auto\"\n[tokenizer]\nsource = \"union\"\npad_to_multiple_of = 8\n\
        [tokenizer.tokens.\"<|im_start|>\"]\nsource = \"e1\"\nforce = true\n\
        [tokenizer.tokens.\"<|im_end|>\"]\nsource = { kind = \"model_token\", model = \"e2\", token = \"</s>\" }\n\
        [tokenizer.tokens.\"<new>\"]\nsource = { kind = \"zero\" }\n\
        [tokenizer.tokens.\"<row>\"]\nsource = { kind = \"model_token\", model = \"b\", token_id = 3 }\n\
        [tokenizer.tokens.\"<only>\"]\n";

    #[test]
    fn a_tokenizer_table_becomes_the_folder_outputs_spec() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        std::fs::write(&p, TOKENIZER_RECIPE).unwrap();
        let r = Recipe::load(&p).unwrap();
        let at = |s: &str| dir.path().join(s);
        let req = r.to_request(false).unwrap();
        let folder = req.folder.unwrap();
        assert_eq!(folder.chat_template, Some(ChatTemplate::Auto));
        assert_eq!(folder.tokenizer_from, None, "a union has no single source folder");
        let spec = folder.tokenizer.unwrap();
        assert_eq!(spec.source, Source::Union);
        assert_eq!(spec.pad_to_multiple_of, Some(8));
        assert_eq!(spec.base_model, Some(at("b")));
        // './e2' and 'e2' are the same input: the spec names it as the recipe's experts do.
        assert_eq!(spec.models, [at("b"), at("e1"), at("./e2")]);
        let tokens: Vec<_> = spec.tokens.iter().map(|(t, e)| (t.as_str(), e.clone())).collect();
        assert_eq!(
            tokens,
            [
                (
                    "<new>",
                    TokenEmbedding {
                        source: Some(EmbeddingSource::Zero),
                        force: false
                    }
                ),
                (
                    "<only>",
                    TokenEmbedding {
                        source: None,
                        force: false
                    }
                ),
                (
                    "<row>",
                    TokenEmbedding {
                        source: Some(EmbeddingSource::ModelToken {
                            model: at("b"),
                            token: TokenRef::Id(3)
                        }),
                        force: false
                    }
                ),
                (
                    "<|im_end|>",
                    TokenEmbedding {
                        source: Some(EmbeddingSource::ModelToken {
                            model: at("./e2"),
                            token: TokenRef::Text("</s>".into())
                        }),
                        force: false
                    }
                ),
                (
                    "<|im_start|>",
                    TokenEmbedding {
                        source: Some(EmbeddingSource::Model(at("e1"))),
                        force: true
                    }
                ),
            ]
        );
        // Written back (as `recipe convert` and the window write recipes) it reads the same.
        let again: Recipe = toml::from_str(&toml::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
        let pretty: Recipe = toml::from_str(&toml::to_string_pretty(&r).unwrap()).unwrap();
        assert_eq!(pretty, r);
        let mut literal = r.clone();
        literal.chat_template = Some(ChatTemplate::Literal(
            "{% for m in messages %}\n\"{{ m['content'] }}\"\\n'''\"\"\"\n{% endfor %}".into(),
        ));
        let again: Recipe = toml::from_str(&literal.to_toml().unwrap()).unwrap();
        assert_eq!(again, literal);
    }

    #[test]
    fn base_and_model_sources_take_that_models_files_and_old_recipes_are_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        let head = "method = \"weight-average\"\nexperts = [\"a\", \"b\"]\nout = \"m\"\n";
        std::fs::write(&p, format!("{head}[tokenizer]\nsource = \"base\"\nbase = \"a\"\n")).unwrap();
        let req = Recipe::load(&p).unwrap().to_request(false).unwrap();
        let folder = req.folder.unwrap();
        assert_eq!(folder.tokenizer_from, Some(dir.path().join("a")));
        let spec = folder.tokenizer.unwrap();
        assert_eq!(
            (spec.source, spec.base_model),
            (Source::Base, Some(dir.path().join("a")))
        );
        assert_eq!(spec.models, [dir.path().join("a"), dir.path().join("b")]);

        std::fs::write(&p, format!("{head}[tokenizer]\nsource = \"b\"\n")).unwrap();
        let folder = Recipe::load(&p).unwrap().to_request(false).unwrap().folder.unwrap();
        assert_eq!(folder.tokenizer_from, Some(dir.path().join("b")));
        assert_eq!(folder.tokenizer.unwrap().source, Source::Model(dir.path().join("b")));

        // A recipe without the keys: no folder, nothing written back.
        std::fs::write(&p, head).unwrap();
        let r = Recipe::load(&p).unwrap();
        assert_eq!((r.tokenizer.as_ref(), r.chat_template.as_ref()), (None, None));
        assert!(r.to_request(false).unwrap().folder.is_none());
        let text = toml::to_string(&r).unwrap();
        assert!(!text.contains("tokenizer") && !text.contains("chat_template"), "{text}");
    }

    #[test]
    fn bad_tokenizer_tables_name_the_key_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        let head = "method = \"weight-average\"\nexperts = [\"a\", \"b\"]\nout = \"m\"\n";
        let cases: &[(&str, &[&str])] = &[
            ("[tokenizer]\npad_to = 8\n", &["pad_to", "pad_to_multiple_of", "tokens"]),
            (
                "[tokenizer]\nchat_template = \"auto\"\n",
                &["chat_template", "top-level key"],
            ),
            ("[tokenizer]\nsource = 3\n", &["union", "base", "path of a model"]),
            (
                "[tokenizer.tokens.x]\nsource = { kind = \"nearest\" }\n",
                &["\"nearest\"", "model_token", "zero"],
            ),
            (
                "[tokenizer.tokens.x]\nsource = { kind = \"zero\", model = \"a\" }\n",
                &["`model`", "kind"],
            ),
            (
                "[tokenizer.tokens.x]\nsource = { kind = \"model_token\", model = \"a\" }\n",
                &["token", "token_id"],
            ),
            ("[tokenizer.tokens.x]\nforced = true\n", &["forced", "force", "source"]),
            (
                "chat_template = \"vicuna\"\n",
                &["'vicuna'", "named template (alpaca, chatml"],
            ),
            ("chat_template = 3\n", &["chat_template must be"]),
        ];
        for (tail, needles) in cases {
            std::fs::write(&p, format!("{head}{tail}")).unwrap();
            let e = Recipe::load(&p).unwrap_err().to_string();
            for n in *needles {
                assert!(e.contains(n), "{tail}: {n} in {e}");
            }
        }
        let at_request: &[(&str, &[&str])] = &[
            ("[tokenizer]\nsource = \"base\"\n", &["base", "[tokenizer] base"]),
            (
                "[tokenizer]\npad_to_multiple_of = 0\n",
                &["pad_to_multiple_of", "positive"],
            ),
        ];
        for (tail, needles) in at_request {
            std::fs::write(&p, format!("{head}{tail}")).unwrap();
            let e = Recipe::load(&p).unwrap().to_request(false).unwrap_err().to_string();
            for n in *needles {
                assert!(e.contains(n), "{tail}: {n} in {e}");
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("1 MiB"), Some(1_048_576));
        assert_eq!(parse_size("42"), Some(42));
        assert_eq!(parse_size("x"), None);
    }
}
