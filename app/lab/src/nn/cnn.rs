//! The CNN backbone: conv 3×3 (16) → ReLU → max-pool 2 → conv 3×3 (32) → ReLU → max-pool 2 →
//! flatten (32·7·7) → linear 128 → ReLU.

use super::im2col::Im2Col;
use super::{Init, ParamSpec, Params, get, linear, linear_specs};
use candle_core::Tensor;
use candle_nn::Module as _;
use mergescope_engine::error::Result;

const C1: usize = 16;
const C2: usize = 32;
const OUT: usize = 128;

fn conv_specs(name: &str, cin: usize, cout: usize) -> [ParamSpec; 2] {
    let bound = 1.0 / ((cin * 9) as f64).sqrt();
    [
        ParamSpec::new(format!("{name}.weight"), &[cout, cin, 3, 3], Init::Uniform(bound)),
        ParamSpec::new(format!("{name}.bias"), &[cout], Init::Uniform(bound)),
    ]
}

pub(super) fn specs() -> Vec<ParamSpec> {
    let mut s = conv_specs("conv1", 1, C1).to_vec();
    s.extend(conv_specs("conv2", C1, C2));
    s.extend(linear_specs("fc", C2 * 7 * 7, OUT));
    s
}

/// 3×3 convolution with padding 1 of `[b, c, h, w]`. On the CPU: im2col plus one batched
/// matmul (see [`super::im2col`]), fast in both directions; elsewhere candle's convolution.
fn conv(p: &Params, name: &str, x: &Tensor) -> Result<Tensor> {
    let weight = get(p, &format!("{name}.weight"))?;
    let bias = get(p, &format!("{name}.bias"))?;
    let (b, _, h, w) = x.dims4()?;
    let cout = weight.dims()[0];
    let out = if x.device().is_cpu() {
        let cols = x.contiguous()?.apply_op1(Im2Col)?; // [b, c·9, h·w]
        weight
            .flatten_from(1)?
            .broadcast_matmul(&cols)?
            .reshape((b, cout, h, w))?
    } else {
        x.conv2d(weight, 1, 1, 1, 1)?
    };
    Ok(out.broadcast_add(&bias.reshape((1, cout, 1, 1))?)?)
}

pub(super) fn forward(p: &Params, x: &Tensor) -> Result<Tensor> {
    let x = conv(p, "conv1", x)?.relu()?.max_pool2d(2)?;
    let x = conv(p, "conv2", &x)?.relu()?.max_pool2d(2)?;
    let x = x.flatten_from(1)?;
    Ok(linear(p, "fc")?.forward(&x)?.relu()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The im2col path computes candle's convolution, and its gradients are candle's too.
    #[test]
    fn im2col_conv_matches_candle_conv_forward_and_backward() {
        let dev = Device::Cpu;
        let mut rng = mergescope_engine::rng::SplitMix64::new(3);
        let x = super::super::init_tensor(&[2, 3, 5, 6], Init::Normal(1.0), &mut rng, &dev).unwrap();
        let w = super::super::init_tensor(&[4, 3, 3, 3], Init::Normal(1.0), &mut rng, &dev).unwrap();
        let bias = super::super::init_tensor(&[4], Init::Normal(1.0), &mut rng, &dev).unwrap();
        let (xv, wv) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&w).unwrap());
        let p: Params = [
            ("c.weight".to_owned(), wv.as_tensor().clone()),
            ("c.bias".to_owned(), bias.clone()),
        ]
        .into();
        let ours = conv(&p, "c", xv.as_tensor()).unwrap();
        let reference = xv
            .as_tensor()
            .conv2d(wv.as_tensor(), 1, 1, 1, 1)
            .unwrap()
            .broadcast_add(&bias.reshape((1, 4, 1, 1)).unwrap())
            .unwrap();
        let diff = |a: &Tensor, b: &Tensor| {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        assert!(diff(&ours, &reference) < 1e-5);
        // A loss that weights every output differently, so every gradient entry is checked.
        let weights = super::super::init_tensor(ours.dims(), Init::Normal(1.0), &mut rng, &dev).unwrap();
        let g1 = (&ours * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (&reference * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        for v in [&xv, &wv] {
            let (a, b) = (g1.get(v).unwrap(), g2.get(v).unwrap());
            assert!(diff(a, b) < 1e-4, "{}", diff(a, b));
        }
    }
}
