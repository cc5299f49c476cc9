//! Hugging Face model folders as outputs: the merged weights (`model.safetensors` or shards
//! with their index) beside the `config.json` and `generation_config.json` of a source model,
//! its tokenizer files, and a `README.md` model card saying how the folder was made, so that
//! `AutoModelForCausalLM.from_pretrained(folder)` loads the merge as it loads its inputs.

use crate::tokenizer_union::{ChatTemplate, TokenizerSpec, VocabPlan, chat_template_of};
use mergescope_engine::dtype::DType;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::writer::ExtraFile;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Tokenizer files copied from the tokenizer source when present (as `save_pretrained` writes
/// them for the common tokenizer kinds).
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "spiece.model",
    "chat_template.jinja",
];

/// Configuration keys holding the number of transformer layers, by family.
const LAYER_COUNT_KEYS: &[&str] = &["num_hidden_layers", "n_layer", "num_layers"];

/// What a folder output takes from its inputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FolderOutput {
    /// Folder whose `config.json` and `generation_config.json` are copied; `None`: the base's,
    /// else the first expert's.
    pub config_from: Option<PathBuf>,
    /// Folder whose tokenizer files are copied; `None`: the config's folder.
    pub tokenizer_from: Option<PathBuf>,
    /// A recipe the merge came from, kept in the folder and quoted in the card: (file name, text),
    /// e.g. `("mergekit_config.yml", yaml)`.
    pub source_recipe: Option<(String, String)>,
    /// An output vocabulary built from the inputs' tokenizers (mergekit's `tokenizer_source:
    /// union` or `tokenizer:` block): its tokenizer files are written, the vocabulary tensors
    /// are aligned to it and `config.json` gets its size ([`crate::tokenizer_union`]).
    pub tokenizer: Option<TokenizerSpec>,
    /// A chat template for the output's tokenizer (mergekit's `chat_template`).
    pub chat_template: Option<ChatTemplate>,
}

/// What the model card says about a merge.
#[derive(Clone, Debug)]
pub struct CardInfo<'a> {
    /// Plugin id and version.
    pub method: (&'a str, &'a str),
    /// Inputs in order, with their roles (`base` or `expert`).
    pub inputs: Vec<(&'a str, &'a Path)>,
    /// The recorded parameters.
    pub params: &'a Value,
    /// The seed.
    pub seed: u64,
}

/// The folder a checkpoint path stands for: itself if it is a folder, else the file's folder.
pub fn folder_of(checkpoint: &Path) -> PathBuf {
    if checkpoint.is_dir() {
        checkpoint.to_path_buf()
    } else {
        checkpoint.parent().map(Path::to_path_buf).unwrap_or_default()
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| EngineError::io("cannot read", path, e))
}

/// `config.json` with the output's dtype, layer count and vocabulary size written in (other keys
/// as they were).
fn adapted_config(path: &Path, dtype: Option<DType>, layers: Option<usize>, vocab: Option<usize>) -> Result<Vec<u8>> {
    let bytes = read(path)?;
    if dtype.is_none() && layers.is_none() && vocab.is_none() {
        return Ok(bytes);
    }
    let mut config: Value = serde_json::from_slice(&bytes).map_err(|e| {
        EngineError::bad(
            path,
            format!("is not valid JSON ({e}); fix it or name another folder with --config-from"),
        )
    })?;
    let Some(object) = config.as_object_mut() else {
        return Err(EngineError::bad(
            path,
            "is not a JSON object; name another folder with --config-from",
        ));
    };
    if let Some(dtype) = dtype {
        let name = match dtype {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            other => other.name(),
        };
        // transformers 4 writes torch_dtype, 5 writes dtype: update whichever the file has.
        let mut written = false;
        for key in ["torch_dtype", "dtype"] {
            if object.contains_key(key) {
                object.insert(key.to_owned(), name.into());
                written = true;
            }
        }
        if !written {
            object.insert("torch_dtype".to_owned(), name.into());
        }
    }
    if let Some(n) = layers {
        for key in LAYER_COUNT_KEYS {
            if object.get(*key).is_some_and(Value::is_u64) {
                object.insert((*key).to_owned(), n.into());
            }
        }
    }
    if let Some(n) = vocab {
        // mergekit's _update_config_vocab: `vocab_size`, or the text model's for multimodal
        // configurations that keep it only there.
        let top = object.contains_key("vocab_size");
        match object.get_mut("text_config").and_then(Value::as_object_mut) {
            Some(text) if !top && text.contains_key("vocab_size") => {
                text.insert("vocab_size".to_owned(), n.into());
            }
            _ => {
                object.insert("vocab_size".to_owned(), n.into());
            }
        }
    }
    let mut text = serde_json::to_vec_pretty(&config)
        .map_err(|e| EngineError::Invalid(format!("cannot encode config.json: {e}")))?;
    text.push(b'\n');
    Ok(text)
}

