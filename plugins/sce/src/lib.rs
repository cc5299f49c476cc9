//! `sce`: SCE (Select, Calculate, Erase; Wan et al., 2024, FuseChat-2.0, arXiv:2408.07990) as
//! mergekit computes it (mergekit/merge_methods/sce.py, 0.1.5), over whole tensors in f64.
//!
//! With task vectors δ_i = θ_i − θ0 of the N experts:
//! 1. Select (only when `select_topk` < 1): keep the k = ⌊f32(m)·f32(select_topk)⌋ elements of
//!    largest population variance across the experts (m: elements of non-zero variance) and zero
//!    every δ_i elsewhere.
//! 2. Calculate: w_i = mean(δ_i²) / Σ_j mean(δ_j²), or 1/N where that sum is below 1e-6.
//! 3. Erase: per element the elected sign is that of Σ_i δ_i (+ at 0); entries of another sign
//!    (zeros included) are dropped, and θ = θ0 + Σ_i w_i·m_i·δ_i / max(Σ_i w_i·m_i, 1e-6).

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "SCE, Select-Calculate-Erase (Wan et al., 2024, FuseChat-2.0; mergekit's `sce`). Works on \
the task vectors δ_i = θ_i − θ0 of the N experts, one whole tensor at a time:\n\
1. Select (only when select_topk < 1): rank the elements by the variance of δ_1..δ_N across the experts \
(population variance, divided by N); keep the k with the largest variance, k = ⌊m·select_topk⌋ where m is \
the number of elements of non-zero variance (the product is taken in f32 and truncated, as torch does in \
mergekit); every δ_i is set to 0 elsewhere. Ties at the cut go to the lower index (torch leaves their order \
unspecified).\n\
2. Calculate: each expert's weight w_i = mean(δ_i²) / Σ_j mean(δ_j²), from the selected task vectors. \
Where Σ_j mean(δ_j²) < 1e-6 (an absolute threshold: task vectors with an RMS below about 1e-3/√N, common \
for fine-tuning deltas) mergekit uses equal weights 1/N instead, and so does this plugin.\n\
3. Erase: per element the elected sign is the sign of Σ_i δ_i (+ where the sum is 0); entries of the \
other sign, and zero entries, are dropped.\n\
θ = θ0 + Σ_i w_i·m_i·δ_i / max(Σ_i w_i·m_i, 1e-6), m_i = 1 where δ_i is kept: a weighted mean over the \
kept entries (an element no expert keeps stays at the base).\n\
Parameters:\n\
- select_topk (default 1.0, mergekit's default, which skips the selection step): fraction, 0 to 1, of the \
elements with non-zero variance kept in step 1. 0 keeps none and returns the base. With one expert the \
variance is 0 everywhere, so any select_topk < 1 returns the base.\n\
A base model is required; every expert weighs in through w_i only (there are no per-expert weights, as in \
mergekit). mergekit's int8_mask only changes the mask's storage type, so it is not offered.\n\
mergekit's implementation choices, kept here: the equal-weight fallback below 1e-6 (absolute, so \
whether it applies depends on the scale of the task vectors), the per-element division by the kept weights, and \
the default select_topk = 1, which skips the Select step the method is named for.";

/// Below this sum of the experts' mean squared task vectors, mergekit weighs them equally
/// (`sce_weight`'s `abs(weight_sum) < 1e-6`).
pub const MIN_WEIGHT_SUM: f64 = 1e-6;

/// Smallest sum of kept weights an element is divided by (mergekit's `clamp(min=1e-6)`).
pub const MIN_KEPT_WEIGHT: f64 = 1e-6;

/// The SCE method.
pub struct Sce {
    select_topk: f64,
}

/// The number of elements step 1 keeps among `nonzero` elements of non-zero variance:
/// mergekit's `int(torch.count_nonzero(var) * density)`, where the int64 count times a Python
/// float is a float32 tensor, so the product is rounded to f32 before it is truncated
/// (100 × 0.29 gives 29, not the 28 of f64).
pub fn selection_count(nonzero: usize, select_topk: f64) -> usize {
    let k = (nonzero as f32) * (select_topk as f32);
    if k.is_nan() || k <= 0.0 { 0 } else { k as usize }
}

/// Step 1's mask: `None` keeps every element (select_topk ≥ 1), otherwise `true` for the
/// elements of largest variance of the task vectors across experts (ties to the lower index).
pub fn select_mask(base: &[f32], experts: &[&[f32]], select_topk: f64) -> Option<Vec<bool>> {
    let n = base.len();
    if select_topk >= 1.0 {
        return None;
    }
    if select_topk <= 0.0 || experts.is_empty() {
        return Some(vec![false; n]);
    }
    // Population variance per element by Welford's update (as torch's CPU var does), so that
    // identical task vectors give exactly 0.
    let count = experts.len() as f64;
    let variance: Vec<f64> = (0..n)
        .map(|j| {
            let (mut mean, mut m2) = (0f64, 0f64);
            for (i, e) in experts.iter().enumerate() {
                let x = f64::from(e[j]) - f64::from(base[j]);
                let delta = x - mean;
                mean += delta / (i + 1) as f64;
                m2 += delta * (x - mean);
            }
            m2 / count
        })
        .collect();
    let mut candidates: Vec<usize> = (0..n).filter(|&j| variance[j] != 0.0).collect();
    let k = selection_count(candidates.len(), select_topk).min(candidates.len());
    let mut mask = vec![false; n];
    if k == 0 {
        return Some(mask);
    }
    // Largest variance first, then lower index: a total order, so the k kept are determined.
    let order = |a: &usize, b: &usize| variance[*b].total_cmp(&variance[*a]).then(a.cmp(b));
    candidates.select_nth_unstable_by(k - 1, order);
    for &j in &candidates[..k] {
        mask[j] = true;
    }
    Some(mask)
}

