//! Golden tests of the `sce`, `karcher` and `multislerp` plugins, loaded from their built
//! libraries, with numbers worked out by hand from the definitions in mergekit 0.1.5
//! (merge_methods/sce.py, karcher.py and multislerp.py, which the plugins follow).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{MemModel, merge_in_memory};
use mergescope_tests::{assert_close, assert_contains, assert_documented, load, model};
use serde_json::{Value, json};

const SCE: &str = "mergescope_plugin_sce";
const KARCHER: &str = "mergescope_plugin_karcher";
const MULTISLERP: &str = "mergescope_plugin_multislerp";

fn merge(lib: &str, params: &Value, base: Option<&MemModel>, experts: &[MemModel]) -> Result<MemModel, String> {
    merge_in_memory(&load(lib), params, 0, base, experts).map_err(|e| e.to_string())
}

fn one(values: &[f32]) -> MemModel {
    model(&[("w", &[values.len()], values)])
}

fn values(m: &MemModel) -> Vec<f64> {
    m.get("w").unwrap().data.iter().map(|v| f64::from(*v)).collect()
}

fn assert_finite(m: &MemModel, context: &str) {
    assert!(values(m).iter().all(|v| v.is_finite()), "{context}: {:?}", values(m));
}

#[test]
fn the_three_plugins_describe_themselves() {
    for lib in [SCE, KARCHER, MULTISLERP] {
        assert_documented(&load(lib));
    }
}

// ---------------------------------------------------------------------------------------------
// SCE

#[test]
fn sce_without_selection_is_a_sign_elected_mean_weighted_by_squared_magnitudes() {
    // Base θ0 = (1, 1, 1, 1); task vectors δ1 = (3, −1, 0, 2), δ2 = (1, 1, −2, −4).
    // Calculate: mean(δ1²) = (9 + 1 + 0 + 4)/4 = 3.5, mean(δ2²) = (1 + 1 + 4 + 16)/4 = 5.5,
    // sum 9 → w = (7/18, 11/18).
    // Erase, element by element (elected sign = sign of δ1 + δ2, + at 0):
    //   0: (3, 1), sum 4 → +, both kept: (3·7 + 1·11)/18 / (18/18) = 32/18 = 16/9;
    //   1: (−1, 1), sum 0 → +, only δ2: 1·(11/18)/(11/18) = 1;
    //   2: (0, −2), sum −2 → −, δ1 = 0 has sign 0 and is dropped: −2;
    //   3: (2, −4), sum −2 → −, only δ2: −4.
    // θ = θ0 + (16/9, 1, −2, −4) = (25/9, 2, −1, −3).
    let base = one(&[1.0, 1.0, 1.0, 1.0]);
    let e1 = one(&[4.0, 0.0, 1.0, 3.0]);
    let e2 = one(&[2.0, 2.0, -1.0, -3.0]);
    for params in [json!({}), json!({"select_topk": 1.0})] {
        let out = merge(SCE, &params, Some(&base), &[e1.clone(), e2.clone()]).unwrap();
        assert_close(&out, "w", &[25.0 / 9.0, 2.0, -1.0, -3.0], "select_topk = 1");
    }
}

