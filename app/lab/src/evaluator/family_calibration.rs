//! A model family's tasks as the data-driven methods see them: loss, accuracy, gradients,
//! diagonal Fisher and fine-tuning of whole candidate models, computed with candle autograd from
//! the family's logits ([`ClassifierFamily`]) on each task's calibration (and train) examples:
//! a classifier's, or a causal LM's over a question's choices or a text's next tokens.
//! Candidates carry the merged tensors; everything else (integer buffers, tensors the merge
//! leaves alone) comes from the base model.

use super::ClassifierFamily;
use super::backbone::Tally;
use super::calibration::{
    CalibrationScore, CalibrationTasks, Objective, Subset, add_grads, detached, fisher_of, objective_loss, variables,
    zero_grads,
};
use crate::family::hf;
use crate::nn::Params;
use crate::train::{self, BatchSize, Batcher, TrainConfig};
use candle_core::{Device, Tensor, Var};
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The calibration (and optional train) tasks of a family suite, for a model-level session.
pub(crate) struct FamilyCalibration<E: ClassifierFamily> {
    names: Vec<String>,
    calibration: E,
    train: Option<E>,
    inputs: E::Inputs,
    base: HashMap<String, Tensor>,
    source: PathBuf,
}

impl<E: ClassifierFamily> FamilyCalibration<E> {
    /// `calibration` scores and differentiates candidates; `train` (same tasks) is what
    /// fine-tuning steps on. Configs and tokenizers are resolved from `base`, whose tensors fill
    /// in what candidates do not carry; images are decoded, and a causal LM's tasks tokenised,
    /// once, here.
    pub(crate) fn new(mut calibration: E, mut train: Option<E>, base: &Path) -> Result<Self> {
        calibration.subsample(base, 0)?;
        calibration.prepare(base)?;
        if let Some(t) = &mut train {
            t.prepare(base)?;
        }
        Ok(FamilyCalibration {
            names: super::ScoresWeights::task_names(&calibration),
            inputs: calibration.inputs_for(base)?,
            base: hf::load_weights(base, calibration.device())?,
            calibration,
            train,
            source: base.to_owned(),
        })
    }

    /// The full weights of `model`: its tensors over the base's, and over those the tensors in
    /// `tracked` (the variables gradients are taken for).
    fn weights(&self, model: &Params, tracked: Option<&Params>) -> HashMap<String, Tensor> {
        let mut w = self.base.clone();
        w.extend(model.iter().map(|(k, t)| (k.clone(), t.clone())));
        if let Some(p) = tracked {
            w.extend(p.iter().map(|(k, t)| (k.clone(), t.clone())));
        }
        w
    }

    /// One autograd variable per tensor named in `order`, and the calibration network built
    /// from `model` with those variables in place.
    fn tracked_net(&self, model: &Params, order: &[String]) -> Result<(Vec<Var>, E::Net)> {
        let (vars, p) = variables(model, order)?;
        let net = self
            .calibration
            .build(&self.inputs, self.weights(model, Some(&p)), &self.source)?;
        Ok((vars, net))
    }

    fn labels(&self, labels: &[usize]) -> Result<Tensor> {
        let v: Vec<u32> = labels.iter().map(|&l| l as u32).collect();
        Ok(Tensor::from_vec(v, labels.len(), self.calibration.device())?)
    }
}

