//! Suites and model families given the wrong thing: each refusal names the suite, the key or
//! the file, and what to do, and leaves every file as it was.

use super::refuses;
use crate::common::Env;
use std::path::{Path, PathBuf};

fn families() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families")
        .canonicalize()
        .unwrap()
}

fn f(p: &str) -> String {
    families().join(p).display().to_string()
}

/// Writes `text` as the suite `name` in the test folder.
fn suite(env: &Env, name: &str, text: &str) -> String {
    let p = env.path(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn eval(env: &Env, suite: &str, model: &str, needles: &[&str]) -> String {
    refuses(env, &["eval", "--benchmark", suite, "--checkpoint", model], needles)
}

#[test]
fn a_model_of_another_family_is_refused_by_name() {
    let env = Env::new();
    let bert = suite(
        &env,
        "bert.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("bert-tiny/data.jsonl")
        ),
    );
    eval(&env, &bert, &f("clip-tiny"), &["'clip' model", "bert"]);
    let clip = suite(
        &env,
        "clip.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"clip\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("clip-tiny/images")
        ),
    );
    eval(&env, &clip, &f("bert-tiny"), &["not CLIP", "clip_vision_model"]);
    let lm = suite(
        &env,
        "lm.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"causal-lm\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("llama-tiny/mc.jsonl")
        ),
    );
    eval(
        &env,
        &lm,
        &f("bert-tiny"),
        &["'bert' model", "llama, mistral, qwen2 and gpt2"],
    );
}

#[test]
fn a_checkpoint_missing_layers_is_named_not_a_panic() {
    let env = Env::new();
    // The base of the mergekit fixtures is a tiny Llama with 2 layers: a config claiming 3
    // layers asks for tensors it does not have.
    let dir = env.path("llama3");
    std::fs::create_dir(&dir).unwrap();
    let config = std::fs::read_to_string(families().join("llama-tiny/config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap();
    std::fs::copy(families().join("llama-tiny/tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::copy(
        families().join("llama-tiny/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let lm = suite(
        &env,
        "lm.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"causal-lm\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("llama-tiny/mc.jsonl")
        ),
    );
    eval(&env, &lm, &dir.display().to_string(), &["model.layers.2.", "layers: 3"]);
}

#[test]
fn bad_task_data_names_the_file_and_line() {
    let env = Env::new();
    std::fs::write(
        env.path("bad.jsonl"),
        "{\"text\": \"fine\", \"label\": 0}\n{\"text\": \"no label\"}\n",
    )
    .unwrap();
    let s = suite(
        &env,
        "s.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            env.path("bad.jsonl").display()
        ),
    );
    eval(
        &env,
        &s,
        &f("bert-tiny"),
        &["bad.jsonl", "line 2", "label", "[[task]] 'a'"],
    );
    let s = suite(
        &env,
        "missing.toml",
        "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"nowhere.jsonl\"\n",
    );
    eval(&env, &s, &f("bert-tiny"), &["nowhere.jsonl"]);
    std::fs::create_dir_all(env.path("imgs/empty")).unwrap();
    let s = suite(
        &env,
        "img.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"clip\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            env.path("imgs").display()
        ),
    );
    eval(&env, &s, &f("clip-tiny"), &["empty", "no .png"]);
    std::fs::write(
        env.path("q.jsonl"),
        "{\"question\": \"x\", \"choices\": [\"a\", \"b\"], \"answer\": 5}\n",
    )
    .unwrap();
    let s = suite(
        &env,
        "q.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"causal-lm\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            env.path("q.jsonl").display()
        ),
    );
    eval(&env, &s, &f("llama-tiny"), &["q.jsonl", "line 1", "answer"]);
}

#[test]
fn suite_keys_that_cannot_work_are_refused() {
    let env = Env::new();
    let s = suite(
        &env,
        "t.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"clip\"\ntemplates = [\"a photo\"]\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("clip-tiny/images")
        ),
    );
    eval(&env, &s, &f("clip-tiny"), &["templates", "{}"]);
    let s = suite(
        &env,
        "z.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\nzeroshot_from = \"x\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("bert-tiny/data.jsonl")
        ),
    );
    eval(&env, &s, &f("bert-tiny"), &["zeroshot_from", "clip family"]);
    // A merged file alone has no config beside it.
    let lone = env.path("merged.safetensors");
    std::fs::copy(families().join("bert-tiny/model.safetensors"), &lone).unwrap();
    let s = suite(
        &env,
        "b.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("bert-tiny/data.jsonl")
        ),
    );
    eval(
        &env,
        &s,
        &lone.display().to_string(),
        &["config.json", "config = ", "[model]"],
    );
}

#[test]
fn commands_on_a_suite_without_models_or_with_a_command_say_what_is_missing() {
    let env = Env::new();
    let s = suite(
        &env,
        "b.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"a\"\ndata = \"{}\"\n",
            f("bert-tiny/data.jsonl")
        ),
    );
    refuses(
        &env,
        &["compare", "--benchmark", &s, "--out-dir", "cmp"],
        &["names no models", "--base", "[models]"],
    );
    let c = suite(
        &env,
        "c.toml",
        &format!(
            "name = \"s\"\n[evaluator]\ncommand = [\"true\", \"{{model}}\"]\ntasks = [\"a\"]\n[models]\nbase = \"{}\"\nexperts = [\"{}\", \"{}\"]\n",
            f("bert-experts/base"),
            f("bert-experts/topic"),
            f("bert-experts/verdict")
        ),
    );
    refuses(
        &env,
        &[
            "analyze",
            "landscape",
            "--benchmark",
            &c,
            "--kind",
            "ta-line",
            "--no-cache",
            "-q",
        ],
        &["only saved files", "[model] family"],
    );
}

#[test]
fn searches_that_cannot_run_are_refused_before_any_merge() {
    let env = Env::new();
    let b = suite(
        &env,
        "b.toml",
        &format!(
            "name = \"s\"\n[model]\nfamily = \"bert\"\n[[task]]\nname = \"topic\"\ndata = \"{}\"\nhead = \"{}\"\n[models]\nbase = \"{}\"\nexperts = [\"{}\", \"{}\"]\n",
            f("bert-experts/topic.jsonl"),
            f("bert-experts/topic"),
            f("bert-experts/base"),
            f("bert-experts/topic"),
            f("bert-experts/verdict")
        ),
    );
    let out = env.path("best.safetensors").display().to_string();
    let search = |extra: &[&str], needles: &[&str]| {
        let mut args = vec!["search", "--benchmark", &b, "--out", &out, "-q"];
        args.extend_from_slice(extra);
        refuses(&env, &args, needles);
    };
    search(
        &["--method", "adamerging", "--search", "lambda"],
        &["model-level", "per-tensor"],
    );
    search(
        &["--method", "task-arithmetic", "--search", "lambda", "--range", "1:0"],
        &["--range", "LO < HI"],
    );
    search(
        &["--method", "task-arithmetic", "--search", "lambda:groups=3"],
        &["layers=G"],
    );
    search(
        &[
            "--method",
            "task-arithmetic",
            "--search",
            "task_weights",
            "--budget",
            "0",
        ],
        &["--budget"],
    );
}
