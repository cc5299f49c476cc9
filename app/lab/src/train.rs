//! Fine-tuning on candle autograd: SGD, SGD with momentum and AdamW, minibatch or full-batch,
//! a budget in steps or epochs, seeded shuffling and augmentation (so a run is a function of
//! its seed on the CPU), progress after every step and cancellation between steps.

use crate::nn::{Arch, Head, IMAGE_SIDE, Params, cross_entropy, labels_tensor};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// The update rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// θ ← θ − lr·(g + wd·θ).
    Sgd,
    /// PyTorch's heavy ball: b ← μ·b + g + wd·θ; θ ← θ − lr·b.
    Momentum,
    /// Adam with decoupled weight decay: θ ← θ·(1 − lr·wd) − lr·m̂/(√v̂ + ε).
    AdamW,
}

impl OptimizerKind {
    /// Parses `sgd`, `momentum`, `adamw`.
    pub fn parse(s: &str) -> Option<OptimizerKind> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Some(OptimizerKind::Sgd),
            "momentum" | "sgd-momentum" => Some(OptimizerKind::Momentum),
            "adamw" | "adam" => Some(OptimizerKind::AdamW),
            _ => None,
        }
    }
}

/// Optimiser settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    /// Update rule.
    pub kind: OptimizerKind,
    /// Learning rate.
    pub lr: f64,
    /// Weight decay (L2 for SGD and momentum, decoupled for AdamW).
    pub weight_decay: f64,
    /// Momentum μ (momentum only).
    pub momentum: f64,
    /// Adam's β₁, β₂.
    pub betas: (f64, f64),
    /// Adam's ε.
    pub eps: f64,
}

impl OptimConfig {
    /// Plain SGD with learning rate `lr` and no weight decay.
    pub fn sgd(lr: f64) -> OptimConfig {
        OptimConfig {
            kind: OptimizerKind::Sgd,
            lr,
            weight_decay: 0.0,
            momentum: 0.0,
            betas: (0.9, 0.999),
            eps: 1e-8,
        }
    }

    /// SGD with momentum 0.9.
    pub fn momentum(lr: f64) -> OptimConfig {
        OptimConfig {
            kind: OptimizerKind::Momentum,
            momentum: 0.9,
            ..OptimConfig::sgd(lr)
        }
    }

    /// AdamW with β = (0.9, 0.999), ε = 1e-8.
    pub fn adamw(lr: f64, weight_decay: f64) -> OptimConfig {
        OptimConfig {
            kind: OptimizerKind::AdamW,
            weight_decay,
            ..OptimConfig::sgd(lr)
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(EngineError::Param(format!("optimizer: {what}")));
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(&format!("learning rate {} must be a positive number", self.lr));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(&format!("weight decay {} must be ≥ 0", self.weight_decay));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return bad(&format!("momentum {} must be in [0, 1)", self.momentum));
        }
        Ok(())
    }
}

/// Optimiser state over a list of variables.
pub struct Optimizer {
    cfg: OptimConfig,
    vars: Vec<Var>,
    /// Momentum buffers, or Adam's first moments.
    first: Vec<Option<Tensor>>,
    /// Adam's second moments.
    second: Vec<Option<Tensor>>,
    step: i32,
}

impl Optimizer {
    /// An optimiser updating `vars`.
    pub fn new(cfg: OptimConfig, vars: Vec<Var>) -> Result<Optimizer> {
        cfg.validate()?;
        let n = vars.len();
        Ok(Optimizer {
            cfg,
            vars,
            first: vec![None; n],
            second: vec![None; n],
            step: 0,
        })
    }

    /// Sets the learning rate of the next steps (for a schedule such as a warm-up).
    pub fn set_lr(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }

