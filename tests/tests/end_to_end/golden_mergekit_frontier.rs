//! Golden tests of mergekit's newest methods as plugins (`nearswap`, `ram`, `ramplus-tl`,
//! `arcee-fusion`), loaded from their built libraries, with numbers worked out by hand from
//! mergekit 0.1.5's definitions (merge_methods/nearswap.py, ram.py, arcee_fusion.py), and the
//! refusals a user meets: NearSwap without `t`, Arcee Fusion with more than one expert, from the
//! CLI's parameters and from mergekit YAML.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::error::ErrorKind;
use mergescope_engine::merge::{MemModel, merge_in_memory};
use mergescope_interop::mergekit;
use mergescope_tests::{assert_close, assert_contains, assert_documented, load, merge_to_files, model};
use serde_json::{Value, json};
use std::path::Path;

const NEARSWAP: &str = "mergescope_plugin_nearswap";
const RAM: &str = "mergescope_plugin_ram";
const RAMPLUS: &str = "mergescope_plugin_ramplus_tl";
const FUSION: &str = "mergescope_plugin_arcee_fusion";

fn merge(lib: &str, params: &Value, base: &MemModel, experts: &[MemModel]) -> Result<MemModel, String> {
    merge_in_memory(&load(lib), params, 0, Some(base), experts).map_err(|e| e.to_string())
}

fn one(values: &[f32]) -> MemModel {
    model(&[("w", &[values.len()], values)])
}

#[test]
fn the_four_plugins_describe_themselves() {
    for lib in [NEARSWAP, RAM, RAMPLUS, FUSION] {
        assert_documented(&load(lib));
    }
}

#[test]
fn nearswap_takes_the_expert_where_it_is_within_t() {
    // t = 1: |Δ| = 0.5 → w = 1 (the expert's 1.5); |Δ| = 4 → w = 0.25, 0.25·5 + 0.75·1 = 2;
    // |Δ| = 0 → the clamp at 1e-6 gives w = 1; |Δ| = 10 → w = 0.1, 0.1·(−10) + 0.9·0 = −1.
    let out = merge(
        NEARSWAP,
        &json!({"t": 1.0}),
        &one(&[1.0, 1.0, 2.0, 0.0]),
        &[one(&[1.5, 5.0, 2.0, -10.0])],
    )
    .unwrap();
    assert_close(&out, "w", &[1.5, 2.0, 2.0, -1.0], "nearswap t = 1");
}

#[test]
fn nearswap_without_t_and_fusion_with_two_experts_are_refused() {
    let base = one(&[0.0, 1.0]);
    let e = one(&[1.0, 2.0]);
    let err = merge_in_memory(&load(NEARSWAP), &json!({}), 0, Some(&base), std::slice::from_ref(&e)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Parameter, "{err}");
    assert_contains(
        &err.to_string(),
        &["'nearswap'", "needs parameter 't'", "--param t=VALUE"],
    );
    let err = merge(FUSION, &json!({}), &base, &[e.clone(), e]).unwrap_err();
    assert_contains(&err, &["'arcee-fusion'", "exactly one expert", "2 experts"]);
}

#[test]
fn ram_keeps_unique_changes_and_averages_shared_ones() {
    // Task vectors (1, 2, 0, 1e-6) and (3, 0, 0, 0) from base 1 with ε = 1e-5: element 0 is shared
    // (mean 2), element 1 is the first expert's alone (2), element 2 nobody's, element 3 below ε.
    let base = one(&[1.0, 1.0, 1.0, 1.0]);
    let experts = [one(&[2.0, 3.0, 1.0, 1.000001]), one(&[4.0, 1.0, 1.0, 1.0])];
    let out = merge(RAM, &json!({}), &base, &experts).unwrap();
    assert_close(&out, "w", &[3.0, 3.0, 1.0, 1.0], "ram");
    // Plain averaging would give (3, 2, 1, 1): RAM does not dilute the unique change.
}

#[test]
fn ramplus_boosts_unique_changes_by_the_share_ratio() {
    // Expert 1 changes elements 0 (shared) and 1 (alone): ρ_1 = 1/1, λ_1 = 1 + 0.1·min(1, 0.2)
    // = 1.02. Expert 2 changes 0 (shared) and 2 (alone): λ_2 = 1.02. Element 0: mean of 1 and 3.
    let base = one(&[1.0, 1.0, 1.0]);
    let experts = [one(&[2.0, 3.0, 1.0]), one(&[4.0, 1.0, 0.5])];
    let out = merge(RAMPLUS, &json!({"r": 0.1, "alpha": 0.2}), &base, &experts).unwrap();
    assert_close(&out, "w", &[3.0, 1.0 + 2.0 * 1.02, 1.0 - 0.5 * 1.02], "ramplus-tl");
    // alpha = 0: λ = 1, RAM itself.
    let plain = merge(RAMPLUS, &json!({"alpha": 0.0}), &base, &experts).unwrap();
    assert_eq!(plain, merge(RAM, &json!({}), &base, &experts).unwrap());
}

