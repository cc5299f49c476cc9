//! Golden tests of the `ties` plugin, loaded from its built library.
//! References: seeds-002-004.md §4.2 (the implementations), §4.6 (golden vectors: original /
//! FusionBench semantics, mergekit semantics, the cancellation edge case) and §4.7 (the
//! differences the plugin's choices select between).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::executor::Observer;
use mergescope_engine::merge::{ExecOptions, MemModel, MemTensor, merge_in_memory, merge_in_memory_with};
use mergescope_engine::plugin::instance::{CallEnv, Instance};
use mergescope_engine::plugin::{Plugin, resolve_params};
use mergescope_plugin_api::abi::{CAP_CHUNKED_STATISTICS, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_tests::{TOL, assert_close, assert_documented, load, model};
use serde_json::{Value, json};
use std::sync::atomic::AtomicBool;

fn plugin() -> Plugin {
    load("mergescope_plugin_ties")
}

/// The three task vectors of seeds-002-004 §4.6.
const TAU: [[f32; 10]; 3] = [
    [0.5, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6],
    [-0.6, 0.25, 0.1, 0.2, -0.8, 0.7, -0.05, 0.35, 0.45, -0.1],
    [0.4, -0.3, -0.15, -0.2, 0.1, 0.2, 0.0, -0.3, 0.5, 0.55],
];

/// Base θ0 = 0 and experts θ_t = τ_t on one tensor, so τ is exact in f32 and exact
/// cancellations (index 5 of §4.6) stay exact.
fn zero_base(name: &str, taus: &[&[f32]]) -> (MemModel, Vec<MemModel>) {
    let n = taus[0].len();
    let base = model(&[(name, &[n], &vec![0.0; n])]);
    let experts = taus.iter().map(|t| model(&[(name, &[n], t)])).collect();
    (base, experts)
}

fn golden_inputs() -> (MemModel, Vec<MemModel>) {
    zero_base("layer.bias", &[&TAU[0], &TAU[1], &TAU[2]])
}

fn merge(params: &Value, base: &MemModel, experts: &[MemModel]) -> MemModel {
    merge_in_memory(&plugin(), params, 0, Some(base), experts).unwrap_or_else(|e| panic!("merge with {params}: {e}"))
}

#[test]
fn plugin_describes_itself() {
    let p = plugin();
    assert_eq!(p.id(), "ties");
    let names: Vec<&str> = p.schema().iter().map(|s| s.name.as_str()).collect();
    for n in [
        "density",
        "lambda",
        "aggregation",
        "trim_scope",
        "count_rule",
        "election",
        "zero_sign",
    ] {
        assert!(names.contains(&n), "schema lacks '{n}': {names:?}");
    }
    assert_documented(&p);
}

/// §4.6, original/FusionBench semantics: threshold 20 keeps int(10·0.2)+1 = 3 entries per row
/// (τ1 → 0.9, −0.7, 0.6; τ2 → −0.6, −0.8, 0.7; τ3 → 0.4, 0.5, 0.55); elected signs
/// [−,0,0,0,+,0,0,0,+,+] with the zeros replaced by the global majority sign(−1+1+1+1) = +.
#[test]
fn reference_semantics_golden_vectors() {
    let (base, experts) = golden_inputs();
    let cases: [(&str, [f64; 10]); 3] = [
        ("dis-mean", [-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.575]),
        ("dis-sum", [-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 1.15]),
        ("dis-max", [-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.6]),
    ];
    for scope in ["global", "tensor"] {
        for (aggregation, expected) in &cases {
            let params = json!({"density": 0.2, "count_rule": "reference", "zero_sign": "reference",
                                "aggregation": aggregation, "trim_scope": scope, "lambda": 1.0});
            let out = merge(&params, &base, &experts);
            assert_close(&out, "layer.bias", expected, &params.to_string());
        }
    }
}

/// The final model is θ0 + λ·τ_m: λ = 0.3 with dis-sum (AdaMerging/FusionBench setting) on a
/// non-zero dyadic base (so that τ = θ_t − θ0 stays exact).
#[test]
fn lambda_and_base_are_applied() {
    let b: Vec<f32> = (0..10).map(|j| j as f32 - 4.0).collect();
    let base = model(&[("layer.bias", &[10], &b)]);
    let experts: Vec<MemModel> = TAU
        .iter()
        .map(|tau| {
            let d: Vec<f32> = b.iter().zip(tau).map(|(x, t)| x + t).collect();
            model(&[("layer.bias", &[10], &d)])
        })
        .collect();
    // With |θ| ≤ 5 the f32 task vectors are off by up to ~5e-7, so the exact cancellation at
    // index 5 may become ±ε; both land on + here (ε > 0 directly, ε = 0 via the majority), but a
    // −ε would give −0.7: accept either at that index and check the rest exactly.
    let params = json!({"density": 0.2, "count_rule": "reference", "zero_sign": "reference",
                        "aggregation": "dis-sum", "lambda": 0.3});
    let out = merge(&params, &base, &experts);
    let tm = [-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 1.15];
    let got = &out["layer.bias"].data;
    for j in 0..10 {
        let expected = f64::from(b[j]) + 0.3 * tm[j];
        let alt = f64::from(b[j]) - 0.3 * tm[j];
        let ok = (f64::from(got[j]) - expected).abs() <= TOL || (j == 5 && (f64::from(got[j]) - alt).abs() <= TOL);
        assert!(ok, "index {j}: got {}, expected {expected}; full {got:?}", got[j]);
    }
}

/// §4.6, mergekit semantics (per tensor, density 0.2 → exactly 2 kept, ties go to +, disjoint
/// mean): [0, 0, 0, 0, 0.9, 0.7, 0, 0, 0.5, 0.55].
#[test]
fn mergekit_semantics_golden_vector() {
    let (base, experts) = golden_inputs();
    let params = json!({"density": 0.2, "trim_scope": "tensor", "count_rule": "exact", "zero_sign": "positive"});
    let out = merge(&params, &base, &experts);
    assert_close(
        &out,
        "layer.bias",
        &[0.0, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.55],
        "mergekit",
    );
}

/// The defaults (paper: global trim, exact k = round(0.2·10) = 2, mass election, elected sign 0
/// keeps nothing, dis-mean, λ = 1), by hand: τ1 keeps 0.9, −0.7; τ2 keeps −0.8, 0.7; τ3 keeps
/// 0.55, 0.5. Σ = [0,0,0,0,0.1,0,0,0,0.5,0.55]: index 5 cancels exactly, so it gets 0 (where
/// mergekit's "ties go to +" keeps 0.7).
#[test]
fn default_semantics_by_hand() {
    let (base, experts) = golden_inputs();
    let expected = [0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.5, 0.55];
    assert_close(&merge(&json!({}), &base, &experts), "layer.bias", &expected, "defaults");
    let explicit = json!({"density": 0.2, "lambda": 1.0, "aggregation": "dis-mean", "trim_scope": "global",
                          "count_rule": "exact", "election": "mass", "zero_sign": "none"});
    assert_close(
        &merge(&explicit, &base, &experts),
        "layer.bias",
        &expected,
        "explicit defaults",
    );
}

/// §4.6 edge case: τ1 = [1, −1], τ2 = [−1, 1], no trimming (density 1). Every coordinate
/// cancels: none (paper literal, MergeLM) → [0, 0]; reference (global majority 0, negatives
/// kept) → [−1, −1]; positive (mergekit) → [1, 1].
#[test]
fn cancellation_everywhere() {
    let (base, experts) = zero_base("layer.bias", &[&[1.0, -1.0], &[-1.0, 1.0]]);
    for (zero_sign, expected) in [
        ("none", [0.0, 0.0]),
        ("reference", [-1.0, -1.0]),
        ("positive", [1.0, 1.0]),
    ] {
        for scope in ["global", "tensor"] {
            let params = json!({"density": 1.0, "zero_sign": zero_sign, "trim_scope": scope});
            assert_close(
                &merge(&params, &base, &experts),
                "layer.bias",
                &expected,
                &params.to_string(),
            );
        }
    }
    // The original code's dis-max multiplies by the elected sign, which stays 0: [0, 0]; its
    // dis-sum keeps the negatives like dis-mean.
    let params = json!({"density": 1.0, "zero_sign": "reference", "aggregation": "dis-max"});
    assert_close(
        &merge(&params, &base, &experts),
        "layer.bias",
        &[0.0, 0.0],
        "reference dis-max",
    );
    let params = json!({"density": 1.0, "zero_sign": "reference", "aggregation": "dis-sum"});
    assert_close(
        &merge(&params, &base, &experts),
        "layer.bias",
        &[-1.0, -1.0],
        "reference dis-sum",
    );
}

/// Mass against count election: τ = (3, −1, −1), no trim. Mass: Σ = 1 → + → 3. Count: one
/// positive, two negatives → − → mean(−1, −1) = −1.
#[test]
fn mass_against_count_election() {
    let (base, experts) = zero_base("layer.bias", &[&[3.0], &[-1.0], &[-1.0]]);
    let mass = merge(&json!({"density": 1.0, "election": "mass"}), &base, &experts);
    assert_close(&mass, "layer.bias", &[3.0], "mass");
    let count = merge(&json!({"density": 1.0, "election": "count"}), &base, &experts);
    assert_close(&count, "layer.bias", &[-1.0], "count");
}

/// Two tensors, two experts, density 0.5, count_rule exact, dis-mean, λ = 1.
/// τ1: a = [4, −3], b = [1, 0.5]; τ2: a = [−1, 2], b = [3, −0.25]; θ0: a = [10, 20], b = [30, 40].
///
/// global (n = 4, k = 2 per expert): τ1 keeps 4, −3 (a) → a = [4, −3], b = [0, 0];
///   τ2 keeps 3 (b), 2 (a) → a = [0, 2], b = [3, 0]. Σ: a = [4, −1] → [+, −]; b = [3, 0] → [+, 0].
///   merged: a = [4, −3], b = [3, 0] (b1 elects 0: nothing kept).
/// tensor (n = 2, k = 1 per tensor and expert): τ1 → a = [4, 0], b = [1, 0]; τ2 → a = [0, 2],
///   b = [3, 0]. Σ: a = [4, 2] → [+, +]; b = [4, 0]. merged: a = [4, 2], b = [mean(1, 3) = 2, 0].
/// global with count_rule reference: int(4·0.5)+1 = 3 kept: τ1 → a = [4, −3], b = [1, 0];
///   τ2 → a = [−1, 2], b = [3, 0]. Σ: a = [3, −1] → [+, −]; b = [4, 0]. merged: a = [4, −3],
///   b = [2, 0].
#[test]
fn global_against_tensor_scope() {
    let base = model(&[("a.bias", &[2], &[10.0, 20.0]), ("b.bias", &[2], &[30.0, 40.0])]);
    let experts = vec![
        model(&[("a.bias", &[2], &[14.0, 17.0]), ("b.bias", &[2], &[31.0, 40.5])]),
        model(&[("a.bias", &[2], &[9.0, 22.0]), ("b.bias", &[2], &[33.0, 39.75])]),
    ];
    let global = merge(&json!({"density": 0.5, "trim_scope": "global"}), &base, &experts);
    assert_close(&global, "a.bias", &[14.0, 17.0], "global");
    assert_close(&global, "b.bias", &[33.0, 40.0], "global");
    let tensor = merge(&json!({"density": 0.5, "trim_scope": "tensor"}), &base, &experts);
    assert_close(&tensor, "a.bias", &[14.0, 22.0], "tensor");
    assert_close(&tensor, "b.bias", &[32.0, 40.0], "tensor");
    let reference = merge(&json!({"density": 0.5, "count_rule": "reference"}), &base, &experts);
    assert_close(&reference, "a.bias", &[14.0, 17.0], "global, reference count");
    assert_close(&reference, "b.bias", &[32.0, 40.0], "global, reference count");
}

/// zero_sign = reference: the majority is model-wide with trim_scope = global and per tensor with
/// trim_scope = tensor. No trim (density 1), θ0 = 0, dis-mean.
/// a: τ1 = [1, 1, −3], τ2 = [2, −1, 3] → Σ = [3, 0, 0], signs [+, 0, 0] (sum +1);
/// b: τ1 = [−1, −1, −2], τ2 = [−1, −3, 2] → Σ = [−2, −4, 0], signs [−, −, 0] (sum −2).
/// global majority sign(1 − 2) = −: a → [1.5, −1, −3], b → [−1, −2, −2].
/// per tensor: a's majority + → a = [1.5, 1, 3]; b's − → b = [−1, −2, −2].
#[test]
fn reference_zero_sign_majority_scope() {
    let base = model(&[("a.bias", &[3], &[0.0; 3]), ("b.bias", &[3], &[0.0; 3])]);
    let experts = vec![
        model(&[
            ("a.bias", &[3], &[1.0, 1.0, -3.0]),
            ("b.bias", &[3], &[-1.0, -1.0, -2.0]),
        ]),
        model(&[
            ("a.bias", &[3], &[2.0, -1.0, 3.0]),
            ("b.bias", &[3], &[-1.0, -3.0, 2.0]),
        ]),
    ];
    let global = merge(
        &json!({"density": 1.0, "zero_sign": "reference", "trim_scope": "global"}),
        &base,
        &experts,
    );
    assert_close(&global, "a.bias", &[1.5, -1.0, -3.0], "global majority");
    assert_close(&global, "b.bias", &[-1.0, -2.0, -2.0], "global majority");
    let tensor = merge(
        &json!({"density": 1.0, "zero_sign": "reference", "trim_scope": "tensor"}),
        &base,
        &experts,
    );
    assert_close(&tensor, "a.bias", &[1.5, 1.0, 3.0], "per-tensor majority");
    assert_close(&tensor, "b.bias", &[-1.0, -2.0, -2.0], "per-tensor majority");
}

/// density 0 keeps nothing under the exact rule (θ = θ0) and the maximum under the reference
/// rule (int(0)+1 = 1, §4.2 "K = 0 keeps the maximum-magnitude element(s)").
#[test]
fn density_zero() {
    let (base, experts) = golden_inputs();
    let exact = merge(&json!({"density": 0.0}), &base, &experts);
    assert_close(&exact, "layer.bias", &[0.0; 10], "exact");
    let reference = merge(&json!({"density": 0.0, "count_rule": "reference"}), &base, &experts);
    // τ1 keeps 0.9, τ2 −0.8, τ3 0.55: index 4 elects + (0.1) → 0.9; index 9 → 0.55.
    assert_close(
        &reference,
        "layer.bias",
        &[0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.55],
        "reference",
    );
}

// ---------------------------------------------------------------------------------------------
// Randomised cross-check against a direct restatement of the semantics (sorting is fine here).

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Task-vector entries with exact zeros, exact magnitude ties, a cluster of values that share
    /// the top 16 bits of their f32 pattern (so the second radix pass matters), and a wide spread.
    fn entry(&mut self) -> f32 {
        let sign = if self.next().is_multiple_of(2) { 1.0 } else { -1.0 };
        match self.next() % 8 {
            0 => 0.0,
            1 => 0.5 * sign,
            2 => (0.3 + (self.next() % 50) as f32 * 1e-6) * sign,
            _ => ((self.unit() * 2.0 - 1.0) * 2f64.powi((self.next() % 7) as i32 - 4)) as f32,
        }
    }
}

