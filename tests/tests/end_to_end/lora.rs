//! LoRA adapters as merge inputs, checked against PEFT: each adapter of
//! `tests/fixtures/peft` (made by `scripts/peft-fixtures.py`: plain LoRA on q/v/up_proj, and
//! rsLoRA with an alpha_pattern and lm_head in modules_to_save) applied to the tiny Llama base
//! gives the tensors of PEFT's `merge_and_unload()`; adapters merge like the models they stand
//! for; an adapter extracted by SVD gives the model back; bad adapters fail naming the tensor.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::lora;
use mergescope_engine::merge::{MemModel, MergeRequest, open_expert};
use mergescope_tests::{assert_contains, merge_to_files};
use serde_json::json;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn base() -> PathBuf {
    fixtures().join("mergekit/inputs/base")
}

use mergescope_tests::tensors_of as read;

fn max_difference(a: &MemModel, b: &MemModel) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    a.iter()
        .flat_map(|(n, t)| t.data.iter().zip(&b[n].data).map(|(x, y)| f64::from((x - y).abs())))
        .fold(0.0, f64::max)
}

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
    // The rslora model has a different lm_head: not a layer matrix, so it is named as left out.
    let rs = Checkpoint::open(&fixtures().join("peft/merged-rslora")).unwrap();
    let r = lora::extract(&base_ck, &rs, 2, &dir.path().join("rs"), false).unwrap();
    assert_eq!(r.left_out, ["lm_head.weight"]);
    // An existing folder is refused unless it is an adapter and --overwrite is given.
    let e = lora::extract(&base_ck, &model, 4, &out, false).unwrap_err().to_string();
    assert_contains(&e, &["already exists", "--overwrite"]);
    lora::extract(&base_ck, &model, 2, &out, true).unwrap();
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
    let converted = mergescope_engine::mergekit::convert(text, &fixtures().join("merge.yml"), &out).unwrap();
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
    let e = mergescope_engine::mergekit::convert(&text, &fixtures().join("merge.yml"), &out)
        .unwrap_err()
        .to_string();
    assert_contains(&e, &["adapter-rslora", "expert1", "not base_model"]);
}
