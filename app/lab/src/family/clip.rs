//! The CLIP family (`model_type: "clip"`, and the `clip_vision_model` fine-tunes FusionBench
//! publishes) for image classification, as the task-arithmetic papers score it: the image
//! tower (candle-transformers' CLIP) and visual projection give an image embedding, each class
//! an embedding of its prompts from the text tower (a zero-shot head), and the logits are the
//! scaled cosines, as `CLIPModel.logits_per_image`.

use super::hf;
use candle_core::{D, Device, Tensor};
use candle_nn::{Linear, Module};
use candle_transformers::models::clip::text_model::{Activation, ClipTextConfig, ClipTextTransformer};
use candle_transformers::models::clip::vision_model::{ClipVisionConfig, ClipVisionTransformer};
use mergescope_engine::error::{EngineError, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::Tokenizer;

/// The two towers' settings and the shared projection width.
#[derive(Clone, Debug)]
pub struct ClipConfigs {
    /// The image tower.
    pub vision: ClipVisionConfig,
    /// The text tower (absent from a vision-only config).
    pub text: Option<ClipTextConfig>,
    /// Width of the joint embedding.
    pub projection_dim: usize,
    /// exp of this scales the cosines when the checkpoint has no `logit_scale`.
    pub logit_scale_init: f32,
}

#[derive(Deserialize)]
struct Tower {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default = "quick_gelu")]
    hidden_act: String,
    #[serde(default = "eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    vocab_size: Option<usize>,
    #[serde(default)]
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    image_size: Option<usize>,
    #[serde(default)]
    patch_size: Option<usize>,
    #[serde(default)]
    num_channels: Option<usize>,
    #[serde(default)]
    projection_dim: Option<usize>,
}

fn quick_gelu() -> String {
    "quick_gelu".into()
}

fn eps() -> f64 {
    1e-5
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    text_config: Option<Tower>,
    #[serde(default)]
    vision_config: Option<Tower>,
    #[serde(default)]
    projection_dim: Option<usize>,
    #[serde(default)]
    logit_scale_init_value: Option<f32>,
}

/// Reads a CLIP `config.json` (a `CLIPModel`'s, or a `CLIPVisionModel`'s); errors name the
/// key candle's CLIP cannot follow.
pub fn read_config(path: &Path) -> Result<ClipConfigs> {
    let file: ConfigFile = hf::read_config(path, &[])?;
    let bad = |what: String| EngineError::evaluator(format!("'{}': {what}", path.display()));
    let (vision, text) = match file.model_type.as_deref() {
        Some("clip") => (file.vision_config, file.text_config),
        // A vision-only model's settings are the file's own keys.
        Some("clip_vision_model") => (Some(hf::read_config::<Tower>(path, &[])?), None),
        other => {
            return Err(bad(format!(
                "model_type {other:?} is not CLIP; the clip family reads \"clip\" (CLIPModel) and \"clip_vision_model\" (CLIPVisionModel) folders"
            )));
        }
    };
    let vision = vision.ok_or_else(|| bad("has no vision_config".into()))?;
    for (tower, t) in [("vision", Some(&vision)), ("text", text.as_ref())] {
        let Some(t) = t else { continue };
        if t.hidden_act != "quick_gelu" {
            return Err(bad(format!(
                "the {tower} tower's hidden_act is '{}'; candle's CLIP computes quick_gelu only",
                t.hidden_act
            )));
        }
        if (t.layer_norm_eps - 1e-5).abs() > 1e-12 {
            return Err(bad(format!(
                "the {tower} tower's layer_norm_eps is {}; candle's CLIP uses 1e-5",
                t.layer_norm_eps
            )));
        }
    }
    let projection_dim = file.projection_dim.or(vision.projection_dim).unwrap_or(512);
    let text = match text {
        Some(t) => Some(ClipTextConfig {
            vocab_size: t
                .vocab_size
                .ok_or_else(|| bad("text_config has no vocab_size".into()))?,
            embed_dim: t.hidden_size,
            activation: Activation::QuickGelu,
            intermediate_size: t.intermediate_size,
            max_position_embeddings: t.max_position_embeddings.unwrap_or(77),
            pad_with: None,
            num_hidden_layers: t.num_hidden_layers,
            num_attention_heads: t.num_attention_heads,
            projection_dim,
        }),
        None => None,
    };
    Ok(ClipConfigs {
        vision: ClipVisionConfig {
            embed_dim: vision.hidden_size,
            activation: Activation::QuickGelu,
            intermediate_size: vision.intermediate_size,
            num_hidden_layers: vision.num_hidden_layers,
            num_attention_heads: vision.num_attention_heads,
            projection_dim,
            num_channels: vision.num_channels.unwrap_or(3),
            image_size: vision.image_size.unwrap_or(224),
            patch_size: vision.patch_size.unwrap_or(32),
        },
        text,
        projection_dim,
        logit_scale_init: file.logit_scale_init_value.unwrap_or(2.6592),
    })
}