#[test]
fn sce_selects_the_elements_of_largest_variance() {
    // Base θ0 = (0.5, −0.5, 1, 0); task vectors
    //   δ1 = (2, 1, 0, 1), δ2 = (2, −1, 0, 3), δ3 = (2, 0, 6, 3).
    // Population variances across the experts, per element:
    //   0: (2, 2, 2) → 0;  1: (1, −1, 0), mean 0 → (1 + 1 + 0)/3 = 2/3;
    //   2: (0, 0, 6), mean 2 → (4 + 4 + 16)/3 = 8;  3: (1, 3, 3), mean 7/3 → (16/9 + 4/9 + 4/9)/3 = 8/9.
    // m = 3 elements of non-zero variance; select_topk = 0.7 → k = ⌊3·0.7⌋ = 2: elements 2 and 3.
    // (Element 0, where every expert agrees, has variance 0 and is never selected.)
    // Masked: δ1 = (0, 0, 0, 1), δ2 = (0, 0, 0, 3), δ3 = (0, 0, 6, 3).
    // Weights from the masked vectors: mean squares 1/4, 9/4, 45/4 → w = (1, 9, 45)/55.
    //   2: (0, 0, 6) → +, only δ3: 6;  3: (1, 3, 3) → +, all: (1·1 + 3·9 + 3·45)/55 = 163/55;
    //   0 and 1: nothing kept → 0 (the base).
    // θ = θ0 + (0, 0, 6, 163/55) = (0.5, −0.5, 7, 163/55).
    let base = one(&[0.5, -0.5, 1.0, 0.0]);
    let experts = [
        one(&[2.5, 0.5, 1.0, 1.0]),
        one(&[2.5, -1.5, 1.0, 3.0]),
        one(&[2.5, -0.5, 7.0, 3.0]),
    ];
    let out = merge(SCE, &json!({"select_topk": 0.7}), Some(&base), &experts).unwrap();
    assert_close(&out, "w", &[0.5, -0.5, 7.0, 163.0 / 55.0], "select_topk = 0.7");
    // k = ⌊3·0.5⌋ = 1: element 2 only; weights (0, 0, 1): θ = θ0 + (0, 0, 6, 0).
    let out = merge(SCE, &json!({"select_topk": 0.5}), Some(&base), &experts).unwrap();
    assert_close(&out, "w", &[0.5, -0.5, 7.0, 0.0], "select_topk = 0.5");
    // select_topk = 0 selects nothing: the base.
    let out = merge(SCE, &json!({"select_topk": 0.0}), Some(&base), &experts).unwrap();
    assert_close(&out, "w", &[0.5, -0.5, 1.0, 0.0], "select_topk = 0");
}

#[test]
fn sce_weighs_small_task_vectors_equally() {
    // δ1 = (1e-4, 0), δ2 = (3e-4, −1e-4): Σ mean(δ²) = 0.5e-8 + 5e-8 < 1e-6, so mergekit takes
    // w = (½, ½) (not (1, 10)/11): element 0 = (1e-4 + 3e-4)/2 = 2e-4 (1/11 : 10/11 would give
    // 2.818e-4); element 1: sum < 0 → only δ2 → −1e-4.
    let base = one(&[0.0, 0.0]);
    let out = merge(SCE, &json!({}), Some(&base), &[one(&[1e-4, 0.0]), one(&[3e-4, -1e-4])]).unwrap();
    assert_close(&out, "w", &[2e-4, -1e-4], "equal-weight fallback");
}

#[test]
fn sce_invariants_identical_experts_and_permutations() {
    // N identical experts: equal weights, every non-zero entry kept → the expert itself.
    let base = one(&[0.25, -1.0, 2.0]);
    let e = one(&[1.0, -3.0, 2.0]);
    let out = merge(SCE, &json!({}), Some(&base), &[e.clone(), e.clone(), e.clone()]).unwrap();
    assert_close(&out, "w", &values(&e), "identical experts");
    // SCE has no per-expert parameter: any order of the experts gives the same merge.
    let experts = [one(&[1.0, 0.5, -2.0]), one(&[-0.5, 2.0, 3.0]), one(&[2.0, -1.0, 2.5])];
    for topk in [1.0, 0.7] {
        let params = json!({ "select_topk": topk });
        let a = merge(SCE, &params, Some(&base), &experts).unwrap();
        let permuted = [experts[2].clone(), experts[0].clone(), experts[1].clone()];
        let b = merge(SCE, &params, Some(&base), &permuted).unwrap();
        assert_close(&b, "w", &values(&a), "permuted experts");
    }
}

#[test]
fn sce_edge_cases_do_not_give_nan() {
    // Every expert equal to the base: zero task vectors, zero variance, weights 1/N (sum 0 <
    // 1e-6), nothing kept → 0/1e-6 = 0: the base, at every select_topk.
    let base = one(&[1.5, -2.0, 0.0]);
    for topk in [1.0, 0.5, 0.0] {
        let out = merge(
            SCE,
            &json!({ "select_topk": topk }),
            Some(&base),
            &[base.clone(), base.clone()],
        )
        .unwrap();
        assert_close(&out, "w", &[1.5, -2.0, 0.0], "zero task vectors");
    }
    // One expert: with select_topk = 1 the expert; with less, the variance is 0 everywhere and
    // the base is returned.
    let e = one(&[2.0, -1.0, 1.0]);
    let out = merge(SCE, &json!({}), Some(&base), std::slice::from_ref(&e)).unwrap();
    assert_close(&out, "w", &[2.0, -1.0, 1.0], "one expert");
    let out = merge(SCE, &json!({"select_topk": 0.5}), Some(&base), &[e]).unwrap();
    assert_close(&out, "w", &[1.5, -2.0, 0.0], "one expert, selection");
}

