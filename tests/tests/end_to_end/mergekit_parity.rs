//! Agreement with mergekit: the same inputs merged by mergekit 0.1.5 and by mergescope's plugins
//! give the same tensors. The inputs (a base and three experts of a tiny Llama, bf16) and
//! mergekit's float32 outputs are committed under `tests/fixtures/mergekit/`, made by
//! `scripts/mergekit-parity.py` (which installs mergekit from PyPI), so this test needs no
//! Python. Each case prints its largest difference (`cargo test mergekit -- --nocapture`);
//! docs/mergekit.md records them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{MemModel, merge_in_memory};
use mergescope_tests::load;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit")
}

use mergescope_tests::read_model as read;

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
    ties_case("ties", params, [0.2; 3]);
}

/// mergekit's `ties` with per-model density (0.3, 0.5, 0.2) and weight (0.5, 0.3, 0.8) and
/// normalize: true, as the plugin's per-expert density, task_weights and normalize (dis-mean =
/// the agreeing Σ w·τ̃ / Σ w). Equal except where some expert has a magnitude tie at its threshold.
#[test]
fn weighted_ties_agrees_with_mergekit_except_at_threshold_ties() {
    let densities = [0.3, 0.5, 0.2];
    let params = json!({"density": densities, "task_weights": [0.5, 0.3, 0.8], "normalize": true,
                        "trim_scope": "tensor", "count_rule": "mergekit", "election": "mass",
                        "zero_sign": "positive", "aggregation": "dis-mean", "lambda": 1.0});
    ties_case("ties_weighted", params, densities);
}

