//! Building the text benchmark on a pretrained BERT-family backbone (all-MiniLM-L6-v2), the
//! demo's protocol on a real transformer:
//! 1. **Heads**: a linear probe per task on the frozen backbone's pooled features
//!    (`tanh(W h[CLS] + b)`, what `BertForSequenceClassification` reads), trained with AdamW on
//!    [`TEXT_HEAD_SHOTS`] examples per class of the train split (or all of it), then frozen. The
//!    base with these heads is the linear-probe baseline.
//! 2. **Experts**: full fine-tuning of the encoder and pooler on each task through its frozen
//!    head (AdamW, linear warm-up then linear decay, seeded minibatches), so task vectors live
//!    in the encoder only; or, with [`FineTuning::Lora`], LoRA factors of the layers' attention
//!    and MLP matrices ([`super::lora`]), the expert written merged and its adapter beside it.
//!
//! A build folder holds `base/` and `experts/<task>/` (Hugging Face folders: `config.json`,
//! `tokenizer.json`, `model.safetensors` with the backbone's tensor names), `heads/<task>.safetensors`
//! (`classifier.weight`, `classifier.bias`: what [`ClassifierHead`](crate::family::head::ClassifierHead)
//! reads), `data/<task>.<split>.jsonl`, `suite.toml` (a `bert` suite over all of it) and
//! `manifest.json`; a LoRA build adds `adapters/<task>/` (PEFT adapters over `base/`). It is written into a temporary sibling folder and renamed into place.

use super::data::{TextSplit, TextTask, Tokenized};
use super::lora::{FineTuning, LoraFactors};
use crate::demo::{BuildProgress, kernel_path_on, open_build, save_params, write_manifest};
use crate::family::bert::{self, BertEncoder, Linears, TokenBatch};
use crate::family::hf;
use crate::nn::{Params, cross_entropy};
use crate::train::{BatchSize, Batcher, OptimConfig, Optimizer, to_vars};
use candle_core::{D, DType, Device, Tensor, Var};
use candle_transformers::models::bert::Config;
use mergescope_engine::error::{EngineError, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Version of the text build recipe, task data included: a build by another version is
/// rebuilt. 2: `cldr_language` (Unicode CLDR) replaced the GPL `fortune_language`.
pub const TEXT_RECIPE_VERSION: u32 = 2;

/// Examples per class the default recipe trains each linear probe on: few-shot heads, weak the
/// way the zero-shot heads of the task-vector papers are (the image demo's
/// [`crate::demo::HEAD_SHOTS`]), so that each expert gains much over the probe (measured in
/// docs/text-benchmark.md).
pub const TEXT_HEAD_SHOTS: usize = 10;

/// Settings of a text-benchmark build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextRecipe {
    /// Tokens kept per example (at most 128).
    pub max_length: usize,
    /// Full-batch AdamW steps of each linear probe.
    pub head_steps: usize,
    /// Learning rate of the probes.
    pub head_lr: f64,
    /// Examples per class each probe is trained on (the first ones of each class of the train
    /// split); `None`: the whole train split.
    pub head_shots: Option<usize>,
    /// Fine-tuning steps of each expert.
    pub expert_steps: usize,
    /// Examples per fine-tuning step.
    pub batch_size: usize,
    /// Peak learning rate of the experts' AdamW.
    pub lr: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Steps of linear warm-up from 0 to `lr` (then linear decay to 0).
    pub warmup_steps: usize,
    /// Keep at most this many train examples per task (`None`: all).
    pub max_train: Option<usize>,
    /// Keep at most this many calibration and test examples per task (`None`: all).
    pub max_eval: Option<usize>,
    /// Seed of head initialisation and minibatch order (and of LoRA's A factors).
    pub seed: u64,
    /// How the experts are fine-tuned: every tensor, or LoRA factors. Absent (builds before
    /// LoRA, and full builds, which leave it out): full.
    #[serde(default, skip_serializing_if = "FineTuning::is_full")]
    pub fine_tuning: FineTuning,
}

impl TextRecipe {
    /// The default recipe for `seed`.
    pub fn default_for(seed: u64) -> TextRecipe {
        TextRecipe {
            max_length: 32,
            head_steps: 300,
            head_lr: 1e-2,
            head_shots: Some(TEXT_HEAD_SHOTS),
            expert_steps: 120,
            batch_size: 32,
            lr: 1e-4,
            weight_decay: 0.01,
            warmup_steps: 12,
            max_train: None,
            max_eval: None,
            seed,
            fine_tuning: FineTuning::Full,
        }
    }

    /// The default recipe for `seed` with LoRA of rank `rank` (alpha 2·rank, every weight of
    /// [`super::lora::LORA_TARGETS`]) at LoRA's learning rate [`super::lora::TEXT_LORA_LR`].
    pub fn lora_for(seed: u64, rank: usize) -> TextRecipe {
        TextRecipe {
            lr: super::lora::TEXT_LORA_LR,
            fine_tuning: FineTuning::Lora(super::lora::LoraRecipe::new(rank)),
            ..TextRecipe::default_for(seed)
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Param(format!("text benchmark recipe: {m}")));
        if !(1..=128).contains(&self.max_length) {
            return bad(format!("max_length {} must be between 1 and 128", self.max_length));
        }
        if self.batch_size == 0 || self.head_shots == Some(0) {
            return bad("batch_size and head_shots must be at least 1".into());
        }
        if !(self.lr > 0.0 && self.head_lr > 0.0) {
            return bad("learning rates must be positive".into());
        }
        if let FineTuning::Lora(l) = &self.fine_tuning {
            l.validate()?;
        }
        Ok(())
    }

    /// The learning rate of step `step` (0-based): linear warm-up, then linear decay.
    pub fn lr_at(&self, step: usize) -> f64 {
        let s = step as f64 + 1.0;
        if step < self.warmup_steps {
            return self.lr * s / self.warmup_steps as f64;
        }
        let rest = (self.expert_steps.saturating_sub(self.warmup_steps)).max(1) as f64;
        self.lr * (1.0 - (s - 1.0 - self.warmup_steps as f64) / rest).max(0.0)
    }
}

/// One task of a built text benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextBenchTask {
    /// Task name.
    pub name: String,
    /// Class names.
    pub classes: Vec<String>,
    /// Examples per split (train, calibration, test) used.
    pub examples: BTreeMap<String, usize>,
    /// The base's (linear probe's) accuracy, per split.
    pub base_accuracy: BTreeMap<String, f64>,
    /// The expert's accuracy on its own task, per split.
    pub expert_accuracy: BTreeMap<String, f64>,
    /// Mean loss of the expert's last 10 steps.
    pub expert_final_loss: f64,
}