const SHAPES: [(&str, &[usize]); 4] = [
    ("a.weight", &[7, 9]),
    ("b.bias", &[13]),
    ("c.weight", &[4, 5]),
    ("d.norm.weight", &[6]),
];

fn random_inputs(seed: u64, n_experts: usize) -> (MemModel, Vec<MemModel>) {
    random_inputs_shaped(seed, n_experts, &SHAPES)
}

fn random_inputs_shaped(seed: u64, n_experts: usize, shapes: &[(&str, &[usize])]) -> (MemModel, Vec<MemModel>) {
    let mut rng = Rng(seed);
    let mut base = MemModel::new();
    let mut experts = vec![MemModel::new(); n_experts];
    for &(name, shape) in shapes {
        let n: usize = shape.iter().product();
        // Dyadic base values in [−2, 2].
        let b: Vec<f32> = (0..n).map(|_| (rng.next() % 17) as f32 * 0.25 - 2.0).collect();
        for e in &mut experts {
            let d: Vec<f32> = b.iter().map(|x| x + rng.entry()).collect();
            e.insert(name.to_string(), MemTensor::new(shape.to_vec(), d));
        }
        base.insert(name.to_string(), MemTensor::new(shape.to_vec(), b));
    }
    (base, experts)
}

#[derive(Clone, Copy, Debug)]
struct Options<'a> {
    density: f64,
    lambda: f64,
    aggregation: &'a str,
    scope: &'a str,
    count_rule: &'a str,
    election: &'a str,
    zero_sign: &'a str,
}

