//! The demo benchmark: a base backbone, one frozen head per task and one fine-tuned expert per
//! task, built deterministically from a seed and cached on disk (DESIGN §4).
//!
//! Protocol of the task-vector papers, in miniature:
//! 1. **Pretrain** the base backbone on the pooled training images of every task with a
//!    label-free pretext task (which of four rotations was applied), so the base has generic
//!    features but knows no task's labels.
//! 2. **Heads**: train each task's linear head on the frozen base's features of a few examples
//!    per class ([`BuildRecipe::head_shots`]; the first ones of each class after the calibration
//!    prefix), then freeze it. Few-shot heads make the base weak on every task, the way the
//!    zero-shot heads of the papers do, so each expert gains much over the base.
//! 3. **Experts**: fine-tune the backbone on each task through its frozen head, with a small
//!    AdamW step and no augmentation. Measured for recipe 3 (docs/results.md): random ±2-pixel
//!    shifts (recipe 2) raise each expert's own test loss from the first steps and leave task
//!    arithmetic below weight averaging at every step size tried; without them, and with
//!    η = 2·10⁻⁴, task arithmetic lands between weight averaging and the experts.
//!
//! Merges combine backbones only; each task is evaluated with its own head. A benchmark
//! folder holds `manifest.json`, `base.safetensors`, `heads.safetensors` (tensors
//! `<task>.weight`, `<task>.bias`) and `experts/<task>.safetensors`.

use crate::data::{SplitKind, TaskData};
use crate::evaluator::{BackboneEvaluator, EvalReport, EvalTask};
use crate::nn::{Arch, Head, Params, cross_entropy, labels_tensor, to_host};
use crate::train::{
    BatchSize, Batcher, Budget, Examples, OptimConfig, TrainConfig, TrainProgress, TrainTask, fine_tune, optimize,
    to_vars,
};
use candle_core::{Device, Tensor, Var};
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Version of the build recipe: a cached benchmark built by another version is rebuilt.
pub const RECIPE_VERSION: u32 = 3;

/// Examples per class the default recipe trains each head on (see [`BuildRecipe::head_shots`]).
pub const HEAD_SHOTS: usize = 10;

/// Training settings of each stage of a build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildRecipe {
    /// Rotation-prediction pretraining of the base on the pooled images.
    pub pretrain: TrainConfig,
    /// Linear heads on the frozen base's features.
    pub head: TrainConfig,
    /// Examples per class each head is trained on (the first ones of each class after the
    /// calibration prefix of the train split): few-shot heads, weak the way the zero-shot heads
    /// of the task-vector papers are, so that the experts have much to gain. `None`: every
    /// train example (recipe version 1, whose manifests have no such field).
    #[serde(default)]
    pub head_shots: Option<usize>,
    /// Fine-tuning of each expert through its frozen head.
    pub expert: TrainConfig,
}

impl BuildRecipe {
    /// The default recipe of `arch` for `seed`.
    pub fn default_for(arch: Arch, seed: u64) -> BuildRecipe {
        let head = TrainConfig {
            optim: OptimConfig::adamw(1e-2, 1e-4),
            batch: BatchSize::Full,
            budget: Budget::Steps(300),
            seed,
            augment_shift: 0,
        };
        let (pretrain_steps, expert_optim, expert_steps) = match arch {
            Arch::Mlp => (400, OptimConfig::adamw(2e-4, 0.0), 300),
            Arch::Cnn => (300, OptimConfig::adamw(2e-4, 0.0), 250),
            Arch::Vit => (400, OptimConfig::adamw(2e-4, 0.0), 300),
        };
        BuildRecipe {
            pretrain: TrainConfig {
                optim: OptimConfig::adamw(1e-3, 1e-4),
                batch: BatchSize::Size(128),
                budget: Budget::Steps(pretrain_steps),
                seed,
                augment_shift: 0,
            },
            head,
            head_shots: Some(HEAD_SHOTS),
            expert: TrainConfig {
                optim: expert_optim,
                batch: BatchSize::Size(64),
                budget: Budget::Steps(expert_steps),
                seed,
                augment_shift: 0,
            },
        }
    }
}

/// Accuracy on the test and calibration splits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitAccuracy {
    /// Test split.
    pub test: f64,
    /// Calibration split.
    pub calibration: f64,
}

impl SplitAccuracy {
    /// The accuracy on `split`.
    pub fn get(&self, split: SplitKind) -> f64 {
        match split {
            SplitKind::Test => self.test,
            SplitKind::Calibration => self.calibration,
        }
    }
}

/// One task of a built benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchmarkTask {
    /// Task name.
    pub name: String,
    /// Class names.
    pub classes: Vec<String>,
    /// Expert checkpoint, relative to the benchmark folder.
    pub expert: String,
    /// The base's accuracy with this task's head.
    pub base_accuracy: SplitAccuracy,
    /// The expert's accuracy on its own task (the normaliser).
    pub expert_accuracy: SplitAccuracy,
}

