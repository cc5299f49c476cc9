//! Host extension `mergescope.host.sign-consensus.v1`: the fused operations of sign-consensus
//! methods (TIES, DARE-TIES): magnitude trim, sign election and disjoint aggregation. On the CPU
//! they borrow candle's storage and run blocked, branch-free loops; elsewhere candle op chains.

use crate::plugin::call::{CallCtx, HResult, HostError, slice_arg, with_cpu_f32, with_cpu_slices, with_ctx};
use candle_core::{DType, Tensor};
use mergescope_plugin_api::abi::{self, HostSignConsensusV1, Status, TensorHandle};
use std::ffi::c_void;

/// The extension's static table.
pub(crate) static TABLE: HostSignConsensusV1 = HostSignConsensusV1 {
    struct_size: std::mem::size_of::<HostSignConsensusV1>(),
    trim_abs: h_trim_abs,
    elect_sign: h_elect_sign,
    disjoint_merge: h_disjoint_merge,
};

/// `|a| ≥ threshold ? a : 0`.
pub fn trim_abs_cpu(a: &[f32], threshold: f32) -> Vec<f32> {
    a.iter().map(|x| if x.abs() >= threshold { *x } else { 0.0 }).collect()
}

pub(crate) unsafe extern "C" fn h_trim_abs(
    ctx: *mut c_void,
    a: TensorHandle,
    threshold: f64,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        let thr = threshold as f32;
        let t = match with_cpu_f32(a, |s| trim_abs_cpu(s, thr)) {
            Some(v) => Tensor::from_vec(v, a.shape(), c.device())?,
            None => a.abs()?.ge(thr)?.where_cond(a, &a.zeros_like()?)?,
        };
        c.put(t, out)
    })
}

/// Sign in {−1, 0, 1}, branch-free.
fn sign_b(x: f32) -> f32 {
    (i32::from(x > 0.0) - i32::from(x < 0.0)) as f32
}

/// Elements per block of the fused loops: small enough that a block of every input stays in
/// cache while the inputs are swept one after another.
const FUSED_BLOCK: usize = 4096;

/// Elected sign per element: of the summed values (mass) or of the summed signs (count).
/// Sums run over the tensors in order, as `Σ_t` would.
pub fn elect_sign_cpu(ts: &[&[f32]], rule: abi::ElectRule) -> Vec<f32> {
    let n = ts.first().map_or(0, |t| t.len());
    let mut total = vec![0f32; n];
    for (bi, block) in total.chunks_mut(FUSED_BLOCK).enumerate() {
        let from = bi * FUSED_BLOCK;
        for t in ts {
            let src = &t[from..from + block.len()];
            if rule == abi::ELECT_COUNT {
                block.iter_mut().zip(src).for_each(|(o, v)| *o += sign_b(*v));
            } else {
                block.iter_mut().zip(src).for_each(|(o, v)| *o += *v);
            }
        }
        block.iter_mut().for_each(|o| *o = sign_b(*o));
    }
    total
}

/// Disjoint aggregation of the entries agreeing with `sign` (zeros never agree), branch-free
/// and blocked so it vectorises.
pub fn disjoint_merge_cpu(ts: &[&[f32]], sign: &[f32], op: abi::DisjointOp) -> Vec<f32> {
    let n = sign.len();
    let mut out = vec![0f32; n];
    let mut count = vec![0f32; FUSED_BLOCK];
    let mut max_abs = vec![0f32; FUSED_BLOCK];
    for (bi, block) in out.chunks_mut(FUSED_BLOCK).enumerate() {
        let from = bi * FUSED_BLOCK;
        let len = block.len();
        let s = &sign[from..from + len];
        let (count, max_abs) = (&mut count[..len], &mut max_abs[..len]);
        count.fill(0.0);
        max_abs.fill(0.0);
        for t in ts {
            let src = &t[from..from + len];
            for i in 0..len {
                let (v, si) = (src[i], s[i]);
                // `v·s > 0` would underflow for tiny values; compare the signs instead.
                let agree = (v > 0.0 && si > 0.0) | (v < 0.0 && si < 0.0);
                let kept = if agree { v } else { 0.0 };
                block[i] += kept;
                count[i] += f32::from(u8::from(agree));
                max_abs[i] = max_abs[i].max(kept.abs());
            }
        }
        match op {
            abi::DISJOINT_SUM => {}
            abi::DISJOINT_MEAN => block.iter_mut().zip(count.iter()).for_each(|(o, c)| *o /= c.max(1.0)),
            _ => block
                .iter_mut()
                .zip(max_abs.iter().zip(s))
                .for_each(|(o, (m, si))| *o = m * sign_b(*si)),
        }
    }
    out
}