impl Options<'_> {
    fn json(&self) -> Value {
        json!({"density": self.density, "lambda": self.lambda, "aggregation": self.aggregation,
               "trim_scope": self.scope, "count_rule": self.count_rule, "election": self.election,
               "zero_sign": self.zero_sign})
    }
}

fn kept(n: usize, density: f64, rule: &str) -> usize {
    let k = if rule == "exact" {
        (n as f64 * density).round()
    } else {
        (n as f64 * density).floor() + 1.0
    };
    (k.max(0.0) as usize).min(n)
}

/// k-th largest |x| by sorting (None when k = 0).
fn threshold(values: &[f32], k: usize) -> Option<f32> {
    if k == 0 {
        return None;
    }
    let mut mags: Vec<f32> = values.iter().map(|v| v.abs()).collect();
    mags.sort_by(|a, b| b.total_cmp(a));
    Some(mags[k - 1])
}

fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// Per-expert densities and weights, and normalize (the mergekit parameters).
struct Weighting {
    densities: Vec<f64>,
    weights: Vec<f64>,
    normalize: bool,
}

impl Weighting {
    /// The plugin's parameters: `o`'s plus the per-expert lists and normalize.
    fn json(&self, o: &Options<'_>) -> Value {
        let mut v = o.json();
        v["density"] = json!(self.densities);
        v["task_weights"] = json!(self.weights);
        v["normalize"] = json!(self.normalize);
        v
    }
}

