//! `della`: DELLA-Merging (Deep, Bhardwaj & Poria, 2024, arXiv 2406.11617), as mergekit 0.1.5's
//! `della` and `della_linear` compute it. Each task vector τ_t = θ_t − θ0 drops entries at
//! random with a keep probability that grows with the entry's magnitude rank in its row
//! (MAGPRUNE), the kept entries are rescaled so that the tensor keeps its L1 norm, weighted,
//! optionally reduced to the entries that agree with the elected sign (TIES), summed, optionally
//! normalised by the weights, scaled by λ and added to θ0.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::combine::{Consensus, combine};
use mergescope_plugin_api::sdk::expert_seed;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "DELLA-Merging (Deep, Bhardwaj & Poria, 2024; arXiv 2406.11617) as mergekit 0.1.5 \
computes its della and della_linear methods. Per tensor, each task vector τ_t = θ_t − θ0 (a base model \
is required) is pruned at random by MAGPRUNE: the entries of every row are ranked by |τ| (rank r = 0 for \
the smallest to m − 1 for the largest of a row of m), entry j is kept with probability \
p_j = (density − epsilon) + 2·epsilon·r/(m − 1), so the kept fraction averages density; the kept entries \
are rescaled (rescale) so that the tensor's L1 norm is unchanged. Then θ = θ0 + λ·Σ_t w_t·τ̃_t, optionally \
/ Σ_t w_t (normalize). With consensus = sign (mergekit's della) an entry is merged only from the task \
vectors whose sign agrees with the sign of Σ_t w_t·τ̃_t (ties going to +), and normalize divides by the \
agreeing weights (1 where none agrees); with consensus = none (mergekit's della_linear) every entry is \
summed and normalize divides by Σ_t w_t (1 where |Σ_t w_t| < 1e-8).\n\
Parameters:\n\
- density (per task, default 0.7, in [0, 1]): mean keep probability. density = 1 keeps τ_t unchanged \
(no drops, no rescale, epsilon unchecked) and density = 0 drops all of it, as in mergekit. mergekit's \
default is 1, which makes della a TIES merge without trimming; 0.7 is chosen so that the default prunes \
(the paper sweeps drop rates of 0.3 to 0.9).\n\
- epsilon (per task, default 0.15, ≥ 0): half the spread of the keep probabilities; density − epsilon \
and density + epsilon must both lie inside (0, 1) (mergekit raises otherwise; so does this plugin, \
naming the expert).\n\
- task_weights (per task, default 1.0): w_t (mergekit's weight).\n\
- lambda (default 1.0): the scaling λ.\n\
- normalize (default true, mergekit's default for della): divide by the summed weights (of the \
agreeing entries with consensus). mergekit's della_linear defaults to false: give normalize = false \
with consensus = none to match it.\n\
- rescale (default true): multiply each pruned task vector by ‖τ_t‖₁ / ‖m_t ⊙ τ_t‖₁ (per tensor; left \
unscaled when either norm is below 1e-7), as mergekit; false leaves the kept entries as they are.\n\
- consensus (default sign): sign (della) or none (della_linear).\n\
Where mergekit differs from the paper, this plugin follows mergekit: ranks are taken per row, along \
dimension 1 (for each index of dimension 0 and of the dimensions after 1; a 1-D tensor is one row), \
not over the whole tensor; the probabilities are (density − epsilon) + 2·epsilon·rank_norm rather than \
the paper's p_min + (ε/n)·rank; the rescale matches the L1 norm per tensor instead of the paper's \
1/p_j per entry; and density ± epsilon outside (0, 1) is an error. Where mergekit is undefined the \
plugin chooses: entries of equal magnitude are ranked in index order (torch's argsort order at ties is \
unspecified), and a row of one entry (a scalar, or a tensor whose dimension 1 has size 1, on which \
mergekit divides 0 by 0 and fails) gets probability density.\n\
Randomness: the mask of expert t (0-based) on tensor `name` uses the seed s_t = \
splitmix64(splitmix64(seed XOR fnv1a64(name)) XOR t), as the dare plugin, and entry j is kept iff the \
host's counter-based draw for (s_t, j) is below p_j (bernoulli_mask_p of the host extension \
mergescope.host.random.v2), so the same seed gives the same merge on any device or thread count. The \
draws are not torch's, so single merges match mergekit's in distribution, not bit for bit. Ranks and \
norms need whole tensors, so tensors are never chunked.";

/// The DELLA method (mergekit's `della` with `consensus = sign`, `della_linear` with `none`).
pub struct Della {
    density: Vec<f64>,
    epsilon: Vec<f64>,
    weights: Vec<f64>,
    lambda: f64,
    normalize: bool,
    rescale: bool,
    consensus: Consensus,
    seed: u64,
}