/// TIES against mergekit's fixture `case`: every element equal to F32_AGREEMENT except where
/// some expert's |τ| equals its threshold (the k-th largest, k = max(1, int(density·n)) per
/// tensor), and those under 1 %.
fn ties_case(case: &str, params: Value, densities: [f64; 3]) {
    let e123 = ["expert1", "expert2", "expert3"];
    let a = ours("mergescope_plugin_ties", params, true, &e123);
    let b = mergekit(case);
    let base = input("base");
    let experts: Vec<MemModel> = e123.iter().map(|e| input(e)).collect();
    let (mut total, mut differing, mut worst) = (0usize, 0usize, 0f64);
    for (name, t) in &a {
        let n = t.data.len();
        let taus: Vec<Vec<f32>> = experts
            .iter()
            .map(|e| e[name].data.iter().zip(&base[name].data).map(|(x, y)| x - y).collect())
            .collect();
        let thresholds: Vec<f32> = taus
            .iter()
            .zip(densities)
            .map(|(tau, density)| {
                let k = ((density * n as f64).floor() as usize).max(1);
                let mut m: Vec<f32> = tau.iter().map(|v| v.abs()).collect();
                m.sort_by(|x, y| y.total_cmp(x));
                m[k - 1]
            })
            .collect();
        for (j, (x, y)) in t.data.iter().zip(&b[name].data).enumerate() {
            total += 1;
            let diff = f64::from((x - y).abs());
            if diff <= F32_AGREEMENT {
                worst = worst.max(diff);
                continue;
            }
            differing += 1;
            let tie = taus.iter().zip(&thresholds).any(|(tau, thr)| tau[j].abs() == *thr);
            assert!(
                tie,
                "{case}: {name}[{j}] differs ({x} vs {y}) without a magnitude tie at a threshold"
            );
        }
    }
    println!(
        "mergekit parity: {case}: {differing} of {total} elements differ, each at a threshold tie; \
         elsewhere max |Δ| = {worst:.2e}"
    );
    assert!(
        differing * 100 < total,
        "{case}: {differing} of {total} elements differ"
    );
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

// ---------------------------------------------------------------------------------------------
// DARE: mergekit's masks are one draw of torch's generator and mergescope's one draw of its own
// counter-based generator, so the two agree on the statistics, not element for element: both
// outputs are compared with the expected merge E computed from the inputs, with the same
// measures, and must look like two draws of one distribution.

/// Per tensor: base, τ_t (f64, from the f32 inputs) for the three experts.
struct DareInputs {
    base: MemModel,
    taus: Vec<std::collections::BTreeMap<String, Vec<f64>>>,
}

fn dare_inputs() -> DareInputs {
    let base = input("base");
    let taus = ["expert1", "expert2", "expert3"]
        .iter()
        .map(|e| {
            let e = input(e);
            base.iter()
                .map(|(name, b)| {
                    let tau = e[name]
                        .data
                        .iter()
                        .zip(&b.data)
                        .map(|(x, y)| f64::from(x - y))
                        .collect();
                    (name.clone(), tau)
                })
                .collect()
        })
        .collect();
    DareInputs { base, taus }
}

/// How one output compares with the expected merge E (over every element of every tensor).
#[derive(Debug)]
struct DrawStats {
    /// mean |x − E|.
    mean_abs_dev: f64,
    /// mean (x − E).
    bias: f64,
    /// Fraction of elements the merge changed (x ≠ θ0).
    changed: f64,
}

fn draw_stats(out: &MemModel, expected: &std::collections::BTreeMap<String, Vec<f64>>, base: &MemModel) -> DrawStats {
    let (mut n, mut abs_dev, mut dev, mut changed) = (0f64, 0f64, 0f64, 0f64);
    for (name, e) in expected {
        for ((x, e), b) in out[name].data.iter().zip(e).zip(&base[name].data) {
            n += 1.0;
            abs_dev += (f64::from(*x) - e).abs();
            dev += f64::from(*x) - e;
            changed += f64::from(u8::from(x != b));
        }
    }
    DrawStats {
        mean_abs_dev: abs_dev / n,
        bias: dev / n,
        changed: changed / n,
    }
}

/// Both draws agree with the expectation and with each other: the fraction of changed elements
/// is within 0.015 of its expected value (a standard error of about 0.003 over the 24 736
/// elements), neither is biased (|mean (x − E)| under a tenth of mean |x − E|), and the two mean
/// deviations are within 10 % of each other.
fn assert_same_distribution(case: &str, ours: &DrawStats, theirs: &DrawStats, expected_changed: f64) {
    println!(
        "mergekit parity: {case}: mean |x − E|: mergescope {:.3e}, mergekit {:.3e} (ratio {:.3}); \
         mean (x − E): {:.1e}, {:.1e}; changed fraction: {:.4}, {:.4} (expected {expected_changed:.4})",
        ours.mean_abs_dev,
        theirs.mean_abs_dev,
        ours.mean_abs_dev / theirs.mean_abs_dev,
        ours.bias,
        theirs.bias,
        ours.changed,
        theirs.changed
    );
    for (who, s) in [("mergescope", ours), ("mergekit", theirs)] {
        assert!(
            (s.changed - expected_changed).abs() < 0.015,
            "{case}: {who} changed {:.4} of the elements, expected {expected_changed:.4}",
            s.changed
        );
        assert!(s.bias.abs() < 0.1 * s.mean_abs_dev, "{case}: {who} is biased: {s:?}");
    }
    let ratio = ours.mean_abs_dev / theirs.mean_abs_dev;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{case}: mean |x − E| differs: {ours:?} against mergekit's {theirs:?}"
    );
}

/// The mask seed of expert `t` on tensor `name` (the dare plugin's documented derivation).
fn dare_expert_seed(seed: u64, name: &str, t: usize) -> u64 {
    let splitmix64 = |x: u64| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    splitmix64(splitmix64(seed ^ mergescope_engine::rng::fnv1a(name)) ^ t as u64)
}

