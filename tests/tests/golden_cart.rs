//! Golden tests of the `cart` plugin, loaded from its built library.
//! References: seeds-000-001.md §1.2 (Algorithm 1), §1.7 items 1 and 8 (rank rounding, T = 2),
//! and §6 golden cases G-C1, G-C2, G-C3.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{MemModel, merge_in_memory};
use mergescope_engine::plugin::Plugin;
use mergescope_plugin_cart::rank_from_ratio;
use mergescope_tests::{assert_close, assert_documented, load, model};
use serde_json::{Value, json};

fn plugin() -> Plugin {
    load("mergescope_plugin_cart")
}

const I2: [f64; 4] = [1.0, 0.0, 0.0, 1.0];

fn merge(params: &Value, base: Option<&MemModel>, experts: &[MemModel]) -> MemModel {
    merge_in_memory(&plugin(), params, 0, base, experts).unwrap_or_else(|e| panic!("merge with {params}: {e}"))
}

/// G-C1: θ_1 = [[3,2],[1,0]], θ_2 = [[−2,−3],[1,0]], θ_3 = [[2,1],[−2,3]] (θ_avg = I) with biases
/// (1,0), (0,3), (2,0). The same matrices are also stored as an embedding and the biases as a
/// norm, which CART only averages.
fn gc1() -> Vec<MemModel> {
    let w: [[f32; 4]; 3] = [[3.0, 2.0, 1.0, 0.0], [-2.0, -3.0, 1.0, 0.0], [2.0, 1.0, -2.0, 3.0]];
    let b: [[f32; 2]; 3] = [[1.0, 0.0], [0.0, 3.0], [2.0, 0.0]];
    (0..3)
        .map(|t| {
            model(&[
                ("layer.weight", &[2, 2], &w[t]),
                ("layer.bias", &[2], &b[t]),
                ("embed.weight", &[2, 2], &w[t]),
                ("final_norm.weight", &[2], &b[t]),
            ])
        })
        .collect()
}

fn diag3(d: [f32; 3]) -> [f32; 9] {
    [d[0], 0.0, 0.0, 0.0, d[1], 0.0, 0.0, 0.0, d[2]]
}

#[test]
fn plugin_describes_itself() {
    let p = plugin();
    assert_eq!(p.id(), "cart");
    let names: Vec<&str> = p.schema().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["rank_mode", "rank_ratio", "rank", "lambda"]);
    assert_documented(&p);
}

/// §1.7 item 1: k = ⌈r·γ⌉ computed robustly, clamped to [0, r].
#[test]
fn rank_ratio_to_k() {
    assert_eq!(rank_from_ratio(25, 0.08), 2); // 25·0.08 = 2.0000000000000004 in f64
    assert_eq!(rank_from_ratio(3, 0.32), 1);
    assert_eq!(rank_from_ratio(3, 0.34), 2);
    assert_eq!(rank_from_ratio(2, 0.08), 1);
    assert_eq!(rank_from_ratio(2, 0.5), 1);
    assert_eq!(rank_from_ratio(2, 1.0), 2);
    assert_eq!(rank_from_ratio(10, 0.1), 1);
    assert_eq!(rank_from_ratio(768, 0.08), 62);
    assert_eq!(rank_from_ratio(100, 0.0), 0);
    assert_eq!(rank_from_ratio(0, 0.5), 0);
}

