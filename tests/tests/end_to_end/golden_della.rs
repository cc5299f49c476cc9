//! Golden tests of the `della` plugin (mergekit 0.1.5's `della` and `della_linear`), loaded from
//! its built library. DELLA's drops are random, so the tests check (a) the keep probabilities,
//! from kept fractions over many entries, (b) the expectation of the merge, from means over many
//! independent draws, and (c) the deterministic parts exactly: the L1 rescale, the sign
//! consensus and the divisor, worked by hand from mergekit's generalized_task_arithmetic.py and
//! sparsify.py.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{ExecOptions, MemModel, merge_in_memory, merge_in_memory_with};
use mergescope_tests::{assert_close, assert_contains, assert_documented, load, model};
use serde_json::{Value, json};

const LIB: &str = "mergescope_plugin_della";

fn merge(params: &Value, seed: u64, base: &MemModel, experts: &[MemModel]) -> Result<MemModel, String> {
    merge_in_memory(&load(LIB), params, seed, Some(base), experts).map_err(|e| e.to_string())
}

fn one(name: &str, shape: &[usize], values: &[f32]) -> MemModel {
    model(&[(name, shape, values)])
}

fn data<'a>(m: &'a MemModel, name: &str) -> &'a [f32] {
    &m.get(name).expect("tensor in the output").data
}

/// Binomial check: `kept` of `n` draws with mean probability `p` (and summed variance `var`)
/// lies within 4 standard deviations.
fn assert_fraction(kept: usize, n: usize, p: f64, var: f64, context: &str) {
    let frac = kept as f64 / n as f64;
    let sd = var.sqrt() / n as f64;
    assert!(
        (frac - p).abs() <= 4.0 * sd,
        "{context}: kept {frac:.4} of {n}, expected {p:.4} ± {:.4} (4 sd)",
        4.0 * sd
    );
}

#[test]
fn della_describes_itself() {
    let p = load(LIB);
    assert_documented(&p);
    assert_eq!(p.id(), "della");
    for word in ["mergekit", "della_linear", "per row", "L1", "(0, 1)", "2406.11617"] {
        assert!(p.info.help.contains(word), "help should mention {word}");
    }
}

/// (a) One row of 20 000 entries with |τ| increasing, so entry j has rank j and keep probability
/// p_j = (d − ε) + 2ε·j/19 999. Over 10 seeds, the kept fraction of the lowest-ranked 10 % is
/// the mean of their p_j, (d − ε) + 2ε·(1 999/2)/19 999 ≈ d − 0.9·ε, that of the highest 10 %
/// ≈ d + 0.9·ε, and that of all entries d.
#[test]
fn keep_probabilities_rise_with_the_magnitude_rank() {
    const M: usize = 20_000;
    let (d, eps) = (0.5, 0.2);
    let tau: Vec<f32> = (0..M).map(|j| (j + 1) as f32 * 1e-3).collect();
    let base = one("w", &[1, M], &vec![0.0; M]);
    let expert = one("w", &[1, M], &tau);
    let params = json!({"density": d, "epsilon": eps, "rescale": false, "normalize": false, "consensus": "none"});
    let p = |j: usize| d - eps + 2.0 * eps * j as f64 / (M - 1) as f64;
    let slices = [
        (0..M / 10, "lowest 10 %"),
        (M - M / 10..M, "highest 10 %"),
        (0..M, "all"),
    ];
    let mut kept = [0usize; 3];
    let seeds = 10u64;
    for seed in 0..seeds {
        let out = merge(&params, seed, &base, std::slice::from_ref(&expert)).unwrap();
        let out = data(&out, "w");
        for (j, (o, t)) in out.iter().zip(&tau).enumerate() {
            // Without rescale an entry is τ_j (kept) or 0 (dropped).
            assert!(*o == 0.0 || o == t, "entry {j}: {o} is neither 0 nor τ = {t}");
        }
        for (k, (range, _)) in slices.iter().enumerate() {
            kept[k] += range.clone().filter(|j| out[*j] != 0.0).count();
        }
    }
    for (k, (range, context)) in slices.iter().enumerate() {
        let n = range.len() * seeds as usize;
        let mean: f64 = range.clone().map(p).sum::<f64>() / range.len() as f64;
        let var: f64 = range.clone().map(|j| p(j) * (1.0 - p(j))).sum::<f64>() * seeds as f64;
        assert_fraction(kept[k], n, mean, var, context);
    }
    // The slices' means are where the formula puts them.
    let low: f64 = (0..M / 10).map(p).sum::<f64>() / (M / 10) as f64;
    assert!((low - (d - eps * (1.0 - 2.0 * 999.5 / 19_999.0))).abs() < 1e-12);
}