/// `manifest.json` of a text benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextManifest {
    /// Recipe version.
    pub recipe_version: u32,
    /// mergescope version that built it.
    pub mergescope_version: String,
    /// The backbone folder it was built from, and the SHA-256 of its weights file.
    pub backbone: String,
    /// SHA-256 of the backbone's weights.
    pub backbone_sha256: String,
    /// The recipe.
    pub recipe: TextRecipe,
    /// Tasks, in suite order.
    pub tasks: Vec<TextBenchTask>,
    /// Seconds per stage (tokenise, heads, experts with their evaluation, write) and of each
    /// expert's fine-tuning alone (`fine-tune <task>`).
    pub seconds: BTreeMap<String, f64>,
    /// The matrix-kernel path ([`kernel_path_on`]).
    pub kernel_path: String,
}

/// A loaded backbone: config, tokenizer and float weights.
pub struct Backbone {
    /// Its folder.
    pub dir: PathBuf,
    /// The BERT config.
    pub config: Config,
    /// Tokenizer, truncating to the recipe's length.
    pub tokenizer: tokenizers::Tokenizer,
    /// Every float tensor (f32), by the names the checkpoint uses.
    pub weights: Params,
}

impl Backbone {
    /// Loads a Hugging Face BERT folder (`config.json`, `tokenizer.json`, `model.safetensors`),
    /// truncating inputs to `max_length` tokens.
    pub fn load(dir: &Path, max_length: usize, device: &Device) -> Result<Backbone> {
        let fix = "point --backbone at the all-MiniLM-L6-v2 folder that scripts/fetch-minilm.sh unpacks (~/.cache/mergescope/all-minilm-l6-v2)";
        for f in ["config.json", "tokenizer.json", "model.safetensors"] {
            if !dir.join(f).is_file() {
                return Err(EngineError::invalid(format!(
                    "the backbone folder '{}' has no {f}; {fix}",
                    dir.display()
                )));
            }
        }
        let config = bert::read_config(&dir.join("config.json"))?;
        let tokenizer = hf::load_tokenizer(&dir.join("tokenizer.json"), max_length)?;
        let weights: Params = hf::load_weights(&dir.join("model.safetensors"), device)?
            .into_iter()
            .collect();
        if !weights.contains_key("pooler.dense.weight") {
            return Err(EngineError::invalid(format!(
                "'{}' has no pooler.dense.weight (or uses the bert. prefix of a task model); the text benchmark needs a bare BERT model with its pooler; {fix}",
                dir.join("model.safetensors").display()
            )));
        }
        Ok(Backbone {
            dir: dir.to_owned(),
            config,
            tokenizer,
            weights,
        })
    }

    /// The encoder over `weights` (this backbone's tensors, or a variant of them).
    pub(crate) fn encoder(&self, weights: &Params, device: &Device) -> Result<BertEncoder> {
        self.encoder_with(weights, &Linears::AsLoaded, device)
    }

    /// The encoder over `weights`, its layers' linear maps computed as `linears` says (LoRA's
    /// frozen weights and side paths).
    pub(crate) fn encoder_with(&self, weights: &Params, linears: &Linears, device: &Device) -> Result<BertEncoder> {
        let map: HashMap<String, Tensor> = weights.iter().map(|(k, t)| (k.clone(), t.clone())).collect();
        BertEncoder::load_with(&self.config, map, linears, device, &self.dir)
    }

    pub(crate) fn pad_id(&self) -> u32 {
        self.config.pad_token_id as u32
    }
}

/// A frozen linear head: logits = x Wᵀ + b.
#[derive(Clone, Debug)]
pub struct LinearHead {
    /// `[classes, hidden]`.
    pub weight: Tensor,
    /// `[classes]`.
    pub bias: Tensor,
}

impl LinearHead {
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)?)
    }
}

fn pooled(encoder: &BertEncoder, batch: &TokenBatch) -> Result<Tensor> {
    encoder
        .pooled(batch)?
        .ok_or_else(|| EngineError::Bug("the pooler vanished after loading".into()))
}

/// Batches of indices of `tok`, longest first (less padding); order does not change accuracy.
fn eval_batches(tok: &Tokenized, size: usize) -> Vec<Vec<usize>> {
    let mut idx: Vec<usize> = (0..tok.len()).collect();
    idx.sort_by_key(|&i| std::cmp::Reverse(tok.ids[i].len()));
    idx.chunks(size.max(1)).map(<[usize]>::to_vec).collect()
}

/// Pooled features of every example of `tok`, `[n, hidden]`, in example order.
fn features(backbone: &Backbone, weights: &Params, tok: &Tokenized, device: &Device) -> Result<Tensor> {
    let encoder = backbone.encoder(weights, device)?;
    let mut parts = Vec::new();
    for chunk in (0..tok.len()).collect::<Vec<_>>().chunks(64) {
        let (batch, _) = tok.batch(chunk, backbone.pad_id(), device)?;
        parts.push(pooled(&encoder, &batch)?);
    }
    Ok(Tensor::cat(&parts, 0)?.detach())
}

/// Accuracy of `weights` with `head` on `tok`.
pub fn accuracy(
    backbone: &Backbone,
    weights: &Params,
    head: &LinearHead,
    tok: &Tokenized,
    device: &Device,
) -> Result<f64> {
    let encoder = backbone.encoder(weights, device)?;
    let mut right = 0usize;
    for idx in eval_batches(tok, 64) {
        let (batch, labels) = tok.batch(&idx, backbone.pad_id(), device)?;
        let pred = head.logits(&pooled(&encoder, &batch)?)?.argmax(D::Minus1)?;
        right += pred.eq(&labels)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? as usize;
    }
    Ok(right as f64 / tok.len().max(1) as f64)
}

/// Deterministic uniform init in ±1/√hidden (PyTorch's `nn.Linear` range) from `seed`.
fn init_head(classes: usize, hidden: usize, seed: u64, device: &Device) -> Result<LinearHead> {
    let mut rng = mergescope_engine::rng::SplitMix64::new(seed);
    let bound = 1.0 / (hidden as f64).sqrt();
    let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32).collect() };
    Ok(LinearHead {
        weight: Tensor::from_vec(draw(classes * hidden), (classes, hidden), device)?,
        bias: Tensor::from_vec(draw(classes), classes, device)?,
    })
}

