//! The research-frontier plugins (`tsv-m`, `iso-c`, `iso-cts`, `wudi`) against FusionBench
//! 0.2.33's own functions: tests/fixtures/fusionbench, made by scripts/fusionbench-parity.py on
//! small seeded checkpoints in f32 and in bf16 (matrices of both orientations and one of rank
//! below the number of experts, a bias, a 4-D kernel, a scalar). Plus the refusals a user meets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::merge_in_memory;
use mergescope_tests::{assert_contains, assert_documented, load, model, read_model};
use serde_json::{Value, json};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/fusionbench")
}

/// Largest |ours − reference| allowed, per method (measured: TSV-M 2.3e-7, Iso-C 7.1e-8,
/// Iso-CTS 1.1e-7, WUDI 3.0e-8, on values of about 0.05): the SVD-based merges differ by the
/// reference's f32 SVDs (ours are f64); WUDI by gradients summed in another order over 400 Adam
/// steps (each moves an element by at most lr = 1e-5).
fn tolerance(method: &str) -> f64 {
    match method {
        "wudi" => 2e-7,
        _ => 1e-6,
    }
}

#[test]
fn the_plugins_describe_themselves() {
    for lib in ["tsv_m", "iso_c", "iso_cts", "wudi"] {
        assert_documented(&load(&format!("mergescope_plugin_{lib}")));
    }
}

#[test]
fn fusionbenchs_own_merges_agree() {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("manifest.json")).unwrap()).unwrap();
    let experts_n = manifest["experts"].as_u64().unwrap();
    let mut report = Vec::new();
    for dtype in ["f32", "bf16"] {
        let root = fixtures().join(dtype);
        let base = read_model(&root.join("inputs/base.safetensors"));
        let experts: Vec<_> = (1..=experts_n)
            .map(|i| read_model(&root.join(format!("inputs/expert{i}.safetensors"))))
            .collect();
        for (name, merge) in manifest["merges"].as_object().unwrap() {
            let method = merge["method"].as_str().unwrap();
            let lib = format!("mergescope_plugin_{}", method.replace('-', "_"));
            let ours = merge_in_memory(&load(&lib), &merge["params"], 0, Some(&base), &experts)
                .unwrap_or_else(|e| panic!("{dtype}/{name}: {e}"));
            let reference = read_model(&root.join(format!("fusionbench/{name}.safetensors")));
            assert_eq!(ours.keys().collect::<Vec<_>>(), reference.keys().collect::<Vec<_>>());
            for (tensor, r) in &reference {
                let o = &ours[tensor];
                assert_eq!(o.shape, r.shape, "{dtype}/{name}/{tensor}");
                let diff = o
                    .data
                    .iter()
                    .zip(&r.data)
                    .map(|(a, b)| f64::from((a - b).abs()))
                    .fold(0.0, f64::max);
                // The change the merge made, to show the difference is small against it.
                let moved = r
                    .data
                    .iter()
                    .zip(&base[tensor].data)
                    .map(|(a, b)| f64::from((a - b).abs()))
                    .fold(0.0, f64::max);
                report.push(format!(
                    "{dtype}/{name}/{tensor}: max |Δ| {diff:.2e} (merge moved up to {moved:.2e})"
                ));
                assert!(
                    diff <= tolerance(method),
                    "{dtype}/{name}/{tensor}: ours differs from FusionBench's by {diff:e} (> {:e})",
                    tolerance(method)
                );
            }
        }
    }
    println!("{}", report.join("\n"));
}

#[test]
fn iso_cts_refuses_a_fraction_outside_the_open_interval() {
    let base = model(&[("w", &[2, 2], &[0.0; 4])]);
    let e = model(&[("w", &[2, 2], &[1.0, 0.0, 0.0, 1.0])]);
    for f in [0.0, 1.0] {
        let err = merge_in_memory(
            &load("mergescope_plugin_iso_cts"),
            &json!({ "common_space_fraction": f }),
            0,
            Some(&base),
            std::slice::from_ref(&e),
        )
        .unwrap_err()
        .to_string();
        assert_contains(&err, &["common_space_fraction", "strictly between 0 and 1", "0.8"]);
    }
    let err = merge_in_memory(
        &load("mergescope_plugin_iso_cts"),
        &json!({ "common_space_fraction": 1.5 }),
        0,
        Some(&base),
        std::slice::from_ref(&e),
    )
    .unwrap_err()
    .to_string();
    assert_contains(&err, &["common_space_fraction", "1.5"]);
}