/// Ranks are per row (dimension 1), not over the tensor: row 0 holds small entries and row 1
/// large ones, yet the largest 10 % of row 0 are kept with ≈ d + 0.9·ε, as those of row 1.
#[test]
fn ranks_are_taken_per_row() {
    const M: usize = 10_000;
    let (d, eps) = (0.4, 0.3);
    let mut tau: Vec<f32> = (0..M).map(|j| (j + 1) as f32 * 1e-4).collect();
    tau.extend((0..M).map(|j| 10.0 + (j + 1) as f32 * 1e-3));
    let base = one("m.weight", &[2, M], &vec![0.0; 2 * M]);
    let expert = one("m.weight", &[2, M], &tau);
    let params = json!({"density": d, "epsilon": eps, "rescale": false, "normalize": false, "consensus": "none"});
    let p = |k: usize| d - eps + 2.0 * eps * k as f64 / (M - 1) as f64;
    let seeds = 8u64;
    let mut kept = [0usize; 4];
    for seed in 0..seeds {
        let out = merge(&params, seed, &base, std::slice::from_ref(&expert)).unwrap();
        let out = data(&out, "m.weight");
        for (r, row) in out.chunks(M).enumerate() {
            kept[2 * r] += row[..M / 10].iter().filter(|v| **v != 0.0).count();
            kept[2 * r + 1] += row[M - M / 10..].iter().filter(|v| **v != 0.0).count();
        }
    }
    let n = M / 10 * seeds as usize;
    for (i, range) in [0..M / 10, M - M / 10..M, 0..M / 10, M - M / 10..M]
        .into_iter()
        .enumerate()
    {
        let mean = range.clone().map(p).sum::<f64>() / range.len() as f64;
        let var = range.map(|k| p(k) * (1.0 - p(k))).sum::<f64>() * seeds as f64;
        assert_fraction(kept[i], n, mean, var, &format!("row {}, slice {}", i / 2, i % 2));
    }
}

