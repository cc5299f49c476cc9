//! The linear maps of the BERT network ([`super::net`]) and the one parameter they take:
//! as the checkpoint has them (evaluation, full fine-tuning: `candle_nn::Linear`, op for op), or
//! with the weight frozen and, where named, a low-rank side path (LoRA training):
//! y = x·Wᵀ + scale·((x·Aᵀ)·Bᵀ) + b. A frozen product x·Wᵀ is [`FrozenMatmul`], which gives its
//! input the gradient candle's matmul would (the same bits) but never forms the weight's
//! gradient, the `[out, in]` product candle's matmul backward always computes; so a LoRA step
//! costs the forward and the input gradients of the dense layers plus rank-r products, and
//! W + scale·B·A is never formed.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Layout, MetalStorage, Module, Shape, Tensor};
use candle_nn::VarBuilder;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// One low-rank side path: the map reads x·Wᵀ + scale·((x·Aᵀ)·Bᵀ) + b.
#[derive(Clone, Debug)]
pub struct SidePath {
    /// A, `[r, in]`.
    pub a: Tensor,
    /// B, `[out, r]`.
    pub b: Tensor,
    /// The factor the path is scaled by (LoRA's alpha / r).
    pub scale: f64,
}

/// How the encoder layers' linear maps are computed.
#[derive(Clone, Debug, Default)]
pub enum Linears {
    /// As the checkpoint has them, gradients reaching every weight that tracks one
    /// (evaluation and full fine-tuning).
    #[default]
    AsLoaded,
    /// Every encoder layer's weight frozen (no gradient is formed for it), with side paths on
    /// the maps named by their module (`encoder.layer.0.attention.self.query`, as the
    /// checkpoint names the weight without `.weight`). Every name must be a linear map of an
    /// encoder layer.
    Frozen(HashMap<String, SidePath>),
}

/// What loading the layers needs besides the weights: the parameter, and the side paths used.
pub(super) struct LinearsLoader<'a> {
    linears: &'a Linears,
    used: RefCell<BTreeSet<String>>,
}

impl<'a> LinearsLoader<'a> {
    pub(super) fn new(linears: &'a Linears) -> Self {
        LinearsLoader {
            linears,
            used: RefCell::new(BTreeSet::new()),
        }
    }

    /// The linear map `in_dim → out_dim` at `vb`'s path.
    pub(super) fn load(&self, in_dim: usize, out_dim: usize, vb: VarBuilder) -> candle_core::Result<Linear> {
        let inner = candle_nn::linear(in_dim, out_dim, vb.clone())?;
        let (frozen, side) = match self.linears {
            Linears::AsLoaded => (false, None),
            Linears::Frozen(sides) => {
                let name = vb.prefix();
                let side = sides.get(&name).cloned();
                if side.is_some() {
                    self.used.borrow_mut().insert(name);
                }
                (true, side)
            }
        };
        Ok(Linear { inner, frozen, side })
    }

    /// Refuses side paths that named no linear map of the network.
    pub(super) fn check_all_used(&self) -> candle_core::Result<()> {
        let Linears::Frozen(sides) = self.linears else {
            return Ok(());
        };
        let used = self.used.borrow();
        let mut unknown: Vec<&String> = sides.keys().filter(|k| !used.contains(*k)).collect();
        unknown.sort();
        if let Some(first) = unknown.first() {
            candle_core::bail!(
                "{} side path(s) name no linear map of the encoder's layers, e.g. '{first}' (names are the weights' without .weight, e.g. encoder.layer.0.attention.self.query)",
                unknown.len()
            );
        }
        Ok(())
    }
}