/// TIES restated directly from seeds-002-004 §4.2 with the plugin's documented choices.
fn reference_ties(base: &MemModel, experts: &[MemModel], o: &Options<'_>) -> MemModel {
    let w = Weighting {
        densities: vec![o.density; experts.len()],
        weights: vec![1.0; experts.len()],
        normalize: true,
    };
    reference_weighted_ties(base, experts, o, &w)
}

/// The restatement with per-expert densities, weights w_t multiplied into the trimmed values
/// before the election (one f32 product, as the host's `scale`), and dis-mean as Σ w·τ̃ / Σ w
/// over the agreeing entries (divisor 0 → 1), or their sum without normalize (mergekit's rules).
fn reference_weighted_ties(base: &MemModel, experts: &[MemModel], o: &Options<'_>, w: &Weighting) -> MemModel {
    let names: Vec<&String> = base.keys().collect();
    // τ in f32, as the host computes it.
    let taus: Vec<Vec<Vec<f32>>> = experts
        .iter()
        .map(|e| {
            names
                .iter()
                .map(|n| e[*n].data.iter().zip(&base[*n].data).map(|(x, b)| x - b).collect())
                .collect()
        })
        .collect();
    // thresholds[t][tensor]
    let thresholds: Vec<Vec<Option<f32>>> = taus
        .iter()
        .zip(&w.densities)
        .map(|(per_tensor, density)| {
            if o.scope == "global" {
                let all: Vec<f32> = per_tensor.iter().flatten().copied().collect();
                vec![threshold(&all, kept(all.len(), *density, o.count_rule)); per_tensor.len()]
            } else {
                per_tensor
                    .iter()
                    .map(|v| threshold(v, kept(v.len(), *density, o.count_rule)))
                    .collect()
            }
        })
        .collect();
    // w_t·τ̃_t.
    let trimmed = |t: usize, i: usize, j: usize| -> f32 {
        let v = taus[t][i][j];
        match thresholds[t][i] {
            Some(thr) if v.abs() >= thr => v * w.weights[t] as f32,
            _ => 0.0,
        }
    };
    // The elected total, summed in f32 in expert order exactly like the host's weighted sum.
    let total = |i: usize, j: usize| -> f64 {
        let mut s = 0f32;
        for t in 0..experts.len() {
            let v = trimmed(t, i, j);
            s += if o.election == "mass" {
                v
            } else {
                sign(f64::from(v)) as f32
            };
        }
        f64::from(s)
    };
    let raw_sign_sums: Vec<f64> = (0..names.len())
        .map(|i| (0..taus[0][i].len()).map(|j| sign(total(i, j))).sum())
        .collect();
    let model_majority = sign(raw_sign_sums.iter().sum());
    let mut out = MemModel::new();
    for (i, name) in names.iter().enumerate() {
        let b = &base[*name];
        let majority = if o.scope == "global" {
            model_majority
        } else {
            sign(raw_sign_sums[i])
        };
        let data: Vec<f32> = (0..b.data.len())
            .map(|j| {
                let tot = total(i, j);
                let (multiply, select) = match o.zero_sign {
                    "none" => (sign(tot), sign(tot)),
                    "positive" => {
                        let s = if tot >= 0.0 { 1.0 } else { -1.0 };
                        (s, s)
                    }
                    _ => {
                        let s = if sign(tot) == 0.0 { majority } else { sign(tot) };
                        (s, if s == 0.0 { -1.0 } else { s })
                    }
                };
                let selected: Vec<(f64, f64)> = (0..experts.len())
                    .map(|t| (f64::from(trimmed(t, i, j)), w.weights[t]))
                    .filter(|(v, _)| *v != 0.0 && sign(*v) == select)
                    .collect();
                let sum: f64 = selected.iter().map(|(v, _)| v).sum();
                let merged = match o.aggregation {
                    "dis-sum" => sum,
                    "dis-max" => selected.iter().map(|(v, _)| v.abs()).fold(0.0, f64::max) * multiply,
                    _ if !w.normalize => sum,
                    _ => {
                        let divisor: f64 = selected.iter().map(|(_, wt)| wt).sum();
                        sum / if divisor == 0.0 { 1.0 } else { divisor }
                    }
                };
                (f64::from(b.data[j]) + o.lambda * merged) as f32
            })
            .collect();
        out.insert(name.to_string(), MemTensor::new(b.shape.clone(), data));
    }
    out
}

fn check_against_reference(o: &Options<'_>, base: &MemModel, experts: &[MemModel]) {
    check_against_reference_with(o, base, experts, &ExecOptions::default());
}

fn check_against_reference_with(o: &Options<'_>, base: &MemModel, experts: &[MemModel], opts: &ExecOptions) {
    let expected = reference_ties(base, experts, o);
    let got = merge_in_memory_with(&plugin(), &o.json(), 0, Some(base), experts, opts)
        .unwrap_or_else(|e| panic!("merge with {}: {e}", o.json()));
    for (name, t) in &expected {
        let e: Vec<f64> = t.data.iter().map(|v| f64::from(*v)).collect();
        assert_close(&got, name, &e, &format!("{o:?}"));
    }
}

