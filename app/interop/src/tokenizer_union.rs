//! Merging models whose tokenizers differ, as mergekit does for `tokenizer_source` (`union`,
//! `base` or a model) and its `tokenizer:` block: an output vocabulary is built from the
//! inputs' `tokenizer.json` files, and every vocabulary-indexed tensor (`embed_tokens`,
//! `lm_head`, ...) of every input is read with its rows permuted into that vocabulary, so the
//! merge method runs on aligned rows as on any tensor. The rows are rearranged per range read
//! ([`mergescope_engine::checkpoint::RowMap`]); only the rows some model lacks are held in memory.
//!
//! What follows mergekit 0.1.5 (`mergekit/tokenizer/build.py`, `embed.py`, `merge.py`):
//!
//! - The tokenizer base is `base_model`, else the first model (`build_tokenizer`), stripped of
//!   the tokens whose id is at least its `config.json` `vocab_size` (`get_stripped_tokenizer`;
//!   BPE only).
//! - `union` (`build_union_tokenizer`): the base's tokenizer, then every model's tokens that are
//!   not added tokens and not in the base, as regular added tokens (`normalized`, not
//!   `special`), then every model's added tokens (the first model's settings win), each new
//!   content given the next id as the `tokenizers` library numbers added tokens. Tokens at or
//!   past a model's `vocab_size` are left out. mergekit visits the models in Python set order and
//!   each vocabulary in hash-map order, so the ids it gives tokens the base lacks can change from
//!   run to run; mergescope takes the models in the configuration's order and each vocabulary in
//!   id order. A token's row is the same either way.
//! - `tokens:` keys are added (as regular added tokens) when missing (`build_tokenizer`), and
//!   `pad_to_multiple_of` pads the row count.
//! - A model's row for a token is its own row when it has the token (and the token is not
//!   `force`d); otherwise the token's default (`PermutedVocabulary.assign_embedding_sources`,
//!   `execute`): the `tokens:` entry's source if it has one, else the row of the only model
//!   that has the token, else zeros when none has it, else the base's row when the base is a
//!   merged model and has it, else the mean of the rows of the models that have it (summed in
//!   f32 in model order, then divided, as mergekit's float32 tensors do). Padding rows are the
//!   mean of the model's aligned rows.
//! - The output's `config.json` `vocab_size` is the (padded) vocabulary size
//!   (`_update_config_vocab`).
//! - `chat_template` (`_set_chat_template`): `auto` takes the template most of the inputs
//!   share, a literal Jinja template is written as given, and the names of mergekit's bundled
//!   templates (`chatml`, `llama3`, ...) give mergescope's own templates that render the same
//!   ([`crate::chat_templates`]).

use mergescope_engine::checkpoint::{Checkpoint, RowFrom, RowMap, TensorEntry, is_lora_adapter};
use mergescope_engine::error::{EngineError, Result};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Names of the tensors indexed by vocabulary along their first axis (the weights mergekit's
/// architecture definitions give a `vocabulary_axis`).
pub const VOCAB_TENSORS: &[&str] = &[
    "model.embed_tokens.weight",
    "lm_head.weight",
    "lm_head.bias",
    "transformer.wte.weight",
    "model.language_model.embed_tokens.weight",
    "embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "encoder.embed_tokens.weight",
    "shared.weight",
    "gpt_neox.embed_in.weight",
    "embed_out.weight",
    "transformer.embd.wte.weight",
    "transformer.word_embeddings.weight",
    "transformer.embedding.word_embeddings.weight",
    "transformer.output_layer.weight",
    "model.tok_embeddings.weight",
    "output.weight",
    "backbone.embeddings.weight",
    "embeddings.word_embeddings.weight",
    "bert.embeddings.word_embeddings.weight",
    "roberta.embeddings.word_embeddings.weight",
    "distilbert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.weight",
    "cls.predictions.bias",
    "lm_head.decoder.weight",
    "lm_head.linear.weight",
    "lm_head.linear.bias",
    "vocab_projector.weight",
    "vocab_projector.bias",
];

/// Where the output vocabulary comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// The base model's tokenizer.
    Base,
    /// The union of every model's vocabulary.
    Union,
    /// This model's tokenizer.
    Model(PathBuf),
}

/// Which token of a model gives a row.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenRef {
    /// A row index of the model's tensor.
    Id(usize),
    /// A token of the model's tokenizer.
    Text(String),
}

/// Where a token's row comes from when a model lacks it (or always, when forced).
#[derive(Clone, Debug, PartialEq)]
pub enum EmbeddingSource {
    /// This model's row for the same token.
    Model(PathBuf),
    /// This model's row for another token.
    ModelToken {
        /// The model.
        model: PathBuf,
        /// The token.
        token: TokenRef,
    },
    /// Zeros.
    Zero,
}

/// A `tokens:` entry of mergekit's `tokenizer:` block.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEmbedding {
    /// Its source (`None`: mergekit's defaults, the token is only added).
    pub source: Option<EmbeddingSource>,
    /// Use the source for every model, even those that have the token.
    pub force: bool,
}