/// Indices of the examples a probe is trained on: all, or the first `shots` of each class.
fn head_indices(tok: &Tokenized, classes: usize, shots: Option<usize>) -> Vec<usize> {
    let Some(k) = shots else {
        return (0..tok.len()).collect();
    };
    let mut taken = vec![0usize; classes];
    (0..tok.len())
        .filter(|&i| {
            let n = &mut taken[tok.labels[i] as usize];
            *n += 1;
            *n <= k
        })
        .collect()
}

/// Trains a linear probe on fixed features (full-batch AdamW).
fn train_head(
    feats: &Tensor,
    labels: &Tensor,
    classes: usize,
    recipe: &TextRecipe,
    stream: u64,
    on_step: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<LinearHead> {
    let init = init_head(classes, feats.dim(1)?, recipe.seed ^ stream, feats.device())?;
    let (w, b) = (Var::from_tensor(&init.weight)?, Var::from_tensor(&init.bias)?);
    let mut opt = Optimizer::new(OptimConfig::adamw(recipe.head_lr, 1e-4), vec![w.clone(), b.clone()])?;
    for _ in 0..recipe.head_steps {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let head = LinearHead {
            weight: w.as_tensor().clone(),
            bias: b.as_tensor().clone(),
        };
        let loss = cross_entropy(&head.logits(feats)?, labels)?;
        opt.step(&loss.backward()?)?;
        on_step(loss.to_scalar::<f32>()?);
    }
    Ok(LinearHead {
        weight: w.as_tensor().detach(),
        bias: b.as_tensor().detach(),
    })
}

/// A fine-tuned expert.
struct Expert {
    /// The dense model (with LoRA: the backbone with the updates merged in).
    weights: Params,
    /// LoRA's factors, for the adapter.
    lora: Option<LoraFactors>,
    /// Mean loss of the last 10 steps.
    final_loss: f64,
}

/// One expert's fine-tuning: the backbone, the task's frozen head and tokens, the recipe and the
/// task's seed stream.
struct FineTuneJob<'a> {
    backbone: &'a Backbone,
    head: &'a LinearHead,
    tok: &'a Tokenized,
    recipe: &'a TextRecipe,
    stream: u64,
    device: &'a Device,
    cancel: &'a AtomicBool,
}

/// Fine-tunes the backbone on the job's task through its frozen head: every weight, or LoRA
/// factors (as the recipe says).
fn fine_tune(job: &FineTuneJob<'_>, on_step: &mut dyn FnMut(f32)) -> Result<Expert> {
    let weights = &job.backbone.weights;
    match &job.recipe.fine_tuning {
        FineTuning::Full => {
            let vars = to_vars(weights)?;
            let trainable = vars.iter().map(|(_, v)| v.clone()).collect();
            let encoder = || job.backbone.encoder(&crate::train::from_vars(&vars), job.device);
            let final_loss = train_steps(job, trainable, &encoder, on_step)?;
            Ok(Expert {
                weights: crate::train::detached(&vars),
                lora: None,
                final_loss,
            })
        }
        FineTuning::Lora(l) => {
            let factors = LoraFactors::init(weights, l, job.recipe.seed, 0x10AA ^ job.stream, job.device)?;
            let linears = factors.linears();
            let encoder = || job.backbone.encoder_with(weights, &linears, job.device);
            let final_loss = train_steps(job, factors.vars(), &encoder, on_step)?;
            Ok(Expert {
                weights: factors.merged(weights)?,
                lora: Some(factors),
                final_loss,
            })
        }
    }
}

/// The training loop: `recipe.expert_steps` AdamW steps on `trainable`, the encoder built by
/// `encoder` at each step (over the variables, or the frozen backbone with LoRA's side paths);
/// returns the mean loss of the last 10 steps.
fn train_steps(
    job: &FineTuneJob<'_>,
    trainable: Vec<Var>,
    encoder: &dyn Fn() -> Result<BertEncoder>,
    on_step: &mut dyn FnMut(f32),
) -> Result<f64> {
    let FineTuneJob {
        backbone,
        head,
        tok,
        recipe,
        stream,
        device,
        cancel,
    } = *job;
    let mut opt = Optimizer::new(OptimConfig::adamw(recipe.lr, recipe.weight_decay), trainable)?;
    let mut batcher = Batcher::new(tok.len(), BatchSize::Size(recipe.batch_size), recipe.seed, stream);
    let mut last = Vec::new();
    for step in 0..recipe.expert_steps {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        opt.set_lr(recipe.lr_at(step));
        let idx = batcher.next_batch();
        let loss = batch_loss(backbone, &encoder()?, head, tok, &idx, device)?;
        let value = loss.to_scalar::<f32>()?;
        if !value.is_finite() {
            return Err(EngineError::Diverged {
                step: step + 1,
                loss: value,
                lr: recipe.lr,
            });
        }
        opt.step(&loss.backward()?)?;
        last.push(f64::from(value));
        on_step(value);
    }
    let tail = &last[last.len().saturating_sub(10)..];
    Ok(tail.iter().sum::<f64>() / tail.len().max(1) as f64)
}

fn io(what: &'static str, path: &Path, e: std::io::Error) -> EngineError {
    EngineError::io(what, path, e)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| io("cannot write", path, e))
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| io("cannot read", path, e))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| io("cannot read", path, e))?;
    Ok(format!("{:x}", h.finalize()))
}

