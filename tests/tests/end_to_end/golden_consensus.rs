//! Golden tests of the `consensus` plugin (TALL-mask consensus task arithmetic), loaded from its
//! built library. Reference: seeds-000-001.md §3 ("Consensus TA / Consensus Merge": TALL mask
//! m_t = 1{|τ_t| ≥ λ_t·|τ_MTL − τ_t|}, keep weights whose mask is on for ≥ 2 tasks, then TA).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{ExecOptions, MemModel, merge_in_memory, merge_in_memory_with};
use mergescope_engine::plugin::Plugin;
use mergescope_tests::{assert_close, assert_documented, load, model};
use serde_json::{Value, json};

fn plugin() -> Plugin {
    load("mergescope_plugin_consensus")
}

/// Hand-made task vectors: 3 tasks, 5 coordinates. τ_MTL = Σ_t τ_t = [1, 1.9, 0.1, −0.6, 0.3].
const TAU: [[f32; 5]; 3] = [
    [1.0, 1.0, 0.5, 0.2, -0.3],
    [0.0, 0.9, -0.5, 0.2, 0.3],
    [0.0, 0.0, 0.1, -1.0, 0.3],
];
const MTL: [f64; 5] = [1.0, 1.9, 0.1, -0.6, 0.3];
const BASE: [f32; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];

fn inputs() -> (MemModel, Vec<MemModel>) {
    let base = model(&[("layer.bias", &[5], &BASE)]);
    let experts = TAU
        .iter()
        .map(|tau| {
            let d: Vec<f32> = BASE.iter().zip(tau).map(|(b, t)| b + t).collect();
            model(&[("layer.bias", &[5], &d)])
        })
        .collect();
    (base, experts)
}

fn merge(params: &Value) -> MemModel {
    let (base, experts) = inputs();
    merge_in_memory(&plugin(), params, 0, Some(&base), &experts).unwrap_or_else(|e| panic!("merge with {params}: {e}"))
}

/// θ0 + λ·keep ⊙ τ_MTL.
fn expected(keep: [bool; 5], lambda: f64) -> Vec<f64> {
    (0..5)
        .map(|j| f64::from(BASE[j]) + if keep[j] { lambda * MTL[j] } else { 0.0 })
        .collect()
}

#[test]
fn plugin_describes_itself() {
    let p = plugin();
    assert_eq!(p.id(), "consensus");
    let names: Vec<&str> = p.schema().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["tall_lambda", "min_tasks", "lambda"]);
    assert_documented(&p);
}

/// Defaults λ_t = 0.4, min_tasks = 2, λ = 0.3. TALL masks m_t = 1{|τ_t| ≥ 0.4·|τ_MTL − τ_t|}:
///   c0: 1 ≥ 0.4·0 ✓; 0 ≥ 0.4·1 ✗; 0 ≥ 0.4·1 ✗              → 1 task  → dropped (selfish)
///   c1: 1 ≥ 0.36 ✓; 0.9 ≥ 0.4 ✓; 0 ≥ 0.76 ✗                  → 2 tasks → kept
///   c2: 0.5 ≥ 0.16 ✓; 0.5 ≥ 0.24 ✓; 0.1 ≥ 0 ✓                → 3 tasks → kept
///   c3: 0.2 ≥ 0.32 ✗; 0.2 ≥ 0.32 ✗; 1 ≥ 0.16 ✓                → 1 task  → dropped
///   c4: 0.3 ≥ 0.24 ✓; 0.3 ≥ 0 ✓; 0.3 ≥ 0 ✓                    → 3 tasks → kept
/// θ = θ0 + 0.3·[0, 1.9, 0.1, 0, 0.3] = [1, 2.57, 3.03, 4, 5.09].
#[test]
fn hand_made_three_tasks_defaults() {
    let want = [1.0, 2.57, 3.03, 4.0, 5.09];
    assert_close(&merge(&json!({})), "layer.bias", &want, "defaults");
    let explicit = json!({"tall_lambda": [0.4, 0.4, 0.4], "min_tasks": 2, "lambda": 0.3});
    assert_close(&merge(&explicit), "layer.bias", &want, "explicit defaults");
    assert_close(
        &merge(&explicit),
        "layer.bias",
        &expected([false, true, true, false, true], 0.3),
        "keep mask",
    );
}

