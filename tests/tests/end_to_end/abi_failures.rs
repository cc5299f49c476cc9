//! ABI tests against real libraries: every way a plugin can be broken is refused with a message
//! that says what is wrong, a panicking or misbehaving plugin fails its merge without taking
//! the process down, and the plain-C example plugin gives the same numbers as the Rust one.
//!
//! The fixtures live in `tests/plugins/*` (libraries named `mstest_*`, so discovery never picks
//! them up); they and the C example are dependencies of this crate, so `cargo test` builds them
//! into `target/<profile>/deps` next to this test binary.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use mergescope_engine::merge::{ExecOptions, MemModel, merge_in_memory, merge_in_memory_with};
use mergescope_engine::plugin::load_plugin;
use mergescope_plugin_api::abi;
use mergescope_tests::{assert_contains, load, model, plugin_path};
use serde_json::json;
use std::path::Path;

const WEIGHT_AVERAGE: &str = "mergescope_plugin_weight_average";
const C_EXAMPLE: &str = "mergescope_plugin_c_example";

/// The user-facing message of a refused library; also checks that it names the file.
fn refusal(lib: &str) -> String {
    let path = plugin_path(lib);
    assert!(path.is_file(), "fixture {} was not built", path.display());
    match load_plugin(&path) {
        Ok(p) => panic!("{lib} loaded as '{}' but must be refused", p.id()),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&path.display().to_string()),
                "the message should name the file: {msg}"
            );
            msg
        }
    }
}

/// Three experts and a base with a matrix and a bias; hand-made so the weighted averages are
/// exact in f32.
fn inputs() -> (MemModel, Vec<MemModel>) {
    let base = model(&[
        ("layer.bias", &[3], &[9.0, 9.0, 9.0]),
        ("layer.weight", &[2, 3], &[7.0; 6]),
    ]);
    let experts = vec![
        model(&[
            ("layer.bias", &[3], &[0.5, 1.0, -1.0]),
            ("layer.weight", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ]),
        model(&[
            ("layer.bias", &[3], &[0.5, 0.0, 1.0]),
            ("layer.weight", &[2, 3], &[3.0, -1.0, 0.0, 2.0, 1.0, -2.0]),
        ]),
        model(&[
            ("layer.bias", &[3], &[2.5, -2.0, 3.0]),
            ("layer.weight", &[2, 3], &[-1.0, 0.0, 5.0, 2.0, 3.0, 10.0]),
        ]),
    ];
    (base, experts)
}

fn assert_close(got: &MemModel, name: &str, shape: &[usize], want: &[f32]) {
    let t = got.get(name).unwrap_or_else(|| panic!("output has no tensor {name}"));
    assert_eq!(t.shape, shape, "{name}: shape");
    assert_eq!(t.data.len(), want.len(), "{name}: length");
    for (i, (g, w)) in t.data.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6,
            "{name}[{i}]: got {g}, want {w} (all: {:?})",
            t.data
        );
    }
}

// ---- loading: every broken library is refused with a useful message --------------------------

#[test]
fn good_plugins_load() {
    let wa = load(WEIGHT_AVERAGE);
    assert_eq!(wa.id(), "weight-average");
    assert_eq!(wa.info.abi, format!("{}.{}", abi::ABI_MAJOR, abi::ABI_MINOR));
    // Loading the same library twice is fine (libraries are never unloaded).
    assert_eq!(load(WEIGHT_AVERAGE).id(), "weight-average");
    // The fixtures that fail only at merge time load normally.
    assert_eq!(load("mstest_panics").id(), "mstest-panics");
    assert_eq!(load("mstest_nan_output").id(), "mstest-nan-output");
    assert_eq!(load("mstest_wrong_shape").id(), "mstest-wrong-shape");
}

/// ABI 1.1 only appended fields: a plugin built against 1.0 (short table, minor 0) still loads
/// and merges, and its absent `run_model` is never read.
#[test]
fn abi_1_0_plugins_keep_loading() {
    let p = load("mstest_abi_1_0");
    assert_eq!(p.info.abi, "1.0");
    assert!(!p.is_model_level());
    let a = model(&[("w", &[2], &[1.0, 2.0])]);
    let b = model(&[("w", &[2], &[5.0, 6.0])]);
    let out = merge_in_memory(&p, &serde_json::json!({}), 0, None, &[a, b]).unwrap();
    assert_eq!(out["w"].data, vec![1.0, 2.0]);
}

