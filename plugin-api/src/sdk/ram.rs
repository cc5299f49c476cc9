//! Reinforced Agent Merging (RAM, arXiv 2601.13572) as mergekit computes it
//! (`merge_methods/ram.py`), shared by the `ram` and `ramplus-tl` plugins: per element, the
//! experts whose task vector τ_i = θ_i − θ_0 exceeds `epsilon` in magnitude contribute; an
//! element one expert alone changes keeps that expert's τ_i (scaled by its λ_i in RAM+), an
//! element several change gets their mean. All in f32, in mergekit's order of operations.

use super::{Host, Result, Tensor, TensorInput};

/// Expert `i`'s task-vector element `j` when it counts as a change (|τ| > ε), else `None`.
fn change(base: &[f32], expert: &[f32], j: usize, epsilon: f32) -> Option<f32> {
    let tv = expert[j] - base[j];
    (tv.abs() > epsilon).then_some(tv)
}

/// How many experts change element `j`.
fn contributors(base: &[f32], experts: &[&[f32]], j: usize, epsilon: f32) -> u32 {
    experts.iter().filter(|e| change(base, e, j, epsilon).is_some()).count() as u32
}

/// RAM+'s per-expert scale of its unique elements (mergekit's `ramplus_tl`):
/// λ_i = 1 + r·clamp(ρ_i, 0, α), ρ_i = (elements expert i shares with another) ÷ max(elements
/// it changes alone, ε), counted over the whole tensor.
fn ramplus_scales(base: &[f32], experts: &[&[f32]], r: f32, alpha: f32, epsilon: f32) -> Vec<f32> {
    let (mut shared, mut unique) = (vec![0u64; experts.len()], vec![0u64; experts.len()]);
    for j in 0..base.len() {
        let count = contributors(base, experts, j, epsilon);
        for (i, e) in experts.iter().enumerate() {
            if change(base, e, j, epsilon).is_some() {
                if count > 1 {
                    shared[i] += 1;
                } else {
                    unique[i] += 1;
                }
            }
        }
    }
    shared
        .iter()
        .zip(&unique)
        .map(|(s, u)| {
            let rho = *s as f32 / (*u as f32).max(epsilon);
            1.0 + r * rho.clamp(0.0, alpha)
        })
        .collect()
}

/// How RAM weighs the experts' unique elements: 1 (RAM), or RAM+'s per-expert λ_i.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UniqueScale {
    /// RAM: an element one expert alone changes keeps its task vector.
    One,
    /// RAM+ (tensor-local): scaled by λ_i = 1 + r·clamp(ρ_i, 0, alpha).
    Plus {
        /// r.
        r: f32,
        /// α, the cap of ρ_i.
        alpha: f32,
    },
}

/// Merges one tensor of the host's inputs with RAM (`scale` [`UniqueScale::One`]) or RAM+;
/// `method` names the plugin in the error when the merge has no base.
pub fn merge_tensor(
    host: &Host<'_>,
    input: &TensorInput<'_>,
    method: &str,
    epsilon: f32,
    scale: UniqueScale,
) -> Result<Tensor> {
    let base = input.require_base(method)?;
    let shape = host.shape(base)?;
    let b = host.view_f32(base)?;
    let experts = input
        .experts
        .iter()
        .map(|e| host.view_f32(*e))
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<&[f32]> = experts.iter().map(|e| e.as_ref()).collect();
    host.from_f32(&ram_merge(&b, &views, epsilon, scale), &shape)
}

/// The merged tensor θ_0 + Σ_i merged τ_i of one tensor's values (`base`, each expert's).
pub fn ram_merge(base: &[f32], experts: &[&[f32]], epsilon: f32, scale: UniqueScale) -> Vec<f32> {
    // Task vectors and masks are recomputed where needed rather than held: the output is the
    // only tensor-sized allocation.
    let lambdas = match scale {
        UniqueScale::One => vec![1.0; experts.len()],
        UniqueScale::Plus { r, alpha } => ramplus_scales(base, experts, r, alpha, epsilon),
    };
    (0..base.len())
        .map(|j| {
            let count = contributors(base, experts, j, epsilon);
            let mut merged = 0f32;
            for (e, lambda) in experts.iter().zip(&lambdas) {
                let z = change(base, e, j, epsilon).unwrap_or(0.0);
                // (τ·unique·λ) + (τ·overlap / max(count, 1)), as mergekit adds them.
                let unique = if count == 1 { z * lambda } else { 0.0 };
                let overlap = if count > 1 { z } else { 0.0 } / count.max(1) as f32;
                merged += unique + overlap;
            }
            base[j] + merged
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: base 0; τ_1 = (1, 2, 0, 1e-6), τ_2 = (3, 0, 0, 0) with ε = 1e-5. Element 0 is
    /// shared (mean 2), element 1 is expert 1's alone (2), element 2 nobody's, element 3 below ε.
    #[test]
    fn ram_keeps_unique_elements_and_averages_shared_ones() {
        let base = [0.0f32; 4];
        let e1 = [1.0f32, 2.0, 0.0, 1e-6];
        let e2 = [3.0f32, 0.0, 0.0, 0.0];
        assert_eq!(
            ram_merge(&base, &[&e1, &e2], 1e-5, UniqueScale::One),
            vec![2.0, 2.0, 0.0, 0.0]
        );
    }

    /// RAM+: expert 1 shares 1 element and has 1 alone, ρ_1 = 1, λ_1 = 1 + 0.1·min(1, 0.2) = 1.02;
    /// expert 2 shares 1 and has 1 alone too (element 2), λ_2 = 1.02.
    #[test]
    fn ramplus_scales_unique_elements_by_the_share_ratio() {
        let base = [1.0f32; 3];
        let e1 = [2.0f32, 3.0, 1.0];
        let e2 = [4.0f32, 1.0, 0.5];
        let out = ram_merge(&base, &[&e1, &e2], 1e-5, UniqueScale::Plus { r: 0.1, alpha: 0.2 });
        let l = 1.0f32 + 0.1 * 0.2;
        assert_eq!(
            out,
            vec![1.0 + (1.0 / 2.0 + 3.0 / 2.0), 1.0 + 2.0 * l, 1.0 + (-0.5) * l]
        );
    }
}
