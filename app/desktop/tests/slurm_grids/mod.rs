//! `mergescope compare` and `mergescope analyze landscape` with `--executor slurm` against a
//! real Slurm (`common::slurm::cluster`, as the sweep tests; a module of the slurm test binary,
//! so that it is linked once): the gathered table and figure are the local executor's, and a
//! second run submits nothing. Without a cluster the cluster tests
//! print why and pass, unless MERGESCOPE_REQUIRE_SLURM=1 (CI), where they fail.

use crate::common::slurm::*;
use crate::common::*;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A two-task MLP benchmark (mnist, letters) built in seconds.
fn bench(env: &Env) -> PathBuf {
    let bench = env.path("bench");
    tiny_benchmark_of(&bench, &["mnist", "letters"]);
    bench
}

/// A CSV's lines without their last column (the seconds a merge took).
fn without_seconds(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(',').unwrap().0.to_owned())
        .collect()
}

/// TA and TIES with λ searched over {0.05, 0.1} and on above it while the best is the largest
/// (`--extend-lambda`; in Slurm the extension runs in each method's final cell): the base,
/// 2 × (2 candidates + 1 final) = 7 cells.
fn compare_args<'a>(bench: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec![
        "compare",
        "--benchmark",
        s(bench),
        "--arch",
        "mlp",
        "--methods",
        "task-arithmetic,ties",
        "--lambda-grid",
        "0.05,0.1",
        "--extend-lambda",
        "--out-dir",
        s(out),
        "--quiet",
    ]
}

#[test]
fn a_comparison_on_slurm_writes_exactly_the_local_table() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    let bench = bench(&env);
    let local = env.path("local");
    env.ok(&compare_args(&bench, &local));
    let slurm = env.path("slurm");
    let mut args = compare_args(&bench, &slurm);
    args.extend(["--executor", "slurm", "--poll-seconds", "0.2"]);
    let t0 = Instant::now();
    let o = slurm_cmd(&env, conf, &args).output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    eprintln!(
        "slurm comparison of 7 cells: {:.1} s\n{err}",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        err.contains("7 cells (0 reused from an earlier run, 7 run in Slurm jobs"),
        "{err}"
    );
    first_result("7-cell comparison", &err);
    let expected = without_seconds(&local.join("results.csv"));
    // Header, the base and two methods: 3 × (2 tasks + average).
    assert_eq!(expected.len(), 1 + 3 * 3, "{expected:?}");
    assert_eq!(
        without_seconds(&slurm.join("results.csv")),
        expected,
        "same values, same order"
    );
    for m in ["task-arithmetic", "ties"] {
        assert!(slurm.join(format!("{m}.safetensors")).is_file(), "{m}'s merge is kept");
    }
    // The Markdown table is the local one but for the time column.
    let md = |p: &Path| -> Vec<String> {
        std::fs::read_to_string(p.join("results.md"))
            .unwrap()
            .lines()
            .map(|l| l.rsplitn(3, '|').nth(2).unwrap_or(l).to_owned())
            .collect()
    };
    assert_eq!(md(&slurm), md(&local));
    // The λ searches, the points above the grid included, are the local ones.
    let search = std::fs::read_to_string(local.join("lambda_search.csv")).unwrap();
    assert!(
        search
            .lines()
            .any(|l| l.ends_with(",true,false") || l.ends_with(",true,true")),
        "no search went above the grid {{0.05, 0.1}}:\n{search}"
    );
    assert_eq!(
        std::fs::read_to_string(slurm.join("lambda_search.csv")).unwrap(),
        search
    );
    // Run again: every cell is finished, nothing is submitted, the table is the same.
    let o = slurm_cmd(&env, conf, &args).output().unwrap();
    assert!(
        o.status.success() && stderr(&o).contains("all 7 cells were finished already"),
        "{}",
        stderr(&o)
    );
    assert_eq!(without_seconds(&slurm.join("results.csv")), expected);
}

