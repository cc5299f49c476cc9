//! `arcee-fusion`: mergekit's Arcee Fusion (`merge_methods/arcee_fusion.py`), for a base and
//! one expert. Each element's importance is |θ_1 − θ_0| times the KL divergence of the row's
//! softmax of θ_1 from the base's (rows along the last dimension); the expert's change is kept
//! where the importance reaches median + 1.5·IQR of the tensor's importances, else the base's
//! value stays.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_ONE_EXPERT, CAP_THREAD_SAFE};
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};

const HELP: &str = "Arcee Fusion (mergekit's `arcee_fusion`): for the base θ_0 and one expert θ_1, \
the importance of each element is |θ_1 − θ_0|·KL(p‖q) with p = softmax(θ_1) + 1e-8 and q = \
softmax(θ_0) + 1e-8 over its row (the last dimension; a vector is one row). The expert's change is \
kept where the importance is at least median + 1.5·(Q3 − Q1) of the tensor's importances (the \
outliers of a box plot), else the element keeps the base's value: θ = θ_0 + m ⊙ (θ_1 − θ_0).\n\
No parameters. Quantiles are taken as mergekit does, sorted values at index ⌊q·(n − 1)⌋, but over \
every element: mergekit draws 1,000,000 elements at random (unseeded) from larger tensors, so its \
threshold for those changes from run to run, and mergescope's is the exact one.";

/// The Arcee Fusion method.
pub struct ArceeFusion;

/// Softmax of one row plus 1e-8, as torch computes it in f32 (max subtracted).
fn softmax_eps(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum + 1e-8).collect()
}

/// Importance of every element: |θ_1 − θ_0| · KL(softmax θ_1 ‖ softmax θ_0) of its row.
fn importance(base: &[f32], expert: &[f32], row_len: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(base.len());
    for (b, e) in base.chunks(row_len.max(1)).zip(expert.chunks(row_len.max(1))) {
        let (p, q) = (softmax_eps(e), softmax_eps(b));
        let kl: f32 = p.iter().zip(&q).map(|(p, q)| p * (p / q).ln()).sum();
        out.extend(e.iter().zip(b).map(|(e, b)| (e - b).abs() * kl));
    }
    out
}

/// median + 1.5·(Q3 − Q1), each quantile the sorted value at ⌊q·(n − 1)⌋.
fn outlier_threshold(scores: &[f32]) -> f32 {
    let mut sorted = scores.to_vec();
    sorted.sort_by(f32::total_cmp);
    let at = |q: f32| sorted[(q * (sorted.len() - 1) as f32) as usize];
    let (median, q1, q3) = (at(0.5), at(0.25), at(0.75));
    median + 1.5 * (q3 - q1)
}

/// The fused values: the expert's change where the importance reaches the threshold.
fn fuse(base: &[f32], expert: &[f32], row_len: usize) -> Vec<f32> {
    if base.is_empty() {
        return Vec::new();
    }
    let scores = importance(base, expert, row_len);
    let threshold = outlier_threshold(&scores);
    base.iter()
        .zip(expert)
        .zip(&scores)
        .map(|((b, e), s)| b + (e - b) * if *s >= threshold { 1.0 } else { 0.0 })
        .collect()
}

impl MergeMethod for ArceeFusion {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "arcee-fusion",
            name: "Arcee Fusion",
            version: "",
            description: "Keeps the expert's changes whose KL-weighted importance is an outlier; the base elsewhere.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE | CAP_ONE_EXPERT,
            params: vec![],
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(ArceeFusion)
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let base = input.require_base("arcee-fusion")?;
        let shape = host.shape(base)?;
        let row_len = shape.last().copied().unwrap_or(1);
        let b = host.view_f32(base)?;
        let e = host.view_f32(input.experts[0])?;
        host.from_f32(&fuse(&b, &e, row_len), &shape)
    }
}

mergescope_plugin_api::export_plugin!(ArceeFusion);

#[cfg(test)]
mod tests {
    use super::*;

    /// Quantiles at ⌊q·(n − 1)⌋ of 0..=8 (n = 9): median 4, Q1 2, Q3 6, threshold 4 + 1.5·4 = 10.
    #[test]
    fn the_threshold_is_median_plus_one_and_a_half_iqr() {
        let scores: Vec<f32> = (0..9).rev().map(|v| v as f32).collect();
        assert_eq!(outlier_threshold(&scores), 10.0);
        // n = 4: indices ⌊1.5⌋ = 1, ⌊0.75⌋ = 0, ⌊2.25⌋ = 2 of (1, 2, 3, 50): 2 + 1.5·2 = 5.
        assert_eq!(outlier_threshold(&[50.0, 1.0, 3.0, 2.0]), 5.0);
    }

    /// A row where the expert changes one element a lot and the others a little: only the large
    /// change is an outlier of importance, so only it is kept.
    #[test]
    fn only_outlying_changes_are_kept() {
        let base = [0.0f32; 8];
        let expert = [0.01f32, 0.02, 0.01, 0.02, 3.0, 0.01, 0.02, 0.01];
        let fused = fuse(&base, &expert, 8);
        assert_eq!(fused, vec![0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0]);
        // Identical models: every importance is 0, the threshold 0, and θ_0 + 1·0 = θ_0.
        assert_eq!(fuse(&expert, &expert, 4), expert.to_vec());
    }
}
