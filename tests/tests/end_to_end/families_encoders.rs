//! The bert family's other encoders against Hugging Face transformers: tiny random
//! `DistilBertForSequenceClassification` and `RobertaForSequenceClassification` models, their
//! tokenizers and transformers' logits of a padded batch of sentences and of sentence pairs,
//! committed under `tests/fixtures/families/{distilbert,roberta}-tiny/` by
//! `scripts/family-fixtures.py`. The fixtures' feed-forward layers are scaled so that the exact
//! GELU and its tanh approximation give logits more than 1e-4 apart, which the tolerance here
//! tells apart. No Python runs here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use candle_core::Device;
use mergescope_lab::evaluate::{EvaluatorSpec, open};
use mergescope_lab::family::bert::{self, ClassifierHead};
use mergescope_lab::family::encoder::{EncoderConfig, EncoderKind, SequenceEncoder};
use mergescope_lab::family::hf;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/families")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect()
}

/// Checks the token ids and logits of the fixture in `dir` (config, weights and tokenizer from
/// `model`, reference from `dir`) against transformers' for both padded batches; returns the
/// largest |logit difference|.
fn check_against_transformers(dir: &Path, model: &Path, kind: EncoderKind) -> f64 {
    let r = json(&dir.join("reference.json"));
    let shift = r["tanh_gelu_logit_shift"].as_f64().unwrap();
    assert!(shift > 2e-4, "the fixture no longer tells the GELUs apart ({shift})");
    let dev = Device::Cpu;
    let config = EncoderConfig::read(&model.join("config.json")).unwrap();
    assert_eq!(config.kind(), kind);
    let max_length = r["max_length"].as_u64().unwrap() as usize;
    let tokenizer = hf::load_tokenizer(&model.join("tokenizer.json"), max_length).unwrap();
    let encoder = SequenceEncoder::load(&config, hf::load_weights(model, &dev).unwrap(), &dev, model).unwrap();
    let head = ClassifierHead::load(model, &dev).unwrap();
    assert_eq!((head.kind(), head.classes(), head.hidden()), (kind, 3, 32));
    let texts = strings(&r["texts"]);
    let pairs: Vec<(String, String)> = r["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let p = strings(p);
            (p[0].clone(), p[1].clone())
        })
        .collect();
    let singles: Vec<(&str, Option<&str>)> = texts.iter().map(|t| (t.as_str(), None)).collect();
    let paired: Vec<(&str, Option<&str>)> = pairs.iter().map(|(a, b)| (a.as_str(), Some(b.as_str()))).collect();
    let mut worst = 0f64;
    for (inputs, ids_key, logits_key) in [
        (singles, "input_ids", "logits"),
        (paired, "pair_input_ids", "pair_logits"),
    ] {
        let batch = bert::encode(&tokenizer, inputs.iter().copied(), config.pad_id(), &dev).unwrap();
        let ids = batch.ids.to_vec2::<u32>().unwrap();
        let mask = batch.mask.to_vec2::<u32>().unwrap();
        assert!(
            mask.iter().any(|row| row.contains(&0)),
            "{ids_key}: the batch is not padded, so the attention mask goes untested"
        );
        for (i, want) in r[ids_key].as_array().unwrap().iter().enumerate() {
            let got: Vec<u64> = ids[i]
                .iter()
                .zip(&mask[i])
                .filter(|(_, m)| **m == 1)
                .map(|(t, _)| u64::from(*t))
                .collect();
            let want: Vec<u64> = want.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert_eq!(got, want, "{ids_key} of {:?}", inputs[i]);
        }
        let logits = head
            .logits(&encoder.features(&batch).unwrap())
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let want = r[logits_key].as_array().unwrap();
        assert_eq!(logits.len(), want.len());
        for (got, want) in logits.iter().zip(want) {
            for (g, w) in got.iter().zip(floats(want)) {
                worst = worst.max((f64::from(*g) - w).abs());
            }
        }
    }
    println!(
        "{}: max |logit - transformers| = {worst:.2e} over {} sentences and {} pairs (tanh GELU would move them {shift:.1e})",
        model.display(),
        texts.len(),
        pairs.len()
    );
    assert!(worst <= 1e-4, "max |diff| {worst}");
    worst
}

/// DistilBERT's token ids and classification logits agree with transformers'.
#[test]
fn distilbert_classifier_logits_match_transformers() {
    let dir = fixtures().join("distilbert-tiny");
    check_against_transformers(&dir, &dir, EncoderKind::DistilBert);
}

