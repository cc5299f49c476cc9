//! LoRA fine-tuning of the text benchmark's experts (issue #23): instead of every backbone
//! tensor, only a pair of low-rank factors per adapted weight is trained, A (`[r, in]`, drawn
//! uniform in ±1/√in from the recipe's seed: PEFT's default `kaiming_uniform_(a=√5)`) and B
//! (`[out, r]`, zero), the weight read as W + (alpha/r)·B·A (PEFT's scaling); every other
//! tensor (embeddings, biases, layer norms, pooler) stays the backbone's. Training computes each
//! adapted map as the usual side path, x·Wᵀ + (alpha/r)·((x·Aᵀ)·Bᵀ) + b with W frozen
//! ([`LoraFactors::linears`]), so a step costs less than a full fine-tuning step. The expert is written
//! as the merged dense model, so merges and evaluators read it as any other expert (its task
//! vector is of rank ≤ r in each adapted weight and zero elsewhere), and beside it as a PEFT
//! adapter (`adapters/<task>/`: `adapter_config.json`, `adapter_model.safetensors` with PEFT's
//! names, `base_model.model.encoder.layer.N.attention.self.query.lora_A.weight`), which the
//! engine reads as an expert over the base ([`mergescope_interop::request::open_expert`]).

use crate::demo::save_params;
use crate::family::bert::{Linears, SidePath};
use crate::nn::Params;
use candle_core::{DType, Device, Tensor, Var};
use mergescope_engine::error::{EngineError, Result};
use mergescope_interop::lora::peft_factor_name;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The weights LoRA adapts by default, by their names inside a layer (`encoder.layer.N.`):
/// attention query, key, value and output projections, and the MLP's two matrices.
pub const LORA_TARGETS: [&str; 6] = [
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
];

/// Peak learning rate of LoRA experts when none is given (`--lora-rank` without `--text-lr`):
/// the factors start at zero update and need a larger step than full fine-tuning's 10⁻⁴.
pub const TEXT_LORA_LR: f64 = 1e-3;

/// How each expert is fine-tuned. Absent from a recipe (builds before LoRA): full.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum FineTuning {
    /// Every backbone tensor is trained.
    #[default]
    Full,
    /// Only LoRA factors of the target weights are trained.
    Lora(LoraRecipe),
}

impl FineTuning {
    /// Whether it is full fine-tuning (what a recipe without the field means).
    pub fn is_full(&self) -> bool {
        matches!(self, FineTuning::Full)
    }

    /// A short description: `full` or `LoRA r=8 alpha=16`.
    pub fn describe(&self) -> String {
        match self {
            FineTuning::Full => "full".to_owned(),
            FineTuning::Lora(l) => format!("LoRA r={} alpha={}", l.rank, l.alpha),
        }
    }
}

/// LoRA settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraRecipe {
    /// Rank r of each update.
    pub rank: usize,
    /// alpha: the update is scaled by alpha / r.
    pub alpha: f64,
    /// The adapted weights, by their names inside a layer (see [`LORA_TARGETS`]).
    pub targets: Vec<String>,
}