/// Writes a Hugging Face folder: the backbone's config and tokenizer and `weights`.
fn write_model(dir: &Path, backbone: &Backbone, weights: &Params, role: &str) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io("cannot create", dir, e))?;
    for f in ["config.json", "tokenizer.json"] {
        let from = backbone.dir.join(f);
        std::fs::copy(&from, dir.join(f)).map_err(|e| io("cannot copy", &from, e))?;
    }
    let meta: BTreeMap<String, String> = [
        ("format", "pt".to_owned()),
        ("mergescope.version", env!("CARGO_PKG_VERSION").to_owned()),
        ("mergescope.text_bench.role", role.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    save_params(&dir.join("model.safetensors"), weights, &meta)
}

fn toml_string(s: &str) -> String {
    let escaped: String = s
        .chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// The suite TOML over a build folder (paths relative to it).
pub fn suite_toml(name: &str, tasks: &[TextTask], max_length: usize) -> String {
    let mut s = format!(
        "# The text benchmark built by `mergescope demo build --benchmark text` (see manifest.json).\nname = {}\n\n[model]\nfamily = \"bert\"\nmax_length = {max_length}\nbatch_size = 64\n",
        toml_string(name)
    );
    for t in tasks {
        let labels: Vec<String> = t.classes.iter().map(|c| toml_string(c)).collect();
        s.push_str(&format!(
            "\n[[task]]\nname = {}\ndata = \"data/{}\"\ncalibration = \"data/{}\"\ntrain = \"data/{}\"\nhead = \"heads/{}.safetensors\"\nlabels = [{}]\n",
            toml_string(&t.name),
            t.file_name(TextSplit::Test),
            t.file_name(TextSplit::Calibration),
            t.file_name(TextSplit::Train),
            t.name,
            labels.join(", ")
        ));
    }
    let experts: Vec<String> = tasks
        .iter()
        .map(|t| toml_string(&format!("experts/{}", t.name)))
        .collect();
    s.push_str(&format!(
        "\n[models]\nbase = \"base\"\nexperts = [{}]\n",
        experts.join(", ")
    ));
    s
}

/// A built text benchmark on disk.
#[derive(Clone, Debug)]
pub struct TextBenchmark {
    /// Its folder.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: TextManifest,
}

impl TextBenchmark {
    /// Opens a built text benchmark, checking that its suite and models are there.
    pub fn open(dir: &Path) -> Result<TextBenchmark> {
        let rebuild = "mergescope demo build --benchmark text --force";
        let manifest = open_build(dir, "text benchmark", rebuild, |m: &TextManifest| {
            let mut needed = vec![dir.join("suite.toml"), dir.join("base/model.safetensors")];
            for t in &m.tasks {
                needed.push(dir.join("experts").join(&t.name).join("model.safetensors"));
                needed.push(dir.join("heads").join(format!("{}.safetensors", t.name)));
                if !m.recipe.fine_tuning.is_full() {
                    needed.push(
                        dir.join("adapters")
                            .join(&t.name)
                            .join(mergescope_interop::lora::WEIGHTS_FILE),
                    );
                }
            }
            needed
        })?;
        Ok(TextBenchmark {
            dir: dir.to_owned(),
            manifest,
        })
    }

    /// Its suite file.
    pub fn suite_path(&self) -> PathBuf {
        self.dir.join("suite.toml")
    }

    /// Whether the current recipe built it.
    pub fn is_current(&self) -> bool {
        self.manifest.recipe_version == TEXT_RECIPE_VERSION
    }
}

/// The cache folder of the text benchmark of `seed`: `<cache>/demo/text-minilm-seed<N>`.
pub fn text_demo_dir(seed: u64) -> Result<PathBuf> {
    Ok(crate::demo::cache_dir()?
        .join("demo")
        .join(format!("text-minilm-seed{seed}")))
}

/// Builds the text benchmark of `tasks` on `backbone_dir` into `dir`. It is written into a
/// temporary sibling folder and renamed into place once complete; an existing `dir` is
/// replaced only then (a failed or cancelled build leaves it as it was).
pub fn build_text(
    backbone_dir: &Path,
    tasks: &[TextTask],
    recipe: &TextRecipe,
    dir: &Path,
    device: &Device,
    progress: &mut dyn FnMut(&BuildProgress),
    cancel: &AtomicBool,
) -> Result<TextBenchmark> {
    recipe.validate()?;
    if tasks.is_empty() {
        return Err(EngineError::invalid("a text benchmark needs at least one task"));
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io("cannot create", &parent, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".building-text-")
        .tempdir_in(&parent)
        .map_err(|e| io("cannot create a folder in", &parent, e))?;
    let manifest = build_into(backbone_dir, tasks, recipe, tmp.path(), device, progress, cancel)?;
    let staged = tmp.keep();
    if dir.exists()
        && let Err(e) = std::fs::remove_dir_all(dir)
    {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(io("cannot replace", dir, e));
    }
    if let Err(e) = std::fs::rename(&staged, dir) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(io("cannot move the build to", dir, e));
    }
    Ok(TextBenchmark {
        dir: dir.to_owned(),
        manifest,
    })
}

fn build_into(
    backbone_dir: &Path,
    tasks: &[TextTask],
    recipe: &TextRecipe,
    out: &Path,
    device: &Device,
    progress: &mut dyn FnMut(&BuildProgress),
    cancel: &AtomicBool,
) -> Result<TextManifest> {
    let mut seconds = BTreeMap::new();
    let clock = Instant::now();
    let backbone = Backbone::load(backbone_dir, recipe.max_length, device)?;
    let mut tasks: Vec<TextTask> = tasks.to_vec();
    for t in &mut tasks {
        if let Some(n) = recipe.max_train {
            t.truncate(TextSplit::Train, n);
        }
        if let Some(n) = recipe.max_eval {
            t.truncate(TextSplit::Calibration, n);
            t.truncate(TextSplit::Test, n);
        }
    }
    let tokenized: Vec<BTreeMap<TextSplit, Tokenized>> = tasks
        .iter()
        .map(|t| {
            TextSplit::ALL
                .iter()
                .map(|&s| Ok((s, Tokenized::new(&backbone.tokenizer, t.split(s))?)))
                .collect::<Result<_>>()
        })
        .collect::<Result<_>>()?;
    seconds.insert("load_and_tokenise".to_owned(), clock.elapsed().as_secs_f64());

    let total = tasks.len() * (recipe.head_steps + recipe.expert_steps) + 1;
    let mut done = 0usize;
    let mut report = BuildProgress::reporter(progress, total);
    let tok = |i: usize, s: TextSplit| -> Result<&Tokenized> {
        tokenized[i]
            .get(&s)
            .ok_or_else(|| EngineError::Bug(format!("split {s:?} was not tokenised")))
    };

    // 1. Linear probes on the frozen backbone's pooled features.
    let clock = Instant::now();
    let mut heads = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let train = tok(i, TextSplit::Train)?;
        let idx = head_indices(train, t.classes.len(), recipe.head_shots);
        let (ids, type_ids) = (
            idx.iter().map(|&j| train.ids[j].clone()).collect(),
            idx.iter().map(|&j| train.type_ids[j].clone()).collect(),
        );
        let labels: Vec<u32> = idx.iter().map(|&j| train.labels[j]).collect();
        let subset = Tokenized {
            ids,
            type_ids,
            labels: labels.clone(),
        };
        let feats = features(&backbone, &backbone.weights, &subset, device)?;
        let labels = Tensor::from_vec(labels, idx.len(), device)?;
        let stage = format!("head {}", t.name);
        let head = train_head(
            &feats,
            &labels,
            t.classes.len(),
            recipe,
            0x7E57 + i as u64,
            &mut |l| {
                done += 1;
                report(&stage, done, Some(l));
            },
            cancel,
        )?;
        heads.push(head);
    }
    seconds.insert("heads".to_owned(), clock.elapsed().as_secs_f64());

    // 2. Experts, and the accuracies of base and expert per task.
    let clock = Instant::now();
    let mut results = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let stage = format!("expert {}", t.name);
        let task_clock = Instant::now();
        let job = FineTuneJob {
            backbone: &backbone,
            head: &heads[i],
            tok: tok(i, TextSplit::Train)?,
            recipe,
            stream: 0xE0 + i as u64,
            device,
            cancel,
        };
        let expert = fine_tune(&job, &mut |l| {
            done += 1;
            report(&stage, done, Some(l));
        })?;
        seconds.insert(format!("fine-tune {}", t.name), task_clock.elapsed().as_secs_f64());
        let mut base_accuracy = BTreeMap::new();
        let mut expert_accuracy = BTreeMap::new();
        for s in [TextSplit::Calibration, TextSplit::Test] {
            let data = tok(i, s)?;
            base_accuracy.insert(
                s.name().to_owned(),
                accuracy(&backbone, &backbone.weights, &heads[i], data, device)?,
            );
            expert_accuracy.insert(
                s.name().to_owned(),
                accuracy(&backbone, &expert.weights, &heads[i], data, device)?,
            );
        }
        write_model(
            &out.join("experts").join(&t.name),
            &backbone,
            &expert.weights,
            &format!("expert {}", t.name),
        )?;
        if let (Some(factors), FineTuning::Lora(l)) = (&expert.lora, &recipe.fine_tuning) {
            factors.write_adapter(
                &out.join("adapters").join(&t.name),
                l,
                &backbone_dir.display().to_string(),
            )?;
        }
        results.push(TextBenchTask {
            name: t.name.clone(),
            classes: t.classes.clone(),
            examples: TextSplit::ALL
                .iter()
                .map(|&s| (s.name().to_owned(), t.split(s).len()))
                .collect(),
            base_accuracy,
            expert_accuracy,
            expert_final_loss: expert.final_loss,
        });
    }
    seconds.insert("experts".to_owned(), clock.elapsed().as_secs_f64());

    // 3. Base, heads, data, suite and manifest.
    if cancel.load(Ordering::Relaxed) {
        return Err(EngineError::Cancelled);
    }
    let clock = Instant::now();
    write_model(&out.join("base"), &backbone, &backbone.weights, "base")?;
    let heads_dir = out.join("heads");
    let data_dir = out.join("data");
    for d in [&heads_dir, &data_dir] {
        std::fs::create_dir_all(d).map_err(|e| io("cannot create", d, e))?;
    }
    for (t, h) in tasks.iter().zip(&heads) {
        let p: Params = [
            (bert::HEAD_WEIGHT.to_owned(), h.weight.clone()),
            (bert::HEAD_BIAS.to_owned(), h.bias.clone()),
        ]
        .into_iter()
        .collect();
        let meta = [("format".to_owned(), "pt".to_owned())].into_iter().collect();
        save_params(&heads_dir.join(format!("{}.safetensors", t.name)), &p, &meta)?;
        for s in TextSplit::ALL {
            let text = t.files.get(&s).map(String::as_str).unwrap_or("");
            write_file(&data_dir.join(t.file_name(s)), text.as_bytes())?;
        }
    }
    let name = format!("text-minilm-seed{}", recipe.seed);
    write_file(
        &out.join("suite.toml"),
        suite_toml(&name, &tasks, recipe.max_length).as_bytes(),
    )?;
    seconds.insert("write".to_owned(), clock.elapsed().as_secs_f64());
    let manifest = TextManifest {
        recipe_version: TEXT_RECIPE_VERSION,
        mergescope_version: env!("CARGO_PKG_VERSION").to_owned(),
        backbone: backbone_dir.display().to_string(),
        backbone_sha256: sha256_file(&backbone_dir.join("model.safetensors"))?,
        recipe: recipe.clone(),
        tasks: results,
        seconds,
        kernel_path: kernel_path_on(device),
    };
    write_manifest(out, &manifest)?;
    done += 1;
    report("done", done, None);
    Ok(manifest)
}