/// G-C1, every cell of the table: k = 0 or 2 → I; k = 1 → I + λ·S_1 with S_1 = [[−1,−1],[−2,2]].
/// Biases (and the embedding and norm) are plain averages for every k and λ.
#[test]
fn gc1_every_k_and_lambda() {
    let experts = gc1();
    for lambda in [0.5, 1.0, 2.0] {
        let k1 = [1.0 - lambda, -lambda, -2.0 * lambda, 1.0 + 2.0 * lambda];
        for (k, expected) in [(0, I2), (1, k1), (2, I2), (8, I2)] {
            let params = json!({"rank_mode": "absolute", "rank": k, "lambda": lambda});
            let out = merge(&params, None, &experts);
            let ctx = params.to_string();
            assert_close(&out, "layer.weight", &expected, &ctx);
            assert_close(&out, "layer.bias", &[1.0, 1.0], &ctx);
            assert_close(&out, "embed.weight", &I2, &ctx);
            assert_close(&out, "final_norm.weight", &[1.0, 1.0], &ctx);
        }
    }
    // The table's three k = 1 cells, spelled out.
    let out = merge(
        &json!({"rank_mode": "absolute", "rank": 1, "lambda": 0.5}),
        None,
        &experts,
    );
    assert_close(&out, "layer.weight", &[0.5, -0.5, -1.0, 2.0], "λ = 0.5");
    let out = merge(
        &json!({"rank_mode": "absolute", "rank": 1, "lambda": 2.0}),
        None,
        &experts,
    );
    assert_close(&out, "layer.weight", &[-1.0, -2.0, -4.0, 5.0], "λ = 2");
}

/// G-C1 through the rank ratio: γ = 0.08 → k = ⌈0.16⌉ = 1, γ = 0.5 → 1, γ = 1 → 2. The defaults
/// (fraction 0.08, λ = 1) give [[0,−1],[−2,3]].
#[test]
fn gc1_rank_ratio_mapping() {
    let experts = gc1();
    let k1 = [0.0, -1.0, -2.0, 3.0];
    for (ratio, expected) in [(0.08, k1), (0.5, k1), (1.0, I2), (0.0, I2)] {
        let params = json!({"rank_mode": "fraction", "rank_ratio": ratio, "lambda": 1.0});
        assert_close(
            &merge(&params, None, &experts),
            "layer.weight",
            &expected,
            &params.to_string(),
        );
    }
    assert_close(&merge(&json!({}), None, &experts), "layer.weight", &k1, "defaults");
}

/// CART ignores the base model.
#[test]
fn base_is_ignored() {
    let experts = gc1();
    let base = model(&[
        ("layer.weight", &[2, 2], &[7.0, 7.0, 7.0, 7.0]),
        ("layer.bias", &[2], &[7.0, 7.0]),
        ("embed.weight", &[2, 2], &[7.0, 7.0, 7.0, 7.0]),
        ("final_norm.weight", &[2], &[7.0, 7.0]),
    ]);
    let out = merge(&json!({}), Some(&base), &experts);
    assert_close(&out, "layer.weight", &[0.0, -1.0, -2.0, 3.0], "with a base");
    assert_close(&out, "layer.bias", &[1.0, 1.0], "with a base");
}

/// G-C2: diag(4,−1,2), diag(3,2,−3), diag(−4,2,4) (θ_avg = I₃), λ = 1.
/// k = 1 (γ = 0.08 or 0.32) → diag(−1,1,−3); k = 2 (γ = 0.34 or 0.5) → diag(1,−1,0); k = 3 → I₃.
#[test]
fn gc2_rank_rounding() {
    let experts: Vec<MemModel> = [[4.0, -1.0, 2.0], [3.0, 2.0, -3.0], [-4.0, 2.0, 4.0]]
        .iter()
        .map(|d| model(&[("layer.weight", &[3, 3], &diag3(*d))]))
        .collect();
    let d = |a: f64, b: f64, c: f64| [a, 0.0, 0.0, 0.0, b, 0.0, 0.0, 0.0, c];
    for (ratio, expected) in [
        (0.08, d(-1.0, 1.0, -3.0)),
        (0.32, d(-1.0, 1.0, -3.0)),
        (0.34, d(1.0, -1.0, 0.0)),
        (0.5, d(1.0, -1.0, 0.0)),
        (1.0, d(1.0, 1.0, 1.0)),
    ] {
        let params = json!({"rank_ratio": ratio, "lambda": 1.0});
        assert_close(
            &merge(&params, None, &experts),
            "layer.weight",
            &expected,
            &params.to_string(),
        );
    }
}

