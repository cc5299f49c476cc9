//! Suites with an external evaluator command, end to end through the binary: the issue's
//! smallest suite as written, `eval --json` and `merge --eval` on it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Env;
use mergescope_engine::dtype::DType;

/// A scorer in plain Python (no packages): reads the F32 tensor `w` of the safetensors file it
/// is given and reports task_a = w[0], task_b = w[1] as "accuracies".
const SCORE_PY: &str = r#"
import json, struct, sys
path = sys.argv[1]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    start, end = header["w"]["data_offsets"]
    f.seek(8 + n + start)
    w = struct.unpack("<%df" % ((end - start) // 4), f.read(end - start))
print("scored", path, file=sys.stderr)
print(json.dumps({"task_a": {"accuracy": w[0], "f1": 0.5}, "task_b": {"accuracy": w[1]}}))
"#;

const SUITE: &str = r#"name = "my-eval"

[evaluator]
command = ["python3", "score.py", "{model}"]
metric = "accuracy"
tasks = ["task_a", "task_b"]
"#;

fn setup() -> (Env, String) {
    let env = Env::new();
    std::fs::write(env.path("score.py"), SCORE_PY).unwrap();
    std::fs::write(env.path("suite.toml"), SUITE).unwrap();
    let suite = env.path("suite.toml").to_string_lossy().into_owned();
    (env, suite)
}

#[test]
fn eval_json_reads_the_commands_metrics_per_task() {
    let (env, suite) = setup();
    let m = env.write("m.safetensors", &[("w", DType::F32, &[2], &[0.25, 0.75])]);
    let out = env.ok(&["eval", "--benchmark", &suite, "--checkpoint", &m, "--json"]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["tasks"]["task_a"]["accuracy"], 0.25);
    assert_eq!(j["tasks"]["task_a"]["f1"], 0.5);
    assert_eq!(j["tasks"]["task_b"]["accuracy"], 0.75);
    assert_eq!(j["average"]["accuracy"], 0.5);
    // f1 is averaged over the one task that has it.
    assert_eq!(j["average"]["f1"], 0.5);
    // Only some tasks, as with a demo benchmark.
    let out = env.ok(&[
        "eval",
        "--benchmark",
        &suite,
        "--checkpoint",
        &m,
        "--tasks",
        "task_b",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["average"]["accuracy"], 0.75);
    assert!(j["tasks"].get("task_a").is_none());
}

/// The merged model is what the command scores: the weight average of w = (0.2, 0.6) and
/// (0.6, 1.0) is (0.4, 0.8).
#[test]
fn merge_eval_scores_the_merged_model_with_the_suite() {
    let (env, suite) = setup();
    let a = env.write("a.safetensors", &[("w", DType::F32, &[2], &[0.2, 0.6])]);
    let b = env.write("b.safetensors", &[("w", DType::F32, &[2], &[0.6, 1.0])]);
    let out = env.path("merged.safetensors").to_string_lossy().into_owned();
    let text = env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--expert",
        &a,
        "--expert",
        &b,
        "--out",
        &out,
        "--eval",
        "--benchmark",
        &suite,
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tasks = &j["eval"]["report"]["tasks"];
    assert!((tasks[0]["accuracy"].as_f64().unwrap() - 0.4).abs() < 1e-6, "{tasks}");
    assert!((tasks[1]["accuracy"].as_f64().unwrap() - 0.8).abs() < 1e-6, "{tasks}");
}

#[test]
fn a_command_that_fails_is_reported_with_its_error_output() {
    let (env, _) = setup();
    std::fs::write(
        env.path("bad.toml"),
        "name = \"bad\"\n[evaluator]\ncommand = [\"python3\", \"-c\", \"import sys; sys.exit('model {model} is unreadable')\"]\ntasks = [\"a\"]\n",
    )
    .unwrap();
    let m = env.write("m.safetensors", &[("w", DType::F32, &[2], &[0.25, 0.75])]);
    let bad = env.path("bad.toml").to_string_lossy().into_owned();
    let e = env.fails(&["eval", "--benchmark", &bad, "--checkpoint", &m]);
    assert!(
        e.contains("failed") && e.contains("is unreadable") && !e.contains("panicked"),
        "{e}"
    );
}

/// The fixture folder of the tiny BERT experts.
fn bert_fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/bert-experts")
        .canonicalize()
        .unwrap()
}

/// Writes a family suite of the BERT experts (with `task_extra` in each [[task]], `{task}`
/// standing for its name) and returns its path, the fixtures' reference.json and a fixture
/// path maker.
fn bert_suite(env: &Env, task_extra: &str) -> (String, serde_json::Value, impl Fn(&str) -> String) {
    let fx = bert_fixtures();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("reference.json")).unwrap()).unwrap();
    let p = move |s: &str| fx.join(s).to_string_lossy().into_owned();
    let task = |name: &str| {
        format!(
            "[[task]]\nname = \"{name}\"\ndata = \"{}\"\nhead = \"{}\"\n{}\n",
            p(&format!("{name}.jsonl")),
            p(name),
            task_extra.replace("{task}", &p(name))
        )
    };
    std::fs::write(
        env.path("text.toml"),
        format!(
            "name = \"text\"\n\n[model]\nfamily = \"bert\"\nconfig = \"{base}/config.json\"\ntokenizer = \"{base}/tokenizer.json\"\n\n\
             {}{}[models]\nbase = \"{base}\"\nexperts = [\"{}\", \"{}\"]\n",
            task("topic"),
            task("verdict"),
            p("topic"),
            p("verdict"),
            base = p("base"),
        ),
    )
    .unwrap();
    (env.path("text.toml").to_string_lossy().into_owned(), r, p)
}

