//! Golden tests of the `slerp`, `nuslerp` and `model-stock` plugins, loaded from their built
//! libraries, with numbers worked out by hand from the definitions (mergekit's slerp.py,
//! nuslerp.py and model_stock.py, which the plugins follow).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{MemModel, merge_in_memory};
use mergescope_tests::{assert_close, assert_contains, assert_documented, load, model};
use serde_json::{Value, json};

fn merge(lib: &str, params: &Value, base: &MemModel, experts: &[MemModel]) -> Result<MemModel, String> {
    merge_in_memory(&load(lib), params, 0, Some(base), experts).map_err(|e| e.to_string())
}

fn one(name: &str, shape: &[usize], values: &[f32]) -> MemModel {
    model(&[(name, shape, values)])
}

#[test]
fn both_plugins_describe_themselves() {
    for lib in [
        "mergescope_plugin_slerp",
        "mergescope_plugin_nuslerp",
        "mergescope_plugin_model_stock",
    ] {
        assert_documented(&load(lib));
    }
}

#[test]
fn slerp_follows_the_great_circle() {
    // θ0 = (2, 0), θ1 = (0, 2): θ = π/2; at t = 1/3, sin(π/3)/1·θ0 + sin(π/6)/1·θ1 = (√3, 1).
    let base = one("w", &[2], &[2.0, 0.0]);
    let expert = one("w", &[2], &[0.0, 2.0]);
    let out = merge("mergescope_plugin_slerp", &json!({"t": 1.0 / 3.0}), &base, &[expert]).unwrap();
    assert_close(&out, "w", &[3f64.sqrt(), 1.0], "t = 1/3");
}

#[test]
fn slerp_of_a_matrix_uses_the_flattened_angle() {
    // θ0 = [[1, 1], [0, 0]], θ1 = [[1, −1], [0, 0]]: orthogonal, norms √2; t = 1/2 gives
    // (θ0 + θ1)·sin(π/4) = [[√2, 0], [0, 0]] (the norm √2 is kept, unlike the linear midpoint).
    let base = one("m.weight", &[2, 2], &[1.0, 1.0, 0.0, 0.0]);
    let expert = one("m.weight", &[2, 2], &[1.0, -1.0, 0.0, 0.0]);
    let out = merge("mergescope_plugin_slerp", &json!({"t": 0.5}), &base, &[expert]).unwrap();
    assert_close(&out, "m.weight", &[2f64.sqrt(), 0.0, 0.0, 0.0], "orthogonal matrices");
}

#[test]
fn slerp_falls_back_to_linear_for_colinear_tensors() {
    // θ1 = 3·θ0: cos = 1 > 0.9995, so (1 − t)·θ0 + t·θ1 = (1 + 2t)·θ0; at t = 0.25, 1.5·θ0.
    let base = one("norm.weight", &[3], &[1.0, 2.0, -1.0]);
    let expert = one("norm.weight", &[3], &[3.0, 6.0, -3.0]);
    let out = merge("mergescope_plugin_slerp", &json!({"t": 0.25}), &base, &[expert]).unwrap();
    assert_close(&out, "norm.weight", &[1.5, 3.0, -1.5], "colinear");
}

#[test]
fn slerp_takes_exactly_one_expert() {
    let base = one("w", &[2], &[1.0, 0.0]);
    let e = one("w", &[2], &[0.0, 1.0]);
    let err = merge("mergescope_plugin_slerp", &json!({}), &base, &[e.clone(), e]).unwrap_err();
    assert_contains(&err, &["exactly one expert", "2 experts", "--expert"]);
    let err = merge(
        "mergescope_plugin_slerp",
        &json!({"t": 1.5}),
        &base,
        &[one("w", &[2], &[0.0, 1.0])],
    )
    .unwrap_err();
    assert_contains(&err, &["'t'", "1.5"]);
}

