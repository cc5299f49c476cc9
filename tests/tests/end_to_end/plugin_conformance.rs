//! `mergescope plugins test`'s harness (`conformance::check_plugin`): every bundled per-tensor
//! method passes it, and deliberately broken fixtures fail it with the property named: output
//! that depends on the worker thread, NaN output, a declared parameter the method ignores.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::conformance::{Check, check_plugin};
use mergescope_tests::load;
use serde_json::{Map, json};

fn failed(checks: &[Check]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| format!("{}: {}", c.property, c.detail))
        .collect()
}

#[test]
fn the_bundled_methods_pass() {
    for (lib, params) in [
        ("task_arithmetic", json!({})),
        ("ties", json!({})),
        ("cart", json!({})),
        ("multislerp", json!({})),
        ("nuslerp", json!({})),
        ("karcher", json!({})),
        ("tsv_m", json!({})),
        ("iso_cts", json!({})),
        ("wudi", json!({"iterations": 3})),
        ("nearswap", json!({"t": 0.01})),
    ] {
        let params: Map<_, _> = params.as_object().unwrap().clone();
        let checks = check_plugin(&load(&format!("mergescope_plugin_{lib}")), &params, None);
        assert!(checks.len() >= 4, "{lib}: {checks:?}");
        assert!(failed(&checks).is_empty(), "{lib}: {:?}", failed(&checks));
    }
}

#[test]
fn broken_plugins_fail_with_the_property_named() {
    let none = Map::new();
    let thread = failed(&check_plugin(&load("mstest_thread_dependent"), &none, None));
    assert_eq!(thread.len(), 1, "{thread:?}");
    assert!(
        thread[0].starts_with("the same bits whatever the threads, chunks and memory budget"),
        "{thread:?}"
    );
    assert!(thread[0].contains("differs"), "{thread:?}");

    let nan = failed(&check_plugin(&load("mstest_nan_output"), &none, None));
    assert_eq!(nan.len(), 1, "{nan:?}");
    assert!(
        nan[0].starts_with("outputs are finite") && nan[0].contains("non-finite"),
        "{nan:?}"
    );

    let ignored = failed(&check_plugin(&load("mstest_ignored_parameter"), &none, None));
    assert_eq!(ignored.len(), 1, "{ignored:?}");
    assert!(
        ignored[0].starts_with("parameter 'lambda' changes the result") && ignored[0].contains("ignores 'lambda'"),
        "{ignored:?}"
    );

    // A model-level method is refused with what to do instead.
    let model = failed(&check_plugin(&load("mergescope_plugin_adamerging"), &none, None));
    assert!(
        model[0].contains("model-level") && model[0].contains("--eval"),
        "{model:?}"
    );
}
