//! Seed 002's sweeps on the text benchmark (issue #23), end to end through the binary on the
//! real all-MiniLM-L6-v2: a reduced text build (two tasks, 48 train texts, 16 tokens), then a
//! sweep over the learning rate and the steps with the text recipe, merged by weight averaging
//! and task arithmetic and scored by the build's suite. Checked: the rows are the grid's, the
//! numbers are accuracies and losses, the sweep's expert at the build's own settings is the
//! build's expert, ‖τ‖ grows with the learning rate and the steps, and a resumed sweep
//! retrains a removed run to the same numbers. The user's mistakes are named first (without the
//! model). CI fetches the model (scripts/fetch-minilm.sh) and sets MERGESCOPE_REQUIRE_MINILM;
//! elsewhere the test says how to fetch it and checks only the mistakes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Env;
use mergescope_engine::checkpoint::Checkpoint;
use std::path::Path;

/// Every row of a sweep's results without its timing column, sorted.
fn rows(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let mut rows: Vec<String> = text
        .lines()
        .skip(1)
        .map(|l| l.rsplit_once(',').unwrap().0.to_owned())
        .collect();
    rows.sort();
    rows
}

/// ‖expert − base‖ over every tensor.
fn distance(expert: &Path, base: &Path) -> f64 {
    let (e, b) = (Checkpoint::open(expert).unwrap(), Checkpoint::open(base).unwrap());
    let mut sum = 0.0;
    for (name, t) in &b.tensors {
        let x = e.read_f32(&e.tensors[name]).unwrap();
        let y = b.read_f32(t).unwrap();
        sum += x.iter().zip(&y).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>();
    }
    sum.sqrt()
}

fn spec(bench: &Path, extra: &str) -> String {
    format!(
        r#"arch = "text"
benchmark = "{}"
groups = 1
[defaults]
lr = 1e-4
batch = 8
steps = 4
data_ratio = 1.0
optimizer = "adamw"
tasks = 2
[grid]
lr = [1e-4, 1e-3]
steps = [2, 4]
{extra}
[[methods]]
plugin = "weight-average"
label = "WA"
[[methods]]
plugin = "task-arithmetic"
label = "TA"
params = {{ lambda = 0.5 }}
"#,
        bench.display().to_string().replace('\\', "/")
    )
}

