//! Model-level methods (ABI 1.1) through the same loader as the per-tensor ones, run in a real
//! session: a small MLP backbone, three real tasks with frozen random heads, and one expert per
//! task fine-tuned from the base. Checks behaviour with numbers: AdaMerging lowers the entropy
//! and moves its coefficients; Frank-Wolfe lowers the calibration loss with a non-negative FW
//! gap; a cancelled run hands back its last iterate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use candle_core::{Device, Tensor};
use mergescope_lab::data::{TaskData, demo_tasks};
use mergescope_lab::evaluator::calibration::{CalibrationTask, DemoCalibration};
use mergescope_lab::model_merge::run_model_in_memory;
use mergescope_lab::nn::{Arch, Head};
use mergescope_lab::session::ModelRunOutput;
use mergescope_lab::session::SessionModel;
use mergescope_lab::train::{BatchSize, Budget, Examples, OptimConfig, TrainConfig, TrainTask, fine_tune};
use mergescope_tests::{load, tensor_max_abs_diff};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, Ordering};

const TASKS: [&str; 3] = ["mnist", "fashion_mnist", "optdigits"];

struct Fixture {
    tasks: Vec<TaskData>,
    heads: Vec<Head>,
    base: Vec<Tensor>,
    experts: Vec<Vec<Tensor>>,
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
}

fn fixture() -> Fixture {
    let dev = Device::Cpu;
    let all = demo_tasks().unwrap();
    let tasks: Vec<TaskData> = TASKS
        .iter()
        .map(|n| all.iter().find(|t| t.name == *n).unwrap().clone())
        .collect();
    let arch = Arch::Mlp;
    let base = arch.init(7, &dev).unwrap();
    let heads: Vec<Head> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| Head::init(arch.feature_dim(), t.classes.len(), 100 + i as u64, &dev).unwrap())
        .collect();
    let cfg = TrainConfig {
        optim: OptimConfig::momentum(0.05),
        batch: BatchSize::Size(64),
        budget: Budget::Steps(40),
        seed: 1,
        augment_shift: 0,
    };
    let names: Vec<String> = base.keys().cloned().collect();
    let experts = tasks
        .iter()
        .zip(&heads)
        .map(|(t, h)| {
            let task = TrainTask {
                data: Examples {
                    images: &t.train.images,
                    labels: &t.train.labels,
                },
                head: h,
            };
            let tuned = fine_tune(arch, &base, &[task], &cfg, &dev, &mut |_| {}, &AtomicBool::new(false)).unwrap();
            names.iter().map(|k| tuned.backbone[k].clone()).collect()
        })
        .collect();
    Fixture {
        shapes: names.iter().map(|k| base[k].dims().to_vec()).collect(),
        base: names.iter().map(|k| base[k].clone()).collect(),
        names,
        experts,
        heads,
        tasks,
    }
}

fn model(f: &Fixture) -> SessionModel<'_> {
    SessionModel {
        names: f.names.clone(),
        shapes: f.shapes.clone(),
        base: f.base.clone(),
        experts: f.experts.clone(),
        tasks: Box::new(
            DemoCalibration::new(
                Arch::Mlp,
                f.tasks
                    .iter()
                    .zip(&f.heads)
                    .map(|(data, head)| CalibrationTask {
                        data,
                        head: head.clone(),
                    })
                    .collect(),
                &Device::Cpu,
            )
            .unwrap(),
        ),
    }
}

