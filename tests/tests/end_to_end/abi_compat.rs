//! ABI 1.2 keeps 1.1 plugins working: a plugin built for 1.1 (`tests/plugins/abi-1-1`) calls the
//! fused operations through the fields of the core host table, and must load and give the same
//! numbers as the 1.2 plugins, which take those operations from host extensions; and the host's
//! worker threads (the parallel extension) must not change a single bit of a merge.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{ExecOptions, MemModel, merge_in_memory, merge_in_memory_with};
use mergescope_engine::rng;
use mergescope_tests::{assert_close, load, model};
use serde_json::json;

/// Deterministic pseudo-random values in (−1, 1) with repeats (so magnitude ties occur), and
/// exact zeros.
fn values(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let u = rng::uniform(seed, i);
            if u < 0.05 {
                0.0
            } else {
                ((u * 2000.0).floor() / 1000.0 - 1.0) as f32
            }
        })
        .collect()
}

/// A base and three experts with a vector, a small matrix and a matrix large enough that TIES's
/// per-tensor statistics are split over the host's threads (≥ 2·2¹⁸ elements).
fn inputs() -> (MemModel, Vec<MemModel>) {
    let shapes: [(&str, &[usize]); 3] = [
        ("bias", &[37]),
        ("small.weight", &[40, 30]),
        ("big.weight", &[1024, 640]),
    ];
    let make = |seed: u64| {
        let owned: Vec<(String, Vec<usize>, Vec<f32>)> = shapes
            .iter()
            .enumerate()
            .map(|(i, (n, s))| {
                (
                    (*n).to_owned(),
                    s.to_vec(),
                    values(seed * 10 + i as u64, s.iter().product()),
                )
            })
            .collect();
        let refs: Vec<(&str, &[usize], &[f32])> = owned
            .iter()
            .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
            .collect();
        model(&refs)
    };
    (make(1), vec![make(2), make(3), make(4)])
}

fn bitwise_equal(a: &MemModel, b: &MemModel, context: &str) {
    assert_eq!(a.len(), b.len(), "{context}: tensor count");
    for (name, t) in a {
        let u = &b[name];
        assert_eq!(t.shape, u.shape, "{context}: {name}: shape");
        let first = t.data.iter().zip(&u.data).position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(
            first.is_none(),
            "{context}: {name} differs at {first:?}: {:?} vs {:?}",
            first.map(|i| t.data[i]),
            first.map(|i| u.data[i])
        );
    }
}

#[test]
fn a_1_1_plugin_loads_on_the_1_2_host() {
    let p = load("mstest_abi_1_1");
    assert_eq!(p.info.abi, "1.1");
    assert_eq!(p.id(), "mstest-abi-1-1");
}

#[test]
fn ties_through_the_core_table_equals_ties_through_the_extension() {
    let old = load("mstest_abi_1_1");
    let ties = load("mergescope_plugin_ties");
    let (base, experts) = inputs();
    for (density, lambda) in [(0.2, 1.0), (0.1, 0.7), (0.5, 1.3)] {
        let a = merge_in_memory(
            &old,
            &json!({"mode": "ties", "density": density, "lambda": lambda}),
            0,
            Some(&base),
            &experts,
        )
        .unwrap();
        let b = merge_in_memory(
            &ties,
            &json!({"density": density, "lambda": lambda, "trim_scope": "tensor", "count_rule": "exact",
                    "election": "mass", "zero_sign": "none", "aggregation": "dis-mean"}),
            0,
            Some(&base),
            &experts,
        )
        .unwrap();
        bitwise_equal(&a, &b, &format!("density {density}, λ {lambda}"));
    }
}

#[test]
fn bernoulli_masks_through_the_core_table_are_the_engine_draws() {
    let old = load("mstest_abi_1_1");
    let n = 1000;
    let base = model(&[("w", &[n], &vec![0.0; n])]);
    let taus = [values(7, n), values(8, n)];
    let experts: Vec<MemModel> = taus.iter().map(|t| model(&[("w", &[n], t)])).collect();
    let (seed, p, lambda) = (42u64, 0.3, 0.9);
    let out = merge_in_memory(
        &old,
        &json!({"mode": "dare", "drop_rate": p, "lambda": lambda}),
        seed,
        Some(&base),
        &experts,
    )
    .unwrap();
    // θ = θ0 + λ/(1 − p)·Σ_t m_t ⊙ τ_t, m_t drawn by the engine's counter-based generator with
    // seed + t at each element's index.
    let expected: Vec<f64> = (0..n)
        .map(|j| {
            taus.iter()
                .enumerate()
                .filter(|(t, _)| rng::bernoulli_keep(seed + *t as u64, j as u64, 1.0 - p))
                .map(|(_, tau)| f64::from(tau[j]) * lambda / (1.0 - p))
                .sum()
        })
        .collect();
    assert_close(&out, "w", &expected, "dare through the core table");
    let kept = (0..n).filter(|j| rng::bernoulli_keep(seed, *j as u64, 1.0 - p)).count();
    assert!((600..800).contains(&kept), "about 70 % kept: {kept}");
}

#[test]
fn low_rank_through_the_core_table_golden() {
    // τ = [[2, 2], [1, −1]] has σ = 2√2 with v = (1, 1)/√2 and √2: rank 1 keeps [[2, 2], [0, 0]].
    let old = load("mstest_abi_1_1");
    let base = model(&[("m.weight", &[2, 2], &[1.0, 1.0, 1.0, 1.0])]);
    let expert = model(&[("m.weight", &[2, 2], &[3.0, 3.0, 2.0, 0.0])]);
    let out = merge_in_memory(&old, &json!({"mode": "low-rank"}), 0, Some(&base), &[expert]).unwrap();
    assert_close(&out, "m.weight", &[3.0, 3.0, 1.0, 1.0], "rank-1 approximation");
}

#[test]
fn the_hosts_threads_do_not_change_a_bit_of_a_merge() {
    // TIES with per-tensor trimming splits its statistics over the threads the host lends it
    // (the parallel extension), as many as the merge's worker threads.
    let ties = load("mergescope_plugin_ties");
    let (base, experts) = inputs();
    let params = json!({"density": 0.2, "trim_scope": "tensor", "zero_sign": "reference"});
    let with = |threads: usize| {
        let opts = ExecOptions {
            threads,
            ..ExecOptions::default()
        };
        merge_in_memory_with(&ties, &params, 0, Some(&base), &experts, &opts).unwrap()
    };
    let one = with(1);
    for threads in [2, 3, 8] {
        bitwise_equal(&one, &with(threads), &format!("{threads} threads against 1"));
    }
}

#[test]
fn chunked_statistics_do_not_depend_on_the_threads() {
    // Model Stock sums its norms and dot products over chunks (here 10,000 elements, so the
    // 655,360-element matrix is 66 chunks) in parallel; the partial sums are added in offset
    // order, so 1, 2, 3 or 8 threads give the same bits.
    let stock = load("mergescope_plugin_model_stock");
    let (base, experts) = inputs();
    let with = |threads: usize| {
        let opts = ExecOptions {
            threads,
            chunk_elems: 10_000,
            ..ExecOptions::default()
        };
        merge_in_memory_with(&stock, &json!({}), 0, Some(&base), &experts, &opts).unwrap()
    };
    let one = with(1);
    for threads in [2, 3, 8] {
        bitwise_equal(
            &one,
            &with(threads),
            &format!("model-stock, {threads} threads against 1"),
        );
    }
}
