#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of the `mergescope` CLI on small checkpoints written by the tests:
//! golden merges, recipes, dtypes, shards, metadata, plugin approval, and the bad-input suite
//! (every error names what, where, and the fix; the exit code is non-zero).

mod common;

use common::*;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::dtype::DType;
use std::path::Path;

#[test]
fn task_arithmetic_merge_is_golden_and_replayable_from_metadata() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = env.path("ta.safetensors");
    let out_s = out.to_string_lossy().into_owned();
    env.ok(&[
        "merge",
        "--method",
        "task-arithmetic",
        "--base",
        &base,
        "--expert",
        &e1,
        "--expert",
        &e2,
        "--param",
        "lambda=0.5",
        "--seed",
        "7",
        "--out",
        &out_s,
    ]);
    // τ1 = [1,0,0,1], τ2 = [0,2,0,-2]; θ = base + 0.5·(τ1+τ2) = [1.5, 3, 3, 3.5].
    close(&read(&out, "w"), &[1.5, 3.0, 3.0, 3.5]);
    close(&read(&out, "b"), &[0.5, -0.5]);
    let meta = Checkpoint::open(&out).unwrap().metadata();
    assert_eq!(meta["mergescope.method"], "task-arithmetic");
    assert_eq!(meta["mergescope.seed"], "7");
    let params: serde_json::Value = serde_json::from_str(&meta["mergescope.params"]).unwrap();
    assert_eq!(params["lambda"], 0.5);
    assert_eq!(params["task_weights"], serde_json::json!([1.0, 1.0]));
    let inputs: serde_json::Value = serde_json::from_str(&meta["mergescope.inputs"]).unwrap();
    assert_eq!(inputs[0]["role"], "base");
    assert_eq!(inputs[2]["name"], "e2.safetensors");
    assert!(inputs[1]["bytes"].as_u64().unwrap() > 0);
    assert!(!meta["mergescope.version"].is_empty());

    // The same merge from a recipe with relative paths gives identical bytes.
    std::fs::write(
        env.path("r.toml"),
        "method = \"task-arithmetic\"\nbase = \"base.safetensors\"\nexperts = [\"e1.safetensors\", \"e2.safetensors\"]\n\
         out = \"ta2.safetensors\"\nseed = 7\n[params]\nlambda = 0.5\n",
    )
    .unwrap();
    env.ok(&["merge", env.path("r.toml").to_str().unwrap()]);
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(env.path("ta2.safetensors")).unwrap()
    );
}

#[test]
fn dtypes_shards_and_int_buffers() {
    let env = Env::new();
    let ints = [3.0f32];
    let base = env.write(
        "base.safetensors",
        &[
            ("w", DType::BF16, &[4], &[1.0, 2.0, 3.0, 4.0]),
            ("steps", DType::parse("I32").unwrap(), &[1], &ints),
        ],
    );
    let e1 = env.write(
        "e1.safetensors",
        &[
            ("w", DType::BF16, &[4], &[3.0, 2.0, 1.0, 4.0]),
            ("steps", DType::parse("I32").unwrap(), &[1], &[9.0]),
        ],
    );
    let out = env.path("avg.safetensors");
    let o = env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--base",
        &base,
        "--expert",
        &base,
        "--expert",
        &e1,
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&o).unwrap();
    assert_eq!(report["copied_tensors"], 1);
    assert!(report["notes"].to_string().contains("non-float dtype I32"), "{report}");
    let c = Checkpoint::open(&out).unwrap();
    assert_eq!(c.tensors["w"].dtype, DType::BF16, "default output dtype = input dtype");
    close(&c.read_f32(&c.tensors["w"]).unwrap(), &[2.0, 2.0, 2.0, 4.0]);
    // The int buffer is the base's bytes (encode_f32 wrote 3.0f32's bits as the I32 payload).
    assert_eq!(c.raw_bytes(&c.tensors["steps"]).unwrap(), 3.0f32.to_le_bytes());

    let out32 = env.path("avg32");
    env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        &base,
        "--expert",
        &e1,
        "--dtype",
        "f32",
        "--shard-size",
        "10",
        "--out",
        out32.to_str().unwrap(),
    ]);
    let c = Checkpoint::open(&out32).unwrap();
    assert!(out32.join("model.safetensors.index.json").is_file());
    assert_eq!(c.files.len(), 2);
    assert_eq!(c.tensors["w"].dtype, DType::F32);
    // A sharded folder is a valid input too.
    let again = env.path("again.safetensors");
    env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        out32.to_str().unwrap(),
        "--expert",
        out32.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    close(&read(&again, "w"), &[2.0, 2.0, 2.0, 4.0]);
}

#[test]
fn inspect_and_plugins_list() {
    let env = Env::new();
    let (base, _, _) = three_models(&env);
    let j: serde_json::Value = serde_json::from_str(&env.ok(&["inspect", &base, "--json"])).unwrap();
    assert_eq!(j["parameters"], 6);
    assert_eq!(j["tensors"][1]["shape"], serde_json::json!([2, 2]));
    let list: serde_json::Value = serde_json::from_str(&env.ok(&["plugins", "list", "--json"])).unwrap();
    let ids: Vec<&str> = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    for id in ["cart", "consensus", "dare", "task-arithmetic", "ties", "weight-average"] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    let ta = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "task-arithmetic")
        .unwrap();
    assert_eq!(ta["params"][0]["name"], "lambda");
    assert_eq!(ta["params"][0]["default"], 0.3);
    assert_eq!(ta["kind"], "per-tensor");
}

