//! mergekit's `tokenizer_source: union` and `tokenizer:` block against mergekit itself: three
//! tiny Llamas whose tokenizers differ (added tokens, a permuted vocabulary, a token only one
//! model has; `tests/fixtures/mergekit/tokenizer_union/`, made by `scripts/mergekit-parity.py
//! --only tokenizer-union`) are merged by mergescope from mergekit's YAML, and the output's
//! vocabulary, config and tensors are compared with mergekit's output. mergekit numbers the
//! tokens the base lacks in Python set order (it changes from run to run), so rows are compared
//! token by token.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::MemModel;
use mergescope_interop::mergekit;
use mergescope_interop::recipe::Recipe;
use mergescope_tests::{assert_contains, merge_to_files, read_model as read, vocab_of};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit/tokenizer_union")
}

/// Converts the mergekit YAML `text` (its models under this fixture folder) and merges it into `out`.
pub(super) fn run_yaml(text: &str, out: &Path) -> Result<(), String> {
    let converted = mergekit::convert(text, &fixtures().join("merge.yml"), out).map_err(|e| e.to_string())?;
    let lib = format!("mergescope_plugin_{}", converted.recipe.method.replace('-', "_"));
    merge_to_files(&lib, &converted.to_request(false).map_err(|e| e.to_string())?)
}

/// token → id of mergekit's output, as the fixture manifest records it for a case.
pub(super) fn manifest_vocab(config: &Value) -> BTreeMap<String, usize> {
    config["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, i)| (t.clone(), i.as_u64().unwrap() as usize))
        .collect()
}

const VOCAB_TENSORS: [&str; 2] = ["model.embed_tokens.weight", "lm_head.weight"];

/// Largest |Δ| between the two outputs, vocabulary rows matched by token (and padding rows by
/// position).
pub(super) fn max_diff(
    case: &str,
    ours: &MemModel,
    theirs: &MemModel,
    our_vocab: &BTreeMap<String, usize>,
    their_vocab: &BTreeMap<String, usize>,
) -> f64 {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{case}: tensor names"
    );
    let mut worst = 0f64;
    let mut diff = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            worst = worst.max(f64::from((x - y).abs()));
        }
    };
    for (name, t) in ours {
        let u = &theirs[name];
        assert_eq!(t.shape, u.shape, "{case}: {name}");
        if VOCAB_TENSORS.contains(&name.as_str()) {
            let cols = t.shape[1];
            let row = |m: &[f32], i: usize| m[i * cols..(i + 1) * cols].to_vec();
            for (tok, &i) in our_vocab {
                diff(&row(&t.data, i), &row(&u.data, their_vocab[tok]));
            }
            for i in our_vocab.len()..t.shape[0] {
                diff(&row(&t.data, i), &row(&u.data, i));
            }
        } else {
            diff(&t.data, &u.data);
        }
    }
    worst
}