/// The plane through the base and the two experts on a 4 × 4 grid: a row per cell, 4 cells.
fn landscape_args<'a>(bench: &'a Path, csv: &'a Path, png: &'a Path) -> Vec<&'a str> {
    vec![
        "analyze",
        "landscape",
        "--benchmark",
        s(bench),
        "--arch",
        "mlp",
        "--kind",
        "plane",
        "--through",
        "mnist,letters",
        "--range=-0.5:1.5:4",
        "--samples",
        "16",
        "--csv",
        s(csv),
        "--png",
        s(png),
        "--size",
        "400x300",
        "--quiet",
    ]
}

#[test]
fn a_landscape_on_slurm_writes_exactly_the_local_figure() {
    let Some(conf) = cluster() else { return };
    let env = Env::new();
    let bench = bench(&env);
    let (csv, png) = (env.path("local.csv"), env.path("local.png"));
    env.ok(&landscape_args(&bench, &csv, &png));
    let (slurm_csv, slurm_png) = (env.path("slurm.csv"), env.path("slurm.png"));
    let mut args = landscape_args(&bench, &slurm_csv, &slurm_png);
    args.extend(["--executor", "slurm", "--poll-seconds", "0.2"]);
    // Its own cache: the local run's cached grid would leave nothing to submit.
    let t0 = Instant::now();
    let o = slurm_cmd(&env, conf, &args)
        .env("MERGESCOPE_CACHE_DIR", env.path("slurm-cache"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    eprintln!("slurm landscape of 4 cells: {:.1} s\n{err}", t0.elapsed().as_secs_f64());
    assert!(err.contains("landscape of 16 points in 4 cells on Slurm"), "{err}");
    assert!(
        err.contains("4 cells (0 reused from an earlier run, 4 run in Slurm job"),
        "{err}"
    );
    first_result("4-cell plane landscape", &err);
    assert_eq!(
        std::fs::read_to_string(&slurm_csv).unwrap(),
        std::fs::read_to_string(&csv).unwrap(),
        "same points, same values"
    );
    assert_eq!(
        std::fs::read(&slurm_png).unwrap(),
        std::fs::read(&png).unwrap(),
        "same picture"
    );
    // Run again: the cells' results (and the cache) are reused; nothing is submitted.
    args.push("--overwrite");
    let o = slurm_cmd(&env, conf, &args)
        .env("MERGESCOPE_CACHE_DIR", env.path("slurm-cache"))
        .output()
        .unwrap();
    assert!(
        o.status.success() && stderr(&o).contains("all 4 cells were finished already"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&slurm_csv).unwrap(),
        std::fs::read_to_string(&csv).unwrap()
    );
}

/// No cluster needed: `--dry-run` prints the script of the cells submitted first (and says
/// what follows), naming the one door every array task runs.
#[test]
fn dry_runs_print_the_batch_scripts_of_comparisons_and_landscapes() {
    let env = Env::new();
    let bench = bench(&env);
    let out = env.path("cmp");
    let mut args = compare_args(&bench, &out);
    args.extend([
        "--executor",
        "slurm",
        "--dry-run",
        "--mergescope-bin",
        "/shared/bin/mergescope",
    ]);
    let o = env.ok(&args);
    for want in [
        "#SBATCH --job-name=mergescope-compare\n",
        // The base and the four λ candidates; then the two final merges.
        "#SBATCH --array=0-2,4-5\n",
        "exec '/shared/bin/mergescope' 'grid' 'run-cell' '",
        "/cmp/slurm/grid.json' \"$SLURM_ARRAY_TASK_ID\"\n",
        "# Then, once these have results, a second array job of the final merges: 3,6\n",
    ] {
        assert!(o.contains(want), "{want} not in\n{o}");
    }
    let (csv, png) = (env.path("l.csv"), env.path("l.png"));
    let mut args = landscape_args(&bench, &csv, &png);
    args.extend(["--executor", "slurm", "--dry-run", "--points-per-cell", "5"]);
    let o = env.ok(&args);
    for want in [
        "#SBATCH --job-name=mergescope-landscape\n",
        "#SBATCH --array=0-3\n",
        "/l.slurm/grid.json' \"$SLURM_ARRAY_TASK_ID\"\n",
    ] {
        assert!(o.contains(want), "{want} not in\n{o}");
    }
    assert!(!csv.exists() && !png.exists(), "a dry run writes no figure");
}