/// Checks one expert's `density` and `epsilon` as mergekit does: when the task vector is pruned
/// at all (0 < density < 1), density ± epsilon must both lie inside (0, 1).
pub fn check_density_epsilon(expert: usize, density: f64, epsilon: f64) -> Result<()> {
    if density <= 0.0 || density >= 1.0 {
        return Ok(());
    }
    let (lo, hi) = (density - epsilon, density + epsilon);
    if lo <= 0.0 || hi >= 1.0 {
        return Err(Error::Message(format!(
            "della: expert {expert} (counting from 0) has density {density} and epsilon {epsilon}, so its keep \
             probabilities would run from {lo} to {hi}, but they must lie inside (0, 1); give an epsilon below \
             {} for this density (or move the density towards 0.5)",
            density.min(1.0 - density)
        )));
    }
    Ok(())
}

/// The keep probability of every entry of a tensor of `shape` whose task vector is `delta`
/// (mergekit's `della_magprune` for 0 < density < 1): entries are ranked by |delta| along
/// dimension 1 (a tensor of rank below 2 is one row), ties in index order, and the entry of
/// rank r among m gets (density − epsilon) + 2·epsilon·r/(m − 1); a row of one entry gets
/// density.
pub fn keep_probabilities(delta: &[f32], shape: &[usize], density: f64, epsilon: f64) -> Vec<f32> {
    let n = delta.len();
    // Rows along dimension 1: `outer` blocks of `len` entries `inner` apart.
    let (outer, len, inner) = if shape.len() < 2 {
        (1, n, 1)
    } else {
        (shape[0], shape[1], shape[2..].iter().product::<usize>())
    };
    let mut probs = vec![density as f32; n];
    if len < 2 || outer * len * inner != n {
        return probs;
    }
    let low = density - epsilon;
    let step = 2.0 * epsilon / (len - 1) as f64;
    let mut order: Vec<usize> = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            let start = o * len * inner + i;
            order.clear();
            order.extend((0..len).map(|k| start + k * inner));
            // A stable sort: entries of equal magnitude keep their index order.
            order.sort_by(|a, b| delta[*a].abs().total_cmp(&delta[*b].abs()));
            for (rank, j) in order.iter().enumerate() {
                probs[*j] = (low + step * rank as f64) as f32;
            }
        }
    }
    probs
}

/// `masked` scaled so that its L1 norm equals `full`'s (mergekit's `rescaled_masked_tensor`
/// with the L1 norm; left as it is when either norm is below 1e-7).
pub fn rescale_l1(full: &[f32], masked: &mut [f32]) {
    let before: f64 = full.iter().map(|v| f64::from(v.abs())).sum();
    let after: f64 = masked.iter().map(|v| f64::from(v.abs())).sum();
    if before < 1e-7 || after < 1e-7 {
        return;
    }
    let factor = (before / after) as f32;
    masked.iter_mut().for_each(|v| *v *= factor);
}

impl Della {
    /// w_t·τ̃_t of expert `t` on a tensor: τ_t pruned by MAGPRUNE (masks from the host),
    /// rescaled, then weighted.
    fn pruned(
        &self,
        host: &Host<'_>,
        input: &TensorInput<'_>,
        shape: &[usize],
        t: usize,
        delta: Vec<f32>,
    ) -> Result<Vec<f32>> {
        let (density, epsilon) = (self.density[t], self.epsilon[t]);
        let mut pruned = if density >= 1.0 {
            delta
        } else if density <= 0.0 {
            vec![0.0; delta.len()]
        } else {
            let probs = keep_probabilities(&delta, shape, density, epsilon);
            let probs = host.from_f32(&probs, shape)?;
            let seed = expert_seed(self.seed, input.meta.name, t);
            let mask_t = host.bernoulli_mask_p(probs, seed, input.meta.offset)?;
            host.release(probs)?;
            let mask = host.read_f32(mask_t)?;
            host.release(mask_t)?;
            let mut masked: Vec<f32> = delta.iter().zip(&mask).map(|(d, m)| d * m).collect();
            if self.rescale {
                rescale_l1(&delta, &mut masked);
            }
            masked
        };
        let w = self.weights[t] as f32;
        pruned.iter_mut().for_each(|v| *v *= w);
        Ok(pruned)
    }
}

