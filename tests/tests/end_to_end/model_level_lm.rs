//! Model-level methods on causal LMs: a causal-lm suite of the tiny Llama, Qwen2 and GPT-2 of the
//! fixtures (a multiple-choice task and a text), two experts fine-tuned from the base on each
//! task's train data through the suite's own calibration tasks, and AdaMerging, Frank-Wolfe,
//! Fisher merging and MIMA run in a real session on them. Checks with numbers: AdaMerging lowers
//! its entropy objective from its starting λ; every method gives finite tensors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use candle_core::{Device, Tensor};
use mergescope_lab::evaluator::calibration::CalibrationTasks;
use mergescope_lab::evaluator::suite::Suite;
use mergescope_lab::family::hf;
use mergescope_lab::model_merge::run_model_in_memory;
use mergescope_lab::nn::Params;
use mergescope_lab::session::{ModelRunOutput, SessionModel};
use mergescope_lab::train::{BatchSize, Budget, OptimConfig, TrainConfig};
use mergescope_tests::load;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

struct LmFixture {
    _dir: tempfile::TempDir,
    suite: Suite,
    base_dir: PathBuf,
    names: Vec<String>,
    base: Vec<Tensor>,
    experts: Vec<Vec<Tensor>>,
}

/// The suite of the tiny `arch` model (`llama`, `qwen2`, `gpt2`): tasks "mc" and "text", each
/// calibrating and training on its own file; experts fine-tuned from the base on each.
fn lm_fixture(arch: &str) -> LmFixture {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/families/{arch}-tiny"));
    let dir = tempfile::tempdir().unwrap();
    let p = |s: &str| fx.join(s).to_string_lossy().replace('\\', "/");
    let task = |name: &str, file: &str| {
        format!(
            "[[task]]\nname = \"{name}\"\ndata = \"{d}\"\ncalibration = \"{d}\"\ntrain = \"{d}\"\n",
            d = p(file)
        )
    };
    let path = dir.path().join("lm.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"lm\"\n[model]\nfamily = \"causal-lm\"\nbatch_size = 3\n{}{}",
            task("mc", "mc.jsonl"),
            task("text", "text.txt")
        ),
    )
    .unwrap();
    let suite = Suite::load(&path).unwrap();
    let base: Params = hf::load_weights(&fx, &Device::Cpu).unwrap().into_iter().collect();
    let tasks = suite
        .calibration_tasks(&fx, &[fx.clone(), fx.clone()], &Device::Cpu)
        .unwrap();
    let cfg = TrainConfig {
        optim: OptimConfig::adamw(1e-2, 0.0),
        batch: BatchSize::Size(3),
        budget: Budget::Steps(15),
        seed: 1,
        augment_shift: 0,
    };
    let names: Vec<String> = base.keys().cloned().collect();
    let experts = (0..2)
        .map(|t| {
            let tuned = tasks
                .finetune(&base, t, &cfg, &Device::Cpu, &AtomicBool::new(false))
                .unwrap();
            names.iter().map(|k| tuned[k].clone()).collect()
        })
        .collect();
    LmFixture {
        _dir: dir,
        base: names.iter().map(|k| base[k].clone()).collect(),
        names,
        experts,
        suite,
        base_dir: fx,
    }
}

/// Runs the plugin library `lib` with `params` on the fixture's session.
fn run(lib: &str, f: &LmFixture, params: Value) -> ModelRunOutput {
    let tasks: Box<dyn CalibrationTasks> = f
        .suite
        .calibration_tasks(&f.base_dir, &[f.base_dir.clone(), f.base_dir.clone()], &Device::Cpu)
        .unwrap();
    let m = SessionModel {
        names: f.names.clone(),
        shapes: f.base.iter().map(|t| t.dims().to_vec()).collect(),
        base: f.base.clone(),
        experts: f.experts.clone(),
        tasks,
    };
    run_model_in_memory(
        &load(lib),
        &params,
        0,
        &m,
        &Device::Cpu,
        &AtomicBool::new(false),
        &mut |_, _| {},
    )
    .unwrap()
}