/// (b) Without rescale, E[θ] = θ0 + λ·Σ_t w_t·p_t,j·τ_t,j (della_linear, normalize false). A
/// [1 000, 4] tensor whose rows are all the same is 1 000 independent draws of one row, so the
/// mean over rows and 4 seeds estimates the expectation; per column, 4 sd of that mean.
#[test]
fn the_merge_is_unbiased_for_the_keep_probabilities() {
    const ROWS: usize = 1_000;
    let theta0 = [0.5f32, -1.0, 2.0, 0.0];
    let tau_a = [0.4f32, -0.1, 0.2, 0.8]; // ranks 2, 0, 1, 3
    let tau_b = [-0.3f32, 0.6, 0.9, -0.05]; // ranks 1, 2, 3, 0
    let (d, eps) = ([0.5, 0.6], [0.3, 0.15]);
    let (w, lambda) = ([2.0, 0.5], 0.75);
    let rank_a = [2.0, 0.0, 1.0, 3.0];
    let rank_b = [1.0, 2.0, 3.0, 0.0];
    let p = |t: usize, r: f64| d[t] - eps[t] + 2.0 * eps[t] * r / 3.0;
    let tile = |row: &[f32]| -> Vec<f32> { row.iter().copied().cycle().take(4 * ROWS).collect() };
    let base = one("w", &[ROWS, 4], &tile(&theta0));
    let a: Vec<f32> = theta0.iter().zip(&tau_a).map(|(x, t)| x + t).collect();
    let b: Vec<f32> = theta0.iter().zip(&tau_b).map(|(x, t)| x + t).collect();
    let experts = [one("w", &[ROWS, 4], &tile(&a)), one("w", &[ROWS, 4], &tile(&b))];
    let params = json!({
        "density": d, "epsilon": eps, "task_weights": w, "lambda": lambda,
        "rescale": false, "normalize": false, "consensus": "none"
    });
    let seeds = 4u64;
    let mut sum = [0f64; 4];
    for seed in 0..seeds {
        let out = merge(&params, 100 + seed, &base, &experts).unwrap();
        for row in data(&out, "w").chunks(4) {
            for (s, v) in sum.iter_mut().zip(row) {
                *s += f64::from(*v);
            }
        }
    }
    let n = (ROWS as u64 * seeds) as f64;
    for c in 0..4 {
        let (pa, pb) = (p(0, rank_a[c]), p(1, rank_b[c]));
        let (ta, tb) = (f64::from(tau_a[c]), f64::from(tau_b[c]));
        let expected = f64::from(theta0[c]) + lambda * (w[0] * pa * ta + w[1] * pb * tb);
        let var = lambda * lambda * (w[0] * w[0] * ta * ta * pa * (1.0 - pa) + w[1] * w[1] * tb * tb * pb * (1.0 - pb));
        let mean = sum[c] / n;
        let sd = (var / n).sqrt();
        assert!(
            (mean - expected).abs() <= 4.0 * sd + 1e-6,
            "column {c}: mean {mean}, expected {expected} ± {}",
            4.0 * sd
        );
    }
}