/// The weights of a CLIP checkpoint with the names transformers gives them: a `CLIPModel`'s as
/// they are, and those of models that wrap one (`model.` or `clip_model.` prefixes) with the
/// prefix removed.
pub fn canonical(weights: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    let prefix = ["clip_model.", "model."]
        .into_iter()
        .find(|p| weights.keys().any(|k| k.starts_with(&format!("{p}vision_model."))));
    match prefix {
        Some(p) => weights
            .into_iter()
            .map(|(k, v)| (k.strip_prefix(p).map(str::to_owned).unwrap_or(k), v))
            .collect(),
        None => weights,
    }
}

fn linear_no_bias(weights: &HashMap<String, Tensor>, name: &str) -> Option<Linear> {
    weights.get(name).map(|w| Linear::new(w.clone(), None))
}

/// The image side: the vision tower and the visual projection.
pub struct ImageEncoder {
    tower: ClipVisionTransformer,
    projection: Linear,
}

impl ImageEncoder {
    /// Builds it from `weights` (`vision_model.*`), taking `visual_projection.weight` from
    /// `weights` or else from `fallback` (a vision-only fine-tune has none of its own).
    pub fn load(
        config: &ClipConfigs,
        weights: &HashMap<String, Tensor>,
        fallback: Option<&HashMap<String, Tensor>>,
        device: &Device,
        source: &Path,
    ) -> Result<ImageEncoder> {
        let projection = linear_no_bias(weights, "visual_projection.weight")
            .or_else(|| fallback.and_then(|f| linear_no_bias(f, "visual_projection.weight")))
            .ok_or_else(|| {
                EngineError::evaluator(format!(
                    "'{}' has no visual_projection.weight (a CLIPVisionModel fine-tune): name the CLIPModel it was fine-tuned from as zeroshot_from in the suite's [model] table",
                    source.display()
                ))
            })?;
        if !weights.contains_key("vision_model.embeddings.class_embedding") {
            return Err(EngineError::evaluator(format!(
                "'{}' has no vision_model.embeddings.class_embedding: it is not a CLIP image tower",
                source.display()
            )));
        }
        let vb = hf::var_builder(weights.clone(), device);
        let tower = ClipVisionTransformer::new(vb.pp("vision_model"), &config.vision).map_err(|e| {
            EngineError::evaluator(format!(
                "'{}' is not a CLIP image tower of its config (width {}, {} layers): {e}",
                source.display(),
                config.vision.embed_dim,
                config.vision.num_hidden_layers
            ))
        })?;
        Ok(ImageEncoder { tower, projection })
    }

    /// Unnormalised image embeddings `[batch, projection]` of pixels `[batch, 3, size, size]`.
    pub fn features(&self, pixels: &Tensor) -> Result<Tensor> {
        Ok(self.projection.forward(&self.tower.forward(pixels)?)?)
    }
}