/// `manifest.json` of a benchmark folder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Recipe version it was built with.
    pub recipe_version: u32,
    /// mergescope version that built it.
    pub mergescope_version: String,
    /// Backbone architecture.
    pub arch: Arch,
    /// Seed of the build.
    pub seed: u64,
    /// The recipe.
    pub recipe: BuildRecipe,
    /// Tasks, sorted by name.
    pub tasks: Vec<BenchmarkTask>,
    /// Seconds per stage (pretrain, heads, experts, evaluation).
    pub seconds: BTreeMap<String, f64>,
    /// The matrix-kernel path it was trained with ([`kernel_path_on`]); builds on the same path
    /// are byte-identical, on different paths they differ in the last bits. Empty: not recorded
    /// (built before it was).
    #[serde(default)]
    pub kernel_path: String,
}

/// The matrix-kernel path a build on `device` trains with: `cuda` or `metal` on a GPU (whose
/// sums go in the GPU library's order), else the CPU's [`kernel_path`].
pub fn kernel_path_on(device: &Device) -> String {
    match device {
        Device::Cuda(_) => "cuda".to_owned(),
        Device::Metal(_) => "metal".to_owned(),
        Device::Cpu => kernel_path(),
    }
}

/// The CPU matrix-kernel path this process trains with, which decides the order float sums
/// accumulate in: `x86_64-fma` (every x86-64 CPU with FMA, AVX2 or AVX-512 alike: the matrix
/// kernels do not use AVX-512), `x86_64-scalar`, `aarch64-neon`, or the architecture's name,
/// followed by the L1 data cache the matrix kernels size their blocks by (`-l1d48k12w`: 48 KiB,
/// 12-way, [`l1_blocking`]), since the length of the blocks a long sum is split into depends on
/// it. Thread counts do not change it: each output element is summed by one thread, in one order.
pub fn kernel_path() -> String {
    format!("{}-{}", kernel_isa(), l1_blocking())
}

/// The instruction path of the CPU's matrix kernels ([`kernel_path`] without the cache).
fn kernel_isa() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") {
            "x86_64-fma".to_owned()
        } else {
            "x86_64-scalar".to_owned()
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            "aarch64-neon".to_owned()
        } else {
            "aarch64-scalar".to_owned()
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        std::env::consts::ARCH.to_owned()
    }
}

/// The L1 data cache as the CPU matrix kernels (gemm) read it, which sets how many terms of a
/// dot product each block sums before the next block adds on (`kc`): `l1d{KiB}k{ways}w`, with
/// the line size when it is not 64 bytes. Two CPUs that differ here sum products of long
/// vectors (the MLP's 784 inputs) in other orders, so they differ in the last bits.
pub fn l1_blocking() -> String {
    let l1 = gemm_common::cache::CACHE_INFO[0];
    let line = if l1.cache_line_bytes == 64 {
        String::new()
    } else {
        format!("{}b", l1.cache_line_bytes)
    };
    format!("l1d{}k{}w{line}", l1.cache_bytes / 1024, l1.associativity)
}

/// A built benchmark on disk.
#[derive(Clone, Debug)]
pub struct Benchmark {
    /// Its folder.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// Progress of a build.
#[derive(Clone, Debug)]
pub struct BuildProgress {
    /// Current stage (`pretrain`, `head mnist`, `expert mnist`, `evaluate`).
    pub stage: String,
    /// Steps done over the whole build.
    pub done: usize,
    /// Steps in the whole build.
    pub total: usize,
    /// Loss of the last step, if a training step.
    pub loss: Option<f32>,
}

impl BuildProgress {
    /// What a build of `total` steps reports through: called with the stage, the steps done so
    /// far and the last loss, it hands `progress` a [`BuildProgress`] (the image demo's and the
    /// text benchmark's builds).
    pub fn reporter<'a>(
        progress: &'a mut dyn FnMut(&BuildProgress),
        total: usize,
    ) -> impl FnMut(&str, usize, Option<f32>) + 'a {
        move |stage, done, loss| {
            progress(&BuildProgress {
                stage: stage.to_owned(),
                done,
                total,
                loss,
            })
        }
    }
}

/// mergescope's cache folder: `$MERGESCOPE_CACHE_DIR`, else `$XDG_CACHE_HOME/mergescope`, else
/// `~/.cache/mergescope`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("MERGESCOPE_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("mergescope"))
        .ok_or_else(|| EngineError::Invalid("cannot find a cache folder: set MERGESCOPE_CACHE_DIR (or HOME)".into()))
}

/// The folder of the demo benchmark of `arch` and `seed` in the cache.
pub fn demo_dir(arch: Arch, seed: u64) -> Result<PathBuf> {
    Ok(cache_dir()?.join("demo").join(format!("{arch}-seed{seed}")))
}