/// What output vocabulary to build, and from which models.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerSpec {
    /// The vocabulary's source.
    pub source: Source,
    /// Per-token sources, in the configuration's order (their tokens are added when missing).
    pub tokens: Vec<(String, TokenEmbedding)>,
    /// Pad the row count to a multiple of this.
    pub pad_to_multiple_of: Option<usize>,
    /// mergekit's `base_model`.
    pub base_model: Option<PathBuf>,
    /// Every model the configuration names, in its order (the base first); merge inputs are
    /// among them.
    pub models: Vec<PathBuf>,
    /// Where the specification came from, for messages (e.g. "mergekit config 'merge.yml'").
    pub origin: String,
}

/// mergekit's `chat_template`.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatTemplate {
    /// The template most inputs share.
    Auto,
    /// A Jinja template.
    Literal(String),
    /// One of mergekit's bundled templates, by name ([`crate::chat_templates::NAMED`]).
    Named(&'static str),
}

impl ChatTemplate {
    /// Reads a `chat_template` value: `auto`, the name of one of mergekit's bundled templates, or
    /// a literal template (mergekit's rule: at least 20 characters and a `{`).
    pub fn parse(value: &str) -> std::result::Result<ChatTemplate, String> {
        if value == "auto" {
            return Ok(ChatTemplate::Auto);
        }
        if value.len() < 256 && !value.contains('\n') && !value.contains('{') {
            return match crate::chat_templates::named(value) {
                Some((name, _)) => Ok(ChatTemplate::Named(name)),
                None => Err(format!(
                    "'{value}' is neither 'auto', a named template ({}) nor a Jinja template (a template contains \
                     '{{'); give one of those",
                    crate::chat_templates::names()
                )),
            };
        }
        if value.len() < 20 || !value.contains('{') {
            return Err(format!(
                "'{value}' is not a valid chat template (mergekit wants at least 20 characters with a '{{')"
            ));
        }
        Ok(ChatTemplate::Literal(value.to_owned()))
    }
}

/// An added token as `tokenizer.json` lists it.
#[derive(Clone, Debug, PartialEq)]
struct Added {
    id: usize,
    content: String,
    /// The entry's other fields (single_word, lstrip, rstrip, normalized, special).
    flags: Map<String, Value>,
}

/// One model's tokenizer.
#[derive(Clone, Debug)]
struct Tok {
    file: PathBuf,
    json: Value,
    /// Regular vocabulary (the tokenization model's).
    model_vocab: HashMap<String, usize>,
    added: Vec<Added>,
    /// Rows of the model (its config.json `vocab_size`, else the vocabulary's size).
    vocab_size: usize,
}

impl Tok {
    /// `get_vocab()`: the model's vocabulary with the added tokens.
    fn vocab(&self) -> HashMap<String, usize> {
        let mut v = self.model_vocab.clone();
        for a in &self.added {
            v.insert(a.content.clone(), a.id);
        }
        v
    }
}

fn bad(file: &Path, what: impl std::fmt::Display) -> EngineError {
    EngineError::Invalid(format!("'{}': {what}", file.display()))
}

/// The folder a checkpoint path stands for.
fn folder(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    }
}

/// The config.json `vocab_size` of the model in `dir` (or of its `text_config`).
fn config_vocab_size(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("vocab_size")
        .or_else(|| v.get("text_config").and_then(|t| t.get("vocab_size")))
        .and_then(Value::as_u64)
        .map(|n| n as usize)
}

fn parse_tokenizer(file: &Path, json: Value, vocab_size: Option<usize>) -> Result<Tok> {
    let model = json
        .get("model")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(file, "has no 'model' object; it is not a Hugging Face tokenizer.json"))?;
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
    let mut model_vocab = HashMap::new();
    match (kind, model.get("vocab")) {
        ("BPE" | "WordPiece" | "WordLevel", Some(Value::Object(v))) => {
            for (tok, id) in v {
                let id = id
                    .as_u64()
                    .ok_or_else(|| bad(file, format!("vocabulary entry '{tok}' has no integer id")))?;
                model_vocab.insert(tok.clone(), id as usize);
            }
        }
        ("Unigram", Some(Value::Array(v))) => {
            for (id, piece) in v.iter().enumerate() {
                let tok = piece
                    .get(0)
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(file, format!("Unigram vocabulary entry {id} is not [piece, score]")))?;
                model_vocab.insert(tok.to_owned(), id);
            }
        }
        _ => {
            return Err(bad(
                file,
                format!(
                    "has a tokenization model of type '{kind}' whose vocabulary mergescope cannot read (it reads BPE, \
                     WordPiece, WordLevel and Unigram)"
                ),
            ));
        }
    }
    let mut added = Vec::new();
    for (i, entry) in json
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let mut flags = entry.as_object().cloned().unwrap_or_default();
        let id = flags.remove("id").and_then(|v| v.as_u64());
        let content = flags.remove("content").and_then(|v| v.as_str().map(str::to_owned));
        let (Some(id), Some(content)) = (id, content) else {
            return Err(bad(file, format!("added_tokens[{i}] has no id or content")));
        };
        added.push(Added {
            id: id as usize,
            content,
            flags,
        });
    }
    added.sort_by_key(|a| a.id);
    let mut tok = Tok {
        file: file.to_path_buf(),
        json,
        model_vocab,
        added,
        vocab_size: 0,
    };
    tok.vocab_size = vocab_size.unwrap_or_else(|| tok.vocab().len());
    Ok(tok)
}