/// G-C3 (§1.7 item 8): with T = 2, τ̄_2 = −τ̄_1 and CART equals weight averaging: [[1,1],[1,1]]
/// for every k and λ.
#[test]
fn gc3_two_experts_degenerate_to_the_average() {
    let experts = vec![
        model(&[("layer.weight", &[2, 2], &[2.0, 0.0, 1.0, 3.0])]),
        model(&[("layer.weight", &[2, 2], &[0.0, 2.0, 1.0, -1.0])]),
    ];
    for k in [0, 1, 2] {
        for lambda in [0.5, 1.0, 2.0, 3.0] {
            let params = json!({"rank_mode": "absolute", "rank": k, "lambda": lambda});
            assert_close(
                &merge(&params, None, &experts),
                "layer.weight",
                &[1.0; 4],
                &params.to_string(),
            );
        }
    }
}

/// The ratio is applied per matrix with the robust ceiling: a 25×25 matrix at γ = 0.08 keeps
/// k = 2 (a naive ⌈25·0.08⌉ gives 3). θ_1 = A + D1, θ_2 = A + D2, θ_3 = A − D1 − D2 with
/// D1 = diag(10,9,8,7,6,0,…) and D2 = diag(0,…,0,5.5,4.5,3.5,2.5,1.5,0,…) (positions 5..10), so
/// θ_avg = A and SVD_2 keeps the two largest diagonal entries of each: D1 → 10, 9 (positions
/// 0, 1); D2 → 5.5, 4.5 (positions 5, 6); −(D1 + D2) → −10, −9 (positions 0, 1). The sum is
/// 5.5 at (5,5) and 4.5 at (6,6); k = 3 would add 3.5 at (7,7).
#[test]
fn rank_ratio_uses_the_robust_ceiling() {
    let n = 25;
    let a: Vec<f32> = (0..n * n).map(|i| 0.01 * ((i * 7 + (i / n) * 3) % 13) as f32).collect();
    let mut d1 = vec![0f32; n];
    let mut d2 = vec![0f32; n];
    for i in 0..5 {
        d1[i] = 10.0 - i as f32;
        d2[5 + i] = 5.5 - i as f32;
    }
    let with_diag = |f: &dyn Fn(usize) -> f32| -> Vec<f32> {
        (0..n * n)
            .map(|idx| a[idx] + if idx / n == idx % n { f(idx / n) } else { 0.0 })
            .collect()
    };
    let experts = vec![
        model(&[("layer.weight", &[n, n], &with_diag(&|i| d1[i]))]),
        model(&[("layer.weight", &[n, n], &with_diag(&|i| d2[i]))]),
        model(&[("layer.weight", &[n, n], &with_diag(&|i| -d1[i] - d2[i]))]),
    ];
    let out = merge(&json!({"rank_ratio": 0.08, "lambda": 1.0}), None, &experts);
    let mut expected: Vec<f64> = a.iter().map(|v| f64::from(*v)).collect();
    expected[5 * n + 5] += 5.5;
    expected[6 * n + 6] += 4.5;
    assert_close(&out, "layer.weight", &expected, "25x25 at γ = 0.08");
}

#[test]
fn bad_parameters_are_errors() {
    let experts = gc1();
    let err = merge_in_memory(&plugin(), &json!({"rank_ratio": 1.5}), 0, None, &experts).expect_err("ratio > 1");
    assert!(err.to_string().contains("rank_ratio"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({"rank_mode": "relative"}), 0, None, &experts).expect_err("choice");
    assert!(err.to_string().contains("rank_mode"), "{err}");
    let err = merge_in_memory(&plugin(), &json!({"rank": -1}), 0, None, &experts).expect_err("negative rank");
    assert!(err.to_string().contains("rank"), "{err}");
}
