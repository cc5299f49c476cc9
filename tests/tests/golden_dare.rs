//! Golden tests of the `dare` plugin, loaded from its built library. The drop masks are rebuilt
//! here from the plugin's documented seed derivation (`expert_seed`, from the plugin's rlib) and
//! the host's draw (`bernoulli_keep`), so every expected value is computed by hand.
//! References: seeds-002-004.md §4.3 (implementations), §4.6 (DARE golden vectors), §4.7 item 8.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{ExecOptions, MemModel, MemTensor, merge_in_memory, merge_in_memory_with};
use mergescope_engine::plugin::Plugin;
use mergescope_engine::rng::bernoulli_keep;
use mergescope_plugin_dare::expert_seed;
use mergescope_tests::{assert_close, assert_documented, load, model};
use serde_json::{Value, json};

fn plugin() -> Plugin {
    load("mergescope_plugin_dare")
}

/// τ1 of seeds-002-004 §4.6.
const TAU1: [f32; 10] = [0.5, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6];

fn merge(params: &Value, seed: u64, base: &MemModel, experts: &[MemModel]) -> MemModel {
    merge_in_memory(&plugin(), params, seed, Some(base), experts).unwrap_or_else(|e| panic!("merge with {params}: {e}"))
}

/// The mask the plugin draws for expert `t` on tensor `name` (true = kept).
fn mask(seed: u64, name: &str, t: usize, n: usize, drop_rate: f64) -> Vec<bool> {
    (0..n as u64)
        .map(|j| bernoulli_keep(expert_seed(seed, name, t), j, 1.0 - drop_rate))
        .collect()
}

/// Three experts on a 4×5 matrix and a 7-vector, with a non-zero base.
fn inputs() -> (MemModel, Vec<MemModel>) {
    let shapes: [(&str, &[usize]); 2] = [("layer.weight", &[4, 5]), ("layer.bias", &[7])];
    let mut base = MemModel::new();
    let mut experts = vec![MemModel::new(); 3];
    for (name, shape) in shapes {
        let n: usize = shape.iter().product();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.61).cos()).collect();
        for (t, e) in experts.iter_mut().enumerate() {
            let d: Vec<f32> = b
                .iter()
                .enumerate()
                .map(|(i, x)| x + ((i * 3 + t * 5) % 11) as f32 * 0.05 - 0.25)
                .collect();
            e.insert(name.to_string(), MemTensor::new(shape.to_vec(), d));
        }
        base.insert(name.to_string(), MemTensor::new(shape.to_vec(), b));
    }
    (base, experts)
}

/// τ_t of tensor `name` in f64, from the f32 inputs (as the host computes it in f32).
fn tau(base: &MemModel, expert: &MemModel, name: &str) -> Vec<f64> {
    expert[name]
        .data
        .iter()
        .zip(&base[name].data)
        .map(|(x, b)| f64::from(x - b))
        .collect()
}

/// Expected DARE + task arithmetic: θ0 + λ·Σ_t r_t·(m_t ⊙ τ_t).
fn expected_sum(
    base: &MemModel,
    experts: &[MemModel],
    name: &str,
    seed: u64,
    p: f64,
    rescale: &str,
    lambda: f64,
) -> Vec<f64> {
    let mut out: Vec<f64> = base[name].data.iter().map(|v| f64::from(*v)).collect();
    for (t, e) in experts.iter().enumerate() {
        let tau = tau(base, e, name);
        let m = mask(seed, name, t, tau.len(), p);
        let dropped: Vec<f64> = tau.iter().zip(&m).map(|(v, k)| if *k { *v } else { 0.0 }).collect();
        let r = match rescale {
            "inverse" => 1.0 / (1.0 - p),
            "l1" => {
                let full: f64 = tau.iter().map(|v| v.abs()).sum();
                let kept: f64 = dropped.iter().map(|v| v.abs()).sum();
                if full < 1e-7 || kept < 1e-7 { 1.0 } else { full / kept }
            }
            _ => 1.0,
        };
        for (o, d) in out.iter_mut().zip(&dropped) {
            *o += lambda * r * d;
        }
    }
    out
}

#[test]
fn plugin_describes_itself() {
    let p = plugin();
    assert_eq!(p.id(), "dare");
    let names: Vec<&str> = p.schema().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["drop_rate", "rescale", "combine", "lambda", "task_weights", "normalize"]
    );
    assert_documented(&p);
}

