//! Causal language models scored as lm-evaluation-harness scores them: multiple-choice tasks by
//! the log-likelihood of each choice after the question (`acc`, and `acc_norm` with the
//! log-likelihood divided by the choice's length in bytes, the headline), and texts by
//! perplexity and next-token accuracy (the headline), on the evaluator's device.
//!
//! It is also a [`ClassifierFamily`], so that the data-driven merge methods run on causal LMs
//! through the classifiers' one path (`family_calibration`): a multiple-choice question is an
//! example whose "logits" are its choices' length-normalised log-likelihoods (the scores
//! `acc_norm` ranks), its label the answer; a text window gives one example per predicted token,
//! its logits over the vocabulary, its label the next token. Cross-entropy is then the answer's
//! loss under the softmax over choices (or the mean next-token NLL), entropy that of the
//! prediction over choices (or the mean next-token entropy).

use super::{ClassifierFamily, EvalReport, ScoresWeights, TaskScore, evenly, summarise};
use crate::data::SplitKind;
use crate::family::causal_lm::{CausalLm, LmConfig, read_config};
use crate::family::hf;
use candle_core::{D, DType, Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
                return Err(EngineError::evaluator(format!("'{}' is empty", path.display())));
            }
            LmTaskData::Text(text)
        }
        "jsonl" | "json" => {
            let mut qs = Vec::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let at = |what: &str| EngineError::evaluator(format!("'{}', line {}: {what}", path.display(), i + 1));
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
                return Err(EngineError::evaluator(format!(
                    "'{}' holds no questions",
                    path.display()
                )));
            }
            LmTaskData::MultipleChoice(qs)
        }
        _ => {
            return Err(EngineError::evaluator(format!(
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
    /// Questions (all their choices together) or text windows per forward pass of the
    /// data-driven methods.
    pub batch_size: usize,
}

/// What `acc_norm` divides a choice's log-likelihood by, as lm-evaluation-harness does
/// (`process_results`: `completion_len = len(choice)`): the choice's length in characters
/// (Unicode scalar values, as Python's `len`), without the space that joins it to the question.
/// An empty choice counts as 1, where lm-eval would divide by zero.
fn acc_norm_length(choice: &str) -> f64 {
    choice.chars().count().max(1) as f64
}

/// A token sequence whose tokens from `from` on are scored.
#[derive(Clone, Debug)]
struct Scored {
    tokens: Vec<u32>,
    from: usize,
    /// What its log-likelihood is divided by for `acc_norm` ([`acc_norm_length`]).
    norm: f64,
}

/// A task's data as token sequences, tokenised once for the data-driven methods.
#[derive(Clone, Debug)]
enum Tokenised {
    /// Each question's choices, and its answer.
    Choices(Vec<(Vec<Scored>, usize)>),
    /// The windows of a text (at least two tokens each).
    Windows(Vec<Vec<u32>>),
}

/// The value missing choices get among a batch's choice scores (a question with fewer choices
/// than the batch's most): nothing of the softmax, and no NaN in the entropy.
const NO_CHOICE: f32 = -1e9;

/// Evaluates causal LMs on multiple-choice and perplexity tasks.
#[derive(Clone)]
pub struct LmEvaluator {
    name: String,
    spec: LmModelSpec,
    tasks: Vec<LmTask>,
    device: Device,
    /// The tasks' token sequences, once [`ClassifierFamily::prepare`] made them.
    tokenised: Option<Arc<Vec<Tokenised>>>,
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
            tokenised: None,
        })
    }

    /// Tokens per window for models of `config`.
    fn window(&self, config: &LmConfig) -> usize {
        self.spec.max_length.min(config.max_positions())
    }

    /// Question `q`'s choices as scored sequences, each the question, a space and the choice,
    /// keeping its last `window` tokens (the choice and as much context as fits).
    fn choice_sequences(tokenizer: &Tokenizer, q: &Question, window: usize) -> Result<Vec<Scored>> {
        let context = Self::encode(tokenizer, &q.question)?.len();
        q.choices
            .iter()
            .map(|choice| {
                let full = Self::encode(tokenizer, &format!("{} {choice}", q.question))?;
                let cut = full.len().saturating_sub(window);
                Ok(Scored {
                    from: context.max(cut + 1).min(full.len()) - cut,
                    tokens: full[cut..].to_vec(),
                    norm: acc_norm_length(choice),
                })
            })
            .collect()
    }

    /// `text` cut into windows of `window` tokens (a last one of a single token is dropped).
    fn text_windows(tokenizer: &Tokenizer, text: &str, window: usize) -> Result<Vec<Vec<u32>>> {
        Ok(Self::encode(tokenizer, text)?
            .chunks(window)
            .filter(|c| c.len() >= 2)
            .map(<[u32]>::to_vec)
            .collect())
    }

    /// The tasks' token sequences, or a bug if [`ClassifierFamily::prepare`] was not called.
    fn tokenised(&self, task: usize) -> Result<&Tokenised> {
        self.tokenised
            .as_ref()
            .and_then(|t| t.get(task))
            .ok_or_else(|| EngineError::Bug("a causal-lm task was used before it was tokenised".into()))
    }

    /// `seqs` right-padded into one `[batch, longest]` tensor of token ids.
    fn padded<'s>(&self, seqs: impl ExactSizeIterator<Item = &'s [u32]> + Clone) -> Result<(Tensor, usize)> {
        let len = seqs.clone().map(<[u32]>::len).max().unwrap_or(0);
        let n = seqs.len();
        let mut ids = vec![0u32; n * len];
        for (row, s) in ids.chunks_mut(len.max(1)).zip(seqs) {
            row[..s.len()].copy_from_slice(s);
        }
        Ok((Tensor::from_vec(ids, (n, len), &self.device)?, len))
    }

    /// The log-likelihood `[n]` under `lm` of each of `seqs` (its tokens from `from` on), in one
    /// batch, differentiable.
    fn log_likelihoods(&self, lm: &CausalLm, seqs: &[&Scored]) -> Result<Tensor> {
        let (ids, len) = self.padded(seqs.iter().map(|s| s.tokens.as_slice()))?;
        let first = seqs.iter().map(|s| s.from).min().unwrap_or(1).max(1) - 1;
        if len <= first + 1 {
            // Nothing to score (choices that add no token).
            return Ok(Tensor::zeros(seqs.len(), DType::F32, &self.device)?);
        }
        let steps = len - 1 - first;
        // Position p's logits predict token p + 1.
        let log_p = candle_nn::ops::log_softmax(&lm.logits(&ids.narrow(1, 0, len - 1)?, first)?, D::Minus1)?;
        let targets = ids.narrow(1, first + 1, steps)?.contiguous()?.unsqueeze(2)?;
        let picked = log_p.gather(&targets, 2)?.squeeze(2)?;
        let mask: Vec<f32> = seqs
            .iter()
            .flat_map(|s| (first + 1..len).map(|p| if p >= s.from && p < s.tokens.len() { 1.0 } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (seqs.len(), steps), &self.device)?;
        Ok((picked * mask)?.sum(1)?)
    }

    fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
        Ok(tokenizer
            .encode(text, true)
            .map_err(|e| EngineError::evaluator(format!("the tokenizer failed: {e}")))?
            .get_ids()
            .to_vec())
    }
}