impl LoraRecipe {
    /// Rank `rank`, alpha 2·rank (scale 2, as PEFT's BERT examples: r 8, alpha 16), every
    /// weight of [`LORA_TARGETS`].
    pub fn new(rank: usize) -> LoraRecipe {
        LoraRecipe {
            rank,
            alpha: 2.0 * rank as f64,
            targets: LORA_TARGETS.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    /// alpha / r.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank.max(1) as f64
    }

    /// Checks rank, alpha and targets; the errors name the command-line flags.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(EngineError::invalid(
                "--lora-rank 0: give a LoRA rank of 1 or more (8 is usual), or leave --lora-rank out for full fine-tuning",
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(EngineError::invalid(format!(
                "--lora-alpha {}: give a positive number (the update is scaled by alpha / rank; default 2 × rank)",
                self.alpha
            )));
        }
        if self.targets.is_empty() {
            return Err(EngineError::invalid(format!(
                "--lora-targets: name at least one weight to adapt: {}",
                LORA_TARGETS.join(", ")
            )));
        }
        if let Some(bad) = self.targets.iter().find(|t| !LORA_TARGETS.contains(&t.as_str())) {
            return Err(EngineError::invalid(format!(
                "--lora-targets: unknown weight '{bad}'; the weights LoRA adapts are {}",
                LORA_TARGETS.join(", ")
            )));
        }
        Ok(())
    }

    /// The names of the weights of `weights` it adapts (`encoder.layer.N.<target>.weight`), in
    /// name order.
    pub fn target_weights(&self, weights: &Params) -> Vec<String> {
        weights
            .keys()
            .filter(|name| {
                let Some((n, module)) = name.strip_prefix("encoder.layer.").and_then(|r| r.split_once('.')) else {
                    return false;
                };
                n.parse::<usize>().is_ok()
                    && module
                        .strip_suffix(".weight")
                        .is_some_and(|m| self.targets.iter().any(|t| t == m))
            })
            .cloned()
            .collect()
    }
}

/// One adapted weight: its name and its factors.
pub struct LoraPair {
    /// The weight's name in the backbone (`encoder.layer.0.attention.self.query.weight`).
    pub weight: String,
    /// A, `[r, in]`.
    pub a: Var,
    /// B, `[out, r]`.
    pub b: Var,
}

/// The trainable factors of one expert.
pub struct LoraFactors {
    /// alpha / r.
    pub scale: f64,
    /// One pair per adapted weight, in name order.
    pub pairs: Vec<LoraPair>,
}