/// Every combination of the choices on a random 4-tensor model with magnitude ties, against the
/// restatement above. This exercises the exact global threshold of the two radix passes.
#[test]
fn all_options_match_a_direct_restatement() {
    let (base, experts) = random_inputs(7, 3);
    for scope in ["global", "tensor"] {
        for count_rule in ["exact", "reference"] {
            for election in ["mass", "count"] {
                for zero_sign in ["none", "reference", "positive"] {
                    for aggregation in ["dis-mean", "dis-sum", "dis-max"] {
                        let o = Options {
                            density: 0.45,
                            lambda: 0.7,
                            aggregation,
                            scope,
                            count_rule,
                            election,
                            zero_sign,
                        };
                        check_against_reference(&o, &base, &experts);
                    }
                }
            }
        }
    }
}

#[test]
fn densities_match_a_direct_restatement() {
    for (seed, n_experts) in [(1u64, 2usize), (2, 4), (3, 1)] {
        let (base, experts) = random_inputs(seed, n_experts);
        for density in [0.0, 0.01, 0.1, 0.2, 0.38, 0.45, 0.5, 0.9, 1.0] {
            for scope in ["global", "tensor"] {
                for count_rule in ["exact", "reference"] {
                    let o = Options {
                        density,
                        lambda: 1.0,
                        aggregation: "dis-mean",
                        scope,
                        count_rule,
                        election: "mass",
                        zero_sign: "reference",
                    };
                    check_against_reference(&o, &base, &experts);
                }
            }
        }
    }
}

/// With global thresholds fixed by the statistics passes the merge is elementwise: chunks of 3
/// elements give the same model.
#[test]
fn global_scope_chunked_equals_unchunked() {
    let (base, experts) = random_inputs(11, 3);
    let params = json!({"density": 0.3, "zero_sign": "reference", "aggregation": "dis-max"});
    let whole = merge(&params, &base, &experts);
    let opts = ExecOptions {
        chunk_elems: 3,
        ..Default::default()
    };
    let chunked = merge_in_memory_with(&plugin(), &params, 0, Some(&base), &experts, &opts).expect("chunked merge");
    for (name, t) in &whole {
        let e: Vec<f64> = t.data.iter().map(|v| f64::from(*v)).collect();
        assert_close(&chunked, name, &e, "chunked");
    }
}

/// The statistics passes accept chunks (`CAP_CHUNKED_STATISTICS`), global and per tensor: the
/// host streams the histogram and sign-vote passes in chunks of 1, 3 and 7 elements on two worker
/// threads, so every tensor of the model (63, 13, 20 and 6 elements) is split into several pieces
/// that arrive in any order, and the model must be bit for bit the one from whole tensors, for
/// both scopes, every zero-sign rule (reference uses the sign votes of pass 2, over the model or
/// per tensor) and both elections.
#[test]
fn statistics_in_parallel_chunks_equal_whole() {
    let whole_opts = ExecOptions {
        chunk_elems: usize::MAX,
        threads: 1,
        ..Default::default()
    };
    for (seed, n_experts) in [(21u64, 3usize), (22, 2)] {
        let (base, experts) = random_inputs(seed, n_experts);
        for (scope, zero_sign) in ["global", "tensor"]
            .into_iter()
            .flat_map(|scope| ["none", "reference", "positive"].map(|z| (scope, z)))
        {
            for (election, aggregation, count_rule, density) in [
                ("mass", "dis-mean", "exact", 0.3),
                ("count", "dis-max", "reference", 0.12),
                ("mass", "dis-sum", "reference", 0.0),
            ] {
                let o = Options {
                    density,
                    lambda: 0.8,
                    aggregation,
                    scope,
                    count_rule,
                    election,
                    zero_sign,
                };
                let whole = merge_in_memory_with(&plugin(), &o.json(), 0, Some(&base), &experts, &whole_opts)
                    .unwrap_or_else(|e| panic!("whole merge with {}: {e}", o.json()));
                // The whole run is itself right (so that equal means correct, not equally wrong).
                for (name, t) in &reference_ties(&base, &experts, &o) {
                    let e: Vec<f64> = t.data.iter().map(|v| f64::from(*v)).collect();
                    assert_close(&whole, name, &e, &format!("{o:?}, whole"));
                }
                for chunk_elems in [1, 3, 7] {
                    let opts = ExecOptions {
                        chunk_elems,
                        threads: 2,
                        ..Default::default()
                    };
                    let chunked = merge_in_memory_with(&plugin(), &o.json(), 0, Some(&base), &experts, &opts)
                        .unwrap_or_else(|e| panic!("chunked merge with {}: {e}", o.json()));
                    assert_eq!(chunked.len(), whole.len());
                    for (name, t) in &whole {
                        let got = &chunked[name];
                        assert_eq!(got.shape, t.shape, "{o:?}, chunks of {chunk_elems}: '{name}' shape");
                        let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                        assert_eq!(
                            bits(&got.data),
                            bits(&t.data),
                            "{o:?}, chunks of {chunk_elems}: tensor '{name}' differs from the whole-tensor run\n\
                             chunked: {:?}\nwhole: {:?}",
                            got.data,
                            t.data
                        );
                    }
                }
            }
        }
    }
}

/// Both scopes ask for chunked statistics (tensor scope counts the chunks of a tensor into
/// histograms of its own), with a sign-vote pass more for zero_sign = reference. Both stay
/// elementwise, thread-safe and base-needing.
#[test]
fn chunked_statistics_capability_by_scope() {
    let p = plugin();
    let opts = ExecOptions::default();
    let cancel = AtomicBool::new(false);
    let env = || CallEnv {
        device: &opts.device,
        cancel: &cancel,
        log: Observer::silent().log,
        threads: opts.threads,
    };
    for (scope, zero_sign, chunked, passes) in [
        ("global", "none", true, 2),
        ("global", "reference", true, 3),
        ("tensor", "none", true, 2),
        ("tensor", "reference", true, 3),
    ] {
        let user = json!({"trim_scope": scope, "zero_sign": zero_sign});
        let resolved = resolve_params(p.id(), p.schema(), user.as_object().unwrap(), 2).unwrap();
        let instance = Instance::create(&p, &resolved, 2, 0, env()).unwrap();
        let caps = instance.capabilities;
        for bit in [CAP_ELEMENTWISE, CAP_THREAD_SAFE, CAP_NEEDS_BASE] {
            assert_ne!(caps & bit, 0, "{scope}: capabilities {caps:#x} lack {bit:#x}");
        }
        assert_eq!(
            caps & CAP_CHUNKED_STATISTICS != 0,
            chunked,
            "{scope}: capabilities {caps:#x}"
        );
        assert_eq!(
            instance.passes, passes,
            "{scope}, zero_sign={zero_sign}: statistics passes"
        );
    }
}