impl ScoresWeights for LmEvaluator {
    type Inputs = (LmConfig, Tokenizer);
    const FAMILY: &'static str = "causal-lm";

    suite_accessors!();

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
        let (config, tokenizer) = hf::locate_config_and_tokenizer(
            self.spec.config.as_deref(),
            self.spec.tokenizer.as_deref(),
            checkpoint,
            self.spec.base.as_deref(),
        )?;
        Ok((read_config(&config)?, hf::load_tokenizer(&tokenizer, usize::MAX / 2)?))
    }

    fn score_weights(
        &self,
        (config, tokenizer): &(LmConfig, Tokenizer),
        weights: HashMap<String, Tensor>,
        source: &Path,
        cancel: &AtomicBool,
    ) -> Result<EvalReport> {
        let mut lm = CausalLm::load(config, weights, &self.device, source)?;
        let window = self.window(config);
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
                        let mut best = (f64::NEG_INFINITY, 0usize, f64::NEG_INFINITY, 0usize);
                        for (k, s) in Self::choice_sequences(tokenizer, q, window)?.iter().enumerate() {
                            let ll: f64 = lm.score_tokens(&s.tokens, s.from)?.iter().map(|(lp, _)| lp).sum();
                            let norm = ll / s.norm;
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
                    let (mut nll, mut top1, mut count) = (0f64, 0usize, 0usize);
                    for chunk in Self::text_windows(tokenizer, text, window)? {
                        stop()?;
                        for (lp, best) in lm.score_tokens(&chunk, 1)? {
                            nll -= lp;
                            top1 += usize::from(best);
                            count += 1;
                        }
                    }
                    if count == 0 {
                        return Err(EngineError::evaluator(format!(
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

impl ClassifierFamily for LmEvaluator {
    type Net = CausalLm;

    fn build(
        &self,
        (config, _): &(LmConfig, Tokenizer),
        weights: HashMap<String, Tensor>,
        source: &Path,
    ) -> Result<CausalLm> {
        CausalLm::load_for_gradients(config, weights, &self.device, source)
    }

    fn prepare(&mut self, like: &Path) -> Result<()> {
        let (config, tokenizer) = self.inputs_for(like)?;
        let window = self.window(&config);
        let tokenised = self
            .tasks
            .iter()
            .map(|t| {
                Ok(match &t.data {
                    LmTaskData::MultipleChoice(qs) => Tokenised::Choices(
                        qs.iter()
                            .map(|q| Ok((Self::choice_sequences(&tokenizer, q, window)?, q.answer)))
                            .collect::<Result<_>>()?,
                    ),
                    LmTaskData::Text(text) => {
                        let windows = Self::text_windows(&tokenizer, text, window)?;
                        if windows.is_empty() {
                            return Err(EngineError::evaluator(format!(
                                "suite '{}', task '{}': its text is a single token; give it more text",
                                self.name, t.name
                            )));
                        }
                        Tokenised::Windows(windows)
                    }
                })
            })
            .collect::<Result<_>>()?;
        self.tokenised = Some(Arc::new(tokenised));
        Ok(())
    }

    fn examples(&self, task: usize) -> usize {
        match self.tokenised(task) {
            Ok(Tokenised::Choices(qs)) => qs.len(),
            Ok(Tokenised::Windows(w)) => w.len(),
            Err(_) => 0,
        }
    }

    fn rows(&self, task: usize, indices: &[usize]) -> usize {
        match self.tokenised(task) {
            Ok(Tokenised::Windows(w)) => indices.iter().map(|&i| w[i].len() - 1).sum(),
            _ => indices.len(),
        }
    }

    fn batch_size(&self) -> usize {
        self.spec.batch_size
    }

    fn logits(
        &self,
        _inputs: &(LmConfig, Tokenizer),
        lm: &CausalLm,
        task: usize,
        indices: &[usize],
    ) -> Result<(Tensor, Vec<usize>)> {
        match self.tokenised(task)? {
            Tokenised::Choices(qs) => {
                let chosen: Vec<&(Vec<Scored>, usize)> = indices.iter().map(|&i| &qs[i]).collect();
                let seqs: Vec<&Scored> = chosen.iter().flat_map(|(c, _)| c).collect();
                let norms: Vec<f32> = seqs.iter().map(|s| s.norm as f32).collect();
                let norms = Tensor::from_vec(norms, seqs.len(), &self.device)?;
                let scores = (self.log_likelihoods(lm, &seqs)? / norms)?;
                // [questions, most choices]: each question's scores, padded with NO_CHOICE.
                let widest = chosen.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
                let mut at = Vec::with_capacity(chosen.len() * widest);
                let mut next = 0u32;
                for (c, _) in &chosen {
                    for k in 0..widest {
                        at.push(if k < c.len() {
                            next + k as u32
                        } else {
                            seqs.len() as u32
                        });
                    }
                    next += c.len() as u32;
                }
                let padded = Tensor::cat(&[&scores, &Tensor::new(&[NO_CHOICE], &self.device)?], 0)?;
                let at = Tensor::from_vec(at, chosen.len() * widest, &self.device)?;
                let logits = padded.index_select(&at, 0)?.reshape((chosen.len(), widest))?;
                Ok((logits, chosen.iter().map(|(_, answer)| *answer).collect()))
            }
            Tokenised::Windows(windows) => {
                let chosen: Vec<&[u32]> = indices.iter().map(|&i| windows[i].as_slice()).collect();
                let (ids, len) = self.padded(chosen.iter().copied())?;
                let logits = lm.logits(&ids.narrow(1, 0, len - 1)?, 0)?;
                let vocab = logits.dim(2)?;
                // Each window's predicted positions, out of the padded ones.
                let (mut rows, mut labels) = (Vec::new(), Vec::new());
                for (b, w) in chosen.iter().enumerate() {
                    for (j, next) in w.iter().enumerate().skip(1) {
                        rows.push((b * (len - 1) + j - 1) as u32);
                        labels.push(*next as usize);
                    }
                }
                let rows = Tensor::from_vec(rows, labels.len(), &self.device)?;
                let logits = logits
                    .reshape((chosen.len() * (len - 1), vocab))?
                    .index_select(&rows, 0)?;
                Ok((logits, labels))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::acc_norm_length;

    /// The choice `acc_norm` picks from per-choice log-likelihoods.
    fn acc_norm_pick(choices: &[&str], log_likelihoods: &[f64]) -> usize {
        let scores: Vec<f64> = choices
            .iter()
            .zip(log_likelihoods)
            .map(|(c, ll)| ll / acc_norm_length(c))
            .collect();
        (0..scores.len()).fold(0, |best, i| if scores[i] > scores[best] { i } else { best })
    }

    #[test]
    fn acc_norm_divides_by_characters_without_the_delimiter_as_lm_eval() {
        // lm-eval's completion_len = len(choice) in Python: code points.
        assert_eq!(acc_norm_length("green"), 5.0);
        assert_eq!(acc_norm_length("é"), 1.0);
        assert_eq!(acc_norm_length("über"), 4.0);
        assert_eq!(acc_norm_length("日本語"), 3.0);
        assert_eq!(acc_norm_length(""), 1.0);
        // By hand with lm-eval's rule: "é" -2.0 / 1 = -2.0, "ab" -3.9 / 2 = -1.95, so "ab"; the
        // former rule (bytes with the leading space) gave -2.0 / 3 = -0.67 and -3.9 / 3 = -1.3,
        // so "é".
        assert_eq!(acc_norm_pick(&["é", "ab"], &[-2.0, -3.9]), 1);
        // "日本" -4.0 / 2 = -2.0 against "abc" -6.3 / 3 = -2.1: "日本" (by its 7 bytes with the
        // space, -0.57 against -1.58, it won as well).
        assert_eq!(acc_norm_pick(&["日本", "abc"], &[-4.0, -6.3]), 0);
    }
}