#[test]
fn sce_errors_name_the_problem() {
    let e = one(&[1.0, 2.0]);
    let err = merge(SCE, &json!({}), None, &[e.clone(), e.clone()]).unwrap_err();
    assert_contains(&err, &["'sce'", "base", "--base"]);
    let base = one(&[0.0, 0.0]);
    let err = merge(SCE, &json!({"select_topk": 1.5}), Some(&base), std::slice::from_ref(&e)).unwrap_err();
    assert_contains(&err, &["'select_topk'", "1.5", "out of range"]);
    let err = merge(SCE, &json!({"select_topk": -0.1}), Some(&base), &[e]).unwrap_err();
    assert_contains(&err, &["'select_topk'", "-0.1"]);
}

// ---------------------------------------------------------------------------------------------
// Karcher

#[test]
fn karcher_of_two_vectors_is_the_midpoint_direction_at_the_mean_norm() {
    // x1 = (2, 0), x2 = (0, 4): unit vectors at θ = 90°, so the mean direction is at θ/2 = 45°,
    // (1, 1)/√2 (the start, Σ α u normalised, is already there; the tangents cancel). Scale: the
    // mean norm (2 + 4)/2 = 3 → (3/√2, 3/√2) = (2.12132, 2.12132); the linear mean is (1, 2).
    let out = merge(KARCHER, &json!({}), None, &[one(&[2.0, 0.0]), one(&[0.0, 4.0])]).unwrap();
    let h = 3.0 / 2f64.sqrt();
    assert_close(&out, "w", &[h, h], "two orthogonal vectors");
}

#[test]
fn karcher_iterates_to_the_mean_angle() {
    // x1 = (1, 0), x2 = (3, 0), x3 = (0, 2): directions at 0°, 0°, 90°, mean norm (1 + 3 + 2)/3 = 2.
    // On a circle the Karcher mean is the mean angle, (0 + 0 + 90)/3 = 30°: the start
    // (2, 1)/√5 is at atan(1/2) = 26.57°, and one step moves by the mean signed angle to 30°
    // exactly (on a circle the log and exp maps are exact), where the tangent is 0 and it stops.
    // θ = 2·(cos 30°, sin 30°) = (√3, 1).
    let experts = [one(&[1.0, 0.0]), one(&[3.0, 0.0]), one(&[0.0, 2.0])];
    let out = merge(KARCHER, &json!({}), None, &experts).unwrap();
    assert_close(&out, "w", &[3f64.sqrt(), 1.0], "mean angle");
    // max_iter = 0 keeps the start: 2·(2, 1)/√5.
    let out = merge(KARCHER, &json!({"max_iter": 0}), None, &experts).unwrap();
    assert_close(&out, "w", &[4.0 / 5f64.sqrt(), 2.0 / 5f64.sqrt()], "max_iter = 0");
    // A base is one more input, as mergekit passes it: base (0, 2) with the first two experts is
    // the same three vectors.
    let out = merge(KARCHER, &json!({}), Some(&experts[2]), &experts[..2]).unwrap();
    assert_close(&out, "w", &[3f64.sqrt(), 1.0], "base as one more model");
}

#[test]
fn karcher_invariants_identical_models_and_permutations() {
    let x = one(&[1.0, -2.0, 0.5]);
    let out = merge(KARCHER, &json!({}), None, &[x.clone(), x.clone(), x.clone()]).unwrap();
    assert_close(&out, "w", &values(&x), "identical models");
    let out = merge(KARCHER, &json!({}), None, std::slice::from_ref(&x)).unwrap();
    assert_close(&out, "w", &values(&x), "one model");
    let experts = [one(&[1.0, 0.5, -2.0]), one(&[-0.5, 2.0, 3.0]), one(&[2.0, -1.0, 2.5])];
    let a = merge(KARCHER, &json!({}), None, &experts).unwrap();
    let permuted = [experts[1].clone(), experts[2].clone(), experts[0].clone()];
    let b = merge(KARCHER, &json!({}), None, &permuted).unwrap();
    assert_close(&b, "w", &values(&a), "permuted models");
}

