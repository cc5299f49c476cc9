#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The demo benchmark's default recipe puts merging in the regime the papers study (issue #5):
//! every expert beats the base on its own task, most by ten points or more, and task arithmetic
//! (λ picked on calibration accuracy with the grid and rule of `mergescope compare`) lands
//! between weight averaging and the experts in mean normalised test accuracy.
//!
//! It builds the real MLP benchmark of seed 0 with `BuildRecipe::default_for`, so a recipe change
//! that leaves this regime fails here, not in a user's first comparison.

use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_lab::data::{SplitKind, demo_tasks};
use mergescope_lab::demo::{Benchmark, BuildRecipe, build, load_params};
use mergescope_lab::nn::{Arch, Params};
use mergescope_studies::analysis::landscape::AffineFamily;
use mergescope_studies::compare::{CompareConfig, CompareInputs, choose_lambda, compare, default_lambda_grid};
use std::path::Path;
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

/// The committed SHA-256 of every file of the MLP demo build of seed 0 and of a task-arithmetic
/// merge of it (tests/fixtures/reproducibility/mlp-seed0.sha256): the same bytes on every x86-64
/// machine with FMA, whatever its vector width (the matrix kernels take the same FMA path on AVX2
/// and AVX-512) and thread count (issue #29). Elsewhere (aarch64, or x86-64 without FMA) the
/// kernels accumulate differently, so the test says so and checks nothing. After an intended
/// change of the recipe or the training code, `MERGESCOPE_BLESS=1` rewrites the file.
///
/// The same build then runs the comparison docs/results.md prints for the MLP (weight averaging,
/// task arithmetic, TIES and CART with λ chosen on calibration data): every number of those rows
/// but the time must be the one in the docs, so the docs cannot drift from the code.
#[test]
fn the_mlp_demo_build_and_a_merge_of_it_have_the_committed_bytes() {
    // The bytes are a function of the seed on one matrix-kernel path (instruction set and the L1
    // cache the kernels block by): each path that has been checked has its committed hashes.
    let path = mergescope_lab::demo::kernel_path();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/reproducibility");
    let committed = fixtures.join(format!("mlp-seed0.{path}.sha256"));
    let (dev, _) = open_device(DeviceChoice::Cpu);
    let tasks = demo_tasks().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bench = build(
        Arch::Mlp,
        &tasks,
        &BuildRecipe::default_for(Arch::Mlp, 0),
        &dir.path().join("mlp-seed0"),
        &dev,
        &mut |_| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    let merged = dir.path().join("ta-0.3.safetensors");
    let plugin = mergescope_tests::load("mergescope_plugin_task_arithmetic");
    let req = mergescope_interop::request::MergeRequest::new(bench.expert_paths(), &merged)
        .with_base(Some(bench.base_path()))
        .with_params(serde_json::json!({"lambda": 0.3}));
    mergescope_interop::request::merge_files(
        &plugin,
        &req,
        &Default::default(),
        mergescope_engine::merge::Observer::silent(),
        &AtomicBool::new(false),
    )
    .unwrap();
    let mut files = vec![bench.base_path(), bench.heads_path()];
    files.extend(bench.expert_paths());
    let lines: Vec<String> = files
        .iter()
        .map(|f| (f, f.strip_prefix(&bench.dir).unwrap().to_string_lossy().into_owned()))
        .chain(std::iter::once((
            &merged,
            "merge/task-arithmetic-lambda-0.3.safetensors".to_owned(),
        )))
        .map(|(f, name)| format!("{}  {name}", mergescope_tests::sha256_hex(&std::fs::read(f).unwrap())))
        .collect();
    let got = lines.join("\n") + "\n";
    if std::env::var_os("MERGESCOPE_BLESS").is_some() {
        std::fs::create_dir_all(&fixtures).unwrap();
        std::fs::write(&committed, &got).unwrap();
        eprintln!("wrote {}", committed.display());
    } else if let Ok(want) = std::fs::read_to_string(&committed) {
        let differ: Vec<&str> = got
            .lines()
            .zip(want.lines())
            .filter(|(g, w)| g != w)
            .map(|(g, _)| g.split_whitespace().last().unwrap_or(""))
            .collect();
        assert!(
            differ.is_empty() && got.lines().count() == want.lines().count(),
            "the MLP demo build of seed 0 on this machine ({path}) differs from the committed bytes in: {differ:?}\n\
             got:\n{got}\nIf the recipe or the training code changed on purpose, run the test with MERGESCOPE_BLESS=1."
        );
    } else {
        eprintln!(
            "kernel path {path}: no committed hashes for it in {} (run with MERGESCOPE_BLESS=1 to commit them); \
             not compared",
            fixtures.display()
        );
    }

    // docs/results.md's MLP table, rows without their time column.
    let inputs = CompareInputs::of_benchmark(&bench, &tasks, &dev).unwrap();
    let plugins: Vec<_> = ["weight_average", "task_arithmetic", "ties", "cart"]
        .iter()
        .map(|m| mergescope_tests::load(&format!("mergescope_plugin_{m}")))
        .collect();
    let refs: Vec<&_> = plugins.iter().collect();
    let cfg = CompareConfig {
        out_dir: dir.path().join("cmp"),
        overwrite: false,
        lambda_grid: default_lambda_grid(),
        extend_lambda: true,
        seed: 0,
    };
    let table = compare(
        &refs,
        &inputs,
        &cfg,
        &Default::default(),
        &|_| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/results.md")).unwrap();
    let mlp = docs.split("\n## MLP").nth(1).unwrap().split("\n## ").next().unwrap();
    // The table names the kernel path it was computed on; another path's last bits may move a
    // printed digit.
    let documented_path = mlp
        .split("kernel path `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .expect("docs/results.md's MLP section names its kernel path (kernel path `…`)");
    if documented_path != path {
        eprintln!(
            "docs/results.md's MLP table is of kernel path {documented_path}, this machine's is {path}; not compared"
        );
        return;
    }
    let without_time = |row: &str| -> String {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').map(str::trim).collect();
        cells[..cells.len() - 1].join(" | ")
    };
    let name = |row: &str| {
        row.trim_start_matches('|')
            .split('|')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let mut checked = 0;
    for row in table
        .markdown()
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| method"))
    {
        let documented = mlp
            .lines()
            .find(|l| name(l) == name(row))
            .unwrap_or_else(|| panic!("docs/results.md's MLP table has no row '{}'", name(row)));
        assert_eq!(
            without_time(row),
            without_time(documented),
            "docs/results.md's MLP row '{}' is not what this build gives; regenerate the table with \
             scripts/results-tables.sh",
            name(row)
        );
        checked += 1;
    }
    assert_eq!(checked, 6, "base, experts and four methods");
}