/// Saves named tensors as f32 safetensors with `metadata`, atomically and byte-for-byte
/// reproducibly (sorted header) through the engine's [`OutputWriter`](mergescope_engine::writer::OutputWriter).
pub fn save_params(path: &Path, params: &Params, metadata: &BTreeMap<String, String>) -> Result<()> {
    let host = to_host(params)?;
    let outputs: Vec<mergescope_engine::writer::OutputTensor> = host
        .iter()
        .map(|(k, (shape, _))| mergescope_engine::writer::OutputTensor {
            name: k.clone(),
            dtype: mergescope_engine::dtype::DType::F32,
            shape: shape.clone(),
        })
        .collect();
    let writer = mergescope_engine::writer::OutputWriter::create(path, &outputs, metadata, None, true)?;
    for (k, (_, v)) in &host {
        writer.write(k, 0, bytemuck::cast_slice(v))?;
    }
    writer.commit()?;
    Ok(())
}

pub use crate::nn::load_params;

fn rotate90(src: &[u8], dst: &mut [u8], side: usize, quarter_turns: usize) {
    for y in 0..side {
        for x in 0..side {
            let (sy, sx) = match quarter_turns % 4 {
                0 => (y, x),
                1 => (x, side - 1 - y),
                2 => (side - 1 - y, side - 1 - x),
                _ => (side - 1 - x, y),
            };
            dst[y * side + x] = src[sy * side + sx];
        }
    }
}

fn pretrain(
    arch: Arch,
    tasks: &[TaskData],
    cfg: &TrainConfig,
    device: &Device,
    on_step: &mut dyn FnMut(&TrainProgress),
    cancel: &AtomicBool,
) -> Result<Params> {
    let per = crate::nn::IMAGE_SIDE * crate::nn::IMAGE_SIDE;
    let pool: Vec<&[u8]> = tasks.iter().flat_map(|t| t.train.images.chunks_exact(per)).collect();
    let backbone = to_vars(&arch.init(cfg.seed, device)?)?;
    let pretext = Head::init(arch.feature_dim(), 4, cfg.seed ^ 0x9E37, device)?;
    let (hw, hb) = (Var::from_tensor(&pretext.weight)?, Var::from_tensor(&pretext.bias)?);
    let mut batcher = Batcher::new(pool.len(), cfg.batch, cfg.seed, 0xA0);
    let mut rot_rng = SplitMix64::stream(cfg.seed, 0xA1);
    let mut vars: Vec<Var> = backbone.iter().map(|(_, v)| v.clone()).collect();
    vars.extend([hw.clone(), hb.clone()]);
    let steps = crate::train::total_steps(cfg.budget, batcher.steps_per_epoch());
    let mut loss = |_step: usize| -> Result<Tensor> {
        let idx = batcher.next_batch();
        let mut images = vec![0u8; idx.len() * per];
        let mut labels = Vec::with_capacity(idx.len());
        for (slot, &i) in idx.iter().enumerate() {
            let k = rot_rng.below(4);
            rotate90(
                pool[i],
                &mut images[slot * per..(slot + 1) * per],
                crate::nn::IMAGE_SIDE,
                k,
            );
            labels.push(k as u8);
        }
        let all: Vec<usize> = (0..idx.len()).collect();
        let x = crate::train::batch_images(&images, &all, cfg.augment_shift, batcher.rng(), device)?;
        let p = crate::train::from_vars(&backbone);
        let head = Head {
            weight: hw.as_tensor().clone(),
            bias: hb.as_tensor().clone(),
        };
        cross_entropy(&head.logits(&arch.features(&p, &x)?)?, &labels_tensor(&labels, device)?)
    };
    optimize(vars, cfg.optim, steps, &mut loss, on_step, cancel)?;
    Ok(crate::train::detached(&backbone))
}

/// The images and labels the head of `task` is trained on: every train example, or with
/// `shots`, the first `shots` examples of each class after the calibration prefix of the train
/// split (so the base's calibration accuracy is not measured on its heads' training examples).
fn head_examples(task: &TaskData, shots: Option<usize>) -> (Vec<u8>, Vec<u8>) {
    let Some(k) = shots else {
        return (task.train.images.clone(), task.train.labels.clone());
    };
    let per = crate::nn::IMAGE_SIDE * crate::nn::IMAGE_SIDE;
    let skip = if task.train.len() > crate::data::CALIBRATION_PER_TASK {
        crate::data::CALIBRATION_PER_TASK
    } else {
        0
    };
    let mut taken = vec![0usize; task.classes.len()];
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    let examples = task.train.images.chunks_exact(per).zip(&task.train.labels).skip(skip);
    for (image, &label) in examples {
        if let Some(n) = taken.get_mut(usize::from(label)).filter(|n| **n < k) {
            *n += 1;
            images.extend_from_slice(image);
            labels.push(label);
        }
    }
    (images, labels)
}

