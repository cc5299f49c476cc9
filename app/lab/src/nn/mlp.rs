//! The MLP backbone: flatten, 784 → 256 → 128 with ReLU.

use super::{IMAGE_SIDE, ParamSpec, Params, linear, linear_specs};
use candle_core::Tensor;
use candle_nn::Module as _;
use mergescope_engine::error::Result;

const HIDDEN: usize = 256;
const OUT: usize = 128;

pub(super) fn specs() -> Vec<ParamSpec> {
    let mut s = linear_specs("fc1", IMAGE_SIDE * IMAGE_SIDE, HIDDEN).to_vec();
    s.extend(linear_specs("fc2", HIDDEN, OUT));
    s
}

pub(super) fn forward(p: &Params, x: &Tensor) -> Result<Tensor> {
    let x = x.flatten_from(1)?;
    let x = linear(p, "fc1")?.forward(&x)?.relu()?;
    Ok(linear(p, "fc2")?.forward(&x)?.relu()?)
}
