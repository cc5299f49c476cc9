//! The differentiable side of evaluation that data-driven merge methods (AdaMerging,
//! Frank-Wolfe, MIMA, Fisher) drive through a model-level session: loss, accuracy, gradients,
//! diagonal Fisher and fine-tuning of whole candidate models on each task's calibration (or
//! train) data. [`CalibrationTasks`] is what a model family implements; [`DemoCalibration`]
//! is the demo benchmark's (a backbone of a demo architecture with each task's frozen head).

use crate::data::{SplitKind, TaskData};
use crate::nn::{Arch, Head, Params, images_tensor, labels_tensor};
use crate::train::{self, Examples, TrainConfig, TrainTask};
use candle_core::backprop::GradStore;
use candle_core::{D, Device, Tensor, Var};
use mergescope_engine::error::{EngineError, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// What a session minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    /// Mean cross-entropy against the calibration labels.
    CrossEntropy,
    /// Mean entropy of the predicted distribution (uses no labels; AdaMerging's objective).
    Entropy,
}

/// Which of each task's calibration examples an objective is computed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subset {
    /// Every calibration example.
    All,
    /// Batch `step` of `size` examples per task, drawn as a [`train::Batcher`] seeded with
    /// `seed` and the task's index draws them ([`train::batch_at`]); every example when `size`
    /// is at least the task's count.
    Minibatch {
        /// Examples per task.
        size: usize,
        /// Seed of the shuffles.
        seed: u64,
        /// Batch number.
        step: u64,
    },
}

impl Subset {
    /// Indices of task `task`'s examples out of its `n`, in the order used.
    pub fn indices(self, n: usize, task: usize) -> Vec<usize> {
        match self {
            Subset::Minibatch { size, seed, step } if size < n => train::batch_at(n, size, seed, task as u64, step),
            _ => (0..n).collect(),
        }
    }
}

/// Loss and accuracy of a candidate, averaged over the tasks asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CalibrationScore {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
    /// Examples evaluated in all.
    pub examples: u64,
}

impl CalibrationScore {
    /// The mean over `tasks` of each task's score, as `task` computes it in turn (its mean loss,
    /// its accuracy); the examples add up. No task scores loss and accuracy 0.
    pub(crate) fn mean_over(
        tasks: &[usize],
        mut task: impl FnMut(usize) -> Result<CalibrationScore>,
    ) -> Result<CalibrationScore> {
        let (mut loss, mut accuracy, mut examples) = (0.0, 0.0, 0u64);
        for &t in tasks {
            let s = task(t)?;
            loss += s.loss;
            accuracy += s.accuracy;
            examples += s.examples;
        }
        let n = tasks.len().max(1) as f64;
        Ok(CalibrationScore {
            loss: loss / n,
            accuracy: accuracy / n,
            examples,
        })
    }
}

/// A model family's tasks as a data-driven method sees them. Task `t` belongs to expert `t`;
/// models are tensors by name, on the session's device.
pub trait CalibrationTasks {
    /// Task names, in expert order.
    fn task_names(&self) -> Vec<&str>;
    /// Mean loss and accuracy of `model` over `tasks`' calibration examples.
    fn evaluate(&self, model: &Params, tasks: &[usize]) -> Result<CalibrationScore>;
    /// Σ over `tasks` of the mean `objective` over `subset` of each task's calibration examples
    /// and, with `with_grads`, its gradient for every tensor named in `order` (in that order).
    fn objective(
        &self,
        model: &Params,
        order: &[String],
        tasks: &[usize],
        subset: Subset,
        objective: Objective,
        with_grads: bool,
    ) -> Result<(f64, Option<Vec<Tensor>>)>;
    /// Mean over task `task`'s calibration examples of the squared gradient of log p(y | x)
    /// for every tensor named in `order`; y is the true label, or the model's argmax when
    /// `predicted`.
    fn diag_fisher(
        &self,
        model: &Params,
        order: &[String],
        task: usize,
        predicted: bool,
        cancel: &AtomicBool,
    ) -> Result<Vec<Tensor>>;
    /// `start` fine-tuned on the train split of `task`.
    fn finetune(
        &self,
        start: &Params,
        task: usize,
        config: &TrainConfig,
        device: &Device,
        cancel: &AtomicBool,
    ) -> Result<Params>;
}