fn train_head(
    features: &Tensor,
    labels: &[u8],
    classes: usize,
    cfg: &TrainConfig,
    stream: u64,
    on_step: &mut dyn FnMut(&TrainProgress),
    cancel: &AtomicBool,
) -> Result<Head> {
    let device = features.device();
    let init = Head::init(features.dims()[1], classes, cfg.seed ^ stream, device)?;
    let (w, b) = (Var::from_tensor(&init.weight)?, Var::from_tensor(&init.bias)?);
    let mut batcher = Batcher::new(labels.len(), cfg.batch, cfg.seed, stream);
    let labels = labels_tensor(labels, device)?;
    let steps = crate::train::total_steps(cfg.budget, batcher.steps_per_epoch());
    let mut loss = |_step: usize| -> Result<Tensor> {
        let idx = batcher.next_batch();
        let ids = Tensor::from_vec(idx.iter().map(|&i| i as u32).collect::<Vec<_>>(), idx.len(), device)?;
        let head = Head {
            weight: w.as_tensor().clone(),
            bias: b.as_tensor().clone(),
        };
        let logits = head.logits(&features.index_select(&ids, 0)?)?;
        cross_entropy(&logits, &labels.index_select(&ids, 0)?)
    };
    optimize(vec![w.clone(), b.clone()], cfg.optim, steps, &mut loss, on_step, cancel)?;
    Ok(Head {
        weight: w.as_tensor().detach(),
        bias: b.as_tensor().detach(),
    })
}

fn features_of(arch: Arch, backbone: &Params, images: &[u8], device: &Device) -> Result<Tensor> {
    let x = crate::nn::images_tensor(images, device)?;
    let n = x.dims()[0];
    let mut parts = Vec::new();
    let mut from = 0;
    while from < n {
        let len = 1000.min(n - from);
        parts.push(arch.features(backbone, &x.narrow(0, from, len)?)?);
        from += len;
    }
    // Contiguous: a single chunk is returned as is, and the ViT's features are a strided view.
    Ok(Tensor::cat(&parts, 0)?.contiguous()?.detach())
}

fn heads_params(names: &[&str], heads: &[Head]) -> Params {
    names
        .iter()
        .zip(heads)
        .flat_map(|(n, h)| {
            [
                (format!("{n}.weight"), h.weight.clone()),
                (format!("{n}.bias"), h.bias.clone()),
            ]
        })
        .collect()
}