/// The seed derivation is part of the recorded-merge contract: pin it.
#[test]
fn expert_seed_is_stable() {
    assert_eq!(expert_seed(0, "layer.weight", 0), 0xff67_794a_79d3_e838);
    assert_eq!(expert_seed(42, "layer.weight", 2), 0x0858_0d4c_cc3a_1263);
    assert_ne!(expert_seed(42, "layer.weight", 1), expert_seed(42, "layer.weight", 2));
    assert_ne!(expert_seed(42, "layer.weight", 1), expert_seed(42, "layer.bias", 1));
}

/// §4.6: τ1 with the keep-mask [1,0,1,0,1,0,1,0,1,0] and p = 0.5. The plugin draws its mask from
/// the seed, so search for a merge seed whose mask for this tensor is exactly that pattern
/// (about 1 in 1024 seeds), then compare with the golden vectors.
#[test]
fn golden_vectors_with_the_section_4_6_mask() {
    let pattern = [true, false, true, false, true, false, true, false, true, false];
    let seed = (0..1_000_000u64)
        .find(|s| mask(*s, "layer.bias", 0, 10, 0.5) == pattern)
        .expect("some seed gives the alternating mask");
    let base = model(&[("layer.bias", &[10], &[0.0; 10])]);
    let experts = vec![model(&[("layer.bias", &[10], &TAU1)])];

    let out = merge(
        &json!({"drop_rate": 0.5, "rescale": "inverse", "lambda": 1.0}),
        seed,
        &base,
        &experts,
    );
    let inverse = [1.0, 0.0, 0.2, 0.0, 1.8, 0.0, 0.1, 0.0, -0.8, 0.0];
    assert_close(&out, "layer.bias", &inverse, "1/(1-p) rescale");

    // mergekit L1 rescale: factor ‖τ‖₁/‖m⊙τ‖₁ = 3.75/1.95 = 1.923077.
    let out = merge(&json!({"drop_rate": 0.5, "rescale": "l1"}), seed, &base, &experts);
    let l1 = [
        0.961538, 0.0, 0.192308, 0.0, 1.730769, 0.0, 0.096154, 0.0, -0.769231, 0.0,
    ];
    assert_close(&out, "layer.bias", &l1, "L1 rescale");

    let out = merge(&json!({"drop_rate": 0.5, "rescale": "none"}), seed, &base, &experts);
    let none = [0.5, 0.0, 0.1, 0.0, 0.9, 0.0, 0.05, 0.0, -0.4, 0.0];
    assert_close(&out, "layer.bias", &none, "no rescale");
}

/// Three experts, two tensors, p = 0.3, λ = 0.7: every rescale against the rebuilt masks.
#[test]
fn rebuilt_masks_every_rescale() {
    let (base, experts) = inputs();
    let seed = 12345;
    for rescale in ["inverse", "l1", "none"] {
        let params = json!({"drop_rate": 0.3, "rescale": rescale, "lambda": 0.7});
        let out = merge(&params, seed, &base, &experts);
        for name in ["layer.weight", "layer.bias"] {
            let expected = expected_sum(&base, &experts, name, seed, 0.3, rescale, 0.7);
            assert_close(&out, name, &expected, rescale);
        }
    }
}

/// combine = ties: per coordinate the sign of Σ_t τ̃_t is elected and the non-zero τ̃_t that agree
/// are averaged (no trimming); elected sign 0 gives 0. The election sum is formed in f32 in expert
/// order, as the host does, so that near-cancellations elect the same sign.
#[test]
fn combine_ties_against_rebuilt_masks() {
    let (base, experts) = inputs();
    let (seed, p, lambda) = (99, 0.4, 1.3);
    for (rescale, r) in [("inverse", (1.0 / (1.0 - p)) as f32), ("none", 1.0)] {
        let params = json!({"drop_rate": p, "combine": "ties", "lambda": lambda, "rescale": rescale});
        let out = merge(&params, seed, &base, &experts);
        check_combine_ties(&out, &base, &experts, seed, p, lambda, r);
    }
}

