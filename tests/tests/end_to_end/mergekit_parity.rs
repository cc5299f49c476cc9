//! Agreement with mergekit: the same inputs merged by mergekit 0.1.5 and by mergescope's plugins
//! give the same tensors. The inputs (a base and three experts of a tiny Llama, bf16) and
//! mergekit's float32 outputs are committed under `tests/fixtures/mergekit/`, made by
//! `scripts/mergekit-parity.py` (which installs mergekit from PyPI), so this test needs no
//! Python. Each case prints its largest difference (`cargo test mergekit -- --nocapture`);
//! docs/mergekit.md records them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::merge::{MemModel, MemTensor, merge_in_memory};
use mergescope_tests::load;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit")
}

/// Every tensor of a checkpoint, as f32.
fn read(path: &Path) -> MemModel {
    let ck = Checkpoint::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ck.tensors
        .values()
        .map(|t| (t.name.clone(), MemTensor::new(t.shape.clone(), ck.read_f32(t).unwrap())))
        .collect()
}

fn input(name: &str) -> MemModel {
    read(&fixtures().join("inputs").join(name))
}

fn mergekit(name: &str) -> MemModel {
    read(&fixtures().join("mergekit").join(name))
}

/// Merges the fixture inputs with a plugin: `base` (or none) and the named experts.
fn ours(lib: &str, params: Value, base: bool, experts: &[&str]) -> MemModel {
    let experts: Vec<MemModel> = experts.iter().map(|e| input(e)).collect();
    let base = base.then(|| input("base"));
    merge_in_memory(&load(lib), &params, 0, base.as_ref(), &experts).unwrap_or_else(|e| panic!("{lib}: {e}"))
}

/// The largest |a − b| over every tensor, after checking both have the same tensors and shapes.
fn max_difference(case: &str, a: &MemModel, b: &MemModel) -> f64 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{case}: tensor names"
    );
    let mut worst = 0f64;
    for (name, t) in a {
        assert_eq!(t.shape, b[name].shape, "{case}: {name}: shape");
        for (x, y) in t.data.iter().zip(&b[name].data) {
            worst = worst.max(f64::from((x - y).abs()));
        }
    }
    worst
}

/// Deterministic methods agree to float32 rounding: the values are of order 0.01 to 1, so a
/// difference of 1e-6 is a few units in the last place of f32 (mergekit sums in float32 torch
/// where mergescope accumulates norms and dots in f64 and fuses the weighted sum).
const F32_AGREEMENT: f64 = 1e-6;

#[test]
fn deterministic_methods_agree_with_mergekit() {
    let e123 = ["expert1", "expert2", "expert3"];
    let cases: Vec<(&str, &str, Value, bool, &[&str])> = vec![
        ("linear", "mergescope_plugin_weight_average", json!({}), false, &e123),
        (
            "task_arithmetic",
            "mergescope_plugin_task_arithmetic",
            json!({"lambda": 1.0, "task_weights": 0.3}),
            true,
            &e123,
        ),
        (
            "slerp_t03",
            "mergescope_plugin_slerp",
            json!({"t": 0.3}),
            true,
            &["expert1"],
        ),
        (
            "slerp_t07",
            "mergescope_plugin_slerp",
            json!({"t": 0.7}),
            true,
            &["expert3"],
        ),
        // Layer-wise t: a gradient per filter and a catch-all, resolved per tensor by the host.
        (
            "slerp_gradient",
            "mergescope_plugin_slerp",
            json!({"t": [{"filter": "self_attn", "value": [0.1, 0.9, 0.4, 0.6]},
                         {"filter": "mlp", "value": [0.8, 0.2]}, {"value": 0.35}]}),
            true,
            &["expert2"],
        ),
        ("model_stock", "mergescope_plugin_model_stock", json!({}), true, &e123),
        (
            "model_stock_filter_wise",
            "mergescope_plugin_model_stock",
            json!({"filter_wise": true}),
            true,
            &e123,
        ),
        (
            "nuslerp",
            "mergescope_plugin_nuslerp",
            json!({"weights": [1.0, 3.0]}),
            false,
            &["expert1", "expert2"],
        ),
        (
            "nuslerp_base",
            "mergescope_plugin_nuslerp",
            json!({"weights": [2.0, 1.0]}),
            true,
            &["expert1", "expert3"],
        ),
        (
            "nuslerp_rows",
            "mergescope_plugin_nuslerp",
            json!({"flatten": false}),
            true,
            &["expert2", "expert3"],
        ),
        (
            "nuslerp_row_wise",
            "mergescope_plugin_nuslerp",
            json!({"flatten": false, "row_wise": true}),
            true,
            &["expert1", "expert2"],
        ),
    ];
    for (case, lib, params, base, experts) in cases {
        let diff = max_difference(case, &ours(lib, params, base, experts), &mergekit(case));
        println!("mergekit parity: {case:<24} max |Δ| = {diff:.2e}");
        assert!(diff <= F32_AGREEMENT, "{case}: max |Δ| = {diff:e} > {F32_AGREEMENT:e}");
    }
}