/// Per expert, the fraction of its non-zero τ entries an output kept, read back from a
/// dare_linear output x − θ0 = Σ_t c_t·m_t·τ_t with c_t = w_t·r_t/Σw: per element the subset of
/// experts whose sum is nearest, with r_t first 1/density_t and then the L1 factor of the masks
/// found (twice). The τ are generic enough that the nearest subset is nearly always the drawn one.
fn recovered_kept(out: &MemModel, inputs: &DareInputs, densities: [f64; 3], weights: [f64; 3]) -> [f64; 3] {
    let total_w: f64 = weights.iter().sum();
    let (mut kept, mut nonzero) = ([0f64; 3], [0f64; 3]);
    for (name, b) in &inputs.base {
        let n = b.data.len();
        let delta: Vec<f64> = out[name]
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| f64::from(*x) - f64::from(*y))
            .collect();
        let tau = |t: usize| &inputs.taus[t][name];
        let mut r: [f64; 3] = [1.0 / densities[0], 1.0 / densities[1], 1.0 / densities[2]];
        let mut masks = vec![0usize; n];
        for _ in 0..3 {
            for (j, m) in masks.iter_mut().enumerate() {
                let mut best = (f64::INFINITY, 0usize);
                for subset in 0..8usize {
                    let sum: f64 = (0..3)
                        .filter(|t| subset >> t & 1 == 1)
                        .map(|t| weights[t] * r[t] / total_w * tau(t)[j])
                        .sum();
                    let err = (delta[j] - sum).abs();
                    if err < best.0 {
                        best = (err, subset);
                    }
                }
                *m = best.1;
            }
            for (t, rt) in r.iter_mut().enumerate() {
                let full: f64 = tau(t).iter().map(|v| v.abs()).sum();
                let masked: f64 = (0..n)
                    .filter(|j| masks[*j] >> t & 1 == 1)
                    .map(|j| tau(t)[j].abs())
                    .sum();
                if full >= 1e-7 && masked >= 1e-7 {
                    *rt = full / masked;
                }
            }
        }
        for t in 0..3 {
            for (j, mask) in masks.iter().enumerate().take(n) {
                if tau(t)[j] != 0.0 {
                    nonzero[t] += 1.0;
                    kept[t] += f64::from(u8::from(mask >> t & 1 == 1));
                }
            }
        }
    }
    [kept[0] / nonzero[0], kept[1] / nonzero[1], kept[2] / nonzero[2]]
}

