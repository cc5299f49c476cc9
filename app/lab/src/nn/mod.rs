//! The demo benchmark's models, in candle-nn: a backbone shared by every task (an MLP, a small
//! CNN or a small ViT) and one linear classification head per task.
//!
//! Backbones are plain named tensors ([`Params`]), so a merged checkpoint is evaluated the same
//! way as an expert: the names and shapes of [`Arch::param_specs`] are the whole contract.
//! Heads are kept apart from backbones (in the benchmark's `heads.safetensors`) because the
//! task-vector protocol freezes them and merges combine backbones only.

mod cnn;
mod im2col;
mod mlp;
mod vit;

use candle_core::{DType, Device, Tensor};
use candle_nn::Module as _;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Named tensors (a backbone, or a set of heads).
pub type Params = BTreeMap<String, Tensor>;

/// Side of the square input images every architecture takes.
pub const IMAGE_SIDE: usize = 28;

/// A backbone architecture of the demo benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// 784 → 256 → 128, ReLU.
    Mlp,
    /// Two 3×3 conv + max-pool stages (16, 32 channels), then a 128-unit layer.
    Cnn,
    /// 7×7 patches, width 64, two pre-norm transformer blocks of 4 heads, class token.
    Vit,
}

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform in ±bound (PyTorch's default for linear and conv layers: 1/√fan_in).
    Uniform(f64),
    /// Normal with this standard deviation.
    Normal(f64),
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// Name, shape and initialisation of one backbone parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Tensor name in checkpoints.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
}

impl ParamSpec {
    fn new(name: impl Into<String>, shape: &[usize], init: Init) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            init,
        }
    }
}

/// Weight and bias of a linear layer named `name` with PyTorch's default initialisation.
fn linear_specs(name: &str, fan_in: usize, out: usize) -> [ParamSpec; 2] {
    let bound = 1.0 / (fan_in as f64).sqrt();
    [
        ParamSpec::new(format!("{name}.weight"), &[out, fan_in], Init::Uniform(bound)),
        ParamSpec::new(format!("{name}.bias"), &[out], Init::Uniform(bound)),
    ]
}

/// A candle-nn linear layer from `params[name.weight]` and `params[name.bias]`.
fn linear(p: &Params, name: &str) -> Result<candle_nn::Linear> {
    Ok(candle_nn::Linear::new(
        get(p, &format!("{name}.weight"))?.clone(),
        Some(get(p, &format!("{name}.bias"))?.clone()),
    ))
}

fn get<'a>(p: &'a Params, name: &str) -> Result<&'a Tensor> {
    p.get(name)
        .ok_or_else(|| EngineError::Invalid(format!("the backbone has no tensor '{name}'")))
}

impl Arch {
    /// Every architecture.
    pub const ALL: [Arch; 3] = [Arch::Mlp, Arch::Cnn, Arch::Vit];

    /// Lower-case name (`mlp`, `cnn`, `vit`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Mlp => "mlp",
            Arch::Cnn => "cnn",
            Arch::Vit => "vit",
        }
    }

    /// Parses a lower-case name.
    pub fn parse(s: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == s.to_ascii_lowercase())
    }

    /// Width of the features the heads read.
    pub fn feature_dim(self) -> usize {
        match self {
            Arch::Mlp | Arch::Cnn => 128,
            Arch::Vit => vit::WIDTH,
        }
    }

    /// The backbone's parameters, in a fixed order.
    pub fn param_specs(self) -> Vec<ParamSpec> {
        match self {
            Arch::Mlp => mlp::specs(),
            Arch::Cnn => cnn::specs(),
            Arch::Vit => vit::specs(),
        }
    }

    /// Features `[batch, feature_dim]` of images `[batch, 1, 28, 28]` (values in 0..1).
    pub fn features(self, p: &Params, x: &Tensor) -> Result<Tensor> {
        match self {
            Arch::Mlp => mlp::forward(p, x),
            Arch::Cnn => cnn::forward(p, x),
            Arch::Vit => vit::forward(p, x),
        }
    }

    /// Number of scalar parameters of the backbone.
    pub fn num_params(self) -> usize {
        self.param_specs()
            .iter()
            .map(|s| s.shape.iter().product::<usize>())
            .sum()
    }

    /// The architecture whose backbone has exactly these tensor names and shapes, if any.
    pub fn detect<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Option<Arch> {
        let have: BTreeMap<&str, &[usize]> = tensors.into_iter().collect();
        Arch::ALL.into_iter().find(|a| {
            let specs = a.param_specs();
            specs.len() == have.len()
                && specs
                    .iter()
                    .all(|s| have.get(s.name.as_str()).is_some_and(|sh| *sh == s.shape.as_slice()))
        })
    }

    /// Checks that `p` is a backbone of this architecture; the error names every missing tensor
    /// and every shape mismatch.
    pub fn check(self, p: &Params) -> Result<()> {
        let mut problems = Vec::new();
        for s in self.param_specs() {
            match p.get(&s.name) {
                None => problems.push(format!("tensor '{}' is missing", s.name)),
                Some(t) if t.dims() != s.shape.as_slice() => problems.push(format!(
                    "tensor '{}' has shape {:?}, the {} backbone needs {:?}",
                    s.name,
                    t.dims(),
                    self.name(),
                    s.shape
                )),
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(EngineError::Invalid(format!(
                "not a {} backbone of the demo benchmark:\n  - {}",
                self.name(),
                problems.join("\n  - ")
            )))
        }
    }

    /// A freshly initialised backbone, fully determined by `seed`.
    pub fn init(self, seed: u64, device: &Device) -> Result<Params> {
        let mut rng = SplitMix64::stream(seed, 0xBAC0);
        self.param_specs()
            .into_iter()
            .map(|s| Ok((s.name, init_tensor(&s.shape, s.init, &mut rng, device)?)))
            .collect()
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor of `shape` drawn from `init`.
pub fn init_tensor(shape: &[usize], init: Init, rng: &mut SplitMix64, device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = match init {
        Init::Uniform(b) => (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) * b) as f32).collect(),
        Init::Normal(s) => (0..n).map(|_| (rng.normal() * s) as f32).collect(),
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
    };
    Ok(Tensor::from_vec(v, shape, device)?)
}