/// (c) With rescale, the pruned task vector keeps its L1 norm exactly: with one expert,
/// normalize false, ‖θ − θ0‖₁ = ‖τ‖₁·|w|·λ, and every kept entry is τ_j·w·λ·‖τ‖₁/‖m ⊙ τ‖₁.
#[test]
fn the_rescale_keeps_the_l1_norm() {
    let n = 4 * 50;
    let theta0: Vec<f32> = (0..n).map(|j| ((j * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let tau: Vec<f32> = (0..n)
        .map(|j| ((j * 37 % 101) as f32 - 50.0) * 0.01 + if j % 2 == 0 { 0.003 } else { -0.003 })
        .collect();
    let expert: Vec<f32> = theta0.iter().zip(&tau).map(|(a, b)| a + b).collect();
    let l1_tau: f64 = tau.iter().map(|v| f64::from(v.abs())).sum();
    let (w, lambda) = (0.5, 2.5);
    for consensus in ["none", "sign"] {
        for seed in [1u64, 2, 3] {
            let params = json!({
                "density": 0.4, "epsilon": 0.2, "task_weights": w, "lambda": lambda,
                "normalize": false, "consensus": consensus
            });
            let out = merge(
                &params,
                seed,
                &one("w", &[4, 50], &theta0),
                &[one("w", &[4, 50], &expert)],
            )
            .unwrap();
            let out = data(&out, "w");
            // The merged delta (θ − θ0, in f64 from the f32 result).
            let delta: Vec<f64> = out
                .iter()
                .zip(&theta0)
                .map(|(o, b)| f64::from(*o) - f64::from(*b))
                .collect();
            let l1: f64 = delta.iter().map(|v| v.abs()).sum();
            let want = l1_tau * w * lambda;
            assert!(
                ((l1 - want) / want).abs() < 1e-5,
                "{consensus}, seed {seed}: ‖θ − θ0‖₁ = {l1}, expected {want}"
            );
            // One factor for every kept entry: the L1 ratio.
            let kept: Vec<usize> = (0..n).filter(|j| out[*j] != theta0[*j]).collect();
            assert!(kept.len() > n / 5 && kept.len() < n * 4 / 5, "kept {}", kept.len());
            let kept_l1: f64 = kept.iter().map(|j| f64::from(tau[*j].abs())).sum();
            let factor = w * lambda * l1_tau / kept_l1;
            for j in &kept {
                let expected = f64::from(tau[*j]) * factor;
                assert!(
                    (delta[*j] - expected).abs() < 1e-5,
                    "{consensus}, seed {seed}, entry {j}: {} vs {expected}",
                    delta[*j]
                );
            }
        }
    }
}

/// (c) Sign consensus and the divisor, deterministic with density 1 (mergekit's della_magprune
/// returns τ unchanged then). θ0 = 1, τ_A = (1, 2, 1, 0), τ_B = (−3, −1, 3, 0), w = (2, 1):
/// weighted A' = (2, 4, 2, 0), B' = (−3, −1, 3, 0), Σ = (−1, 3, 5, 0), elected (−, +, +, +).
///   entry 0: only B agrees: −3 / 1      entry 1: only A: 4 / 2
///   entry 2: both: 5 / 3                entry 3: nothing agrees (zeros never do): 0 / 1
/// With λ = 0.5 and normalize: θ = 1 + 0.5·(−3, 2, 5/3, 0); without: 1 + 0.5·(−3, 4, 5, 0).
/// della_linear (no consensus): (A' + B')·λ / Σw = 0.5·(−1, 3, 5, 0)/3, or ·1 without normalize.
#[test]
fn sign_consensus_and_the_divisor_follow_mergekit() {
    let base = one("w", &[4], &[1.0; 4]);
    let experts = [
        one("w", &[4], &[2.0, 3.0, 2.0, 1.0]),
        one("w", &[4], &[-2.0, 0.0, 4.0, 1.0]),
    ];
    let common = |normalize: bool, consensus: &str| json!({"density": 1.0, "task_weights": [2.0, 1.0], "lambda": 0.5, "normalize": normalize, "consensus": consensus});
    let cases: [(bool, &str, [f64; 4]); 4] = [
        (true, "sign", [1.0 - 1.5, 1.0 + 1.0, 1.0 + 5.0 / 6.0, 1.0]),
        (false, "sign", [1.0 - 1.5, 1.0 + 2.0, 1.0 + 2.5, 1.0]),
        (true, "none", [1.0 - 0.5 / 3.0, 1.0 + 0.5, 1.0 + 2.5 / 3.0, 1.0]),
        (false, "none", [1.0 - 0.5, 1.0 + 1.5, 1.0 + 2.5, 1.0]),
    ];
    for (normalize, consensus, expected) in cases {
        for seed in [0, 9] {
            let out = merge(&common(normalize, consensus), seed, &base, &experts).unwrap();
            assert_close(
                &out,
                "w",
                &expected,
                &format!("normalize {normalize}, consensus {consensus}"),
            );
        }
    }
    // The defaults are della's: consensus sign and normalize true.
    let out = merge(
        &json!({"density": 1.0, "task_weights": [2.0, 1.0], "lambda": 0.5}),
        0,
        &base,
        &experts,
    )
    .unwrap();
    assert_close(&out, "w", &cases[0].2, "defaults");
}

/// Sign consensus after pruning: two experts of opposite signs everywhere, the larger-weighted
/// one positive. Every entry where A survives is A's (B never agrees with the elected +); where
/// A was dropped and B kept, the entry is B's alone; where both were dropped, θ0.
#[test]
fn sign_consensus_drops_the_disagreeing_expert_after_pruning() {
    let n = 400;
    let base = one("w", &[n], &vec![0.0; n]);
    let a = one("w", &[n], &vec![1.0; n]);
    let b = one("w", &[n], &vec![-0.5; n]);
    let params = json!({"density": 0.5, "epsilon": 0.1, "rescale": false, "normalize": true, "consensus": "sign"});
    let out = merge(&params, 5, &base, &[a, b]).unwrap();
    let out = data(&out, "w");
    let (mut only_a, mut only_b, mut none) = (0, 0, 0);
    for v in out {
        if *v == 1.0 {
            only_a += 1;
        } else if *v == -0.5 {
            only_b += 1;
        } else if *v == 0.0 {
            none += 1;
        } else {
            panic!("{v} is neither τ_A, τ_B nor 0: the experts were mixed");
        }
    }
    assert!(
        only_a > n / 4 && only_b > n / 10 && none > n / 10,
        "{only_a} {only_b} {none}"
    );
}

#[test]
fn the_same_seed_gives_the_same_merge_and_another_seed_another() {
    let n = 300;
    let base = model(&[("a", &[3, 100], &vec![0.0; n]), ("b", &[n], &vec![1.0; n])]);
    let values: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin()).collect();
    let shifted: Vec<f32> = values.iter().map(|v| v + 1.0).collect();
    let experts = [
        model(&[("a", &[3, 100], &values), ("b", &[n], &shifted)]),
        model(&[("a", &[3, 100], &shifted), ("b", &[n], &values)]),
    ];
    let params = json!({"density": 0.5});
    let first = merge(&params, 42, &base, &experts).unwrap();
    let again = merge(&params, 42, &base, &experts).unwrap();
    let other = merge(&params, 43, &base, &experts).unwrap();
    for name in ["a", "b"] {
        assert_eq!(data(&first, name), data(&again, name), "tensor {name}, same seed");
        assert_ne!(data(&first, name), data(&other, name), "tensor {name}, another seed");
    }
    // Threads and chunk sizes do not matter: tensors are merged whole.
    let opts = ExecOptions {
        threads: 1,
        chunk_elems: 7,
        ..ExecOptions::default()
    };
    let small = merge_in_memory_with(&load(LIB), &params, 42, Some(&base), &experts, &opts).unwrap();
    for name in ["a", "b"] {
        assert_eq!(
            data(&first, name),
            data(&small, name),
            "tensor {name}, 1 thread, chunks of 7"
        );
    }
    // A tensor's masks depend on its name, not on the other tensors of the model.
    let alone = merge(
        &params,
        42,
        &one("a", &[3, 100], &vec![0.0; n]),
        &[one("a", &[3, 100], &values), one("a", &[3, 100], &shifted)],
    )
    .unwrap();
    assert_eq!(data(&first, "a"), data(&alone, "a"));
    assert_eq!(
        load(LIB).info.capabilities & mergescope_plugin_api::abi::CAP_ELEMENTWISE,
        0
    );
}

#[test]
fn an_epsilon_too_large_for_the_density_is_refused_naming_the_expert() {
    let base = one("w", &[2], &[0.0, 0.0]);
    let experts = [one("w", &[2], &[1.0, 2.0]), one("w", &[2], &[2.0, 1.0])];
    let err = merge(&json!({"density": [0.5, 0.9], "epsilon": 0.15}), 0, &base, &experts).unwrap_err();
    assert_contains(&err, &["expert 1", "density 0.9", "epsilon 0.15", "(0, 1)", "below"]);
    let err = merge(&json!({"density": 0.2, "epsilon": 0.2}), 0, &base, &experts).unwrap_err();
    assert_contains(&err, &["expert 0", "density 0.2", "epsilon 0.2"]);
    // A negative epsilon is refused by the schema.
    let err = merge(&json!({"epsilon": -0.1}), 0, &base, &experts).unwrap_err();
    assert_contains(&err, &["epsilon", "-0.1"]);
    // density 1 keeps everything and, as in mergekit, never checks epsilon.
    assert!(merge(&json!({"density": 1.0, "epsilon": 0.5}), 0, &base, &experts).is_ok());
}

#[test]
fn unknown_parameters_and_a_missing_base_are_refused() {
    let base = one("w", &[2], &[0.0, 0.0]);
    let experts = [one("w", &[2], &[1.0, 2.0])];
    let err = merge(&json!({"epsilom": 0.1}), 0, &base, &experts).unwrap_err();
    assert_contains(&err, &["epsilom", "epsilon"]);
    let err = merge(&json!({"weight": 0.5}), 0, &base, &experts).unwrap_err();
    assert_contains(&err, &["'weight'", "task_weights"]);
    let err = merge_in_memory(&load(LIB), &json!({}), 0, None, &experts)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["della", "base"]);
}