/// Real BERT-family experts from transformers (a tiny BERT fine-tuned on two text tasks,
/// `tests/fixtures/families/bert-experts`, made by `scripts/family-fixtures.py`), merged by
/// task arithmetic and scored by a family suite with each task's own head: the accuracies are
/// the ones transformers computed for the same models and the same merge (λ = 0.5).
#[test]
fn bert_experts_merged_and_scored_like_transformers() {
    let env = Env::new();
    let (suite, r, p) = bert_suite(&env, "");
    let accuracies = |j: &serde_json::Value| {
        (
            j["tasks"]["topic"]["accuracy"].as_f64().unwrap(),
            j["tasks"]["verdict"]["accuracy"].as_f64().unwrap(),
        )
    };
    let want = |model: &str| {
        (
            r["accuracy"][model]["topic"].as_f64().unwrap(),
            r["accuracy"][model]["verdict"].as_f64().unwrap(),
        )
    };
    for model in ["base", "topic", "verdict"] {
        let out = env.ok(&["eval", "--benchmark", &suite, "--checkpoint", &p(model), "--json"]);
        let j: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(accuracies(&j), want(model), "{model}");
    }
    let merged = env.path("ta.safetensors").to_string_lossy().into_owned();
    let text = env.ok(&[
        "merge",
        "--method",
        "task-arithmetic",
        "--base",
        &p("base"),
        "--expert",
        &p("topic"),
        "--expert",
        &p("verdict"),
        "--param",
        "lambda=0.5",
        "--out",
        &merged,
        "--eval",
        "--benchmark",
        &suite,
        "--json",
        "-q",
    ]);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let got = accuracies(&j["eval"]);
    let (t, v) = want("task-arithmetic");
    assert_eq!(got, (t, v), "{text}");
    // The merge is worth it: better than the base on both tasks.
    assert!(t > 0.5 && v > 0.5);
    // The suite's [models] table gives the inputs when no --base/--expert is given: the same
    // merge, the same bytes.
    let again = env.path("ta2.safetensors").to_string_lossy().into_owned();
    env.ok(&[
        "merge",
        "--method",
        "task-arithmetic",
        "--param",
        "lambda=0.5",
        "--out",
        &again,
        "--benchmark",
        &suite,
        "-q",
    ]);
    assert_eq!(std::fs::read(&merged).unwrap(), std::fs::read(&again).unwrap());
    // The radar (bars, with two tasks) of the base and the merge, the models from the suite's
    // [models] table, normalised by each task's expert (which scores 1.0 on its own task).
    let csv = env.ok(&["analyze", "radar", "--benchmark", &suite, "--checkpoint", &merged]);
    let rows: Vec<Vec<String>> = csv.lines().map(|l| l.split(',').map(str::to_owned).collect()).collect();
    assert_eq!(rows[0], ["task", "base", "ta"], "{csv}");
    let num = |r: usize, c: usize| rows[r][c].parse::<f64>().unwrap();
    let (bt, bv) = want("base");
    let et = r["accuracy"]["topic"]["topic"].as_f64().unwrap();
    let ev = r["accuracy"]["verdict"]["verdict"].as_f64().unwrap();
    assert_eq!((rows[1][0].as_str(), rows[2][0].as_str()), ("topic", "verdict"));
    assert!(
        (num(1, 1) - bt / et).abs() < 1e-12 && (num(2, 1) - bv / ev).abs() < 1e-12,
        "{csv}"
    );
    assert!(
        (num(1, 2) - t / et).abs() < 1e-12 && (num(2, 2) - v / ev).abs() < 1e-12,
        "{csv}"
    );

    // The task-arithmetic line scores models built in memory: at λ = 0.5 it is the merge above,
    // at λ = 0 the base.
    let csv = env.ok(&[
        "analyze",
        "landscape",
        "--benchmark",
        &suite,
        "--kind",
        "ta-line",
        "--lambdas",
        "0:0.5:2",
        "--no-cache",
        "-q",
    ]);
    let values: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap().parse().unwrap())
        .collect();
    assert_eq!(values.len(), 2, "{csv}");
    assert!((values[0] - (bt + bv) / 2.0).abs() < 1e-12, "{csv}");
    assert!((values[1] - (t + v) / 2.0).abs() < 1e-12, "{csv}");
}

