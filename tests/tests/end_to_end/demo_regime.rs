#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The demo benchmark's default recipe puts merging in the regime the papers study (issue #5):
//! every expert beats the base on its own task, most by ten points or more, and task arithmetic
//! (λ picked on calibration accuracy with the grid and rule of `mergescope compare`) lands
//! between weight averaging and the experts in mean normalised test accuracy.
//!
//! It builds the real MLP benchmark of seed 0 with `BuildRecipe::default_for`, so a recipe change
//! that leaves this regime fails here, not in a user's first comparison.

use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_lab::analysis::landscape::AffineFamily;
use mergescope_lab::compare::{choose_lambda, default_lambda_grid};
use mergescope_lab::data::{SplitKind, demo_tasks};
use mergescope_lab::demo::{Benchmark, BuildRecipe, build, load_params};
use mergescope_lab::nn::{Arch, Params};
use std::sync::atomic::AtomicBool;

#[test]
fn the_default_mlp_recipe_puts_task_arithmetic_between_averaging_and_the_experts() {
    let (dev, _) = open_device(DeviceChoice::Cpu);
    let tasks = demo_tasks().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mlp-seed0");
    let bench: Benchmark = build(
        Arch::Mlp,
        &tasks,
        &BuildRecipe::default_for(Arch::Mlp, 0),
        &out,
        &dev,
        &mut |_| {},
        &AtomicBool::new(false),
    )
    .unwrap();

    // Experts against the base, each on its own task.
    let gains: Vec<(String, f64)> = bench
        .manifest
        .tasks
        .iter()
        .map(|t| (t.name.clone(), t.expert_accuracy.test - t.base_accuracy.test))
        .collect();
    for (name, gain) in &gains {
        assert!(*gain > 0.0, "the {name} expert is not better than the base: {gain:+.3}");
    }
    let big = gains.iter().filter(|(_, g)| *g >= 0.10).count();
    assert!(
        big * 2 > gains.len(),
        "only {big} experts gain ten points or more: {gains:?}"
    );

    // Task arithmetic with λ picked on calibration, against weight averaging, on test.
    let base = load_params(&bench.base_path(), &dev).unwrap();
    let experts: Vec<Params> = bench
        .expert_paths()
        .iter()
        .map(|p| load_params(p, &dev).unwrap())
        .collect();
    let n = experts.len() as f64;
    // base + λ·Σ (expert − base); λ = 1/N is weight averaging.
    let line = AffineFamily::task_arithmetic(&base, &experts).unwrap();
    let calibration = bench.evaluator(&tasks, None, SplitKind::Calibration, &dev).unwrap();
    let test = bench.evaluator(&tasks, None, SplitKind::Test, &dev).unwrap();
    let tried: Vec<(f64, f64)> = default_lambda_grid()
        .into_iter()
        .map(|l| (l, calibration.evaluate(&line.at(&[l]).unwrap()).unwrap().mean_accuracy))
        .collect();
    let lambda = choose_lambda(tried).value;
    let norm = |p: &Params| test.evaluate(p).unwrap().mean_normalized.unwrap();
    let wa = norm(&line.at(&[1.0 / n]).unwrap());
    let ta = norm(&line.at(&[lambda]).unwrap());
    eprintln!("normalised test accuracy: WA {wa:.4}, TA (λ = {lambda}) {ta:.4}; expert gains {gains:?}");
    assert!(
        lambda > 1.0 / n,
        "calibration picks λ = {lambda}, not above 1/N: TA is no more than averaging"
    );
    assert!(
        wa < ta && ta < 1.0,
        "TA {ta:.4} is not between WA {wa:.4} and the experts (1.0)"
    );
}