/// Runs the plugin library `lib` with `params` on the fixture, never cancelled.
fn run(lib: &str, f: &Fixture, params: Value) -> ModelRunOutput {
    let m = model(f);
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

#[test]
fn model_level_plugins_load_through_the_common_door() {
    for lib in [
        "mergescope_plugin_adamerging",
        "mergescope_plugin_frank_wolfe",
        "mergescope_plugin_mima",
        "mergescope_plugin_fisher",
    ] {
        let p = load(lib);
        assert!(p.is_model_level(), "{lib}: {}", p.info.kind);
        // Built with this SDK: the current ABI (1.1 added model-level methods).
        let current = format!(
            "{}.{}",
            mergescope_plugin_api::abi::ABI_MAJOR,
            mergescope_plugin_api::abi::ABI_MINOR
        );
        assert_eq!(p.info.abi, current);
    }
}

#[test]
fn adamerging_lowers_entropy_and_moves_its_coefficients() {
    let f = fixture();
    let out = run(
        "mergescope_plugin_adamerging",
        &f,
        json!({"steps": 40, "lr": 0.01, "report_every": 5}),
    );
    let merged = out.result.unwrap();
    assert_eq!(merged.len(), f.names.len());
    let its = &out.trajectory.iterates;
    // Steps 0, 5, …, 35 and the final one.
    assert_eq!(out.trajectory.reported, 9);
    assert_eq!(its.first().unwrap().label, "step 0");
    assert_eq!(its.last().unwrap().label, "step 40");
    let first = metric(&its[0].metrics, "loss");
    let last = metric(&its.last().unwrap().metrics, "loss");
    assert!(last < first - 1e-3, "entropy did not fall: {first} → {last}");
    let lambda = numbers(&its.last().unwrap().metrics["lambda"]);
    // Layer-wise: one coefficient per task and tensor, all inside the clamp.
    assert_eq!(lambda.len(), 3 * f.names.len());
    assert!(lambda.iter().all(|l| (0.0..=1.0).contains(l)), "{lambda:?}");
    let moved = lambda.iter().map(|l| (l - 0.3).abs()).fold(0.0, f64::max);
    assert!(moved > 0.05, "coefficients stayed at the init: {lambda:?}");
    // The first iterate is exactly task arithmetic at λ = 0.3.
    let ta = &its[0].tensors;
    for (p, t) in ta.iter().enumerate() {
        let want = (&f.base[p]
            + ((&f.experts[0][p] + &f.experts[1][p]).unwrap() + &f.experts[2][p])
                .unwrap()
                .broadcast_sub(&(&f.base[p] * 3.0).unwrap())
                .unwrap()
                * 0.3)
            .unwrap();
        let diff = tensor_max_abs_diff(t, &want);
        assert!(diff < 1e-5, "tensor {}: TA init off by {diff}", f.names[p]);
    }
}

/// AdaMerging's steps on mini-batches (its default, 16 per task, through the session's
/// mini-batch extension): a batch as large as the calibration set (100 per task) is the full
/// batch bit for bit; batches of 16 take another path, and it still lowers the entropy over
/// every calibration example from task arithmetic's.
#[test]
fn adamerging_steps_on_minibatches() {
    let f = fixture();
    let ada = |batch: u64| {
        run(
            "mergescope_plugin_adamerging",
            &f,
            json!({"steps": 40, "lr": 0.01, "report_every": 5, "batch_size": batch}),
        )
    };
    let (full, whole, mini) = (ada(0), ada(100), ada(16));
    let loss = |o: &ModelRunOutput, i: usize| metric(&o.trajectory.iterates[i].metrics, "loss");
    let last = |o: &ModelRunOutput| loss(o, o.trajectory.iterates.len() - 1);
    let (full_m, whole_m, mini_m) = (
        full.result.as_ref().unwrap(),
        whole.result.as_ref().unwrap(),
        mini.result.as_ref().unwrap(),
    );
    for ((a, b), name) in full_m.iter().zip(whole_m).zip(&f.names) {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.flatten_all().unwrap().to_vec1().unwrap(),
            b.flatten_all().unwrap().to_vec1().unwrap(),
        );
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}");
    }
    // Step 0 is task arithmetic at λ = 0.3 in every run: the full batch's loss is over every
    // example, the mini-batch run's over its first batch.
    let start = loss(&full, 0);
    assert_eq!(start.to_bits(), loss(&whole, 0).to_bits());
    assert!((loss(&mini, 0) - start).abs() > 1e-6, "{} vs {start}", loss(&mini, 0));
    // The last iterate's loss is over every calibration example.
    let end = last(&mini);
    assert!(
        end < start - 1e-3,
        "mini-batches did not lower the entropy: {start} → {end}"
    );
    let moved = max_abs_diff(full_m, mini_m);
    assert!(moved > 1e-6, "mini-batches gave the full batch's merge");
}

