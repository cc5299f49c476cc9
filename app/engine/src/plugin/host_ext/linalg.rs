//! Host extension `mergescope.host.linalg.v1`: truncated SVD and best low-rank approximation,
//! computed in f64 with faer (CART's low-rank task matrices; the lab's spectra use the same
//! functions).

use crate::plugin::call::{CallCtx, HResult, HostError, to_f32_vec, with_ctx};
use candle_core::{Device, Tensor};
use mergescope_plugin_api::abi::{HostLinalgV1, Status, TensorHandle};
use std::ffi::c_void;

/// The extension's static table.
pub(crate) static TABLE: HostLinalgV1 = HostLinalgV1 {
    struct_size: std::mem::size_of::<HostLinalgV1>(),
    svd: h_svd,
    low_rank: h_low_rank,
};

/// Row-major factors of a truncated SVD: (U m×k, S k, Vᵀ k×n).
pub type SvdFactors = (Vec<f64>, Vec<f64>, Vec<f64>);

/// Thin SVD of a row-major m×n matrix in f64, truncated to k.
pub fn truncated_svd(data: &[f32], m: usize, n: usize, k: usize) -> Result<SvdFactors, String> {
    let k = k.min(m.min(n));
    let a = faer::Mat::<f64>::from_fn(m, n, |i, j| f64::from(data[i * n + j]));
    let svd = a.thin_svd().map_err(|e| format!("SVD did not converge: {e:?}"))?;
    let (u, s, v) = (svd.U(), svd.S().column_vector(), svd.V());
    let mut uk = vec![0f64; m * k];
    for i in 0..m {
        for j in 0..k {
            uk[i * k + j] = u[(i, j)];
        }
    }
    let sk: Vec<f64> = (0..k).map(|j| s[j]).collect();
    let mut vt = vec![0f64; k * n];
    for j in 0..k {
        for c in 0..n {
            vt[j * n + c] = v[(c, j)];
        }
    }
    Ok((uk, sk, vt))
}

fn matrix_arg(c: &CallCtx<'_>, a: TensorHandle, what: &str) -> HResult<(Vec<f32>, usize, usize)> {
    let t = c.tensor(a)?;
    let &[m, n] = t.dims() else {
        return Err(HostError::Invalid(format!(
            "{what} needs a 2-D tensor, got shape {:?}",
            t.dims()
        )));
    };
    Ok((to_f32_vec(t)?, m, n))
}

fn to_f32_tensor(v: &[f64], dims: &[usize], device: &Device) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    Tensor::from_vec(v, dims, device)
}

pub(crate) unsafe extern "C" fn h_svd(
    ctx: *mut c_void,
    a: TensorHandle,
    k: usize,
    out_u: *mut TensorHandle,
    out_s: *mut TensorHandle,
    out_vt: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let (data, m, n) = matrix_arg(c, a, "svd")?;
        let (u, s, vt) = truncated_svd(&data, m, n, k).map_err(HostError::Failed)?;
        let k = s.len();
        let dev = c.device();
        if !out_u.is_null() {
            let t = to_f32_tensor(&u, &[m, k], dev)?;
            c.put(t, out_u)?;
        }
        if !out_s.is_null() {
            let t = to_f32_tensor(&s, &[k], dev)?;
            c.put(t, out_s)?;
        }
        if !out_vt.is_null() {
            let t = to_f32_tensor(&vt, &[k, n], dev)?;
            c.put(t, out_vt)?;
        }
        Ok(())
    })
}

/// Best rank-k approximation of a row-major m×n matrix, computed in f64.
pub fn low_rank_approx(data: &[f32], m: usize, n: usize, k: usize) -> Result<Vec<f64>, String> {
    let mut r = vec![0f64; m * n];
    if k == 0 {
        return Ok(r);
    }
    let (u, s, vt) = truncated_svd(data, m, n, k)?;
    let k = s.len();
    for i in 0..m {
        for j in 0..k {
            let w = u[i * k + j] * s[j];
            if w == 0.0 {
                continue;
            }
            let row = &vt[j * n..(j + 1) * n];
            for (o, v) in r[i * n..(i + 1) * n].iter_mut().zip(row) {
                *o += w * v;
            }
        }
    }
    Ok(r)
}

pub(crate) unsafe extern "C" fn h_low_rank(
    ctx: *mut c_void,
    a: TensorHandle,
    k: usize,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let (data, m, n) = matrix_arg(c, a, "low_rank")?;
        let r = low_rank_approx(&data, m, n, k).map_err(HostError::Failed)?;
        let t = to_f32_tensor(&r, &[m, n], c.device())?;
        c.put(t, out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_rank_golden_cart_gc1() {
        // τ̄_1 = [[2,2],[1,-1]] has σ = 2√2 (v = (1,1)/√2) and √2: rank 1 keeps [[2,2],[0,0]].
        let r = low_rank_approx(&[2.0, 2.0, 1.0, -1.0], 2, 2, 1).unwrap();
        for (a, b) in r.iter().zip([2.0, 2.0, 0.0, 0.0]) {
            assert!((a - b).abs() < 1e-9, "{r:?}");
        }
        let full = low_rank_approx(&[2.0, 2.0, 1.0, -1.0], 2, 2, 5).unwrap();
        for (a, b) in full.iter().zip([2.0, 2.0, 1.0, -1.0]) {
            assert!((a - b).abs() < 1e-9);
        }
        let (_, s, _) = truncated_svd(&[2.0, 2.0, 1.0, -1.0], 2, 2, 2).unwrap();
        assert!((s[0] - 8f64.sqrt()).abs() < 1e-9 && (s[1] - 2f64.sqrt()).abs() < 1e-9);
    }
}