    /// One update from the gradients of the last backward pass (variables without a gradient
    /// are left alone).
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step += 1;
        let c = self.cfg;
        for (i, var) in self.vars.iter().enumerate() {
            let Some(g) = grads.get(var) else { continue };
            let theta = var.as_tensor();
            let next = match c.kind {
                OptimizerKind::Sgd => {
                    let g = with_l2(g, theta, c.weight_decay)?;
                    (theta - (g * c.lr)?)?
                }
                OptimizerKind::Momentum => {
                    let g = with_l2(g, theta, c.weight_decay)?;
                    let b = match &self.first[i] {
                        Some(b) => ((b * c.momentum)? + g)?,
                        None => g,
                    };
                    let next = (theta - (&b * c.lr)?)?;
                    self.first[i] = Some(b);
                    next
                }
                OptimizerKind::AdamW => {
                    let (b1, b2) = c.betas;
                    let m = match &self.first[i] {
                        Some(m) => ((m * b1)? + (g * (1.0 - b1))?)?,
                        None => (g * (1.0 - b1))?,
                    };
                    let v = match &self.second[i] {
                        Some(v) => ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?,
                        None => (g.sqr()? * (1.0 - b2))?,
                    };
                    let m_hat = (&m / (1.0 - b1.powi(self.step)))?;
                    let v_hat = (&v / (1.0 - b2.powi(self.step)))?;
                    let update = (m_hat / (v_hat.sqrt()? + c.eps)?)?;
                    let decayed = (theta * (1.0 - c.lr * c.weight_decay))?;
                    self.first[i] = Some(m);
                    self.second[i] = Some(v);
                    (decayed - (update * c.lr)?)?
                }
            };
            var.set(&next)?;
        }
        Ok(())
    }
}

fn with_l2(g: &Tensor, theta: &Tensor, wd: f64) -> Result<Tensor> {
    Ok(if wd > 0.0 { (g + (theta * wd)?)? } else { g.clone() })
}

/// Examples per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchSize {
    /// Every example of the task in every step (full-batch gradient descent; no shuffling).
    Full,
    /// Shuffled minibatches of this size, reshuffled every epoch (the last one may be short).
    Size(usize),
}

/// How long to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Budget {
    /// This many optimiser steps.
    Steps(usize),
    /// This many passes over the (largest) task's examples.
    Epochs(usize),
}

/// A training run's settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimiser.
    pub optim: OptimConfig,
    /// Batch size.
    pub batch: BatchSize,
    /// Steps or epochs.
    pub budget: Budget,
    /// Seed of shuffling and augmentation.
    pub seed: u64,
    /// Random translation of each training image by up to this many pixels (0: none).
    pub augment_shift: usize,
}

/// Progress of a training run, after each step.
#[derive(Clone, Debug)]
pub struct TrainProgress {
    /// Steps done.
    pub step: usize,
    /// Steps in the run.
    pub steps: usize,
    /// Loss of the step just taken (before its update).
    pub loss: f32,
}

/// Labelled examples: `images` `[n, 28, 28]` bytes and `labels` `[n]`.
#[derive(Clone, Copy, Debug)]
pub struct Examples<'a> {
    /// Images, row-major.
    pub images: &'a [u8],
    /// Labels.
    pub labels: &'a [u8],
}

impl Examples<'_> {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// One task of a (multi-task) fine-tuning run: its examples and its frozen head.
#[derive(Clone, Copy, Debug)]
pub struct TrainTask<'a> {
    /// Training examples.
    pub data: Examples<'a>,
    /// The task's head (not trained).
    pub head: &'a Head,
}

/// Draws the example indices of each step: all in order (full batch), or shuffled
/// minibatches with a fresh permutation per epoch.
pub struct Batcher {
    n: usize,
    batch: BatchSize,
    order: Vec<usize>,
    pos: usize,
    rng: SplitMix64,
}

impl Batcher {
    /// A batcher over `n` examples; `stream` separates the batchers of one run.
    pub fn new(n: usize, batch: BatchSize, seed: u64, stream: u64) -> Batcher {
        Batcher {
            n,
            batch,
            order: (0..n).collect(),
            pos: n,
            rng: SplitMix64::stream(seed, stream),
        }
    }

