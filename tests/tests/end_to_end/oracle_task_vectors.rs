#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The task-vectors-as-gradients oracle (seed 004, Theorem 1 and Eq. 2), run through the real
//! fine-tuning engine on real demo data: it checks the whole gradient pipeline (models,
//! cross-entropy, autograd, optimiser, batching).
//!
//! - One epoch of full-batch gradient descent with step η per task, merged with task
//!   arithmetic at α, equals one multi-task full-batch step with step αη on Σₜ L̄ₜ.
//! - Over k > 1 epochs the two differ by a second-order term: the gap is far above float
//!   noise and shrinks about 4× when η is halved (on the smooth ViT; see the test).

use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_lab::data::{TaskData, demo_tasks};
use mergescope_lab::nn::{Arch, Head, Params, to_host};
use mergescope_lab::train::{BatchSize, Budget, Examples, OptimConfig, TrainConfig, TrainTask, fine_tune};
use std::sync::atomic::AtomicBool;

const PER_TASK: usize = 48;
const TASKS: [&str; 3] = ["mnist", "fashion_mnist", "letters"];

struct Setup {
    arch: Arch,
    base: Params,
    tasks: Vec<TaskData>,
    heads: Vec<Head>,
}

fn setup(arch: Arch) -> Setup {
    let (dev, _) = open_device(DeviceChoice::Cpu);
    let tasks: Vec<TaskData> = demo_tasks()
        .unwrap()
        .into_iter()
        .filter(|t| TASKS.contains(&t.name.as_str()))
        .collect();
    assert_eq!(tasks.len(), 3);
    let heads = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| Head::init(arch.feature_dim(), t.classes.len(), 100 + i as u64, &dev).unwrap())
        .collect();
    Setup {
        arch,
        base: arch.init(11, &dev).unwrap(),
        tasks,
        heads,
    }
}

fn examples(t: &TaskData) -> Examples<'_> {
    Examples {
        images: &t.train.images[..PER_TASK * 28 * 28],
        labels: &t.train.labels[..PER_TASK],
    }
}

/// Full-batch gradient descent for `epochs` epochs with step `lr` on the summed loss of `tasks`.
fn gd(s: &Setup, tasks: &[usize], lr: f64, epochs: usize) -> Vec<f64> {
    let (dev, _) = open_device(DeviceChoice::Cpu);
    let train: Vec<TrainTask> = tasks
        .iter()
        .map(|&i| TrainTask {
            data: examples(&s.tasks[i]),
            head: &s.heads[i],
        })
        .collect();
    let cfg = TrainConfig {
        optim: OptimConfig::sgd(lr),
        batch: BatchSize::Full,
        budget: Budget::Epochs(epochs),
        seed: 0,
        augment_shift: 0,
    };
    let out = fine_tune(
        s.arch,
        &s.base,
        &train,
        &cfg,
        &dev,
        &mut |_| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(out.losses.len(), epochs, "one full-batch step per epoch");
    flat(&out.backbone)
}

fn flat(p: &Params) -> Vec<f64> {
    to_host(p)
        .unwrap()
        .into_values()
        .flat_map(|(_, v)| v.into_iter().map(f64::from))
        .collect()
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

/// (‖θ_TA − θ_MT‖, ‖θ_MT − θ_base‖) after `epochs` epochs with step `eta`, α = 1/T.
fn gap(s: &Setup, eta: f64, epochs: usize) -> (f64, f64) {
    let base = flat(&s.base);
    let alpha = 1.0 / s.tasks.len() as f64;
    let mut ta = base.clone();
    for i in 0..s.tasks.len() {
        let theta = gd(s, &[i], eta, epochs);
        for ((m, t), b) in ta.iter_mut().zip(&theta).zip(&base) {
            *m += alpha * (t - b);
        }
    }
    let all: Vec<usize> = (0..s.tasks.len()).collect();
    let mt = gd(s, &all, alpha * eta, epochs);
    let diff = norm(ta.iter().zip(&mt).map(|(a, b)| a - b));
    let moved = norm(mt.iter().zip(&base).map(|(a, b)| a - b));
    (diff, moved)
}

fn one_epoch_equals_one_multitask_step(arch: Arch) {
    let s = setup(arch);
    let (diff, moved) = gap(&s, 0.5, 1);
    assert!(moved > 1e-2, "{arch}: the step must move the weights ({moved})");
    // Equal up to f32 rounding of the sums (Theorem 1 is exact).
    assert!(
        diff < 1e-5 * moved,
        "{arch}: ‖θ_TA − θ_MT‖ = {diff:e} vs ‖τ_MT‖ = {moved:e}"
    );
}

#[test]
fn theorem1_mlp_one_epoch_task_arithmetic_is_one_multitask_gradient_step() {
    one_epoch_equals_one_multitask_step(Arch::Mlp);
}

#[test]
fn theorem1_cnn_one_epoch_task_arithmetic_is_one_multitask_gradient_step() {
    one_epoch_equals_one_multitask_step(Arch::Cnn);
}

#[test]
fn theorem1_vit_one_epoch_task_arithmetic_is_one_multitask_gradient_step() {
    one_epoch_equals_one_multitask_step(Arch::Vit);
}

#[test]
fn eq2_over_several_epochs_the_gap_is_second_order_in_the_step() {
    // The ViT is smooth (GELU, layer norm, softmax), as the expansion assumes. With ReLU
    // networks the halving ratio wanders between about 2.6 and 3.7 (activation patterns flip
    // inside the step), so they are not used here. Measured ratios for this setup:
    // η = 0.003 → 0.0015: 3.85; 0.0015 → 0.00075: 3.93; 0.00075 → 0.000375: 3.96.
    let s = setup(Arch::Vit);
    let epochs = 4;
    let (g1, moved) = gap(&s, 0.0015, epochs);
    let (g2, _) = gap(&s, 0.00075, epochs);
    // Far above the float noise of the one-epoch identity, yet small next to the move.
    assert!(g1 > 1e-3 * moved && g1 < 0.5 * moved, "gap {g1:e}, move {moved:e}");
    let ratio = g1 / g2;
    assert!(
        (3.6..4.4).contains(&ratio),
        "halving η divided the gap by {ratio} (expected ≈ 4)"
    );
}
