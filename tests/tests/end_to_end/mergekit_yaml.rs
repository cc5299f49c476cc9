//! mergekit's YAML configurations run by mergescope: every configuration that made a parity
//! fixture (`tests/fixtures/mergekit/mergekit/*.yml`, as `scripts/mergekit-parity.py` gave them
//! to `mergekit-yaml`) is converted, merged into a Hugging Face folder and compared with
//! mergekit's output folder; the folder itself (config, card, index) and frankenmerge slices
//! are checked; bad configurations fail naming the key.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::merge::MemModel;
use mergescope_interop::mergekit;
use mergescope_tests::{assert_contains, merge_to_files};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit")
}

use mergescope_tests::read_model as read;

/// Converts the YAML `text` as if it lay in the fixtures folder (mergekit ran there, so its
/// model paths are relative to it) and merges it into `out`.
fn run_yaml(text: &str, out: &Path) -> Result<(), String> {
    let converted = mergekit::convert(text, &fixtures().join("merge.yml"), out).map_err(|e| e.to_string())?;
    let lib = format!("mergescope_plugin_{}", converted.recipe.method.replace('-', "_"));
    merge_to_files(&lib, &converted.to_request(false).map_err(|e| e.to_string())?)
}

/// (largest |Δ|, number of elements differing by more than `tolerance`, elements).
fn compare(case: &str, ours: &MemModel, theirs: &MemModel, tolerance: f64) -> (f64, usize, usize) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{case}: tensor names"
    );
    let (mut worst, mut off, mut n) = (0f64, 0usize, 0usize);
    for (name, t) in ours {
        assert_eq!(t.shape, theirs[name].shape, "{case}: {name}");
        for (x, y) in t.data.iter().zip(&theirs[name].data) {
            let d = f64::from((x - y).abs());
            worst = worst.max(d);
            off += usize::from(d > tolerance);
            n += 1;
        }
    }
    (worst, off, n)
}

#[test]
fn every_parity_config_runs_from_its_yaml_and_gives_mergekits_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let mut configs: Vec<PathBuf> = std::fs::read_dir(fixtures().join("mergekit"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    configs.sort();
    assert!(configs.len() >= 14, "{} configs", configs.len());
    let mut ran = 0;
    for config in &configs {
        let case = config.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(config).unwrap();
        // Random-drop methods are compared statistically by mergekit_parity.rs.
        if ["dare", "della"]
            .iter()
            .any(|m| text.contains(&format!("merge_method: {m}")))
        {
            continue;
        }
        let out = dir.path().join(&case);
        run_yaml(&text, &out).unwrap_or_else(|e| panic!("{case}: {e}"));
        let (worst, off, n) = compare(&case, &read(&out), &read(&config.with_extension("")), 1e-6);
        // Magnitude-trimming methods keep exactly k entries in mergekit, whose choice among equal
        // magnitudes at the cut no rule reproduces (docs/mergekit.md): under 1 % of the elements.
        let trims = ["ties", "breadcrumbs"]
            .iter()
            .any(|m| text.contains(&format!("merge_method: {m}")));
        // SCE's variance top-k has the same arbitrary choice among equal variances at its cut
        // (bf16 task vectors repeat them); a swapped element also shifts the tensor's weights
        // (mean squares of the selected entries), so many more elements move a little (< 1e-4).
        let selects = text.contains("merge_method: sce") && text.contains("select_topk");
        println!("{case}: max |Δ| {worst:.2e}, {off} of {n} elements beyond 1e-6");
        if trims {
            assert!(off * 100 < n, "{case}: {off} of {n} elements differ");
        } else if selects {
            let (_, swapped, _) = compare(&case, &read(&out), &read(&config.with_extension("")), 1e-4);
            println!("{case}: {swapped} elements beyond 1e-4 (selection swaps at variance ties)");
            assert!(swapped * 200 < n, "{case}: {swapped} of {n} elements beyond 1e-4");
        } else {
            assert_eq!(off, 0, "{case}: max |Δ| {worst}");
        }
        ran += 1;
    }
    assert!(ran >= 14, "only {ran} configs ran");
}

#[test]
fn the_output_is_a_hugging_face_folder_with_config_card_and_the_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged");
    let text = std::fs::read_to_string(fixtures().join("mergekit/slerp_t03.yml")).unwrap();
    run_yaml(&text, &out).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "README.md",
            "config.json",
            "mergekit_config.yml",
            "model.safetensors",
            "model.safetensors.index.json"
        ]
    );
    // The base's config, with the output dtype (out_dtype: float32) written in.
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let base: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("inputs/base/config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "float32");
    for key in ["model_type", "hidden_size", "num_hidden_layers", "vocab_size"] {
        assert_eq!(config[key], base[key], "{key}");
    }
    assert_eq!(std::fs::read_to_string(out.join("mergekit_config.yml")).unwrap(), text);
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert_contains(
        &card,
        &[
            "`slerp`",
            "base: `base`",
            "expert: `expert1`",
            "\"t\": 0.3",
            "merge_method: slerp",
        ],
    );
    // The folder reopens as a checkpoint, and running again refuses to replace it...
    assert_eq!(Checkpoint::open(&out).unwrap().tensors.len(), 21);
    let e = run_yaml(&text, &out).unwrap_err();
    assert_contains(&e, &["already exists", "--overwrite"]);
    // ...but --overwrite replaces it, since every file in it is one mergescope wrote.
    let converted = mergekit::convert(&text, &fixtures().join("merge.yml"), &out).unwrap();
    merge_to_files("mergescope_plugin_slerp", &converted.to_request(true).unwrap()).unwrap();
}