/// Step 2's weights from the experts' mean squared (selected) task vectors: normalised to sum
/// to 1, or equal where their sum is below [`MIN_WEIGHT_SUM`].
pub fn weights(mean_squares: &[f64]) -> Vec<f64> {
    let total: f64 = mean_squares.iter().sum();
    if total.abs() < MIN_WEIGHT_SUM {
        let n = mean_squares.len().max(1) as f64;
        return vec![1.0 / n; mean_squares.len()];
    }
    mean_squares.iter().map(|w| w / total).collect()
}

/// The SCE merge of one tensor: `base` and every expert hold the same number of elements.
pub fn merge(base: &[f32], experts: &[&[f32]], select_topk: f64) -> Vec<f32> {
    let n = base.len();
    if experts.is_empty() || n == 0 {
        return base.to_vec();
    }
    let mask = select_mask(base, experts, select_topk);
    let kept = |j: usize| mask.as_ref().is_none_or(|m| m[j]);
    let delta = |i: usize, j: usize| {
        if kept(j) {
            f64::from(experts[i][j]) - f64::from(base[j])
        } else {
            0.0
        }
    };
    let mean_squares: Vec<f64> = (0..experts.len())
        .map(|i| (0..n).map(|j| delta(i, j).powi(2)).sum::<f64>() / n as f64)
        .collect();
    let w = weights(&mean_squares);
    (0..n)
        .map(|j| {
            let elected = if (0..experts.len()).map(|i| delta(i, j)).sum::<f64>() >= 0.0 {
                1.0
            } else {
                -1.0
            };
            let (mut sum, mut kept_weight) = (0f64, 0f64);
            for (i, wi) in w.iter().enumerate() {
                let d = delta(i, j);
                // sign(δ) == elected sign: zeros have sign 0 and are dropped.
                if d != 0.0 && d.signum() == elected {
                    sum += d * wi;
                    kept_weight += wi;
                }
            }
            (f64::from(base[j]) + sum / kept_weight.max(MIN_KEPT_WEIGHT)) as f32
        })
        .collect()
}

impl MergeMethod for Sce {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "sce",
            name: "SCE",
            version: "",
            description: "Select high-variance elements, weigh experts by their squared task vectors, erase sign conflicts.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "select_topk",
                    1.0,
                    "Fraction of the elements (of non-zero variance across experts) kept; 1 keeps all.",
                )
                .range(0.0, 1.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let select_topk = params.float("select_topk")?;
        if !(0.0..=1.0).contains(&select_topk) {
            return Err(Error::Message(format!(
                "parameter 'select_topk' = {select_topk} is out of range; give a fraction from 0 to 1 (1 keeps every \
                 element, mergekit's default)"
            )));
        }
        Ok(Sce { select_topk })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let base = input.require_base("sce")?;
        let shape = host.shape(base)?;
        let b = host.view_f32(base)?;
        let es = input
            .experts
            .iter()
            .map(|e| host.view_f32(*e))
            .collect::<Result<Vec<_>>>()?;
        if let Some((i, e)) = es.iter().enumerate().find(|(_, e)| e.len() != b.len()) {
            return Err(Error::Message(format!(
                "tensor '{}': expert {} has {} elements but the base has {}; SCE needs every model's tensor to \
                 have the base's shape (are the checkpoints of the same architecture?)",
                input.meta.name,
                i + 1,
                e.len(),
                b.len()
            )));
        }
        let refs: Vec<&[f32]> = es.iter().map(AsRef::as_ref).collect();
        host.from_f32(&merge(&b, &refs, self.select_topk), &shape)
    }
}

mergescope_plugin_api::export_plugin!(Sce);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_count_rounds_in_f32_like_torch() {
        assert_eq!(selection_count(100, 0.29), 29);
        assert_eq!(selection_count(10, 0.7), 7);
        assert_eq!(selection_count(3, 0.5), 1);
        assert_eq!(selection_count(0, 0.5), 0);
    }

    #[test]
    fn selection_keeps_the_largest_variances() {
        // δ1 = (1, 0, 2, 3), δ2 = (−1, 0, 2, 1): variances 1, 0, 0, 1. m = 2 non-zero; at 0.5,
        // k = 1: the tie between elements 0 and 3 goes to element 0.
        let base = [0.0f32; 4];
        let e1 = [1.0f32, 0.0, 2.0, 3.0];
        let e2 = [-1.0f32, 0.0, 2.0, 1.0];
        let mask = select_mask(&base, &[&e1, &e2], 0.5).unwrap();
        assert_eq!(mask, vec![true, false, false, false]);
        assert!(select_mask(&base, &[&e1, &e2], 1.0).is_none());
        assert_eq!(select_mask(&base, &[&e1, &e2], 0.0).unwrap(), vec![false; 4]);
    }

    #[test]
    fn weights_fall_back_to_equal_below_the_threshold() {
        assert_eq!(weights(&[1.0, 3.0]), vec![0.25, 0.75]);
        assert_eq!(weights(&[1e-7, 3e-7]), vec![0.5, 0.5]);
    }

    #[test]
    fn erase_keeps_the_elected_sign() {
        // δ1 = (2, −1), δ2 = (−1, −1): mean squares 2.5 and 1 → w = (5/7, 2/7).
        // Element 0: sum 1 ≥ 0 → + elected, only δ1 kept → 2. Element 1: both −1 → −1.
        let out = merge(&[0.0, 0.0], &[&[2.0, -1.0], &[-1.0, -1.0]], 1.0);
        assert!((out[0] - 2.0).abs() < 1e-6 && (out[1] + 1.0).abs() < 1e-6, "{out:?}");
    }
}