/// The metadata every demo checkpoint carries: format, version, architecture, seed and role.
pub fn checkpoint_metadata(arch: Arch, seed: u64, role: &str) -> BTreeMap<String, String> {
    [
        ("format", "pt".to_owned()),
        ("mergescope.version", env!("CARGO_PKG_VERSION").to_owned()),
        ("mergescope.demo.arch", arch.name().to_owned()),
        ("mergescope.demo.seed", seed.to_string()),
        ("mergescope.demo.role", role.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Builds a benchmark of `arch` on `tasks` into `dir` (written to a temporary sibling folder
/// and renamed into place, so an interrupted build leaves nothing half-written). `dir` must
/// not exist.
pub fn build(
    arch: Arch,
    tasks: &[TaskData],
    recipe: &BuildRecipe,
    dir: &Path,
    device: &Device,
    progress: &mut dyn FnMut(&BuildProgress),
    cancel: &AtomicBool,
) -> Result<Benchmark> {
    if tasks.is_empty() {
        return Err(EngineError::Invalid("a benchmark needs at least one task".into()));
    }
    if recipe.head_shots == Some(0) {
        return Err(EngineError::Param(
            "head_shots must be at least 1 example per class".into(),
        ));
    }
    if let Some(t) = tasks
        .iter()
        .find(|t| t.image_size != (crate::nn::IMAGE_SIDE, crate::nn::IMAGE_SIDE))
    {
        return Err(EngineError::Invalid(format!(
            "task '{}' has {}×{} images; the demo architectures take 28×28",
            t.name, t.image_size.0, t.image_size.1
        )));
    }
    if dir.exists() {
        return Err(EngineError::Invalid(format!(
            "'{}' already exists; remove it or choose another folder",
            dir.display()
        )));
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| EngineError::io("cannot create", parent, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)
        .map_err(|e| EngineError::io("cannot create a folder in", parent, e))?;
    std::fs::create_dir(tmp.path().join("experts"))
        .map_err(|e| EngineError::io("cannot create", tmp.path().join("experts"), e))?;

    let per_epoch = crate::train::steps_per_epoch;
    let pooled: usize = tasks.iter().map(|t| t.train.len()).sum();
    let pre_steps = crate::train::total_steps(recipe.pretrain.budget, per_epoch(pooled, recipe.pretrain.batch));
    let head_sets: Vec<(Vec<u8>, Vec<u8>)> = tasks.iter().map(|t| head_examples(t, recipe.head_shots)).collect();
    let head_steps: Vec<usize> = head_sets
        .iter()
        .map(|(_, labels)| crate::train::total_steps(recipe.head.budget, per_epoch(labels.len(), recipe.head.batch)))
        .collect();
    let expert_steps: Vec<usize> = tasks
        .iter()
        .map(|t| crate::train::total_steps(recipe.expert.budget, per_epoch(t.train.len(), recipe.expert.batch)))
        .collect();
    let total = pre_steps + head_steps.iter().sum::<usize>() + expert_steps.iter().sum::<usize>() + 1;
    let mut done = 0usize;
    let mut seconds = BTreeMap::new();

    let mut report = BuildProgress::reporter(progress, total);

    let t0 = Instant::now();
    let base = pretrain(
        arch,
        tasks,
        &recipe.pretrain,
        device,
        &mut |p| report("pretrain", done + p.step, Some(p.loss)),
        cancel,
    )?;
    done += pre_steps;
    seconds.insert("pretrain".to_owned(), t0.elapsed().as_secs_f64());

    let t0 = Instant::now();
    let mut heads = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let (images, labels) = &head_sets[i];
        let f = features_of(arch, &base, images, device)?;
        let stage = format!("head {}", t.name);
        let h = train_head(
            &f,
            labels,
            t.classes.len(),
            &recipe.head,
            0x4EAD + i as u64,
            &mut |p| report(&stage, done + p.step, Some(p.loss)),
            cancel,
        )?;
        done += head_steps[i];
        heads.push(h);
    }
    seconds.insert("heads".to_owned(), t0.elapsed().as_secs_f64());

    let t0 = Instant::now();
    let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
    save_params(
        &tmp.path().join("base.safetensors"),
        &base,
        &checkpoint_metadata(arch, recipe.pretrain.seed, "base"),
    )?;
    save_params(
        &tmp.path().join("heads.safetensors"),
        &heads_params(&names, &heads),
        &checkpoint_metadata(arch, recipe.pretrain.seed, "heads"),
    )?;
    let mut experts = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let stage = format!("expert {}", t.name);
        let cfg = TrainConfig {
            seed: recipe.expert.seed.wrapping_add(i as u64),
            ..recipe.expert
        };
        let task = TrainTask {
            data: Examples {
                images: &t.train.images,
                labels: &t.train.labels,
            },
            head: &heads[i],
        };
        let tuned = fine_tune(
            arch,
            &base,
            &[task],
            &cfg,
            device,
            &mut |p| report(&stage, done + p.step, Some(p.loss)),
            cancel,
        )?;
        done += expert_steps[i];
        let mut meta = checkpoint_metadata(arch, recipe.expert.seed, "expert");
        meta.insert("mergescope.demo.task".to_owned(), t.name.clone());
        meta.extend(crate::train::train_metadata(&cfg, expert_steps[i], t.train.len()));
        save_params(
            &tmp.path().join("experts").join(format!("{}.safetensors", t.name)),
            &tuned.backbone,
            &meta,
        )?;
        experts.push(tuned.backbone);
    }
    seconds.insert("experts".to_owned(), t0.elapsed().as_secs_f64());

    report("evaluate", done, None);
    let t0 = Instant::now();
    let mut entries = Vec::new();
    let mut base_reports = Vec::new();
    for split in [SplitKind::Test, SplitKind::Calibration] {
        let ev = BackboneEvaluator::new(
            arch,
            split,
            tasks
                .iter()
                .zip(&heads)
                .map(|(t, h)| EvalTask {
                    data: t,
                    head: h.clone(),
                    reference: None,
                })
                .collect(),
            device,
        )?;
        base_reports.push(ev.evaluate(&base)?);
    }
    for (i, t) in tasks.iter().enumerate() {
        let mut acc = [0f64; 2];
        for (j, split) in [SplitKind::Test, SplitKind::Calibration].into_iter().enumerate() {
            let ev = BackboneEvaluator::new(
                arch,
                split,
                vec![EvalTask {
                    data: t,
                    head: heads[i].clone(),
                    reference: None,
                }],
                device,
            )?;
            acc[j] = ev.evaluate(&experts[i])?.mean_accuracy;
        }
        let base_acc = |r: &EvalReport| r.task(&t.name).map_or(0.0, |s| s.accuracy);
        entries.push(BenchmarkTask {
            name: t.name.clone(),
            classes: t.classes.clone(),
            expert: format!("experts/{}.safetensors", t.name),
            base_accuracy: SplitAccuracy {
                test: base_acc(&base_reports[0]),
                calibration: base_acc(&base_reports[1]),
            },
            expert_accuracy: SplitAccuracy {
                test: acc[0],
                calibration: acc[1],
            },
        });
    }
    seconds.insert("evaluate".to_owned(), t0.elapsed().as_secs_f64());
    report("evaluate", total, None);

    let manifest = Manifest {
        recipe_version: RECIPE_VERSION,
        mergescope_version: env!("CARGO_PKG_VERSION").to_owned(),
        arch,
        seed: recipe.pretrain.seed,
        recipe: recipe.clone(),
        tasks: entries,
        seconds,
        kernel_path: kernel_path_on(device),
    };
    write_manifest(tmp.path(), &manifest)?;
    let built = tmp.keep();
    std::fs::rename(&built, dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&built);
        EngineError::io("cannot move the finished benchmark to", dir, e)
    })?;
    Ok(Benchmark {
        dir: dir.to_path_buf(),
        manifest,
    })
}

/// Reads the `manifest.json` of a build folder (the image demo's [`Manifest`], the text
/// benchmark's `TextManifest`) and checks that every file `needed` lists for it is there.
/// Errors name the folder and say how to rebuild it (`rebuild`: the command).
pub fn open_build<M: serde::de::DeserializeOwned>(
    dir: &Path,
    what: &str,
    rebuild: &str,
    needed: impl FnOnce(&M) -> Vec<PathBuf>,
) -> Result<M> {
    let path = dir.join("manifest.json");
    let bytes = std::fs::read(&path).map_err(|e| EngineError::io("cannot read", &path, e))?;
    let manifest: M = serde_json::from_slice(&bytes).map_err(|e| {
        EngineError::Invalid(format!(
            "'{}' is not a {what} manifest ({e}); rebuild it with `{rebuild}`",
            path.display()
        ))
    })?;
    if let Some(p) = needed(&manifest).into_iter().find(|p| !p.is_file()) {
        return Err(EngineError::Invalid(format!(
            "the {what} in '{}' is incomplete: '{}' is missing; rebuild it with `{rebuild}`",
            dir.display(),
            p.display()
        )));
    }
    Ok(manifest)
}

/// Writes `manifest` as the pretty-printed `manifest.json` of the build folder `dir`.
pub fn write_manifest<M: Serialize>(dir: &Path, manifest: &M) -> Result<()> {
    let json = serde_json::to_vec_pretty(manifest)
        .map_err(|e| EngineError::Bug(format!("cannot serialise the manifest: {e}")))?;
    mergescope_engine::writer::write_atomic(&dir.join("manifest.json"), &json)
}

/// Builds with `build_into` into a staging sibling of `dir`, then moves the result into place:
/// what `dir` held (an older build) is removed only once the new build is complete, so a
/// failed or cancelled build leaves it as it was. The CLI's `demo build --force` and the
/// GUI's rebuild of an outdated cache both go through here.
pub fn build_replacing(dir: &Path, build_into: impl FnOnce(&Path) -> Result<Benchmark>) -> Result<Benchmark> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = dir.with_file_name(format!(".{name}.new-{}", std::process::id()));
    let built = build_into(&staging)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| EngineError::io("cannot replace", dir, e))?;
    }
    std::fs::rename(&staging, dir).map_err(|e| EngineError::io("cannot move the build to", dir, e))?;
    Ok(Benchmark {
        dir: dir.to_path_buf(),
        ..built
    })
}

