//! `analyze oracle` (seed 004 on the text benchmark) given the wrong thing: settings that
//! cannot run, folders that are not text builds, builds that are damaged, tasks and batches the
//! build lacks. Every refusal names the option or the file and what to give instead, and comes
//! before any gradient step. The builds here are real text builds of a tiny random BERT (no
//! download; one expert step on 16 texts per task), so the refusals after the build is read
//! are the real code's.

use super::refuses;
use crate::common::*;
use mergescope_lab::text_bench::tiny::tiny_backbone;
use std::path::{Path, PathBuf};

/// A text build of the tiny backbone in the test folder: two tasks, 16 train and 8 test texts
/// each, 16 tokens, one expert step.
fn tiny_text_build(env: &Env) -> mergescope_engine::error::Result<PathBuf> {
    let backbone = tiny_backbone(env.dir.path())?;
    let out = env.path("text");
    env.ok(&[
        "demo",
        "build",
        "--benchmark",
        "text",
        "--backbone",
        s(&backbone),
        "--out",
        s(&out),
        "--text-tasks",
        "word_sentiment,name_gender",
        "--text-steps",
        "1",
        "--text-batch",
        "4",
        "--text-max-train",
        "16",
        "--text-max-eval",
        "8",
        "--text-max-length",
        "16",
        "-q",
    ]);
    Ok(out)
}

/// `analyze oracle --text-bench DIR` with `extra` options, which must be refused naming each
/// of `needles`.
fn oracle(env: &Env, dir: &str, extra: &[&str], needles: &[&str]) -> String {
    let mut args = vec!["analyze", "oracle", "--text-bench", dir];
    args.extend_from_slice(extra);
    args.push("-q");
    refuses(env, &args, needles)
}

#[test]
fn oracle_settings_that_cannot_run_are_refused_before_any_work() {
    let env = Env::new();
    // Settings are checked before the folder is: no build is needed to refuse them.
    let dir = env.path("no-build");
    let dir = s(&dir);
    for (flags, needles) in [
        (&["--lr", "0"][..], &["--lr 0:", "positive", "e.g. --lr 5e-6,1e-5"][..]),
        (&["--lr", "-1e-5"], &["--lr -0.00001:", "positive"]),
        (&["--lr", "1e-5,-1e-5"], &["--lr -0.00001:", "positive"]),
        (&["--lr", "NaN"], &["--lr NaN:", "positive"]),
        (&["--lr", "inf"], &["--lr inf:", "positive"]),
        (
            &["--lr", "fast"],
            &["--lr 'fast' is not a number", "e.g. --lr 5e-6,1e-5"],
        ),
        (&["--lr", ""], &["--lr: give at least one learning rate"]),
        (
            &["--lr", "1e-5,,2e-5"],
            &["--lr '1e-5,,2e-5': an empty entry between commas"],
        ),
        (
            &["--epochs", "1,0"],
            &["--epochs 0:", "at least 1", "e.g. --epochs 1,2,4"],
        ),
        (
            &["--epochs", "-2"],
            &["--epochs '-2' is negative", "e.g. --epochs 1,2,4"],
        ),
        (&["--epochs", "1.5"], &["--epochs '1.5' is not a whole number"]),
        (&["--epochs", ""], &["--epochs: give at least one epoch count"]),
        (&["--examples", "0"], &["--examples 0:", "give --examples 1 or more"]),
        (
            &["--examples", "-3"],
            &["--examples '-3' is negative", "e.g. --examples 32"],
        ),
        (&["--examples", "many"], &["--examples 'many' is not a whole number"]),
        (&["--alpha", "0"], &["--alpha 0:", "positive", "--alpha 1"]),
        (&["--alpha", "-1"], &["--alpha -1:", "positive"]),
        (&["--alpha", "NaN"], &["--alpha NaN:", "positive"]),
        (&["--max-length", "0"], &["--max-length 0:", "between 1 and 128"]),
        (
            &["--max-length", "500"],
            &["--max-length 500:", "leave --max-length out"],
        ),
        (
            &["--tasks", "a,b,a"],
            &["--tasks names 'a' twice", "name each task once"],
        ),
        (
            &["--tasks", "a,,b"],
            &["--tasks: an empty task name", "leave --tasks out for all"],
        ),
        (&["--device", "tpu"], &["--device 'tpu'", "cpu, cuda or metal"]),
        (&["--size", "10"], &["--size '10'", "e.g. 1000x720"]),
    ] {
        oracle(&env, dir, flags, needles);
    }
    // An output that exists is refused before the run (it takes minutes), not after.
    let csv = env.path("old.csv");
    std::fs::write(&csv, "keep").unwrap();
    oracle(&env, dir, &["--csv", s(&csv)], &["old.csv' exists", "--overwrite"]);
}