/// Reads `dir/tokenizer.json`; `None` when there is none.
fn read_tokenizer(dir: &Path) -> Result<Option<Tok>> {
    let file = dir.join("tokenizer.json");
    if !file.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&file).map_err(|e| EngineError::io("cannot read", &file, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| bad(&file, format!("is not valid JSON ({e})")))?;
    parse_tokenizer(&file, json, config_vocab_size(dir)).map(Some)
}

/// The base's tokenizer without the tokens at or past its vocab_size (mergekit's
/// `get_stripped_tokenizer`).
fn stripped(mut tok: Tok) -> Result<Tok> {
    let limit = tok.vocab_size;
    let unused: HashSet<String> = tok
        .vocab()
        .into_iter()
        .filter(|(_, id)| *id >= limit)
        .map(|(t, _)| t)
        .collect();
    if unused.is_empty() {
        return Ok(tok);
    }
    let kind = tok.json.pointer("/model/type").and_then(Value::as_str).unwrap_or("");
    if kind != "BPE" {
        return Err(bad(
            &tok.file,
            format!(
                "has {} tokens at or past the model's vocab_size {limit}, and only a BPE tokenizer can be stripped of \
                 them (this one is {kind}); use a tokenizer whose ids fit the model",
                unused.len()
            ),
        ));
    }
    tok.added.retain(|a| a.id < limit);
    tok.model_vocab.retain(|t, _| !unused.contains(t));
    let file = tok.file.clone();
    if let Some(model) = tok.json.get_mut("model").and_then(Value::as_object_mut) {
        if let Some(Value::Object(v)) = model.get_mut("vocab") {
            v.retain(|t, _| !unused.contains(t));
        }
        if let Some(Value::Array(merges)) = model.get_mut("merges") {
            let mut keep = Vec::with_capacity(merges.len());
            for m in merges.drain(..) {
                let parts: Vec<&str> = match &m {
                    Value::String(s) if s.matches(' ').count() == 1 => s.split(' ').collect(),
                    Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                    other => return Err(bad(&file, format!("has a merge of unexpected form {other}"))),
                };
                if !parts.iter().any(|p| unused.contains(*p)) {
                    keep.push(m);
                }
            }
            *merges = keep;
        }
    }
    Ok(tok)
}

/// The output tokenizer being built: `add_tokens` as the `tokenizers` library does it.
struct OutTok {
    tok: Tok,
}

impl OutTok {
    fn vocab(&self) -> HashMap<String, usize> {
        self.tok.vocab()
    }

    /// Adds `content` with `flags` unless an added token has it; a token of the regular
    /// vocabulary keeps its id, a new one gets the next id (the model's size, or one past the
    /// largest added id when that is larger).
    fn add(&mut self, content: &str, flags: Map<String, Value>) {
        if self.tok.added.iter().any(|a| a.content == content) {
            return;
        }
        let model_size = self.tok.model_vocab.len();
        let id = match self.tok.model_vocab.get(content) {
            Some(id) => *id,
            None => match self.tok.added.iter().map(|a| a.id).max() {
                Some(max) if max >= model_size || model_size == 0 => max + 1,
                _ => model_size,
            },
        };
        self.tok.added.push(Added {
            id,
            content: content.to_owned(),
            flags,
        });
        self.tok.added.sort_by_key(|a| a.id);
    }

    /// The flags `add_tokens("...")` gives a plain string.
    fn plain() -> Map<String, Value> {
        let mut m = Map::new();
        for (k, v) in [
            ("single_word", false),
            ("lstrip", false),
            ("rstrip", false),
            ("normalized", true),
            ("special", false),
        ] {
            m.insert(k.to_owned(), Value::Bool(v));
        }
        m
    }

    /// The tokenizer.json text.
    fn json(&self) -> Result<Vec<u8>> {
        let mut json = self.tok.json.clone();
        let added: Vec<Value> = self
            .tok
            .added
            .iter()
            .map(|a| {
                let mut m = Map::new();
                m.insert("id".to_owned(), a.id.into());
                m.insert("content".to_owned(), a.content.clone().into());
                for k in ["single_word", "lstrip", "rstrip", "normalized", "special"] {
                    m.insert(k.to_owned(), a.flags.get(k).cloned().unwrap_or(Value::Bool(false)));
                }
                Value::Object(m)
            })
            .collect();
        if let Some(obj) = json.as_object_mut() {
            obj.insert("added_tokens".to_owned(), Value::Array(added));
        }
        let mut text = serde_json::to_vec_pretty(&json)
            .map_err(|e| EngineError::Invalid(format!("cannot encode tokenizer.json: {e}")))?;
        text.push(b'\n');
        Ok(text)
    }
}