#[test]
fn union_vocabularies_give_mergekits_tokenizer_config_and_tensors() {
    let manifest: Value = serde_json::from_slice(&std::fs::read(fixtures().join("manifest.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The cases with slices are compared in mergekit_lora_slices.rs.
    let configs: Vec<&Value> = manifest["configs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["name"].as_str().unwrap().contains("_slices_"))
        .collect();
    assert_eq!(configs.len(), 3);
    let base_vocab = vocab_of(&fixtures().join("inputs/base/tokenizer.json"));
    for config in configs {
        let case = config["name"].as_str().unwrap();
        let text = std::fs::read_to_string(fixtures().join(config["config"].as_str().unwrap())).unwrap();
        let out = dir.path().join(case);
        run_yaml(&text, &out).unwrap_or_else(|e| panic!("{case}: {e}"));
        let theirs_dir = fixtures().join(config["output"].as_str().unwrap());

        // The vocabulary: the same tokens; the base's at the base's ids.
        let ours_vocab = vocab_of(&out.join("tokenizer.json"));
        let theirs_vocab = manifest_vocab(config);
        assert_eq!(
            ours_vocab.keys().collect::<Vec<_>>(),
            theirs_vocab.keys().collect::<Vec<_>>(),
            "{case}: tokens"
        );
        for (t, i) in &base_vocab {
            assert_eq!(ours_vocab[t], *i, "{case}: id of the base's token {t:?}");
            assert_eq!(theirs_vocab[t], *i, "{case}: mergekit's id of {t:?}");
        }
        let same_ids = ours_vocab.iter().filter(|(t, i)| theirs_vocab[*t] == **i).count();

        // config.json: the (padded) vocabulary size.
        let cfg: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["vocab_size"], config["vocab_size_in_config"], "{case}: vocab_size");

        // The chat template, where the configuration sets one.
        if text.contains("chat_template:") {
            let ours = std::fs::read_to_string(out.join("chat_template.jinja")).unwrap();
            assert_eq!(ours.trim(), config["chat_template"].as_str().unwrap().trim(), "{case}");
        }

        let worst = max_diff(case, &read(&out), &read(&theirs_dir), &ours_vocab, &theirs_vocab);
        println!(
            "{case}: {} tokens ({same_ids} at mergekit's ids), vocab_size {}, max |Δ| {worst:.2e}",
            ours_vocab.len(),
            cfg["vocab_size"]
        );
        assert!(worst <= 1e-6, "{case}: max |Δ| {worst}");

        // The output loads as the same tokenizer would: tokenizer_config.json beside it.
        assert!(out.join("tokenizer_config.json").is_file(), "{case}");
    }
}

#[test]
fn union_rows_follow_mergekits_defaults() {
    // task_arithmetic_union, checked against the inputs directly: 'Z' (expert2 lacks it) takes
    // the base's row for expert2, '<|im_start|>' (only expert1) expert1's row for everyone, so
    // the merged row is expert1's plus 0.5 times its own task vector (base and expert2 equal it).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ta");
    let text = std::fs::read_to_string(fixtures().join("mergekit/task_arithmetic_union.yml")).unwrap();
    run_yaml(&text, &out).unwrap();
    let vocab = vocab_of(&out.join("tokenizer.json"));
    let merged = read(&out);
    let base = read(&fixtures().join("inputs/base"));
    let e1 = read(&fixtures().join("inputs/expert1"));
    let e2 = read(&fixtures().join("inputs/expert2"));
    let v1 = vocab_of(&fixtures().join("inputs/expert1/tokenizer.json"));
    let v2 = vocab_of(&fixtures().join("inputs/expert2/tokenizer.json"));
    let name = "model.embed_tokens.weight";
    let cols = merged[name].shape[1];
    let row = |m: &MemModel, i: usize| m[name].data[i * cols..(i + 1) * cols].to_vec();
    // 'Z': base + 0.5 (e1 − base) + 0.5 (base − base).
    let z = vocab["Z"];
    let (b, x1) = (row(&base, z), row(&e1, v1["Z"]));
    for (j, m) in row(&merged, z).iter().enumerate() {
        assert!((m - (b[j] + 0.5 * (x1[j] - b[j]))).abs() < 1e-6);
    }
    // 'a' sits at another id in expert2.
    let a = vocab["a"];
    let (b, x1, x2) = (row(&base, a), row(&e1, v1["a"]), row(&e2, v2["a"]));
    assert_ne!(v2["a"], a);
    for (j, m) in row(&merged, a).iter().enumerate() {
        assert!((m - (b[j] + 0.5 * (x1[j] - b[j]) + 0.5 * (x2[j] - b[j]))).abs() < 1e-6);
    }
    // '<|im_start|>': every model takes expert1's row (the base too), so the task vectors are 0.
    let s = vocab["<|im_start|>"];
    assert_eq!(row(&merged, s), row(&e1, v1["<|im_start|>"]));
}

#[test]
fn bad_tokenizer_settings_fail_naming_the_key_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged");
    let head = "merge_method: task_arithmetic\nbase_model: inputs/base\nmodels:\n  - model: inputs/expert1\n    parameters: {weight: 0.5}\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "tokenizer_source: union\ntokenizer: {source: union}\n",
            &["both tokenizer_source and tokenizer"],
        ),
        (
            "tokenizer: {source: union, pad_to: 8}\n",
            &["'pad_to'", "pad_to_multiple_of"],
        ),
        (
            "tokenizer: {tokens: {x: {source: {kind: nearest}}}}\n",
            &["tokens['x']", "model_token or zero"],
        ),
        (
            "tokenizer: {tokens: {'<x>': {source: {kind: model_token, model: inputs/expert2, token: a}}}}\n",
            &["inputs/expert2", "not one of the merged models"],
        ),
        (
            "tokenizer_source: union\nchat_template: vicuna\n",
            &["'vicuna'", "named template (alpaca, chatml"],
        ),
        (
            "tokenizer_source: union\nchat_template: 3\n",
            &["chat_template must be"],
        ),
        (
            "tokenizer: {tokens: {x: {force: true}}}\n",
            &["tokens 'x'", "no source"],
        ),
    ];
    for (tail, needles) in cases {
        let e = run_yaml(&format!("{head}{tail}"), &out).expect_err(tail);
        assert_contains(&e, needles);
        assert!(!out.exists());
    }
    // A model without tokenizer.json: the main parity fixtures have none.
    let plain = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit/merge.yml");
    let e = mergekit::convert(
        "merge_method: linear\nparameters: {weight: 1.0}\nmodels: [inputs/expert1, inputs/expert2]\ntokenizer_source: union\n",
        &plain,
        &out,
    )
    .unwrap_err()
    .to_string();
    assert_contains(&e, &["union", "tokenizer.json", "expert1", "save_pretrained"]);
}

