//! Singular subspaces shared by the SVD-based merges (TSV-M, Iso-C, Iso-CTS): singular triplets
//! gathered from several SVDs, orthogonalised by their polar factors and multiplied back.
//!
//! The polar factor of a matrix X with thin SVD X = P·Σ·Qᵀ is P·Qᵀ, the orthogonal matrix nearest
//! to X. It does not depend on the signs the SVD picks for its singular vectors, so merges built
//! from it agree with their reference implementations whatever LAPACK or faer returns.

use super::Host;
use crate::{Result, Tensor};

/// Polar factor P·Qᵀ of a 2-D tensor (thin SVD X = P·Σ·Qᵀ, by the host in f64).
pub fn polar(host: &Host<'_>, x: Tensor) -> Result<Tensor> {
    let shape = host.shape(x)?;
    let &[m, n] = shape.as_slice() else {
        return Err(format!("polar factor of a tensor of shape {shape:?}: a 2-D matrix is needed").into());
    };
    let (p, s, qt) = host.svd(x, m.min(n))?;
    host.release(s)?;
    let out = host.matmul(p, qt)?;
    host.release(p)?;
    host.release(qt)?;
    Ok(out)
}

/// How the singular values of the gathered triplets enter the product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Spectrum {
    /// Each triplet keeps its own singular value (TSV-M).
    Own,
    /// Every singular value is replaced by their mean (isotropic merging).
    Mean,
}

/// Singular triplets (u_j, s_j, v_j) of an m×n shape gathered from several SVDs, in order.
#[derive(Clone, Debug)]
pub struct Triplets {
    m: usize,
    n: usize,
    /// Left vectors, one row of length m per triplet (Uᵀ, row-major).
    ut: Vec<f32>,
    s: Vec<f32>,
    /// Right vectors, one row of length n per triplet (Vᵀ, row-major).
    vt: Vec<f32>,
}

impl Triplets {
    /// No triplets yet, for m×n matrices.
    pub fn new(m: usize, n: usize) -> Self {
        Triplets {
            m,
            n,
            ut: Vec::new(),
            s: Vec::new(),
            vt: Vec::new(),
        }
    }

    /// How many triplets were gathered.
    pub fn len(&self) -> usize {
        self.s.len()
    }

    /// Whether no triplet was gathered.
    pub fn is_empty(&self) -> bool {
        self.s.is_empty()
    }

    /// The gathered singular values, in order.
    pub fn singular_values(&self) -> &[f32] {
        &self.s
    }

    /// Appends the first `take` triplets of the host's truncated SVD `(U m×k, S k, Vᵀ k×n)` and
    /// releases its three tensors.
    pub fn append(&mut self, host: &Host<'_>, (u, s, vt): (Tensor, Tensor, Tensor), take: usize) -> Result<()> {
        let (m, n) = (self.m, self.n);
        let (u_data, s_data, vt_data) = (host.read_f32(u)?, host.read_f32(s)?, host.read_f32(vt)?);
        let k = s_data.len();
        if take > k || u_data.len() != m * k || vt_data.len() != k * n {
            return Err(format!(
                "SVD factors of {} values for {m}×{n} with {k} singular values: cannot take {take}",
                u_data.len()
            )
            .into());
        }
        for j in 0..take {
            self.ut.extend((0..m).map(|i| u_data[i * k + j]));
        }
        self.s.extend_from_slice(&s_data[..take]);
        self.vt.extend_from_slice(&vt_data[..take * n]);
        for t in [u, s, vt] {
            host.release(t)?;
        }
        Ok(())
    }

    /// polar(U)·diag(σ)·polar(Vᵀ) over the gathered triplets, an m×n tensor: σ_j = s_j for
    /// [`Spectrum::Own`], the mean of the s_j for [`Spectrum::Mean`]. With no triplet: zeros.
    pub fn orthogonalised_product(&self, host: &Host<'_>, like: Tensor, spectrum: Spectrum) -> Result<Tensor> {
        let (m, n, k) = (self.m, self.n, self.len());
        if k == 0 {
            return host.full_like(like, 0.0);
        }
        let ut = host.from_f32(&self.ut, &[k, m])?;
        let u = host.transpose(ut)?;
        host.release(ut)?;
        let pu = polar(host, u)?;
        host.release(u)?;
        let vt = host.from_f32(&self.vt, &[k, n])?;
        let pv = polar(host, vt)?;
        host.release(vt)?;
        // Scale the columns of polar(U) by σ (a mean spectrum scales the product once).
        let mut left = host.read_f32(pu)?;
        host.release(pu)?;
        if spectrum == Spectrum::Own {
            for row in left.chunks_exact_mut(k) {
                for (x, s) in row.iter_mut().zip(&self.s) {
                    *x *= s;
                }
            }
        }
        let left = host.from_f32(&left, &[m, k])?;
        let product = host.matmul(left, pv)?;
        host.release(left)?;
        host.release(pv)?;
        if spectrum == Spectrum::Mean {
            let mean = (self.s.iter().map(|&x| f64::from(x)).sum::<f64>() / k as f64) as f32;
            let scaled = host.scale(product, f64::from(mean))?;
            host.release(product)?;
            return Ok(scaled);
        }
        Ok(product)
    }
}

/// θ0 + λ·(1/T)·Σ_t (θ_t − θ0) over `all` = [θ0, θ_1, …, θ_T] (as
/// [`TensorInput::base_and_experts`](crate::TensorInput::base_and_experts) gives them): what the
/// subspace merges do with tensors that are not matrices, as one fused weighted sum.
pub fn base_plus_mean_task_vector(host: &Host<'_>, all: &[Tensor], lambda: f64) -> Result<Tensor> {
    let t = all.len().saturating_sub(1).max(1) as f64;
    let mut coefficients = vec![lambda / t; all.len()];
    coefficients[0] = 1.0 - lambda;
    host.weighted_sum(all, Some(&coefficients))
}

/// Σ_t (θ_t − θ0) over `all` = [θ0, θ_1, …, θ_T], as one fused weighted sum.
pub fn task_vector_sum(host: &Host<'_>, all: &[Tensor]) -> Result<Tensor> {
    let mut coefficients = vec![1.0; all.len()];
    coefficients[0] = -(all.len().saturating_sub(1) as f64);
    host.weighted_sum(all, Some(&coefficients))
}

/// θ0 + λ·τ for a merged task vector τ (released).
pub fn base_plus(host: &Host<'_>, base: Tensor, tau: Tensor, lambda: f64) -> Result<Tensor> {
    let out = host.weighted_sum(&[base, tau], Some(&[1.0, lambda]))?;
    host.release(tau)?;
    Ok(out)
}

/// The (m, n) of a 2-D tensor shape, or `None`.
pub fn matrix_shape(shape: &[usize]) -> Option<(usize, usize)> {
    match shape {
        &[m, n] => Some((m, n)),
        _ => None,
    }
}