/// A task's frozen linear classifier on the backbone's features.
#[derive(Clone, Debug)]
pub struct Head {
    /// `[classes, feature_dim]`.
    pub weight: Tensor,
    /// `[classes]`.
    pub bias: Tensor,
}

impl Head {
    /// A freshly initialised head (PyTorch's linear default), determined by `seed`.
    pub fn init(features: usize, classes: usize, seed: u64, device: &Device) -> Result<Head> {
        let mut rng = SplitMix64::stream(seed, 0x4EAD);
        let b = 1.0 / (features as f64).sqrt();
        Ok(Head {
            weight: init_tensor(&[classes, features], Init::Uniform(b), &mut rng, device)?,
            bias: init_tensor(&[classes], Init::Uniform(b), &mut rng, device)?,
        })
    }

    /// Logits `[batch, classes]` of features `[batch, feature_dim]`.
    pub fn logits(&self, features: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::Linear::new(self.weight.clone(), Some(self.bias.clone())).forward(features)?)
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.bias.dims().first().copied().unwrap_or(0)
    }
}

/// Images `[n, 28, 28]` of 0..255 bytes as a `[n, 1, 28, 28]` f32 tensor in 0..1.
pub fn images_tensor(images: &[u8], device: &Device) -> Result<Tensor> {
    let per = IMAGE_SIDE * IMAGE_SIDE;
    if !images.len().is_multiple_of(per) {
        return Err(EngineError::Invalid(format!(
            "{} image bytes are not a whole number of {IMAGE_SIDE}×{IMAGE_SIDE} images",
            images.len()
        )));
    }
    let n = images.len() / per;
    let v: Vec<f32> = images.iter().map(|b| f32::from(*b) / 255.0).collect();
    Ok(Tensor::from_vec(v, (n, 1, IMAGE_SIDE, IMAGE_SIDE), device)?)
}

/// Labels as a `[n]` u32 tensor (what the cross-entropy loss takes).
pub fn labels_tensor(labels: &[u8], device: &Device) -> Result<Tensor> {
    let v: Vec<u32> = labels.iter().map(|l| u32::from(*l)).collect();
    Ok(Tensor::from_vec(v, labels.len(), device)?)
}

/// Mean cross-entropy of `logits` `[n, classes]` against `labels` `[n]` (u32).
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::loss::cross_entropy(logits, labels)?)
}

/// Named tensors on the host: shape and f32 values.
pub type HostParams = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Copies named tensors to host f32 vectors (for saving and for the merge engine).
pub fn to_host(p: &Params) -> Result<HostParams> {
    p.iter()
        .map(|(k, t)| {
            let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            Ok((k.clone(), (t.dims().to_vec(), v)))
        })
        .collect()
}

/// Loads every float tensor of a checkpoint (file or shard folder) as f32 on `device`.
pub fn load_params(path: &std::path::Path, device: &Device) -> Result<Params> {
    let c = mergescope_engine::checkpoint::Checkpoint::open(path)?;
    c.tensors
        .iter()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(k, t)| Ok((k.clone(), Tensor::from_vec(c.read_f32(t)?, t.shape.clone(), device)?)))
        .collect()
}

/// Largest |a − b| over two tensors of one shape (tests only).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arch_maps_images_to_features_and_is_detected_from_its_names() {
        let dev = Device::Cpu;
        let x = images_tensor(&vec![128u8; 3 * 28 * 28], &dev).unwrap();
        for arch in Arch::ALL {
            let p = arch.init(7, &dev).unwrap();
            arch.check(&p).unwrap();
            let f = arch.features(&p, &x).unwrap();
            assert_eq!(f.dims(), [3, arch.feature_dim()], "{arch}");
            let shapes: Vec<(String, Vec<usize>)> = p.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect();
            let detected = Arch::detect(shapes.iter().map(|(k, s)| (k.as_str(), s.as_slice())));
            assert_eq!(detected, Some(arch));
            assert_eq!(Arch::parse(arch.name()), Some(arch));
        }
    }

    #[test]
    fn init_is_a_function_of_the_seed() {
        let dev = Device::Cpu;
        let a = to_host(&Arch::Cnn.init(1, &dev).unwrap()).unwrap();
        let b = to_host(&Arch::Cnn.init(1, &dev).unwrap()).unwrap();
        let c = to_host(&Arch::Cnn.init(2, &dev).unwrap()).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // PyTorch's default: uniform in ±1/√fan_in (fan_in of conv2 is 16·3·3 = 144).
        let (_, w) = &a["conv2.weight"];
        let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max <= 1.0 / 12.0 && max > 0.95 / 12.0, "{max}");
    }

    #[test]
    fn check_names_every_problem() {
        let dev = Device::Cpu;
        let mut p = Arch::Mlp.init(0, &dev).unwrap();
        p.remove("fc1.bias");
        p.insert("fc2.weight".into(), Tensor::zeros((3, 3), DType::F32, &dev).unwrap());
        let e = Arch::Mlp.check(&p).unwrap_err().to_string();
        assert!(
            e.contains("'fc1.bias' is missing") && e.contains("'fc2.weight' has shape [3, 3]"),
            "{e}"
        );
    }
}