/// Every setting is elementwise in the merge pass (per-tensor thresholds and majority signs come
/// from the statistics pass): chunks of 1, 3 and 7 elements, which split every tensor of the
/// random model at different places, give the restatement's model for every combination.
#[test]
fn every_setting_chunked_matches_a_direct_restatement() {
    let (base, experts) = random_inputs(5, 3);
    for chunk_elems in [1, 3, 7] {
        let opts = ExecOptions {
            chunk_elems,
            ..Default::default()
        };
        for scope in ["global", "tensor"] {
            for count_rule in ["exact", "reference"] {
                for election in ["mass", "count"] {
                    for zero_sign in ["none", "reference", "positive"] {
                        for aggregation in ["dis-mean", "dis-sum", "dis-max"] {
                            let o = Options {
                                density: 0.3,
                                lambda: 0.9,
                                aggregation,
                                scope,
                                count_rule,
                                election,
                                zero_sign,
                            };
                            check_against_reference_with(&o, &base, &experts, &opts);
                        }
                    }
                }
            }
        }
    }
}

/// Large tensors (the plugin's radix selection, split over threads, instead of its direct
/// selection for small ones) against the restatement, whole and in chunks.
#[test]
fn large_tensors_match_a_direct_restatement() {
    let shapes: [(&str, &[usize]); 3] = [
        ("big.weight", &[520, 1024]),
        ("mid.weight", &[150, 130]),
        ("s.bias", &[9]),
    ];
    let (base, experts) = random_inputs_shaped(13, 3, &shapes);
    let chunked = ExecOptions {
        chunk_elems: 100_003,
        ..Default::default()
    };
    for scope in ["global", "tensor"] {
        for (count_rule, zero_sign, density) in [("exact", "reference", 0.2), ("reference", "none", 0.07)] {
            let o = Options {
                density,
                lambda: 1.0,
                aggregation: "dis-mean",
                scope,
                count_rule,
                election: "mass",
                zero_sign,
            };
            let expected = reference_ties(&base, &experts, &o);
            for opts in [&ExecOptions::default(), &chunked] {
                let got = merge_in_memory_with(&plugin(), &o.json(), 0, Some(&base), &experts, opts)
                    .unwrap_or_else(|e| panic!("merge with {}: {e}", o.json()));
                for (name, t) in &expected {
                    let e: Vec<f64> = t.data.iter().map(|v| f64::from(*v)).collect();
                    assert_close(&got, name, &e, &format!("{o:?}, chunks of {}", opts.chunk_elems));
                }
            }
        }
    }
}

/// The per-tensor majority of zero_sign = reference is taken over the whole tensor even when the
/// merge pass sees it in chunks: a tensor whose first chunk alone would vote the other way.
/// a: τ1 = [1, −1, −1, 1, 1, 1], τ2 = [−1, 1, 1, 1, 1, 1] (density 1): Σ = [0, 0, 0, 2, 2, 2],
/// raw signs [0, 0, 0, +, +, +], majority + → [1, 1, 1, 1, 1, 1]; with chunks of 3 the first chunk
/// (all zero signs) must still use +.
#[test]
fn tensor_majority_spans_chunks() {
    let (base, experts) = zero_base(
        "a.bias",
        &[&[1.0, -1.0, -1.0, 1.0, 1.0, 1.0], &[-1.0, 1.0, 1.0, 1.0, 1.0, 1.0]],
    );
    let params = json!({"density": 1.0, "zero_sign": "reference", "trim_scope": "tensor"});
    let opts = ExecOptions {
        chunk_elems: 3,
        ..Default::default()
    };
    let out = merge_in_memory_with(&plugin(), &params, 0, Some(&base), &experts, &opts).expect("chunked merge");
    assert_close(&out, "a.bias", &[1.0; 6], "chunked per-tensor majority");
}

/// A NaN task-vector entry cannot be ranked: both scopes refuse it instead of trimming it away.
#[test]
fn nan_task_vector_is_an_error() {
    let (base, experts) = zero_base("layer.bias", &[&[0.5, f32::NAN, 0.1, 0.2], &[0.3, 0.1, -0.2, 0.4]]);
    for scope in ["global", "tensor"] {
        let params = json!({"density": 0.5, "trim_scope": scope});
        let err = merge_in_memory(&plugin(), &params, 0, Some(&base), &experts).expect_err("NaN must fail");
        assert!(err.to_string().contains("NaN"), "{scope}: {err}");
    }
}

