//! Image classification with CLIP (the protocol of the task-arithmetic papers and FusionBench):
//! each task's images go through the evaluated image tower, and are classified against a head
//! per task: given as a file, or built zero-shot from class names and prompt templates by a
//! CLIP text tower (the `zeroshot_from` model's, computed once, or the evaluated model's own).

use super::{ClassifierFamily, EvalReport, ScoresWeights, evenly, score_classifier};
use crate::family::clip::{self, ClipConfigs, ImageEncoder, TextEncoder};
use crate::family::hf;
use crate::family::image_data::{ImageExample, pixels};
use candle_core::{Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// One task: its images, class names, prompt templates and optional fixed head.
#[derive(Clone)]
pub struct ImageTask {
    /// Task name.
    pub name: String,
    /// Class names, in label order (used in the prompts).
    pub classes: Vec<String>,
    /// The images.
    pub examples: Vec<ImageExample>,
    /// Prompt templates, `{}` standing for the class name.
    pub templates: Vec<String>,
    /// A fixed head `[classes, projection]` (rows need not be normalised); `None`: zero-shot.
    pub head: Option<Tensor>,
    /// Preprocessed pixels of `examples`, when kept in memory (landscapes).
    pixels: Option<Tensor>,
}

impl ImageTask {
    /// A task of `examples` (labels index `classes`).
    pub fn new(
        name: String,
        classes: Vec<String>,
        examples: Vec<ImageExample>,
        templates: Vec<String>,
        head: Option<Tensor>,
    ) -> Self {
        ImageTask {
            name,
            classes,
            examples,
            templates,
            head,
            pixels: None,
        }
    }
}

/// Where the CLIP model's other parts come from.
#[derive(Clone, Debug)]
pub struct ClipModelSpec {
    /// `config.json`; default: beside the checkpoint, else the `zeroshot_from` model's.
    pub config: Option<PathBuf>,
    /// `tokenizer.json`; default: beside `zeroshot_from`, else beside the checkpoint.
    pub tokenizer: Option<PathBuf>,
    /// The CLIPModel whose text tower builds zero-shot heads (and whose visual projection and
    /// logit scale serve vision-only fine-tunes); `None`: the evaluated model's own.
    pub zeroshot_from: Option<PathBuf>,
    /// Images per forward pass.
    pub batch_size: usize,
    /// The suite's base model: its config and tokenizer serve checkpoints with none beside them.
    pub base: Option<PathBuf>,
}

/// Weights and heads that do not depend on the evaluated model, loaded once.
#[derive(Default)]
struct Shared {
    fallback: Option<Arc<HashMap<String, Tensor>>>,
    heads: Option<Arc<Vec<Tensor>>>,
}

/// Evaluates CLIP image towers on image-classification tasks.
#[derive(Clone)]
pub struct ImageClassifierEvaluator {
    name: String,
    spec: ClipModelSpec,
    tasks: Vec<ImageTask>,
    device: Device,
    shared: Arc<Mutex<Shared>>,
}

impl ImageClassifierEvaluator {
    /// An evaluator named `name` (a suite's) of `tasks`; heads given as files must have one
    /// row per class.
    pub fn new(name: String, spec: ClipModelSpec, tasks: Vec<ImageTask>, device: &Device) -> Result<Self> {
        if spec.batch_size == 0 {
            return Err(EngineError::Param(format!(
                "suite '{name}': [model] batch_size must be at least 1"
            )));
        }
        for t in &tasks {
            if let Some(h) = &t.head
                && h.dims().first() != Some(&t.classes.len())
            {
                return Err(EngineError::evaluator(format!(
                    "task '{}': its head has shape {:?} but the task has {} classes ({})",
                    t.name,
                    h.dims(),
                    t.classes.len(),
                    t.classes.join(", ")
                )));
            }
        }
        Ok(ImageClassifierEvaluator {
            name,
            spec,
            tasks,
            device: device.clone(),
            shared: Arc::new(Mutex::new(Shared::default())),
        })
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `zeroshot_from` model's weights, loaded once.
    fn fallback(&self) -> Result<Option<Arc<HashMap<String, Tensor>>>> {
        let Some(path) = &self.spec.zeroshot_from else {
            return Ok(None);
        };
        if let Some(w) = &self.shared().fallback {
            return Ok(Some(w.clone()));
        }
        let w = Arc::new(clip::canonical(hf::load_weights(path, &self.device)?));
        self.shared().fallback = Some(w.clone());
        Ok(Some(w))
    }

    fn config_for(&self, checkpoint: &Path) -> Result<ClipConfigs> {
        let path = self
            .spec
            .config
            .clone()
            .or_else(|| hf::beside(checkpoint, "config.json"))
            .or_else(|| self.spec.base.as_ref().and_then(|b| hf::beside(b, "config.json")))
            .or_else(|| self.spec.zeroshot_from.as_ref().and_then(|z| hf::beside(z, "config.json")))
            .ok_or_else(|| {
                EngineError::evaluator(format!(
                    "no config.json beside '{}'; name the CLIP model's config as config = \"...\" (or its folder as zeroshot_from) in the suite's [model] table",
                    checkpoint.display()
                ))
            })?;
        clip::read_config(&path)
    }

    /// The heads of every task, normalised: fixed ones, and zero-shot ones from the
    /// `zeroshot_from` text tower (computed once) or from `weights`' own.
    fn heads(
        &self,
        weights: &HashMap<String, Tensor>,
        config: &ClipConfigs,
        source: &Path,
    ) -> Result<Arc<Vec<Tensor>>> {
        if let Some(h) = &self.shared().heads {
            return Ok(h.clone());
        }
        let needs_text = self.tasks.iter().any(|t| t.head.is_none());
        let text = if needs_text {
            let (text_weights, text_config, text_source) = match (self.fallback()?, &self.spec.zeroshot_from) {
                (Some(f), Some(z)) => (f, self.config_for(z)?, z.clone()),
                _ => (Arc::new(weights.clone()), config.clone(), source.to_owned()),
            };
            let tokenizer_path = self
                .spec
                .tokenizer
                .clone()
                .or_else(|| hf::beside(&text_source, "tokenizer.json"))
                .ok_or_else(|| {
                    EngineError::evaluator(format!(
                        "no tokenizer.json beside '{}' for the zero-shot heads; name it as tokenizer = \"...\" in the suite's [model] table",
                        text_source.display()
                    ))
                })?;
            let tokenizer = hf::load_tokenizer(
                &tokenizer_path,
                text_config.text.as_ref().map_or(77, |t| t.max_position_embeddings),
            )?;
            Some((
                TextEncoder::load(&text_config, &text_weights, &self.device, &text_source)?,
                tokenizer,
            ))
        } else {
            None
        };
        let heads = self
            .tasks
            .iter()
            .map(|t| match (&t.head, &text) {
                (Some(h), _) => clip::l2_normalise(h),
                (None, Some((enc, tok))) => enc.zero_shot_head(tok, &t.classes, &t.templates, &self.device),
                (None, None) => Err(EngineError::Bug("a zero-shot task without a text tower".into())),
            })
            .collect::<Result<Vec<_>>>()?;
        let heads = Arc::new(heads);
        // Heads from fixed files or from the zeroshot_from model do not change between models.
        if !needs_text || self.spec.zeroshot_from.is_some() {
            self.shared().heads = Some(heads.clone());
        }
        Ok(heads)
    }
}

impl ScoresWeights for ImageClassifierEvaluator {
    type Inputs = ClipConfigs;
    const FAMILY: &'static str = "clip";

    suite_accessors!();

    fn subsample(&mut self, like: &Path, samples: usize) -> Result<()> {
        let size = self.config_for(like)?.vision.image_size;
        for t in &mut self.tasks {
            t.examples = evenly(&t.examples, samples);
            // Decoded once: every model of a landscape sees the same images.
            t.pixels = Some(pixels(&t.examples, size, &self.device)?);
        }
        Ok(())
    }

    fn inputs_for(&self, like: &Path) -> Result<ClipConfigs> {
        self.config_for(like)
    }

    fn score_weights(
        &self,
        config: &ClipConfigs,
        weights: HashMap<String, Tensor>,
        source: &Path,
        cancel: &AtomicBool,
    ) -> Result<EvalReport> {
        score_classifier(self, config, weights, source, cancel)
    }
}

/// A CLIP image tower with its logit scale and the head of every task.
pub(crate) struct ImageNet {
    encoder: ImageEncoder,
    scale: f64,
    heads: Arc<Vec<Tensor>>,
}

impl ClassifierFamily for ImageClassifierEvaluator {
    type Net = ImageNet;

    fn build(&self, config: &ClipConfigs, weights: HashMap<String, Tensor>, source: &Path) -> Result<ImageNet> {
        let weights = clip::canonical(weights);
        let fallback = self.fallback()?;
        Ok(ImageNet {
            encoder: ImageEncoder::load(config, &weights, fallback.as_deref(), &self.device, source)?,
            scale: clip::logit_scale(config, &weights, fallback.as_deref())?,
            heads: self.heads(&weights, config, source)?,
        })
    }

    fn examples(&self, task: usize) -> usize {
        self.tasks[task].examples.len()
    }

    fn batch_size(&self) -> usize {
        self.spec.batch_size
    }

    fn logits(
        &self,
        config: &ClipConfigs,
        net: &ImageNet,
        task: usize,
        indices: &[usize],
    ) -> Result<(Tensor, Vec<usize>)> {
        let t = &self.tasks[task];
        let x = match &t.pixels {
            Some(p) => {
                let ids: Vec<u32> = indices.iter().map(|&i| i as u32).collect();
                p.index_select(&Tensor::from_vec(ids, indices.len(), &self.device)?, 0)?
            }
            None => {
                let chosen: Vec<ImageExample> = indices.iter().map(|&i| t.examples[i].clone()).collect();
                pixels(&chosen, config.vision.image_size, &self.device)?
            }
        };
        let logits = clip::logits(&net.encoder.features(&x)?, &net.heads[task], net.scale)?;
        Ok((logits, indices.iter().map(|&i| t.examples[i].label).collect()))
    }
}