#[test]
fn a_reduced_text_sweep_trains_merges_and_scores_the_grid() {
    let env = Env::new();
    let out = env.path("sweep").to_string_lossy().into_owned();
    // Mistakes a user can make, named before anything is trained.
    let e = env.fails(&["sweep", "--preset", "paper-002", "--arch", "txt", "--out", &out]);
    assert!(e.contains("--arch 'txt'") && e.contains("text"), "{e}");
    let nowhere = env.path("nowhere").to_string_lossy().into_owned();
    let e = env.fails(&[
        "sweep",
        "--preset",
        "paper-002",
        "--arch",
        "text",
        "--benchmark",
        &nowhere,
        "--out",
        &out,
    ]);
    assert!(
        e.contains("does not exist") && e.contains("demo build --benchmark text"),
        "{e}"
    );
    std::fs::create_dir_all(env.path("empty")).unwrap();
    let empty = env.path("empty").to_string_lossy().into_owned();
    let e = env.fails(&[
        "sweep",
        "--preset",
        "paper-002",
        "--arch",
        "text",
        "--benchmark",
        &empty,
        "--out",
        &out,
    ]);
    assert!(
        e.contains("is not a text benchmark build") && e.contains("--benchmark"),
        "{e}"
    );
    let printed = env.ok(&["sweep", "--preset", "paper-002", "--arch", "text", "--print-spec"]);
    assert!(
        printed.contains("arch = \"text\"") && printed.contains("weight-average"),
        "{printed}"
    );

    let Some(model) = common::external::minilm("to test the text sweeps") else {
        return;
    };
    let bench = env.path("text-bench");
    let b = bench.to_string_lossy().into_owned();
    env.ok(&[
        "demo",
        "build",
        "--benchmark",
        "text",
        "--backbone",
        &model.to_string_lossy(),
        "--out",
        &b,
        "--text-tasks",
        "cldr_language,word_sentiment",
        "--text-steps",
        "4",
        "--text-batch",
        "8",
        "--text-max-train",
        "48",
        "--text-max-eval",
        "32",
        "--text-max-length",
        "16",
        "-q",
    ]);

    // Bad values in a text specification, and a demo sweep pointed at the text build.
    let bad = |name: &str, extra: &str, defaults: Option<(&str, &str)>| {
        let mut text = spec(&bench, extra);
        if let Some((from, to)) = defaults {
            text = text.replace(from, to);
        }
        let path = env.path(name);
        std::fs::write(&path, text).unwrap();
        let p = path.to_string_lossy().into_owned();
        (env.fails(&["sweep", &p, "--out", &out]), p)
    };
    let (e, p) = bad("bad-lr.toml", "", Some(("lr = [1e-4, 1e-3]", "lr = [1e-4, -1.0]")));
    assert!(e.contains(&p) && e.contains("learning rate -1 must be positive"), "{e}");
    let (e, _) = bad("sgd.toml", "optimizer = [\"sgd\"]", None);
    assert!(e.contains("optimizer 'sgd'") && e.contains("AdamW"), "{e}");
    let (e, _) = bad("n.toml", "tasks = [3]", None);
    assert!(e.contains("3 tasks per group") && e.contains("1..=2"), "{e}");
    let (e, _) = bad(
        "subsample.toml",
        "",
        Some(("groups = 1", "groups = 1\neval_examples = 5")),
    );
    assert!(e.contains("eval_examples") && e.contains("--text-max-eval"), "{e}");
    let e = env.fails(&["sweep", "--preset", "paper-002", "--benchmark", &b, "--out", &out]);
    assert!(
        e.contains("is a text benchmark build") && e.contains("--arch text"),
        "{e}"
    );
    assert!(!Path::new(&out).exists(), "nothing is written for a refused sweep");

    let path = env.path("tiny-text.toml");
    std::fs::write(&path, spec(&bench, "")).unwrap();
    let spec_s = path.to_string_lossy().into_owned();
    let clock = std::time::Instant::now();
    let printed = env.ok(&["sweep", &spec_s, "--out", &out, "--quiet"]);
    eprintln!("the text sweep took {:.1} s", clock.elapsed().as_secs_f64());
    let dir = Path::new(&out);
    let got = rows(dir);
    // Three points (the defaults, K = 2, η = 10⁻³), each with its two experts and one group of
    // both tasks merged by two methods (a row per task): 3 × (2 + 2 × 2) rows.
    assert_eq!(got.len(), 18, "{got:#?}");
    for point in ["0.0001,8,4,", "0.0001,8,2,", "0.001,8,4,"] {
        let n = got.iter().filter(|r| r.starts_with(point)).count();
        assert_eq!(n, 6, "{point}: {got:#?}");
    }
    for r in &got {
        let f: Vec<&str> = r.split(',').collect();
        let (acc, loss): (f64, f64) = (f[10].parse().unwrap(), f[11].parse().unwrap());
        assert!((0.0..=1.0).contains(&acc) && loss.is_finite() && loss > 0.0, "{r}");
        assert_eq!(f[12], "32", "every test text is scored: {r}");
    }
    // The η law (a + c·η², two coefficients) is fitted per method on its two points; the K law
    // needs three.
    assert!(
        printed.contains("| lr | WA |") && printed.contains("| lr | TA |"),
        "{printed}"
    );
    for f in ["fits.md", "plots/lr-accuracy.png", "plots/steps-loss.png", "sweep.toml"] {
        assert!(dir.join(f).is_file(), "{f} is missing");
    }

    // The sweep fine-tunes through the build's door: at the build's own settings (η = 10⁻⁴,
    // b = 8, K = 4, seed 0) its expert is the build's, bit for bit.
    let models = dir.join("models");
    let run = |lr: &str| models.join(format!("experts/lr{lr}_b8_a1_adamw"));
    for task in ["cldr_language", "word_sentiment"] {
        let ours = Checkpoint::open(&run("0.0001").join(format!("{task}.k4.safetensors"))).unwrap();
        let built = Checkpoint::open(&bench.join(format!("experts/{task}/model.safetensors"))).unwrap();
        assert_eq!(ours.tensors.len(), built.tensors.len());
        for (name, t) in &built.tensors {
            assert_eq!(
                ours.read_f32(&ours.tensors[name]).unwrap(),
                built.read_f32(t).unwrap(),
                "{task}: {name}"
            );
        }
    }
    // An invariant of the sweep: a larger learning rate, and more steps, move the experts
    // further from the base.
    let base = bench.join("base/model.safetensors");
    for task in ["cldr_language", "word_sentiment"] {
        let tau = |lr: &str, k: usize| distance(&run(lr).join(format!("{task}.k{k}.safetensors")), &base);
        let (small, k2, large) = (tau("0.0001", 4), tau("0.0001", 2), tau("0.001", 4));
        assert!(k2 > 0.0 && k2 < small, "{task}: ‖τ‖ K=2 {k2} vs K=4 {small}");
        assert!(large > 2.0 * small, "{task}: ‖τ‖ η=1e-3 {large} vs η=1e-4 {small}");
    }

    // Determinism and resume: without the η = 10⁻³ run and the last cells, the same command
    // retrains that run and gives the same numbers.
    std::fs::remove_dir_all(run("0.001")).unwrap();
    let text = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let kept: Vec<&str> = text.lines().take(1 + 12).collect();
    std::fs::write(dir.join("results.csv"), kept.join("\n") + "\n").unwrap();
    let again = env.run(&["sweep", &spec_s, "--out", &out, "--quiet"]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{err}");
    assert!(err.contains("reused") && err.contains("2 fine-tuning runs"), "{err}");
    assert_eq!(rows(dir), got);
}