#[test]
fn karcher_zero_antipodal_and_colinear_inputs_stay_finite() {
    // All norms ≤ tol: mergekit returns 0.
    let out = merge(KARCHER, &json!({}), None, &[one(&[0.0, 0.0]), one(&[0.0, 0.0])]).unwrap();
    assert_close(&out, "w", &[0.0, 0.0], "zero inputs");
    // A zero input is left out of the direction but counts in the mean norm: (0 + 2)/2 = 1.
    let out = merge(KARCHER, &json!({}), None, &[one(&[0.0, 0.0]), one(&[2.0, 0.0])]).unwrap();
    assert_close(&out, "w", &[1.0, 0.0], "one zero input");
    // Antipodal: Σ α u = 0 → μ = the first direction; θ = π gives u − cos θ·μ = 0, no move.
    let out = merge(KARCHER, &json!({}), None, &[one(&[1.0, 0.0]), one(&[-1.0, 0.0])]).unwrap();
    assert_finite(&out, "antipodal");
    assert_close(&out, "w", &[1.0, 0.0], "antipodal");
    // Colinear (1, 2) and (2, 4): one direction, mean norm 1.5·√5 → (1.5, 3).
    let out = merge(KARCHER, &json!({}), None, &[one(&[1.0, 2.0]), one(&[2.0, 4.0])]).unwrap();
    assert_close(&out, "w", &[1.5, 3.0], "colinear");
}

#[test]
fn karcher_errors_name_the_parameter() {
    let experts = [one(&[1.0, 0.0]), one(&[0.0, 1.0])];
    let err = merge(KARCHER, &json!({"tol": 0.0}), None, &experts).unwrap_err();
    assert_contains(&err, &["'tol'", "greater than 0"]);
    let err = merge(KARCHER, &json!({"max_iter": -1}), None, &experts).unwrap_err();
    assert_contains(&err, &["'max_iter'", "-1"]);
    let err = merge(KARCHER, &json!({"max_iter": 2.5}), None, &experts).unwrap_err();
    assert_contains(&err, &["'max_iter'", "not an integer"]);
    let err = merge(KARCHER, &json!({"weight": [1, 2]}), None, &experts).unwrap_err();
    assert_contains(&err, &["'weight'"]);
}

// ---------------------------------------------------------------------------------------------
// Multi-SLERP

#[test]
fn multislerp_of_two_equal_weights_is_slerp_at_one_half() {
    // x1 = (2, 0), x2 = (0, 2), w = (½, ½): μ = (1, 1)/√2, the tangents cancel, the mean norm is
    // 2 → (√2, √2) = SLERP at t = ½: sin(π/4)/sin(π/2)·(x1 + x2).
    let experts = [one(&[2.0, 0.0]), one(&[0.0, 2.0])];
    let out = merge(MULTISLERP, &json!({}), None, &experts).unwrap();
    let r = 2f64.sqrt();
    assert_close(&out, "w", &[r, r], "equal weights");
    // The same as the nuslerp plugin (mergekit's two-model slerp) at t = ½.
    let reference = merge("mergescope_plugin_nuslerp", &json!({}), None, &experts).unwrap();
    assert_close(&out, "w", &values(&reference), "against nuslerp");
    // normalize_weights = false with w = (1, 1): the same direction, scaled by Σ w·‖x‖ = 4.
    let out = merge(
        MULTISLERP,
        &json!({"weights": [1.0, 1.0], "normalize_weights": false}),
        None,
        &experts,
    )
    .unwrap();
    assert_close(&out, "w", &[2.0 * r, 2.0 * r], "unnormalised weights");
}

#[test]
fn multislerp_with_a_base_interpolates_task_vectors() {
    // θ0 = (1, 1, 0); v1 = (1, 0, 0), v2 = (0, 2, 0); w = (1, 3)/4.
    // μ = (¼, ¾, 0)/‖·‖ = (1, 3, 0)/√10, the tangents sum to 0, the mean norm ¼·1 + ¾·2 = 7/4:
    // θ = θ0 + (7/4)·(1, 3, 0)/√10 = (1.553399, 2.660199, 0). (Not SLERP at t = ¾, which would
    // be at 67.5°: mergekit's step gives the normalised weighted mean of the directions, at
    // atan 3 = 71.57°.)
    let base = one(&[1.0, 1.0, 0.0]);
    let experts = [one(&[2.0, 1.0, 0.0]), one(&[1.0, 3.0, 0.0])];
    let out = merge(MULTISLERP, &json!({"weights": [1.0, 3.0]}), Some(&base), &experts).unwrap();
    let s = 1.75 / 10f64.sqrt();
    assert_close(&out, "w", &[1.0 + s, 1.0 + 3.0 * s, 0.0], "task vectors");
    // One expert is returned as it is, base or not.
    let out = merge(MULTISLERP, &json!({}), Some(&base), &experts[..1]).unwrap();
    assert_close(&out, "w", &[2.0, 1.0, 0.0], "one expert");
}