impl MergeMethod for Della {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "della",
            name: "DELLA",
            version: "",
            description: "Drops task-vector entries at random, keeping larger ones more often, rescales and adds them (optionally with TIES sign consensus).",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float("density", 0.7, "Mean keep probability of each task vector's entries.")
                    .range(0.0, 1.0)
                    .per_task(),
                ParamSpec::float(
                    "epsilon",
                    0.15,
                    "Half-spread of the keep probabilities, from density − epsilon (smallest) to density + epsilon (largest).",
                )
                .min(0.0)
                .per_task(),
                ParamSpec::float("task_weights", 1.0, "Weight w_t of each expert's task vector.").per_task(),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the merged task vector."),
                ParamSpec::bool(
                    "normalize",
                    true,
                    "Divide by the summed weights (of the agreeing entries with consensus).",
                ),
                ParamSpec::bool(
                    "rescale",
                    true,
                    "Rescale each pruned task vector to its original L1 norm (mergekit).",
                ),
                ParamSpec::choice_of(
                    "consensus",
                    Consensus::Sign,
                    "sign: only entries agreeing with the elected sign (della); none: every kept entry (della_linear).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        let density = params.per_task("density")?;
        let epsilon = params.per_task("epsilon")?;
        for (t, (d, e)) in density.iter().zip(&epsilon).enumerate() {
            check_density_epsilon(t, *d, *e)?;
        }
        Ok(Della {
            density,
            epsilon,
            weights: params.per_task("task_weights")?,
            lambda: params.float("lambda")?,
            normalize: params.bool("normalize")?,
            rescale: params.bool("rescale")?,
            consensus: params.choice_of("consensus")?,
            seed: ctx.seed,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let base = input.require_base("della")?;
        let shape = host.shape(base)?;
        let b = host.view_f32(base)?;
        // w_t·τ̃_t for every expert, as mergekit forms them (in f32).
        let mut deltas = Vec::with_capacity(input.experts.len());
        for (t, e) in input.experts.iter().enumerate() {
            host.check_cancelled()?;
            let e = host.view_f32(*e)?;
            let d: Vec<f32> = e.iter().zip(b.iter()).map(|(x, y)| x - y).collect();
            deltas.push(self.pruned(host, input, &shape, t, d)?);
        }
        let out = combine(&b, &deltas, &self.weights, self.consensus, self.normalize, self.lambda);
        host.from_f32(&out, &shape)
    }
}

mergescope_plugin_api::export_plugin!(Della);

#[cfg(test)]
mod tests {
    use super::*;

    /// One row of five: ranks 0..4 by |τ| give (d − ε) + 2ε·r/4.
    #[test]
    fn probabilities_grow_with_the_rank_in_the_row() {
        let d = [0.3f32, -0.1, 5.0, -2.0, 0.2];
        let p = keep_probabilities(&d, &[5], 0.5, 0.2);
        let expected = [0.5, 0.3, 0.7, 0.6, 0.4];
        for (a, e) in p.iter().zip(expected) {
            assert!((f64::from(*a) - e).abs() < 1e-6, "{p:?}");
        }
    }

    /// A 2×3 matrix is ranked per row; a [2, 2, 2] tensor along dimension 1 for every (i0, i2).
    #[test]
    fn ranks_run_along_dimension_one() {
        let d = [3.0f32, 1.0, 2.0, -1.0, -3.0, -2.0];
        let p = keep_probabilities(&d, &[2, 3], 0.5, 0.1);
        let expected = [0.6, 0.4, 0.5, 0.4, 0.6, 0.5];
        for (a, e) in p.iter().zip(expected) {
            assert!((f64::from(*a) - e).abs() < 1e-6, "{p:?}");
        }
        // [2, 2, 2]: fibre (i0, ·, i2) = entries (i0·4 + i2, i0·4 + 2 + i2).
        let d = [1.0f32, 4.0, 2.0, 3.0, 5.0, 0.0, 6.0, -1.0];
        let p = keep_probabilities(&d, &[2, 2, 2], 0.5, 0.1);
        let expected = [0.4, 0.6, 0.6, 0.4, 0.4, 0.4, 0.6, 0.6];
        for (a, e) in p.iter().zip(expected) {
            assert!((f64::from(*a) - e).abs() < 1e-6, "{p:?}");
        }
    }

    #[test]
    fn ties_go_in_index_order_and_single_entries_get_the_density() {
        let p = keep_probabilities(&[1.0, -1.0, 1.0], &[3], 0.5, 0.1);
        let expected = [0.4, 0.5, 0.6];
        for (a, e) in p.iter().zip(expected) {
            assert!((f64::from(*a) - e).abs() < 1e-6, "{p:?}");
        }
        assert_eq!(keep_probabilities(&[2.0], &[], 0.5, 0.1), vec![0.5]);
        assert_eq!(keep_probabilities(&[2.0, 3.0], &[2, 1], 0.5, 0.1), vec![0.5, 0.5]);
    }

    #[test]
    fn density_and_epsilon_are_checked_as_mergekit() {
        assert!(check_density_epsilon(0, 0.5, 0.49).is_ok());
        assert!(check_density_epsilon(0, 1.0, 0.9).is_ok());
        assert!(check_density_epsilon(0, 0.0, 0.9).is_ok());
        let Err(Error::Message(m)) = check_density_epsilon(2, 0.7, 0.3) else {
            panic!("0.7 + 0.3 reaches 1")
        };
        assert!(
            m.contains("expert 2") && m.contains("epsilon 0.3") && m.contains("density 0.7"),
            "{m}"
        );
        assert!(check_density_epsilon(0, 0.1, 0.1).is_err());
    }

    #[test]
    fn rescale_matches_the_l1_norm() {
        let full = [1.0f32, -2.0, 3.0, -4.0];
        let mut masked = [0.0f32, -2.0, 0.0, -4.0];
        rescale_l1(&full, &mut masked);
        for (a, e) in masked.iter().zip([0.0, -10.0 / 3.0, 0.0, -20.0 / 3.0]) {
            assert!((f64::from(*a) - e).abs() < 1e-6, "{masked:?}");
        }
        let mut none = [0.0f32; 4];
        rescale_l1(&full, &mut none);
        assert_eq!(none, [0.0; 4]);
    }
}