/// A token's row when a model lacks it.
#[derive(Clone, Debug, PartialEq)]
enum Default {
    /// The mean of these (input, row)s.
    Mean(Vec<(usize, usize)>),
    /// This input's row.
    Row(usize, usize),
    /// Zeros.
    Zero,
}

/// The output vocabulary and how each merge input's rows map into it.
#[derive(Clone, Debug)]
pub struct VocabPlan {
    tokenizer: OutTokData,
    /// Tokens of the output vocabulary (without padding).
    pub vocab_len: usize,
    /// Rows of the output's vocabulary tensors (`vocab_len` padded).
    pub rows: usize,
    /// Per merge input, per output row below `vocab_len`: its stored row.
    perms: Vec<Vec<Option<usize>>>,
    /// The `tokens:` entries by output row: token, force, resolved source.
    user: BTreeMap<usize, (String, bool, Option<Default>)>,
    /// The merge input that is the base, when the base is merged.
    base_input: Option<usize>,
    /// For messages.
    origin: String,
    /// The tokenizer source's folder (tokenizer_config.json and the like come from it).
    source_dir: PathBuf,
    /// Whether the output vocabulary differs from the source tokenizer's (else its files are
    /// copied as they are).
    pub changed: bool,
}

/// The output tokenizer's data (what [`VocabPlan`] writes).
#[derive(Clone, Debug)]
struct OutTokData {
    json: Vec<u8>,
    added: Vec<Added>,
}

/// Resolves the tokenizer folder of a model path: an adapter's tokenizer is its base's unless it
/// has its own.
fn tokenizer_dir(path: &Path, base: Option<&Path>) -> PathBuf {
    let dir = folder(path);
    if is_lora_adapter(&dir)
        && !dir.join("tokenizer.json").is_file()
        && let Some(b) = base
    {
        return folder(b);
    }
    dir
}

