//! Golden tests of the `task-arithmetic` plugin, loaded from its built library.
//! References: seeds-002-004.md §4.1 and §4.6 (TA golden vector); seeds-000-001.md §6 G-C1
//! (TA(1/3) = θ_avg and TA(0.3) with θ0 = 0).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{ExecOptions, MemModel, merge_in_memory, merge_in_memory_with};
use mergescope_engine::plugin::Plugin;
use mergescope_tests::{assert_documented, load, model};
use serde_json::json;

fn plugin() -> Plugin {
    load("mergescope_plugin_task_arithmetic")
}

fn assert_close(model: &MemModel, name: &str, expected: &[f64]) {
    mergescope_tests::assert_close(model, name, expected, "");
}

/// The three task vectors of seeds-002-004 §4.6.
const TAU: [[f64; 10]; 3] = [
    [0.5, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6],
    [-0.6, 0.25, 0.1, 0.2, -0.8, 0.7, -0.05, 0.35, 0.45, -0.1],
    [0.4, -0.3, -0.15, -0.2, 0.1, 0.2, 0.0, -0.3, 0.5, 0.55],
];

/// A non-zero base θ0 and experts θ_t = θ0 + τ_t for the §4.6 task vectors.
fn golden_inputs() -> (Vec<f64>, MemModel, Vec<MemModel>) {
    let base: Vec<f64> = (0..10).map(|j| 0.1 * j as f64 - 0.3).collect();
    let base_f32: Vec<f32> = base.iter().map(|v| *v as f32).collect();
    let experts = TAU
        .iter()
        .map(|tau| {
            let data: Vec<f32> = base.iter().zip(tau).map(|(b, t)| (b + t) as f32).collect();
            model(&[("layer.bias", &[10], &data)])
        })
        .collect();
    (base, model(&[("layer.bias", &[10], &base_f32)]), experts)
}

#[test]
fn plugin_describes_itself() {
    let p = plugin();
    assert_eq!(p.id(), "task-arithmetic");
    let names: Vec<&str> = p.schema().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["lambda", "task_weights", "normalize"]);
    assert_documented(&p);
}

/// §4.6: λ = 0.3 gives λ·Στ = [0.09, -0.075, 0.015, 0, 0.06, 0.06, 0, 0.105, 0.165, 0.315].
#[test]
fn golden_lambda_0_3() {
    const LAMBDA_SUM: [f64; 10] = [0.09, -0.075, 0.015, 0.0, 0.06, 0.06, 0.0, 0.105, 0.165, 0.315];
    let (base, base_model, experts) = golden_inputs();
    let expected: Vec<f64> = base.iter().zip(LAMBDA_SUM).map(|(b, d)| b + d).collect();
    let out = merge_in_memory(&plugin(), &json!({"lambda": 0.3}), 0, Some(&base_model), &experts).expect("merge");
    assert_close(&out, "layer.bias", &expected);
    // 0.3 is the default.
    let out = merge_in_memory(&plugin(), &json!({}), 0, Some(&base_model), &experts).expect("merge");
    assert_close(&out, "layer.bias", &expected);
}

/// Per-task weights w = [1, 0.5, 2], λ = 0.5: θ0 + 0.5·(τ1 + 0.5τ2 + 2τ3); with normalize the
/// weights become w/3.5.
#[test]
fn task_weights_and_normalize() {
    let (base, base_model, experts) = golden_inputs();
    let w = [1.0, 0.5, 2.0];
    let mixed: Vec<f64> = (0..10).map(|j| (0..3).map(|t| w[t] * TAU[t][j]).sum()).collect();
    let expected: Vec<f64> = base.iter().zip(&mixed).map(|(b, m)| b + 0.5 * m).collect();
    let out = merge_in_memory(
        &plugin(),
        &json!({"lambda": 0.5, "task_weights": w}),
        0,
        Some(&base_model),
        &experts,
    )
    .expect("merge");
    assert_close(&out, "layer.bias", &expected);

    let expected: Vec<f64> = base.iter().zip(&mixed).map(|(b, m)| b + 0.5 * m / 3.5).collect();
    let params = json!({"lambda": 0.5, "task_weights": w, "normalize": true});
    let out = merge_in_memory(&plugin(), &params, 0, Some(&base_model), &experts).expect("merge");
    assert_close(&out, "layer.bias", &expected);
}

/// G-C1 (seeds-000-001 §6) with θ0 = 0: TA(λ = 1/3) = θ_avg = I and TA(0.3) = 0.9·I.
#[test]
fn gc1_task_arithmetic_points() {
    let base = model(&[("layer.weight", &[2, 2], &[0.0; 4])]);
    let experts = vec![
        model(&[("layer.weight", &[2, 2], &[3.0, 2.0, 1.0, 0.0])]),
        model(&[("layer.weight", &[2, 2], &[-2.0, -3.0, 1.0, 0.0])]),
        model(&[("layer.weight", &[2, 2], &[2.0, 1.0, -2.0, 3.0])]),
    ];
    let out = merge_in_memory(&plugin(), &json!({"lambda": 1.0 / 3.0}), 0, Some(&base), &experts).expect("merge");
    assert_close(&out, "layer.weight", &[1.0, 0.0, 0.0, 1.0]);
    let out = merge_in_memory(&plugin(), &json!({"lambda": 0.3}), 0, Some(&base), &experts).expect("merge");
    assert_close(&out, "layer.weight", &[0.9, 0.0, 0.0, 0.9]);
}