#[test]
fn plugins_outside_the_app_folder_need_approval() {
    let env = Env::new();
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let lib = format!(
        "{}mergescope_plugin_weight_average{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let extra = env.path("extra");
    std::fs::create_dir_all(&extra).unwrap();
    std::fs::copy(deps.join(&lib), extra.join(&lib)).unwrap();
    // With no bundled plugins, the copy in --plugin-dir is found but not loaded.
    let run = |args: &[&str]| {
        let mut c = env.cmd();
        c.env("MERGESCOPE_BUNDLED_DIR", env.path("empty"))
            .arg("--plugin-dir")
            .arg(&extra)
            .args(args);
        c.output().unwrap()
    };
    let o = run(&["plugins", "list", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["plugins"].as_array().unwrap().len(), 0);
    assert!(j["needs_approval"][0]["path"].as_str().unwrap().ends_with(&lib));
    let (_, e1, e2) = three_models(&env);
    let out = env.path("o.safetensors");
    let o = run(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        &e1,
        "--expert",
        &e2,
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("plugins approve"), "{err}");
    let o = run(&["plugins", "approve", extra.join(&lib).to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        &e1,
        "--expert",
        &e2,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    close(&read(&out, "w"), &[1.5, 3.0, 3.0, 3.5]);

    // A rebuilt library (other bytes) needs approving again, and `plugins list` says why.
    let mut bytes = std::fs::read(extra.join(&lib)).unwrap();
    bytes.extend_from_slice(b"rebuilt");
    std::fs::write(extra.join(&lib), bytes).unwrap();
    let o = run(&["plugins", "list"]);
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains("changed since you approved it"), "{listed}");
    let o = run(&["plugins", "list", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["needs_approval"][0]["changed"], true);
    // A trusted development folder loads whatever is built into it, now and after rebuilds.
    let o = run(&["plugins", "approve", "--folder", extra.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["plugins", "list", "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["plugins"].as_array().unwrap().len(), 1, "{j}");
    assert!(j["needs_approval"].as_array().unwrap().is_empty(), "{j}");
}

/// `plugins new` makes a Rust and a C project that build out of the tree, offline, with nothing
/// but cargo and a C compiler; trusting their build folders loads them, and each merges like the
/// plugin it was made from (weighted averaging). An id that is not one, or a folder in the way,
/// is refused with nothing written.
#[test]
fn plugins_new_makes_rust_and_c_projects_that_build_and_merge() {
    let env = Env::new();
    let (_, e1, e2) = three_models(&env);
    let build = |dir: &std::path::Path, program: &str, args: &[&str]| {
        let o = std::process::Command::new(program)
            .args(args)
            .current_dir(dir)
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            o.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (id, flag, program, args, lib_dir) in [
        (
            "my-rust-method",
            "--rust",
            cargo.as_str(),
            &["build", "--release", "--offline"][..],
            "target/release",
        ),
        ("my-c-method", "--c", "make", &[][..], ""),
    ] {
        let dir = env.path(id);
        env.ok(&["plugins", "new", id, flag, "--dir", dir.to_str().unwrap()]);
        build(&dir, program, args);
        let libs = dir.join(lib_dir);
        let lib = libs.join(format!(
            "{}mergescope_plugin_{}{}",
            std::env::consts::DLL_PREFIX,
            id.replace('-', "_"),
            std::env::consts::DLL_SUFFIX
        ));
        let tested = env.ok(&["plugins", "test", lib.to_str().unwrap()]);
        assert!(
            tested.contains(" properties hold") && !tested.contains("FAIL"),
            "{tested}"
        );
        env.ok(&["plugins", "approve", "--folder", libs.to_str().unwrap()]);
        let out = env.path(&format!("{id}.safetensors"));
        env.ok(&[
            "--plugin-dir",
            libs.to_str().unwrap(),
            "merge",
            "--method",
            id,
            "--expert",
            &e1,
            "--expert",
            &e2,
            "--param",
            "weights=1,3",
            "--out",
            out.to_str().unwrap(),
        ]);
        // (e1 + 3·e2)/4 with e1 = (2, 2, 3, 5) and e2 = (1, 4, 3, 2).
        close(&read(&out, "w"), &[1.25, 3.5, 3.0, 2.75]);
    }
    let err = env.fails(&["plugins", "new", "My_Method"]);
    assert!(err.contains("is not a method id") && err.contains("my-method"), "{err}");
    let err = env.fails(&[
        "plugins",
        "new",
        "my-c-method",
        "--c",
        "--dir",
        env.path("my-c-method").to_str().unwrap(),
    ]);
    assert!(
        err.contains("already exists and is not empty") && err.contains("nothing was written"),
        "{err}"
    );
}

#[test]
fn bad_inputs_fail_with_actionable_messages() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = env.path("out.safetensors");
    let out_s = out.to_str().unwrap();
    let merge = |extra: &[&str]| {
        let mut a = vec!["merge", "--base", &base, "--expert", &e1, "--expert", &e2];
        a.extend_from_slice(extra);
        env.fails(&a)
    };
    let e = merge(&["--method", "tiez", "--out", out_s]);
    assert!(
        e.contains("unknown merge method 'tiez'") && e.contains("Did you mean 'ties'") && e.contains("task-arithmetic"),
        "{e}"
    );
    let e = merge(&["--method", "ties", "--param", "densty=0.3", "--out", out_s]);
    assert!(
        e.contains("no parameter 'densty'") && e.contains("Did you mean 'density'"),
        "{e}"
    );
    let e = merge(&["--method", "ties", "--param", "density=1.5", "--out", out_s]);
    assert!(e.contains("density") && e.contains("out of range"), "{e}");
    let e = merge(&["--method", "ties", "--param", "density", "--out", out_s]);
    assert!(e.contains("name=value"), "{e}");
    let e = env.fails(&["merge", "--method", "task-arithmetic", "--expert", &e1, "--out", out_s]);
    assert!(e.contains("needs the base model") && e.contains("--base"), "{e}");

    let missing = env.path("nope.safetensors");
    let e = merge(&[
        "--method",
        "ties",
        "--expert",
        missing.to_str().unwrap(),
        "--out",
        out_s,
    ]);
    assert!(e.contains("nope.safetensors") && e.contains("does not exist"), "{e}");

    std::fs::write(env.path("text.safetensors"), "hello, I am not a checkpoint").unwrap();
    let e = merge(&[
        "--method",
        "ties",
        "--expert",
        env.path("text.safetensors").to_str().unwrap(),
        "--out",
        out_s,
    ]);
    assert!(e.contains("text.safetensors") && e.contains("not safetensors"), "{e}");

    let mut truncated = std::fs::read(&e1).unwrap();
    truncated.truncate(truncated.len() - 3);
    std::fs::write(env.path("trunc.safetensors"), truncated).unwrap();
    let e = merge(&[
        "--method",
        "ties",
        "--expert",
        env.path("trunc.safetensors").to_str().unwrap(),
        "--out",
        out_s,
    ]);
    assert!(e.contains("trunc.safetensors") && e.contains("truncated"), "{e}");

    let odd = env.write(
        "odd.safetensors",
        &[("w", DType::F32, &[4], &[1.0; 4]), ("extra", DType::F32, &[1], &[0.0])],
    );
    let e = merge(&["--method", "ties", "--expert", &odd, "--out", out_s]);
    assert!(
        e.contains("incompatible")
            && e.contains("'w' has shape [4]")
            && e.contains("'extra'")
            && e.contains("'b' is missing"),
        "{e}"
    );

    let before = std::fs::read(&e1).unwrap();
    let e = merge(&["--method", "ties", "--out", &e1]);
    assert!(e.contains("one of the inputs"), "{e}");
    let e = merge(&["--method", "ties", "--out", &e1, "--overwrite"]);
    assert!(e.contains("one of the inputs"), "{e}");
    assert_eq!(std::fs::read(&e1).unwrap(), before, "inputs are never modified");

    std::fs::write(&out, "precious").unwrap();
    let e = merge(&["--method", "ties", "--out", out_s]);
    assert!(e.contains("already exists") && e.contains("--overwrite"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    let e = merge(&["--method", "ties", "--dtype", "f8", "--out", out_s]);
    assert!(e.contains("--dtype 'f8'"), "{e}");
    let e = merge(&[
        "--method",
        "ties",
        "--out",
        env.path("no/such/dir/o.safetensors").to_str().unwrap(),
    ]);
    assert!(e.contains("does not exist"), "{e}");
    let leftovers: Vec<_> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files are left behind");
}

#[test]
fn eval_and_merge_eval_on_a_benchmark() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    let b = bench.to_string_lossy().into_owned();
    let expert = bench.join("experts/mnist.safetensors").to_string_lossy().into_owned();
    // An expert scores exactly 1 normalised on its own task.
    let out = env.ok(&["eval", "--checkpoint", &expert, "--benchmark", &b, "--json"]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let tasks = j["report"]["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    let mnist = tasks.iter().find(|t| t["task"] == "mnist").unwrap();
    assert_eq!(mnist["normalized"].as_f64(), Some(1.0));
    assert_eq!(mnist["examples"].as_u64(), Some(500));
    assert_eq!(j["device"], "cpu");
    // `--device cuda` reports the device it ran on: CUDA where the build and the machine have
    // it, else the CPU with a warning saying why, and the same scores either way.
    let o = env.run(&[
        "eval",
        "--checkpoint",
        &expert,
        "--benchmark",
        &b,
        "--device",
        "cuda",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let on: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let warned = String::from_utf8_lossy(&o.stderr).contains("running on the CPU");
    assert_eq!(on["device"], if warned { "cpu" } else { "cuda" });
    for (a, b) in tasks.iter().zip(on["report"]["tasks"].as_array().unwrap()) {
        assert_eq!(a["task"], b["task"]);
        let (x, y) = (a["accuracy"].as_f64().unwrap(), b["accuracy"].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 0.002,
            "{} on cpu {x}, on {}: {y}",
            a["task"],
            on["device"]
        );
    }
    // The table and --tasks / --split.
    let out = env.ok(&[
        "eval",
        "--checkpoint",
        &expert,
        "--benchmark",
        &b,
        "--tasks",
        "letters",
        "--split",
        "calibration",
    ]);
    assert!(
        out.contains("letters") && !out.contains("mnist ") && out.contains("calibration split"),
        "{out}"
    );
    // merge with the benchmark's base and experts, evaluated right away; weight averaging of
    // two experts is their midpoint, and its evaluation is the one `eval` prints.
    let merged = env.path("wa.safetensors").to_string_lossy().into_owned();
    let out = env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--benchmark",
        &b,
        "--out",
        &merged,
        "--eval",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let again: serde_json::Value =
        serde_json::from_str(&env.ok(&["eval", "--checkpoint", &merged, "--benchmark", &b, "--json"])).unwrap();
    assert_eq!(j["eval"]["report"], again["report"]);
    let a = read(&bench.join("experts/letters.safetensors"), "fc2.bias");
    let m = read(&bench.join("experts/mnist.safetensors"), "fc2.bias");
    let mid: Vec<f32> = a.iter().zip(&m).map(|(x, y)| (x + y) / 2.0).collect();
    close(&read(Path::new(&merged), "fc2.bias"), &mid);
    // Errors name the problem and the fix.
    let e = env.fails(&["eval", "--checkpoint", &expert, "--benchmark", &b, "--tasks", "mnsit"]);
    assert!(
        e.contains("unknown task 'mnsit'") && e.contains("letters, mnist"),
        "{e}"
    );
    let e = env.fails(&["eval", "--checkpoint", &expert]);
    assert!(
        e.contains("no demo benchmark for mlp") && e.contains("mergescope demo build --arch mlp"),
        "{e}"
    );
    // A demo in the cache built by an older recipe is named as such, with the rebuild command,
    // by `eval` and by `demo list`.
    let cached = env.path("cache").join("demo").join("mlp-seed0");
    std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
    copy_dir(&bench, &cached);
    let manifest = cached.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["recipe_version"] = serde_json::json!(mergescope_lab::demo::RECIPE_VERSION - 1);
    std::fs::write(&manifest, serde_json::to_string(&m).unwrap()).unwrap();
    let e = env.fails(&["eval", "--checkpoint", &expert]);
    let old = format!("built by recipe {}", mergescope_lab::demo::RECIPE_VERSION - 1);
    assert!(
        e.contains(&old) && e.contains("mergescope demo build --arch mlp` to rebuild it"),
        "{e}"
    );
    let list = env.ok(&["demo", "list"]);
    assert!(list.contains("outdated:") && list.contains(&old), "{list}");
    let other = env.write("other.safetensors", &[("w", DType::F32, &[2], &[1.0, 2.0])]);
    let e = env.fails(&["eval", "--checkpoint", &other, "--benchmark", &b]);
    assert!(
        e.contains("not a mlp backbone") && e.contains("'fc1.weight' is missing"),
        "{e}"
    );
    let e = env.fails(&["eval", "--checkpoint", &expert, "--benchmark", &b, "--split", "train"]);
    assert!(e.contains("use test or calibration"), "{e}");
    // --device picks where the evaluation runs; an unknown one is named with the choices.
    let on_cpu: serde_json::Value = serde_json::from_str(&env.ok(&[
        "eval",
        "--checkpoint",
        &merged,
        "--benchmark",
        &b,
        "--device",
        "cpu",
        "--json",
    ]))
    .unwrap();
    assert_eq!(on_cpu["report"], again["report"]);
    let e = env.fails(&["eval", "--checkpoint", &expert, "--benchmark", &b, "--device", "tpu"]);
    assert!(
        e.contains("--device 'tpu'") && e.contains("use cpu, cuda or metal"),
        "{e}"
    );
}

/// A model-level method's output is sharded by the same rules as a per-tensor merge's: as
/// `--shard-size` asks, and otherwise like a sharded base.
#[test]
fn model_level_outputs_are_sharded_like_per_tensor_ones() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    let b = s(&bench).to_owned();
    let shards = |dir: &Path| -> Vec<String> {
        let index: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
        let mut files: Vec<String> = index["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        files.sort();
        files.dedup();
        files
    };
    let fw = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "merge",
            "--method",
            "frank-wolfe",
            "--benchmark",
            &b,
            "--param",
            "iterations=2",
            "--out",
            s(out),
            "-q",
        ];
        args.extend_from_slice(extra);
        env.ok(&args);
    };
    // Asked for: 300 kB shards of the ~930 kB MLP.
    let asked = env.path("fw-asked");
    fw(&asked, &["--shard-size", "300KB"]);
    assert!(shards(&asked).len() >= 2, "{:?}", shards(&asked));
    // Not asked for, from a base sharded in 400 kB files: the output is sharded too.
    let sharded_base = env.path("base-sharded");
    env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        s(&bench.join("base.safetensors")),
        "--shard-size",
        "400KB",
        "--out",
        s(&sharded_base),
        "-q",
    ]);
    assert!(shards(&sharded_base).len() >= 2);
    let like_base = env.path("fw-like-base");
    fw(&like_base, &["--base", s(&sharded_base)]);
    assert!(shards(&like_base).len() >= 2, "{:?}", shards(&like_base));
    // The same merge either way: the shards hold the single file's tensors.
    let single = env.path("fw.safetensors");
    fw(&single, &[]);
    for name in ["fc1.weight", "fc2.bias"] {
        assert_eq!(read(&asked, name), read(&single, name), "{name}");
    }
}

/// `compare` runs per-tensor and model-level methods on a benchmark, picks λ by calibration
/// accuracy (checked against `eval --split calibration` of merges at each grid value), and
/// its table agrees with `eval` of the checkpoints it leaves; it never overwrites a table.
#[test]
fn compare_writes_a_results_table_that_eval_confirms() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    let b = bench.to_string_lossy().into_owned();
    let out_dir = env.path("cmp");
    let o = out_dir.to_string_lossy().into_owned();
    let args = [
        "compare",
        "--benchmark",
        &b,
        "--arch",
        "mlp",
        "--methods",
        "weight-average,task-arithmetic,fisher",
        "--lambda-grid",
        "0.2,1.0",
        "--out-dir",
        &o,
        "-q",
    ];
    let stdout = env.ok(&args);
    let md = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    assert!(stdout.contains(&md), "stdout shows the table");
    for row in [
        "| Pretrained (base) |",
        "| Individual (experts) |",
        "| Weight averaging | defaults |",
        "| Fisher merging | defaults |",
    ] {
        assert!(md.contains(row), "{row} missing in:\n{md}");
    }
    let csv = std::fs::read_to_string(out_dir.join("results.csv")).unwrap();
    let average = |method: &str| -> (String, f64) {
        let line = csv
            .lines()
            .find(|l| l.starts_with(&format!("\"{method}\"")) && l.contains(",average,"))
            .unwrap_or_else(|| panic!("no average row for {method} in\n{csv}"));
        let cols: Vec<&str> = line.split(',').collect();
        (cols[1].trim_matches('"').to_owned(), cols[3].parse().unwrap())
    };
    // Each table entry is what `eval` says about the checkpoint left behind.
    for method in ["weight-average", "task-arithmetic", "fisher"] {
        let ckpt = out_dir
            .join(format!("{method}.safetensors"))
            .to_string_lossy()
            .into_owned();
        let j: serde_json::Value =
            serde_json::from_str(&env.ok(&["eval", "--checkpoint", &ckpt, "--benchmark", &b, "--json"])).unwrap();
        let want = j["report"]["mean_accuracy"].as_f64().unwrap();
        let (_, got) = average(method);
        assert!((got - want).abs() < 1e-12, "{method}: table {got} vs eval {want}");
    }
    // λ: the grid value whose merge is more accurate on the calibration split.
    let calib = |lambda: &str| -> f64 {
        let path = env
            .path(&format!("ta-{lambda}.safetensors"))
            .to_string_lossy()
            .into_owned();
        env.ok(&[
            "merge",
            "--method",
            "task-arithmetic",
            "--benchmark",
            &b,
            "--param",
            &format!("lambda={lambda}"),
            "--out",
            &path,
            "-q",
        ]);
        let j: serde_json::Value = serde_json::from_str(&env.ok(&[
            "eval",
            "--checkpoint",
            &path,
            "--benchmark",
            &b,
            "--split",
            "calibration",
            "--json",
        ]))
        .unwrap();
        j["report"]["mean_accuracy"].as_f64().unwrap()
    };
    let (low, high) = (calib("0.2"), calib("1.0"));
    // The λ search, point by point: what `eval` says of each candidate on the calibration split
    // (a grid given on the command line is not extended).
    let search = std::fs::read_to_string(out_dir.join("lambda_search.csv")).unwrap();
    let chosen = if high > low { "1" } else { "0.2" };
    let lines: Vec<&str> = search.lines().collect();
    assert_eq!(lines[0], "method,lambda,calibration_accuracy,above_grid,chosen");
    assert_eq!(lines.len(), 3, "{search}");
    for (line, (lambda, acc)) in lines[1..].iter().zip([("0.2", low), ("1", high)]) {
        let cols: Vec<&str> = line.split(',').collect();
        assert_eq!(
            (cols[0], cols[1], cols[3]),
            ("task-arithmetic", lambda, "false"),
            "{line}"
        );
        assert!(
            (cols[2].parse::<f64>().unwrap() - acc).abs() < 1e-12,
            "{line} vs eval {acc}"
        );
        assert_eq!(cols[4], (lambda == chosen).to_string(), "{line}");
    }
    let expected = if high > low {
        "λ = 1 (calibration)"
    } else {
        "λ = 0.2 (calibration)"
    };
    assert_eq!(
        average("task-arithmetic").0,
        expected,
        "calibration accuracy 0.2: {low}, 1.0: {high}"
    );
    // A second run must not replace the first one's results.
    let e = env.fails(&args);
    assert!(e.contains("--overwrite"), "{e}");
}

/// The value of `series` at `x` in a lines CSV (`series,x,value,axis`).
fn lines_csv_value(csv: &str, series: &str, x: f64) -> f64 {
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|c| c[0] == series && (c[1].parse::<f64>().unwrap() - x).abs() < 1e-9)
        .unwrap_or_else(|| panic!("no {series} at {x} in\n{csv}"))[2]
        .parse()
        .unwrap()
}

/// A landscape point is the evaluation of the model it stands for: task arithmetic's λ line
/// at λ = 0.5 equals `merge --method task-arithmetic --param lambda=0.5` then `eval`. The
/// grid is cached (a second run computes nothing) and outputs are never overwritten silently.
#[test]
fn analyze_landscape_points_are_direct_evaluations() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    let b = bench.to_string_lossy().into_owned();
    let csv = env.path("ta.csv").to_string_lossy().into_owned();
    let args = [
        "analyze",
        "landscape",
        "--benchmark",
        &b,
        "--arch",
        "mlp",
        "--kind",
        "ta-line",
        "--lambdas",
        "0:1:3",
        "--metric",
        "loss",
        "--samples",
        "0",
        "--csv",
        &csv,
        "-q",
    ];
    let first = env.run(&args);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(String::from_utf8_lossy(&first.stderr).contains("3 computed, 0 from the cache"));
    let table = std::fs::read_to_string(&csv).unwrap();
    let merged = env.path("ta.safetensors").to_string_lossy().into_owned();
    let base = bench.join("base.safetensors").to_string_lossy().into_owned();
    let e1 = bench.join("experts/letters.safetensors").to_string_lossy().into_owned();
    let e2 = bench.join("experts/mnist.safetensors").to_string_lossy().into_owned();
    env.ok(&[
        "merge",
        "--method",
        "task-arithmetic",
        "--base",
        &base,
        "--expert",
        &e1,
        "--expert",
        &e2,
        "--param",
        "lambda=0.5",
        "--out",
        &merged,
        "-q",
    ]);
    let j: serde_json::Value =
        serde_json::from_str(&env.ok(&["eval", "--checkpoint", &merged, "--benchmark", &b, "--json"])).unwrap();
    let direct = j["report"]["mean_loss"].as_f64().unwrap();
    let on_line = lines_csv_value(&table, "mean loss", 0.5);
    assert!(
        (on_line - direct).abs() < 1e-4 * direct.max(1.0),
        "landscape {on_line} vs eval {direct}"
    );
    // λ = 0 is the base.
    let j: serde_json::Value =
        serde_json::from_str(&env.ok(&["eval", "--checkpoint", &base, "--benchmark", &b, "--json"])).unwrap();
    let at_zero = lines_csv_value(&table, "mean loss", 0.0);
    assert!((at_zero - j["report"]["mean_loss"].as_f64().unwrap()).abs() < 1e-4);
    // The existing CSV is kept unless --overwrite; with it, the cached grid answers.
    assert!(env.fails(&args).contains("--overwrite"));
    let mut again = args.to_vec();
    again.push("--overwrite");
    let second = env.run(&again);
    assert!(String::from_utf8_lossy(&second.stderr).contains("0 computed, 3 from the cache"));
    let cached = std::fs::read_to_string(&csv).unwrap();
    for x in [0.0, 0.5, 1.0] {
        let (a, b) = (
            lines_csv_value(&cached, "mean loss", x),
            lines_csv_value(&table, "mean loss", x),
        );
        assert!((a - b).abs() < 1e-12, "cached {a} vs computed {b}");
    }
}

/// PCA, cosine, spectrum (and R/I curves) and radar write PNGs and CSVs with the numbers the
/// views promise: task vectors have cosine 1 with themselves, an expert scores 100 % of itself
/// on its own task, and R(k) falls to 0 at full rank.
#[test]
fn analyze_views_write_pictures_and_numbers() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark(&bench);
    let b = bench.to_string_lossy().into_owned();
    let out = |name: &str| env.path(name).to_string_lossy().into_owned();
    let common = ["--benchmark", b.as_str(), "--arch", "mlp"];
    let expert = bench.join("experts/mnist.safetensors").to_string_lossy().into_owned();
    let views: [(&str, Vec<&str>); 5] = [
        ("pca", vec!["--checkpoint", &expert]),
        ("cosine", vec![]),
        ("spectrum", vec![]),
        ("spectrum", vec!["--curves"]),
        ("radar", vec!["--checkpoint", &expert]),
    ];
    for (i, (view, extra)) in views.iter().enumerate() {
        let (png, csv) = (out(&format!("{i}.png")), out(&format!("{i}.csv")));
        let mut args = vec!["analyze", view];
        args.extend(common);
        args.extend(extra.iter().copied());
        args.extend(["--png", &png, "--csv", &csv]);
        env.ok(&args);
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..4], b"\x89PNG", "{view}");
    }
    let csv = |i: usize| std::fs::read_to_string(env.path(&format!("{i}.csv"))).unwrap();
    let pca = csv(0);
    assert!(pca.lines().any(|l| l.starts_with("point,base,,base,")), "{pca}");
    assert_eq!(pca.lines().filter(|l| l.starts_with("point,expert,")).count(), 2);
    let cosine = csv(1);
    for task in ["letters", "mnist"] {
        let row = format!("{task},{task},");
        let v: f64 = cosine.lines().find(|l| l.starts_with(&row)).unwrap()[row.len()..]
            .parse()
            .unwrap();
        assert!((v - 1.0).abs() < 1e-9, "{cosine}");
    }
    let curves = csv(3);
    let last_r = curves.lines().rfind(|l| l.starts_with("R(k) centred,")).unwrap();
    let r: f64 = last_r.split(',').nth(2).unwrap().parse().unwrap();
    assert!(r.abs() < 1e-9, "R at full rank: {last_r}");
    let radar = csv(4);
    let header: Vec<&str> = radar.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = radar
        .lines()
        .find(|l| l.starts_with("mnist,"))
        .unwrap()
        .split(',')
        .collect();
    let col = header.iter().position(|h| *h == "mnist").unwrap();
    assert_eq!(row[col].parse::<f64>().unwrap(), 1.0, "{radar}");
}

/// Every row of a sweep's results without its timing column, sorted.
fn sweep_rows(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let mut rows: Vec<String> = text
        .lines()
        .skip(1)
        .map(|l| l.rsplit_once(',').unwrap().0.to_owned())
        .collect();
    rows.sort();
    rows
}

/// A learning rate at which fine-tuning diverges is a measurement, not a failure: the sweep
/// finishes, records that point's experts and merges as collapsed (NaN), leaves a marker with
/// the step beside the run's snapshots, names the point in the fits and plots, and a rerun
/// reuses those cells instead of training again.
#[test]
fn a_diverging_run_is_recorded_as_collapsed() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark_of(&bench, &["mnist", "letters"]);
    let spec = env.path("blowup.toml");
    std::fs::write(
        &spec,
        format!(
            r#"arch = "mlp"
benchmark = "{}"
groups = 1
eval_examples = 50
[defaults]
lr = 1e-3
batch = 16
steps = 6
data_ratio = 1.0
optimizer = "sgd"
tasks = 2
[grid]
lr = [1e-3, 1e30]
[[methods]]
plugin = "task-arithmetic"
label = "TA"
params = {{ lambda = "1/N" }}
"#,
            bench.display().to_string().replace('\\', "/")
        ),
    )
    .unwrap();
    let spec_s = spec.to_string_lossy().into_owned();
    let out_dir = env.path("sweep");
    let o = out_dir.to_string_lossy().into_owned();
    let stdout = env.ok(&["sweep", &spec_s, "--out", &o, "--quiet"]);
    let rows = sweep_rows(&out_dir);
    let (blown, fine): (Vec<&String>, Vec<&String>) = rows
        .iter()
        .partition(|r| r.starts_with("1000000000000000000000000000000,"));
    // Two experts and TA on each of the two tasks, at each learning rate.
    assert_eq!((blown.len(), fine.len()), (4, 4), "{rows:?}");
    for r in &blown {
        let f: Vec<&str> = r.split(',').collect();
        assert_eq!((f[10], f[11]), ("NaN", "NaN"), "{r}");
    }
    for r in &fine {
        let acc: f64 = r.split(',').nth(10).unwrap().parse().unwrap();
        assert!(acc > 0.0 && acc <= 1.0, "{r}");
    }
    let marker = std::fs::read_to_string(
        out_dir.join("models/experts/lr1000000000000000000000000000000_b16_a1_sgd/mnist.diverged"),
    )
    .unwrap();
    let step: usize = marker.lines().next().unwrap().parse().unwrap();
    assert!((1..=6).contains(&step), "{marker}");
    assert!(marker.contains("training diverged at step"), "{marker}");
    let named = "collapsed (fine-tuning diverged; left out of curves and fits): TA at 1000000000000000000000000000000 (1/1 groups), experts at 1000000000000000000000000000000 (1/1 groups)";
    assert!(stdout.contains(named), "{stdout}");
    assert!(
        std::fs::read_to_string(out_dir.join("fits.md"))
            .unwrap()
            .contains(named)
    );
    // Rerun: every cell, the collapsed ones included, is reused; nothing is trained again.
    let again = env.run(&["sweep", &spec_s, "--out", &o, "--quiet"]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("(6 reused"), "{err}");
    assert_eq!(sweep_rows(&out_dir), rows);
}

/// A sweep killed in the middle resumes where it stopped, redoes no finished cell, and ends
/// with exactly the rows of an uninterrupted run; its plots and fits are written; a group of
/// one task merged by TA with λ = 1/N is that task's expert.
#[test]
fn a_killed_sweep_resumes_to_the_same_results() {
    let env = Env::new();
    let bench = env.path("bench");
    tiny_benchmark_of(&bench, &["mnist", "letters", "fashion_mnist"]);
    let spec = env.path("tiny.toml");
    std::fs::write(
        &spec,
        format!(
            r#"arch = "mlp"
benchmark = "{}"
groups = 2
eval_examples = 100
[defaults]
lr = 1e-3
batch = 16
steps = 20
data_ratio = 1.0
optimizer = "adamw"
tasks = 2
[grid]
steps = [5, 10, 20]
data_ratio = [0.5, 1.0]
tasks = [1, 2, 3]
[[methods]]
plugin = "task-arithmetic"
label = "TA"
params = {{ lambda = "1/N" }}
[[methods]]
plugin = "ties"
label = "TIES"
"#,
            bench.display().to_string().replace('\\', "/")
        ),
    )
    .unwrap();
    let spec_s = spec.to_string_lossy().into_owned();

    let whole = env.path("whole");
    let w = whole.to_string_lossy().into_owned();
    let out = env.ok(&["sweep", &spec_s, "--out", &w, "--quiet"]);
    assert!(
        out.contains("| steps | TA |") && out.contains("| tasks | TIES |"),
        "{out}"
    );
    let expected = sweep_rows(&whole);
    for f in ["steps-loss.png", "data_ratio-accuracy.png", "tasks-loss.csv"] {
        assert!(whole.join("plots").join(f).is_file(), "{f}");
    }
    assert!(
        std::fs::read_to_string(whole.join("fits.md"))
            .unwrap()
            .contains("a + c/α")
    );

    // Kill a second run once some cells are written, then run it again.
    let killed = env.path("killed");
    let k = killed.to_string_lossy().into_owned();
    let mut child = env
        .cmd()
        .args(["sweep", &spec_s, "--out", &k, "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let results = killed.join("results.csv");
    loop {
        let lines = std::fs::read_to_string(&results).map_or(0, |t| t.lines().count());
        if lines > 4 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before it could be killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let partial = sweep_rows(&killed);
    assert!(
        partial.len() < expected.len(),
        "killed after {} of {} rows",
        partial.len(),
        expected.len()
    );
    // Every finished cell is reused: each expert row is a cell, a merge cell has a row per task.
    let cells: std::collections::BTreeSet<String> = partial
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f[8] == "expert" { l.clone() } else { f[..9].join(",") }
        })
        .collect();
    let o = env.run(&["sweep", &spec_s, "--out", &k, "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("({} reused", cells.len())),
        "{} cells were finished: {err}",
        cells.len()
    );
    assert_eq!(sweep_rows(&killed), expected);

    // N = 1: task arithmetic with λ = 1 returns the group's expert.
    let split = |l: &str| l.split(',').map(str::to_owned).collect::<Vec<_>>();
    let rows: Vec<Vec<String>> = expected.iter().map(|l| split(l)).collect();
    let mut checked = 0;
    for r in rows.iter().filter(|r| r[5] == "1" && r[8] == "TA") {
        let e = rows
            .iter()
            .find(|e| e[8] == "expert" && e[9] == r[9] && e[0..5] == r[0..5])
            .unwrap();
        assert_eq!(r[10], e[10], "accuracy of TA(N=1) vs the {} expert", r[9]);
        let (a, b): (f64, f64) = (r[11].parse().unwrap(), e[11].parse().unwrap());
        assert!((a - b).abs() < 1e-5, "loss {a} vs {b}");
        checked += 1;
    }
    assert!(checked >= 2, "{checked}");

    // Experts record their step count and training-set size (half the data at α = 0.5).
    let meta = |f: &str| {
        Checkpoint::open(&whole.join("models/experts").join(f)).unwrap().files[0]
            .metadata
            .clone()
    };
    let k5 = meta("lr0.001_b16_a1_adamw/mnist.k5.safetensors");
    assert_eq!(k5["mergescope.train.steps"], "5");
    let full: usize = k5["mergescope.train.examples"].parse().unwrap();
    let half: usize = meta("lr0.001_b16_a0.5_adamw/mnist.k20.safetensors")["mergescope.train.examples"]
        .parse()
        .unwrap();
    assert!((half as f64 / full as f64 - 0.5).abs() < 0.01, "{half} of {full}");

    // Effective weights from the recorded step counts: K = 5, 10, 20 give 1/7, 2/7, 4/7.
    let base = bench.join("base.safetensors").to_string_lossy().into_owned();
    let exp = |f: &str| {
        whole
            .join("models/experts/lr0.001_b16_a1_adamw")
            .join(f)
            .to_string_lossy()
            .into_owned()
    };
    let (e5, e10, e20) = (
        exp("mnist.k5.safetensors"),
        exp("letters.k10.safetensors"),
        exp("fashion_mnist.k20.safetensors"),
    );
    let b = bench.to_string_lossy().into_owned();
    let common = ["--benchmark", b.as_str(), "--arch", "mlp", "--base", base.as_str()];
    let with = |cmd: &str, extra: &[&str]| {
        let mut v = vec!["analyze", cmd];
        v.extend(common);
        v.extend(["--expert", &e5, "--expert", &e10, "--expert", &e20]);
        v.extend(extra);
        v.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let args = with("weights", &[]);
    let csv = env.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let lambda: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    for (got, want) in lambda.iter().zip([1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]) {
        assert!((got - want).abs() < 1e-9, "{csv}");
    }
    // The heterogeneity proxy: one row per task with before, after and a signed δ.
    let args = with("heterogeneity", &["--mask", "dare", "--drop", "0.3"]);
    let csv = env.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert!(csv.lines().next().unwrap().contains("after DARE (drop 0.3)"), "{csv}");
    // The bound: four variants (χ² × constant), each split into stability and optimisation.
    let args = with(
        "bound",
        &["--examples", "8", "--csv", &env.path("bound.csv").to_string_lossy()],
    );
    let out = env.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.contains("| mnist | 0.333 | 5 | 16 |"), "{out}");
    let csv = std::fs::read_to_string(env.path("bound.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(csv.contains("standard χ², constant 12"), "{csv}");

    // A different specification in the same folder is refused, naming what differs.
    std::fs::write(
        &spec,
        std::fs::read_to_string(&spec)
            .unwrap()
            .replace("groups = 2\n", "groups = 2\nseed = 7\n"),
    )
    .unwrap();
    let o = env.run(&["sweep", &spec_s, "--out", &k, "--quiet"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("different seed"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The MLP demo build is the same bytes with one worker thread and with three (issue #29): the
/// thread count decides no summation order in training or evaluation. The manifest records the
/// kernel path the build was trained with.
#[test]
fn demo_builds_are_byte_identical_across_thread_counts() {
    let hashes = |threads: &str| {
        let env = Env::new();
        let o = env
            .cmd()
            .env("RAYON_NUM_THREADS", threads)
            .args(["demo", "build", "--arch", "mlp"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let dir = env.path("cache/demo/mlp-seed0");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        assert!(!manifest["kernel_path"].as_str().unwrap().is_empty(), "{manifest}");
        let mut files: Vec<(String, Vec<u8>)> = walk(&dir)
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .map(|p| {
                (
                    p.strip_prefix(&dir).unwrap().display().to_string(),
                    std::fs::read(&p).unwrap(),
                )
            })
            .collect();
        files.sort();
        assert_eq!(files.len(), 9, "base, heads and seven experts");
        files
    };
    let one = hashes("1");
    let three = hashes("3");
    for ((name, a), (_, b)) in one.iter().zip(&three) {
        assert!(a == b, "{name} differs between 1 and 3 threads");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A mergekit configuration run three ways gives the same folder: `merge --config`, `merge
/// merge.yml`, and `recipe convert` followed by `merge recipe.toml`; the folder holds the base's
/// config with the output dtype, and the bad cases say what to pass.
#[test]
fn a_mergekit_config_runs_directly_and_as_a_converted_recipe() {
    let env = Env::new();
    let mk = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mergekit")
        .canonicalize()
        .unwrap();
    let yml = env.path("merge.yml");
    let text = format!(
        "merge_method: ties\nbase_model: {m}/inputs/base\nmodels:\n  - model: {m}/inputs/base\n  - model: \
         {m}/inputs/expert1\n    parameters: {{density: 0.5, weight: 0.7}}\n  - model: {m}/inputs/expert3\n    \
         parameters: {{density: 0.3, weight: 0.4}}\nparameters:\n  normalize: true\n  int8_mask: true\ndtype: \
         bfloat16\n",
        m = mk.display()
    );
    std::fs::write(&yml, &text).unwrap();
    let (a, b, c) = (env.path("a"), env.path("b"), env.path("c"));
    let o = env.run(&["merge", "--config", s(&yml), "--out", s(&a), "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("int8_mask"),
        "the ignored key is noted"
    );
    env.ok(&["merge", s(&yml), "--out", s(&b), "-q"]);
    let recipe = env.path("recipe.toml");
    env.ok(&["recipe", "convert", s(&yml), "-o", s(&recipe), "--out", s(&c)]);
    let toml_text = std::fs::read_to_string(&recipe).unwrap();
    for needle in [
        "method = \"ties\"",
        "hf_folder = true",
        "dtype = \"bf16\"",
        "count_rule = \"mergekit\"",
    ] {
        assert!(toml_text.contains(needle), "{needle} in\n{toml_text}");
    }
    env.ok(&["merge", s(&recipe), "-q"]);
    let weights = |dir: &Path| std::fs::read(dir.join("model.safetensors")).unwrap();
    assert_eq!(weights(&a), weights(&b));
    assert_eq!(weights(&a), weights(&c));
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(a.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    assert_eq!(config["model_type"], "llama");
    assert_eq!(
        Checkpoint::open(&a).unwrap().tensors["model.norm.weight"].dtype,
        DType::BF16
    );
    // Without --out; converting onto an existing recipe.
    let e = env.fails(&["merge", "--config", s(&yml)]);
    assert!(e.contains("--out FOLDER"), "{e}");
    let e = env.fails(&["recipe", "convert", s(&yml), "-o", s(&recipe)]);
    assert!(e.contains("already exists") && e.contains("--overwrite"), "{e}");
}