    /// Steps in one epoch.
    pub fn steps_per_epoch(&self) -> usize {
        steps_per_epoch(self.n, self.batch)
    }

    /// Indices of the next step's examples.
    pub fn next_batch(&mut self) -> Vec<usize> {
        match self.batch {
            BatchSize::Full => (0..self.n).collect(),
            BatchSize::Size(b) => {
                if self.pos >= self.n {
                    self.rng.shuffle(&mut self.order);
                    self.pos = 0;
                }
                let end = (self.pos + b.max(1)).min(self.n);
                let out = self.order[self.pos..end].to_vec();
                self.pos = end;
                out
            }
        }
    }

    /// The generator, for augmentation draws that follow the batch order.
    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }
}

/// Batch `step` (0-based) of a [`Batcher`] over `n` examples with batches of `size`, `seed` and
/// `stream`: the same indices in the same order, computed from the step alone (the epoch's
/// shuffles are replayed; each costs O(n)), so a caller that holds no batcher (a session call)
/// can ask for any step.
pub fn batch_at(n: usize, size: usize, seed: u64, stream: u64, step: u64) -> Vec<usize> {
    let size = size.max(1);
    let per_epoch = steps_per_epoch(n, BatchSize::Size(size)).max(1) as u64;
    let mut rng = SplitMix64::stream(seed, stream);
    let mut order: Vec<usize> = (0..n).collect();
    for _ in 0..=step / per_epoch {
        rng.shuffle(&mut order);
    }
    let start = ((step % per_epoch) as usize * size).min(n);
    order[start..(start + size).min(n)].to_vec()
}

