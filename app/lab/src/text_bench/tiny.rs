//! A tiny random BERT that the text benchmark builds on as it builds on all-MiniLM-L6-v2, with
//! no download: the one setup that the lab's, the window's and the CLI's tests of text builds
//! share.

use super::build::TextRecipe;
use super::data::{TextTask, builtin_tasks};
use crate::demo::save_params;
use crate::nn::Params;
use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::path::{Path, PathBuf};

/// Writes a tiny random BERT folder into `dir/tiny-bert` and returns that folder: 2 layers,
/// hidden 16, a letter-by-letter WordPiece `tokenizer.json`, `config.json`, and
/// `model.safetensors` with its pooler, the same numbers every time.
pub fn tiny_backbone(dir: &Path) -> Result<PathBuf> {
    let dir = dir.join("tiny-bert");
    std::fs::create_dir_all(&dir).map_err(|e| EngineError::io("cannot create", &dir, e))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| EngineError::io("cannot write", path, e))
    };
    let mut vocab: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"].map(String::from).to_vec();
    for c in 'a'..='z' {
        vocab.push(c.to_string());
        vocab.push(format!("##{c}"));
    }
    let ids: serde_json::Map<String, serde_json::Value> =
        vocab.iter().enumerate().map(|(i, w)| (w.clone(), i.into())).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids},
    });
    write("tokenizer.json", tokenizer.to_string())?;
    let (h, inter, layers) = (16usize, 32usize, 2usize);
    let config = serde_json::json!({
        "model_type": "bert", "vocab_size": vocab.len(), "hidden_size": h,
        "num_hidden_layers": layers, "num_attention_heads": 2, "intermediate_size": inter,
        "max_position_embeddings": 64, "type_vocab_size": 2, "pad_token_id": 0,
    });
    write("config.json", config.to_string())?;
    let mut rng = mergescope_engine::rng::SplitMix64::new(42);
    let d = Device::Cpu;
    let mut p = Params::new();
    let mut add = |name: String, shape: &[usize], fill: Option<f32>| -> Result<()> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| fill.unwrap_or_else(|| ((rng.uniform() * 2.0 - 1.0) * 0.3) as f32))
            .collect();
        p.insert(name, Tensor::from_vec(v, shape, &d)?);
        Ok(())
    };
    add("embeddings.word_embeddings.weight".into(), &[vocab.len(), h], None)?;
    add("embeddings.position_embeddings.weight".into(), &[64, h], None)?;
    add("embeddings.token_type_embeddings.weight".into(), &[2, h], None)?;
    add("embeddings.LayerNorm.weight".into(), &[h], Some(1.0))?;
    add("embeddings.LayerNorm.bias".into(), &[h], Some(0.0))?;
    for l in 0..layers {
        for (m, o, i) in [
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", inter, h),
            ("output.dense", h, inter),
        ] {
            add(format!("encoder.layer.{l}.{m}.weight"), &[o, i], None)?;
            add(format!("encoder.layer.{l}.{m}.bias"), &[o], None)?;
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            add(format!("encoder.layer.{l}.{norm}.weight"), &[h], Some(1.0))?;
            add(format!("encoder.layer.{l}.{norm}.bias"), &[h], Some(0.0))?;
        }
    }
    add("pooler.dense.weight".into(), &[h, h], None)?;
    add("pooler.dense.bias".into(), &[h], None)?;
    let meta = [("format".to_owned(), "pt".to_owned())].into_iter().collect();
    save_params(&dir.join("model.safetensors"), &p, &meta)?;
    Ok(dir)
}

/// The built-in tasks named in `names`, in the built-in order.
pub fn tasks_named(names: &[&str]) -> Result<Vec<TextTask>> {
    Ok(builtin_tasks()?
        .into_iter()
        .filter(|t| names.contains(&t.name.as_str()))
        .collect())
}

/// Seed 0's full fine-tuning recipe made tiny for a text build of [`tiny_backbone`]: texts of
/// 16 tokens, 5 head steps, one warm-up step and one expert step, batches of `batch_size`
/// texts, at most `max_train` train and `max_eval` test texts per task.
pub fn tiny_recipe(batch_size: usize, max_train: usize, max_eval: usize) -> TextRecipe {
    let mut recipe = TextRecipe::default_for(0);
    (recipe.max_length, recipe.head_steps, recipe.expert_steps) = (16, 5, 1);
    (recipe.warmup_steps, recipe.batch_size) = (1, batch_size);
    (recipe.max_train, recipe.max_eval) = (Some(max_train), Some(max_eval));
    recipe
}
