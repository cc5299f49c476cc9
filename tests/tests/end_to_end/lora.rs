//! LoRA adapters as merge inputs, checked against PEFT: each adapter of
//! `tests/fixtures/peft` (made by `scripts/peft-fixtures.py`: plain LoRA on q/v/up_proj, and
//! rsLoRA with an alpha_pattern and lm_head in modules_to_save) applied to the tiny Llama base
//! gives the tensors of PEFT's `merge_and_unload()`; adapters merge like the models they stand
//! for; an adapter extracted by SVD gives the model back (embeddings, output head and norms
//! saved whole as modules_to_save, or as LoRA with --embed-lora); bad adapters fail naming the
//! tensor. `scripts/peft-extract-check.py` (by hand) loads such adapters in PEFT itself.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::merge::MemModel;
use mergescope_interop::lora;
use mergescope_interop::request::{MergeRequest, open_expert};
use mergescope_tests::{assert_contains, max_difference, merge_to_files};
use serde_json::json;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn base() -> PathBuf {
    fixtures().join("mergekit/inputs/base")
}

use mergescope_tests::tensors_of as read;

#[test]
fn adapters_read_as_peft_merges_them() {
    for case in ["plain", "rslora"] {
        let adapter = fixtures().join(format!("peft/adapter-{case}"));
        assert!(lora::is_adapter(&adapter));
        let applied = open_expert(&adapter, Some(&base())).unwrap();
        let peft = Checkpoint::open(&fixtures().join(format!("peft/merged-{case}"))).unwrap();
        let (ours, theirs) = (read(&applied), read(&peft));
        let worst = max_difference(&ours, &theirs);
        println!("{case}: max |Δ| against PEFT's merge_and_unload {worst:.2e}");
        // PEFT adds B·A in float32 to the bf16 base upcast to float32; mergescope in f64.
        assert!(worst < 1e-6, "{case}: {worst}");
        // Only the adapted weights changed (and lm_head, saved whole, for rslora).
        let plain = read(&Checkpoint::open(&base()).unwrap());
        let changed: Vec<&String> = ours.keys().filter(|n| ours[*n].data != plain[*n].data).collect();
        let expected = if case == "plain" { 6 } else { 5 };
        assert_eq!(changed.len(), expected, "{case}: {changed:?}");
        // Ranges read alone give the same values as the whole tensor (the streaming path).
        let t = &applied.tensors["model.layers.1.self_attn.v_proj.weight"];
        let whole = applied.read_f32(t).unwrap();
        for (from, len) in [(0, 7), (5, 40), (31, 33), (1000, 24)] {
            assert_eq!(
                applied.read_f32_range(t, from, len).unwrap(),
                whole[from..from + len],
                "{from}+{len}"
            );
        }
    }
}

#[test]
fn adapters_merge_like_the_models_they_stand_for() {
    // Task arithmetic of the two adapters equals task arithmetic of PEFT's merged models.
    let dir = tempfile::tempdir().unwrap();
    let run = |experts: Vec<PathBuf>, out: &str| {
        let req = MergeRequest::new(experts, dir.path().join(out))
            .with_base(Some(base()))
            .with_params(json!({"lambda": 0.7}));
        merge_to_files("mergescope_plugin_task_arithmetic", &req).unwrap();
        read(&Checkpoint::open(&dir.path().join(out)).unwrap())
    };
    let adapters = run(
        vec![
            fixtures().join("peft/adapter-plain"),
            fixtures().join("peft/adapter-rslora"),
        ],
        "a.safetensors",
    );
    let merged = run(
        vec![
            fixtures().join("peft/merged-plain"),
            fixtures().join("peft/merged-rslora"),
        ],
        "m.safetensors",
    );
    // The outputs take the first input's dtype (bf16 base): equal up to its rounding.
    assert!(max_difference(&adapters, &merged) < 1e-2);
    let base = read(&Checkpoint::open(&base()).unwrap());
    assert_ne!(
        adapters["model.layers.0.self_attn.q_proj.weight"].data,
        base["model.layers.0.self_attn.q_proj.weight"].data
    );
}