#[test]
fn missing_header_is_not_a_plugin() {
    let msg = refusal("mstest_no_header");
    assert_contains(&msg, &["not a mergescope plugin", abi::HEADER_SYMBOL]);
}

#[test]
fn wrong_magic_is_not_a_plugin() {
    let msg = refusal("mstest_wrong_magic");
    assert_contains(&msg, &["not a mergescope plugin"]);
}

#[test]
fn other_major_is_refused_with_both_versions() {
    let msg = refusal("mstest_major_mismatch");
    assert_contains(&msg, &["ABI 2.0", &format!("ABI 1.{}", abi::ABI_MINOR)]);
}

#[test]
fn newer_minor_is_refused() {
    let msg = refusal("mstest_minor_newer");
    assert_contains(&msg, &["1.99", "newer"]);
}

#[test]
fn missing_entry_is_named() {
    let msg = refusal("mstest_missing_entry");
    assert_contains(&msg, &[abi::ENTRY_SYMBOL_V1]);
}

#[test]
fn null_entry_is_refused() {
    let msg = refusal("mstest_null_entry");
    assert_contains(&msg, &["null"]);
}

#[test]
fn short_table_is_refused() {
    let msg = refusal("mstest_short_table");
    assert_contains(&msg, &["too short"]);
}

#[test]
fn missing_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libmergescope_plugin_does_not_exist.so");
    let msg = load_plugin(&path)
        .map(|p| p.id().to_owned())
        .expect_err("a missing file must not load")
        .to_string();
    assert_contains(&msg, &[&path.display().to_string()]);
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join(format!("libmergescope_plugin_text{}", std::env::consts::DLL_SUFFIX));
    std::fs::write(&path, "this is not a shared library\n").unwrap();
    let msg = load_plugin(&path)
        .map(|p| p.id().to_owned())
        .expect_err("a text file must not load")
        .to_string();
    assert_contains(&msg, &[&path.display().to_string()]);
}

// ---- merging: misbehaving plugins fail their merge, the process survives ----------------------

#[test]
fn panicking_plugin_fails_the_merge_and_the_process_survives() {
    let (base, experts) = inputs();
    let panics = load("mstest_panics");
    for _ in 0..2 {
        let err = merge_in_memory(&panics, &json!({}), 0, Some(&base), &experts)
            .map(|_| ())
            .expect_err("a panicking plugin must fail the merge")
            .to_string();
        assert_contains(&err, &["panicked", "fixture panic: boom"]);
    }
    // Still alive: a good plugin merges afterwards.
    let wa = load(WEIGHT_AVERAGE);
    let out = merge_in_memory(&wa, &json!({}), 0, Some(&base), &experts).expect("weight-average after a panic");
    assert_close(&out, "layer.bias", &[3], &[3.5 / 3.0, -1.0 / 3.0, 1.0]);
}

#[test]
fn nan_output_is_refused_naming_the_tensor() {
    let (base, experts) = inputs();
    let err = merge_in_memory(&load("mstest_nan_output"), &json!({}), 0, Some(&base), &experts)
        .map(|_| ())
        .expect_err("NaN output must fail the merge")
        .to_string();
    assert_contains(&err, &["non-finite"]);
    assert!(
        err.contains("layer.bias") || err.contains("layer.weight"),
        "the message should name the tensor: {err}"
    );
}

#[test]
fn wrong_shape_is_refused_naming_the_tensor() {
    let (base, experts) = inputs();
    let err = merge_in_memory(&load("mstest_wrong_shape"), &json!({}), 0, Some(&base), &experts)
        .map(|_| ())
        .expect_err("a wrong shape must fail the merge")
        .to_string();
    assert_contains(&err, &["shape"]);
    assert!(
        err.contains("layer.bias") || err.contains("layer.weight"),
        "the message should name the tensor: {err}"
    );
}

// ---- the plain-C plugin ---------------------------------------------------------------------------