/// The model card (`README.md`).
fn model_card(card: &CardInfo<'_>, source: Option<&(String, String)>) -> String {
    let name = |p: &Path| {
        p.file_name()
            .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
    };
    let mut s = String::from("---\nlibrary_name: transformers\ntags:\n- mergescope\n- merge\n");
    if let Some((_, base)) = card.inputs.iter().find(|(role, _)| *role == "base") {
        s += &format!("base_model: {}\n", name(base));
    }
    s += "---\n\n# Merged model\n\n";
    s += &format!(
        "This model was merged with mergescope {} using the `{}` method (plugin version {}).\n\n## Inputs\n\n",
        env!("CARGO_PKG_VERSION"),
        card.method.0,
        card.method.1
    );
    for (role, path) in &card.inputs {
        s += &format!("- {role}: `{}`\n", name(path));
    }
    let params = serde_json::to_string_pretty(card.params).unwrap_or_else(|_| card.params.to_string());
    s += &format!("\n## Parameters\n\n```json\n{params}\n```\n\nSeed: {}\n", card.seed);
    if let Some((file, text)) = source {
        s += &format!(
            "\n## Configuration\n\nFrom `{file}`:\n\n```yaml\n{}\n```\n",
            text.trim_end()
        );
    }
    s
}

/// The files a folder output holds beside its weights, and notes on what could not be found.
/// `inputs` are the checkpoints in order (base first when there is one).
pub fn folder_files(
    spec: &FolderOutput,
    inputs: &[&Path],
    dtype: Option<DType>,
    layers: Option<usize>,
    card: &CardInfo<'_>,
) -> Result<(Vec<ExtraFile>, Vec<String>)> {
    let mut files = Vec::new();
    let mut notes = Vec::new();
    let plan = match &spec.tokenizer {
        Some(t) => {
            let paths: Vec<PathBuf> = inputs.iter().map(|p| p.to_path_buf()).collect();
            VocabPlan::build(t, &paths)?
        }
        None => None,
    };
    let config_dir = match &spec.config_from {
        Some(dir) => {
            let dir = folder_of(dir);
            if !dir.join("config.json").is_file() {
                return Err(EngineError::Invalid(format!(
                    "--config-from '{}' has no config.json; name the Hugging Face folder of the base model",
                    dir.display()
                )));
            }
            Some(dir)
        }
        None => inputs
            .iter()
            .map(|p| folder_of(p))
            .find(|d| d.join("config.json").is_file()),
    };
    match &config_dir {
        Some(dir) => {
            files.push(ExtraFile {
                name: "config.json".to_owned(),
                bytes: adapted_config(&dir.join("config.json"), dtype, layers, plan.as_ref().map(|p| p.rows))?,
            });
            let generation = dir.join("generation_config.json");
            if generation.is_file() {
                files.push(ExtraFile {
                    name: "generation_config.json".to_owned(),
                    bytes: read(&generation)?,
                });
            }
        }
        None => notes.push(
            "no input folder has a config.json, so the output folder holds weights without one; pass --config-from \
             FOLDER to copy a model's config and tokenizer"
                .to_owned(),
        ),
    }
    let tokenizer_dir = spec.tokenizer_from.as_deref().map(folder_of).or(config_dir);
    if let Some(plan) = plan.as_ref().filter(|p| p.changed) {
        for (name, bytes) in plan.tokenizer_files()? {
            files.push(ExtraFile { name, bytes });
        }
    } else if let Some(dir) = &tokenizer_dir {
        let before = files.len();
        for name in TOKENIZER_FILES {
            let p = dir.join(name);
            if p.is_file() {
                files.push(ExtraFile {
                    name: (*name).to_owned(),
                    bytes: read(&p)?,
                });
            }
        }
        if files.len() == before && spec.tokenizer_from.is_some() {
            return Err(EngineError::Invalid(format!(
                "the tokenizer source '{}' has no tokenizer files (tokenizer.json, tokenizer.model, vocab.json...)",
                dir.display()
            )));
        }
    }
    if let Some(template) = &spec.chat_template {
        set_chat_template(&mut files, template, spec, inputs, &mut notes)?;
    }
    if let Some((name, text)) = &spec.source_recipe {
        files.push(ExtraFile {
            name: name.clone(),
            bytes: text.clone().into_bytes(),
        });
    }
    files.push(ExtraFile {
        name: "README.md".to_owned(),
        bytes: model_card(card, spec.source_recipe.as_ref()).into_bytes(),
    });
    Ok((files, notes))
}

