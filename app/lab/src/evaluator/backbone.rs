//! The demo benchmark's evaluator: a backbone of a demo architecture with each task's frozen
//! head, scored in candle on the evaluator's device (accuracy, mean cross-entropy and accuracy
//! normalised by the task's expert), from a file or from tensors held in memory.

use super::{EvalReport, Evaluator, InMemoryEvaluator, TaskScore, evenly, summarise};
use crate::data::{SplitKind, TaskData};
use crate::nn::{Arch, Head, Params, images_tensor, labels_tensor, load_params};
use candle_core::{D, DType, Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Images per forward pass (bounds the memory of activations).
const CHUNK: usize = 1000;

#[derive(Clone)]
struct EvalSet {
    name: String,
    images: Tensor,
    labels: Tensor,
    head: Head,
    reference: Option<f64>,
}

/// Evaluates backbones of one architecture on a fixed set of tasks: the data is converted to
/// tensors once, so evaluating many candidate models (landscapes, AdaMerging) is cheap.
#[derive(Clone)]
pub struct BackboneEvaluator {
    arch: Arch,
    split: SplitKind,
    sets: Vec<EvalSet>,
    device: Device,
}

/// A task to evaluate: its data, its frozen head and, for normalisation, its expert's
/// accuracy on the same split.
pub struct EvalTask<'a> {
    /// The task.
    pub data: &'a TaskData,
    /// Its head.
    pub head: Head,
    /// Expert accuracy on the split, if known.
    pub reference: Option<f64>,
}

impl BackboneEvaluator {
    /// An evaluator of `arch` backbones on `split` of `tasks`.
    pub fn new(arch: Arch, split: SplitKind, tasks: Vec<EvalTask<'_>>, device: &Device) -> Result<BackboneEvaluator> {
        let sets = tasks
            .into_iter()
            .map(|t| {
                let s = t.data.split(split);
                if t.data.image_size != (crate::nn::IMAGE_SIDE, crate::nn::IMAGE_SIDE) {
                    return Err(EngineError::Evaluator(format!(
                        "task '{}' has {}×{} images; the demo architectures take 28×28",
                        t.data.name, t.data.image_size.0, t.data.image_size.1
                    )));
                }
                if t.head.classes() != t.data.classes.len() {
                    return Err(EngineError::Evaluator(format!(
                        "the head of task '{}' has {} outputs but the task has {} classes",
                        t.data.name,
                        t.head.classes(),
                        t.data.classes.len()
                    )));
                }
                Ok(EvalSet {
                    name: t.data.name.clone(),
                    images: images_tensor(&s.images, device)?,
                    labels: labels_tensor(&s.labels, device)?,
                    head: t.head,
                    reference: t.reference,
                })
            })
            .collect::<Result<_>>()?;
        Ok(BackboneEvaluator {
            arch,
            split,
            sets,
            device: device.clone(),
        })
    }

    /// The architecture evaluated.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The device the evaluation runs on (where its data lives).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Keeps at most `per_task` examples of each task, evenly spaced through the split (so
    /// every part of it is represented): cheaper evaluations for landscapes.
    pub fn subsample(mut self, per_task: usize) -> Result<BackboneEvaluator> {
        for s in &mut self.sets {
            let n = s.labels.dims1()?;
            if per_task == 0 || per_task >= n {
                continue;
            }
            let idx = evenly(&(0..n as u32).collect::<Vec<_>>(), per_task);
            let idx = Tensor::from_vec(idx, per_task, s.labels.device())?;
            s.images = s.images.index_select(&idx, 0)?;
            s.labels = s.labels.index_select(&idx, 0)?;
        }
        Ok(self)
    }

    /// Evaluates `backbone` on every task.
    pub fn evaluate(&self, backbone: &Params) -> Result<EvalReport> {
        self.evaluate_until(backbone, &AtomicBool::new(false))
    }