impl VocabPlan {
    /// Builds the output vocabulary of `spec` and the permutations of the merge `inputs`
    /// (checkpoint paths, each one of `spec.models`). `Ok(None)`: nothing to align (a `base` or
    /// model source without tokenizer.json, and no `tokens` or padding; the files are copied as
    /// they are).
    pub fn build(spec: &TokenizerSpec, inputs: &[PathBuf]) -> Result<Option<VocabPlan>> {
        let origin = &spec.origin;
        let base_ref = spec
            .base_model
            .clone()
            .or_else(|| spec.models.first().cloned())
            .ok_or_else(|| EngineError::Invalid(format!("{origin}: no models to take a tokenizer from")))?;
        let base_path = spec.base_model.as_deref();
        let union = spec.source == Source::Union;
        // The tokenizers: the base's (stripped) first, then the others in order.
        let mut toks: Vec<(PathBuf, Tok)> = Vec::new();
        let mut missing = Vec::new();
        for model in std::iter::once(&base_ref).chain(spec.models.iter()) {
            if toks.iter().any(|(p, _)| p == model) || missing.contains(model) {
                continue;
            }
            let dir = tokenizer_dir(model, base_path);
            match read_tokenizer(&dir)? {
                Some(t) if *model == base_ref => toks.push((model.clone(), stripped(t)?)),
                Some(t) => toks.push((model.clone(), t)),
                None => missing.push(model.clone()),
            }
        }
        let how_to_fix = "save the model's tokenizer there (tokenizer.save_pretrained(folder) writes tokenizer.json; \
                          mergescope reads fast tokenizers only)";
        if union && let Some(m) = missing.first() {
            return Err(EngineError::Invalid(format!(
                "{origin}: tokenizer_source union needs every model's tokenizer.json, and '{}' has none: {how_to_fix}",
                tokenizer_dir(m, base_path).display()
            )));
        }
        let tok_of = |model: &Path| toks.iter().find(|(p, _)| p == model).map(|(_, t)| t);
        // A base or model source without tokenizer.json (only tokenizer.model, say): its files are
        // copied and the tensors merged as they are, as before vocabularies were aligned.
        let copy_only = spec.source != Source::Union && spec.tokens.is_empty() && spec.pad_to_multiple_of.is_none();
        let Some(base_tok) = tok_of(&base_ref) else {
            if copy_only {
                return Ok(None);
            }
            return Err(EngineError::Invalid(format!(
                "{origin}: the tokenizer base '{}' has no tokenizer.json: {how_to_fix}",
                tokenizer_dir(&base_ref, base_path).display()
            )));
        };
        let (out_tok, source_dir) = match &spec.source {
            Source::Base => (base_tok.clone(), tokenizer_dir(&base_ref, base_path)),
            Source::Model(m) => {
                let dir = tokenizer_dir(m, base_path);
                match read_tokenizer(&dir)? {
                    Some(t) => (t, dir),
                    None if copy_only => return Ok(None),
                    None => {
                        return Err(EngineError::Invalid(format!(
                            "{origin}: the tokenizer source '{}' has no tokenizer.json, which tokens and \
                             pad_to_multiple_of need: {how_to_fix}",
                            dir.display()
                        )));
                    }
                }
            }
            Source::Union => (base_tok.clone(), tokenizer_dir(&base_ref, base_path)),
        };
        let mut out = OutTok { tok: out_tok };
        if union {
            let base_vocab = base_tok.vocab();
            let mut regular: Vec<String> = Vec::new();
            let mut seen: HashSet<String> = HashSet::new();
            let mut added: Vec<Added> = Vec::new();
            for (_, tok) in &toks {
                let added_here: HashSet<&str> = tok.added.iter().map(|a| a.content.as_str()).collect();
                let mut by_id: Vec<(String, usize)> = tok.vocab().into_iter().collect();
                by_id.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
                for (t, id) in by_id {
                    if id >= tok.vocab_size || added_here.contains(t.as_str()) {
                        continue;
                    }
                    if seen.insert(t.clone()) {
                        regular.push(t.clone());
                    }
                }
                for a in &tok.added {
                    if a.id < tok.vocab_size && !added.iter().any(|b| b.content == a.content) {
                        added.push(a.clone());
                    }
                }
            }
            let added_contents: HashSet<&str> = added.iter().map(|a| a.content.as_str()).collect();
            for t in &regular {
                if !added_contents.contains(t.as_str()) && !base_vocab.contains_key(t) {
                    out.add(t, OutTok::plain());
                }
            }
            for a in &added {
                out.add(&a.content, a.flags.clone());
            }
        }
        for (t, _) in &spec.tokens {
            if !out.vocab().contains_key(t) {
                out.add(t, OutTok::plain());
            }
        }
        let vocab = out.vocab();
        let vocab_len = vocab.len();
        let changed = match read_tokenizer(&source_dir)? {
            Some(raw) => raw.vocab() != vocab,
            None => true,
        };
        if let Some((t, id)) = vocab.iter().find(|(_, id)| **id >= vocab_len) {
            return Err(EngineError::Invalid(format!(
                "{origin}: the output tokenizer's ids are not 0..{vocab_len}: '{t}' has id {id}; the tokenizer of \
                 '{}' has gaps in its ids, which mergescope (like mergekit) cannot lay out as rows",
                source_dir.display()
            )));
        }
        let rows = match spec.pad_to_multiple_of {
            Some(m) if m > 0 && !vocab_len.is_multiple_of(m) => (vocab_len / m + 1) * m,
            _ => vocab_len,
        };
        // Permutations of the merge inputs.
        let mut perms = Vec::with_capacity(inputs.len());
        for input in inputs {
            if !spec.models.contains(input) && spec.base_model.as_deref() != Some(input.as_path()) {
                return Err(EngineError::Bug(format!(
                    "merge input '{}' is not among the tokenizer models",
                    input.display()
                )));
            }
            // A model without a tokenizer (base/model sources only) is taken to share the base's.
            let tok = tok_of(input).unwrap_or(base_tok);
            let model_vocab = tok.vocab();
            let mut p = vec![None; vocab_len];
            for (t, &new) in &vocab {
                if let Some(&old) = model_vocab.get(t)
                    && old < tok.vocab_size
                {
                    p[new] = Some(old);
                }
            }
            perms.push(p);
        }
        // The `tokens:` entries, resolved to merge inputs and rows.
        let index_of = |model: &Path, key: &str| -> Result<usize> {
            inputs.iter().position(|i| i == model).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "{origin}: tokens '{key}': the source model '{}' is not one of the merged models, so it has no rows \
                     to give; name one of {}",
                    model.display(),
                    inputs.iter().map(|p| format!("'{}'", p.display())).collect::<Vec<_>>().join(", ")
                ))
            })
        };
        let mut user = BTreeMap::new();
        for (token, cfg) in &spec.tokens {
            let Some(&id) = vocab.get(token) else { continue };
            let source = match &cfg.source {
                None => None,
                Some(EmbeddingSource::Zero) => Some(Default::Zero),
                Some(EmbeddingSource::Model(m)) => {
                    let k = index_of(m, token)?;
                    let row = perms[k][id].ok_or_else(|| {
                        EngineError::Invalid(format!(
                            "{origin}: tokens '{token}': its source '{}' does not have the token; name a model that \
                             has it, or use {{kind: model_token, model: ..., token: ...}}",
                            m.display()
                        ))
                    })?;
                    Some(Default::Row(k, row))
                }
                Some(EmbeddingSource::ModelToken { model, token: r }) => {
                    let k = index_of(model, token)?;
                    let row = match r {
                        TokenRef::Id(i) => *i,
                        TokenRef::Text(t) => {
                            let tok = tok_of(model).unwrap_or(base_tok);
                            *tok.vocab().get(t).ok_or_else(|| {
                                EngineError::Invalid(format!(
                                    "{origin}: tokens '{token}': the token '{t}' is not in the tokenizer of '{}'",
                                    model.display()
                                ))
                            })?
                        }
                    };
                    Some(Default::Row(k, row))
                }
            };
            user.insert(id, (token.clone(), cfg.force, source));
        }
        let base_input = base_path.and_then(|b| inputs.iter().position(|i| i == b));
        let plan = VocabPlan {
            tokenizer: OutTokData {
                json: out.json()?,
                added: out.tok.added.clone(),
            },
            vocab_len,
            rows,
            perms,
            user,
            base_input,
            source_dir,
            changed,
            origin: origin.clone(),
        };
        // Checked now for the case every input has the tensors.
        plan.defaults(&vec![true; inputs.len()])?;
        Ok(Some(plan))
    }

    /// The rows of the tokens some of the inputs marked in `has` (those with the tensor at hand)
    /// lack, or that are forced (`PermutedVocabulary.assign_embedding_sources`, then `execute`).
    fn defaults(&self, has: &[bool]) -> Result<BTreeMap<usize, Default>> {
        let origin = &self.origin;
        let models: Vec<usize> = (0..has.len()).filter(|&k| has[k]).collect();
        let mut out = BTreeMap::new();
        for id in 0..self.vocab_len {
            let present: Vec<usize> = models
                .iter()
                .copied()
                .filter(|&k| self.perms[k][id].is_some())
                .collect();
            let cfg = self.user.get(&id);
            let force = cfg.is_some_and(|(_, f, _)| *f);
            if !force && present.len() == models.len() {
                continue;
            }
            let row = |k: usize| self.perms[k][id].unwrap_or_default();
            let default = match cfg {
                None => match present.as_slice() {
                    [] => Default::Zero,
                    [k] => Default::Row(*k, row(*k)),
                    _ => match self.base_input.filter(|b| has[*b] && self.perms[*b][id].is_some()) {
                        Some(b) => Default::Row(b, row(b)),
                        None => Default::Mean(present.iter().map(|&k| (k, row(k))).collect()),
                    },
                },
                Some((token, _, None)) => {
                    return Err(EngineError::Invalid(format!(
                        "{origin}: tokens '{token}' has no source but some models lack the token (or it is forced); \
                         give it a source: a model, {{kind: model_token, model: ..., token: ...}} or {{kind: zero}}"
                    )));
                }
                Some((token, _, Some(d))) => {
                    if let Default::Row(k, _) = d
                        && !has[*k]
                    {
                        return Err(EngineError::Invalid(format!(
                            "{origin}: tokens '{token}' takes a vocabulary row from a model that lacks the tensor at \
                             hand (an output head its embeddings are tied to); choose another source"
                        )));
                    }
                    d.clone()
                }
            };
            out.insert(id, default);
        }
        Ok(out)
    }

    /// The output's tokenizer files: tokenizer.json, and the source's tokenizer_config.json
    /// (its `added_tokens_decoder` completed) and special_tokens_map.json.
    pub fn tokenizer_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut files = vec![("tokenizer.json".to_owned(), self.tokenizer.json.clone())];
        let config = self.source_dir.join("tokenizer_config.json");
        if config.is_file() {
            let bytes = std::fs::read(&config).map_err(|e| EngineError::io("cannot read", &config, e))?;
            let mut json: Value =
                serde_json::from_slice(&bytes).map_err(|e| bad(&config, format!("is not valid JSON ({e})")))?;
            if let Some(Value::Object(decoder)) = json.get_mut("added_tokens_decoder") {
                for a in &self.tokenizer.added {
                    let mut m = Map::new();
                    m.insert("content".to_owned(), a.content.clone().into());
                    for k in ["lstrip", "normalized", "rstrip", "single_word", "special"] {
                        m.insert(k.to_owned(), a.flags.get(k).cloned().unwrap_or(Value::Bool(false)));
                    }
                    decoder.entry(a.id.to_string()).or_insert(Value::Object(m));
                }
            }
            let mut text = serde_json::to_vec_pretty(&json)
                .map_err(|e| EngineError::Invalid(format!("cannot encode tokenizer_config.json: {e}")))?;
            text.push(b'\n');
            files.push(("tokenizer_config.json".to_owned(), text));
        }
        for name in ["special_tokens_map.json", "chat_template.jinja"] {
            let p = self.source_dir.join(name);
            if p.is_file() {
                files.push((
                    name.to_owned(),
                    std::fs::read(&p).map_err(|e| EngineError::io("cannot read", &p, e))?,
                ));
            }
        }
        Ok(files)
    }

    /// Makes every vocabulary tensor of the `inputs` (the checkpoints of [`VocabPlan::build`]'s
    /// inputs, in that order) read aligned to the output vocabulary.
    pub fn align(&self, inputs: &mut [&mut Checkpoint]) -> Result<()> {
        self.align_where(inputs, |_| true)
    }

    /// [`VocabPlan::align`] for the vocabulary tensors `which` accepts only: a sliced merge's
    /// inputs take their embeddings from one model and their output head from another, each
    /// aligned with the permutation of the model it came from ([`crate::slices::align`]).
    pub fn align_where(&self, inputs: &mut [&mut Checkpoint], which: impl Fn(&str) -> bool) -> Result<()> {
        for name in VOCAB_TENSORS.iter().filter(|n| which(n)) {
            let entries: Vec<Option<TensorEntry>> = inputs.iter().map(|c| c.tensors.get(*name).cloned()).collect();
            let Some(first) = entries.iter().flatten().next() else {
                continue;
            };
            let row_shape = first.shape.get(1..).unwrap_or_default().to_vec();
            let cols: usize = row_shape.iter().product();
            for (k, e) in entries.iter().enumerate() {
                let Some(e) = e else { continue };
                let stored_rows = e.shape.first().copied().unwrap_or(0);
                if e.shape.get(1..).unwrap_or_default() != row_shape.as_slice() {
                    return Err(EngineError::Incompatible(format!(
                        "'{name}' is {:?} in '{}' but {:?} in '{}': vocabulary tensors can only be aligned when their \
                         rows have the same shape",
                        e.shape,
                        inputs[k].path.display(),
                        first.shape,
                        inputs[0].path.display()
                    )));
                }
                if let Some(max) = self.perms[k].iter().flatten().max()
                    && *max >= stored_rows
                {
                    return Err(EngineError::Incompatible(format!(
                        "'{name}' of '{}' has {stored_rows} rows but its tokenizer has token id {max}; the model's \
                         config.json vocab_size or its tokenizer is wrong",
                        inputs[k].path.display()
                    )));
                }
            }
            // The rows some model lacks, read before any tensor is rearranged (over the models that
            // have this tensor, as mergekit gathers them).
            let has: Vec<bool> = entries.iter().map(Option::is_some).collect();
            let defaults = self.defaults(&has)?;
            let forced: HashSet<usize> = self
                .user
                .iter()
                .filter(|(_, (_, f, _))| *f)
                .map(|(id, _)| *id)
                .collect();
            let mut fill: Vec<f32> = Vec::with_capacity(defaults.len() * cols);
            let mut fill_index = BTreeMap::new();
            for (&id, default) in &defaults {
                let read = |k: usize, row: usize| -> Result<Vec<f32>> {
                    let e = entries[k].as_ref().ok_or_else(|| {
                        EngineError::Incompatible(format!(
                            "token id {id} needs a row of '{name}' from '{}', which has no such tensor",
                            inputs[k].path.display()
                        ))
                    })?;
                    if row >= e.shape.first().copied().unwrap_or(0) {
                        return Err(EngineError::Invalid(format!(
                            "token id {id} takes row {row} of '{name}' of '{}', which has only {} rows",
                            inputs[k].path.display(),
                            e.shape.first().copied().unwrap_or(0)
                        )));
                    }
                    inputs[k].read_f32_range(e, row * cols, cols)
                };
                let values = match default {
                    Default::Zero => vec![0f32; cols],
                    Default::Row(k, row) => read(*k, *row)?,
                    Default::Mean(parts) => {
                        let mut acc = vec![0f32; cols];
                        for &(k, row) in parts {
                            for (a, v) in acc.iter_mut().zip(read(k, row)?) {
                                *a += v;
                            }
                        }
                        let n = parts.len() as f32;
                        acc.iter_mut().for_each(|a| *a /= n);
                        acc
                    }
                };
                fill_index.insert(id, fill_index.len());
                fill.extend_from_slice(&values);
            }
            let fill = Arc::new(fill);
            for (k, e) in entries.iter().enumerate() {
                let Some(e) = e else { continue };
                let mut rows = Vec::with_capacity(self.rows);
                for id in 0..self.vocab_len {
                    rows.push(match (self.perms[k][id], fill_index.get(&id)) {
                        (Some(s), _) if !forced.contains(&id) => RowFrom::Stored(s),
                        (_, Some(f)) => RowFrom::Fill(*f),
                        _ => RowFrom::Zero,
                    });
                }
                rows.resize(self.rows, RowFrom::Pad);
                let mut map = RowMap {
                    stored: e.clone(),
                    rows,
                    fill: fill.clone(),
                    pad: Vec::new(),
                };
                if self.rows > self.vocab_len {
                    map.pad = padding_row(inputs[k], &map, self.vocab_len, cols)?;
                }
                inputs[k].map_rows(name, map)?;
            }
        }
        Ok(())
    }

    /// The chat template `auto` picks among the `inputs`' tokenizer folders: the most common
    /// one (the first of those equally common), `None` when none has one.
    pub fn auto_chat_template(models: &[PathBuf], base: Option<&Path>) -> Result<Option<String>> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for m in models {
            if let Some(t) = chat_template_of(&tokenizer_dir(m, base))? {
                let t = t.trim().to_owned();
                match counts.iter_mut().find(|(x, _)| *x == t) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((t, 1)),
                }
            }
        }
        let best = counts.iter().map(|(_, n)| *n).max();
        Ok(counts.into_iter().find(|(_, n)| Some(*n) == best).map(|(t, _)| t))
    }
}

