//! Causal language models scored as lm-evaluation-harness scores them: multiple-choice tasks by
//! the log-likelihood of each choice after the question (`acc`, and `acc_norm` with the
//! log-likelihood divided by the choice's length in bytes, the headline), and texts by
//! perplexity and next-token accuracy (the headline), on the evaluator's device.

use super::{EvalReport, ScoresWeights, TaskScore, evenly, summarise};
use crate::data::SplitKind;
use crate::family::causal_lm::{CausalLm, LmConfig, read_config};
use crate::family::hf;
use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use tokenizers::Tokenizer;

/// One multiple-choice question.
#[derive(Clone, Debug, PartialEq)]
pub struct Question {
    /// The context the choices continue.
    pub question: String,
    /// The possible continuations (each scored after a space).
    pub choices: Vec<String>,
    /// Index of the right one.
    pub answer: usize,
}

/// What a language-model task scores.
#[derive(Clone, Debug)]
pub enum LmTaskData {
    /// Questions with choices (JSONL: `question`, `choices`, `answer`).
    MultipleChoice(Vec<Question>),
    /// A text whose perplexity is measured.
    Text(String),
}

/// One task.
#[derive(Clone, Debug)]
pub struct LmTask {
    /// Task name.
    pub name: String,
    /// Its data.
    pub data: LmTaskData,
}

/// Reads a task's data: `.jsonl` multiple-choice questions or a `.txt` text.
pub fn read_lm_task(name: &str, path: &Path) -> Result<LmTask> {
    let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("cannot read", path, e))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let data = match ext.as_str() {
        "txt" => {
            if text.trim().is_empty() {
                return Err(EngineError::invalid(format!("'{}' is empty", path.display())));
            }
            LmTaskData::Text(text)
        }
        "jsonl" | "json" => {
            let mut qs = Vec::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let at = |what: &str| EngineError::invalid(format!("'{}', line {}: {what}", path.display(), i + 1));
                let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(&format!("not JSON ({e})")))?;
                let question = v["question"]
                    .as_str()
                    .ok_or_else(|| at("no string \"question\""))?
                    .to_owned();
                let choices: Vec<String> = v["choices"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_owned)).collect())
                    .filter(|c: &Vec<String>| c.len() >= 2)
                    .ok_or_else(|| at("\"choices\" must list at least two strings"))?;
                let answer = v["answer"]
                    .as_u64()
                    .map(|a| a as usize)
                    .filter(|a| *a < choices.len())
                    .ok_or_else(|| at("\"answer\" must be the index of the right choice"))?;
                qs.push(Question {
                    question,
                    choices,
                    answer,
                });
            }
            if qs.is_empty() {
                return Err(EngineError::invalid(format!("'{}' holds no questions", path.display())));
            }
            LmTaskData::MultipleChoice(qs)
        }
        _ => {
            return Err(EngineError::invalid(format!(
                "'{}': a causal-lm task's data is .jsonl multiple-choice questions ({{\"question\", \"choices\", \"answer\"}} a line) or a .txt text",
                path.display()
            )));
        }
    };
    Ok(LmTask {
        name: name.to_owned(),
        data,
    })
}

/// Where the model's config and tokenizer are, and the window it reads.
#[derive(Clone, Debug)]
pub struct LmModelSpec {
    /// `config.json`; default: beside the evaluated checkpoint.
    pub config: Option<PathBuf>,
    /// `tokenizer.json`; default: beside the evaluated checkpoint.
    pub tokenizer: Option<PathBuf>,
    /// Tokens per window (longer inputs keep their last tokens; texts are cut into windows).
    pub max_length: usize,
    /// The suite's base model: its config and tokenizer serve checkpoints with none beside them.
    pub base: Option<PathBuf>,
}

/// Evaluates causal LMs on multiple-choice and perplexity tasks.
#[derive(Clone)]
pub struct LmEvaluator {
    name: String,
    spec: LmModelSpec,
    tasks: Vec<LmTask>,
    device: Device,
}

impl LmEvaluator {
    /// An evaluator named `name` (a suite's) of `tasks`.
    pub fn new(name: String, spec: LmModelSpec, tasks: Vec<LmTask>, device: &Device) -> Result<Self> {
        if spec.max_length < 2 {
            return Err(EngineError::Param(format!(
                "suite '{name}': [model] max_length must be at least 2"
            )));
        }
        Ok(LmEvaluator {
            name,
            spec,
            tasks,
            device: device.clone(),
        })
    }

    fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
        Ok(tokenizer
            .encode(text, true)
            .map_err(|e| EngineError::invalid(format!("the tokenizer failed: {e}")))?
            .get_ids()
            .to_vec())
    }
}

