//! Plugins, parameters and model-level methods.

use super::refuses;
use crate::common::*;
use mergescope_engine::checkpoint::Checkpoint;
use std::path::{Path, PathBuf};

/// A fixture library built beside the tests, copied into `dir` under a plugin's file name.
fn install_fixture(dir: &Path, fixture: &str, as_name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let (pre, suf) = (std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    std::fs::create_dir_all(dir).unwrap();
    let to = dir.join(format!("{pre}mergescope_plugin_{as_name}{suf}"));
    std::fs::copy(deps.join(format!("{pre}{fixture}{suf}")), &to).unwrap();
    to
}

#[test]
fn a_plugin_without_merge_tensor_is_refused_when_loaded() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let dir = env.path("extra");
    let lib = install_fixture(&dir, "mstest_null_merge", "null_merge");
    refuses(
        &env,
        &["plugins", "approve", s(&lib)],
        &["null_merge", "merge_tensor", "NULL", "was not approved"],
    );
    let approvals = env.path("config").join("approved-plugins.json");
    assert!(!approvals.exists(), "a plugin that does not load is not approved");
    // Loaded as an explicitly named folder after approval by hand: the merge says why the
    // method is unavailable instead of crashing on the first tensor.
    let sha = mergescope_engine::plugin::discovery::file_sha256(&lib).unwrap();
    std::fs::create_dir_all(env.path("config")).unwrap();
    std::fs::write(
        &approvals,
        serde_json::json!({"approved": [{"path": std::fs::canonicalize(&lib).unwrap(), "sha256": sha}]}).to_string(),
    )
    .unwrap();
    refuses(
        &env,
        &[
            "--plugin-dir",
            s(&dir),
            "merge",
            "--method",
            "null-merge",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            &e2,
            "--out",
            s(&env.path("o.safetensors")),
        ],
        &["unavailable", "failed to load", "null_merge", "merge_tensor"],
    );
}

#[test]
fn a_plugin_error_message_is_cut_short() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let dir = env.path("extra");
    let lib = install_fixture(&dir, "mstest_long_error", "long_error");
    env.ok(&["plugins", "approve", s(&lib)]);
    let e = refuses(
        &env,
        &[
            "--plugin-dir",
            s(&dir),
            "merge",
            "--method",
            "mstest-long-error",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            &e2,
            "--out",
            s(&env.path("o.safetensors")),
        ],
        &["mstest-long-error", "fixture error: xxx", "more bytes cut"],
    );
    assert!(
        e.len() < 10_000,
        "the 10 MB message is cut to a few kB, got {} bytes",
        e.len()
    );
}

#[test]
fn a_corrupt_approvals_file_does_not_block_the_bundled_methods() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    std::fs::create_dir_all(env.path("config")).unwrap();
    std::fs::write(env.path("config").join("approved-plugins.json"), "{ not json").unwrap();
    let out = env.path("o.safetensors");
    let o = env.run(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        &e1,
        "--expert",
        &e2,
        "--base",
        &base,
        "--out",
        s(&out),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("approved-plugins.json") && err.contains("corrupt"),
        "the damage is reported: {err}"
    );
    close(&read(&out, "w"), &[1.5, 3.0, 3.0, 3.5]);
}

/// A benchmark whose second expert holds one NaN, and the paths of base and experts.
fn benchmark_with_a_nan_expert(env: &Env) -> (PathBuf, String, Vec<String>) {
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    let b = mergescope_lab::demo::Benchmark::open(&bench).unwrap();
    let experts: Vec<String> = b.expert_paths().iter().map(|p| s(p).to_owned()).collect();
    // Rewrite the second expert with a NaN in its first weight matrix.
    let path = Path::new(&experts[1]);
    let c = Checkpoint::open(path).unwrap();
    let meta = c.metadata();
    let specs: Vec<_> = c
        .tensors
        .values()
        .map(|t| mergescope_engine::writer::OutputTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let poisoned = c
        .tensors
        .keys()
        .find(|k| c.tensors[*k].shape.len() == 2)
        .unwrap()
        .clone();
    let mut values: Vec<(String, Vec<f32>)> = c
        .tensors
        .values()
        .map(|t| (t.name.clone(), c.read_f32(t).unwrap()))
        .collect();
    drop(c);
    for (n, v) in &mut values {
        if *n == poisoned {
            v[3] = f32::NAN;
        }
    }
    std::fs::remove_file(path).unwrap();
    let w = mergescope_engine::writer::OutputWriter::create(path, &specs, &meta, None, false).unwrap();
    for (n, v) in &values {
        w.write_values(n, 0, v).unwrap();
    }
    w.commit().unwrap();
    (bench, s(&b.base_path()).to_owned(), experts)
}

#[test]
fn model_level_methods_refuse_a_nan_expert_and_name_it() {
    let env = Env::new();
    let (bench, base, experts) = benchmark_with_a_nan_expert(&env);
    let expert_file = Path::new(&experts[1]).file_name().unwrap().to_str().unwrap().to_owned();
    for method in ["frank-wolfe", "adamerging"] {
        let e = refuses(
            &env,
            &[
                "merge",
                "--method",
                method,
                "--benchmark",
                s(&bench),
                "--base",
                &base,
                "--expert",
                &experts[0],
                "--expert",
                &experts[1],
                "--out",
                s(&env.path("o.safetensors")),
            ],
            &[&expert_file, "NaN", "tensor '", "element 3"],
        );
        assert!(!e.contains("not JSON"), "{e}");
    }
}

#[test]
fn a_method_that_refuses_the_expert_count_says_so_before_merging() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = env.path("out.safetensors");
    refuses(
        &env,
        &[
            "merge",
            "--method",
            "slerp",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            &e2,
            "--out",
            s(&out),
        ],
        &[
            "'slerp'",
            "before merging",
            "exactly one expert",
            "2 experts",
            "--expert",
        ],
    );
    refuses(
        &env,
        &[
            "merge",
            "--method",
            "model-stock",
            "--base",
            &base,
            "--expert",
            &e1,
            "--out",
            s(&out),
        ],
        &["'model-stock'", "at least two experts", "has 1"],
    );
}

#[test]
fn adamerging_refuses_a_cart_start_above_one_that_clamping_would_undo() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    refuses(
        &env,
        &[
            "merge",
            "--method",
            "adamerging",
            "--benchmark",
            s(&bench),
            "--param",
            "merge=cart",
            "--param",
            "cart_init=3.5",
            "--out",
            s(&env.path("o.safetensors")),
        ],
        &["cart_init", "3.5", "clamp=false", "≤ 1"],
    );
}