/// mergekit's dare_linear with per-model density (0.6, 0.4, 0.8) and weight (0.5, 0.3, 0.8),
/// normalize: true and its default L1 rescale, against the plugin's combine = sum, rescale = l1,
/// drop_rate = 1 − density, task_weights, normalize. E = θ0 + Σ_t w_t·τ_t / Σ_t w_t (the L1
/// rescale keeps the expectation, up to its ratio's O(1/n) bias). Per expert the kept fraction
/// must be the density: mergescope's exactly from its masks; read back from both outputs by the
/// same method, mergekit's must match mergescope's.
#[test]
fn dare_linear_agrees_with_mergekit_statistically() {
    let (densities, weights) = ([0.6, 0.4, 0.8], [0.5, 0.3, 0.8]);
    let drop: Vec<f64> = densities.iter().map(|d| 1.0 - d).collect();
    let params = json!({"combine": "sum", "rescale": "l1", "drop_rate": drop, "task_weights": weights,
                        "normalize": true, "lambda": 1.0});
    let a = ours(
        "mergescope_plugin_dare",
        params,
        true,
        &["expert1", "expert2", "expert3"],
    );
    let b = mergekit("dare_linear");
    let inputs = dare_inputs();
    let total_w: f64 = weights.iter().sum();
    let (mut expected, mut changed, mut elements) = (std::collections::BTreeMap::new(), 0f64, 0f64);
    let (mut exact_kept, mut nonzero) = ([0f64; 3], [0f64; 3]);
    for (name, base) in &inputs.base {
        let e: Vec<f64> = (0..base.data.len())
            .map(|j| {
                let mut none_kept = 1.0;
                let mut v = f64::from(base.data[j]);
                for t in 0..3 {
                    let tau = inputs.taus[t][name][j];
                    v += weights[t] * tau / total_w;
                    if tau != 0.0 {
                        none_kept *= 1.0 - densities[t];
                        nonzero[t] += 1.0;
                        let seed = dare_expert_seed(0, name, t);
                        exact_kept[t] += f64::from(u8::from(mergescope_engine::rng::bernoulli_keep(
                            seed,
                            j as u64,
                            densities[t],
                        )));
                    }
                }
                changed += 1.0 - none_kept;
                elements += 1.0;
                v
            })
            .collect();
        expected.insert(name.clone(), e);
    }
    let ours_stats = draw_stats(&a, &expected, &inputs.base);
    let theirs_stats = draw_stats(&b, &expected, &inputs.base);
    assert_same_distribution("dare_linear", &ours_stats, &theirs_stats, changed / elements);
    let exact: Vec<f64> = (0..3).map(|t| exact_kept[t] / nonzero[t]).collect();
    let ours_read = recovered_kept(&a, &inputs, densities, weights);
    let theirs_read = recovered_kept(&b, &inputs, densities, weights);
    println!(
        "mergekit parity: dare_linear: kept fraction per expert (density {densities:?}): mergescope's masks \
         {exact:.4?}, read back from mergescope {ours_read:.4?}, from mergekit {theirs_read:.4?}"
    );
    // The read-back errs by a percent or two (elements where another subset's sum is nearer),
    // the same way for both outputs: compare mergekit's read-back with mergescope's.
    for t in 0..3 {
        assert!(
            (exact[t] - densities[t]).abs() < 0.015,
            "expert {t}: mergescope kept {exact:?}"
        );
        assert!(
            (ours_read[t] - exact[t]).abs() < 0.03,
            "expert {t}: read back {ours_read:?} for {exact:?}"
        );
        assert!(
            (theirs_read[t] - ours_read[t]).abs() < 0.02,
            "expert {t}: mergekit kept {theirs_read:?}, mergescope {ours_read:?} (read back alike)"
        );
    }
}

/// mergekit's dare_ties with per-model density (0.5, 0.7, 0.3) and weight (0.7, 0.4, 0.6) and
/// its defaults (L1 rescale, normalize: false), against the plugin's combine = ties-sum. E is the
/// expectation over the 8 keep patterns S of each element (probability Π_t d_t or 1 − d_t), of
/// the agreeing Σ u_t, u_t = w_t·τ_t/d_t (the L1 rescale taken at its limit 1/d_t), for the mass
/// election with Σ ≥ 0 electing + (mergekit's).
#[test]
fn dare_ties_agrees_with_mergekit_statistically() {
    let (densities, weights) = ([0.5, 0.7, 0.3], [0.7, 0.4, 0.6]);
    let drop: Vec<f64> = densities.iter().map(|d| 1.0 - d).collect();
    let params = json!({"combine": "ties-sum", "rescale": "l1", "drop_rate": drop, "task_weights": weights,
                        "normalize": false, "lambda": 1.0});
    let a = ours(
        "mergescope_plugin_dare",
        params,
        true,
        &["expert1", "expert2", "expert3"],
    );
    let b = mergekit("dare_ties");
    let inputs = dare_inputs();
    let (mut expected, mut changed, mut elements) = (std::collections::BTreeMap::new(), 0f64, 0f64);
    for (name, base) in &inputs.base {
        let e: Vec<f64> = (0..base.data.len())
            .map(|j| {
                let u: Vec<f64> = (0..3)
                    .map(|t| weights[t] * inputs.taus[t][name][j] / densities[t])
                    .collect();
                let mut mean = f64::from(base.data[j]);
                for subset in 0..8usize {
                    let kept = |t: usize| subset >> t & 1 == 1;
                    let p: f64 = (0..3)
                        .map(|t| if kept(t) { densities[t] } else { 1.0 - densities[t] })
                        .product();
                    let total: f64 = (0..3).filter(|t| kept(*t)).map(|t| u[t]).sum();
                    let s = if total >= 0.0 { 1.0 } else { -1.0 };
                    let merged: f64 = (0..3).filter(|t| kept(*t) && u[*t] * s > 0.0).map(|t| u[t]).sum();
                    mean += p * merged;
                    if merged != 0.0 {
                        changed += p;
                    }
                }
                elements += 1.0;
                mean
            })
            .collect();
        expected.insert(name.clone(), e);
    }
    let ours_stats = draw_stats(&a, &expected, &inputs.base);
    let theirs_stats = draw_stats(&b, &expected, &inputs.base);
    assert_same_distribution("dare_ties", &ours_stats, &theirs_stats, changed / elements);
}