/// Images `idx` of `images` as a `[b, 1, 28, 28]` tensor in 0..1, each translated by a random
/// offset of up to `shift` pixels (zero fill) when `shift` > 0.
pub fn batch_images(
    images: &[u8],
    idx: &[usize],
    shift: usize,
    rng: &mut SplitMix64,
    device: &Device,
) -> Result<Tensor> {
    let side = IMAGE_SIDE;
    let per = side * side;
    let mut out = vec![0f32; idx.len() * per];
    let span = 2 * shift + 1;
    for (slot, &i) in idx.iter().enumerate() {
        let src = &images[i * per..(i + 1) * per];
        let dst = &mut out[slot * per..(slot + 1) * per];
        let (dy, dx) = if shift > 0 {
            (
                rng.below(span) as isize - shift as isize,
                rng.below(span) as isize - shift as isize,
            )
        } else {
            (0, 0)
        };
        for y in 0..side {
            let sy = y as isize - dy;
            if !(0..side as isize).contains(&sy) {
                continue;
            }
            for x in 0..side {
                let sx = x as isize - dx;
                if (0..side as isize).contains(&sx) {
                    dst[y * side + x] = f32::from(src[sy as usize * side + sx as usize]) / 255.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(out, (idx.len(), 1, side, side), device)?)
}

/// Steps in one epoch over `n` examples (the last minibatch may be short).
pub fn steps_per_epoch(n: usize, batch: BatchSize) -> usize {
    match batch {
        BatchSize::Full => 1,
        BatchSize::Size(b) => n.div_ceil(b.max(1)),
    }
}

/// Steps a budget amounts to, given the steps per epoch.
pub fn total_steps(budget: Budget, steps_per_epoch: usize) -> usize {
    match budget {
        Budget::Steps(s) => s,
        Budget::Epochs(e) => e * steps_per_epoch,
    }
}

/// Runs `steps` optimiser steps on `vars`, with `loss(step)` building each step's loss.
/// Checks `cancel` between steps and reports progress after each.
pub fn optimize(
    vars: Vec<Var>,
    optim: OptimConfig,
    steps: usize,
    loss: &mut dyn FnMut(usize) -> Result<Tensor>,
    on_step: &mut dyn FnMut(&TrainProgress),
    cancel: &AtomicBool,
) -> Result<Vec<f32>> {
    let mut opt = Optimizer::new(optim, vars)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let l = loss(step)?;
        let value = l.to_scalar::<f32>()?;
        if !value.is_finite() {
            return Err(EngineError::Diverged {
                step: step + 1,
                loss: value,
                lr: optim.lr,
            });
        }
        let grads = l.backward()?;
        opt.step(&grads)?;
        losses.push(value);
        on_step(&TrainProgress {
            step: step + 1,
            steps,
            loss: value,
        });
    }
    Ok(losses)
}

/// Variables initialised from `params` (copies: `params` is not modified).
pub fn to_vars(params: &Params) -> Result<Vec<(String, Var)>> {
    params
        .iter()
        .map(|(k, t)| Ok((k.clone(), Var::from_tensor(&t.copy()?)?)))
        .collect()
}

/// The variables as tensors that record operations for backpropagation (for a loss).
pub fn from_vars(vars: &[(String, Var)]) -> Params {
    vars.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect()
}

/// Current values of variables, detached from autograd (what a finished run returns: computing
/// with them must not build graphs back into the training variables).
pub fn detached(vars: &[(String, Var)]) -> Params {
    vars.iter().map(|(k, v)| (k.clone(), v.as_tensor().detach())).collect()
}

/// Result of a fine-tuning run.
#[derive(Clone, Debug)]
pub struct Finetuned {
    /// The trained backbone.
    pub backbone: Params,
    /// Loss of every step.
    pub losses: Vec<f32>,
}

/// Fine-tunes a backbone of `arch`, starting at `start`, on the summed mean cross-entropy of
/// `tasks` (each through its frozen head). With one task this is ordinary fine-tuning; with
/// several it is multi-task training on Σₜ L̄ₜ. Epochs count passes over the largest task.
pub fn fine_tune(
    arch: Arch,
    start: &Params,
    tasks: &[TrainTask<'_>],
    cfg: &TrainConfig,
    device: &Device,
    on_step: &mut dyn FnMut(&TrainProgress),
    cancel: &AtomicBool,
) -> Result<Finetuned> {
    fine_tune_with_snapshots(
        arch,
        start,
        tasks,
        cfg,
        device,
        &[],
        &mut |_, _| Ok(()),
        on_step,
        cancel,
    )
}

/// [`fine_tune`], handing `on_snapshot(k, backbone)` a copy of the backbone after each step
/// count `k` of `at` (the paper's protocol: the intermediate checkpoints of one run serve the
/// smaller step counts; a snapshot equals a run of exactly `k` steps).
#[allow(clippy::too_many_arguments)]
pub fn fine_tune_with_snapshots(
    arch: Arch,
    start: &Params,
    tasks: &[TrainTask<'_>],
    cfg: &TrainConfig,
    device: &Device,
    at: &[usize],
    on_snapshot: &mut dyn FnMut(usize, Params) -> Result<()>,
    on_step: &mut dyn FnMut(&TrainProgress),
    cancel: &AtomicBool,
) -> Result<Finetuned> {
    arch.check(start)?;
    if let Some((i, _)) = tasks.iter().enumerate().find(|(_, t)| t.data.is_empty()) {
        return Err(EngineError::Invalid(format!("training task {i} has no examples")));
    }
    if let BatchSize::Size(0) = cfg.batch {
        return Err(EngineError::Param("batch size must be at least 1".into()));
    }
    let vars = to_vars(start)?;
    let mut batchers: Vec<Batcher> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| Batcher::new(t.data.len(), cfg.batch, cfg.seed, i as u64))
        .collect();
    let labels: Vec<Tensor> = tasks
        .iter()
        .map(|t| labels_tensor(t.data.labels, device))
        .collect::<Result<_>>()?;
    // Full batch without augmentation: the images never change, so convert them once.
    let fixed: Option<Vec<Tensor>> = if cfg.batch == BatchSize::Full && cfg.augment_shift == 0 {
        Some(
            tasks
                .iter()
                .map(|t| crate::nn::images_tensor(t.data.images, device))
                .collect::<Result<_>>()?,
        )
    } else {
        None
    };
    let per_epoch = batchers.iter().map(Batcher::steps_per_epoch).max().unwrap_or(1);
    let steps = total_steps(cfg.budget, per_epoch);
    let mut loss = |step: usize| -> Result<Tensor> {
        if step > 0 && at.contains(&step) {
            // The variables are updated in place: the snapshot must own its storage.
            let copy = vars
                .iter()
                .map(|(k, v)| Ok((k.clone(), v.as_tensor().detach().copy()?)))
                .collect::<Result<Params>>()?;
            on_snapshot(step, copy)?;
        }
        let p = from_vars(&vars);
        let mut total: Option<Tensor> = None;
        for (i, t) in tasks.iter().enumerate() {
            let (x, y) = match &fixed {
                Some(x) => (x[i].clone(), labels[i].clone()),
                None => {
                    let b = &mut batchers[i];
                    let idx = b.next_batch();
                    let x = batch_images(t.data.images, &idx, cfg.augment_shift, b.rng(), device)?;
                    let ids = Tensor::from_vec(idx.iter().map(|&j| j as u32).collect::<Vec<_>>(), idx.len(), device)?;
                    (x, labels[i].index_select(&ids, 0)?)
                }
            };
            let logits = t.head.logits(&arch.features(&p, &x)?)?;
            let l = cross_entropy(&logits, &y)?;
            total = Some(match total {
                Some(s) => (s + l)?,
                None => l,
            });
        }
        total.ok_or_else(|| EngineError::Invalid("fine-tuning needs at least one task".into()))
    };
    let var_list: Vec<Var> = vars.iter().map(|(_, v)| v.clone()).collect();
    let losses = optimize(var_list, cfg.optim, steps, &mut loss, on_step, cancel)?;
    let backbone = detached(&vars);
    if at.contains(&steps) {
        on_snapshot(steps, backbone.clone())?;
    }
    Ok(Finetuned { backbone, losses })
}

/// Checkpoint metadata describing a fine-tuning run of `steps` steps on `examples` examples:
/// the step count is what effective task weights (seed 002, Algorithm 002-B) are computed from.
pub fn train_metadata(cfg: &TrainConfig, steps: usize, examples: usize) -> BTreeMap<String, String> {
    let optimizer = match cfg.optim.kind {
        OptimizerKind::Sgd => "sgd",
        OptimizerKind::Momentum => "momentum",
        OptimizerKind::AdamW => "adamw",
    };
    let batch = match cfg.batch {
        BatchSize::Full => "full".to_owned(),
        BatchSize::Size(b) => b.to_string(),
    };
    [
        (STEPS_KEY, steps.to_string()),
        ("mergescope.train.lr", cfg.optim.lr.to_string()),
        ("mergescope.train.batch", batch),
        ("mergescope.train.optimizer", optimizer.to_owned()),
        ("mergescope.train.examples", examples.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Metadata key of a fine-tuned checkpoint's step count.
pub const STEPS_KEY: &str = "mergescope.train.steps";

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of each rule on L(θ) = θ² from θ = 1 (g = 2θ), computed by hand.
    fn run(cfg: OptimConfig, steps: usize) -> f32 {
        let v = Var::new(&[1f32], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(cfg, vec![v.clone()]).unwrap();
        for _ in 0..steps {
            let g = v.as_tensor().sqr().unwrap().sum_all().unwrap().backward().unwrap();
            opt.step(&g).unwrap();
        }
        v.as_tensor().to_vec1::<f32>().unwrap()[0]
    }

    #[test]
    fn optimizers_match_hand_computed_steps() {
        // SGD: 1 − 0.1·2 = 0.8.
        assert!((run(OptimConfig::sgd(0.1), 1) - 0.8).abs() < 1e-6);
        // L2 decay 0.5 adds 0.5θ to g: 1 − 0.1·2.5 = 0.75.
        let wd = OptimConfig {
            weight_decay: 0.5,
            ..OptimConfig::sgd(0.1)
        };
        assert!((run(wd, 1) - 0.75).abs() < 1e-6);
        // Momentum 0.9: b₁ = 2, θ₁ = 0.8; g₂ = 1.6, b₂ = 3.4, θ₂ = 0.8 − 0.34 = 0.46.
        assert!((run(OptimConfig::momentum(0.1), 2) - 0.46).abs() < 1e-6);
        // AdamW: m̂ = 2, v̂ = 4, update 1; θ = 1·(1 − 0.1·0.1) − 0.1 = 0.89.
        assert!((run(OptimConfig::adamw(0.1, 0.1), 1) - 0.89).abs() < 1e-6);
        // Step 2 from θ = 0.89, g = 1.78: m = 0.9·0.2 + 0.178 = 0.358, v = 0.999·0.004 + 0.001·3.1684;
        // m̂ = m/0.19, v̂ = v/0.001999.
        let (m, v) = (0.358f64, 0.999 * 0.004 + 0.001 * 1.78f64.powi(2));
        let update = (m / 0.19) / ((v / (1.0 - 0.999f64.powi(2))).sqrt() + 1e-8);
        let expected = 0.89 * (1.0 - 0.01) - 0.1 * update;
        assert!((f64::from(run(OptimConfig::adamw(0.1, 0.1), 2)) - expected).abs() < 1e-6);
    }

    #[test]
    fn bad_settings_are_refused_with_the_value() {
        let e = Optimizer::new(OptimConfig::sgd(-1.0), vec![])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("learning rate -1"), "{e}");
    }

    #[test]
    fn batcher_covers_every_example_once_per_epoch_and_depends_on_the_seed() {
        let mut b = Batcher::new(10, BatchSize::Size(4), 3, 0);
        assert_eq!(b.steps_per_epoch(), 3);
        let mut epoch: Vec<usize> = (0..3).flat_map(|_| b.next_batch()).collect();
        let first = epoch.clone();
        epoch.sort_unstable();
        assert_eq!(epoch, (0..10).collect::<Vec<_>>());
        let mut other = Batcher::new(10, BatchSize::Size(4), 4, 0);
        let other: Vec<usize> = (0..3).flat_map(|_| other.next_batch()).collect();
        assert_ne!(first, other);
        assert_eq!(Batcher::new(5, BatchSize::Full, 0, 0).next_batch(), vec![0, 1, 2, 3, 4]);
    }

    /// The stateless batch of a step is the batcher's, across epochs and short last batches.
    #[test]
    fn batch_at_replays_the_batcher() {
        for (n, size, seed, stream) in [
            (10, 4, 3, 0),
            (10, 4, 3, 2),
            (7, 7, 1, 5),
            (5, 9, 2, 1),
            (100, 16, 0, 4),
        ] {
            let mut b = Batcher::new(n, BatchSize::Size(size), seed, stream);
            for step in 0..40 {
                assert_eq!(
                    batch_at(n, size, seed, stream, step),
                    b.next_batch(),
                    "n {n}, size {size}, step {step}"
                );
            }
        }
    }

    #[test]
    fn shifted_images_move_by_whole_pixels() {
        let mut img = vec![0u8; 28 * 28];
        img[10 * 28 + 10] = 255;
        let mut rng = SplitMix64::new(1);
        let x = batch_images(&img, &[0], 2, &mut rng, &Device::Cpu).unwrap();
        let v = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let hot: Vec<usize> = (0..v.len()).filter(|&i| v[i] > 0.0).collect();
        assert_eq!(hot.len(), 1);
        let (y, x) = (hot[0] / 28, hot[0] % 28);
        assert!((8..=12).contains(&y) && (8..=12).contains(&x));
    }

    /// Demo task 4 with a fresh 10-class head, and the MLP base the fine-tuning tests start
    /// from.
    struct Fixture {
        tasks: Vec<crate::data::TaskData>,
        head: Head,
        base: Params,
    }

    impl Fixture {
        fn new(dev: &Device) -> Fixture {
            Fixture {
                tasks: crate::data::demo_tasks().unwrap(),
                head: Head::init(128, 10, 1, dev).unwrap(),
                base: Arch::Mlp.init(0, dev).unwrap(),
            }
        }

        /// The task's first `n` training examples through the head.
        fn task(&self, n: usize) -> TrainTask<'_> {
            let t = &self.tasks[4];
            TrainTask {
                data: Examples {
                    images: &t.train.images[..n * 784],
                    labels: &t.train.labels[..n],
                },
                head: &self.head,
            }
        }
    }

    /// AdamW (lr 1e-3) on shuffled, shifted minibatches of 32 for `budget`.
    fn minibatch_config(budget: Budget, seed: u64) -> TrainConfig {
        TrainConfig {
            optim: OptimConfig::adamw(1e-3, 0.0),
            batch: BatchSize::Size(32),
            budget,
            seed,
            augment_shift: 1,
        }
    }

    /// The intermediate checkpoint after k steps of a longer run is the model a run of exactly
    /// k steps ends at (so one run serves every smaller step count of a sweep).
    #[test]
    fn snapshots_equal_shorter_runs() {
        let dev = Device::Cpu;
        let fixture = Fixture::new(&dev);
        let (task, base) = (fixture.task(128), &fixture.base);
        let cfg = |steps| minibatch_config(Budget::Steps(steps), 3);
        let no = AtomicBool::new(false);
        let mut snaps = BTreeMap::new();
        let long = fine_tune_with_snapshots(
            Arch::Mlp,
            base,
            &[task],
            &cfg(9),
            &dev,
            &[3, 9],
            &mut |k, p| {
                snaps.insert(k, crate::nn::to_host(&p)?);
                Ok(())
            },
            &mut |_| {},
            &no,
        )
        .unwrap();
        assert_eq!(snaps.keys().copied().collect::<Vec<_>>(), [3, 9]);
        let short = fine_tune(Arch::Mlp, base, &[task], &cfg(3), &dev, &mut |_| {}, &no).unwrap();
        assert_eq!(snaps[&3], crate::nn::to_host(&short.backbone).unwrap());
        assert_eq!(snaps[&9], crate::nn::to_host(&long.backbone).unwrap());
        assert_ne!(snaps[&3], snaps[&9], "the snapshot owns its storage");
    }

    #[test]
    fn fine_tuning_is_a_function_of_the_seed_and_cancellable() {
        let dev = Device::Cpu;
        let fixture = Fixture::new(&dev);
        let (task, base) = (fixture.task(256), &fixture.base);
        let cfg = |seed| minibatch_config(Budget::Epochs(2), seed);
        let go = |seed| {
            fine_tune(
                Arch::Mlp,
                base,
                &[task],
                &cfg(seed),
                &dev,
                &mut |_| {},
                &AtomicBool::new(false),
            )
            .unwrap()
        };
        let (a, b, c) = (go(5), go(5), go(6));
        assert_eq!(a.losses.len(), 16);
        assert_eq!(a.losses, b.losses);
        assert_eq!(
            crate::nn::to_host(&a.backbone).unwrap(),
            crate::nn::to_host(&b.backbone).unwrap()
        );
        assert_ne!(a.losses, c.losses);
        assert!(a.losses[15] < a.losses[0], "{:?}", a.losses);
        // The start point is not modified.
        assert_eq!(
            crate::nn::to_host(base).unwrap(),
            crate::nn::to_host(&Arch::Mlp.init(0, &dev).unwrap()).unwrap()
        );
        let cancel = AtomicBool::new(true);
        let e = fine_tune(Arch::Mlp, base, &[task], &cfg(5), &dev, &mut |_| {}, &cancel).unwrap_err();
        assert!(matches!(e, EngineError::Cancelled));
    }
}