/// A linear map of an encoder layer.
#[derive(Clone, Debug)]
pub(super) struct Linear {
    inner: candle_nn::Linear,
    frozen: bool,
    side: Option<SidePath>,
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if !self.frozen {
            return self.inner.forward(x);
        }
        // As candle_nn::Linear for a contiguous input: one [tokens, in] × [in, out] product.
        let dims = x.dims().to_vec();
        let Some((&k, lead)) = dims.split_last() else {
            candle_core::bail!("a linear map needs an input of rank 1 or more");
        };
        let rows: usize = lead.iter().product();
        let x2 = x.contiguous()?.reshape((rows, k))?;
        let mut y = frozen_matmul(&x2, &self.inner.weight().t()?)?;
        if let Some(s) = &self.side {
            let down = (x2.matmul(&s.a.t()?)? * s.scale)?;
            y = (y + down.matmul(&s.b.t()?)?)?;
        }
        let mut out_dims = lead.to_vec();
        out_dims.push(y.dim(1)?);
        let y = y.reshape(out_dims)?;
        match self.inner.bias() {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// x·Wᵀ with Wᵀ frozen: `[m, k] × [k, n]`, the gradient going to x only.
pub(super) fn frozen_matmul(x: &Tensor, w_t: &Tensor) -> candle_core::Result<Tensor> {
    let ((m, k), (k2, _)) = (x.dims2()?, w_t.dims2()?);
    if k != k2 {
        candle_core::bail!("frozen matmul: {:?} × {:?} do not chain", x.shape(), w_t.shape());
    }
    // Detached: were W a variable, candle's backward would wait for a gradient that never comes.
    let w_t = w_t.detach();
    if m == 0 {
        return x.matmul(&w_t);
    }
    x.apply_op2(&w_t, FrozenMatmul)
}

/// x·Wᵀ as candle's matmul computes it, whose backward gives x its gradient, g·W, and Wᵀ none.
struct FrozenMatmul;

fn matmul_storage<S: BackendStorage>(x: &S, lx: &Layout, w: &S, lw: &Layout) -> candle_core::Result<(S, Shape)> {
    let ((m, k), (_, n)) = (lx.shape().dims2()?, lw.shape().dims2()?);
    Ok((x.matmul(w, (1, m, n, k), lx, lw)?, Shape::from((m, n))))
}

impl CustomOp2 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        matmul_storage(s1, l1, s2, l2)
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        matmul_storage(s1, l1, s2, l2)
    }

    fn metal_fwd(
        &self,
        s1: &MetalStorage,
        l1: &Layout,
        s2: &MetalStorage,
        l2: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        matmul_storage(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        _x: &Tensor,
        w_t: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        // What candle's matmul backward gives its left operand: grad · rhsᵀ.
        Ok((Some(grad.matmul(&w_t.t()?)?), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Every device this build and machine have: the CPU, and the first CUDA GPU where there is
    /// one (a `--features cuda` build on a GPU machine).
    fn devices() -> Vec<Device> {
        let mut all = vec![Device::Cpu];
        if let Ok(d) = Device::cuda_if_available(0)
            && d.is_cuda()
        {
            all.push(d);
        }
        all
    }

    #[test]
    fn a_frozen_product_is_candles_matmul_and_its_input_gradient_on_every_device() {
        let (m, k, n) = (37, 48, 29);
        let xs: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
        let ws: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 997) as f32 * 1e-3 - 0.45).collect();
        let gs: Vec<f32> = (0..m * n).map(|i| ((i * 31) % 101) as f32 * 1e-2 - 0.5).collect();
        for device in devices() {
            let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), (m, k), &device).unwrap()).unwrap();
            let w_t = Tensor::from_vec(ws.clone(), (k, n), &device).unwrap();
            let g = Tensor::from_vec(gs.clone(), (m, n), &device).unwrap();
            let frozen = frozen_matmul(x.as_tensor(), &w_t).unwrap();
            let plain = x.as_tensor().matmul(&w_t).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(bits(&frozen), bits(&plain), "forward on {device:?}");
            // The loss Σ g ⊙ (x·Wᵀ): the input's gradient is g·W either way, bit for bit.
            let grad_of = |y: &Tensor| {
                let grads = (y * &g).unwrap().sum_all().unwrap().backward().unwrap();
                grads.get(x.as_tensor()).unwrap().clone()
            };
            assert_eq!(
                bits(&grad_of(&frozen)),
                bits(&grad_of(&plain)),
                "gradient on {device:?}"
            );
            // And the product is the one the CPU computes, to f32 rounding.
            let on_cpu = Tensor::from_vec(xs.clone(), (m, k), &Device::Cpu)
                .unwrap()
                .matmul(&Tensor::from_vec(ws.clone(), (k, n), &Device::Cpu).unwrap())
                .unwrap();
            let diff = crate::nn::max_abs_diff(&frozen.to_device(&Device::Cpu).unwrap(), &on_cpu);
            assert!(diff < 1e-4, "{device:?}: {diff}");
        }
    }
}