/// One task of the demo benchmark: its data (calibration examples are the first of its train
/// split) and its frozen head.
pub struct CalibrationTask<'a> {
    /// The task's data.
    pub data: &'a TaskData,
    /// Its frozen head.
    pub head: Head,
}

struct Split {
    images: Tensor,
    labels: Tensor,
}

/// The demo benchmark's calibration tasks, with their examples on the session's device.
pub struct DemoCalibration<'a> {
    arch: Arch,
    tasks: Vec<CalibrationTask<'a>>,
    calibration: Vec<Split>,
}

impl<'a> DemoCalibration<'a> {
    /// `tasks` for `arch` backbones, their calibration examples moved to `device` once.
    pub fn new(arch: Arch, tasks: Vec<CalibrationTask<'a>>, device: &Device) -> Result<DemoCalibration<'a>> {
        let calibration = tasks
            .iter()
            .map(|t| {
                let s = t.data.split(SplitKind::Calibration);
                Ok(Split {
                    images: images_tensor(&s.images, device)?,
                    labels: labels_tensor(&s.labels, device)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(DemoCalibration {
            arch,
            tasks,
            calibration,
        })
    }

    /// Logits of task `t`'s calibration `images` under `model`.
    fn logits(&self, model: &Params, t: usize, images: &Tensor) -> Result<Tensor> {
        let features = self.arch.features(model, images)?;
        self.tasks[t].head.logits(&features)
    }
}

/// `model` with every tensor detached from the autograd graph (scoring records no gradients).
pub(crate) fn detached(model: &Params) -> Params {
    model.iter().map(|(k, t)| (k.clone(), t.detach())).collect()
}

/// A zero tensor shaped like each of `vars`: the sums their gradients are added to.
pub(crate) fn zero_grads(vars: &[Var]) -> Result<Vec<Tensor>> {
    Ok(vars
        .iter()
        .map(|v| v.as_tensor().zeros_like())
        .collect::<candle_core::Result<_>>()?)
}

/// One fresh autograd variable per tensor named in `order`, and the model that reads them.
pub(crate) fn variables(model: &Params, order: &[String]) -> Result<(Vec<Var>, Params)> {
    let vars: Vec<Var> = order
        .iter()
        .map(|k| {
            let t = model
                .get(k)
                .ok_or_else(|| EngineError::Evaluator(format!("the candidate has no tensor '{k}'")))?;
            Ok(Var::from_tensor(&t.detach())?)
        })
        .collect::<Result<_>>()?;
    let p = order
        .iter()
        .zip(&vars)
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    Ok((vars, p))
}

/// The mean `objective` of `logits` `[n, classes]` (cross-entropy against `labels` `[n]`, or the
/// entropy of the predictions), differentiable.
pub(crate) fn objective_loss(logits: &Tensor, labels: &Tensor, objective: Objective) -> Result<Tensor> {
    Ok(match objective {
        Objective::CrossEntropy => candle_nn::loss::cross_entropy(logits, labels)?,
        Objective::Entropy => {
            let log_p = candle_nn::ops::log_softmax(logits, D::Minus1)?;
            (log_p.exp()? * &log_p)?.sum(D::Minus1)?.mean_all()?.neg()?
        }
    })
}

/// Adds the gradients in `store` of each of `vars` to `sums` (a variable without one adds 0).
pub(crate) fn add_grads(sums: &mut [Tensor], store: &GradStore, vars: &[Var]) -> Result<()> {
    for (sum, v) in sums.iter_mut().zip(vars) {
        if let Some(g) = store.get(v.as_tensor()) {
            *sum = (&*sum + g)?;
        }
    }
    Ok(())
}

/// Mean over `n` examples of the squared gradient of log p(y | x) for each of `vars`, where
/// `example(i)` gives example i's logits `[1, classes]` and label `[1]`; y is the label, or the
/// model's argmax when `predicted`.
pub(crate) fn fisher_of(
    vars: &[Var],
    n: usize,
    predicted: bool,
    cancel: &AtomicBool,
    mut example: impl FnMut(usize) -> Result<(Tensor, Tensor)>,
) -> Result<Vec<Tensor>> {
    let mut sums = zero_grads(vars)?;
    for i in 0..n {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let (logits, label) = example(i)?;
        let log_p = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let y = if predicted {
            log_p.argmax_keepdim(D::Minus1)?
        } else {
            label.unsqueeze(1)?
        };
        let store = log_p.gather(&y, D::Minus1)?.sum_all()?.backward()?;
        for (sum, v) in sums.iter_mut().zip(vars) {
            if let Some(g) = store.get(v.as_tensor()) {
                *sum = (&*sum + g.sqr()?)?;
            }
        }
    }
    let scale = 1.0 / n.max(1) as f64;
    Ok(sums
        .into_iter()
        .map(|s| s.affine(scale, 0.0))
        .collect::<candle_core::Result<_>>()?)
}

impl CalibrationTasks for DemoCalibration<'_> {
    fn task_names(&self) -> Vec<&str> {
        self.tasks.iter().map(|t| t.data.name.as_str()).collect()
    }

    fn evaluate(&self, model: &Params, tasks: &[usize]) -> Result<CalibrationScore> {
        let model = detached(model);
        CalibrationScore::mean_over(tasks, |t| {
            let c = &self.calibration[t];
            let (correct, loss_sum, n) = super::score(self.arch, &model, &self.tasks[t].head, &c.images, &c.labels)?;
            Ok(CalibrationScore {
                loss: loss_sum / n as f64,
                accuracy: correct as f64 / n as f64,
                examples: n as u64,
            })
        })
    }

    fn objective(
        &self,
        model: &Params,
        order: &[String],
        tasks: &[usize],
        subset: Subset,
        objective: Objective,
        with_grads: bool,
    ) -> Result<(f64, Option<Vec<Tensor>>)> {
        let (vars, p) = variables(model, order)?;
        let mut total: Option<Tensor> = None;
        for &t in tasks {
            let c = &self.calibration[t];
            let n = c.labels.dim(0)?;
            let picked: Vec<u32> = subset.indices(n, t).into_iter().map(|i| i as u32).collect();
            // Every example (in order) needs no gather.
            let (images, labels) = if picked.len() == n {
                (c.images.clone(), c.labels.clone())
            } else {
                let idx = Tensor::from_slice(&picked, picked.len(), c.labels.device())?;
                (c.images.index_select(&idx, 0)?, c.labels.index_select(&idx, 0)?)
            };
            let l = objective_loss(&self.logits(&p, t, &images)?, &labels, objective)?;
            total = Some(match total {
                Some(s) => (s + l)?,
                None => l,
            });
        }
        let Some(total) = total else {
            return Ok((0.0, None));
        };
        let value = f64::from(total.to_scalar::<f32>()?);
        if !with_grads {
            return Ok((value, None));
        }
        let mut grads = zero_grads(&vars)?;
        add_grads(&mut grads, &total.backward()?, &vars)?;
        Ok((value, Some(grads)))
    }

    fn diag_fisher(
        &self,
        model: &Params,
        order: &[String],
        task: usize,
        predicted: bool,
        cancel: &AtomicBool,
    ) -> Result<Vec<Tensor>> {
        let (vars, p) = variables(model, order)?;
        let c = &self.calibration[task];
        fisher_of(&vars, c.images.dim(0)?, predicted, cancel, |i| {
            let features = self.arch.features(&p, &c.images.narrow(0, i, 1)?)?;
            Ok((self.tasks[task].head.logits(&features)?, c.labels.narrow(0, i, 1)?))
        })
    }

    fn finetune(
        &self,
        start: &Params,
        task: usize,
        config: &TrainConfig,
        device: &Device,
        cancel: &AtomicBool,
    ) -> Result<Params> {
        let t = &self.tasks[task];
        let data = TrainTask {
            data: Examples {
                images: &t.data.train.images,
                labels: &t.data.train.labels,
            },
            head: &t.head,
        };
        let out = train::fine_tune(self.arch, start, &[data], config, device, &mut |_| {}, cancel)?;
        Ok(out.backbone)
    }
}
