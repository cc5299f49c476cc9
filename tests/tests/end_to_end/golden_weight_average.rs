//! Golden tests of the `weight-average` plugin, loaded from its built library like any plugin.
//! Reference: seeds-000-001.md §1.1 (θ_avg, CART Eq. 1) and §6 G-C1.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::{ExecOptions, MemModel, merge_in_memory, merge_in_memory_with};
use mergescope_engine::plugin::Plugin;
use mergescope_tests::{assert_documented, load, model};
use serde_json::json;

fn plugin() -> Plugin {
    load("mergescope_plugin_weight_average")
}

fn assert_close(model: &MemModel, name: &str, expected: &[f64]) {
    mergescope_tests::assert_close(model, name, expected, "");
}

fn experts() -> Vec<MemModel> {
    vec![
        model(&[
            ("layer.weight", &[2, 2], &[3.0, 2.0, 1.0, 0.0]),
            ("layer.bias", &[2], &[1.0, 0.0]),
        ]),
        model(&[
            ("layer.weight", &[2, 2], &[-2.0, -3.0, 1.0, 0.0]),
            ("layer.bias", &[2], &[0.0, 3.0]),
        ]),
        model(&[
            ("layer.weight", &[2, 2], &[2.0, 1.0, -2.0, 3.0]),
            ("layer.bias", &[2], &[2.0, 0.0]),
        ]),
    ]
}

#[test]
fn plugin_describes_itself() {
    let p = plugin();
    assert_eq!(p.id(), "weight-average");
    assert!(!p.version().is_empty());
    assert!(p.schema().iter().any(|s| s.name == "weights"));
    assert_documented(&p);
}

/// G-C1 (seeds-000-001 §6): the three experts average to θ_avg = I, biases to (1, 1).
#[test]
fn uniform_average_is_gc1_theta_avg() {
    let out = merge_in_memory(&plugin(), &json!({}), 0, None, &experts()).expect("merge");
    assert_close(&out, "layer.weight", &[1.0, 0.0, 0.0, 1.0]);
    assert_close(&out, "layer.bias", &[1.0, 1.0]);
}

/// Weights [1, 2, 1] (normalised by 4): W = (θ1 + 2θ2 + θ3)/4 = [[1, -3/4], [1/4, 3/4]],
/// b = ((1,0) + 2(0,3) + (2,0))/4 = (3/4, 3/2).
/// normalize = false (mergekit's linear without normalisation): W = θ1 + 2θ2 + θ3 =
/// [[1, -3], [1, 3]], b = (1,0) + (0,6) + (2,0) = (3, 6); weights summing to 0 are then allowed:
/// θ1 − θ2 = [[5, 5], [0, 0]], b = (1, −3).
#[test]
fn unnormalised_weighted_sum() {
    let params = json!({"weights": [1.0, 2.0, 1.0], "normalize": false});
    let out = merge_in_memory(&plugin(), &params, 0, None, &experts()).expect("merge");
    assert_close(&out, "layer.weight", &[1.0, -3.0, 1.0, 3.0]);
    assert_close(&out, "layer.bias", &[3.0, 6.0]);
    let two = &experts()[..2];
    let out = merge_in_memory(
        &plugin(),
        &json!({"weights": [1.0, -1.0], "normalize": false}),
        0,
        None,
        two,
    )
    .unwrap();
    assert_close(&out, "layer.weight", &[5.0, 5.0, 0.0, 0.0]);
    assert_close(&out, "layer.bias", &[1.0, -3.0]);
    let e = merge_in_memory(&plugin(), &json!({"weights": [1.0, -1.0]}), 0, None, two)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sum to 0") && e.contains("normalize=false"), "{e}");
}

#[test]
fn weights_1_2_1() {
    let out = merge_in_memory(&plugin(), &json!({"weights": [1.0, 2.0, 1.0]}), 0, None, &experts()).expect("merge");
    assert_close(&out, "layer.weight", &[0.25, -0.75, 0.25, 0.75]);
    assert_close(&out, "layer.bias", &[0.75, 1.5]);
}

/// The base model, when given, plays no part.
#[test]
fn base_is_ignored() {
    let base = model(&[
        ("layer.weight", &[2, 2], &[9.0, 9.0, 9.0, 9.0]),
        ("layer.bias", &[2], &[9.0, 9.0]),
    ]);
    let with_base = merge_in_memory(&plugin(), &json!({}), 0, Some(&base), &experts()).expect("merge");
    assert_close(&with_base, "layer.weight", &[1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn weights_summing_to_zero_are_an_error() {
    let err = merge_in_memory(&plugin(), &json!({"weights": [1.0, -2.0, 1.0]}), 0, None, &experts())
        .expect_err("weights summing to 0 must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("weights") && msg.contains("sum"),
        "unhelpful message: {msg}"
    );
}

#[test]
fn wrong_number_of_weights_names_the_parameter() {
    let err = merge_in_memory(&plugin(), &json!({"weights": [1.0, 2.0]}), 0, None, &experts())
        .expect_err("2 weights for 3 experts must fail");
    assert!(
        err.to_string().contains("weights"),
        "message does not name the parameter: {err}"
    );
}

#[test]
fn chunked_equals_unchunked() {
    let data: Vec<Vec<f32>> = (0..3)
        .map(|t| (0..37).map(|i| ((i * 7 + t * 13) % 11) as f32 * 0.1 - 0.5).collect())
        .collect();
    let experts: Vec<MemModel> = data.iter().map(|d| model(&[("big.weight", &[37], d)])).collect();
    let params = json!({"weights": [0.5, 1.0, 2.5]});
    let whole = merge_in_memory(&plugin(), &params, 0, None, &experts).expect("merge");
    let opts = ExecOptions {
        chunk_elems: 3,
        ..Default::default()
    };
    let chunked = merge_in_memory_with(&plugin(), &params, 0, None, &experts, &opts).expect("chunked merge");
    let expected: Vec<f64> = (0..37)
        .map(|i| (0.5 * f64::from(data[0][i]) + f64::from(data[1][i]) + 2.5 * f64::from(data[2][i])) / 4.0)
        .collect();
    assert_close(&whole, "big.weight", &expected);
    assert_close(&chunked, "big.weight", &expected);
}