impl<E: ClassifierFamily> CalibrationTasks for FamilyCalibration<E> {
    fn task_names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    fn evaluate(&self, model: &Params, tasks: &[usize]) -> Result<CalibrationScore> {
        let net = self
            .calibration
            .build(&self.inputs, self.weights(&detached(model), None), &self.source)?;
        CalibrationScore::mean_over(tasks, |t| {
            let mut tally = Tally::default();
            for indices in super::batches(self.calibration.examples(t), self.calibration.batch_size()) {
                let (logits, labels) = self.calibration.logits(&self.inputs, &net, t, &indices)?;
                tally.add(&logits, labels)?;
            }
            let s = tally.score(&self.names[t]);
            Ok(CalibrationScore {
                loss: s.loss.unwrap_or(f64::NAN),
                accuracy: s.accuracy,
                examples: s.examples as u64,
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
        let (vars, net) = self.tracked_net(model, order)?;
        let mut grads = if with_grads { Some(zero_grads(&vars)?) } else { None };
        let mut value = 0.0;
        for &t in tasks {
            let selected = subset.indices(self.calibration.examples(t), t);
            let rows = self.calibration.rows(t, &selected);
            // The task's mean loss as a sum over batches, each differentiated on its own so that
            // memory holds one batch of activations.
            for indices in selected.chunks(self.calibration.batch_size().max(1)) {
                let (logits, labels) = self.calibration.logits(&self.inputs, &net, t, indices)?;
                let share = self.calibration.rows(t, indices) as f64 / rows as f64;
                let l = (objective_loss(&logits, &self.labels(&labels)?, objective)? * share)?;
                value += f64::from(l.to_scalar::<f32>()?);
                if let Some(g) = &mut grads {
                    add_grads(g, &l.backward()?, &vars)?;
                }
            }
        }
        Ok((value, grads))
    }

    fn diag_fisher(
        &self,
        model: &Params,
        order: &[String],
        task: usize,
        predicted: bool,
        cancel: &AtomicBool,
    ) -> Result<Vec<Tensor>> {
        let (vars, net) = self.tracked_net(model, order)?;
        let n = self.calibration.examples(task);
        fisher_of(&vars, n, predicted, cancel, |i| {
            let (logits, labels) = self.calibration.logits(&self.inputs, &net, task, &[i])?;
            Ok((logits, self.labels(&labels)?))
        })
    }

    fn finetune(
        &self,
        start: &Params,
        task: usize,
        config: &TrainConfig,
        _device: &Device,
        cancel: &AtomicBool,
    ) -> Result<Params> {
        let Some(train) = &self.train else {
            return Err(EngineError::Param(format!(
                "fine-tuning on task '{}' needs its training examples: give every [[task]] of the suite a train = \"...\" file (same format as its data)",
                self.names[task]
            )));
        };
        let n = train.examples(task);
        if n == 0 {
            return Err(EngineError::evaluator(format!(
                "task '{}' has no training examples",
                self.names[task]
            )));
        }
        if config.batch == BatchSize::Size(0) {
            return Err(EngineError::Param("batch size must be at least 1".into()));
        }
        let vars = train::to_vars(start)?;
        let mut batcher = Batcher::new(n, config.batch, config.seed, task as u64);
        let steps = train::total_steps(config.budget, batcher.steps_per_epoch());
        let mut loss = |_step: usize| -> Result<Tensor> {
            let net = train.build(&self.inputs, self.weights(&train::from_vars(&vars), None), &self.source)?;
            let indices = batcher.next_batch();
            let (logits, labels) = train.logits(&self.inputs, &net, task, &indices)?;
            objective_loss(&logits, &self.labels(&labels)?, Objective::CrossEntropy)
        };
        let var_list = vars.iter().map(|(_, v)| v.clone()).collect();
        train::optimize(var_list, config.optim, steps, &mut loss, &mut |_| {}, cancel)?;
        Ok(train::detached(&vars))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evaluator::suite::Suite;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/bert-experts")
    }

    /// A two-task bert-family suite (`family = "bert"`, whatever the model type) calibrating and
    /// training on each task's file in `fx`, heads from `experts` (no `head` key).
    fn text_tasks(
        dir: &Path,
        fx: &Path,
        tasks: [(&str, &str); 2],
        base: &Path,
        experts: [&Path; 2],
    ) -> Box<dyn CalibrationTasks> {
        let p = |s: &str| fx.join(s).to_string_lossy().replace('\\', "/");
        let task = |(name, file): (&str, &str)| {
            format!(
                "[[task]]\nname = \"{name}\"\ndata = \"{d}\"\ncalibration = \"{d}\"\ntrain = \"{d}\"\n",
                d = p(file)
            )
        };
        let path = dir.join("suite.toml");
        std::fs::write(
            &path,
            format!(
                "name = \"text\"\n[model]\nfamily = \"bert\"\nbatch_size = 16\n{}{}",
                task(tasks[0]),
                task(tasks[1])
            ),
        )
        .unwrap();
        let suite = Suite::load(&path).unwrap();
        suite
            .calibration_tasks(base, &[experts[0].to_owned(), experts[1].to_owned()], &Device::Cpu)
            .unwrap()
    }

    /// The two-task BERT suite of the fixtures, calibrating on each task's data, heads from the
    /// experts.
    fn bert_tasks(dir: &Path) -> Box<dyn CalibrationTasks> {
        let fx = fixtures();
        text_tasks(
            dir,
            &fx,
            [("topic", "topic.jsonl"), ("verdict", "verdict.jsonl")],
            &fx.join("base"),
            [&fx.join("topic"), &fx.join("verdict")],
        )
    }

    /// Gradients through the tiny classifier `name` of the fixtures (`distilbert-tiny`,
    /// `roberta-tiny`) on its own data twice over, with its own head, for the tensors `order`.
    fn check_tiny_gradients(name: &str, order: &[&str]) {
        let dir = tempfile::tempdir().unwrap();
        let fx = fixtures().join("..").join(name);
        let tasks = text_tasks(
            dir.path(),
            &fx,
            [("a", "data.jsonl"), ("b", "data.jsonl")],
            &fx,
            [&fx, &fx],
        );
        let model: Params = hf::load_weights(&fx, &Device::Cpu).unwrap().into_iter().collect();
        check_gradients(tasks.as_ref(), &model, order);
        assert_eq!(tasks.evaluate(&model, &[0, 1]).unwrap().examples, 32);
    }

    fn model(name: &str) -> Params {
        hf::load_weights(&fixtures().join(name), &Device::Cpu)
            .unwrap()
            .into_iter()
            .collect()
    }

    /// The calibration tasks of the two-task CLIP suite of the fixtures (zero-shot heads from
    /// the base's text tower), calibrating on each task's images.
    fn clip_tasks(dir: &Path) -> Box<dyn CalibrationTasks> {
        let fx = fixtures().join("../clip-experts");
        let p = |s: &str| fx.join(s).to_string_lossy().replace('\\', "/");
        let path = dir.join("clip.toml");
        std::fs::write(
            &path,
            format!(
                "name = \"clip\"\n[model]\nfamily = \"clip\"\nzeroshot_from = \"{base}\"\n\
                 [[task]]\nname = \"shapes\"\ndata = \"{s}\"\ncalibration = \"{s}\"\n\
                 [[task]]\nname = \"brightness\"\ndata = \"{b}\"\ncalibration = \"{b}\"\nlabels = [\"shape\", \"picture\"]\n",
                base = p("base"),
                s = p("data/shapes"),
                b = p("data/brightness"),
            ),
        )
        .unwrap();
        Suite::load(&path)
            .unwrap()
            .calibration_tasks(
                &fx.join("base"),
                &[fx.join("shapes"), fx.join("brightness")],
                &Device::Cpu,
            )
            .unwrap()
    }

    /// Checks, for each tensor of `order`, that its gradient of the cross-entropy objective over
    /// both tasks is non-zero and agrees with a central finite difference at its largest entry;
    /// and that the objective is the sum over tasks of the mean cross-entropy `evaluate` reports.
    fn check_gradients(tasks: &dyn CalibrationTasks, model: &Params, order: &[&str]) {
        check_objective_gradients(tasks, model, order, Objective::CrossEntropy);
    }

    /// [`check_gradients`] for `objective`; returns the worst relative error of the gradients.
    fn check_objective_gradients(
        tasks: &dyn CalibrationTasks,
        model: &Params,
        order: &[&str],
        objective: Objective,
    ) -> f64 {
        let order: Vec<String> = order.iter().map(|s| (*s).to_owned()).collect();
        let (value, grads) = tasks
            .objective(model, &order, &[0, 1], Subset::All, objective, true)
            .unwrap();
        if objective == Objective::CrossEntropy {
            let score = tasks.evaluate(model, &[0, 1]).unwrap();
            assert!((value - 2.0 * score.loss).abs() < 1e-4, "{value} vs 2 × {}", score.loss);
        }
        let mut worst = 0f64;
        for (name, g) in order.iter().zip(&grads.unwrap()) {
            let flat: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
            let (at, &biggest) = flat
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .unwrap();
            assert!(biggest.abs() > 1e-4, "{name}: no gradient (largest {biggest})");
            let h = 1e-2f32;
            let shifted = |d: f32| {
                let mut m = model.clone();
                let t = &m[name];
                let mut v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                v[at] += d;
                let shape = t.dims().to_vec();
                m.insert(name.clone(), Tensor::from_vec(v, shape, &Device::Cpu).unwrap());
                tasks
                    .objective(&m, &order, &[0, 1], Subset::All, objective, false)
                    .unwrap()
                    .0
            };
            let fd = (shifted(h) - shifted(-h)) / (2.0 * f64::from(h));
            let g = f64::from(biggest);
            assert!(
                (fd - g).abs() < 0.02 * g.abs() + 1e-4,
                "{name}[{at}]: autograd {g}, finite difference {fd}"
            );
            worst = worst.max((fd - g).abs() / g.abs());
        }
        worst
    }

    /// Gradients reach every layer of a BERT encoder, the first included (candle-nn's fused
    /// layer norm records no backward op; third_party/candle-nn falls back to the
    /// differentiable one), and agree with finite differences.
    #[test]
    fn bert_gradients_reach_the_first_layer_and_match_finite_differences() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = bert_tasks(dir.path());
        assert_eq!(tasks.task_names(), ["topic", "verdict"]);
        let order = [
            "bert.embeddings.word_embeddings.weight",
            "bert.encoder.layer.0.attention.self.query.weight",
            "bert.encoder.layer.0.output.LayerNorm.weight",
            "bert.pooler.dense.weight",
        ];
        check_gradients(tasks.as_ref(), &model("base"), &order);
        assert_eq!(tasks.evaluate(&model("base"), &[0, 1]).unwrap().examples, 80);
    }

    /// Mini-batches: one epoch's batches (40 examples in batches of 12, 12, 12 and 4), each
    /// weighted by its share of the examples, add up to the full-batch objective and gradient of
    /// the task (the objective is a mean), each batch differs from it, and a batch as large as
    /// the task is the full batch itself.
    #[test]
    fn an_epoch_of_minibatches_adds_up_to_the_full_objective() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = bert_tasks(dir.path());
        let order: Vec<String> = [
            "bert.encoder.layer.0.attention.self.query.weight",
            "bert.pooler.dense.weight",
        ]
        .map(str::to_owned)
        .to_vec();
        let m = model("topic");
        for (task, objective) in [(0, Objective::Entropy), (1, Objective::CrossEntropy)] {
            let (full, full_g) = tasks
                .objective(&m, &order, &[task], Subset::All, objective, true)
                .unwrap();
            let full_g = full_g.unwrap();
            let (size, seed) = (12, 7);
            let mut value = 0.0;
            let mut grads: Vec<Tensor> = full_g.iter().map(|g| g.zeros_like().unwrap()).collect();
            for step in 0..4 {
                let b = Subset::Minibatch { size, seed, step };
                let share = train::batch_at(40, size, seed, task as u64, step).len() as f64 / 40.0;
                let (v, g) = tasks.objective(&m, &order, &[task], b, objective, true).unwrap();
                assert!(
                    (v - full).abs() > 1e-6,
                    "batch {step} of task {task} gave the full objective {full}"
                );
                value += share * v;
                for (sum, g) in grads.iter_mut().zip(g.unwrap()) {
                    *sum = (&*sum + (g * share).unwrap()).unwrap();
                }
            }
            assert!(
                (value - full).abs() < 1e-5 * full.abs().max(1.0),
                "task {task}: {value} vs {full}"
            );
            for (name, (sum, want)) in order.iter().zip(grads.iter().zip(&full_g)) {
                let err = crate::nn::max_abs_diff(sum, want);
                let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(
                    err <= 1e-4 * scale,
                    "{name}, task {task}: batches off by {err} (largest {scale})"
                );
            }
            let whole = Subset::Minibatch {
                size: 40,
                seed,
                step: 3,
            };
            let (v, g) = tasks.objective(&m, &order, &[task], whole, objective, true).unwrap();
            assert_eq!(v.to_bits(), full.to_bits());
            for (a, b) in g.unwrap().iter().zip(&full_g) {
                assert_eq!(crate::nn::max_abs_diff(a, b), 0.0);
            }
        }
    }

    /// The same through DistilBERT (its tensors run on candle's BERT network under BERT's
    /// names: the gradients must still reach the DistilBERT tensors).
    #[test]
    fn distilbert_gradients_reach_the_first_layer_and_match_finite_differences() {
        check_tiny_gradients(
            "distilbert-tiny",
            &[
                "distilbert.embeddings.word_embeddings.weight",
                "distilbert.embeddings.position_embeddings.weight",
                "distilbert.transformer.layer.0.attention.q_lin.weight",
                "distilbert.transformer.layer.0.output_layer_norm.weight",
                "distilbert.transformer.layer.1.ffn.lin1.weight",
            ],
        );
    }

    /// The same through RoBERTa (candle's XLM-RoBERTa network).
    #[test]
    fn roberta_gradients_reach_the_first_layer_and_match_finite_differences() {
        check_tiny_gradients(
            "roberta-tiny",
            &[
                "roberta.embeddings.word_embeddings.weight",
                "roberta.embeddings.position_embeddings.weight",
                "roberta.encoder.layer.0.attention.self.query.weight",
                "roberta.encoder.layer.0.output.LayerNorm.weight",
                "roberta.encoder.layer.1.intermediate.dense.weight",
            ],
        );
    }

    /// The same through a CLIP image tower (patch convolution, pre-norm, attention, projection)
    /// with zero-shot heads.
    #[test]
    fn clip_gradients_reach_the_patch_embedding_and_match_finite_differences() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = clip_tasks(dir.path());
        assert_eq!(tasks.task_names(), ["shapes", "brightness"]);
        let base: Params = hf::load_weights(&fixtures().join("../clip-experts/base"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .collect();
        let order = [
            "vision_model.embeddings.patch_embedding.weight",
            "vision_model.pre_layrnorm.weight",
            "vision_model.encoder.layers.0.self_attn.q_proj.weight",
            "visual_projection.weight",
        ];
        check_gradients(tasks.as_ref(), &base, &order);
    }

    /// On calibration data the experts score what transformers measured for them (reference.json
    /// of the fixtures), each task with its own expert's head.
    #[test]
    fn calibration_scores_match_transformers() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = bert_tasks(dir.path());
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join("reference.json")).unwrap()).unwrap();
        for (i, expert) in ["topic", "verdict"].iter().enumerate() {
            let s = tasks.evaluate(&model(expert), &[i]).unwrap();
            assert_eq!(s.accuracy, r["accuracy"][expert][expert].as_f64().unwrap(), "{expert}");
        }
        let s = tasks.evaluate(&model("base"), &[0, 1]).unwrap();
        let base = &r["accuracy"]["base"];
        let want = (base["topic"].as_f64().unwrap() + base["verdict"].as_f64().unwrap()) / 2.0;
        assert!((s.accuracy - want).abs() < 1e-12);
    }