#[test]
fn c_example_describes_itself() {
    let c = load(C_EXAMPLE);
    assert_eq!(c.id(), "c-example");
    assert_eq!(c.info.kind, "per-tensor");
    assert_eq!(c.info.abi, format!("{}.{}", abi::ABI_MAJOR, abi::ABI_MINOR));
    assert!(c.has_capability(abi::CAP_ELEMENTWISE) && c.has_capability(abi::CAP_THREAD_SAFE));
    assert!(!c.has_capability(abi::CAP_NEEDS_BASE));
    assert!(c.info.help.contains("weight"), "help: {}", c.info.help);
    // The hand-written schema declares the same `weights` as weight-average's SDK-made one
    // (which also has `normalize`, mergekit's linear without normalisation).
    let wa = load(WEIGHT_AVERAGE);
    assert_eq!(c.schema().len(), 1);
    assert_eq!(
        (
            &c.schema()[0].name,
            c.schema()[0].per_task,
            &c.schema()[0].default,
            &c.schema()[0].ty
        ),
        (
            &wa.schema()[0].name,
            wa.schema()[0].per_task,
            &wa.schema()[0].default,
            &wa.schema()[0].ty
        )
    );
    let w = &c.schema()[0];
    assert_eq!(
        (w.name.as_str(), w.per_task, &w.default),
        ("weights", true, &json!(1.0))
    );
}

#[test]
fn c_example_golden_weighted_average() {
    let (base, experts) = inputs();
    let c = load(C_EXAMPLE);
    // (e1 + 2·e2 + e3) / 4; the base is ignored.
    let out = merge_in_memory(&c, &json!({"weights": [1.0, 2.0, 1.0]}), 0, Some(&base), &experts).expect("merge");
    assert_eq!(out.len(), 2);
    assert_close(&out, "layer.weight", &[2, 3], &[1.5, 0.0, 2.0, 2.5, 2.5, 3.0]);
    assert_close(&out, "layer.bias", &[3], &[1.0, -0.25, 1.0]);
    // Default weights: the plain average; no base needed.
    let out = merge_in_memory(&c, &json!({}), 0, None, &experts).expect("merge without base");
    assert_close(
        &out,
        "layer.weight",
        &[2, 3],
        &[1.0, 1.0 / 3.0, 8.0 / 3.0, 8.0 / 3.0, 3.0, 14.0 / 3.0],
    );
}

#[test]
fn c_example_matches_the_rust_weight_average() {
    let (base, experts) = inputs();
    let (c, wa) = (load(C_EXAMPLE), load(WEIGHT_AVERAGE));
    for params in [
        json!({}),
        json!({"weights": [1.0, 2.0, 1.0]}),
        json!({"weights": [0.3, -0.7, 2.5]}),
        json!({"weights": 4}),
    ] {
        let from_c = merge_in_memory(&c, &params, 7, Some(&base), &experts).expect("c-example");
        let from_rust = merge_in_memory(&wa, &params, 7, Some(&base), &experts).expect("weight-average");
        assert_eq!(from_c, from_rust, "params {params}");
    }
}

#[test]
fn c_example_chunked_on_several_threads_gives_the_same_result() {
    // CAP_ELEMENTWISE | CAP_THREAD_SAFE: the host may cut tensors into chunks and call one
    // instance from several threads at once.
    let (base, experts) = inputs();
    let c = load(C_EXAMPLE);
    let params = json!({"weights": [1.0, 2.0, 1.0]});
    let whole = merge_in_memory(&c, &params, 0, Some(&base), &experts).expect("unchunked");
    let opts = ExecOptions {
        chunk_elems: 2,
        threads: 2,
        ..ExecOptions::default()
    };
    let chunked = merge_in_memory_with(&c, &params, 0, Some(&base), &experts, &opts).expect("chunked");
    assert_eq!(whole, chunked);
}

#[test]
fn c_example_errors_reach_the_user() {
    let (base, experts) = inputs();
    let c = load(C_EXAMPLE);
    let err = merge_in_memory(&c, &json!({"weights": [1.0, -1.0, 0.0]}), 0, Some(&base), &experts)
        .map(|_| ())
        .expect_err("weights summing to 0 must fail")
        .to_string();
    assert_contains(&err, &["c-example", "weights sum to 0"]);
}

#[test]
fn fixtures_are_invisible_to_discovery() {
    for lib in [
        "mstest_panics",
        "mstest_wrong_magic",
        "mstest_no_header",
        "mstest_use_after_release",
    ] {
        let path = plugin_path(lib);
        assert!(
            !mergescope_engine::plugin::discovery::is_plugin_file(Path::new(&path)),
            "{} would be discovered",
            path.display()
        );
    }
    assert!(mergescope_engine::plugin::discovery::is_plugin_file(&plugin_path(
        C_EXAMPLE
    )));
}