impl ScoresWeights for LmEvaluator {
    type Inputs = (LmConfig, Tokenizer);
    const FAMILY: &'static str = "causal-lm";

    fn suite_name(&self) -> &str {
        &self.name
    }

    fn task_names(&self) -> Vec<String> {
        self.tasks.iter().map(|t| t.name.clone()).collect()
    }

    fn subsample(&mut self, _like: &Path, samples: usize) -> Result<()> {
        for t in &mut self.tasks {
            if let LmTaskData::MultipleChoice(qs) = &mut t.data {
                *qs = evenly(qs, samples);
            }
        }
        Ok(())
    }

    /// The config and tokenizer for models like `checkpoint` (the suite's, or those beside it).
    fn inputs_for(&self, checkpoint: &Path) -> Result<(LmConfig, Tokenizer)> {
        let config = read_config(&hf::locate(
            self.spec.config.as_deref(),
            checkpoint,
            self.spec.base.as_deref(),
            "config.json",
            "config",
        )?)?;
        let tokenizer = hf::load_tokenizer(
            &hf::locate(
                self.spec.tokenizer.as_deref(),
                checkpoint,
                self.spec.base.as_deref(),
                "tokenizer.json",
                "tokenizer",
            )?,
            usize::MAX / 2,
        )?;
        Ok((config, tokenizer))
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn score_weights(
        &self,
        (config, tokenizer): &(LmConfig, Tokenizer),
        weights: HashMap<String, Tensor>,
        source: &Path,
        cancel: &AtomicBool,
    ) -> Result<EvalReport> {
        let mut lm = CausalLm::load(config, weights, &self.device, source)?;
        let window = self.spec.max_length.min(config.max_positions());
        let mut scores = Vec::with_capacity(self.tasks.len());
        for task in &self.tasks {
            let stop = || -> Result<()> {
                if cancel.load(Ordering::Relaxed) {
                    Err(EngineError::Cancelled)
                } else {
                    Ok(())
                }
            };
            scores.push(match &task.data {
                LmTaskData::MultipleChoice(qs) => {
                    let (mut acc, mut acc_norm) = (0usize, 0usize);
                    for q in qs {
                        stop()?;
                        let context = Self::encode(tokenizer, &q.question)?.len();
                        let mut best = (f64::NEG_INFINITY, 0usize, f64::NEG_INFINITY, 0usize);
                        for (k, choice) in q.choices.iter().enumerate() {
                            let full = Self::encode(tokenizer, &format!("{} {choice}", q.question))?;
                            // Keep the last `window` tokens (the choice and as much context as fits).
                            let cut = full.len().saturating_sub(window);
                            let from = context.max(cut + 1).min(full.len()) - cut;
                            let ll: f64 = lm.score_tokens(&full[cut..], from)?.iter().map(|(lp, _)| lp).sum();
                            let norm = ll / (choice.len() + 1) as f64;
                            if ll > best.0 {
                                best.0 = ll;
                                best.1 = k;
                            }
                            if norm > best.2 {
                                best.2 = norm;
                                best.3 = k;
                            }
                        }
                        acc += usize::from(best.1 == q.answer);
                        acc_norm += usize::from(best.3 == q.answer);
                    }
                    let n = qs.len() as f64;
                    TaskScore {
                        task: task.name.clone(),
                        accuracy: acc_norm as f64 / n,
                        metric: "acc_norm".into(),
                        loss: None,
                        normalized: None,
                        examples: qs.len(),
                        metrics: BTreeMap::from([
                            ("acc".into(), acc as f64 / n),
                            ("acc_norm".into(), acc_norm as f64 / n),
                        ]),
                    }
                }
                LmTaskData::Text(text) => {
                    let ids = Self::encode(tokenizer, text)?;
                    let (mut nll, mut top1, mut count) = (0f64, 0usize, 0usize);
                    for chunk in ids.chunks(window).filter(|c| c.len() >= 2) {
                        stop()?;
                        for (lp, best) in lm.score_tokens(chunk, 1)? {
                            nll -= lp;
                            top1 += usize::from(best);
                            count += 1;
                        }
                    }
                    if count == 0 {
                        return Err(EngineError::invalid(format!(
                            "task '{}': its text is a single token; give it more text",
                            task.name
                        )));
                    }
                    let mean = nll / count as f64;
                    TaskScore {
                        task: task.name.clone(),
                        accuracy: top1 as f64 / count as f64,
                        metric: "token_accuracy".into(),
                        loss: Some(mean),
                        normalized: None,
                        examples: count,
                        metrics: BTreeMap::from([("perplexity".into(), mean.exp())]),
                    }
                }
            });
        }
        Ok(summarise(SplitKind::Test, scores))
    }
}