#[test]
fn bad_choices_and_missing_base_are_errors() {
    let (base, experts) = golden_inputs();
    let err = merge_in_memory(
        &plugin(),
        &json!({"aggregation": "dis-median"}),
        0,
        Some(&base),
        &experts,
    )
    .expect_err("unknown aggregation must fail");
    assert!(err.to_string().contains("aggregation"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({"density": 1.5}), 0, Some(&base), &experts)
        .expect_err("density out of range must fail");
    assert!(err.to_string().contains("density"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({}), 0, None, &experts).expect_err("no base must fail");
    assert!(err.to_string().to_lowercase().contains("base"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Per-expert densities, task weights and normalize (mergekit's `ties` parameters).

/// Weighted TIES by hand (no trim: density 1; θ0 = 0; dyadic values, so every number is exact).
/// τ1 = [1, 2, −1, 0.5], τ2 = [3, −1, −2, 0], τ3 = [−1, 1, 4, 1], w = [0.5, 0.25, 2]:
/// u = w·τ: u1 = [0.5, 1, −0.5, 0.25], u2 = [0.75, −0.25, −0.5, 0], u3 = [−2, 2, 8, 2];
/// Σu = [−0.75, 2.75, 7, 2.25] → s = [−, +, +, +].
/// Index 0 is the weighted election flipping a sign: unweighted Σ τ = 3 elects + (mean(1, 3) = 2),
/// weighted Σ u = −0.75 elects −, and only u3 = −2 (w 2) agrees.
/// normalize (Σ u / Σ w over the agreeing): [−2/2, (1 + 2)/(0.5 + 2), 8/2, (0.25 + 2)/(0.5 + 2)]
///   = [−1, 1.2, 4, 0.9];
/// without normalize, and dis-sum either way: [−2, 3, 8, 2.25];
/// dis-max (largest agreeing |u| times s): [−2, 2, 8, 2];
/// unit weights (dis-mean): Σ τ = [3, 2, 1, 1.5], all +: [2, 1.5, 4, 0.75].
#[test]
fn weighted_ties_with_normalize_by_hand() {
    let (base, experts) = zero_base(
        "layer.bias",
        &[&[1.0, 2.0, -1.0, 0.5], &[3.0, -1.0, -2.0, 0.0], &[-1.0, 1.0, 4.0, 1.0]],
    );
    for scope in ["global", "tensor"] {
        for zero_sign in ["none", "positive"] {
            let merged = |extra: Value| {
                let mut params = json!({"density": 1.0, "task_weights": [0.5, 0.25, 2.0], "trim_scope": scope,
                                        "zero_sign": zero_sign});
                for (k, v) in extra.as_object().unwrap() {
                    params[k] = v.clone();
                }
                (merge(&params, &base, &experts), params.to_string())
            };
            let (out, ctx) = merged(json!({}));
            assert_close(
                &out,
                "layer.bias",
                &[-1.0, 1.2, 4.0, 0.9],
                &format!("{ctx} (normalize by default)"),
            );
            let (out, ctx) = merged(json!({"normalize": true, "aggregation": "dis-mean"}));
            assert_close(&out, "layer.bias", &[-1.0, 1.2, 4.0, 0.9], &ctx);
            for extra in [
                json!({"normalize": false}),
                json!({"aggregation": "dis-sum"}),
                json!({"aggregation": "dis-sum", "normalize": false}),
            ] {
                let (out, ctx) = merged(extra);
                assert_close(&out, "layer.bias", &[-2.0, 3.0, 8.0, 2.25], &ctx);
            }
            let (out, ctx) = merged(json!({"aggregation": "dis-max"}));
            assert_close(&out, "layer.bias", &[-2.0, 2.0, 8.0, 2.0], &ctx);
            let (out, ctx) = merged(json!({"task_weights": 1.0}));
            assert_close(&out, "layer.bias", &[2.0, 1.5, 4.0, 0.75], &ctx);
        }
    }
}

/// A heavy expert outvotes two light ones: τ = (3, −1, −1) on one coordinate, no trim. Unweighted
/// mass: Σ = 1 → + → 3. With w = (0.25, 1, 1): Σ u = 0.75 − 2 = −1.25 → − → the agreeing u are
/// −1, −1 (w 1, 1): normalize gives −2/2 = −1, the sum −2. With w = (1, 0.25, 0.25): Σ u = 2.5 → +
/// → 3/1 = 3. With w = (0, 1, 1) the first expert is left out: −1.
#[test]
fn weighted_mass_election_flips_a_sign() {
    let (base, experts) = zero_base("layer.bias", &[&[3.0], &[-1.0], &[-1.0]]);
    for (weights, normalize, expected) in [
        (json!(1.0), true, 3.0),
        (json!([0.25, 1.0, 1.0]), true, -1.0),
        (json!([0.25, 1.0, 1.0]), false, -2.0),
        (json!([1.0, 0.25, 0.25]), true, 3.0),
        (json!([0.0, 1.0, 1.0]), true, -1.0),
    ] {
        let params = json!({"density": 1.0, "task_weights": weights, "normalize": normalize});
        assert_close(
            &merge(&params, &base, &experts),
            "layer.bias",
            &[expected],
            &params.to_string(),
        );
    }
}

/// Per-expert density on §4.6's task vectors, density = [0.2, 0.5, 0.1], exact rule (n = 10, so
/// k = 2, 5, 1): τ1 keeps 0.9, −0.7 (indices 4, 5); τ2 keeps −0.8, 0.7, −0.6, 0.45, 0.35 (4, 5, 0,
/// 8, 7); τ3 keeps 0.55 (9). Σ = [−0.6, 0, 0, 0, 0.1, 0 (−0.7 + 0.7 cancels exactly), 0, 0.35,
/// 0.45, 0.55]: dis-mean with zero_sign none → [−0.6, 0, 0, 0, 0.9, 0, 0, 0.35, 0.45, 0.55].
/// One tensor, so the global and the per-tensor scope agree.
#[test]
fn per_expert_density_by_hand() {
    let (base, experts) = golden_inputs();
    for scope in ["global", "tensor"] {
        let params = json!({"density": [0.2, 0.5, 0.1], "trim_scope": scope});
        assert_close(
            &merge(&params, &base, &experts),
            "layer.bias",
            &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.35, 0.45, 0.55],
            &params.to_string(),
        );
    }
}

/// Per-expert density → per-expert kept counts. Expert t's task vector is non-zero only on its own
/// block of 40 of the 120 entries (distinct magnitudes, so no ties at a threshold), and the blocks
/// do not overlap, so the merged entry is the one kept τ itself and the non-zeros of block t count
/// what expert t kept. density = [0.06, 0.13, 0.27] of n = 120: d·n = 7.2, 15.6, 32.4, so
/// exact (round) keeps 7, 16, 32; mergekit (max(1, floor)) 7, 15, 32; reference (floor + 1) 8, 16, 33.
/// Global and per-tensor scope see the same n (one tensor); a second tensor of zeros doubles the
/// global n: then exact keeps round(14.4, 31.2, 64.8) = 14, 31, 65 capped by the 40 non-zeros.
#[test]
fn per_expert_density_gives_per_expert_kept_counts() {
    let n = 120;
    let taus: Vec<Vec<f32>> = (0..3)
        .map(|t| {
            (0..n)
                .map(|j| {
                    if j / 40 == t {
                        let m = 1.0 + (j % 40) as f32 * 0.125;
                        if j % 3 == 0 { -m } else { m }
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    let (base, experts) = zero_base("a.weight", &[&taus[0], &taus[1], &taus[2]]);
    let counts = |out: &MemModel, name: &str| -> Vec<usize> {
        out[name]
            .data
            .chunks(40)
            .map(|b| b.iter().filter(|v| **v != 0.0).count())
            .collect()
    };
    for scope in ["global", "tensor"] {
        for (rule, expected) in [
            ("exact", [7, 16, 32]),
            ("mergekit", [7, 15, 32]),
            ("reference", [8, 16, 33]),
        ] {
            let params = json!({"density": [0.06, 0.13, 0.27], "count_rule": rule, "trim_scope": scope,
                                "task_weights": [0.5, 2.0, 1.0]});
            let out = merge(&params, &base, &experts);
            assert_eq!(counts(&out, "a.weight"), expected, "{params}");
            // Each kept entry is w_t·τ / w_t = τ itself (normalize), the rest is 0.
            let expected_values: Vec<f64> = (0..n)
                .map(|j| {
                    let t = j / 40;
                    let rank = taus[t].iter().filter(|v| v.abs() > taus[t][j].abs()).count();
                    if rank < expected[t] { f64::from(taus[t][j]) } else { 0.0 }
                })
                .collect();
            assert_close(&out, "a.weight", &expected_values, &params.to_string());
        }
    }
    // Global scope over two tensors: each expert's k comes from its own density over all 240.
    let mut base2 = base.clone();
    base2.insert("b.bias".into(), MemTensor::new(vec![n], vec![0.0; n]));
    let experts2: Vec<MemModel> = experts
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.insert("b.bias".into(), MemTensor::new(vec![n], vec![0.0; n]));
            e
        })
        .collect();
    let params = json!({"density": [0.06, 0.13, 0.27], "trim_scope": "global"});
    let out = merge(&params, &base2, &experts2);
    assert_eq!(counts(&out, "a.weight"), [14, 31, 40], "{params}");
}

/// Per-expert densities, weights (one negative, so that a divisor can vanish) and normalize on
/// the random model with magnitude ties, against the restatement, for every choice, whole and
/// in chunks of 3 (global statistics in parallel chunks included).
#[test]
fn weighted_options_match_a_direct_restatement() {
    let (base, experts) = random_inputs(31, 3);
    let chunked = ExecOptions {
        chunk_elems: 3,
        threads: 2,
        ..Default::default()
    };
    for (densities, weights) in [
        (vec![0.3, 0.5, 0.2], vec![0.5, 0.3, 0.8]),
        (vec![0.6, 0.1, 0.45], vec![0.7, -0.4, 1.3]),
    ] {
        for normalize in [true, false] {
            let w = Weighting {
                densities: densities.clone(),
                weights: weights.clone(),
                normalize,
            };
            for scope in ["global", "tensor"] {
                for election in ["mass", "count"] {
                    for zero_sign in ["none", "reference", "positive"] {
                        for aggregation in ["dis-mean", "dis-sum", "dis-max"] {
                            let o = Options {
                                density: 0.0,
                                lambda: 0.8,
                                aggregation,
                                scope,
                                count_rule: "exact",
                                election,
                                zero_sign,
                            };
                            let expected = reference_weighted_ties(&base, &experts, &o, &w);
                            for opts in [&ExecOptions::default(), &chunked] {
                                let got = merge_in_memory_with(&plugin(), &w.json(&o), 0, Some(&base), &experts, opts)
                                    .unwrap_or_else(|e| panic!("merge with {}: {e}", w.json(&o)));
                                for (name, t) in &expected {
                                    let e: Vec<f64> = t.data.iter().map(|v| f64::from(*v)).collect();
                                    assert_close(
                                        &got,
                                        name,
                                        &e,
                                        &format!("{}, chunks {}", w.json(&o), opts.chunk_elems),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The defaults of the new parameters change nothing: unit weights, normalize true and a density
/// list of equal values give bit for bit the model of the scalar-density recipe.
#[test]
fn default_weights_and_normalize_are_bit_identical() {
    let (base, experts) = random_inputs(41, 3);
    for aggregation in ["dis-mean", "dis-sum", "dis-max"] {
        for zero_sign in ["none", "reference"] {
            let old = json!({"density": 0.3, "aggregation": aggregation, "zero_sign": zero_sign});
            let mut new = old.clone();
            new["density"] = json!([0.3, 0.3, 0.3]);
            new["task_weights"] = json!([1.0, 1.0, 1.0]);
            new["normalize"] = json!(true);
            let a = merge(&old, &base, &experts);
            let b = merge(&new, &base, &experts);
            for (name, t) in &a {
                let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&t.data), bits(&b[name].data), "{new}: {name}");
            }
        }
    }
}

#[test]
fn per_task_lists_of_the_wrong_length_are_errors() {
    let (base, experts) = golden_inputs();
    for params in [
        json!({"density": [0.2, 0.3]}),
        json!({"task_weights": [1.0, 2.0, 3.0, 4.0]}),
    ] {
        let err = merge_in_memory(&plugin(), &params, 0, Some(&base), &experts).expect_err("wrong length");
        let key = params.as_object().unwrap().keys().next().unwrap().clone();
        assert!(
            err.to_string().contains(&key) && err.to_string().contains("per task"),
            "{err}"
        );
    }
}
