//! Reinforced Agent Merging (RAM, arXiv 2601.13572) as mergekit computes it
//! (`merge_methods/ram.py`), shared by the `ram` and `ramplus-tl` plugins: per element, the
//! experts whose task vector τ_i = θ_i − θ_0 exceeds `epsilon` in magnitude contribute; an
//! element one expert alone changes keeps that expert's τ_i (scaled by its λ_i in RAM+), an
//! element several change gets their mean. All in f32, in mergekit's order of operations.

use super::{Host, Result, Tensor, TensorInput};

/// Which experts change each element: `|τ_i| > epsilon`, and how many do.
struct Contributions {
    /// Per expert, per element: whether it contributes.
    nonzero: Vec<Vec<bool>>,
    /// Per element: how many experts contribute.
    counts: Vec<u32>,
}

fn task_vectors(base: &[f32], experts: &[&[f32]]) -> Vec<Vec<f32>> {
    experts
        .iter()
        .map(|e| e.iter().zip(base).map(|(x, b)| x - b).collect())
        .collect()
}

fn contributions(tvs: &[Vec<f32>], epsilon: f32) -> Contributions {
    let n = tvs.first().map_or(0, Vec::len);
    let nonzero: Vec<Vec<bool>> = tvs
        .iter()
        .map(|tv| tv.iter().map(|v| v.abs() > epsilon).collect())
        .collect();
    let counts = (0..n)
        .map(|j| nonzero.iter().filter(|nz| nz[j]).count() as u32)
        .collect();
    Contributions { nonzero, counts }
}

/// RAM+'s per-expert scale of its unique elements (mergekit's `ramplus_tl`):
/// λ_i = 1 + r·clamp(ρ_i, 0, α), ρ_i = (elements expert i shares with another) ÷ max(elements
/// it changes alone, ε), counted over the whole tensor.
fn ramplus_scales(c: &Contributions, r: f32, alpha: f32, epsilon: f32) -> Vec<f32> {
    c.nonzero
        .iter()
        .map(|nz| {
            let shared = nz.iter().zip(&c.counts).filter(|(z, k)| **z && **k > 1).count() as f32;
            let unique = nz.iter().zip(&c.counts).filter(|(z, k)| **z && **k == 1).count() as f32;
            let rho = shared / unique.max(epsilon);
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
    let tvs = task_vectors(base, experts);
    let c = contributions(&tvs, epsilon);
    let lambdas = match scale {
        UniqueScale::One => vec![1.0; experts.len()],
        UniqueScale::Plus { r, alpha } => ramplus_scales(&c, r, alpha, epsilon),
    };
    (0..base.len())
        .map(|j| {
            let count = c.counts[j];
            let mut merged = 0f32;
            for (i, tv) in tvs.iter().enumerate() {
                let z = if c.nonzero[i][j] { tv[j] } else { 0.0 };
                // (τ·unique·λ) + (τ·overlap / max(count, 1)), as mergekit adds them.
                let unique = if count == 1 { z * lambdas[i] } else { 0.0 };
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