#[test]
fn frank_wolfe_hard_lowers_the_calibration_loss() {
    let f = fixture();
    let out = run(
        "mergescope_plugin_frank_wolfe",
        &f,
        json!({"iterations": 4, "init": "base"}),
    );
    out.result.unwrap();
    let its = &out.trajectory.iterates;
    assert_eq!(its.len(), 5, "init and four iterations");
    let losses: Vec<f64> = its[1..].iter().map(|i| metric(&i.metrics, "loss_before")).collect();
    let init_loss = metric(&its[0].metrics, "loss");
    assert!((losses[0] - init_loss).abs() < 1e-4, "{losses:?} vs {init_loss}");
    // From the base, γ_0 = 1 jumps to the best expert, which lowers the summed loss.
    assert!(losses[1] < losses[0], "{losses:?}");
    for it in &its[1..] {
        let gap = metric(&it.metrics, "fw_gap");
        assert!(gap.is_finite());
        assert!(metric(&it.metrics, "gamma") > 0.0);
    }
    // Step 1 (γ = 1) lands exactly on the vertex it names.
    let v = its[1].metrics["vertex"].as_u64().unwrap() as usize;
    for (p, t) in its[1].tensors.iter().enumerate() {
        assert!(tensor_max_abs_diff(t, &f.experts[v][p]) < 1e-6);
    }
}

#[test]
fn frank_wolfe_soft_mixes_vertices_on_the_simplex() {
    let f = fixture();
    let out = run(
        "mergescope_plugin_frank_wolfe",
        &f,
        json!({"variant": "soft", "iterations": 2, "init": "base", "soft_steps": 8, "soft_lr": 0.1}),
    );
    out.result.unwrap();
    for it in &out.trajectory.iterates[1..] {
        let lambda = numbers(&it.metrics["lambda"]);
        assert_eq!(lambda.len(), 3);
        assert!(
            lambda.iter().all(|l| *l >= 0.0) && lambda.iter().sum::<f64>() <= 1.0 + 1e-9,
            "{lambda:?}"
        );
    }
}

/// `simplex=none` (FusionBench's unconstrained soft step): from the base, the first iterate is
/// exactly base + Σ_j λ_j (s_j − base) with the λ it reports, and it lowers the calibration loss.
#[test]
fn frank_wolfe_soft_with_free_weights_lands_on_its_reported_combination() {
    let f = fixture();
    let out = run(
        "mergescope_plugin_frank_wolfe",
        &f,
        json!({"variant": "soft", "simplex": "none", "iterations": 2, "init": "base", "soft_steps": 8, "soft_lr": 0.1, "batch_size": 0}),
    );
    out.result.as_ref().unwrap();
    let lambda = numbers(&out.trajectory.iterates[1].metrics["lambda"]);
    assert_eq!(lambda.len(), 3);
    // Adam's first steps move every λ by about soft_lr: none stays at its start, 0.
    assert!(lambda.iter().all(|l| l.abs() > 0.05), "{lambda:?}");
    assert_soft_step_from_base(&f, &out, |_| lambda.clone());
}

/// `granularity=layer` with free weights (FusionBench's layer-wise soft step): every tensor has
/// its own λ_j, the first iterate from the base is base_p + Σ_j λ_jp (s_j,p − base_p) with the
/// table it reports, the tensors' λ differ, and the calibration loss falls.
#[test]
fn frank_wolfe_soft_layer_wise_weights_differ_per_tensor() {
    let f = fixture();
    let out = run(
        "mergescope_plugin_frank_wolfe",
        &f,
        json!({"variant": "soft", "simplex": "none", "granularity": "layer", "iterations": 2, "init": "base",
               "soft_steps": 8, "soft_lr": 0.1, "batch_size": 0}),
    );
    out.result.as_ref().unwrap();
    let first = &out.trajectory.iterates[1].metrics;
    let table: Vec<Vec<f64>> = first["lambda_per_tensor"]
        .as_array()
        .unwrap()
        .iter()
        .map(numbers)
        .collect();
    assert_eq!(table.len(), f.base.len());
    assert!(table.iter().all(|row| row.len() == 3));
    // The reported λ is each vertex's mean over tensors.
    let mean = numbers(&first["lambda"]);
    for (j, m) in mean.iter().enumerate() {
        let want = table.iter().map(|row| row[j]).sum::<f64>() / table.len() as f64;
        assert!((m - want).abs() < 1e-12, "vertex {j}: {m} vs {want}");
    }
    assert!(
        table.iter().any(|row| (row[0] - table[0][0]).abs() > 1e-6),
        "every tensor has the same λ: {table:?}"
    );
    assert_soft_step_from_base(&f, &out, |p| table[p].clone());
}