fn metric(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("metric '{key}' missing in {v}"))
}

/// The merged model: one finite tensor per name, of the base's shape.
fn assert_finite(out: ModelRunOutput, f: &LmFixture, what: &str) -> Vec<Tensor> {
    let merged = out.result.unwrap();
    assert_eq!(merged.len(), f.names.len(), "{what}");
    for ((t, b), name) in merged.iter().zip(&f.base).zip(&f.names) {
        assert_eq!(t.dims(), b.dims(), "{what}: {name}");
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{what}: {name} is not finite");
    }
    merged
}

#[test]
fn data_driven_methods_run_on_causal_lm_suites() {
    for arch in ["llama", "qwen2", "gpt2"] {
        let t = std::time::Instant::now();
        let f = lm_fixture(arch);
        eprintln!("{arch}-tiny: experts fine-tuned in {:.1} s", t.elapsed().as_secs_f64());

        // AdaMerging (task-wise λ, entropy of the choices' and the next tokens' predictions).
        let t = std::time::Instant::now();
        let out = run(
            "mergescope_plugin_adamerging",
            &f,
            json!({"granularity": "task", "steps": 20, "lr": 0.05, "report_every": 5}),
        );
        let its = out.trajectory.iterates.clone();
        let (first, last) = (
            metric(&its[0].metrics, "loss"),
            metric(&its.last().unwrap().metrics, "loss"),
        );
        eprintln!(
            "{arch}-tiny AdaMerging: entropy {first:.4} -> {last:.4}, λ {} -> {} ({:.1} s)",
            its[0].metrics["lambda"],
            its.last().unwrap().metrics["lambda"],
            t.elapsed().as_secs_f64()
        );
        assert!(last < first - 1e-3, "{arch}: entropy did not fall: {first} -> {last}");
        assert_eq!(its[0].metrics["lambda"], json!([0.3, 0.3]));
        assert_finite(out, &f, "adamerging");

        // Frank-Wolfe (hard): from the base, the first step jumps to an expert.
        let t = std::time::Instant::now();
        let out = run(
            "mergescope_plugin_frank_wolfe",
            &f,
            json!({"iterations": 3, "init": "base"}),
        );
        let its = out.trajectory.iterates.clone();
        assert_eq!(its.len(), 4, "{arch}: init and three iterations");
        let losses: Vec<f64> = its[1..].iter().map(|i| metric(&i.metrics, "loss_before")).collect();
        for it in &its[1..] {
            assert!(metric(&it.metrics, "fw_gap").is_finite());
        }
        eprintln!(
            "{arch}-tiny Frank-Wolfe: loss before each step {losses:.4?} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        assert!(losses.iter().all(|l| l.is_finite()));
        assert_finite(out, &f, "frank-wolfe");

        // Fisher merging.
        let t = std::time::Instant::now();
        let out = run("mergescope_plugin_fisher", &f, json!({}));
        let loss = |i: usize| metric(&out.trajectory.iterates[i].metrics, "loss");
        eprintln!(
            "{arch}-tiny Fisher: calibration loss uniform {:.4}, fisher {:.4} ({:.1} s)",
            loss(0),
            loss(1),
            t.elapsed().as_secs_f64()
        );
        assert!(loss(0).is_finite() && loss(1).is_finite());
        assert_finite(out, &f, "fisher");

        // MIMA: two rounds of fine-tuning on each task's train data and averaging.
        let t = std::time::Instant::now();
        let out = run(
            "mergescope_plugin_mima",
            &f,
            json!({"rounds": 2, "total_steps": 10, "optimizer": "adamw", "lr": 0.01, "batch_size": 3}),
        );
        assert_eq!(out.trajectory.reported, 2);
        let merged = assert_finite(out, &f, "mima");
        let moved = merged
            .iter()
            .zip(&f.base)
            .map(|(m, b)| mergescope_tests::tensor_max_abs_diff(m, b))
            .fold(0.0, f32::max);
        eprintln!(
            "{arch}-tiny MIMA: max |Δ| from the base {moved:.4} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        assert!(moved > 1e-3, "{arch}: MIMA left the base as it was");
    }
}