fn check_combine_ties(out: &MemModel, base: &MemModel, experts: &[MemModel], seed: u64, p: f64, lambda: f64, r: f32) {
    for name in ["layer.weight", "layer.bias"] {
        let n = base[name].data.len();
        let dropped: Vec<Vec<f32>> = experts
            .iter()
            .enumerate()
            .map(|(t, e)| {
                let m = mask(seed, name, t, n, p);
                let tau32: Vec<f32> = e[name].data.iter().zip(&base[name].data).map(|(x, b)| x - b).collect();
                tau32
                    .iter()
                    .zip(&m)
                    .map(|(v, k)| if *k { v * r } else { 0.0 })
                    .collect()
            })
            .collect();
        let expected: Vec<f64> = (0..n)
            .map(|j| {
                let total = dropped.iter().fold(0f32, |acc, d| acc + d[j]);
                let s = if total > 0.0 {
                    1.0
                } else if total < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                let agree: Vec<f64> = dropped
                    .iter()
                    .map(|d| f64::from(d[j]))
                    .filter(|v| *v != 0.0 && v.signum() == s)
                    .collect();
                let mean = if agree.is_empty() {
                    0.0
                } else {
                    agree.iter().sum::<f64>() / agree.len() as f64
                };
                f64::from(base[name].data[j]) + lambda * mean
            })
            .collect();
        assert_close(out, name, &expected, &format!("combine ties, r = {r}"));
    }
}

/// p = 0 drops nothing: the result is task arithmetic θ0 + λ·Στ, whatever the seed or rescale.
#[test]
fn drop_rate_zero_is_the_identity() {
    let (base, experts) = inputs();
    for rescale in ["inverse", "l1", "none"] {
        for seed in [0, 7] {
            let out = merge(
                &json!({"drop_rate": 0.0, "rescale": rescale, "lambda": 0.5}),
                seed,
                &base,
                &experts,
            );
            for name in ["layer.weight", "layer.bias"] {
                let mut expected: Vec<f64> = base[name].data.iter().map(|v| f64::from(*v)).collect();
                for e in &experts {
                    for (o, t) in expected.iter_mut().zip(tau(&base, e, name)) {
                        *o += 0.5 * t;
                    }
                }
                assert_close(&out, name, &expected, rescale);
            }
        }
    }
}

/// p = 1 drops everything: θ = θ0, never NaN (FusionBench would give 0/0).
#[test]
fn drop_rate_one_gives_the_base() {
    let (base, experts) = inputs();
    for rescale in ["inverse", "l1", "none"] {
        for combine in ["sum", "ties"] {
            let params = json!({"drop_rate": 1.0, "rescale": rescale, "combine": combine});
            let out = merge(&params, 3, &base, &experts);
            for name in ["layer.weight", "layer.bias"] {
                let expected: Vec<f64> = base[name].data.iter().map(|v| f64::from(*v)).collect();
                assert_close(&out, name, &expected, &params.to_string());
            }
        }
    }
}

#[test]
fn same_seed_same_merge_other_seed_other_merge() {
    let (base, experts) = inputs();
    let params = json!({"drop_rate": 0.5});
    let a = merge(&params, 2024, &base, &experts);
    let b = merge(&params, 2024, &base, &experts);
    let c = merge(&params, 2025, &base, &experts);
    for name in ["layer.weight", "layer.bias"] {
        assert_eq!(
            a[name].data, b[name].data,
            "same seed must give identical output ({name})"
        );
    }
    assert_ne!(
        a["layer.weight"].data, c["layer.weight"].data,
        "another seed must give another mask"
    );
}

/// The drop rate is honoured statistically on a large tensor.
#[test]
fn drop_fraction_matches_the_rate() {
    let n = 20_000;
    let base = model(&[("big.weight", &[n], &vec![0.0; n])]);
    let experts = vec![model(&[("big.weight", &[n], &vec![1.0; n])])];
    let out = merge(&json!({"drop_rate": 0.3, "rescale": "none"}), 5, &base, &experts);
    let kept = out["big.weight"].data.iter().filter(|v| **v != 0.0).count() as f64 / n as f64;
    assert!((kept - 0.7).abs() < 0.02, "kept fraction {kept}, expected about 0.7");
}