/// A soft Frank-Wolfe run from the base: its first iterate is base_p + Σ_j λ_jp (s_j,p − base_p)
/// for every tensor p, with `lambda(p)` the weights of the vertices it reports, and the
/// calibration loss falls after it.
fn assert_soft_step_from_base(f: &Fixture, out: &ModelRunOutput, lambda: impl Fn(usize) -> Vec<f64>) {
    let its = &out.trajectory.iterates;
    let vertices: Vec<usize> = numbers(&its[1].metrics["vertices"])
        .iter()
        .map(|v| *v as usize)
        .collect();
    for (p, t) in its[1].tensors.iter().enumerate() {
        let mut want = f.base[p].clone();
        for (l, v) in lambda(p).iter().zip(&vertices) {
            let dir = (&f.experts[*v][p] - &f.base[p]).unwrap();
            want = (want + (dir * *l).unwrap()).unwrap();
        }
        let d = tensor_max_abs_diff(t, &want);
        assert!(d < 1e-5, "tensor {p}: {d}");
    }
    let init = metric(&its[0].metrics, "loss");
    let after = metric(&its[2].metrics, "loss_before");
    assert!(after < init, "calibration loss {init} -> {after}");
}

/// A metric that is an array of numbers.
fn numbers(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// MIMA with the fixture experts' recipe (momentum 0.05, batch 64, S = 40 steps per task).
fn mima(rounds: u64, extra: Value) -> Value {
    let mut p = json!({"rounds": rounds, "total_steps": 40, "optimizer": "momentum", "lr": 0.05});
    p.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    p
}

/// Largest |a − b| over two models' tensors.
fn max_abs_diff(a: &[Tensor], b: &[Tensor]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| tensor_max_abs_diff(x, y))
        .fold(0f32, f32::max)
}

/// Seed 003, Prop. 1 and Fig. 5: with the same budget S per task, more rounds of averaging make
/// the final task vectors θ_t − θ0 point the same way, while each round's updates stay far less
/// aligned. And TA with λ = 1/T is exactly the uniform average (003 §2.1 step 4).
#[test]
fn mima_task_vectors_align_as_rounds_grow() {
    let f = fixture();
    let one = run("mergescope_plugin_mima", &f, mima(1, json!({})));
    let four = run("mergescope_plugin_mima", &f, mima(4, json!({})));
    assert_eq!(one.trajectory.reported, 1);
    assert_eq!(four.trajectory.reported, 4);
    let labels: Vec<&str> = four.trajectory.iterates.iter().map(|i| i.label.as_str()).collect();
    assert_eq!(labels, ["round 1", "round 2", "round 3", "round 4"]);
    let cos = |o: &ModelRunOutput| metric(&o.trajectory.iterates.last().unwrap().metrics, "task_vector_cosine");
    let (c1, c4) = (cos(&one), cos(&four));
    assert!(c4 > c1 + 0.2, "mean pairwise cosine of τ: N=1 {c1:.3}, N=4 {c4:.3}");
    let per_round: Vec<f64> = four
        .trajectory
        .iterates
        .iter()
        .map(|i| metric(&i.metrics, "task_vector_cosine"))
        .collect();
    eprintln!("MIMA mean pairwise cos(τ): N=1 {c1:.3}, N=4 per round {per_round:.3?}");
    assert!(per_round.windows(2).all(|w| w[1] > w[0]), "{per_round:?}");
    let update = metric(&four.trajectory.iterates[3].metrics, "update_cosine");
    assert!(update < c4, "round-4 updates cos {update:.3} vs task vectors {c4:.3}");
    // N = 1 is independent fine-tuning: the round's updates are the task vectors.
    let first = &one.trajectory.iterates[0].metrics;
    assert!((metric(first, "update_cosine") - c1).abs() < 1e-9, "{first}");

    // The default final merge is the last average; TA at λ = 1/T gives the same model.
    let avg = four.result.unwrap();
    assert!(max_abs_diff(&avg, &four.trajectory.iterates[3].tensors) == 0.0);
    let ta = run(
        "mergescope_plugin_mima",
        &f,
        mima(4, json!({"final": "task-arithmetic", "ta_lambda": 1.0 / 3.0})),
    )
    .result
    .unwrap();
    let d = max_abs_diff(&avg, &ta);
    assert!(d < 1e-5, "TA(1/T) differs from the uniform average by {d}");
}