impl Benchmark {
    /// Opens a built benchmark folder and checks that its files are there.
    pub fn open(dir: &Path) -> Result<Benchmark> {
        let manifest: Manifest = open_build(dir, "benchmark", "mergescope demo build --force", |m: &Manifest| {
            [dir.join("base.safetensors"), dir.join("heads.safetensors")]
                .into_iter()
                .chain(m.tasks.iter().map(|t| dir.join(&t.expert)))
                .collect()
        })?;
        Ok(Benchmark {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// Whether it was built by the current recipe (otherwise it should be rebuilt).
    pub fn is_current(&self) -> bool {
        self.manifest.recipe_version == RECIPE_VERSION
    }

    /// The base checkpoint.
    pub fn base_path(&self) -> PathBuf {
        self.dir.join("base.safetensors")
    }

    /// The heads file.
    pub fn heads_path(&self) -> PathBuf {
        self.dir.join("heads.safetensors")
    }

    /// Expert checkpoints, in task order.
    pub fn expert_paths(&self) -> Vec<PathBuf> {
        self.manifest.tasks.iter().map(|t| self.dir.join(&t.expert)).collect()
    }

    /// Task names, in order.
    pub fn task_names(&self) -> Vec<&str> {
        self.manifest.tasks.iter().map(|t| t.name.as_str()).collect()
    }

    /// The frozen head of every task of the benchmark, by task name.
    pub fn heads(&self, device: &Device) -> Result<BTreeMap<String, Head>> {
        let heads = load_params(&self.heads_path(), device)?;
        self.manifest
            .tasks
            .iter()
            .map(|t| {
                let get = |k: String| {
                    heads.get(&k).cloned().ok_or_else(|| {
                        EngineError::Invalid(format!(
                            "'{}' has no tensor '{k}': rebuild the benchmark (mergescope demo build --force)",
                            self.heads_path().display()
                        ))
                    })
                };
                let head = Head {
                    weight: get(format!("{}.weight", t.name))?,
                    bias: get(format!("{}.bias", t.name))?,
                };
                Ok((t.name.clone(), head))
            })
            .collect()
    }

    /// An evaluator on `split` of the benchmark's tasks (all, or those named in `only`), with
    /// the experts' accuracies as normalisers. `tasks` is the task data (see
    /// [`crate::data::benchmark_tasks`]); every benchmark task must be among it.
    pub fn evaluator(
        &self,
        tasks: &[TaskData],
        only: Option<&[String]>,
        split: SplitKind,
        device: &Device,
    ) -> Result<BackboneEvaluator> {
        if let Some(names) = only {
            let known = self.task_names();
            if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
                return Err(EngineError::Param(format!(
                    "unknown task '{bad}'; this benchmark has: {}",
                    known.join(", ")
                )));
            }
        }
        let mut heads = self.heads(device)?;
        let mut list = Vec::new();
        for t in &self.manifest.tasks {
            if only.is_some_and(|o| !o.contains(&t.name)) {
                continue;
            }
            let data = tasks.iter().find(|d| d.name == t.name).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "the benchmark in '{}' uses task '{}', whose data is not installed (add its file to the task folder)",
                    self.dir.display(),
                    t.name
                ))
            })?;
            let head = heads.remove(&t.name).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "'{}' has no head for task '{}'",
                    self.heads_path().display(),
                    t.name
                ))
            })?;
            list.push(EvalTask {
                data,
                head,
                reference: Some(t.expert_accuracy.get(split)),
            });
        }
        BackboneEvaluator::new(self.manifest.arch, split, list, device)
    }
}

