//! The ViT backbone: 7×7 patches (16 tokens) embedded to width 64, a class token and learned
//! positions, two pre-norm transformer blocks (4 heads, MLP 128, GELU), a final layer norm;
//! the features are the class token's.

use super::{IMAGE_SIDE, Init, ParamSpec, Params, get, linear, linear_specs};
use candle_core::{D, Tensor};
use candle_nn::Module as _;
use mergescope_engine::error::Result;

pub(super) const WIDTH: usize = 64;
const PATCH: usize = 7;
const GRID: usize = IMAGE_SIDE / PATCH;
const TOKENS: usize = GRID * GRID + 1;
const HEADS: usize = 4;
const MLP: usize = 128;
const DEPTH: usize = 2;
const EPS: f32 = 1e-5;

fn norm_specs(name: &str) -> [ParamSpec; 2] {
    [
        ParamSpec::new(format!("{name}.weight"), &[WIDTH], Init::Ones),
        ParamSpec::new(format!("{name}.bias"), &[WIDTH], Init::Zeros),
    ]
}

pub(super) fn specs() -> Vec<ParamSpec> {
    let mut s = linear_specs("patch", PATCH * PATCH, WIDTH).to_vec();
    s.push(ParamSpec::new("cls", &[1, 1, WIDTH], Init::Normal(0.02)));
    s.push(ParamSpec::new("pos", &[1, TOKENS, WIDTH], Init::Normal(0.02)));
    for b in 0..DEPTH {
        s.extend(norm_specs(&format!("blocks.{b}.norm1")));
        s.extend(linear_specs(&format!("blocks.{b}.attn.qkv"), WIDTH, 3 * WIDTH));
        s.extend(linear_specs(&format!("blocks.{b}.attn.proj"), WIDTH, WIDTH));
        s.extend(norm_specs(&format!("blocks.{b}.norm2")));
        s.extend(linear_specs(&format!("blocks.{b}.mlp.fc1"), WIDTH, MLP));
        s.extend(linear_specs(&format!("blocks.{b}.mlp.fc2"), MLP, WIDTH));
    }
    s.extend(norm_specs("norm"));
    s
}

fn layer_norm(p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
    // The differentiable formulation (candle-nn's fused kernel has no backward pass).
    Ok(candle_nn::ops::layer_norm_slow(
        x,
        get(p, &format!("{name}.weight"))?,
        get(p, &format!("{name}.bias"))?,
        EPS,
    )?)
}

fn attention(p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let dh = WIDTH / HEADS;
    let qkv = linear(p, &format!("{name}.qkv"))?
        .forward(x)?
        .reshape((b, t, 3, HEADS, dh))?
        .permute((2, 0, 3, 1, 4))?; // [3, b, heads, t, dh]
    let q = qkv.get(0)?.contiguous()?;
    let k = qkv.get(1)?.contiguous()?;
    let v = qkv.get(2)?.contiguous()?;
    let scores = (q.matmul(&k.t()?)? / (dh as f64).sqrt())?;
    let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
    let out = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, t, WIDTH))?;
    Ok(linear(p, &format!("{name}.proj"))?.forward(&out)?)
}

pub(super) fn forward(p: &Params, x: &Tensor) -> Result<Tensor> {
    let b = x.dims()[0];
    // [b, 1, 28, 28] → [b, 4, 7, 4, 7] → [b, 4, 4, 7, 7] → [b, 16, 49]
    let patches = x
        .reshape((b, GRID, PATCH, GRID, PATCH))?
        .permute((0, 1, 3, 2, 4))?
        .contiguous()?
        .reshape((b, GRID * GRID, PATCH * PATCH))?;
    let tokens = linear(p, "patch")?.forward(&patches)?;
    let cls = get(p, "cls")?.broadcast_as((b, 1, WIDTH))?;
    let mut h = Tensor::cat(&[&cls, &tokens], 1)?.broadcast_add(get(p, "pos")?)?;
    for i in 0..DEPTH {
        let n = format!("blocks.{i}");
        let a = attention(p, &format!("{n}.attn"), &layer_norm(p, &format!("{n}.norm1"), &h)?)?;
        h = (h + a)?;
        let m = layer_norm(p, &format!("{n}.norm2"), &h)?;
        let m = linear(p, &format!("{n}.mlp.fc1"))?.forward(&m)?.gelu()?;
        let m = linear(p, &format!("{n}.mlp.fc2"))?.forward(&m)?;
        h = (h + m)?;
    }
    let h = layer_norm(p, "norm", &h)?;
    Ok(h.narrow(1, 0, 1)?.squeeze(1)?)
}
