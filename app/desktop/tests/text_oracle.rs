//! Seed 004's task-vectors-as-gradients oracle on the text benchmark, through the binary
//! (`mergescope analyze oracle`) on the real all-MiniLM-L6-v2: a reduced build (two tasks, 16
//! train texts each, 16 tokens), then task arithmetic of full-batch gradient-descent task
//! vectors against multi-task gradient descent. Bad inputs are refused first, without the
//! model (every refusal is also a case of the bad-input suite, `bad_inputs/oracle.rs`). CI
//! fetches the model (scripts/fetch-minilm.sh) and sets MERGESCOPE_REQUIRE_MINILM; elsewhere
//! the test says how to fetch it and passes without it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Env;
use std::collections::HashMap;
use std::time::Instant;

/// The rows of `analyze oracle --csv`, keyed by (η, E), each a map from column to value.
fn rows(csv: &str) -> HashMap<(String, usize), HashMap<String, f64>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            let row: HashMap<String, f64> = header
                .iter()
                .zip(&cells)
                .map(|(h, c)| ((*h).to_owned(), c.parse().unwrap()))
                .collect();
            ((cells[0].to_owned(), row["epochs"] as usize), row)
        })
        .collect()
}

#[test]
fn on_minilm_one_epoch_of_task_arithmetic_is_multitask_descent_and_the_gap_after_two_is_second_order() {
    let env = Env::new();
    let nowhere = env.path("nowhere").to_string_lossy().into_owned();
    let oracle = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["analyze", "oracle"].map(String::from).to_vec();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let fails = |args: Vec<String>| env.fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let e = fails(oracle(&["--text-bench", &nowhere]));
    assert!(
        e.contains("nowhere' does not exist") && e.contains("demo build --benchmark text"),
        "{e}"
    );
    for (flags, want) in [
        (&["--lr", "0"][..], "--lr 0"),
        (&["--lr", "1e-5,-1e-5"][..], "--lr -0.00001"),
        (&["--epochs", "1,0"][..], "--epochs 0"),
        (&["--examples", "0"][..], "--examples 0"),
    ] {
        let mut args = oracle(&["--text-bench", &nowhere]);
        args.extend(flags.iter().map(|s| (*s).to_owned()));
        let e = fails(args);
        assert!(e.contains(want), "{flags:?}: {e}");
    }

    let Some(model) = common::external::minilm("to test the seed-004 oracle on the text benchmark") else {
        return;
    };
    let clock = Instant::now();
    let dir = env.path("text");
    let text = dir.to_string_lossy().into_owned();
    env.ok(&[
        "demo",
        "build",
        "--benchmark",
        "text",
        "--backbone",
        &model.to_string_lossy(),
        "--out",
        &text,
        "--text-tasks",
        "word_sentiment,name_gender",
        "--text-steps",
        "1",
        "--text-batch",
        "4",
        "--text-max-train",
        "16",
        "--text-max-eval",
        "16",
        "--text-max-length",
        "16",
        "-q",
    ]);
    let build_s = clock.elapsed().as_secs_f64();
    let e = fails(oracle(&[
        "--text-bench",
        &text,
        "--tasks",
        "word_sentiment,emoji_group",
    ]));
    assert!(
        e.contains("unknown task 'emoji_group'") && e.contains("name_gender, word_sentiment"),
        "{e}"
    );

    // Gradient descent in f64 (the default), two step sizes, one and two epochs.
    let clock = Instant::now();
    let csv = env.path("oracle.csv").to_string_lossy().into_owned();
    let png = env.path("oracle.png").to_string_lossy().into_owned();
    let common = ["--text-bench", &text, "--examples", "16", "--max-length", "16"];
    let mut args = oracle(&common);
    args.extend(
        [
            "--lr",
            "5e-6,1e-5",
            "--epochs",
            "1,2",
            "--eval-examples",
            "16",
            "--csv",
            &csv,
            "--png",
            &png,
            "-q",
        ]
        .map(String::from),
    );
    let table = env.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let oracle_s = clock.elapsed().as_secs_f64();
    assert!(
        table.contains("| 1e-5 | 2 |") && table.contains("E = 2: gap"),
        "{table}"
    );
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
    let r = rows(&std::fs::read_to_string(&csv).unwrap());
    assert_eq!(r.len(), 4, "{r:?}");
    for lr in ["0.000005", "0.00001"] {
        let one = &r[&(lr.to_owned(), 1)];
        // Theorem 1: equal up to rounding. f64 rounding of the moved entries is about 1e-16 of
        // them; 1e-9 of the move is far below f32's 6e-8 and far above what was measured
        // (about 1e-10 at these η).
        assert!(one["moved_mt"] > 1e-5, "the steps must move the weights: {one:?}");
        assert!(one["gap"] <= 1e-9 * one["moved_mt"], "{lr}: {one:?}");
        assert!(one["gap"] <= 4.0 * one["ulp_norm"], "{lr}: {one:?}");
        for t in ["word_sentiment", "name_gender"] {
            let (ta, mt) = (one[&format!("ta_accuracy_{t}")], one[&format!("mt_accuracy_{t}")]);
            assert!((0.0..=1.0).contains(&ta) && (0.0..=1.0).contains(&mt), "{one:?}");
        }
    }
    let (small, big) = (&r[&("0.000005".to_owned(), 2)], &r[&("0.00001".to_owned(), 2)]);
    // Eq. 2: far above rounding, small next to the move, and second order in η. Measured on
    // this problem: a ratio of 3.996. The third-order term moves it with the heads and the
    // data: with the full build's heads on the same two tasks it was 3.94 here and 3.97 one
    // doubling lower, and it falls to 3.5 by η = 8e-5. ±10 % keeps a kernel path or a rebuilt
    // probe from failing the test while excluding a first-order gap (2) and a third-order
    // one (8).
    assert!(small["gap"] > 1e3 * small["ulp_norm"], "{small:?}");
    assert!(big["relative_gap"] < 1e-2, "{big:?}");
    let ratio = big["gap"] / small["gap"];
    assert!(
        (3.6..4.4).contains(&ratio),
        "doubling η multiplied the gap by {ratio} (expected ≈ 4)"
    );
    let rel = big["relative_gap"] / small["relative_gap"];
    assert!(
        (1.8..2.2).contains(&rel),
        "the relative gap grew by {rel} (expected ≈ 2)"
    );

    // In f32 one epoch still agrees to f32 rounding: within the spacing of f32 numbers around
    // θ_MT (the moved entries are small next to the weights, so not to 1e-9 of the move).
    let csv32 = env.path("oracle-f32.csv").to_string_lossy().into_owned();
    let mut args = oracle(&common);
    args.extend(
        [
            "--lr",
            "1e-5",
            "--epochs",
            "1",
            "--eval-examples",
            "0",
            "--precision",
            "f32",
            "--csv",
            &csv32,
            "-q",
        ]
        .map(String::from),
    );
    env.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let r32 = rows(&std::fs::read_to_string(&csv32).unwrap());
    let one = &r32[&("0.00001".to_owned(), 1)];
    assert!(one["gap"] <= one["ulp_norm"], "{one:?}");
    assert!(
        one["ulp_norm"] > 1e6 * r[&("0.00001".to_owned(), 1)]["ulp_norm"],
        "{one:?}"
    );
    eprintln!(
        "seed 004 oracle on the reduced text benchmark: E = 2 gap ×{ratio:.3} per doubling of η; build {build_s:.1} s, f64 oracle {oracle_s:.1} s, total {:.1} s",
        build_s + clock.elapsed().as_secs_f64()
    );
}