#[test]
fn multislerp_invariants_identical_models_and_permutations() {
    let x = one(&[1.0, -2.0, 0.5]);
    let out = merge(
        MULTISLERP,
        &json!({"weights": [1.0, 2.0, 5.0]}),
        None,
        &[x.clone(), x.clone(), x.clone()],
    )
    .unwrap();
    assert_close(&out, "w", &values(&x), "identical models");
    // Permuting the experts together with their weights changes nothing.
    let base = one(&[0.5, 0.0, -0.5]);
    let experts = [one(&[1.0, 0.5, -2.0]), one(&[-0.5, 2.0, 3.0]), one(&[2.0, -1.0, 2.5])];
    let a = merge(MULTISLERP, &json!({"weights": [1.0, 2.0, 3.0]}), Some(&base), &experts).unwrap();
    let permuted = [experts[2].clone(), experts[0].clone(), experts[1].clone()];
    let b = merge(MULTISLERP, &json!({"weights": [3.0, 1.0, 2.0]}), Some(&base), &permuted).unwrap();
    assert_close(&b, "w", &values(&a), "permuted experts and weights");
}

#[test]
fn multislerp_zero_antipodal_and_colinear_inputs_stay_finite() {
    // Two antipodal experts with equal weights: ‖μ‖ < eps → mergekit's linear fallback, ½·x1 + ½·x2 = 0.
    let out = merge(MULTISLERP, &json!({}), None, &[one(&[1.0, -2.0]), one(&[-1.0, 2.0])]).unwrap();
    assert_close(&out, "w", &[0.0, 0.0], "antipodal pair");
    // Two experts equal to the base: zero task vectors → linear fallback → the base.
    let base = one(&[0.5, -1.5]);
    let out = merge(MULTISLERP, &json!({}), Some(&base), &[base.clone(), base.clone()]).unwrap();
    assert_close(&out, "w", &[0.5, -1.5], "zero task vectors");
    // Colinear (1, 2) and (3, 6): one direction (1, 2)/√5, mean norm (√5 + 3√5)/2 → (2, 4).
    let out = merge(MULTISLERP, &json!({}), None, &[one(&[1.0, 2.0]), one(&[3.0, 6.0])]).unwrap();
    assert_close(&out, "w", &[2.0, 4.0], "colinear");
    // A zero vector among three: u = 0 (divided by 0 + eps), μ = (1, 1)/√2, mean norm
    // (0 + 1 + 1)/3 = 2/3 → (2/3)/√2 = 0.471405 per element.
    let out = merge(
        MULTISLERP,
        &json!({}),
        None,
        &[one(&[0.0, 0.0]), one(&[1.0, 0.0]), one(&[0.0, 1.0])],
    )
    .unwrap();
    let v = 2.0 / 3.0 / 2f64.sqrt();
    assert_close(&out, "w", &[v, v], "one zero vector");
}

#[test]
fn multislerp_errors_name_the_problem() {
    // Three experts equal to the base: Σ w u = 0 and mergekit has no fallback beyond two.
    let base = one(&[1.0, 2.0]);
    let err = merge(
        MULTISLERP,
        &json!({}),
        Some(&base),
        &[base.clone(), base.clone(), base.clone()],
    )
    .unwrap_err();
    assert_contains(&err, &["tensor 'w'", "zero", "'weights'"]);
    let experts = [one(&[1.0, 0.0]), one(&[0.0, 1.0])];
    let err = merge(MULTISLERP, &json!({"weights": [1.0, 2.0, 3.0]}), None, &experts).unwrap_err();
    assert_contains(&err, &["'weights'", "exactly 2", "not 3"]);
    let err = merge(MULTISLERP, &json!({"weights": [1.0, -1.0]}), None, &experts).unwrap_err();
    assert_contains(&err, &["'weights'", "sums to 0", "normalize_weights"]);
    let err = merge(MULTISLERP, &json!({"eps": 0.0}), None, &experts).unwrap_err();
    assert_contains(&err, &["'eps'", "greater than 0"]);
}