#[test]
fn a_literal_chat_template_is_written_and_auto_takes_the_shared_one() {
    let dir = tempfile::tempdir().unwrap();
    let template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}";
    let yaml = format!(
        "merge_method: linear\nparameters: {{weight: 1.0}}\nmodels: [inputs/base, inputs/expert1]\ntokenizer_source: union\nchat_template: \"{}\"\n",
        template.replace('\n', "\\n").replace('"', "\\\"")
    );
    let out = dir.path().join("literal");
    run_yaml(&yaml, &out).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("chat_template.jinja")).unwrap(),
        template
    );
    // A named template: mergescope's own text, which renders as mergekit's bundled one
    // (scripts/mergekit-chat-templates.py); `recipe convert` keeps the name.
    for name in ["chatml", "llama3"] {
        let out = dir.path().join(name);
        let yaml = format!(
            "merge_method: linear\nparameters: {{weight: 1.0}}\nmodels: [inputs/base, inputs/expert1]\ntokenizer_source: union\nchat_template: {name}\n"
        );
        run_yaml(&yaml, &out).unwrap_or_else(|e| panic!("{e}"));
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../assets/chat_templates/{name}.jinja")),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("chat_template.jinja")).unwrap(),
            shipped
        );
        let recipe = mergekit::convert(&yaml, &fixtures().join("merge.yml"), &out)
            .unwrap()
            .recipe
            .to_toml()
            .unwrap();
        assert!(recipe.contains(&format!("chat_template = \"{name}\"")), "{recipe}");
    }
    // A base tokenizer without a template, and only expert1 with one: auto takes expert1's.
    let out = dir.path().join("auto");
    run_yaml(
        "merge_method: linear\nparameters: {weight: 1.0}\nmodels: [inputs/base, inputs/expert1]\ntokenizer_source: base\nbase_model: inputs/base\nchat_template: auto\n",
        &out,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let shared = std::fs::read_to_string(fixtures().join("inputs/expert1/chat_template.jinja")).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("chat_template.jinja")).unwrap().trim(),
        shared.trim()
    );
    // tokenizer_source: base keeps the base's vocabulary: expert1's added rows are dropped.
    let cfg: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["vocab_size"], 64);
    assert_eq!(read(&out)["lm_head.weight"].shape, [64, 32]);
}