/// DELLA's keep probability of every entry of τ (mergekit's della_magprune): by the rank of |τ|
/// within its row (the last dimension; a 1-D tensor is one row), p = (d − ε) + 2ε·(rank − 1)/(n − 1).
/// Equal magnitudes are ranked in index order (torch's argsort breaks such ties its own way).
fn della_probabilities(tau: &[f64], shape: &[usize], density: f64, epsilon: f64) -> Vec<f64> {
    let cols = if shape.len() < 2 {
        tau.len()
    } else {
        shape[1..].iter().product()
    };
    let mut p = vec![0f64; tau.len()];
    for (r, row) in tau.chunks(cols).enumerate() {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|a, b| row[*a].abs().total_cmp(&row[*b].abs()).then(a.cmp(b)));
        let span = (row.len().max(2) - 1) as f64;
        for (rank, j) in order.into_iter().enumerate() {
            p[r * cols + j] = (density - epsilon) + 2.0 * epsilon * rank as f64 / span;
        }
    }
    p
}

/// mergekit's della_linear with rescale false, per-model density (0.5, 0.6, 0.4), epsilon 0.15
/// and weight (0.6, 0.3, 0.5), against the della plugin's consensus = none, rescale = false,
/// normalize = false: E = θ0 + Σ_t w_t·p_t⊙τ_t, with p_t from the magnitude ranks.
#[test]
fn della_linear_agrees_with_mergekit_statistically() {
    let (densities, weights, epsilon) = ([0.5, 0.6, 0.4], [0.6, 0.3, 0.5], 0.15);
    let params = json!({"consensus": "none", "rescale": false, "normalize": false, "density": densities,
                        "epsilon": epsilon, "task_weights": weights, "lambda": 1.0});
    let a = ours(
        "mergescope_plugin_della",
        params,
        true,
        &["expert1", "expert2", "expert3"],
    );
    let b = mergekit("della_linear");
    let inputs = dare_inputs();
    let (mut expected, mut changed, mut elements) = (std::collections::BTreeMap::new(), 0f64, 0f64);
    for (name, base) in &inputs.base {
        let probs: Vec<Vec<f64>> = (0..3)
            .map(|t| della_probabilities(&inputs.taus[t][name], &base.shape, densities[t], epsilon))
            .collect();
        let e: Vec<f64> = (0..base.data.len())
            .map(|j| {
                let mut none_kept = 1.0;
                let mut v = f64::from(base.data[j]);
                for t in 0..3 {
                    let tau = inputs.taus[t][name][j];
                    v += weights[t] * probs[t][j] * tau;
                    if tau != 0.0 {
                        none_kept *= 1.0 - probs[t][j];
                    }
                }
                changed += 1.0 - none_kept;
                elements += 1.0;
                v
            })
            .collect();
        expected.insert(name.clone(), e);
    }
    let ours_stats = draw_stats(&a, &expected, &inputs.base);
    let theirs_stats = draw_stats(&b, &expected, &inputs.base);
    assert_same_distribution("della_linear", &ours_stats, &theirs_stats, changed / elements);
}