    /// Fine-tuning on a task's train examples lowers its loss; the diagonal Fisher is a mean of
    /// squares (non-negative) with something in every layer.
    #[test]
    fn fine_tuning_learns_and_the_fisher_is_positive() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = bert_tasks(dir.path());
        let base = model("base");
        let before = tasks.evaluate(&base, &[0]).unwrap().loss;
        let cfg = TrainConfig {
            optim: train::OptimConfig::adamw(1e-3, 0.0),
            batch: BatchSize::Full,
            budget: train::Budget::Steps(20),
            seed: 1,
            augment_shift: 0,
        };
        let tuned = tasks
            .finetune(&base, 0, &cfg, &Device::Cpu, &AtomicBool::new(false))
            .unwrap();
        let after = tasks.evaluate(&tuned, &[0]).unwrap().loss;
        assert!(after < before - 0.05, "loss {before} -> {after}");
        let order = vec![
            "bert.embeddings.word_embeddings.weight".to_owned(),
            "classifier.weight".to_owned(),
        ];
        let fisher = tasks
            .diag_fisher(&base, &order, 1, false, &AtomicBool::new(false))
            .unwrap();
        let first: Vec<f32> = fisher[0].flatten_all().unwrap().to_vec1().unwrap();
        assert!(first.iter().all(|v| *v >= 0.0) && first.iter().any(|v| *v > 0.0));
    }

    /// A two-task causal-lm suite of the tiny `arch` model of the fixtures (`llama`, `qwen2`,
    /// `gpt2`):
    /// its multiple-choice questions and its text, calibrating and training on the same files,
    /// with `model` keys added to `[model]`.
    fn lm_tasks(dir: &Path, arch: &str, model: &str) -> (Box<dyn CalibrationTasks>, Suite, PathBuf) {
        let fx = fixtures().join(format!("../{arch}-tiny"));
        let p = |s: &str| fx.join(s).to_string_lossy().replace('\\', "/");
        let task = |name: &str, file: &str| {
            format!(
                "[[task]]\nname = \"{name}\"\ndata = \"{d}\"\ncalibration = \"{d}\"\ntrain = \"{d}\"\n",
                d = p(file)
            )
        };
        let path = dir.join(format!("{arch}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"lm\"\n[model]\nfamily = \"causal-lm\"\n{model}\n{}{}",
                task("mc", "mc.jsonl"),
                task("text", "text.txt")
            ),
        )
        .unwrap();
        let suite = Suite::load(&path).unwrap();
        let tasks = suite
            .calibration_tasks(&fx, &[fx.clone(), fx.clone()], &Device::Cpu)
            .unwrap();
        (tasks, suite, fx)
    }

    fn lm_model(fx: &Path) -> Params {
        hf::load_weights(fx, &Device::Cpu).unwrap().into_iter().collect()
    }

    /// The tensors of `arch` whose gradients the causal-LM tests check: the embeddings, the
    /// first layer's attention and norm, the last layer's MLP, the final norm and the output
    /// head (GPT-2's is the token embeddings; its positions and packed attention instead).
    fn lm_tensors(arch: &str) -> &'static [&'static str] {
        if arch == "gpt2" {
            &[
                "transformer.wte.weight",
                "transformer.wpe.weight",
                "transformer.h.0.attn.c_attn.weight",
                "transformer.h.0.attn.c_attn.bias",
                "transformer.h.0.ln_1.weight",
                "transformer.h.1.mlp.c_proj.weight",
                "transformer.ln_f.weight",
            ]
        } else {
            &[
                "model.embed_tokens.weight",
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.1.mlp.down_proj.weight",
                "model.norm.weight",
                "lm_head.weight",
            ]
        }
    }

    /// On a causal LM the calibration scores are what the suite's evaluation reports (the
    /// multiple-choice accuracy is acc_norm, the text's loss its mean next-token NLL), also when
    /// windows cut the questions' context and the text into pieces that batches pad; and both
    /// objectives' gradients (in one pass, and through the key-value cache of a Llama with rope
    /// scaling) agree with finite differences in every layer.
    #[test]
    fn causal_lm_scores_match_evaluation_and_gradients_match_finite_differences() {
        // The tiny Llama with Llama 3's rope scaling, which keeps candle's stepped Llama.
        let scaled = tempfile::tempdir().unwrap();
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join("../llama-tiny/config.json")).unwrap())
                .unwrap();
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16
        });
        let scaled_config = scaled.path().join("config.json");
        std::fs::write(&scaled_config, config.to_string()).unwrap();
        let stepped = format!("config = \"{}\"", scaled_config.to_string_lossy().replace('\\', "/"));
        for (arch, model) in [
            ("llama", ""),
            ("llama", "max_length = 8\nbatch_size = 2"),
            ("llama", stepped.as_str()),
            ("qwen2", ""),
            ("qwen2", "max_length = 8\nbatch_size = 2"),
            ("gpt2", ""),
            ("gpt2", "max_length = 8\nbatch_size = 2"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let (tasks, suite, fx) = lm_tasks(dir.path(), arch, model);
            assert_eq!(tasks.task_names(), ["mc", "text"]);
            let base = lm_model(&fx);
            let report = suite
                .evaluator(None, &Device::Cpu)
                .unwrap()
                .evaluate_file(&fx, &AtomicBool::new(false))
                .unwrap();
            let (mc, text) = (report.task("mc").unwrap(), report.task("text").unwrap());
            let s = tasks.evaluate(&base, &[0]).unwrap();
            assert_eq!(s.accuracy, mc.metrics["acc_norm"], "{arch} {model}");
            assert_eq!(s.examples, 6);
            let s = tasks.evaluate(&base, &[1]).unwrap();
            assert_eq!(s.accuracy, text.accuracy, "{arch} {model}");
            assert_eq!(s.examples as usize, text.examples, "{arch} {model}");
            assert!(
                (s.loss - text.loss.unwrap()).abs() < 1e-5,
                "{arch} {model}: {} vs {:?}",
                s.loss,
                text.loss
            );
            let t = std::time::Instant::now();
            let ce = check_objective_gradients(tasks.as_ref(), &base, lm_tensors(arch), Objective::CrossEntropy);
            let entropy = check_objective_gradients(tasks.as_ref(), &base, lm_tensors(arch), Objective::Entropy);
            println!(
                "{arch}-tiny [{}]: worst relative gradient error: cross-entropy {ce:.1e}, entropy {entropy:.1e} ({:.1} s)",
                model.replace('\n', ", "),
                t.elapsed().as_secs_f64()
            );
        }
    }

    /// The transformers reference of the fixtures: the calibration accuracy of the questions is
    /// its acc_norm, the text's loss its mean NLL.
    #[test]
    fn causal_lm_calibration_scores_match_transformers() {
        for arch in ["llama", "qwen2", "gpt2"] {
            let dir = tempfile::tempdir().unwrap();
            let (tasks, _, fx) = lm_tasks(dir.path(), arch, "");
            let r: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(fx.join("reference.json")).unwrap()).unwrap();
            let base = lm_model(&fx);
            assert_eq!(
                tasks.evaluate(&base, &[0]).unwrap().accuracy,
                r["acc_norm"].as_f64().unwrap()
            );
            let text = tasks.evaluate(&base, &[1]).unwrap();
            assert!(
                (text.loss - r["text_nll"].as_f64().unwrap()).abs() < 1e-5,
                "{arch}: {}",
                text.loss
            );
        }
    }

    /// Fine-tuning a causal LM on a task's train examples lowers its loss (the answers' under
    /// the softmax over choices; the text's next-token NLL); the diagonal Fisher of either task
    /// is finite, non-negative and non-zero in the first layer.
    #[test]
    fn causal_lm_fine_tuning_learns_and_the_fisher_is_positive() {
        for arch in ["llama", "qwen2", "gpt2"] {
            let dir = tempfile::tempdir().unwrap();
            let (tasks, _, fx) = lm_tasks(dir.path(), arch, "batch_size = 3");
            let base = lm_model(&fx);
            let cfg = TrainConfig {
                optim: train::OptimConfig::adamw(1e-2, 0.0),
                batch: BatchSize::Size(3),
                budget: train::Budget::Steps(10),
                seed: 1,
                augment_shift: 0,
            };
            for task in [0, 1] {
                let before = tasks.evaluate(&base, &[task]).unwrap().loss;
                let t = std::time::Instant::now();
                let tuned = tasks
                    .finetune(&base, task, &cfg, &Device::Cpu, &AtomicBool::new(false))
                    .unwrap();
                let after = tasks.evaluate(&tuned, &[task]).unwrap().loss;
                println!(
                    "{arch}-tiny task {task}: train loss {before:.4} -> {after:.4} in 10 steps ({:.1} s)",
                    t.elapsed().as_secs_f64()
                );
                assert!(after < before - 0.05, "{arch} task {task}: loss {before} -> {after}");
                let order: Vec<String> = lm_tensors(arch).iter().map(|s| (*s).to_owned()).collect();
                for predicted in [false, true] {
                    let fisher = tasks
                        .diag_fisher(&base, &order, task, predicted, &AtomicBool::new(false))
                        .unwrap();
                    for (name, f) in order.iter().zip(&fisher) {
                        let v: Vec<f32> = f.flatten_all().unwrap().to_vec1().unwrap();
                        assert!(v.iter().all(|x| x.is_finite() && *x >= 0.0), "{arch} {name}");
                        assert!(v.iter().any(|x| *x > 0.0), "{arch} {name}: all zero");
                    }
                }
            }
        }
    }
}