/// TIES with mergekit's settings (per-tensor trim keeping max(1, int(0.2·n)) entries, mass sign
/// election with Σ ≥ 0 electing +, disjoint sum, λ = 1). mergekit keeps exactly k entries and
/// breaks magnitude ties at the threshold in torch.argsort's order; mergescope keeps every tied
/// entry. So the outputs must be equal except at elements where some expert's |τ| equals its
/// threshold, and those must be few.
#[test]
fn ties_agrees_with_mergekit_except_at_threshold_ties() {
    let params = json!({"density": 0.2, "trim_scope": "tensor", "count_rule": "mergekit",
                        "election": "mass", "zero_sign": "positive", "aggregation": "dis-sum", "lambda": 1.0});
    let e123 = ["expert1", "expert2", "expert3"];
    let a = ours("mergescope_plugin_ties", params, true, &e123);
    let b = mergekit("ties");
    let base = input("base");
    let experts: Vec<MemModel> = e123.iter().map(|e| input(e)).collect();
    let (mut total, mut differing) = (0usize, 0usize);
    for (name, t) in &a {
        let n = t.data.len();
        let k = ((0.2 * n as f64).floor() as usize).max(1);
        let taus: Vec<Vec<f32>> = experts
            .iter()
            .map(|e| e[name].data.iter().zip(&base[name].data).map(|(x, y)| x - y).collect())
            .collect();
        let thresholds: Vec<f32> = taus
            .iter()
            .map(|tau| {
                let mut m: Vec<f32> = tau.iter().map(|v| v.abs()).collect();
                m.sort_by(|x, y| y.total_cmp(x));
                m[k - 1]
            })
            .collect();
        for (j, (x, y)) in t.data.iter().zip(&b[name].data).enumerate() {
            total += 1;
            if f64::from((x - y).abs()) <= F32_AGREEMENT {
                continue;
            }
            differing += 1;
            let tie = taus.iter().zip(&thresholds).any(|(tau, thr)| tau[j].abs() == *thr);
            assert!(
                tie,
                "ties: {name}[{j}] differs ({x} vs {y}) without a magnitude tie at a threshold"
            );
        }
    }
    println!("mergekit parity: ties: {differing} of {total} elements differ, each at a threshold tie");
    assert!(differing * 100 < total, "{differing} of {total} elements differ");
}

/// Model Breadcrumbs, with and without TIES consensus, agrees with mergekit's `breadcrumbs` and
/// `breadcrumbs_ties` except where a mask's cut falls among entries of equal magnitude (the
/// bf16 inputs have many): there any of them may be kept.
#[test]
fn breadcrumbs_agrees_with_mergekit_except_at_cut_ties() {
    let e123 = ["expert1", "expert2", "expert3"];
    let base = input("base");
    let experts: Vec<MemModel> = e123.iter().map(|e| input(e)).collect();
    let cases = [
        (
            "breadcrumbs",
            json!({"density": [0.7, 0.7, 0.7], "gamma": [0.05, 0.05, 0.05], "task_weights": [1.0, 0.5, 0.8],
                   "lambda": 0.9, "normalize": false, "consensus": "none"}),
            [(0.7, 0.05); 3],
        ),
        (
            "breadcrumbs_ties",
            json!({"density": 0.5, "gamma": 0.02, "task_weights": 1.0, "lambda": 1.0, "normalize": true,
                   "consensus": "sign"}),
            [(0.5, 0.02); 3],
        ),
    ];
    for (case, params, cuts) in cases {
        let a = ours("mergescope_plugin_breadcrumbs", params, true, &e123);
        let b = mergekit(case);
        let (mut total, mut differing) = (0usize, 0usize);
        for (name, t) in &a {
            let n = t.data.len();
            // The magnitudes at each task vector's two cuts (its bottom and its top).
            let edges: Vec<(Vec<f32>, [f32; 2])> = experts
                .iter()
                .zip(cuts)
                .map(|(e, (density, gamma))| {
                    let tau: Vec<f32> = e[name].data.iter().zip(&base[name].data).map(|(x, y)| x - y).collect();
                    let mut m: Vec<f32> = tau.iter().map(|v| v.abs()).collect();
                    m.sort_by(|x, y| x.total_cmp(y));
                    let target = (density * n as f64) as usize;
                    let bottom = n.saturating_sub(target + (gamma * n as f64) as usize);
                    let lo = m[bottom.min(n - 1)];
                    let hi = m[(bottom + target).saturating_sub(1).min(n - 1)];
                    (tau.iter().map(|v| v.abs()).collect(), [lo, hi])
                })
                .collect();
            for (j, (x, y)) in t.data.iter().zip(&b[name].data).enumerate() {
                total += 1;
                if f64::from((x - y).abs()) <= F32_AGREEMENT {
                    continue;
                }
                differing += 1;
                let tie = edges.iter().any(|(mag, [lo, hi])| mag[j] == *lo || mag[j] == *hi);
                assert!(tie, "{case}: {name}[{j}] differs ({x} vs {y}) away from a cut");
            }
        }
        println!("mergekit parity: {case}: {differing} of {total} elements differ, each at a cut tie");
        assert!(differing * 20 < total, "{case}: {differing} of {total} elements differ");
    }
}