/// Fisher merging is an element-wise convex combination of the experts, tends to the uniform
/// average as ε grows, and on the experts' calibration data beats the uniform average it starts
/// from (Matena & Raffel, 2022, Fig. 1's ordering).
#[test]
fn fisher_merging_weights_experts_by_their_information() {
    let f = fixture();
    let out = run("mergescope_plugin_fisher", &f, json!({}));
    let labels: Vec<&str> = out.trajectory.iterates.iter().map(|i| i.label.as_str()).collect();
    assert_eq!(labels, ["uniform average", "fisher-weighted"]);
    let loss = |i: usize| metric(&out.trajectory.iterates[i].metrics, "loss");
    eprintln!("Fisher: calibration loss uniform {:.4}, fisher {:.4}", loss(0), loss(1));
    assert!(loss(1) < loss(0), "uniform {} vs fisher {}", loss(0), loss(1));
    let merged = out.result.unwrap();
    for (p, m) in merged.iter().enumerate() {
        let stack = Tensor::stack(&f.experts.iter().map(|e| e[p].clone()).collect::<Vec<_>>(), 0).unwrap();
        let lo = (stack.min(0).unwrap() - 1e-6).unwrap();
        let hi = (stack.max(0).unwrap() + 1e-6).unwrap();
        let inside = m.ge(&lo).unwrap().mul(&m.le(&hi).unwrap()).unwrap();
        let outside = m.elem_count()
            - inside
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap() as usize;
        assert_eq!(outside, 0, "tensor {p}: {outside} entries outside the experts' range");
    }
    let moved = max_abs_diff(&merged, &out.trajectory.iterates[0].tensors);
    assert!(moved > 1e-4, "the Fisher merge equals the average (max |Δ| {moved})");
    let flat = run("mergescope_plugin_fisher", &f, json!({"min_fisher": 1e9}))
        .result
        .unwrap();
    let d = max_abs_diff(&flat, &out.trajectory.iterates[0].tensors);
    assert!(d < 1e-5, "ε = 1e9 should give the average; max |Δ| {d}");
}

#[test]
fn a_cancelled_run_keeps_its_last_iterate() {
    let f = fixture();
    let m = model(&f);
    let plugin = load("mergescope_plugin_adamerging");
    let cancel = AtomicBool::new(false);
    let mut fractions = Vec::new();
    let params = json!({"steps": 200, "report_every": 2});
    let out = run_model_in_memory(&plugin, &params, 0, &m, &Device::Cpu, &cancel, &mut |_, f| {
        fractions.push(f);
        if fractions.len() == 3 {
            cancel.store(true, Ordering::Relaxed);
        }
    })
    .unwrap();
    // Each iterate comes with the plugin's progress: steps 0, 2, 4 of 200.
    assert_eq!(fractions, [0.0, 0.01, 0.02]);
    assert!(matches!(out.result, Err(mergescope_engine::EngineError::Cancelled)));
    assert_eq!(out.trajectory.reported, 3);
    assert_eq!(out.trajectory.iterates.last().unwrap().label, "step 4");
}
