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

use crate::compat::MissingPolicy;
use crate::device::DeviceChoice;
use crate::dtype::OutDType;
use crate::error::{EngineError, Result};
use crate::hf_folder::FolderOutput;
use crate::merge::MergeRequest;
use crate::slices::Slice;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
    /// The folder whose tokenizer files the folder output takes; default: `config_from`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_from: Option<PathBuf>,
    /// Layer slices of several models instead of whole models (see the module doc).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<Slice>,
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

fn toml_to_json(v: &toml::Value) -> serde_json::Value {
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
        let mut r: Recipe = toml::from_str(&text)
            .map_err(|e| EngineError::Invalid(format!("recipe '{}' is invalid: {e}", path.display())))?;
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
        Ok(r)
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
        if self.hf_folder || self.config_from.is_some() || self.tokenizer_from.is_some() {
            req.folder = Some(FolderOutput {
                config_from: self.config_from.clone(),
                tokenizer_from: self.tokenizer_from.clone(),
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

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("1 MiB"), Some(1_048_576));
        assert_eq!(parse_size("42"), Some(42));
        assert_eq!(parse_size("x"), None);
    }
}