#[test]
fn an_extracted_adapter_gives_the_model_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("extracted");
    let base_ck = Checkpoint::open(&base()).unwrap();
    let model = Checkpoint::open(&fixtures().join("peft/merged-plain")).unwrap();
    // Rank 4 holds the plain adapter's updates exactly (rank ≤ 4 per matrix).
    let report = lora::extract(&base_ck, &model, 4, &out, false).unwrap();
    assert_eq!(report.adapted, 14, "7 matrices in each of 2 layers");
    assert!(report.left_out.is_empty(), "{:?}", report.left_out);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["r"].as_u64(), config["lora_alpha"].as_u64()),
        (Some(4), Some(4))
    );
    let back = read(&open_expert(&out, Some(&base())).unwrap());
    let worst = max_difference(&back, &read(&model));
    println!("extract rank 4 and apply: max |Δ| {worst:.2e}");
    assert!(worst < 1e-5, "{worst}");
    // Rank 1 loses part of the rank-4 updates; the untouched matrices stay exact.
    let low = dir.path().join("rank1");
    lora::extract(&base_ck, &model, 1, &low, false).unwrap();
    let one = read(&open_expert(&low, Some(&base())).unwrap());
    assert!(max_difference(&one, &read(&model)) > 1e-3);
    let k = "model.layers.0.self_attn.k_proj.weight";
    assert!(
        one[k]
            .data
            .iter()
            .zip(&read(&model)[k].data)
            .all(|(x, y)| (x - y).abs() < 1e-6)
    );
    // The rslora model has a different lm_head: not a layer matrix, so it is saved whole, as
    // PEFT's modules_to_save, and comes back exactly.
    let rs = Checkpoint::open(&fixtures().join("peft/merged-rslora")).unwrap();
    let r = lora::extract(&base_ck, &rs, 2, &dir.path().join("rs"), false).unwrap();
    assert_eq!(r.saved_in_full, ["lm_head.weight"]);
    assert_eq!(r.modules_to_save, ["lm_head"]);
    assert!(r.left_out.is_empty() && r.notes.is_empty(), "{r:?}");
    let back = read(&open_expert(&dir.path().join("rs"), Some(&base())).unwrap());
    assert_eq!(back["lm_head.weight"].data, read(&rs)["lm_head.weight"].data);
    // An existing folder is refused unless it is an adapter and --overwrite is given.
    let e = lora::extract(&base_ck, &model, 4, &out, false).unwrap_err().to_string();
    assert_contains(&e, &["already exists", "--overwrite"]);
    lora::extract(&base_ck, &model, 2, &out, true).unwrap();
}

/// A fine-tuned tiny Llama whose layer matrices (PEFT's plain merge), token embeddings,
/// lm_head and two norms differ from the base; written in float32 to `path`.
fn fine_tuned(path: &Path) -> MemModel {
    let mut m = read(&Checkpoint::open(&fixtures().join("peft/merged-plain")).unwrap());
    for (i, name) in [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
    ]
    .into_iter()
    .enumerate()
    {
        let t = m.get_mut(name).unwrap();
        for (j, x) in t.data.iter_mut().enumerate() {
            *x += 0.02 * ((j * 7 + i * 13) as f32 * 0.37).sin();
        }
    }
    let owned: Vec<(&str, &[usize], &[f32])> = m
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.as_slice(), t.data.as_slice()))
        .collect();
    mergescope_tests::write_model(path, &owned);
    m
}

fn config_of(adapter: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(adapter.join("adapter_config.json")).unwrap()).unwrap()
}

/// Frobenius norm of the difference of one tensor.
fn frobenius(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(x - y).powi(2))
        .sum::<f64>()
        .sqrt()
}