/// λ = 0 returns the base; one expert with λ = 1 returns that expert.
#[test]
fn endpoints() {
    let (base, base_model, experts) = golden_inputs();
    let out = merge_in_memory(&plugin(), &json!({"lambda": 0.0}), 0, Some(&base_model), &experts).expect("merge");
    assert_close(&out, "layer.bias", &base);
    let one = &experts[..1];
    let out = merge_in_memory(&plugin(), &json!({"lambda": 1.0}), 0, Some(&base_model), one).expect("merge");
    let expected: Vec<f64> = one[0]["layer.bias"].data.iter().map(|v| f64::from(*v)).collect();
    assert_close(&out, "layer.bias", &expected);
}

#[test]
fn normalize_with_weights_summing_to_zero_is_an_error() {
    let (_, base_model, experts) = golden_inputs();
    let params = json!({"task_weights": [1.0, -1.0, 0.0], "normalize": true});
    let err = merge_in_memory(&plugin(), &params, 0, Some(&base_model), &experts).expect_err("must fail");
    assert!(
        err.to_string().contains("task_weights"),
        "message does not name the parameter: {err}"
    );
}

#[test]
fn wrong_number_of_task_weights_names_the_parameter() {
    let (_, base_model, experts) = golden_inputs();
    let params = json!({"task_weights": [1.0, 2.0]});
    let err = merge_in_memory(&plugin(), &params, 0, Some(&base_model), &experts).expect_err("must fail");
    assert!(
        err.to_string().contains("task_weights"),
        "message does not name the parameter: {err}"
    );
}

#[test]
fn missing_base_is_an_error() {
    let (_, _, experts) = golden_inputs();
    let err = merge_in_memory(&plugin(), &json!({}), 0, None, &experts).expect_err("must fail without a base");
    assert!(
        err.to_string().to_lowercase().contains("base"),
        "message does not mention the base: {err}"
    );
}

#[test]
fn chunked_equals_unchunked() {
    let n = 41;
    let base: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let experts: Vec<MemModel> = (0..3)
        .map(|t| {
            let d: Vec<f32> = base
                .iter()
                .enumerate()
                .map(|(i, b)| b + ((i * 5 + t * 3) % 7) as f32 * 0.1 - 0.3)
                .collect();
            model(&[("big.weight", &[n], &d)])
        })
        .collect();
    let base_model = model(&[("big.weight", &[n], &base)]);
    let params = json!({"lambda": 0.7, "task_weights": [1.0, -0.5, 2.0]});
    let whole = merge_in_memory(&plugin(), &params, 0, Some(&base_model), &experts).expect("merge");
    let opts = ExecOptions {
        chunk_elems: 3,
        ..Default::default()
    };
    let chunked = merge_in_memory_with(&plugin(), &params, 0, Some(&base_model), &experts, &opts).expect("merge");
    let expected: Vec<f64> = whole["big.weight"].data.iter().map(|v| f64::from(*v)).collect();
    assert_close(&chunked, "big.weight", &expected);
    let by_hand: Vec<f64> = (0..n)
        .map(|i| {
            let b = f64::from(base[i]);
            let w = [1.0, -0.5, 2.0];
            b + 0.7
                * (0..3)
                    .map(|t| w[t] * (f64::from(experts[t]["big.weight"].data[i]) - b))
                    .sum::<f64>()
        })
        .collect();
    assert_close(&whole, "big.weight", &by_hand);
}

/// LiNeS (Wang et al., ICLR 2025) as a λ gradient: `lambda = [α, α + β]` scales layer ℓ of L by
/// α + β·ℓ/(L − 1) (0-based ℓ), and tensors outside the layers by α. The same holds for every
/// per-tensor method with a `lambda` (TIES and consensus: docs/methods.md, "LiNeS").
#[test]
fn lines_scales_each_layer_by_alpha_plus_beta_times_its_depth() {
    let (alpha, beta) = (0.2, 0.9);
    let names = ["embed.weight", "layers.0.w", "layers.1.w", "layers.2.w", "layers.3.w"];
    let tensors = |v: f32| {
        names
            .iter()
            .map(|n| (*n, &[2usize][..], vec![v, 2.0 * v]))
            .collect::<Vec<_>>()
    };
    let mk = |v: f32| {
        let t = tensors(v);
        model(&t.iter().map(|(n, s, d)| (*n, *s, d.as_slice())).collect::<Vec<_>>())
    };
    let (base, e1, e2) = (mk(0.0), mk(1.0), mk(0.5));
    let out = merge_in_memory(
        &plugin(),
        &json!({"lambda": [alpha, alpha + beta]}),
        0,
        Some(&base),
        &[e1, e2],
    )
    .unwrap();
    // Σ_t τ_t = (1.5, 3.0) in every tensor.
    for (name, depth) in [
        ("embed.weight", 0.0),
        ("layers.0.w", 0.0),
        ("layers.1.w", 1.0 / 3.0),
        ("layers.2.w", 2.0 / 3.0),
        ("layers.3.w", 1.0),
    ] {
        let lambda = alpha + beta * depth;
        assert_close(&out, name, &[1.5 * lambda, 3.0 * lambda]);
    }
}