#[test]
fn wudi_without_iterations_is_task_arithmetic_on_matrices_and_refuses_a_zero_rate() {
    let base = model(&[("w", &[2, 2], &[1.0, 1.0, 1.0, 1.0]), ("b", &[2], &[0.0, 0.0])]);
    let e1 = model(&[("w", &[2, 2], &[2.0, 1.0, 1.0, 1.0]), ("b", &[2], &[1.0, 0.0])]);
    let e2 = model(&[("w", &[2, 2], &[1.0, 1.0, 1.0, 3.0]), ("b", &[2], &[0.0, 1.0])]);
    let wudi = load("mergescope_plugin_wudi");
    let out = merge_in_memory(
        &wudi,
        &json!({"iterations": 0}),
        0,
        Some(&base),
        &[e1.clone(), e2.clone()],
    )
    .unwrap();
    // Matrices: θ0 + Σ τ_t; other tensors: θ0 + mean τ_t.
    assert_eq!(out["w"].data, vec![2.0, 1.0, 1.0, 3.0]);
    assert_eq!(out["b"].data, vec![0.5, 0.5]);
    // Orthogonal task vectors do not interfere: (τ − τ_1)·τ_1ᵀ = τ_2·τ_1ᵀ = 0, so Adam stays put.
    let out = merge_in_memory(&wudi, &json!({}), 0, Some(&base), &[e1.clone(), e2.clone()]).unwrap();
    assert_eq!(out["w"].data, vec![2.0, 1.0, 1.0, 3.0]);
    let err = merge_in_memory(&wudi, &json!({"lr": 0.0}), 0, Some(&base), &[e1, e2])
        .unwrap_err()
        .to_string();
    assert_contains(
        &err,
        &["'lr'", "strictly between 0 and inf", "greater than 0", "iterations=0"],
    );
}

/// mergekit YAML may name a loaded plugin by its own id (`merge_method: tsv-m`): the top-level
/// parameters go to the plugin as they are, per-model ones as one value per expert, and the
/// merge equals the plugin's run with the same parameters. Without the plugin among the loaded
/// ones, or with slices, the config is refused and says why.
#[test]
fn mergekit_yaml_names_a_plugin_by_its_own_id() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, values: &[f32]| {
        let p = dir.path().join(format!("{name}.safetensors"));
        mergescope_tests::write_model(&p, &[("w", &[2, 3], values)]);
        p
    };
    let base = write("base", &[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]);
    let e1 = write("e1", &[1.0, 0.1, 0.2, 0.3, 0.9, 0.5]);
    let e2 = write("e2", &[0.0, 0.6, 0.2, -0.3, 0.4, 0.8]);
    let config = dir.path().join("merge.yml");
    let out = dir.path().join("out.safetensors");
    let (b, x, y) = (base.display(), e1.display(), e2.display());
    let ids = ["tsv-m", "iso-c", "weight-average"];
    let yaml = format!(
        "merge_method: iso-c\nbase_model: {b}\nmodels: [{x}, {y}]\nparameters: {{lambda: 0.7}}\ndtype: float32\n"
    );
    let converted = mergescope_interop::mergekit::convert_with_plugins(&yaml, &config, &out, &ids).unwrap();
    assert_eq!(converted.recipe.method, "iso-c");
    mergescope_tests::merge_to_files("mergescope_plugin_iso_c", &converted.to_request(true).unwrap()).unwrap();
    let direct = merge_in_memory(
        &load("mergescope_plugin_iso_c"),
        &json!({"lambda": 0.7}),
        0,
        Some(&read_model(&base)),
        &[read_model(&e1), read_model(&e2)],
    )
    .unwrap();
    assert_eq!(read_model(&out)["w"].data, direct["w"].data);

    // Per-model parameters become one value per expert.
    let yaml = format!(
        "merge_method: weight-average\nmodels:\n  - model: {x}\n    parameters: {{weights: 1.0}}\n  - model: {y}\n    parameters: {{weights: 3.0}}\n"
    );
    let converted = mergescope_interop::mergekit::convert_with_plugins(&yaml, &config, &out, &ids).unwrap();
    assert_eq!(converted.recipe.method, "weight-average");
    assert_eq!(
        converted
            .recipe
            .params
            .get("weights")
            .map(ToString::to_string)
            .as_deref(),
        Some("[1.0, 3.0]")
    );

    // Not loaded: the usual refusal, now naming the loaded ids too.
    let yaml = format!("merge_method: wudi\nbase_model: {b}\nmodels: [{x}, {y}]\n");
    let err = mergescope_interop::mergekit::convert_with_plugins(&yaml, &config, &out, &ids)
        .unwrap_err()
        .to_string();
    assert_contains(
        &err,
        &[
            "merge_method 'wudi' is not one mergescope reproduces",
            "task_arithmetic",
            "a loaded plugin's id: tsv-m, iso-c",
        ],
    );
    let yaml = format!(
        "merge_method: tsv-m\nbase_model: {b}\nslices:\n  - sources:\n      - model: {x}\n        layer_range: [0, 1]\n"
    );
    let err = mergescope_interop::mergekit::convert_with_plugins(&yaml, &config, &out, &ids)
        .unwrap_err()
        .to_string();
    assert_contains(
        &err,
        &["'slices' with merge_method 'tsv-m'", "list the models under 'models'"],
    );
}