#[test]
fn an_extracted_adapter_saves_embeddings_head_and_norms() {
    let dir = tempfile::tempdir().unwrap();
    let ft_path = dir.path().join("ft.safetensors");
    let ft = fine_tuned(&ft_path);
    let (base_ck, model) = (Checkpoint::open(&base()).unwrap(), Checkpoint::open(&ft_path).unwrap());
    let base_t = read(&base_ck);
    let whole = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
    ];
    let extract = |name: &str, rank: usize, embed_lora: bool, save: &[&str]| {
        let out = dir.path().join(name);
        let options = lora::ExtractOptions {
            rank,
            embed_lora,
            modules_to_save: save.iter().map(|s| (*s).to_owned()).collect(),
            overwrite: false,
            ..Default::default()
        };
        let report = lora::extract_with(&base_ck, &model, &out, &options).unwrap();
        let back = read(&open_expert(&out, Some(&base())).unwrap());
        (report, back, out)
    };

    // Default: every differing tensor without LoRA is saved whole, its module in
    // modules_to_save; full rank (32) gives every other tensor back to float rounding.
    let (report, back, out) = extract("default", 64, false, &[]);
    assert_eq!(report.saved_in_full, whole);
    assert_eq!(
        report.modules_to_save,
        [
            "lm_head",
            "model.embed_tokens",
            "model.layers.0.input_layernorm",
            "model.norm"
        ]
    );
    assert_eq!(report.adapted, 14);
    assert!(report.embedding_lora.is_empty() && report.left_out.is_empty() && report.notes.is_empty());
    for name in whole {
        assert_eq!(back[name].data, ft[name].data, "{name} saved whole comes back exactly");
    }
    let worst = max_difference(&back, &ft);
    println!("default, full rank: max |Δ| {worst:.2e}");
    assert!(worst < 1e-5, "{worst}");
    let config = config_of(&out);
    assert_eq!(config["modules_to_save"], json!(report.modules_to_save));
    assert_eq!(config["target_modules"].as_array().unwrap().len(), 7, "{config}");
    // PEFT's saved keys: base_model.model.NAME for a module saved whole.
    let saved = Checkpoint::open(&out.join("adapter_model.safetensors")).unwrap();
    assert!(saved.tensors.contains_key("base_model.model.model.embed_tokens.weight"));
    assert!(
        saved
            .tensors
            .contains_key("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
    );
    assert!(
        !saved
            .tensors
            .contains_key("base_model.model.model.layers.1.input_layernorm.weight")
    );

    // --embed-lora: the token embeddings as lora_embedding_A/B (A: r × vocab, B: hidden × r),
    // lm_head as a linear pair; the norms are still saved whole.
    let (report, back, out) = extract("embed", 64, true, &[]);
    assert_eq!(report.embedding_lora, ["model.embed_tokens.weight"]);
    assert_eq!(report.adapted, 16);
    assert_eq!(
        report.saved_in_full,
        ["model.layers.0.input_layernorm.weight", "model.norm.weight"]
    );
    let saved = Checkpoint::open(&out.join("adapter_model.safetensors")).unwrap();
    assert_eq!(
        saved.tensors["base_model.model.model.embed_tokens.lora_embedding_A"].shape,
        [32, 64]
    );
    assert_eq!(
        saved.tensors["base_model.model.model.embed_tokens.lora_embedding_B"].shape,
        [32, 32]
    );
    assert_eq!(saved.tensors["base_model.model.lm_head.lora_B.weight"].shape, [64, 32]);
    let targets = config_of(&out)["target_modules"].clone();
    for t in ["embed_tokens", "lm_head", "q_proj"] {
        assert!(targets.as_array().unwrap().contains(&json!(t)), "{targets}");
    }
    let worst = max_difference(&back, &ft);
    println!("--embed-lora, full rank: max |Δ| {worst:.2e}");
    assert!(worst < 1e-5, "{worst}");

    // Rank 2: what is saved whole stays exact; every LoRA weight is off from the model by the
    // SVD tail, ‖Δ − Δ_2‖_F = √(Σ_{i>2} σ_i²), no more.
    let (_, back, _) = extract("rank2", 2, true, &[]);
    for (name, t) in &ft {
        let (got, want) = (&back[name].data, &t.data);
        if whole[2..].contains(&name.as_str()) || t.shape.len() == 1 {
            assert_eq!(got, want, "{name}");
            continue;
        }
        let delta: Vec<f32> = want.iter().zip(&base_t[name].data).map(|(m, b)| m - b).collect();
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let (_, s, _) =
            mergescope_engine::plugin::host_ext::linalg::truncated_svd(&delta, rows, cols, rows.min(cols)).unwrap();
        let tail = s.iter().skip(2).map(|x| x * x).sum::<f64>().sqrt();
        let err = frobenius(got, want);
        assert!(err <= tail * 1.001 + 1e-5, "{name}: {err} > {tail}");
        assert!(err >= tail * 0.999 - 1e-5, "{name}: {err} < {tail}");
    }

    // --modules-to-save: a named module is saved whole (no LoRA pair) and the LoRA targets are
    // named in full so that PEFT does not put LoRA on it too.
    let (report, back, out) = extract("forced", 64, false, &["model.layers.1.self_attn.q_proj"]);
    assert!(
        report
            .saved_in_full
            .contains(&"model.layers.1.self_attn.q_proj.weight".to_owned())
    );
    assert_eq!(report.adapted, 13);
    assert_eq!(report.modules_to_save[0], "model.layers.1.self_attn.q_proj");
    let targets = config_of(&out)["target_modules"].clone();
    assert!(
        targets
            .as_array()
            .unwrap()
            .contains(&json!("model.layers.0.self_attn.q_proj")),
        "{targets}"
    );
    assert_eq!(
        back["model.layers.1.self_attn.q_proj.weight"].data,
        ft["model.layers.1.self_attn.q_proj.weight"].data
    );
    assert!(max_difference(&back, &ft) < 1e-5);
    let e = lora::extract_with(
        &base_ck,
        &model,
        &dir.path().join("bad"),
        &lora::ExtractOptions {
            rank: 4,
            modules_to_save: vec!["no_such_module".to_owned()],
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert_contains(&e, &["no_such_module", "names no module", "lm_head"]);
}

#[test]
fn an_extracted_adapter_of_a_resized_vocabulary_saves_the_embeddings_whole() {
    // 6 tokens added: --embed-lora falls back to saving the embeddings and lm_head whole, with
    // a note; the adapter on the base gives the model's 70-row tensors back.
    let dir = tempfile::tempdir().unwrap();
    let mut m = read(&Checkpoint::open(&fixtures().join("peft/merged-plain")).unwrap());
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        let t = m.get_mut(name).unwrap();
        t.data.extend((0..6 * 32).map(|j| (j as f32 * 0.11).cos() * 0.05));
        t.shape[0] = 70;
    }
    let owned: Vec<(&str, &[usize], &[f32])> = m
        .iter()
        .map(|(n, t)| (n.as_str(), t.shape.as_slice(), t.data.as_slice()))
        .collect();
    let path = dir.path().join("resized.safetensors");
    mergescope_tests::write_model(&path, &owned);
    let out = dir.path().join("adapter");
    let report = lora::extract_with(
        &Checkpoint::open(&base()).unwrap(),
        &Checkpoint::open(&path).unwrap(),
        &out,
        &lora::ExtractOptions {
            rank: 4,
            embed_lora: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(report.saved_in_full, ["lm_head.weight", "model.embed_tokens.weight"]);
    assert!(report.embedding_lora.is_empty());
    assert_contains(
        &report.notes.join(" "),
        &["vocabulary size differs", "--embed-lora is ignored"],
    );
    let back = read(&open_expert(&out, Some(&base())).unwrap());
    assert_eq!(back["model.embed_tokens.weight"].shape, [70, 32]);
    assert!(max_difference(&back, &m) < 1e-5);
}

#[test]
fn a_lora_module_whose_bias_changed_is_saved_whole() {
    // PEFT saves a module whole or not at all: a changed bias takes its weight along (no LoRA
    // pair for it); a bare top-level tensor cannot be in an adapter and is named as left out.
    let dir = tempfile::tempdir().unwrap();
    let w: Vec<f32> = (0..16).map(|i| i as f32 * 0.1).collect();
    let w2: Vec<f32> = w.iter().map(|x| x + 0.5).collect();
    let (base_path, model_path) = (dir.path().join("b.safetensors"), dir.path().join("m.safetensors"));
    mergescope_tests::write_model(
        &base_path,
        &[
            ("model.layers.0.mlp.fc.weight", &[4, 4], &w),
            ("model.layers.0.mlp.fc.bias", &[4], &[0.0; 4]),
            ("model.layers.0.mlp.out.weight", &[4, 4], &w),
            ("scale", &[1], &[1.0]),
        ],
    );
    mergescope_tests::write_model(
        &model_path,
        &[
            ("model.layers.0.mlp.fc.weight", &[4, 4], &w2),
            ("model.layers.0.mlp.fc.bias", &[4], &[1.0; 4]),
            ("model.layers.0.mlp.out.weight", &[4, 4], &w2),
            ("scale", &[1], &[2.0]),
        ],
    );
    let out = dir.path().join("adapter");
    let r = lora::extract(
        &Checkpoint::open(&base_path).unwrap(),
        &Checkpoint::open(&model_path).unwrap(),
        4,
        &out,
        false,
    )
    .unwrap();
    assert_eq!(r.adapted, 1);
    assert_eq!(
        r.saved_in_full,
        ["model.layers.0.mlp.fc.bias", "model.layers.0.mlp.fc.weight"]
    );
    assert_eq!(r.modules_to_save, ["model.layers.0.mlp.fc"]);
    assert_eq!(r.left_out, ["scale"]);
    assert_contains(&r.notes.join(" "), &["model.layers.0.mlp.fc.weight", "saved whole"]);
    let back = read(&open_expert(&out, Some(&base_path)).unwrap());
    assert_eq!(back["model.layers.0.mlp.fc.weight"].data, w2);
    assert_eq!(back["model.layers.0.mlp.fc.bias"].data, [1.0; 4]);
    let out_w = &back["model.layers.0.mlp.out.weight"].data;
    assert!(out_w.iter().zip(&w2).all(|(x, y)| (x - y).abs() < 1e-5));
}

#[test]
fn bad_adapters_are_named() {
    let dir = tempfile::tempdir().unwrap();
    // An adapter needs its base; given as a plain checkpoint it is refused with the fix.
    let e = open_expert(&fixtures().join("peft/adapter-plain"), None)
        .unwrap_err()
        .to_string();
    assert_contains(&e, &["LoRA adapter", "--base"]);
    let e = Checkpoint::open(&fixtures().join("peft/adapter-plain"))
        .unwrap_err()
        .to_string();
    assert_contains(&e, &["LoRA adapter", "--base"]);
    // A base of another shape.
    let other = dir.path().join("other.safetensors");
    mergescope_tests::write_model(
        &other,
        &[("model.layers.0.self_attn.q_proj.weight", &[8, 8], &[0.0; 64])],
    );
    let e = open_expert(&fixtures().join("peft/adapter-plain"), Some(&other))
        .unwrap_err()
        .to_string();
    assert_contains(&e, &["does not fit the base", "base_model_name_or_path"]);
    // DoRA, and a missing weights file.
    let copy = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let src = fixtures().join("peft/adapter-plain");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(src.join("adapter_config.json")).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(d.join("adapter_config.json"), config.to_string()).unwrap();
        d
    };
    let dora = copy("dora", &|c| c["use_dora"] = json!(true));
    std::fs::copy(
        fixtures().join("peft/adapter-plain/adapter_model.safetensors"),
        dora.join("adapter_model.safetensors"),
    )
    .unwrap();
    assert_contains(
        &open_expert(&dora, Some(&base())).unwrap_err().to_string(),
        &["DoRA", "merge_and_unload"],
    );
    let empty = copy("empty", &|_| {});
    assert_contains(
        &open_expert(&empty, Some(&base())).unwrap_err().to_string(),
        &["no adapter_model.safetensors"],
    );
}

#[test]
fn a_mergekit_config_names_adapters_as_model_plus_adapter() {
    // mergekit's `model+adapter`: task arithmetic with weight 1 of the adapted base is the
    // adapted model itself (PEFT's merge), written in float32.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ta");
    let text = "merge_method: task_arithmetic\nbase_model: mergekit/inputs/base\nmodels:\n  - model: \
                mergekit/inputs/base+peft/adapter-rslora\n    parameters: {weight: 1.0}\nout_dtype: float32\n";
    let converted = mergescope_interop::mergekit::convert(text, &fixtures().join("merge.yml"), &out).unwrap();
    assert_eq!(
        converted.recipe.experts,
        [fixtures().join("peft/adapter-rslora").canonicalize().unwrap()]
    );
    merge_to_files(
        "mergescope_plugin_task_arithmetic",
        &converted.to_request(false).unwrap(),
    )
    .unwrap();
    let peft = read(&Checkpoint::open(&fixtures().join("peft/merged-rslora")).unwrap());
    assert!(max_difference(&read(&Checkpoint::open(&out).unwrap()), &peft) < 1e-6);
    // An adapter on another model than the base is refused, naming both.
    let text = text.replace("mergekit/inputs/base+", "mergekit/inputs/expert1+");
    let e = mergescope_interop::mergekit::convert(&text, &fixtures().join("merge.yml"), &out)
        .unwrap_err()
        .to_string();
    assert_contains(&e, &["adapter-rslora", "expert1", "not base_model"]);
}