/// Same masks, other consensus thresholds: min_tasks 3 keeps c2 and c4; 1 keeps every coordinate
/// (each has at least one mask on) and 0 keeps everything: both equal task arithmetic.
#[test]
fn min_tasks_thresholds() {
    let out = merge(&json!({"min_tasks": 3, "lambda": 1.0}));
    assert_close(
        &out,
        "layer.bias",
        &expected([false, false, true, false, true], 1.0),
        "min_tasks 3",
    );
    for k in [0, 1] {
        let out = merge(&json!({"min_tasks": k, "lambda": 1.0}));
        assert_close(&out, "layer.bias", &expected([true; 5], 1.0), "min_tasks ≤ 1");
    }
    let out = merge(&json!({"min_tasks": 4, "lambda": 1.0}));
    assert_close(&out, "layer.bias", &expected([false; 5], 1.0), "min_tasks 4 > T");
}

/// Per-task λ_t = [0.1, 0.1, 3.0]:
///   c0: 1 ≥ 0 ✓; 0 ≥ 0.1 ✗; 0 ≥ 3 ✗          → 1 → dropped
///   c1: 1 ≥ 0.09 ✓; 0.9 ≥ 0.1 ✓; 0 ≥ 5.7 ✗    → 2 → kept
///   c2: 0.5 ≥ 0.04 ✓; 0.5 ≥ 0.06 ✓; 0.1 ≥ 0 ✓ → 3 → kept
///   c3: 0.2 ≥ 0.08 ✓; 0.2 ≥ 0.08 ✓; 1 ≥ 1.2 ✗ → 2 → kept
///   c4: 0.3 ≥ 0.06 ✓; 0.3 ≥ 0 ✓; 0.3 ≥ 0 ✓    → 3 → kept
/// θ = θ0 + 0.3·[0, 1.9, 0.1, −0.6, 0.3].
#[test]
fn per_task_tall_lambda() {
    let out = merge(&json!({"tall_lambda": [0.1, 0.1, 3.0]}));
    assert_close(&out, "layer.bias", &[1.0, 2.57, 3.03, 3.82, 5.09], "per-task λ_t");
}

#[test]
fn chunked_equals_unchunked() {
    let n = 29;
    let base: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
    let experts: Vec<MemModel> = (0..4)
        .map(|t| {
            let d: Vec<f32> = base
                .iter()
                .enumerate()
                .map(|(i, b)| b + ((i * 3 + t * 7) % 9) as f32 * 0.1 - 0.4)
                .collect();
            model(&[("big.weight", &[n], &d)])
        })
        .collect();
    let base = model(&[("big.weight", &[n], &base)]);
    let params = json!({"tall_lambda": [0.2, 0.4, 0.6, 0.8], "min_tasks": 2, "lambda": 0.5});
    let whole = merge_in_memory(&plugin(), &params, 0, Some(&base), &experts).expect("merge");
    let opts = ExecOptions {
        chunk_elems: 3,
        ..Default::default()
    };
    let chunked = merge_in_memory_with(&plugin(), &params, 0, Some(&base), &experts, &opts).expect("chunked merge");
    let e: Vec<f64> = whole["big.weight"].data.iter().map(|v| f64::from(*v)).collect();
    assert_close(&chunked, "big.weight", &e, "chunked");
}

#[test]
fn wrong_number_of_tall_lambdas_names_the_parameter() {
    let err = {
        let (base, experts) = inputs();
        merge_in_memory(&plugin(), &json!({"tall_lambda": [0.4, 0.4]}), 0, Some(&base), &experts)
            .expect_err("2 values for 3 experts must fail")
    };
    assert!(
        err.to_string().contains("tall_lambda"),
        "message does not name the parameter: {err}"
    );
}

#[test]
fn negative_parameters_are_errors() {
    let (base, experts) = inputs();
    let err = merge_in_memory(&plugin(), &json!({"tall_lambda": -0.1}), 0, Some(&base), &experts)
        .expect_err("negative tall_lambda");
    assert!(err.to_string().contains("tall_lambda"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({"min_tasks": -1}), 0, Some(&base), &experts)
        .expect_err("negative min_tasks");
    assert!(err.to_string().contains("min_tasks"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({}), 0, None, &experts).expect_err("no base");
    assert!(err.to_string().to_lowercase().contains("base"), "{err}");
}