    /// [`BackboneEvaluator::evaluate`], stopping between tasks when `cancel` is set.
    fn evaluate_until(&self, backbone: &Params, cancel: &AtomicBool) -> Result<EvalReport> {
        self.arch.check(backbone)?;
        // Evaluation never backpropagates: do not record graphs through trainable tensors.
        let backbone: Params = backbone.iter().map(|(k, t)| (k.clone(), t.detach())).collect();
        let backbone = &backbone;
        let tasks = self
            .sets
            .iter()
            .map(|s| {
                if cancel.load(Ordering::Relaxed) {
                    return Err(EngineError::Cancelled);
                }
                let (correct, loss_sum, n) = score(self.arch, backbone, &s.head, &s.images, &s.labels)?;
                let accuracy = correct as f64 / n as f64;
                Ok(TaskScore::classification(
                    s.name.clone(),
                    accuracy,
                    loss_sum / n as f64,
                    s.reference,
                    n,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(summarise(self.split, tasks))
    }
}

impl Evaluator for BackboneEvaluator {
    fn describe(&self) -> String {
        format!("{} backbones on {} tasks", self.arch, self.sets.len())
    }

    fn task_names(&self) -> Vec<String> {
        self.sets.iter().map(|s| s.name.clone()).collect()
    }

    /// Loads the checkpoint onto the evaluator's device; it must be a backbone of the
    /// evaluator's architecture (the error names the file and what does not match).
    fn evaluate_file(&self, path: &Path, cancel: &AtomicBool) -> Result<EvalReport> {
        let params = load_params(path, &self.device)?;
        self.arch.check(&params).map_err(|e| {
            EngineError::Evaluator(format!(
                "'{}' cannot be evaluated as a {} backbone: {e}",
                path.display(),
                self.arch
            ))
        })?;
        self.evaluate_until(&params, cancel)
    }

    fn in_memory(&self, _like: &Path, samples: usize) -> Result<Option<Box<dyn InMemoryEvaluator>>> {
        Ok(Some(Box::new(self.clone().subsample(samples)?)))
    }
}

impl InMemoryEvaluator for BackboneEvaluator {
    fn evaluate(&self, model: &Params) -> Result<EvalReport> {
        BackboneEvaluator::evaluate(self, model)
    }
}

/// (correct predictions, summed cross-entropy, examples) of one task.
pub(crate) fn score(
    arch: Arch,
    backbone: &Params,
    head: &Head,
    images: &Tensor,
    labels: &Tensor,
) -> Result<(usize, f64, usize)> {
    let n = labels.dims()[0];
    let (mut correct, mut loss_sum) = (0usize, 0f64);
    let mut from = 0;
    while from < n {
        let len = CHUNK.min(n - from);
        let x = images.narrow(0, from, len)?;
        let y = labels.narrow(0, from, len)?;
        let logits = head.logits(&arch.features(backbone, &x)?)?;
        let (c, nll) = score_logits(&logits, &y)?;
        correct += c;
        loss_sum += nll;
        from += len;
    }
    Ok((correct, loss_sum, n))
}

/// A task's running score over its batches: correct predictions, summed cross-entropy and
/// examples, turned into its [`TaskScore`] at the end.
#[derive(Default)]
pub(crate) struct Tally {
    correct: usize,
    nll: f64,
    examples: usize,
}

impl Tally {
    /// Adds a batch: `logits` `[batch, classes]` of examples whose classes are `labels`.
    pub(crate) fn add(&mut self, logits: &Tensor, labels: impl IntoIterator<Item = usize>) -> Result<()> {
        let labels: Vec<u32> = labels.into_iter().map(|l| l as u32).collect();
        let n = labels.len();
        let labels = Tensor::from_vec(labels, n, logits.device())?;
        let (c, l) = score_logits(logits, &labels)?;
        self.correct += c;
        self.nll += l;
        self.examples += n;
        Ok(())
    }

    /// The task's accuracy and mean cross-entropy.
    pub(crate) fn score(&self, task: &str) -> TaskScore {
        let n = self.examples.max(1) as f64;
        TaskScore::classification(task, self.correct as f64 / n, self.nll / n, None, self.examples)
    }
}

/// (correct argmax predictions, summed cross-entropy) of `logits` `[batch, classes]` against
/// class indices `labels` `[batch]` (u32): the one scoring rule of every classifier evaluator.
pub(crate) fn score_logits(logits: &Tensor, labels: &Tensor) -> Result<(usize, f64)> {
    let log_p = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let nll = log_p
        .gather(&labels.unsqueeze(1)?, 1)?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    let pred = logits.argmax(D::Minus1)?;
    let correct = pred.eq(labels)?.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()? as usize;
    Ok((correct, -nll))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::demo_tasks;

    /// The batched evaluation agrees with a per-example oracle computed in f64 on the host.
    #[test]
    fn batched_scores_match_a_per_example_oracle() {
        let dev = Device::Cpu;
        let tasks = demo_tasks().unwrap();
        let t = &tasks[2]; // ising: 2 classes
        let arch = Arch::Mlp;
        let backbone = arch.init(3, &dev).unwrap();
        let head = Head::init(arch.feature_dim(), 2, 9, &dev).unwrap();
        let ev = BackboneEvaluator::new(
            arch,
            SplitKind::Calibration,
            vec![EvalTask {
                data: t,
                head: head.clone(),
                reference: Some(0.5),
            }],
            &dev,
        )
        .unwrap();
        let r = ev.evaluate(&backbone).unwrap();
        let split = t.split(SplitKind::Calibration);
        let (mut correct, mut loss) = (0usize, 0f64);
        for i in 0..split.len() {
            let x = images_tensor(&split.images[i * 784..(i + 1) * 784], &dev).unwrap();
            let logits = head.logits(&arch.features(&backbone, &x).unwrap()).unwrap();
            let z: Vec<f64> = logits
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .map(f64::from)
                .collect();
            let label = usize::from(split.labels[i]);
            let lse = z.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v));
            let lse = lse + z.iter().map(|v| (v - lse).exp()).sum::<f64>().ln();
            loss += lse - z[label];
            let best = if z[1] > z[0] { 1 } else { 0 };
            correct += usize::from(best == label);
        }
        let s = &r.tasks[0];
        assert_eq!(s.examples, 100);
        assert!((s.accuracy - correct as f64 / 100.0).abs() < 1e-12);
        let l = s.loss.unwrap();
        assert!((l - loss / 100.0).abs() < 1e-5, "{} vs {}", l, loss / 100.0);
        assert!((s.normalized.unwrap() - s.accuracy / 0.5).abs() < 1e-12);
        assert_eq!(r.mean_normalized, s.normalized);
    }

    #[test]
    fn a_head_of_the_wrong_size_is_refused() {
        let dev = Device::Cpu;
        let tasks = demo_tasks().unwrap();
        let head = Head::init(128, 3, 0, &dev).unwrap();
        let e = BackboneEvaluator::new(
            Arch::Mlp,
            SplitKind::Test,
            vec![EvalTask {
                data: &tasks[4],
                head,
                reference: None,
            }],
            &dev,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("task 'mnist'") && e.contains("3 outputs") && e.contains("10 classes"),
            "{e}"
        );
    }
}