fn handles_arg<'c>(c: &'c CallCtx<'_>, ts: *const TensorHandle, n: usize) -> HResult<Vec<&'c Tensor>> {
    if n == 0 {
        return Err(HostError::Invalid("no tensors given".into()));
    }
    let handles = slice_arg(ts, n, "tensor array")?;
    let tensors: Vec<&Tensor> = handles.iter().map(|h| c.tensor(*h)).collect::<HResult<_>>()?;
    let shape = tensors[0].shape();
    if let Some(bad) = tensors.iter().find(|t| t.shape() != shape) {
        return Err(HostError::Invalid(format!(
            "shapes differ ({shape:?} vs {:?})",
            bad.shape()
        )));
    }
    Ok(tensors)
}

pub(crate) unsafe extern "C" fn h_elect_sign(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    n: usize,
    rule: abi::ElectRule,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if rule != abi::ELECT_MASS && rule != abi::ELECT_COUNT {
            return Err(HostError::Unsupported(format!("unknown sign-election rule {rule}")));
        }
        let tensors = handles_arg(c, ts, n)?;
        let shape = tensors[0].shape().clone();
        let t = match with_cpu_slices(&tensors, |sl| elect_sign_cpu(sl, rule)) {
            Some(v) => Tensor::from_vec(v, shape, c.device())?,
            None => {
                let owned: Vec<Tensor> = tensors.iter().map(|t| (*t).clone()).collect();
                let stacked = Tensor::stack(&owned, 0)?;
                let summed = if rule == abi::ELECT_COUNT {
                    stacked.sign()?.sum(0)?
                } else {
                    stacked.sum(0)?
                };
                summed.sign()?
            }
        };
        c.put(t, out)
    })
}