#[test]
fn oracle_folders_that_are_not_text_builds_are_refused_by_name() {
    let env = Env::new();
    let fix = "demo build --benchmark text --backbone DIR";
    let nowhere = env.path("nowhere");
    oracle(
        &env,
        s(&nowhere),
        &[],
        &["--text-bench '", "nowhere' does not exist", fix],
    );
    let empty = env.path("empty");
    std::fs::create_dir(&empty).unwrap();
    oracle(
        &env,
        s(&empty),
        &[],
        &["empty' is not a text benchmark build (no manifest.json)", fix],
    );
    let file = env.path("model.safetensors");
    std::fs::write(&file, b"not a build").unwrap();
    oracle(
        &env,
        s(&file),
        &[],
        &["model.safetensors' is not a text benchmark build", fix],
    );
    // An image demo build has a manifest and base.safetensors, but no base/ folder.
    let image = env.path("mlp-seed0");
    std::fs::create_dir(&image).unwrap();
    std::fs::write(image.join("manifest.json"), "{}").unwrap();
    std::fs::write(image.join("base.safetensors"), b"").unwrap();
    oracle(
        &env,
        s(&image),
        &[],
        &[
            "mlp-seed0' is not a text benchmark build (no base/ folder",
            "image demo build",
            fix,
        ],
    );
}

#[test]
fn a_damaged_text_build_is_named_with_the_file_and_how_to_rebuild_it() {
    let env = Env::new();
    let build = tiny_text_build(&env).unwrap();
    let rebuild = "mergescope demo build --benchmark text";
    // Each case damages its own copy of the build.
    let copy = |name: &str, damage: &dyn Fn(&Path)| -> String {
        let dir = env.path(name);
        copy_dir(&build, &dir);
        damage(&dir);
        dir.display().to_string()
    };
    let dir = copy("garbled-manifest", &|d| {
        std::fs::write(d.join("manifest.json"), "{\"tasks\": 3").unwrap()
    });
    oracle(
        &env,
        &dir,
        &[],
        &["manifest.json' is not a text benchmark manifest", rebuild],
    );
    let dir = copy("no-suite", &|d| std::fs::remove_file(d.join("suite.toml")).unwrap());
    // Its suite.toml is named as missing; the folder is given, since there is no suite.toml.
    oracle(&env, &dir, &[], &["is incomplete", "suite.toml' is missing", rebuild]);
    let dir = copy("no-head", &|d| {
        std::fs::remove_file(d.join("heads/name_gender.safetensors")).unwrap()
    });
    oracle(
        &env,
        &dir,
        &[],
        &["is incomplete", "name_gender.safetensors' is missing", rebuild],
    );
    let dir = copy("no-tokenizer", &|d| {
        std::fs::remove_file(d.join("base/tokenizer.json")).unwrap()
    });
    oracle(
        &env,
        &dir,
        &[],
        &["is incomplete", "base/tokenizer.json' is missing", rebuild],
    );
    let dir = copy("garbled-head", &|d| {
        std::fs::write(d.join("heads/word_sentiment.safetensors"), b"\x05\0\0\0\0\0\0\0{}").unwrap()
    });
    oracle(&env, &dir, &[], &["is damaged", "word_sentiment.safetensors", rebuild]);
    let dir = copy("no-data", &|d| {
        std::fs::remove_file(d.join("data/name_gender.train.jsonl")).unwrap()
    });
    oracle(
        &env,
        &dir,
        &[],
        &["is damaged", "name_gender.train.jsonl': cannot read it", rebuild],
    );
    let dir = copy("garbled-data", &|d| {
        std::fs::write(d.join("data/word_sentiment.train.jsonl"), "{\"text\": \"good\"}\n").unwrap()
    });
    let e = oracle(
        &env,
        &dir,
        &[],
        &["word_sentiment.train.jsonl'", "line 1: no string \"label\"", rebuild],
    );
    assert!(
        !e.contains("scripts/text-bench-data.py"),
        "the build's copy is rebuilt, not the assets: {e}"
    );
}

#[test]
fn oracle_tasks_and_batches_the_build_lacks_are_refused() {
    let env = Env::new();
    let build = tiny_text_build(&env).unwrap();
    let dir = s(&build);
    oracle(
        &env,
        dir,
        &["--tasks", "word_sentiment,emoji_group"],
        &[
            "unknown task 'emoji_group' in --tasks",
            "has name_gender, word_sentiment",
            "leave --tasks out for all",
        ],
    );
    // The build keeps 16 train texts per task: a full batch of 17 (or the default 32) cannot
    // be taken, and the message says how many can.
    oracle(
        &env,
        dir,
        &["--examples", "17"],
        &[
            "--examples 17:",
            "'word_sentiment' has 16",
            "word_sentiment.train.jsonl",
            "give --examples 16 or fewer",
        ],
    );
    let suite = build.join("suite.toml");
    oracle(&env, s(&suite), &[], &["--examples 32:", "give --examples 16 or fewer"]);
}