/// RoBERTa's token ids and classification logits agree with transformers' (positions from
/// pad id + 1, pairs as `<s> A </s></s> B </s>`); an `xlm-roberta` config reads the same.
#[test]
fn roberta_classifier_logits_match_transformers() {
    let dir = fixtures().join("roberta-tiny");
    check_against_transformers(&dir, &dir, EncoderKind::Roberta);
    let tmp = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
    }
    let config = std::fs::read_to_string(dir.join("config.json"))
        .unwrap()
        .replace("\"model_type\": \"roberta\"", "\"model_type\": \"xlm-roberta\"");
    assert!(config.contains("xlm-roberta"));
    std::fs::write(tmp.path().join("config.json"), config).unwrap();
    check_against_transformers(&dir, tmp.path(), EncoderKind::Roberta);
}

/// A suite with `family = "bert"` scores DistilBERT and RoBERTa checkpoints through the same
/// door as BERT ones, with the checkpoint's own head and with the head named by file, to the
/// accuracy and mean cross-entropy of transformers' logits.
#[test]
fn a_bert_suite_scores_distilbert_and_roberta_as_transformers_does() {
    for name in ["distilbert-tiny", "roberta-tiny"] {
        let fx = fixtures().join(name);
        let r = json(&fx.join("reference.json"));
        let tmp = tempfile::tempdir().unwrap();
        let suite = tmp.path().join("suite.toml");
        let data = fx.join("data.jsonl").to_string_lossy().replace('\\', "/");
        let head = fx.join("model.safetensors").to_string_lossy().replace('\\', "/");
        std::fs::write(
            &suite,
            format!(
                "name = \"tiny\"\n\n[model]\nfamily = \"bert\"\nmax_length = 32\nbatch_size = 5\n\n\
                 [[task]]\nname = \"own\"\ndata = \"{data}\"\n\n[[task]]\nname = \"named\"\ndata = \"{data}\"\nhead = \"{head}\"\n"
            ),
        )
        .unwrap();
        let labels: Vec<usize> = r["labels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let all: Vec<Value> = r["logits"]
            .as_array()
            .unwrap()
            .iter()
            .chain(r["pair_logits"].as_array().unwrap())
            .cloned()
            .collect();
        assert_eq!(all.len(), labels.len());
        let (mut correct, mut loss) = (0usize, 0f64);
        for (z, y) in all.iter().zip(&labels) {
            let z = floats(z);
            let best = (0..z.len()).max_by(|a, b| z[*a].total_cmp(&z[*b])).unwrap();
            correct += usize::from(best == *y);
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            loss += m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - z[*y];
        }
        let n = labels.len() as f64;
        assert_eq!(correct as f64 / n, r["accuracy"].as_f64().unwrap());
        let opened = open(&EvaluatorSpec::new(suite.display().to_string(), &Device::Cpu), None).unwrap();
        let report = opened.evaluator.evaluate_file(&fx, &AtomicBool::new(false)).unwrap();
        assert_eq!(report.tasks.len(), 2);
        for t in &report.tasks {
            assert_eq!(t.examples, labels.len(), "{name} {}", t.task);
            assert_eq!(t.accuracy, correct as f64 / n, "{name} {}", t.task);
            let l = t.loss.unwrap();
            assert!(
                (l - loss / n).abs() < 1e-5,
                "{name} {}: loss {l} vs {}",
                t.task,
                loss / n
            );
        }
    }
}

/// A model type the family does not read is refused naming the file, the type and the types
/// it reads; a head of another architecture is refused naming both.
#[test]
fn unknown_model_types_and_foreign_heads_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    std::fs::write(&config, "{\"model_type\": \"gpt2\", \"n_embd\": 32}").unwrap();
    let e = EncoderConfig::read(&config).unwrap_err().to_string();
    for want in [
        config.display().to_string().as_str(),
        "'gpt2'",
        "\"bert\"",
        "\"distilbert\"",
        "\"roberta\"",
        "\"xlm-roberta\"",
    ] {
        assert!(e.contains(want), "{e} lacks {want}");
    }
    let roberta = fixtures().join("roberta-tiny");
    let bert_head = fixtures().join("bert-tiny/model.safetensors");
    let suite = tmp.path().join("suite.toml");
    std::fs::write(
        &suite,
        format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\nhead = \"{}\"\n",
            roberta.join("data.jsonl").to_string_lossy().replace('\\', "/"),
            bert_head.to_string_lossy().replace('\\', "/")
        ),
    )
    .unwrap();
    let opened = open(&EvaluatorSpec::new(suite.display().to_string(), &Device::Cpu), None).unwrap();
    let e = opened
        .evaluator
        .evaluate_file(&roberta, &AtomicBool::new(false))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("BERT classifier") && e.contains("RoBERTa model") && e.contains("task 'a'"),
        "{e}"
    );
}