/// Masks are drawn per element of the full tensor, so chunking changes nothing (elementwise
/// settings); with the L1 rescale the statistics pass gets each tensor's chunks in order
/// (`CAP_ORDERED_STATISTICS`) and carries its running sums across them, so the norms, and the
/// merged bits, are those of whole tensors for any chunk size and thread count.
#[test]
fn chunked_equals_unchunked() {
    let (base, experts) = inputs();
    let whole_opts = ExecOptions {
        chunk_elems: usize::MAX,
        threads: 1,
        ..Default::default()
    };
    for params in [
        json!({"drop_rate": 0.3}),
        json!({"drop_rate": 0.3, "combine": "ties"}),
        json!({"drop_rate": 0.3, "rescale": "l1"}),
        json!({"drop_rate": [0.6, 0.0, 0.3], "rescale": "l1", "combine": "ties-sum", "task_weights": [0.5, 1.0, 2.0]}),
        json!({"drop_rate": [1.0, 0.5, 0.2], "rescale": "l1", "combine": "ties", "normalize": true}),
    ] {
        let whole = merge_in_memory_with(&plugin(), &params, 77, Some(&base), &experts, &whole_opts)
            .unwrap_or_else(|e| panic!("whole merge with {params}: {e}"));
        for (chunk_elems, threads) in [(1, 2), (3, 2), (7, 1), (8, 2)] {
            let opts = ExecOptions {
                chunk_elems,
                threads,
                ..Default::default()
            };
            let chunked = merge_in_memory_with(&plugin(), &params, 77, Some(&base), &experts, &opts)
                .unwrap_or_else(|e| panic!("merge with {params} in chunks of {chunk_elems}: {e}"));
            for name in ["layer.weight", "layer.bias"] {
                assert_eq!(
                    bits(&chunked[name].data),
                    bits(&whole[name].data),
                    "{params}, chunks of {chunk_elems} on {threads} threads: '{name}'"
                );
            }
        }
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// The l1 norms over a tensor longer than the plugin's mask block (2¹⁶) and the host's chunks,
/// cut at places that are not multiples of either: the sums carried from chunk to chunk give the
/// bits of the whole-tensor merge, and the rescale keeps ‖r·m ⊙ τ‖₁ = ‖τ‖₁ (checked in f64 against
/// the rebuilt masks).
#[test]
fn l1_sums_carry_across_chunks_of_a_long_tensor() {
    let n = 150_001usize;
    let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut base = MemModel::new();
    base.insert("w".into(), MemTensor::new(vec![n], b.clone()));
    let experts: Vec<MemModel> = (0..2)
        .map(|t| {
            let d: Vec<f32> = b
                .iter()
                .enumerate()
                .map(|(i, x)| x + ((i * 7 + t * 3) % 13) as f32 * 1e-3 - 6e-3)
                .collect();
            let mut m = MemModel::new();
            m.insert("w".into(), MemTensor::new(vec![n], d));
            m
        })
        .collect();
    let params = json!({"drop_rate": 0.7, "rescale": "l1"});
    let whole_opts = ExecOptions {
        chunk_elems: usize::MAX,
        ..Default::default()
    };
    let whole = merge_in_memory_with(&plugin(), &params, 5, Some(&base), &experts, &whole_opts).unwrap();
    for chunk_elems in [40_000, 65_537, 1 << 18] {
        let opts = ExecOptions {
            chunk_elems,
            threads: 2,
            ..Default::default()
        };
        let chunked = merge_in_memory_with(&plugin(), &params, 5, Some(&base), &experts, &opts).unwrap();
        assert_eq!(
            bits(&chunked["w"].data),
            bits(&whole["w"].data),
            "chunks of {chunk_elems}"
        );
    }
    // The whole-tensor result itself, against θ0 + Σ_t r_t·m_t ⊙ τ_t rebuilt in f64 from the
    // documented masks, r_t = ‖τ_t‖₁ / ‖m_t ⊙ τ_t‖₁.
    let mut expected: Vec<f64> = b.iter().map(|x| f64::from(*x)).collect();
    for (t, e) in experts.iter().enumerate() {
        let tau = tau(&base, e, "w");
        let kept = mask(5, "w", t, n, 0.7);
        let full: f64 = tau.iter().map(|x| x.abs()).sum();
        let part: f64 = tau.iter().zip(&kept).filter(|(_, k)| **k).map(|(x, _)| x.abs()).sum();
        for ((o, x), k) in expected.iter_mut().zip(&tau).zip(&kept) {
            if *k {
                *o += full / part * x;
            }
        }
    }
    assert_close(&whole, "w", &expected, "l1 rescale over a long tensor");
}

#[test]
fn bad_parameters_are_errors() {
    let (base, experts) = inputs();
    let err = merge_in_memory(&plugin(), &json!({"drop_rate": 1.5}), 0, Some(&base), &experts).expect_err("p > 1");
    assert!(err.to_string().contains("drop_rate"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({"rescale": "l2"}), 0, Some(&base), &experts).expect_err("bad choice");
    assert!(err.to_string().contains("rescale"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({}), 0, None, &experts).expect_err("no base");
    assert!(err.to_string().to_lowercase().contains("base"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Per-expert drop rates, task weights and normalize (mergekit's dare_linear and dare_ties).

/// The rescale factor r_t of one expert, from its rebuilt mask (as the plugin computes it).
fn rescale_factor(tau: &[f64], kept: &[bool], p: f64, rescale: &str) -> f64 {
    match rescale {
        "inverse" => 1.0 / (1.0 - p),
        "l1" => {
            let full: f64 = tau.iter().map(|v| v.abs()).sum();
            let kept: f64 = tau.iter().zip(kept).filter(|(_, k)| **k).map(|(v, _)| v.abs()).sum();
            if full < 1e-7 || kept < 1e-7 { 1.0 } else { full / kept }
        }
        _ => 1.0,
    }
}

/// combine = sum with per-expert p_t and w_t: θ0 + λ·Σ_t w_t·r_t·(m_t ⊙ τ_t), divided by
/// Σ_t w_t = 1.6 with normalize (mergekit's dare_linear), against the rebuilt masks.
#[test]
fn weighted_sum_with_normalize_against_rebuilt_masks() {
    let (base, experts) = inputs();
    let (seed, lambda) = (4242, 0.9);
    let (p, w) = ([0.2, 0.5, 0.7], [0.5, 0.3, 0.8]);
    for rescale in ["inverse", "l1", "none"] {
        for normalize in [false, true] {
            let params = json!({"drop_rate": p, "task_weights": w, "normalize": normalize, "rescale": rescale,
                                "lambda": lambda});
            let out = merge(&params, seed, &base, &experts);
            let divisor = if normalize { w.iter().sum::<f64>() } else { 1.0 };
            for name in ["layer.weight", "layer.bias"] {
                let mut expected: Vec<f64> = base[name].data.iter().map(|v| f64::from(*v)).collect();
                for (t, e) in experts.iter().enumerate() {
                    let tau = tau(&base, e, name);
                    let m = mask(seed, name, t, tau.len(), p[t]);
                    let r = rescale_factor(&tau, &m, p[t], rescale);
                    for ((o, v), k) in expected.iter_mut().zip(&tau).zip(&m) {
                        if *k {
                            *o += lambda * w[t] * r * v / divisor;
                        }
                    }
                }
                assert_close(&out, name, &expected, &params.to_string());
            }
        }
    }
}

/// combine = ties / ties-sum with per-expert p_t and w_t: u_t = (w_t·r_t)·(m_t ⊙ τ_t) (one f32
/// product, as the host's scale), the sign of Σ_t u_t (f32, expert order) elected, then over the
/// agreeing non-zero u_t: ties → Σ u / Σ w; ties-sum → Σ u, or Σ u / Σ w with normalize
/// (mergekit's dare_ties). Elected sign 0 → 0.
#[test]
fn weighted_ties_and_ties_sum_against_rebuilt_masks() {
    let (base, experts) = inputs();
    let (seed, lambda) = (77, 1.1);
    let (p, w) = ([0.3, 0.6, 0.1], [0.5, 1.5, -0.25]);
    for rescale in ["inverse", "l1", "none"] {
        for (combine, normalize) in [("ties", false), ("ties", true), ("ties-sum", false), ("ties-sum", true)] {
            let params = json!({"drop_rate": p, "task_weights": w, "combine": combine, "normalize": normalize,
                                "rescale": rescale, "lambda": lambda});
            let out = merge(&params, seed, &base, &experts);
            let divide = combine == "ties" || normalize;
            for name in ["layer.weight", "layer.bias"] {
                let n = base[name].data.len();
                let u: Vec<Vec<f32>> = experts
                    .iter()
                    .enumerate()
                    .map(|(t, e)| {
                        let tau64 = tau(&base, e, name);
                        let m = mask(seed, name, t, n, p[t]);
                        let factor = (w[t] * rescale_factor(&tau64, &m, p[t], rescale)) as f32;
                        let tau32: Vec<f32> = e[name].data.iter().zip(&base[name].data).map(|(x, b)| x - b).collect();
                        tau32
                            .iter()
                            .zip(&m)
                            .map(|(v, k)| if *k { v * factor } else { 0.0 })
                            .collect()
                    })
                    .collect();
                let expected: Vec<f64> = (0..n)
                    .map(|j| {
                        let total = u.iter().fold(0f32, |acc, d| acc + d[j]);
                        let s = f64::from(total).signum() * f64::from(u8::from(total != 0.0));
                        let (mut sum, mut weight) = (0f64, 0f64);
                        for (t, d) in u.iter().enumerate() {
                            let v = f64::from(d[j]);
                            if v != 0.0 && v.signum() == s {
                                sum += v;
                                weight += w[t];
                            }
                        }
                        let merged = if divide && weight != 0.0 { sum / weight } else { sum };
                        f64::from(base[name].data[j]) + lambda * merged
                    })
                    .collect();
                assert_close(&out, name, &expected, &params.to_string());
            }
        }
    }
}

/// dare_linear's expected value: with the inverse rescale E[r_t·m_t ⊙ τ_t] = τ_t, so with
/// normalize E[θ] = θ0 + Σ_t w_t·τ_t / Σ_t w_t. θ0 = 0, τ1 = [1, −2, 0.5, 4], τ2 = [2, 1, −1, 0],
/// τ3 = [−1, 3, 2, 1], w = [0.5, 0.3, 0.8] (Σ w = 1.6), p = [0.2, 0.5, 0.4]:
///   index 0: (0.5 + 0.6 − 0.8)/1.6 = 0.1875;  index 1: (−1 + 0.3 + 2.4)/1.6 = 1.0625;
///   index 2: (0.25 − 0.3 + 1.6)/1.6 = 0.96875; index 3: (2 + 0 + 0.8)/1.6 = 1.75.
/// The mean over 1000 seeds must be within 4.5 standard errors, the variance of one draw being
/// Σ_t (w_t/Σw)²·τ_t²·p_t/(1 − p_t) (e.g. index 1: 0.0977·4·0.25 + 0.0352·1·1 + 0.25·9·0.667 ≈
/// 1.63, a standard error of 0.040).
#[test]
fn dare_linear_expected_value_over_many_seeds() {
    let taus: [[f32; 4]; 3] = [[1.0, -2.0, 0.5, 4.0], [2.0, 1.0, -1.0, 0.0], [-1.0, 3.0, 2.0, 1.0]];
    let base = model(&[("v", &[4], &[0.0; 4])]);
    let experts: Vec<MemModel> = taus.iter().map(|t| model(&[("v", &[4], t)])).collect();
    let (p, w) = ([0.2, 0.5, 0.4], [0.5, 0.3, 0.8]);
    let expected = [0.1875, 1.0625, 0.96875, 1.75];
    let params = json!({"drop_rate": p, "task_weights": w, "normalize": true, "rescale": "inverse"});
    let dare = plugin();
    let seeds = 1000;
    let mut mean = [0f64; 4];
    for seed in 0..seeds {
        let out = merge_in_memory(&dare, &params, seed, Some(&base), &experts).unwrap();
        for (m, v) in mean.iter_mut().zip(&out["v"].data) {
            *m += f64::from(*v) / seeds as f64;
        }
    }
    let total: f64 = w.iter().sum();
    for j in 0..4 {
        let variance: f64 = (0..3)
            .map(|t| (w[t] / total).powi(2) * f64::from(taus[t][j]).powi(2) * p[t] / (1.0 - p[t]))
            .sum();
        let bound = 4.5 * (variance / seeds as f64).sqrt();
        assert!(
            (mean[j] - expected[j]).abs() <= bound,
            "index {j}: mean over {seeds} seeds {}, expected {} ± {bound}",
            mean[j],
            expected[j]
        );
    }
}

/// Per-expert drop rates → per-expert kept fractions. Expert t's τ is 1 on its own block of
/// 20 000 of the 60 000 entries and 0 elsewhere, so block t of the merge shows expert t's mask
/// alone: with p = [0.1, 0.5, 0.8] about 90 %, 50 % and 20 % of each block is kept (a standard
/// error of at most 0.0035; the bound 0.02 is over 5 of them), each kept entry being w_t·1 (no
/// rescale), or w_t/Σw with normalize (w = [2, 1, 0.5], Σw = 3.5).
#[test]
fn per_expert_drop_rate_gives_per_expert_kept_fractions() {
    let block = 20_000;
    let n = 3 * block;
    let base = model(&[("big.weight", &[n], &vec![0.0; n])]);
    let experts: Vec<MemModel> = (0..3)
        .map(|t| {
            let d: Vec<f32> = (0..n).map(|j| if j / block == t { 1.0 } else { 0.0 }).collect();
            model(&[("big.weight", &[n], &d)])
        })
        .collect();
    let (p, w) = ([0.1, 0.5, 0.8], [2.0, 1.0, 0.5]);
    for normalize in [false, true] {
        for combine in ["sum", "ties-sum"] {
            let params = json!({"drop_rate": p, "task_weights": w, "rescale": "none", "normalize": normalize,
                                "combine": combine});
            let out = merge(&params, 11, &base, &experts);
            for (t, chunk) in out["big.weight"].data.chunks(block).enumerate() {
                let kept = chunk.iter().filter(|v| **v != 0.0).count() as f64 / block as f64;
                assert!(
                    (kept - (1.0 - p[t])).abs() < 0.02,
                    "{params}: expert {t} kept {kept}, expected about {}",
                    1.0 - p[t]
                );
                let value = if !normalize {
                    w[t]
                } else if combine == "sum" {
                    w[t] / 3.5
                } else {
                    1.0 // alone in its block: w_t·1 / w_t
                };
                assert!(
                    chunk.iter().all(|v| *v == 0.0 || (f64::from(*v) - value).abs() < 1e-6),
                    "{params}: expert {t}'s kept entries are not {value}"
                );
            }
        }
    }
}

/// The defaults of the new parameters change nothing: a list of equal drop rates, unit weights
/// and normalize false give bit for bit the model of the scalar recipe, for every combine and
/// rescale (combine = ties was the plain mean of the agreeing entries, which it stays).
#[test]
fn default_weights_and_normalize_are_bit_identical() {
    let (base, experts) = inputs();
    for combine in ["sum", "ties"] {
        for rescale in ["inverse", "l1", "none"] {
            let old = json!({"drop_rate": 0.4, "combine": combine, "rescale": rescale, "lambda": 0.8});
            let mut new = old.clone();
            new["drop_rate"] = json!([0.4, 0.4, 0.4]);
            new["task_weights"] = json!(1.0);
            new["normalize"] = json!(false);
            let a = merge(&old, 5, &base, &experts);
            let b = merge(&new, 5, &base, &experts);
            for (name, t) in &a {
                let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&t.data), bits(&b[name].data), "{new}: {name}");
            }
        }
    }
}

/// A per-expert drop rate of 1 leaves that expert out (its weight still counts in dare_linear's
/// normalize divisor, as in mergekit); all at 1 give the base.
#[test]
fn per_expert_drop_rate_one_leaves_the_expert_out() {
    let (base, experts) = inputs();
    let params = json!({"drop_rate": [1.0, 0.0, 1.0], "task_weights": [1.0, 2.0, 1.0], "normalize": true});
    let out = merge(&params, 1, &base, &experts);
    for name in ["layer.weight", "layer.bias"] {
        let expected: Vec<f64> = base[name]
            .data
            .iter()
            .zip(tau(&base, &experts[1], name))
            .map(|(b, t)| f64::from(*b) + 2.0 * t / 4.0)
            .collect();
        assert_close(&out, name, &expected, &params.to_string());
    }
}

#[test]
fn per_task_lists_of_the_wrong_length_are_errors() {
    let (base, experts) = inputs();
    for params in [
        json!({"drop_rate": [0.2, 0.3]}),
        json!({"task_weights": [1.0, 2.0, 3.0, 4.0]}),
    ] {
        let err = merge_in_memory(&plugin(), &params, 0, Some(&base), &experts).expect_err("wrong length");
        let key = params.as_object().unwrap().keys().next().unwrap().clone();
        assert!(
            err.to_string().contains(&key) && err.to_string().contains("per task"),
            "{err}"
        );
    }
    let err =
        merge_in_memory(&plugin(), &json!({"combine": "ties_sum"}), 0, Some(&base), &experts).expect_err("bad combine");
    assert!(
        err.to_string().contains("combine") && err.to_string().contains("ties-sum"),
        "{err}"
    );
}