#[test]
fn model_stock_golden_ratios() {
    // Base 0; task vectors δ1 = (1, 0), δ2 = (1, 1): c = 1/√2, t = 2c/(1 + c) = 0.828427…;
    // θ_avg = (1, 0.5), θ = t·θ_avg.
    let base = one("w", &[2], &[0.0, 0.0]);
    let e1 = one("w", &[2], &[1.0, 0.0]);
    let e2 = one("w", &[2], &[1.0, 1.0]);
    let out = merge("mergescope_plugin_model_stock", &json!({}), &base, &[e1, e2]).unwrap();
    let c = std::f64::consts::FRAC_1_SQRT_2;
    let t = 2.0 * c / (1.0 + c);
    assert_close(&out, "w", &[t, 0.5 * t], "two experts at 45°");

    // Three orthogonal task vectors: c = 0, t = 0, the base is kept.
    let base = one("w", &[3], &[0.5, -0.5, 2.0]);
    let experts: Vec<MemModel> = (0..3)
        .map(|i| {
            let mut v = [0.5f32, -0.5, 2.0];
            v[i] += 1.0;
            one("w", &[3], &v)
        })
        .collect();
    let out = merge("mergescope_plugin_model_stock", &json!({}), &base, &experts).unwrap();
    assert_close(&out, "w", &[0.5, -0.5, 2.0], "orthogonal task vectors");
}

#[test]
fn model_stock_filter_wise_takes_one_ratio_per_row() {
    // Row 0: δ1 = (1, 0), δ2 = (0, 1) → c = 0, t = 0 → the base row (0, 0).
    // Row 1: δ1 = δ2 = (2, 2) → c = 1, t = 1 → the average row (2, 2).
    // Whole-tensor: c = ⟨δ1, δ2⟩/(‖δ1‖‖δ2‖) = 8/9, t = 2c/(1 + c) = 16/17.
    let base = one("m.weight", &[2, 2], &[0.0; 4]);
    let e1 = one("m.weight", &[2, 2], &[1.0, 0.0, 2.0, 2.0]);
    let e2 = one("m.weight", &[2, 2], &[0.0, 1.0, 2.0, 2.0]);
    let experts = [e1, e2];
    let rows = merge(
        "mergescope_plugin_model_stock",
        &json!({"filter_wise": true}),
        &base,
        &experts,
    )
    .unwrap();
    assert_close(&rows, "m.weight", &[0.0, 0.0, 2.0, 2.0], "filter-wise");
    let whole = merge("mergescope_plugin_model_stock", &json!({}), &base, &experts).unwrap();
    let t = 16.0 / 17.0;
    assert_close(
        &whole,
        "m.weight",
        &[0.5 * t, 0.5 * t, 2.0 * t, 2.0 * t],
        "whole tensor",
    );
}

#[test]
fn model_stock_needs_two_experts_and_keeps_the_base_where_t_is_undefined() {
    let base = one("w", &[2], &[0.0, 0.0]);
    let err = merge(
        "mergescope_plugin_model_stock",
        &json!({}),
        &base,
        &[one("w", &[2], &[1.0, 0.0])],
    )
    .unwrap_err();
    assert_contains(&err, &["at least two experts", "--expert"]);
    // δ1 = (1, 0), δ2 = (−1, 0): c = −1 = −1/(N − 1) for N = 2, so t is undefined and, as in
    // mergekit 0.1.5, the base is kept.
    let base = one("w", &[2], &[0.5, 0.25]);
    let out = merge(
        "mergescope_plugin_model_stock",
        &json!({}),
        &base,
        &[one("w", &[2], &[1.5, 0.25]), one("w", &[2], &[-0.5, 0.25])],
    )
    .unwrap();
    assert_close(&out, "w", &[0.5, 0.25], "opposing task vectors");
}

#[test]
fn nuslerp_interpolates_experts_or_their_task_vectors() {
    // Without a base: θ1 = (2, 0), θ2 = (0, 2), weights 2 and 1 → t = 1/3: (√3, 1) as for slerp.
    let e1 = one("w", &[2], &[2.0, 0.0]);
    let e2 = one("w", &[2], &[0.0, 2.0]);
    let lib = load("mergescope_plugin_nuslerp");
    let out = merge_in_memory(
        &lib,
        &json!({"weights": [2.0, 1.0]}),
        0,
        None,
        &[e1.clone(), e2.clone()],
    )
    .unwrap();
    assert_close(&out, "w", &[3f64.sqrt(), 1.0], "no base, t = 1/3");
    // With base (1, 1): task vectors (1, −1) and (−1, 1) are antipodal (colinear): linear at
    // t = 1/2 gives 0, so the base.
    let base = one("w", &[2], &[1.0, 1.0]);
    let out = merge("mergescope_plugin_nuslerp", &json!({}), &base, &[e1, e2]).unwrap();
    assert_close(&out, "w", &[1.0, 1.0], "antipodal task vectors");
    let err = merge(
        "mergescope_plugin_nuslerp",
        &json!({}),
        &base,
        &[one("w", &[2], &[0.0, 1.0])],
    )
    .unwrap_err();
    assert_contains(&err, &["exactly two experts", "--expert"]);
}