pub(crate) unsafe extern "C" fn h_disjoint_merge(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    n: usize,
    sign: TensorHandle,
    op: abi::DisjointOp,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if !matches!(op, abi::DISJOINT_SUM | abi::DISJOINT_MEAN | abi::DISJOINT_MAX) {
            return Err(HostError::Unsupported(format!("unknown disjoint aggregation {op}")));
        }
        let tensors = handles_arg(c, ts, n)?;
        let sign = c.tensor(sign)?;
        if sign.shape() != tensors[0].shape() {
            return Err(HostError::Invalid(format!(
                "disjoint_merge: sign has shape {:?}, tensors {:?}",
                sign.shape(),
                tensors[0].shape()
            )));
        }
        let shape = sign.shape().clone();
        let mut all = tensors.clone();
        all.push(sign);
        let cpu = with_cpu_slices(&all, |sl| {
            let (sign, ts) = sl.split_last().map_or((&[][..], &[][..]), |(s, t)| (*s, t));
            disjoint_merge_cpu(ts, sign, op)
        });
        let t = match cpu {
            Some(v) => Tensor::from_vec(v, shape, c.device())?,
            None => {
                let sign = &sign.sign()?;
                let nonzero_sign = sign.ne(0f32)?.to_dtype(DType::F32)?;
                let mut sum = sign.zeros_like()?;
                let mut count = sign.zeros_like()?;
                let mut max_abs = sign.zeros_like()?;
                for t in &tensors {
                    let agree = (t.sign()?.eq(sign)?.to_dtype(DType::F32)? * &nonzero_sign)?;
                    let kept = (&agree * *t)?;
                    max_abs = max_abs.maximum(&kept.abs()?)?;
                    sum = (sum + kept)?;
                    count = (count + agree)?;
                }
                match op {
                    abi::DISJOINT_SUM => sum,
                    abi::DISJOINT_MEAN => (sum / count.maximum(1f32)?)?,
                    _ => (max_abs * sign)?,
                }
            }
        };
        c.put(t, out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn ties_ops_reproduce_the_reference_golden_vectors() {
        // seeds-002-004 §4.6: trimmed rows at K = 20 %, elected signs, and dis-mean/sum/max.
        let t1 = [0.0f32, 0.0, 0.0, 0.0, 0.9, -0.7, 0.0, 0.0, 0.0, 0.6];
        let t2 = [-0.6f32, 0.0, 0.0, 0.0, -0.8, 0.7, 0.0, 0.0, 0.0, 0.0];
        let t3 = [0.4f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.55];
        let ts: [&[f32]; 3] = [&t1, &t2, &t3];
        let raw = elect_sign_cpu(&ts, abi::ELECT_MASS);
        assert_eq!(raw, vec![-1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
        // The reference replaces zero signs by the global majority (+1).
        let elected: Vec<f32> = raw.iter().map(|s| if *s == 0.0 { 1.0 } else { *s }).collect();
        let mean = disjoint_merge_cpu(&ts, &elected, abi::DISJOINT_MEAN);
        let sum = disjoint_merge_cpu(&ts, &elected, abi::DISJOINT_SUM);
        let max = disjoint_merge_cpu(&ts, &elected, abi::DISJOINT_MAX);
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(
            close(&mean, &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.575]),
            "{mean:?}"
        );
        assert!(
            close(&sum, &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 1.15]),
            "{sum:?}"
        );
        assert!(
            close(&max, &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.6]),
            "{max:?}"
        );
        // Count election: index 4 has one + and one −, so its sign is 0.
        assert_eq!(elect_sign_cpu(&ts, abi::ELECT_COUNT)[4], 0.0);
        let raw_t1 = [0.5f32, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6];
        assert_eq!(trim_abs_cpu(&raw_t1, 0.6), t1.to_vec());
    }

    #[test]
    fn cpu_and_candle_paths_agree() {
        // The candle fallback (used on GPUs) must match the CPU loops: run both on the CPU.
        let dev = Device::Cpu;
        let a = Tensor::new(&[0.5f32, -0.2, 0.0, 0.9, -0.7, 0.3], &dev).unwrap();
        let b = Tensor::new(&[-0.6f32, 0.25, 0.1, -0.8, 0.7, 0.3], &dev).unwrap();
        let s = Tensor::new(&[-1f32, 1.0, 1.0, 0.0, -1.0, 1.0], &dev).unwrap();
        let nonzero = s.ne(0f32).unwrap().to_dtype(DType::F32).unwrap();
        let (va, vb, vs) = (
            a.to_vec1::<f32>().unwrap(),
            b.to_vec1::<f32>().unwrap(),
            s.to_vec1::<f32>().unwrap(),
        );
        let cpu = disjoint_merge_cpu(&[&va, &vb], &vs, abi::DISJOINT_MEAN);
        let mut sum = s.zeros_like().unwrap();
        let mut count = s.zeros_like().unwrap();
        for t in [&a, &b] {
            let agree = (t.sign().unwrap().eq(&s).unwrap().to_dtype(DType::F32).unwrap() * &nonzero).unwrap();
            sum = (sum + (&agree * t).unwrap()).unwrap();
            count = (count + agree).unwrap();
        }
        let gpu_path = (sum / count.maximum(1f32).unwrap()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(cpu, gpu_path);
    }
}