/// Every demo benchmark in the cache, current or built by an older recipe (which
/// `mergescope demo build` rebuilds), sorted by folder name.
pub fn demos_in_cache() -> Result<Vec<Benchmark>> {
    let root = cache_dir()?.join("demo");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<Benchmark> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("manifest.json").is_file())
        .filter_map(|p| Benchmark::open(&p).ok())
        .collect();
    out.sort_by(|a, b| a.dir.cmp(&b.dir));
    Ok(out)
}

/// Why `bench` cannot be used, when an older recipe built it: names the recipes and the
/// command that rebuilds it.
pub fn outdated_reason(bench: &Benchmark) -> Option<String> {
    (!bench.is_current()).then(|| {
        let m = &bench.manifest;
        format!(
            "the {} demo benchmark in '{}' was built by recipe {} and this mergescope uses recipe {RECIPE_VERSION}: run `mergescope demo build --arch {}{}` to rebuild it",
            m.arch,
            bench.dir.display(),
            m.recipe_version,
            m.arch,
            if m.seed == 0 { String::new() } else { format!(" --seed {}", m.seed) }
        )
    })
}

/// Finds a benchmark from a user's spec: a folder holding `manifest.json`, or `demo` (the demo
/// build of `arch` if known, preferring seed 0), `demo/<arch>` or `demo/<arch>-seed<N>` in the
/// cache. Errors say which `mergescope demo build` command makes the missing one.
pub fn resolve_benchmark(spec: &str, arch: Option<Arch>) -> Result<Benchmark> {
    let Some(rest) = spec.strip_prefix("demo") else {
        return Benchmark::open(Path::new(spec));
    };
    let rest = rest.trim_start_matches('/');
    let (want_arch, want_seed) = if rest.is_empty() {
        (arch, None)
    } else {
        let (a, seed) = match rest.split_once("-seed") {
            Some((a, s)) => (
                a,
                Some(s.parse::<u64>().map_err(|_| {
                    EngineError::Param(format!(
                        "benchmark '{spec}': '{s}' is not a seed; write e.g. demo/cnn-seed0"
                    ))
                })?),
            ),
            None => (rest, None),
        };
        let a = Arch::parse(a).ok_or_else(|| {
            EngineError::Param(format!(
                "benchmark '{spec}': unknown architecture '{a}'; use demo, demo/mlp, demo/cnn or demo/vit"
            ))
        })?;
        (Some(a), seed)
    };
    let all = demos_in_cache()?;
    let fits = |b: &&Benchmark| {
        want_arch.is_none_or(|a| b.manifest.arch == a) && want_seed.is_none_or(|s| b.manifest.seed == s)
    };
    let mut candidates: Vec<&Benchmark> = all.iter().filter(fits).collect();
    // Prefer a current build, then the CNN (the main demo), then the lowest seed.
    candidates.sort_by_key(|b| (!b.is_current(), b.manifest.arch != Arch::Cnn, b.manifest.seed));
    if let Some(b) = candidates.first() {
        return match outdated_reason(b) {
            None => Ok((*b).clone()),
            Some(why) => Err(EngineError::Invalid(why)),
        };
    }
    let arch_flag = want_arch.map(|a| format!(" --arch {a}")).unwrap_or_default();
    let seed_flag = want_seed.map(|s| format!(" --seed {s}")).unwrap_or_default();
    Err(EngineError::Invalid(format!(
        "no demo benchmark{} is built in '{}': run `mergescope demo build{arch_flag}{seed_flag}` first",
        want_arch.map(|a| format!(" for {a}")).unwrap_or_default(),
        cache_dir()?.join("demo").display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::demo_tasks;

    fn tiny(seed: u64) -> BuildRecipe {
        let mut r = BuildRecipe::default_for(Arch::Mlp, seed);
        r.pretrain.budget = Budget::Steps(3);
        r.head.budget = Budget::Steps(5);
        r.expert.budget = Budget::Steps(4);
        r
    }

    #[test]
    fn a_build_is_complete_deterministic_and_normalised_by_its_experts() {
        let dev = Device::Cpu;
        let tasks: Vec<TaskData> = demo_tasks()
            .unwrap()
            .into_iter()
            .filter(|t| t.name.starts_with('o'))
            .collect();
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        let mut last = None;
        let built = build(
            Arch::Mlp,
            &tasks,
            &tiny(1),
            &a,
            &dev,
            &mut |p| last = Some(p.clone()),
            &AtomicBool::new(false),
        )
        .unwrap();
        let last = last.unwrap();
        assert_eq!((last.done, last.total), (3 + 2 * 5 + 2 * 4 + 1, 3 + 2 * 5 + 2 * 4 + 1));
        let opened = Benchmark::open(&a).unwrap();
        assert_eq!(opened.manifest, built.manifest);
        assert_eq!(opened.task_names(), ["opencv_digits", "optdigits"]);
        // The same seed gives the same bytes.
        build(
            Arch::Mlp,
            &tasks,
            &tiny(1),
            &b,
            &dev,
            &mut |_| {},
            &AtomicBool::new(false),
        )
        .unwrap();
        for f in ["base.safetensors", "heads.safetensors", "experts/optdigits.safetensors"] {
            assert_eq!(
                std::fs::read(a.join(f)).unwrap(),
                std::fs::read(b.join(f)).unwrap(),
                "{f}"
            );
        }
        // Each expert scores exactly 1 normalised on its own task; the base its manifest accuracy.
        let ev = opened
            .evaluator(&tasks, Some(&["optdigits".to_owned()]), SplitKind::Test, &dev)
            .unwrap();
        let expert = load_params(&opened.expert_paths()[1], &dev).unwrap();
        assert_eq!(ev.evaluate(&expert).unwrap().tasks[0].normalized, Some(1.0));
        let base = ev.evaluate(&load_params(&opened.base_path(), &dev).unwrap()).unwrap();
        assert_eq!(base.tasks[0].accuracy, opened.manifest.tasks[1].base_accuracy.test);
        // Never over an existing folder; unknown tasks are named.
        let e = build(
            Arch::Mlp,
            &tasks,
            &tiny(1),
            &a,
            &dev,
            &mut |_| {},
            &AtomicBool::new(false),
        )
        .unwrap_err();
        assert!(e.to_string().contains("already exists"), "{e}");
        // Replacing: a failed build leaves the old folder as it was; a finished one takes its place.
        let e = build_replacing(&a, |_| Err(EngineError::Cancelled)).unwrap_err();
        assert!(matches!(e, EngineError::Cancelled));
        assert_eq!(Benchmark::open(&a).unwrap().manifest, built.manifest);
        let replaced = build_replacing(&a, |staging| {
            build(
                Arch::Mlp,
                &tasks,
                &tiny(1),
                staging,
                &dev,
                &mut |_| {},
                &AtomicBool::new(false),
            )
        })
        .unwrap();
        assert_eq!(replaced.dir, a);
        assert_eq!(Benchmark::open(&a).unwrap().manifest.recipe, built.manifest.recipe);
        let leftovers: Vec<_> = std::fs::read_dir(a.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "no staging folder is left behind: {leftovers:?}");
        let e = opened
            .evaluator(&tasks, Some(&["mnsit".to_owned()]), SplitKind::Test, &dev)
            .err()
            .unwrap();
        assert!(e.to_string().contains("unknown task 'mnsit'"), "{e}");
    }

    #[test]
    fn few_shot_heads_take_the_first_examples_of_each_class_after_the_calibration_prefix() {
        let tasks = demo_tasks().unwrap();
        let t = tasks.iter().find(|t| t.name == "ising").unwrap();
        let (images, labels) = head_examples(t, Some(3));
        assert_eq!(labels.iter().filter(|l| **l == 0).count(), 3);
        assert_eq!(labels.iter().filter(|l| **l == 1).count(), 3);
        assert_eq!(images.len(), 6 * 784);
        let first = (crate::data::CALIBRATION_PER_TASK..t.train.len())
            .find(|&i| t.train.labels[i] == labels[0])
            .unwrap();
        assert_eq!(images[..784], t.train.images[first * 784..(first + 1) * 784]);
        // The ViT's features of one chunk are a strided view: heads index them, so they are made contiguous.
        let vit = Arch::Vit.init(0, &Device::Cpu).unwrap();
        assert!(
            features_of(Arch::Vit, &vit, &images, &Device::Cpu)
                .unwrap()
                .is_contiguous()
        );
    }

    #[test]
    fn a_cancelled_build_leaves_nothing_behind() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("demo");
        let tasks = demo_tasks().unwrap();
        let cancel = AtomicBool::new(true);
        let e = build(Arch::Mlp, &tasks, &tiny(0), &dir, &Device::Cpu, &mut |_| {}, &cancel).unwrap_err();
        assert!(matches!(e, EngineError::Cancelled));
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[test]
    fn benchmark_specs_resolve_or_say_how_to_build() {
        let e = resolve_benchmark("demo/transformer", None).unwrap_err().to_string();
        assert!(e.contains("unknown architecture 'transformer'"), "{e}");
        let e = resolve_benchmark("demo/cnn-seedx", None).unwrap_err().to_string();
        assert!(e.contains("'x' is not a seed"), "{e}");
        let e = resolve_benchmark("/nonexistent/bench", None).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/bench/manifest.json"), "{e}");
    }
}