/// Every file of a folder output but the ones that name where the merge came from (the YAML kept
/// as `mergekit_config.yml` and the model card quoting it): name → bytes. The shard index lists
/// the folder's other files: it is kept without `mergekit_config.yml`.
fn weights_and_tokenizer_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !["mergekit_config.yml", "README.md"].contains(&p.file_name().unwrap().to_str().unwrap()))
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            let mut bytes = std::fs::read(&p).unwrap();
            if name == "model.safetensors.index.json" {
                let mut index: Value = serde_json::from_slice(&bytes).unwrap();
                for list in index["metadata"].as_object_mut().unwrap().values_mut() {
                    if let Value::Array(files) = list {
                        files.retain(|f| f != "mergekit_config.yml");
                    }
                }
                bytes = serde_json::to_vec(&index).unwrap();
            }
            (name, bytes)
        })
        .collect()
}

/// `recipe convert` keeps the tokenizer settings (issue #22): a configuration and the recipe it
/// converts to (written as TOML and read back, as `mergescope recipe convert` then `mergescope
/// merge recipe.toml` do) write byte-identical weights, config, tokenizer and chat template.
#[test]
fn a_converted_recipe_keeps_the_tokenizer_settings_and_writes_the_same_files() {
    let manifest: Value = serde_json::from_slice(&std::fs::read(fixtures().join("manifest.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(String, String)> = manifest["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = std::fs::read_to_string(fixtures().join(c["config"].as_str().unwrap())).unwrap();
            (c["name"].as_str().unwrap().to_owned(), text)
        })
        .collect();
    // A method without a base role whose base_model is the tokenizer's ([tokenizer] base), a
    // base source with a token it lacks, padding and a literal template.
    cases.push((
        "linear_base_source".to_owned(),
        "merge_method: linear\nparameters: {weight: 1.0}\nbase_model: inputs/base\nmodels: [inputs/base, inputs/expert1, inputs/expert2]\n\
         tokenizer:\n  source: base\n  pad_to_multiple_of: 48\n  tokens:\n    '<|im_start|>': {source: inputs/expert1}\n\
         chat_template: \"{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}\"\n"
            .to_owned(),
    ));
    for (case, text) in &cases {
        let from_yaml = dir.path().join(format!("{case}-yaml"));
        run_yaml(text, &from_yaml).unwrap_or_else(|e| panic!("{case}: {e}"));

        let from_toml = dir.path().join(format!("{case}-toml"));
        let converted = mergekit::convert(text, &fixtures().join("merge.yml"), &from_toml).unwrap();
        let recipe_file = dir.path().join(format!("{case}.toml"));
        let toml_text = converted.recipe.to_toml().unwrap();
        assert!(toml_text.contains("[tokenizer]"), "{case}:\n{toml_text}");
        assert_eq!(
            toml_text.contains("chat_template"),
            text.contains("chat_template"),
            "{case}:\n{toml_text}"
        );
        assert!(
            !converted.notes.iter().any(|n| n.contains("tokenizer")),
            "{case}: {:?}",
            converted.notes
        );
        std::fs::write(&recipe_file, &toml_text).unwrap();
        let recipe = Recipe::load(&recipe_file).unwrap();
        assert_eq!(recipe, converted.recipe, "{case}");
        let lib = format!("mergescope_plugin_{}", recipe.method.replace('-', "_"));
        merge_to_files(&lib, &recipe.to_request(false).unwrap()).unwrap_or_else(|e| panic!("{case}: {e}"));

        let (a, b) = (
            weights_and_tokenizer_files(&from_yaml),
            weights_and_tokenizer_files(&from_toml),
        );
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{case}");
        for (name, bytes) in &a {
            assert!(*bytes == b[name], "{case}: {name} differs");
        }
        assert!(a.contains_key("tokenizer.json"), "{case}: {:?}", a.keys());
        println!(
            "{case}: {} files byte-identical: {:?}",
            a.len(),
            a.keys().collect::<Vec<_>>()
        );
    }
    // The base-source case: its vocabulary is the base's plus the token, padded to 96 rows.
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("linear_base_source-toml/config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["vocab_size"], 96);
}