/// mergekit's `modules`: a tiny multimodal model (Mistral3ForConditionalGeneration, one of
/// mergekit's modular architectures) merged module by module, each with its own models (in
/// another order), layer slices and parameters, gradients restarting in every slice of every
/// module, modules and slices merging different numbers of models (then every slice merged on
/// its own) (`tests/fixtures/mergekit/modules/`). The YAML is converted and merged as `mergescope
/// merge --config` does; a module the configuration does not list is left out, as mergekit
/// leaves it.
#[test]
fn modules_agree_with_mergekit() {
    let root = fixtures().join("modules");
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(root.join("manifest.json")).unwrap()).unwrap();
    let configs = manifest["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 6, "the modules fixtures");
    for cfg in configs {
        let name = cfg["name"].as_str().unwrap();
        let text = std::fs::read_to_string(root.join(cfg["config"].as_str().unwrap())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let converted = mergescope_interop::mergekit::convert(&text, &root.join("merge.yml"), &out)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let lib = format!("mergescope_plugin_{}", converted.recipe.method.replace('-', "_"));
        mergescope_tests::merge_to_files(&lib, &converted.to_request(false).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let theirs = read(&root.join(cfg["output"].as_str().unwrap()));
        let d = max_difference(name, &read(&out), &theirs);
        println!("{name}: max |Δ| {d:.1e} over {} tensors", theirs.len());
        assert!(d <= F32_AGREEMENT, "{name}: max |Δ| {d}");
        // `mergescope recipe convert` writes the same merge as a recipe (module-scoped slices).
        let toml_path = dir.path().join("recipe.toml");
        std::fs::write(&toml_path, converted.recipe.to_toml().unwrap()).unwrap();
        let mut recipe = mergescope_interop::recipe::Recipe::load(&toml_path).unwrap();
        recipe.out = dir.path().join("from_toml");
        mergescope_tests::merge_to_files(&lib, &recipe.to_request(false).unwrap()).unwrap();
        assert_eq!(
            max_difference(name, &read(&recipe.out), &read(&out)),
            0.0,
            "{name}: recipe"
        );
    }
}

/// What mergescope refuses in a `modules` configuration names the key and the fix.
#[test]
fn bad_modules_configs_name_the_key() {
    let root = fixtures().join("modules");
    let head = "merge_method: task_arithmetic\nbase_model: inputs/base\nmodules:\n";
    let tv = "  text_decoder: {models: [{model: inputs/expert1}]}\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "  text_decoder: {merge_method: linear, models: [{model: inputs/expert1}]}\n",
            &["modules.text_decoder.merge_method", "top-level"],
        ),
        (
            "  vision: {models: [{model: inputs/expert1}]}\n",
            &["modules.vision", "Mistral3ForConditionalGeneration", "vision_tower"],
        ),
        (
            "  text_decoder: {parameters: {weight: 1}}\n",
            &["modules.text_decoder", "exactly one of models and slices"],
        ),
        (
            "  text_decoder: {models: [{model: inputs/expert1}], parameters: {weight: [0, 1]}}\n  vision_tower: \
             {models: [{model: inputs/expert1}]}\n",
            // mergekit has no default weight: the module that lacks one is refused.
            &["needs 'weight' for every model", "Missing required parameter weight"],
        ),
        (
            "  text_decoder: {slices: [{sources: [{model: inputs/base, layer_range: [0, 1]}, {model: \
             inputs/expert1, layer_range: [0, 1]}]}]}\n",
            &["modules.text_decoder.slices", "keeps each module's layer count"],
        ),
    ];
    for (body, needles) in cases {
        let e =
            mergescope_interop::mergekit::convert(&format!("{head}{body}"), &root.join("merge.yml"), &root.join("x"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
        for n in *needles {
            assert!(e.contains(n), "{body}: {n} in {e}");
        }
    }
    let e = mergescope_interop::mergekit::convert(
        &format!("{head}{tv}tokenizer_source: union\n"),
        &root.join("merge.yml"),
        &root.join("x"),
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("'tokenizer_source' with 'modules'"), "{e}");
    let e = mergescope_interop::mergekit::convert(
        &format!("{head}{tv}models: [{{model: inputs/expert1}}]\n"),
        &root.join("merge.yml"),
        &root.join("x"),
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("exactly one"), "{e}");
}