#[test]
fn a_frankenmerge_stacks_layer_slices_renumbered() {
    // Layers 0–1 of the base, then layer 1 of expert 2, as mergekit's passthrough slices.
    let text = "slices:\n  - sources:\n      - model: inputs/base\n        layer_range: [0, 2]\n  - sources:\n      - \
                model: inputs/expert2\n        layer_range: [1, 2]\nmerge_method: passthrough\ndtype: bfloat16\n";
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("franken");
    run_yaml(text, &out).unwrap();
    let merged = read(&out);
    let base = read(&fixtures().join("inputs/base"));
    let expert = read(&fixtures().join("inputs/expert2"));
    let layer_tensors = |m: &MemModel, l: usize| -> Vec<String> {
        m.keys()
            .filter(|n| n.starts_with(&format!("model.layers.{l}.")))
            .cloned()
            .collect()
    };
    assert_eq!(layer_tensors(&merged, 2).len(), layer_tensors(&base, 0).len());
    assert!(layer_tensors(&merged, 3).is_empty());
    for l in 0..2 {
        for n in layer_tensors(&base, l) {
            assert_eq!(merged[&n].data, base[&n].data, "{n}");
        }
    }
    for n in layer_tensors(&expert, 1) {
        let renamed = n.replacen("model.layers.1.", "model.layers.2.", 1);
        assert_eq!(merged[&renamed].data, expert[&n].data, "{renamed}");
    }
    // Embeddings from the first slice's model, final norm and head from the last slice's.
    assert_eq!(
        merged["model.embed_tokens.weight"].data,
        base["model.embed_tokens.weight"].data
    );
    assert_eq!(merged["model.norm.weight"].data, expert["model.norm.weight"].data);
    assert_eq!(merged["lm_head.weight"].data, expert["lm_head.weight"].data);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["num_hidden_layers"], 3);
    // One weights file, as the single-file models it came from (not shards of their total).
    assert!(out.join("model.safetensors").is_file());
    assert_eq!(config["torch_dtype"], "bfloat16");
}

#[test]
fn bad_configs_name_the_key_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let cases: &[(&str, &[&str])] = &[
        (
            "merge_methd: ties\nmodels: [inputs/base]\n",
            &["unknown key 'merge_methd'", "merge_method"],
        ),
        (
            "merge_method: tiez\nbase_model: inputs/base\nmodels: [inputs/expert1]\n",
            &["'tiez'", "ties, dare_ties"],
        ),
        (
            "merge_method: ties\nbase_model: inputs/base\nmodels:\n  - model: inputs/expert1\n    parameters: {densty: 0.5}\n",
            &["'densty'", "density", "expert1"],
        ),
        (
            "merge_method: task_arithmetic\nmodels: [inputs/expert1]\n",
            &["needs base_model"],
        ),
        (
            "merge_method: slerp\nbase_model: inputs/base\nmodels: [inputs/base, inputs/expert1, inputs/expert2]\nparameters: {t: 0.5}\n",
            &["exactly 1 model", "has 2"],
        ),
        (
            "merge_method: linear\nparameters: {weight: 1.0}\nmodels: [inputs/expert1, org/not-downloaded]\n",
            &["org/not-downloaded", "huggingface-cli download"],
        ),
        (
            "merge_method: linear\nparameters: {weight: 1.0}\nmodels: [inputs/expert1]\ntokenizer_source: union\n",
            &["union", "tokenizer.json", "save_pretrained"],
        ),
        (
            "merge_method: linear\nparameters: {weight: 1.0}\nmodels: [inputs/expert1]\nmodules: {default: {models: [inputs/expert1]}}\n",
            &["'modules'", "exactly one"],
        ),
        ("merge_method: [ties\n", &["not valid YAML"]),
        (
            "merge_method: passthrough\nslices:\n  - sources:\n      - model: inputs/base\n        layer_range: [0, 9]\n",
            &["[0, 9)", "has 2 layers"],
        ),
    ];
    for (text, needles) in cases {
        let e = run_yaml(text, &out).unwrap_err();
        assert_contains(&e, needles);
        assert!(!out.exists(), "{text}: no output after a refused config");
    }
}