impl LoraFactors {
    /// Fresh factors for the target weights of `weights`: A uniform in ±1/√in from
    /// `(seed, stream)`, drawn in name order; B zero (so the model starts as the backbone).
    pub fn init(weights: &Params, lora: &LoraRecipe, seed: u64, stream: u64, device: &Device) -> Result<LoraFactors> {
        lora.validate()?;
        let names = lora.target_weights(weights);
        if names.is_empty() {
            return Err(EngineError::invalid(format!(
                "the backbone has none of the weights --lora-targets names ({}) as encoder.layer.N.<name>.weight; LoRA needs a bare BERT model",
                lora.targets.join(", ")
            )));
        }
        let mut rng = mergescope_engine::rng::SplitMix64::stream(seed, stream);
        let mut pairs = Vec::new();
        for name in names {
            let w = weights
                .get(&name)
                .ok_or_else(|| EngineError::Bug(format!("no weight '{name}'")))?;
            let (out, inp) = w.dims2()?;
            if lora.rank > out.min(inp) {
                return Err(EngineError::invalid(format!(
                    "--lora-rank {}: '{name}' is {out}×{inp}, so a rank above {} adapts nothing more; give --lora-rank {} or less",
                    lora.rank,
                    out.min(inp),
                    out.min(inp)
                )));
            }
            let bound = 1.0 / (inp as f64).sqrt();
            let a: Vec<f32> = (0..lora.rank * inp)
                .map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32)
                .collect();
            pairs.push(LoraPair {
                weight: name,
                a: Var::from_tensor(&Tensor::from_vec(a, (lora.rank, inp), device)?)?,
                b: Var::zeros((out, lora.rank), DType::F32, device)?,
            });
        }
        Ok(LoraFactors {
            scale: lora.scale(),
            pairs,
        })
    }

    /// The trainable variables (A and B of every pair).
    pub fn vars(&self) -> Vec<Var> {
        self.pairs.iter().flat_map(|p| [p.a.clone(), p.b.clone()]).collect()
    }

    /// How the encoder's layers compute with these factors during training: every layer's
    /// weight frozen, and each adapted one read as x·Wᵀ + scale·((x·Aᵀ)·Bᵀ) + b, recording
    /// operations back to A and B only (W + scale·B·A is never formed, nor W's gradient).
    pub fn linears(&self) -> Linears {
        let paths = self
            .pairs
            .iter()
            .map(|p| {
                let module = p.weight.strip_suffix(".weight").unwrap_or(&p.weight).to_owned();
                let path = SidePath {
                    a: p.a.as_tensor().clone(),
                    b: p.b.as_tensor().clone(),
                    scale: self.scale,
                };
                (module, path)
            })
            .collect();
        Linears::Frozen(paths)
    }

    /// The merged dense model W + scale·B·A, detached from autograd (what the expert is).
    pub fn merged(&self, base: &Params) -> Result<Params> {
        let mut out = base.clone();
        for p in &self.pairs {
            let w = base
                .get(&p.weight)
                .ok_or_else(|| EngineError::Bug(format!("the base lost '{}'", p.weight)))?;
            let (a, b) = (p.a.as_tensor().detach(), p.b.as_tensor().detach());
            let update = (b.matmul(&a)? * self.scale)?;
            out.insert(p.weight.clone(), (w + update)?);
        }
        Ok(out)
    }

    /// The factors by PEFT's names (`base_model.model.<module>.lora_A.weight`, `…lora_B.weight`).
    pub fn adapter_tensors(&self) -> Params {
        let mut out = BTreeMap::new();
        for p in &self.pairs {
            out.insert(peft_factor_name(&p.weight, "A", false), p.a.as_tensor().detach());
            out.insert(peft_factor_name(&p.weight, "B", false), p.b.as_tensor().detach());
        }
        out
    }

    /// Writes the factors as a PEFT LoRA adapter folder (`adapter_config.json`,
    /// `adapter_model.safetensors`) over the model at `base_model`.
    pub fn write_adapter(&self, dir: &Path, lora: &LoraRecipe, base_model: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| EngineError::io("cannot create", dir, e))?;
        let modules: Vec<&str> = self
            .pairs
            .iter()
            .map(|p| p.weight.strip_suffix(".weight").unwrap_or(&p.weight))
            .collect();
        // Full module names: PEFT matches a target list by the end of a module's name, and
        // `output.dense` would also reach `attention.output.dense`.
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "FEATURE_EXTRACTION",
            "base_model_name_or_path": base_model,
            "r": lora.rank,
            "lora_alpha": lora.alpha,
            "target_modules": modules,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "init_lora_weights": true,
            "modules_to_save": null,
            "inference_mode": true,
        });
        let text = serde_json::to_string_pretty(&config)
            .map_err(|e| EngineError::Bug(format!("cannot encode adapter_config.json: {e}")))?;
        let path = dir.join(mergescope_interop::lora::CONFIG_FILE);
        std::fs::write(&path, text).map_err(|e| EngineError::io("cannot write", &path, e))?;
        let meta = [("format".to_owned(), "pt".to_owned())].into_iter().collect();
        save_params(
            &dir.join(mergescope_interop::lora::WEIGHTS_FILE),
            &self.adapter_tensors(),
            &meta,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights() -> Params {
        let d = Device::Cpu;
        let mut p = Params::new();
        for l in 0..2 {
            for t in LORA_TARGETS {
                let (o, i) = match t {
                    "intermediate.dense" => (8, 4),
                    "output.dense" => (4, 8),
                    _ => (4, 4),
                };
                p.insert(
                    format!("encoder.layer.{l}.{t}.weight"),
                    Tensor::ones((o, i), DType::F32, &d).unwrap(),
                );
                p.insert(
                    format!("encoder.layer.{l}.{t}.bias"),
                    Tensor::ones(o, DType::F32, &d).unwrap(),
                );
            }
        }
        p.insert(
            "embeddings.word_embeddings.weight".into(),
            Tensor::ones((9, 4), DType::F32, &d).unwrap(),
        );
        p.insert(
            "pooler.dense.weight".into(),
            Tensor::ones((4, 4), DType::F32, &d).unwrap(),
        );
        p
    }

    #[test]
    fn targets_are_the_layer_matrices_named_and_nothing_else() {
        let w = weights();
        let all = LoraRecipe::new(2).target_weights(&w);
        assert_eq!(all.len(), 12);
        assert!(
            all.iter()
                .all(|n| n.starts_with("encoder.layer.") && n.ends_with(".weight"))
        );
        let mut r = LoraRecipe::new(2);
        r.targets = vec!["output.dense".into()];
        // `output.dense` is not `attention.output.dense`.
        assert_eq!(
            r.target_weights(&w),
            [
                "encoder.layer.0.output.dense.weight",
                "encoder.layer.1.output.dense.weight"
            ]
        );
    }

    #[test]
    fn bad_settings_name_their_flag() {
        let e = LoraRecipe::new(0).validate().unwrap_err().to_string();
        assert!(e.contains("--lora-rank 0"), "{e}");
        let mut r = LoraRecipe::new(2);
        r.alpha = -1.0;
        assert!(r.validate().unwrap_err().to_string().contains("--lora-alpha -1"));
        r.alpha = 4.0;
        r.targets = vec!["attention.self.querry".into()];
        let e = r.validate().unwrap_err().to_string();
        assert!(
            e.contains("'attention.self.querry'") && e.contains("attention.self.query"),
            "{e}"
        );
        let e = LoraFactors::init(&weights(), &LoraRecipe::new(5), 0, 0, &Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--lora-rank 5") && e.contains("4 or less"), "{e}");
    }

    #[test]
    fn factors_start_as_the_backbone_and_are_seeded() {
        let w = weights();
        let r = LoraRecipe::new(2);
        let f = LoraFactors::init(&w, &r, 7, 1, &Device::Cpu).unwrap();
        assert_eq!(f.scale, 2.0);
        assert_eq!(f.pairs.len(), 12);
        let merged = f.merged(&w).unwrap();
        for (k, t) in &w {
            let d = (&merged[k] - t).unwrap().abs().unwrap().sum_all().unwrap();
            assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0, "{k}");
        }
        let a = |f: &LoraFactors| {
            f.pairs[0]
                .a
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        let again = LoraFactors::init(&w, &r, 7, 1, &Device::Cpu).unwrap();
        assert_eq!(a(&f), a(&again));
        assert!(a(&f).iter().all(|x| x.abs() <= 0.5) && a(&f).iter().any(|x| *x != 0.0));
        let other = LoraFactors::init(&w, &r, 7, 2, &Device::Cpu).unwrap();
        assert_ne!(a(&f), a(&other));
        let names: Vec<String> = f.adapter_tensors().into_keys().collect();
        assert!(names.contains(&"base_model.model.encoder.layer.0.attention.self.query.lora_A.weight".to_owned()));
        assert!(names.contains(&"base_model.model.encoder.layer.1.output.dense.lora_B.weight".to_owned()));
    }

    /// The largest |x − y| over the largest |y|.
    fn relative_gap(x: &Tensor, y: &Tensor) -> f32 {
        let gap = crate::nn::max_abs_diff(x, y);
        let scale = y.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        gap / scale
    }

    /// The side path computes the merged dense layer W + scale·B·A to f32 rounding, forward and
    /// backward, and no layer matrix gets a gradient even when it could take one.
    #[test]
    fn the_side_path_is_the_merged_weight_and_only_the_factors_get_gradients() {
        use crate::family::bert::TokenBatch;
        use crate::text_bench::build::Backbone;
        use crate::text_bench::tiny::tiny_backbone;
        let tmp = tempfile::tempdir().unwrap();
        let d = Device::Cpu;
        let backbone = Backbone::load(&tiny_backbone(tmp.path()).unwrap(), 16, &d).unwrap();
        let weights = &backbone.weights;
        let factors = LoraFactors::init(weights, &LoraRecipe::new(2), 1, 2, &d).unwrap();
        // B starts at zero; give it values so the side path counts.
        let mut rng = mergescope_engine::rng::SplitMix64::new(9);
        for p in &factors.pairs {
            let v: Vec<f32> = (0..p.b.elem_count())
                .map(|_| ((rng.uniform() * 2.0 - 1.0) * 0.2) as f32)
                .collect();
            p.b.set(&Tensor::from_vec(v, p.b.shape(), &d).unwrap()).unwrap();
        }
        let batch = TokenBatch {
            ids: Tensor::new(&[[2u32, 9, 14, 30, 3], [2, 5, 17, 3, 0]], &d).unwrap(),
            type_ids: Tensor::zeros((2, 5), DType::U32, &d).unwrap(),
            mask: Tensor::new(&[[1u32, 1, 1, 1, 1], [1, 1, 1, 1, 0]], &d).unwrap(),
        };
        // Each hidden value weighed differently (the norms make a plain sum of squares constant).
        let loss = |h: &Tensor| {
            let n = h.elem_count() as u32;
            let w = (Tensor::arange(0u32, n, &d).unwrap().to_dtype(DType::F32).unwrap() * 0.37)
                .unwrap()
                .cos()
                .unwrap()
                .reshape(h.shape())
                .unwrap();
            (h * w).unwrap().sum_all().unwrap()
        };
        // Every backbone tensor a variable, so a gradient that reached a layer matrix would show.
        let vars = crate::train::to_vars(weights).unwrap();
        let params = crate::train::from_vars(&vars);
        let side = backbone.encoder_with(&params, &factors.linears(), &d).unwrap();
        let got = side.hidden_states(&batch).unwrap();
        let grads = loss(&got).backward().unwrap();
        // The reference: the dense layer W + scale·B·A, formed with the factors tracked.
        let mut dense = weights.clone();
        for p in &factors.pairs {
            let update = (p.b.as_tensor().matmul(p.a.as_tensor()).unwrap() * factors.scale).unwrap();
            dense.insert(p.weight.clone(), (&weights[&p.weight] + update).unwrap());
        }
        let want = backbone.encoder(&dense, &d).unwrap().hidden_states(&batch).unwrap();
        let want_grads = loss(&want).backward().unwrap();
        let gap = relative_gap(&got, &want);
        assert!(gap <= 1e-5, "forward: {gap}");
        let merged = backbone.encoder(&factors.merged(weights).unwrap(), &d).unwrap();
        assert!(relative_gap(&got, &merged.hidden_states(&batch).unwrap()) <= 1e-5);
        for p in &factors.pairs {
            for (name, f) in [("A", &p.a), ("B", &p.b)] {
                let g = grads.get(f.as_tensor()).unwrap();
                let w = want_grads.get(f.as_tensor()).unwrap();
                assert!(w.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() > 0.0);
                let gap = relative_gap(g, w);
                assert!(gap <= 1e-5, "{name} of {}: {gap}", p.weight);
            }
        }
        let mut matrices = 0;
        for (name, v) in &vars {
            if name.starts_with("encoder.layer.") && v.rank() == 2 {
                matrices += 1;
                assert!(grads.get(v.as_tensor()).is_none(), "{name} is frozen");
            }
        }
        assert_eq!(matrices, 12);
    }

    #[test]
    fn a_recipe_without_the_mode_is_full_fine_tuning() {
        let lora = FineTuning::Lora(LoraRecipe::new(8));
        let text = serde_json::to_string(&lora).unwrap();
        assert!(
            text.contains("\"mode\":\"lora\"") && text.contains("\"rank\":8"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<FineTuning>(&text).unwrap(), lora);
        assert_eq!(lora.describe(), "LoRA r=8 alpha=16");
    }
}