/// The `__metadata__` of a safetensors file.
fn metadata(path: &std::path::Path) -> serde_json::Map<String, serde_json::Value> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].as_object().unwrap().clone()
}

/// A model-level method on a family suite: AdaMerging learns task-wise λ on the tasks'
/// calibration data (the experts' heads, as no task names one), lowering its objective from the
/// start (task arithmetic at λ = 0.3) and leaving a trajectory; the output is evaluated on the
/// suite. A suite without calibration data, or with an external command, is refused with what
/// to add or use instead.
#[test]
fn adamerging_learns_on_a_family_suite() {
    let env = Env::new();
    let (suite, _, _) = bert_suite(&env, "calibration = \"{task}.jsonl\"");
    // bert_suite names each task's head; drop them so the experts' heads are used.
    let text = std::fs::read_to_string(&suite).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("head = "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&suite, text).unwrap();
    let out = env.path("ada.safetensors").to_string_lossy().into_owned();
    let json = env.ok(&[
        "merge",
        "--method",
        "adamerging",
        "--param",
        "granularity=task",
        "--param",
        "steps=15",
        "--param",
        "lr=0.02",
        "--param",
        "report_every=5",
        "--benchmark",
        &suite,
        "--out",
        &out,
        "--eval",
        "--json",
        "-q",
    ]);
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    for task in ["topic", "verdict"] {
        let a = j["eval"]["tasks"][task]["accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&a), "{json}");
    }
    let m = metadata(&env.path("ada.trajectory.safetensors"));
    let iterates: Vec<serde_json::Value> =
        serde_json::from_str(m["mergescope.trajectory.iterates"].as_str().unwrap()).unwrap();
    let loss = |it: &serde_json::Value| it["metrics"]["loss"].as_f64().unwrap();
    let (first, last) = (iterates.first().unwrap(), iterates.last().unwrap());
    assert!(iterates.len() >= 3, "{iterates:?}");
    assert!(loss(last) < loss(first), "entropy {} -> {}", loss(first), loss(last));
    assert_eq!(first["metrics"]["lambda"], serde_json::json!([0.3, 0.3]), "{first}");
    assert_ne!(last["metrics"]["lambda"], first["metrics"]["lambda"]);

    // Without calibration data: refused, naming the tasks and the key to add.
    let env2 = Env::new();
    let (bare, _, _) = bert_suite(&env2, "");
    let e = env2.fails(&[
        "merge",
        "--method",
        "adamerging",
        "--benchmark",
        &bare,
        "--out",
        "x.safetensors",
    ]);
    assert!(e.contains("topic, verdict") && e.contains("calibration = "), "{e}");
    // An external command gives no gradients.
    let (cmd_suite_env, cmd_suite) = setup();
    let m = cmd_suite_env.write("m.safetensors", &[("w", DType::F32, &[2], &[0.25, 0.75])]);
    let e = cmd_suite_env.fails(&[
        "merge",
        "--method",
        "adamerging",
        "--base",
        &m,
        "--expert",
        &m,
        "--expert",
        &m,
        "--benchmark",
        &cmd_suite,
        "--out",
        "x.safetensors",
    ]);
    assert!(e.contains("gradients") && e.contains("search"), "{e}");
}

/// `compare` on a suite: λ searched on the tasks' calibration data (here the test files, so
/// that the one candidate, λ = 0.5, is the merge transformers scored), model-level methods left
/// out, the experts as the individual row.
#[test]
fn compare_runs_every_method_on_a_suite() {
    let env = Env::new();
    let (suite, r, _) = bert_suite(&env, "calibration = \"{task}.jsonl\"");
    let out_dir = env.path("cmp").to_string_lossy().into_owned();
    let out = env.run(&[
        "compare",
        "--benchmark",
        &suite,
        "--methods",
        "task-arithmetic,weight-average",
        "--lambda-grid",
        "0.5",
        "--out-dir",
        &out_dir,
        "-q",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = std::fs::read_to_string(env.path("cmp/results.csv")).unwrap();
    let value = |method: &str, task: &str| -> f64 {
        csv.lines()
            .find(|l| l.starts_with(&format!("\"{method}\"")) && l.split(',').nth(2) == Some(task))
            .unwrap_or_else(|| panic!("no {method}/{task} in\n{csv}"))
            .split(',')
            .nth(3)
            .unwrap()
            .parse()
            .unwrap()
    };
    for task in ["topic", "verdict"] {
        assert_eq!(
            value("task-arithmetic", task),
            r["accuracy"]["task-arithmetic"][task].as_f64().unwrap()
        );
        assert_eq!(value("pretrained", task), r["accuracy"]["base"][task].as_f64().unwrap());
    }
    assert!(
        stdout.contains("λ = 0.5 (calibration)") && stdout.contains("Individual (experts)"),
        "{stdout}"
    );
}

/// `search`: CMA-ES over task arithmetic's per-task weights on the suite's calibration files;
/// the best candidate is the highest score of the record, and the model merged into --out
/// scores exactly that (the final merge repeats the best candidate).
#[test]
fn search_finds_and_merges_the_best_task_weights() {
    let env = Env::new();
    let (suite, _, _) = bert_suite(&env, "calibration = \"{task}.jsonl\"");
    let out = env.path("best.safetensors").to_string_lossy().into_owned();
    let args = [
        "search",
        "--method",
        "task-arithmetic",
        "--search",
        "task_weights",
        "--param",
        "lambda=1",
        "--benchmark",
        &suite,
        "--budget",
        "18",
        "--seed",
        "3",
        "--out",
        &out,
        "-q",
        "--json",
    ];
    let j: serde_json::Value = serde_json::from_str(&env.ok(&args)).unwrap();
    let history = j["history"].as_array().unwrap();
    assert_eq!(history.len(), 18);
    let top = history
        .iter()
        .map(|c| c["score"].as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    let best = j["best"]["score"].as_f64().unwrap();
    assert_eq!(best, top);
    let weights = j["best"]["params"]["task_weights"].as_array().unwrap();
    assert_eq!(weights.len(), 2);
    assert!(weights.iter().all(|w| (0.0..=1.5).contains(&w.as_f64().unwrap())));
    let scored: serde_json::Value =
        serde_json::from_str(&env.ok(&["eval", "--benchmark", &suite, "--checkpoint", &out, "--json"])).unwrap();
    assert_eq!(scored["average"]["accuracy"].as_f64().unwrap(), best);
    assert!(env.path("best.search.json").is_file());
    assert!(
        !env.path(".best.safetensors.candidate.safetensors").exists(),
        "the scratch candidate was left"
    );
    // The same seed gives the same search; an existing output is not overwritten.
    let e = env.fails(&args);
    assert!(e.contains("exists") && e.contains("--overwrite"), "{e}");
    let mut again = args.to_vec();
    again.push("--overwrite");
    let k: serde_json::Value = serde_json::from_str(&env.ok(&again)).unwrap();
    assert_eq!(k["best"], j["best"]);
    // Mistakes name the parameter and the fix.
    let mut bad = again.clone();
    bad[4] = "nope";
    let e = env.fails(&bad);
    assert!(e.contains("no parameter 'nope'") && e.contains("task_weights"), "{e}");
}

/// CLIP experts from transformers (a tiny CLIP whose image tower was fine-tuned on two image
/// tasks, `tests/fixtures/families/clip-experts`): a clip suite with zero-shot heads from the
/// base scores the base, each expert and their task-arithmetic merge exactly as transformers
/// does, and the merge's landscape and comparison run on the same suite.
#[test]
fn clip_experts_merged_and_scored_like_transformers() {
    let env = Env::new();
    let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/clip-experts")
        .canonicalize()
        .unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("reference.json")).unwrap()).unwrap();
    let p = |s: &str| fx.join(s).to_string_lossy().into_owned();
    std::fs::write(
        env.path("clip.toml"),
        format!(
            "name = \"clip\"\n\n[model]\nfamily = \"clip\"\nzeroshot_from = \"{base}\"\n\n\
             [[task]]\nname = \"shapes\"\ndata = \"{shapes}\"\n\n\
             [[task]]\nname = \"brightness\"\ndata = \"{brightness}\"\nlabels = [\"shape\", \"picture\"]\n\n\
             [models]\nbase = \"{base}\"\nexperts = [\"{e1}\", \"{e2}\"]\n",
            base = p("base"),
            shapes = p("data/shapes"),
            brightness = p("data/brightness"),
            e1 = p("shapes"),
            e2 = p("brightness"),
        ),
    )
    .unwrap();
    let suite = env.path("clip.toml").to_string_lossy().into_owned();
    let got = |j: &serde_json::Value| {
        (
            j["tasks"]["shapes"]["accuracy"].as_f64().unwrap(),
            j["tasks"]["brightness"]["accuracy"].as_f64().unwrap(),
        )
    };
    let want = |m: &str| {
        (
            r["accuracy"][m]["shapes"].as_f64().unwrap(),
            r["accuracy"][m]["brightness"].as_f64().unwrap(),
        )
    };
    for model in ["base", "shapes", "brightness"] {
        let j: serde_json::Value =
            serde_json::from_str(&env.ok(&["eval", "--benchmark", &suite, "--checkpoint", &p(model), "--json"]))
                .unwrap();
        assert_eq!(got(&j), want(model), "{model}");
    }
    let merged = env.path("ta.safetensors").to_string_lossy().into_owned();
    let text = env.ok(&[
        "merge",
        "--method",
        "task-arithmetic",
        "--base",
        &p("base"),
        "--expert",
        &p("shapes"),
        "--expert",
        &p("brightness"),
        "--param",
        "lambda=0.5",
        "--out",
        &merged,
        "--eval",
        "--benchmark",
        &suite,
        "--json",
        "-q",
    ]);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let (t, b) = want("task-arithmetic");
    assert_eq!(got(&j["eval"]), (t, b), "{text}");
    // The TA line through the same λ, models built in memory, images decoded once.
    let csv = env.ok(&[
        "analyze",
        "landscape",
        "--benchmark",
        &suite,
        "--kind",
        "ta-line",
        "--lambdas",
        "0.5:0.5:1",
        "--no-cache",
        "-q",
    ]);
    let v: f64 = csv.lines().nth(1).unwrap().split(',').nth(2).unwrap().parse().unwrap();
    assert!((v - (t + b) / 2.0).abs() < 1e-12, "{csv}");
    // CART's rank × λ grid runs on the suite too (two experts: every point is their mean).
    let csv = env.ok(&[
        "analyze",
        "landscape",
        "--benchmark",
        &suite,
        "--kind",
        "cart",
        "--ranks",
        "0.5,1",
        "--lambdas",
        "0:1:3",
        "--no-cache",
        "-q",
    ]);
    assert_eq!(csv.lines().count(), 1 + 6, "{csv}");
}

/// A model-level method on a causal-lm suite: experts fine-tuned from the tiny Llama of the
/// fixtures on a multiple-choice task and on a text (through the suite's own calibration tasks),
/// then AdaMerging through the binary learns task-wise λ on the tasks' calibration data,
/// lowering its objective (the entropy of the choices' and the next tokens' predictions) from
/// its start (task arithmetic at λ = 0.3); the output is evaluated on the suite.
#[test]
fn adamerging_learns_on_a_causal_lm_suite() {
    use mergescope_engine::device::Device;
    use mergescope_lab::evaluator::suite::Suite;
    use mergescope_lab::family::hf;
    use mergescope_lab::nn::Params;
    use mergescope_lab::train::{BatchSize, Budget, OptimConfig, TrainConfig};
    use std::sync::atomic::AtomicBool;

    let env = Env::new();
    let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/llama-tiny")
        .canonicalize()
        .unwrap();
    let p = |s: &str| fx.join(s).to_string_lossy().replace('\\', "/");
    let task = |name: &str, file: &str| {
        format!(
            "[[task]]\nname = \"{name}\"\ndata = \"{d}\"\ncalibration = \"{d}\"\ntrain = \"{d}\"\n",
            d = p(file)
        )
    };
    std::fs::write(
        env.path("lm.toml"),
        format!(
            "name = \"lm\"\n[model]\nfamily = \"causal-lm\"\nconfig = \"{}\"\ntokenizer = \"{}\"\nbatch_size = 3\n{}{}\
             [models]\nbase = \"{}\"\nexperts = [\"mc.safetensors\", \"text.safetensors\"]\n",
            p("config.json"),
            p("tokenizer.json"),
            task("mc", "mc.jsonl"),
            task("text", "text.txt"),
            p(""),
        ),
    )
    .unwrap();
    let suite_path = env.path("lm.toml");
    let tasks = Suite::load(&suite_path)
        .unwrap()
        .calibration_tasks(&fx, &[fx.clone(), fx.clone()], &Device::Cpu)
        .unwrap();
    let base: Params = hf::load_weights(&fx, &Device::Cpu).unwrap().into_iter().collect();
    let cfg = TrainConfig {
        optim: OptimConfig::adamw(1e-2, 0.0),
        batch: BatchSize::Size(3),
        budget: Budget::Steps(15),
        seed: 1,
        augment_shift: 0,
    };
    for (t, name) in ["mc.safetensors", "text.safetensors"].iter().enumerate() {
        let tuned = tasks
            .finetune(&base, t, &cfg, &Device::Cpu, &AtomicBool::new(false))
            .unwrap();
        let data: Vec<(String, Vec<usize>, Vec<f32>)> = tuned
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.dims().to_vec(),
                    v.flatten_all().unwrap().to_vec1().unwrap(),
                )
            })
            .collect();
        let tensors: Vec<(&str, DType, &[usize], &[f32])> = data
            .iter()
            .map(|(k, s, v)| (k.as_str(), DType::F32, s.as_slice(), v.as_slice()))
            .collect();
        env.write(name, &tensors);
    }
    let suite = suite_path.to_string_lossy().into_owned();
    let out = env.path("ada.safetensors").to_string_lossy().into_owned();
    let json = env.ok(&[
        "merge",
        "--method",
        "adamerging",
        "--param",
        "granularity=task",
        "--param",
        "steps=15",
        "--param",
        "lr=0.05",
        "--param",
        "report_every=5",
        "--benchmark",
        &suite,
        "--out",
        &out,
        "--eval",
        "--json",
        "-q",
    ]);
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        (0.0..=1.0).contains(&j["eval"]["tasks"]["mc"]["acc_norm"].as_f64().unwrap()),
        "{json}"
    );
    assert!(
        j["eval"]["tasks"]["text"]["perplexity"].as_f64().unwrap().is_finite(),
        "{json}"
    );
    let m = metadata(&env.path("ada.trajectory.safetensors"));
    let iterates: Vec<serde_json::Value> =
        serde_json::from_str(m["mergescope.trajectory.iterates"].as_str().unwrap()).unwrap();
    let loss = |it: &serde_json::Value| it["metrics"]["loss"].as_f64().unwrap();
    let (first, last) = (iterates.first().unwrap(), iterates.last().unwrap());
    eprintln!(
        "causal-lm AdaMerging: entropy {} -> {}, λ {} -> {}",
        loss(first),
        loss(last),
        first["metrics"]["lambda"],
        last["metrics"]["lambda"]
    );
    assert!(iterates.len() >= 3, "{iterates:?}");
    assert!(loss(last) < loss(first), "entropy {} -> {}", loss(first), loss(last));
    assert_eq!(first["metrics"]["lambda"], serde_json::json!([0.3, 0.3]), "{first}");
}