/// The text side: the text tower and the text projection.
pub struct TextEncoder {
    tower: ClipTextTransformer,
    projection: Linear,
}

impl TextEncoder {
    /// Builds it from `weights` (`text_model.*`, `text_projection.weight`).
    pub fn load(
        config: &ClipConfigs,
        weights: &HashMap<String, Tensor>,
        device: &Device,
        source: &Path,
    ) -> Result<TextEncoder> {
        let missing = || {
            EngineError::evaluator(format!(
                "'{}' has no CLIP text tower (text_model.*, text_projection.weight) to build zero-shot heads from; name a CLIPModel folder as zeroshot_from in the suite's [model] table, or give each task a head file",
                source.display()
            ))
        };
        let text = config.text.as_ref().ok_or_else(missing)?;
        let projection = linear_no_bias(weights, "text_projection.weight").ok_or_else(missing)?;
        let vb = hf::var_builder(weights.clone(), device);
        let tower = ClipTextTransformer::new(vb.pp("text_model"), text).map_err(|e| {
            EngineError::evaluator(format!(
                "'{}': the CLIP text tower does not match its config: {e}",
                source.display()
            ))
        })?;
        Ok(TextEncoder { tower, projection })
    }

    /// The zero-shot head of `classes`: for each class, the mean of the normalised embeddings
    /// of its prompts (`{}` in each template replaced by the class name), normalised again;
    /// `[classes, projection]`.
    pub fn zero_shot_head(
        &self,
        tokenizer: &Tokenizer,
        classes: &[String],
        templates: &[String],
        device: &Device,
    ) -> Result<Tensor> {
        let mut rows = Vec::with_capacity(classes.len());
        for class in classes {
            let prompts: Vec<String> = templates.iter().map(|t| t.replace("{}", class)).collect();
            let ids = tokenizer
                .encode_batch(prompts.iter().map(String::as_str).collect::<Vec<_>>(), true)
                .map_err(|e| EngineError::evaluator(format!("the CLIP tokenizer failed on '{class}': {e}")))?;
            let len = ids.iter().map(|e| e.get_ids().len()).max().unwrap_or(1);
            // Padding with 0 after the end-of-text token leaves its embedding unchanged: the
            // text tower is causal and pools at the largest id (the end-of-text token).
            let mut flat = vec![0u32; ids.len() * len];
            for (r, e) in ids.iter().enumerate() {
                flat[r * len..r * len + e.get_ids().len()].copy_from_slice(e.get_ids());
            }
            let input = Tensor::from_vec(flat, (ids.len(), len), device)?;
            let emb = l2_normalise(&self.projection.forward(&self.tower.forward(&input)?)?)?;
            rows.push(l2_normalise(&emb.mean(0)?.unsqueeze(0)?)?);
        }
        Ok(Tensor::cat(&rows, 0)?)
    }
}

/// Rows divided by their L2 norms.
pub fn l2_normalise(x: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_div(&x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?)?)
}

/// The factor of the cosines: exp(`logit_scale`) of the checkpoint, else of the config's
/// initial value.
pub fn logit_scale(
    config: &ClipConfigs,
    weights: &HashMap<String, Tensor>,
    fallback: Option<&HashMap<String, Tensor>>,
) -> Result<f64> {
    let t = weights
        .get("logit_scale")
        .or_else(|| fallback.and_then(|f| f.get("logit_scale")));
    Ok(match t {
        Some(t) => f64::from(
            t.flatten_all()?
                .to_vec1::<f32>()?
                .first()
                .copied()
                .unwrap_or(config.logit_scale_init),
        )
        .exp(),
        None => f64::from(config.logit_scale_init).exp(),
    })
}

/// Logits `[batch, classes]`: scale × cosine of each image embedding with each head row
/// (head rows already normalised).
pub fn logits(image_features: &Tensor, head: &Tensor, scale: f64) -> Result<Tensor> {
    Ok((l2_normalise(image_features)?.matmul(&head.t()?)? * scale)?)
}