/// Mean cross-entropy of the examples `idx` of `tok` through `encoder` and the frozen `head`:
/// the text benchmark's training loss (the experts' minibatches, the seed-004 oracle's full
/// batches).
pub(crate) fn batch_loss(
    backbone: &Backbone,
    encoder: &BertEncoder,
    head: &LinearHead,
    tok: &Tokenized,
    idx: &[usize],
    device: &Device,
) -> Result<Tensor> {
    let (batch, labels) = tok.batch(idx, backbone.pad_id(), device)?;
    cross_entropy(&head.logits(&pooled(encoder, &batch)?)?, &labels)
}

/// The seed stream of the minibatches of the expert of task `index` (in the build's task
/// order): what [`build_text`] fine-tunes task `index` with, so a caller of
/// [`fine_tune_snapshots`] with the build's recipe and this stream remakes the build's expert.
pub fn expert_stream(index: usize) -> u64 {
    0xE0 + index as u64
}

/// One expert's fine-tuning as the build makes it, for callers that vary the recipe (seed
/// 002's sweeps): `recipe`'s fine-tuning of `backbone` (every tensor, or LoRA factors; AdamW
/// with warm-up and decay over `recipe.expert_steps`, minibatches of `recipe.batch_size` drawn
/// by `recipe.seed` and `stream`) through the frozen `head` on `tok`. After each step listed in
/// `snapshots` the dense model (with LoRA: W + (alpha/r)·B·A) is handed to `snapshot` (to
/// save or copy there: its tensors may share storage that later steps update), whose error
/// ends the run; `on_step` hears every step's loss; `cancel` stops it between steps. A
/// step whose loss is not finite ends it with [`EngineError::Diverged`]. Returns the mean loss
/// of the last 10 steps.
#[allow(clippy::too_many_arguments)]
pub fn fine_tune_snapshots(
    backbone: &Backbone,
    head: &LinearHead,
    tok: &Tokenized,
    recipe: &TextRecipe,
    stream: u64,
    device: &Device,
    snapshots: &[usize],
    snapshot: &mut dyn FnMut(usize, Params) -> Result<()>,
    on_step: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<f64> {
    recipe.validate()?;
    if tok.is_empty() {
        return Err(EngineError::invalid("fine-tuning needs at least one training example"));
    }
    // The loop stops at the next step when `cancel` is set or a snapshot could not be saved.
    let stop = AtomicBool::new(cancel.load(Ordering::Relaxed));
    let job = FineTuneJob {
        backbone,
        head,
        tok,
        recipe,
        stream,
        device,
        cancel: &stop,
    };
    let mut saved: Result<()> = Ok(());
    let mut step = 0usize;
    let mut after = |loss: f32, dense: &dyn Fn() -> Result<Params>| {
        on_step(loss);
        step += 1;
        if saved.is_ok() && snapshots.contains(&step) {
            saved = dense().and_then(|p| snapshot(step, p));
        }
        if saved.is_err() || cancel.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let weights = &backbone.weights;
    let run = match &recipe.fine_tuning {
        FineTuning::Full => {
            let vars = to_vars(weights)?;
            let trainable = vars.iter().map(|(_, v)| v.clone()).collect();
            let encoder = || backbone.encoder(&crate::train::from_vars(&vars), device);
            let dense = || Ok(crate::train::detached(&vars));
            train_steps(&job, trainable, &encoder, &mut |l| after(l, &dense))
        }
        FineTuning::Lora(l) => {
            let factors = LoraFactors::init(weights, l, recipe.seed, 0x10AA ^ stream, device)?;
            let linears = factors.linears();
            let encoder = || backbone.encoder_with(weights, &linears, device);
            let dense = || factors.merged(weights);
            train_steps(&job, factors.vars(), &encoder, &mut |l| after(l, &dense))
        }
    };
    saved?;
    run
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::text_bench::data::builtin_tasks;
    use crate::text_bench::tiny::{tasks_named, tiny_backbone};

    /// The built-in tasks named in `names`, in the built-in order.
    #[test]
    fn the_learning_rate_warms_up_then_decays_to_zero() {
        let mut r = TextRecipe::default_for(0);
        (r.expert_steps, r.warmup_steps, r.lr) = (10, 2, 1.0);
        let lrs: Vec<f64> = (0..10).map(|s| r.lr_at(s)).collect();
        assert_eq!(lrs[..3], [0.5, 1.0, 1.0]);
        assert!(lrs.windows(2).skip(2).all(|w| w[1] < w[0]), "{lrs:?}");
        assert!(lrs[9] > 0.0 && lrs[9] < 0.2, "{lrs:?}");
        r.warmup_steps = 0;
        assert_eq!(r.lr_at(0), 1.0);
    }

    #[test]
    fn probes_take_the_first_shots_of_each_class() {
        let tok = Tokenized {
            ids: vec![vec![1]; 6],
            type_ids: vec![vec![0]; 6],
            labels: vec![0, 0, 1, 0, 1, 1],
        };
        assert_eq!(head_indices(&tok, 2, Some(2)), [0, 1, 2, 4]);
        assert_eq!(head_indices(&tok, 2, None).len(), 6);
    }

    #[test]
    fn the_suite_names_every_task_with_its_files_and_labels() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = builtin_tasks().unwrap();
        std::fs::write(dir.path().join("suite.toml"), suite_toml("s \"q\"", &tasks, 32)).unwrap();
        // The suite parses with the evaluator's own reader (files are not needed to parse).
        let text = std::fs::read_to_string(dir.path().join("suite.toml")).unwrap();
        let v: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(v["name"].as_str(), Some("s \"q\""));
        let t = v["task"].as_array().unwrap();
        assert_eq!(t.len(), 5);
        assert_eq!(t[0]["head"].as_str(), Some("heads/cldr_language.safetensors"));
        assert_eq!(t[0]["labels"].as_array().unwrap().len(), 6);
        assert_eq!(t[1]["labels"].as_array().unwrap().len(), 8);
        assert_eq!(v["models"]["experts"].as_array().unwrap().len(), 5);
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Singular values of a row-major matrix, largest first.
    fn singular_values(m: &[f32], rows: usize, cols: usize) -> Vec<f64> {
        mergescope_engine::plugin::host_ext::linalg::truncated_svd(m, rows, cols, rows.min(cols))
            .unwrap()
            .1
    }

    #[test]
    fn a_lora_step_trains_only_the_factors_and_the_expert_is_w_plus_scaled_ba() {
        let tmp = tempfile::tempdir().unwrap();
        let d = Device::Cpu;
        let backbone = Backbone::load(&tiny_backbone(tmp.path()).unwrap(), 16, &d).unwrap();
        let before: Params = backbone
            .weights
            .iter()
            .map(|(k, t)| (k.clone(), t.copy().unwrap()))
            .collect();
        let task = builtin_tasks()
            .unwrap()
            .into_iter()
            .find(|t| t.name == "word_sentiment")
            .unwrap();
        let tok = Tokenized::new(&backbone.tokenizer, &task.split(TextSplit::Train)[..32]).unwrap();
        let head = init_head(2, 16, 5, &d).unwrap();
        let mut recipe = TextRecipe::lora_for(0, 2);
        (recipe.expert_steps, recipe.warmup_steps, recipe.batch_size) = (3, 1, 8);
        let FineTuning::Lora(lora) = recipe.fine_tuning.clone() else {
            unreachable!()
        };
        let mut steps = 0;
        let cancel = AtomicBool::new(false);
        let job = FineTuneJob {
            backbone: &backbone,
            head: &head,
            tok: &tok,
            recipe: &recipe,
            stream: 0xE0,
            device: &d,
            cancel: &cancel,
        };
        let expert = fine_tune(&job, &mut |_| steps += 1).unwrap();
        assert_eq!(steps, 3);
        assert!(expert.final_loss.is_finite());
        let factors = expert.lora.as_ref().unwrap();
        let initial = LoraFactors::init(&backbone.weights, &lora, 0, 0x10AA ^ 0xE0, &d).unwrap();
        let targets = lora.target_weights(&backbone.weights);
        assert_eq!(targets.len(), 12);
        assert_eq!(factors.pairs.len(), 12);
        for (p, q) in factors.pairs.iter().zip(&initial.pairs) {
            assert_ne!(
                values(p.a.as_tensor()),
                values(q.a.as_tensor()),
                "A of {} moved",
                p.weight
            );
            assert!(
                values(p.b.as_tensor()).iter().any(|x| *x != 0.0),
                "B of {} moved",
                p.weight
            );
            assert!(values(q.b.as_tensor()).iter().all(|x| *x == 0.0));
        }
        // The frozen weights: the backbone is untouched, and the expert equals it everywhere
        // but the adapted matrices (embeddings, biases, norms, pooler).
        for (k, t) in &before {
            assert_eq!(values(t), values(&backbone.weights[k]), "{k}");
            if !targets.contains(k) {
                assert_eq!(values(t), values(&expert.weights[k]), "{k} is frozen");
            }
        }
        // Each adapted matrix is W + (alpha/r)·B·A, its task vector of rank ≤ r.
        for p in &factors.pairs {
            let w = &backbone.weights[&p.weight];
            let want = (w + (p.b.as_tensor().matmul(p.a.as_tensor()).unwrap() * 2.0).unwrap()).unwrap();
            let got = &expert.weights[&p.weight];
            let diff = crate::nn::max_abs_diff(got, &want);
            assert!(diff < 1e-6, "{}: {diff}", p.weight);
            let (rows, cols) = w.dims2().unwrap();
            let sv = singular_values(&values(&(got - w).unwrap()), rows, cols);
            assert!(sv[0] > 1e-4, "{}: {sv:?}", p.weight);
            assert!(sv[2..].iter().all(|s| *s < 1e-5 * sv[0]), "{}: {sv:?}", p.weight);
        }
    }

    /// Seed 0's LoRA recipe (rank 2) cut down for the tiny backbone: 16 tokens, 5 head steps, 4
    /// expert steps, 32 train and 16 test texts per task.
    fn reduced_lora_recipe() -> TextRecipe {
        let mut recipe = TextRecipe::lora_for(0, 2);
        (recipe.max_length, recipe.head_steps, recipe.expert_steps) = (16, 5, 4);
        (recipe.warmup_steps, recipe.batch_size) = (1, 8);
        (recipe.max_train, recipe.max_eval) = (Some(32), Some(16));
        recipe
    }

    /// A reduced LoRA build (the frozen products and side paths on the GPU) scores on CUDA as on
    /// the CPU, where the build and the machine have CUDA (a `--features cuda` build on a GPU
    /// machine; elsewhere there is no second device to compare with, and it says so).
    #[test]
    fn a_reduced_lora_build_on_cuda_scores_as_on_the_cpu() {
        let Ok(cuda) = Device::cuda_if_available(0) else {
            return;
        };
        if !cuda.is_cuda() {
            eprintln!("no CUDA device: nothing to compare the CPU build with");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let backbone = tiny_backbone(tmp.path()).unwrap();
        let tasks = tasks_named(&["word_sentiment", "name_gender"]).unwrap();
        let recipe = reduced_lora_recipe();
        let build = |device: &Device, name: &str| {
            build_text(
                &backbone,
                &tasks,
                &recipe,
                &tmp.path().join(name),
                device,
                &mut |_| {},
                &AtomicBool::new(false),
            )
            .unwrap()
        };
        let (on_cpu, on_gpu) = (build(&Device::Cpu, "cpu"), build(&cuda, "cuda"));
        for (a, b) in on_cpu.manifest.tasks.iter().zip(&on_gpu.manifest.tasks) {
            for split in ["calibration", "test"] {
                let (x, y) = (a.expert_accuracy[split], b.expert_accuracy[split]);
                eprintln!("{} {split}: expert accuracy {x} on the CPU, {y} on CUDA", a.name);
                // 16 test texts: one text is 1/16.
                assert!((x - y).abs() <= 1.0 / 16.0 + 1e-9, "{} {split}: {x} vs {y}", a.name);
            }
        }
    }

    #[test]
    fn a_reduced_lora_build_writes_dense_experts_and_adapters_that_load_the_same() {
        use mergescope_engine::checkpoint::Checkpoint;
        let tmp = tempfile::tempdir().unwrap();
        let backbone = tiny_backbone(tmp.path()).unwrap();
        let tasks = tasks_named(&["word_sentiment", "name_gender"]).unwrap();
        let recipe = reduced_lora_recipe();
        let out = tmp.path().join("out");
        let mut stages = Vec::new();
        let b = build_text(
            &backbone,
            &tasks,
            &recipe,
            &out,
            &Device::Cpu,
            &mut |p| stages.push(p.stage.clone()),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert!(stages.iter().any(|s| s == "expert name_gender"), "{stages:?}");
        // The recipe, LoRA included, round-trips through manifest.json: the same request
        // finds the build; a full-fine-tuning one does not.
        let opened = TextBenchmark::open(&out).unwrap();
        assert_eq!(opened.manifest.recipe, recipe);
        let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
        assert!(text.contains("\"mode\": \"lora\""), "{text}");
        let mut request = super::super::TextBuildRequest::new(&backbone, 0);
        (request.recipe, request.out) = (recipe.clone(), Some(out.clone()));
        request.tasks = vec!["name_gender".into(), "word_sentiment".into()];
        assert!(matches!(request.plan().unwrap(), super::super::TextBuildPlan::Built(_)));
        request.recipe.fine_tuning = FineTuning::Full;
        assert!(matches!(request.plan().unwrap(), super::super::TextBuildPlan::Build(_)));
        for t in &b.manifest.tasks {
            for split in ["calibration", "test"] {
                assert!((0.0..=1.0).contains(&t.base_accuracy[split]), "{t:?}");
                assert!((0.0..=1.0).contains(&t.expert_accuracy[split]), "{t:?}");
            }
            // The adapter, read by the engine as an expert over base/, is the dense expert.
            let base = out.join("base/model.safetensors");
            let adapter = out.join("adapters").join(&t.name);
            let config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap()).unwrap();
            assert_eq!(
                (config["r"].as_u64(), config["lora_alpha"].as_f64()),
                (Some(2), Some(4.0))
            );
            let from_adapter = mergescope_interop::request::open_expert(&adapter, Some(&base)).unwrap();
            let dense = Checkpoint::open(&out.join("experts").join(&t.name).join("model.safetensors")).unwrap();
            let base = Checkpoint::open(&base).unwrap();
            assert_eq!(
                from_adapter.tensors.keys().collect::<Vec<_>>(),
                dense.tensors.keys().collect::<Vec<_>>()
            );
            let (mut changed, mut same) = (0, 0);
            for (name, e) in &dense.tensors {
                let want = dense.read_f32(e).unwrap();
                let got = from_adapter.read_f32(&from_adapter.tensors[name]).unwrap();
                let diff = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(diff < 1e-6, "{}: {name} differs by {diff}", t.name);
                if want == base.read_f32(&base.tensors[name]).unwrap() {
                    same += 1;
                } else {
                    changed += 1;
                    assert!(
                        name.starts_with("encoder.layer.") && name.ends_with(".weight"),
                        "{name}"
                    );
                }
            }
            assert_eq!(changed, 12, "{}", t.name);
            assert!(same > 12);
            // The task vector of the first layer's query: rank 2.
            let name = "encoder.layer.0.attention.self.query.weight";
            let delta: Vec<f32> = dense
                .read_f32(&dense.tensors[name])
                .unwrap()
                .iter()
                .zip(base.read_f32(&base.tensors[name]).unwrap())
                .map(|(a, b)| a - b)
                .collect();
            let sv = singular_values(&delta, 16, 16);
            assert!(sv[2..].iter().all(|s| *s < 1e-4 * sv[0]), "{sv:?}");
        }
    }

    #[test]
    fn a_recipe_without_the_fine_tuning_mode_reads_as_full_fine_tuning() {
        let full = TextRecipe::default_for(0);
        let text = serde_json::to_string(&full).unwrap();
        assert!(
            !text.contains("fine_tuning"),
            "full builds' manifests are unchanged: {text}"
        );
        assert_eq!(serde_json::from_str::<TextRecipe>(&text).unwrap(), full);
        let lora = TextRecipe::lora_for(0, 8);
        let back: TextRecipe = serde_json::from_str(&serde_json::to_string(&lora).unwrap()).unwrap();
        assert_eq!(back, lora);
        assert_ne!(back, full);
        let mut bad = lora;
        bad.fine_tuning = FineTuning::Lora(super::super::LoraRecipe::new(0));
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("--lora-rank 0"), "{e}");
    }

    #[test]
    fn a_folder_without_the_model_says_how_to_fetch_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = Backbone::load(dir.path(), 32, &Device::Cpu).err().unwrap().to_string();
        assert!(
            e.contains("config.json") && e.contains("scripts/fetch-minilm.sh"),
            "{e}"
        );
        let mut r = TextRecipe::default_for(0);
        r.max_length = 512;
        let e = build_text(
            dir.path(),
            &builtin_tasks().unwrap(),
            &r,
            &dir.path().join("out"),
            &Device::Cpu,
            &mut |_| {},
            &AtomicBool::new(false),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("max_length 512"), "{e}");
        assert!(!dir.path().join("out").exists());
    }

    /// The sweeps' door remakes the build's expert: the build's recipe and task stream give
    /// the same tensors; its snapshots come in order, each a different model; a snapshot that
    /// cannot be saved ends the run with that error, and cancel stops it.
    #[test]
    fn fine_tuning_with_snapshots_remakes_the_builds_expert() {
        use mergescope_engine::checkpoint::Checkpoint;
        let tmp = tempfile::tempdir().unwrap();
        let backbone_dir = tiny_backbone(tmp.path()).unwrap();
        let tasks = tasks_named(&["name_gender", "word_sentiment"]).unwrap();
        let mut recipe = TextRecipe::default_for(3);
        (recipe.max_length, recipe.head_steps, recipe.expert_steps) = (16, 5, 4);
        (recipe.warmup_steps, recipe.batch_size) = (1, 8);
        (recipe.max_train, recipe.max_eval) = (Some(24), Some(8));
        let out = tmp.path().join("out");
        let d = Device::Cpu;
        let never = AtomicBool::new(false);
        build_text(&backbone_dir, &tasks, &recipe, &out, &d, &mut |_| {}, &never).unwrap();
        let backbone = Backbone::load(&out.join("base"), recipe.max_length, &d).unwrap();
        let i = 1;
        let heads = crate::demo::load_params(&out.join("heads/word_sentiment.safetensors"), &d).unwrap();
        let head = LinearHead {
            weight: heads[bert::HEAD_WEIGHT].clone(),
            bias: heads[bert::HEAD_BIAS].clone(),
        };
        let mut task = tasks[i].clone();
        task.truncate(TextSplit::Train, 24);
        let tok = Tokenized::new(&backbone.tokenizer, task.split(TextSplit::Train)).unwrap();
        let name = "encoder.layer.0.attention.self.query.weight";
        let mut saved: Vec<(usize, Vec<f32>)> = Vec::new();
        let mut losses = 0;
        let last = fine_tune_snapshots(
            &backbone,
            &head,
            &tok,
            &recipe,
            expert_stream(i),
            &d,
            &[2, 4],
            &mut |k, p| {
                saved.push((k, values(&p[name])));
                Ok(())
            },
            &mut |_| losses += 1,
            &never,
        )
        .unwrap();
        assert_eq!(losses, 4);
        assert!(last.is_finite());
        assert_eq!(saved.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [2, 4]);
        let built = Checkpoint::open(&out.join("experts/word_sentiment/model.safetensors")).unwrap();
        let want = built.read_f32(&built.tensors[name]).unwrap();
        for (k, got) in &saved {
            if *k == 4 {
                assert_eq!(*got, want, "the K = 4 snapshot is the build's expert");
            } else {
                assert_ne!(*got, want, "the K = 2 snapshot is an earlier model");
                assert_ne!(*got, values(&backbone.weights[name]));
            }
        }
        // A failed save ends the run with its error, before the last step.
        let mut steps = 0;
        let e = fine_tune_snapshots(
            &backbone,
            &head,
            &tok,
            &recipe,
            expert_stream(i),
            &d,
            &[1],
            &mut |_, _| Err(EngineError::invalid("disk full")),
            &mut |_| steps += 1,
            &never,
        )
        .unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(steps, 1);
        let cancel = AtomicBool::new(true);
        let e = fine_tune_snapshots(
            &backbone,
            &head,
            &tok,
            &recipe,
            0,
            &d,
            &[],
            &mut |_, _| Ok(()),
            &mut |_| {},
            &cancel,
        )
        .unwrap_err();
        assert!(matches!(e, EngineError::Cancelled), "{e}");
    }
}