#[test]
fn arcee_fusion_keeps_only_outlying_changes() {
    // One row of 8: the expert moves one element by 3 and the others by 0.01–0.02. The row's KL
    // is shared, so importance ranks |Δ|: quantiles at ⌊q·7⌋ give median 0.01, Q1 0.01, Q3
    // 0.02, threshold 0.025·KL, which only the 3.0 change reaches.
    let base = model(&[("w", &[1, 8], &[0.0; 8])]);
    let expert = model(&[("w", &[1, 8], &[0.01, 0.02, 0.01, 0.02, 3.0, 0.01, 0.02, 0.01])]);
    let out = merge(FUSION, &json!({}), &base, &[expert]).unwrap();
    assert_close(&out, "w", &[0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0], "arcee-fusion");
}

/// mergekit YAML under mergekit's names runs these plugins, and refuses what mergekit refuses.
#[test]
fn mergekit_yaml_names_run_and_bad_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, values: &[f32]| {
        let p = dir.path().join(format!("{name}.safetensors"));
        mergescope_tests::write_model(&p, &[("w", &[values.len()], values)]);
        p
    };
    let base = write("base", &[1.0, 1.0, 2.0]);
    let e1 = write("e1", &[1.5, 5.0, 2.0]);
    let e2 = write("e2", &[4.0, 1.0, 0.5]);
    let config = dir.path().join("merge.yml");
    let out = dir.path().join("out.safetensors");
    let run = |yaml: String, out: &Path| -> Result<MemModel, String> {
        let converted = mergekit::convert(&yaml, &config, out).map_err(|e| e.to_string())?;
        let lib = format!("mergescope_plugin_{}", converted.recipe.method.replace('-', "_"));
        merge_to_files(&lib, &converted.to_request(true).map_err(|e| e.to_string())?)?;
        Ok(mergescope_tests::read_model(out))
    };
    let (b, x, y) = (base.display(), e1.display(), e2.display());
    let swapped = run(
        format!("merge_method: nearswap\nbase_model: {b}\nmodels: [{x}]\nparameters: {{t: 1.0}}\ndtype: float32\n"),
        &out,
    )
    .unwrap();
    assert_close(&swapped, "w", &[1.5, 2.0, 2.0], "nearswap from YAML");
    let ram = run(
        format!("merge_method: ram\nbase_model: {b}\nmodels: [{x}, {y}]\ndtype: float32\n"),
        &out,
    )
    .unwrap();
    assert_eq!(
        ram,
        merge(
            RAM,
            &json!({}),
            &one(&[1.0, 1.0, 2.0]),
            &[one(&[1.5, 5.0, 2.0]), one(&[4.0, 1.0, 0.5])]
        )
        .unwrap()
    );
    let err = run(
        format!("merge_method: nearswap\nbase_model: {b}\nmodels: [{x}]\ndtype: float32\n"),
        &out,
    )
    .unwrap_err();
    assert_contains(&err, &["'nearswap'", "needs parameter 't'"]);
    let err = run(
        format!("merge_method: arcee_fusion\nbase_model: {b}\nmodels: [{x}, {y}]\ndtype: float32\n"),
        &out,
    )
    .unwrap_err();
    assert_contains(&err, &["arcee_fusion", "exactly 1 model", "has 2"]);
}

/// Each of mergekit 0.1.5's merges in tests/fixtures/mergekit/frontier (made by
/// scripts/mergekit-parity.py --only frontier, bf16 inputs computed in f32), run from its own
/// YAML: NearSwap, RAM and RAM+ agree with mergekit's tensors to 1e-6 (measured: 7.5e-9, and
/// RAM and RAM+ bit for bit). Arcee Fusion thresholds importances |Δ|·KL whose KL, between the
/// softmaxes of two nearly equal rows, cancels in f32: torch's and mergescope's exp and log
/// differ in the last bits, the thresholds by up to 1 %, so elements near the threshold fall
/// on either side (measured: 49 of 24,736, 0.2 %); at most 1 % may differ.
#[test]
fn mergekits_own_merges_with_its_newest_methods_agree() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("frontier/manifest.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let configs = manifest["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 5);
    for cfg in configs {
        let name = cfg["name"].as_str().unwrap();
        let yaml = std::fs::read_to_string(fixtures.join("frontier").join(cfg["config"].as_str().unwrap())).unwrap();
        let out = dir.path().join(format!("{name}.safetensors"));
        // Converted as if the YAML lay beside ../inputs, where its model paths point.
        let converted = mergekit::convert(&yaml, &fixtures.join("merge.yml"), &out).unwrap();
        let lib = format!("mergescope_plugin_{}", converted.recipe.method.replace('-', "_"));
        merge_to_files(&lib, &converted.to_request(false).unwrap()).unwrap();
        let ours = mergescope_tests::read_model(&out);
        let theirs = mergescope_tests::read_model(
            &fixtures
                .join("frontier")
                .join(cfg["output"].as_str().unwrap())
                .join("model.safetensors"),
        );
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{name}"
        );
        let (mut worst, mut off, mut n) = (0f64, 0usize, 0usize);
        for (tensor, t) in &ours {
            for (x, y) in t.data.iter().zip(&theirs[tensor].data) {
                let d = f64::from((x - y).abs());
                worst = worst.max(d);
                off += usize::from(d > 1e-6);
                n += 1;
            }
        }
        println!("{name}: max |mergescope - mergekit| = {worst:.2e}, {off} of {n} elements beyond 1e-6");
        if name == "arcee_fusion" {
            assert!(off * 100 <= n, "{name}: {off} of {n} elements differ by more than 1e-6");
        } else {
            assert!(worst <= 1e-6, "{name}: max |diff| {worst}");
        }
    }
}