/// The chat template of the tokenizer in `dir`: chat_template.jinja, else tokenizer_config.json's
/// `chat_template` (a string, or the `default` of a list of named templates).
pub fn chat_template_of(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| EngineError::io("cannot read", &jinja, e));
    }
    let config = dir.join("tokenizer_config.json");
    if !config.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&config).map_err(|e| EngineError::io("cannot read", &config, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| bad(&config, format!("is not valid JSON ({e})")))?;
    Ok(match json.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    })
}

/// The mean of rows `[0, vocab_len)` of `map` as `checkpoint` reads them (mergekit fills the
/// padding rows with it), accumulated in f64 over chunks of rows.
fn padding_row(checkpoint: &Checkpoint, map: &RowMap, vocab_len: usize, cols: usize) -> Result<Vec<f32>> {
    let mut acc = vec![0f64; cols];
    let chunk_rows = (1 << 20) / cols.max(1) + 1;
    let mut row = 0;
    while row < vocab_len {
        let n = chunk_rows.min(vocab_len - row);
        let values = checkpoint.read_mapped(map, row * cols, n * cols)?;
        for (i, v) in values.iter().enumerate() {
            acc[i % cols] += f64::from(*v);
        }
        row += n;
    }
    Ok(acc.iter().map(|a| (a / vocab_len.max(1) as f64) as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(vocab: &[&str], added: &[(usize, &str)], vocab_size: Option<usize>) -> Tok {
        let v: Map<String, Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| ((*t).to_owned(), i.into()))
            .collect();
        let added: Vec<Value> = added
            .iter()
            .map(|(id, c)| serde_json::json!({"id": id, "content": c, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
            .collect();
        let json = serde_json::json!({"model": {"type": "BPE", "vocab": v, "merges": ["a b", ["b", "c"]]}, "added_tokens": added});
        parse_tokenizer(Path::new("t.json"), json, vocab_size).unwrap()
    }

    #[test]
    fn added_tokens_take_the_next_id_as_the_tokenizers_library_gives_it() {
        let mut out = OutTok {
            tok: tok(&["<s>", "a", "b"], &[(0, "<s>")], None),
        };
        out.add("c", OutTok::plain());
        out.add("<x>", Map::new());
        out.add("a", Map::new());
        out.add("c", OutTok::plain());
        let v = out.vocab();
        assert_eq!((v["c"], v["<x>"], v["a"], v.len()), (3, 4, 1, 5));
    }

    #[test]
    fn the_base_is_stripped_of_tokens_past_its_vocab_size() {
        let t = stripped(tok(&["a", "b", "c", "d"], &[(4, "<pad>")], Some(3))).unwrap();
        let v = t.vocab();
        assert_eq!(v.len(), 3);
        assert!(!v.contains_key("d") && !v.contains_key("<pad>"));
        let merges = t.json.pointer("/model/merges").unwrap().as_array().unwrap().len();
        assert_eq!(merges, 2);
    }

    #[test]
    fn chat_templates_are_auto_named_or_literal() {
        assert_eq!(ChatTemplate::parse("auto").unwrap(), ChatTemplate::Auto);
        let t = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
        assert_eq!(ChatTemplate::parse(t).unwrap(), ChatTemplate::Literal(t.to_owned()));
        for name in ["alpaca", "chatml", "exaone", "llama3", "mistral"] {
            assert_eq!(ChatTemplate::parse(name).unwrap(), ChatTemplate::Named(name));
        }
        let e = ChatTemplate::parse("mytemplate").unwrap_err();
        assert!(
            e.contains("'auto'") && e.contains("alpaca, chatml, exaone, llama3, mistral"),
            "{e}"
        );
        assert!(ChatTemplate::parse("{{x}}").is_err());
    }

    #[test]
    fn rows_read_through_a_map_in_any_range() {
        // A 4 × 3 tensor whose rows are 10·r + c, read as 6 rows: stored 2, 3 (one run), a
        // fill row, zeros, stored 0, and the padding row.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        let data: Vec<u8> = (0..12)
            .flat_map(|i| ((i / 3 * 10 + i % 3) as f32).to_le_bytes())
            .collect();
        let header = r#"{"w":{"dtype":"F32","shape":[4,3],"data_offsets":[0,48]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&data);
        std::fs::write(&p, bytes).unwrap();
        let mut c = Checkpoint::open(&p).unwrap();
        let map = RowMap {
            stored: c.tensors["w"].clone(),
            rows: vec![
                RowFrom::Stored(2),
                RowFrom::Stored(3),
                RowFrom::Fill(1),
                RowFrom::Zero,
                RowFrom::Stored(0),
                RowFrom::Pad,
            ],
            fill: Arc::new(vec![-1.0, -2.0, -3.0, 7.0, 8.0, 9.0]),
            pad: vec![0.5, 0.25, 0.125],
        };
        c.map_rows("w", map).unwrap();
        let t = c.tensors["w"].clone();
        assert_eq!(t.shape, [6, 3]);
        let all = c.read_f32(&t).unwrap();
        assert_eq!(
            all,
            [
                20., 21., 22., 30., 31., 32., 7., 8., 9., 0., 0., 0., 0., 1., 2., 0.5, 0.25, 0.125
            ]
        );
        for from in 0..18 {
            for len in 0..=18 - from {
                assert_eq!(
                    c.read_f32_range(&t, from, len).unwrap(),
                    all[from..from + len],
                    "{from}+{len}"
                );
            }
        }
        assert_eq!(c.raw_bytes(&t).unwrap().len(), 18 * 4);
    }
}