/// Sets the output tokenizer's chat template (mergekit's `_set_chat_template`; transformers 5
/// keeps it in `chat_template.jinja`, so any copy in `tokenizer_config.json` is dropped).
fn set_chat_template(
    files: &mut Vec<ExtraFile>,
    template: &ChatTemplate,
    spec: &FolderOutput,
    inputs: &[&Path],
    notes: &mut Vec<String>,
) -> Result<()> {
    let text = match template {
        ChatTemplate::Literal(t) => t.clone(),
        ChatTemplate::Named(name) => crate::chat_templates::named(name)
            .map(|(_, text)| text.to_owned())
            .ok_or_else(|| EngineError::Bug(format!("chat template '{name}' is not one of mergescope's")))?,
        ChatTemplate::Auto => {
            let (models, base) = match &spec.tokenizer {
                Some(t) => (t.models.clone(), t.base_model.clone()),
                None => (inputs.iter().map(|p| p.to_path_buf()).collect(), None),
            };
            match VocabPlan::auto_chat_template(&models, base.as_deref())? {
                Some(t) => t,
                None => {
                    notes.push("chat_template: auto found no chat template among the inputs; none was set".to_owned());
                    return Ok(());
                }
            }
        }
    };
    if !files
        .iter()
        .any(|f| f.name == "tokenizer.json" || f.name == "tokenizer_config.json")
    {
        notes.push(
            "chat_template is set but the output has no tokenizer files, so the template was not saved (as mergekit)"
                .to_owned(),
        );
        return Ok(());
    }
    if let Some(f) = files.iter_mut().find(|f| f.name == "tokenizer_config.json")
        && let Ok(Value::Object(mut config)) = serde_json::from_slice::<Value>(&f.bytes)
        && config.remove("chat_template").is_some()
    {
        let mut bytes = serde_json::to_vec_pretty(&Value::Object(config))
            .map_err(|e| EngineError::Invalid(format!("cannot encode tokenizer_config.json: {e}")))?;
        bytes.push(b'\n');
        f.bytes = bytes;
    }
    files.retain(|f| f.name != "chat_template.jinja");
    files.push(ExtraFile {
        name: "chat_template.jinja".to_owned(),
        bytes: text.into_bytes(),
    });
    Ok(())
}

/// The chat template of a tokenizer folder, for callers that show it.
pub fn chat_template_in(dir: &Path) -> Result<Option<String>> {
    chat_template_of(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_takes_the_output_dtype_and_layer_count() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"model_type": "llama", "num_hidden_layers": 2, "torch_dtype": "float32", "hidden_size": 32}"#,
        )
        .unwrap();
        let out: Value =
            serde_json::from_slice(&adapted_config(&p, Some(DType::BF16), Some(5), Some(72)).unwrap()).unwrap();
        assert_eq!(out["torch_dtype"], "bfloat16");
        assert_eq!(out["num_hidden_layers"], 5);
        assert_eq!(out["hidden_size"], 32);
        assert_eq!(out["vocab_size"], 72);
        // A multimodal configuration keeps the vocabulary size in its text model's.
        let q = dir.path().join("mm.json");
        std::fs::write(&q, r#"{"text_config": {"vocab_size": 64}}"#).unwrap();
        let out: Value = serde_json::from_slice(&adapted_config(&q, None, None, Some(80)).unwrap()).unwrap();
        assert_eq!(out, serde_json::json!({"text_config": {"vocab_size": 80}}));
        // Unchanged output: the file's own bytes.
        assert_eq!(
            adapted_config(&p, None, None, None).unwrap(),
            std::fs::read(&p).unwrap()
        );
    }

    #[test]
    fn folder_files_copy_config_tokenizer_and_write_a_card() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        std::fs::create_dir(&base).unwrap();
        std::fs::write(base.join("config.json"), "{}").unwrap();
        std::fs::write(base.join("generation_config.json"), "{\"do_sample\": false}").unwrap();
        std::fs::write(base.join("tokenizer.json"), "{\"model\": {}}").unwrap();
        std::fs::write(base.join("model.safetensors"), "").unwrap();
        let params = serde_json::json!({"t": 0.3});
        let card = CardInfo {
            method: ("slerp", "1.0"),
            inputs: vec![("base", base.as_path()), ("expert", Path::new("other/model"))],
            params: &params,
            seed: 7,
        };
        let spec = FolderOutput {
            source_recipe: Some(("mergekit_config.yml".into(), "merge_method: slerp\n".into())),
            ..FolderOutput::default()
        };
        let (files, notes) = folder_files(&spec, &[base.as_path()], None, None, &card).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "config.json",
                "generation_config.json",
                "tokenizer.json",
                "mergekit_config.yml",
                "README.md"
            ]
        );
        assert!(notes.is_empty());
        let readme = String::from_utf8(files[4].bytes.clone()).unwrap();
        for needle in [
            "`slerp`",
            "base: `base`",
            "expert: `model`",
            "\"t\": 0.3",
            "Seed: 7",
            "merge_method: slerp",
        ] {
            assert!(readme.contains(needle), "{needle} missing from\n{readme}");
        }
        // No config anywhere: a note, not an error; a named folder without one: an error.
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let (files, notes) = folder_files(&FolderOutput::default(), &[empty.as_path()], None, None, &card).unwrap();
        assert_eq!(files.len(), 1);
        assert!(notes[0].contains("--config-from"), "{notes:?}");
        let spec = FolderOutput {
            config_from: Some(empty),
            ..FolderOutput::default()
        };
        let e = folder_files(&spec, &[base.as_path()], None, None, &card)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no config.json") && e.contains("empty"), "{e}");
    }
}
