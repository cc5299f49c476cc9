//! mergekit's generalized task-arithmetic combine step, for the methods that follow it (Model
//! Breadcrumbs, DELLA): the weighted, already sparsified task vectors d_t = w_t·m_t⊙τ_t are
//! optionally reduced to the entries that agree with the elected sign, summed, optionally
//! divided by the weights that took part, scaled by λ and added to the base, in f32 as
//! mergekit computes it. [`weighted_disjoint_mean`] is the same normalisation on host tensors
//! (TIES, DARE-TIES).

use crate::abi::{BINARY_EQ, BINARY_GT, DISJOINT_SUM};
use crate::sdk::{Host, Result, Tensor};

crate::choice_enum! {
    /// Which entries of the weighted task vectors are merged.
    pub enum Consensus {
        /// Every kept entry (breadcrumbs, della_linear).
        None = "none",
        /// Only the entries whose sign agrees with the sign of Σ_t d_t (mergekit's `sum`
        /// consensus: breadcrumbs_ties, della); a zero sum elects +.
        Sign = "sign",
    }
}

/// torch's sign: −1, 0 or 1.
pub fn sign(v: f32) -> f32 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// θ = θ0 + λ·Σ_t d_t (÷ divisor with `normalize`), per element: without consensus the divisor
/// is Σ_t w_t (1 where |Σ w| < 1e-8); with sign consensus only the agreeing d_t are summed and
/// the divisor is the sum of their weights (1 where none agrees).
pub fn combine(
    base: &[f32],
    deltas: &[Vec<f32>],
    weights: &[f64],
    consensus: Consensus,
    normalize: bool,
    lambda: f64,
) -> Vec<f32> {
    let lambda = lambda as f32;
    (0..base.len())
        .map(|i| {
            let (mut mixed, mut divisor) = (0f32, 0f32);
            match consensus {
                Consensus::None => {
                    for (d, w) in deltas.iter().zip(weights) {
                        mixed += d[i];
                        divisor += *w as f32;
                    }
                    if divisor.abs() < 1e-8 {
                        divisor = 1.0;
                    }
                }
                Consensus::Sign => {
                    let sum: f32 = deltas.iter().map(|d| d[i]).sum();
                    let elected = if sum >= 0.0 { 1.0 } else { -1.0 };
                    for (d, w) in deltas.iter().zip(weights) {
                        if sign(d[i]) == elected {
                            mixed += d[i];
                            divisor += *w as f32;
                        }
                    }
                    if divisor == 0.0 {
                        divisor = 1.0;
                    }
                }
            }
            if normalize {
                mixed /= divisor;
            }
            if lambda != 1.0 {
                mixed *= lambda;
            }
            base[i] + mixed
        })
        .collect()
}

/// Σ_t w_t·τ̃_t over the entries that agree with `sign`, divided by Σ_t w_t over the same
/// entries (mergekit's `normalize` with sign consensus: a divisor of 0 becomes 1, so a coordinate
/// where nothing agrees gets 0). `weighted` holds w_t·τ̃_t. Every intermediate is released.
pub fn weighted_disjoint_mean(host: &Host<'_>, weighted: &[Tensor], weights: &[f64], sign: Tensor) -> Result<Tensor> {
    let sum = host.disjoint_merge(weighted, sign, DISJOINT_SUM)?;
    // Agreement of each expert: sign(w·τ̃)·s is 1 where it agrees (non-zero, same sign), else 0 or −1.
    let mut agree = Vec::with_capacity(weighted.len());
    for t in weighted {
        let s = host.sign(*t)?;
        let product = host.mul(s, sign)?;
        host.release(s)?;
        agree.push(host.compare_scalar(BINARY_GT, product, 0.0)?);
        host.release(product)?;
    }
    let divisor = host.weighted_sum(&agree, Some(weights))?;
    for a in agree {
        host.release(a)?;
    }
    let zero = host.compare_scalar(BINARY_EQ, divisor, 0.0)?;
    let safe = host.add(divisor, zero)?;
    host.release(divisor)?;
    host.release(zero)?;
    let mean = host.div(sum, safe)?;
    host.release(sum)?;
    host.release(safe)?;
    Ok(mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Base 1; d = (0.4, −0.2, 0.1) with weights (2, 1, 1): the sum elects +, so d1 and d3 agree:
    /// (0.4 + 0.1)/(2 + 1) = 1/6 normalised, 0.5 not; without consensus 0.3/4 and 0.3.
    #[test]
    fn combine_by_hand() {
        let deltas = vec![vec![0.4f32], vec![-0.2], vec![0.1]];
        let w = [2.0, 1.0, 1.0];
        let at = |c, n, l| combine(&[1.0], &deltas, &w, c, n, l)[0];
        assert!((at(Consensus::Sign, true, 1.0) - (1.0 + 0.5 / 3.0)).abs() < 1e-6);
        assert!((at(Consensus::Sign, false, 1.0) - 1.5).abs() < 1e-6);
        assert!((at(Consensus::None, true, 1.0) - (1.0 + 0.3 / 4.0)).abs() < 1e-6);
        assert!((at(Consensus::None, false, 2.0) - 1.6).abs() < 1e-6);
        // Nothing agrees with an elected sign: the divisor stays 1, the result the base.
        assert_eq!(
            combine(&[1.0], &[vec![0.0f32]], &[1.0], Consensus::Sign, true, 1.0),
            [1.0]
        );
    }
}
