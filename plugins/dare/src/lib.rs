//! `dare`: DARE, Drop And REscale (Yu et al., 2024, "Language Models are Super Mario").
//!
//! u_t = w_t·r_t·(m_t ⊙ τ_t) with m_t ~ Bernoulli(1 − p_t) drawn by the host's counter-based
//! generator, so a merge is reproducible from its seed whatever the device or chunking; the u_t
//! are summed (mergekit's dare_linear) or go through a TIES sign election (dare_ties), with
//! mergekit's `normalize` divisors. Unit weights take the exact operations of the unweighted
//! method, so recipes from before per-expert weights give the same bits.

use mergescope_plugin_api::abi::{
    CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE, DISJOINT_MEAN, DISJOINT_SUM, ELECT_MASS, REDUCE_SUM_ABS,
};
use mergescope_plugin_api::sdk::combine::weighted_disjoint_mean;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "DARE, Drop And REscale (Yu et al., 2024). With task vectors τ_t = θ_t − θ0 (a base \
model is required), each expert's task vector is sparsified at random, rescaled and weighted:\n\
  u_t = w_t·r_t·(m_t ⊙ τ_t),  m_t,j ~ Bernoulli(1 − p_t) i.i.d. (1 = kept),\n\
then combined: θ = θ0 + λ·Σ_t u_t (combine = sum, optionally / Σ_t w_t) or θ = θ0 + λ·TIES(u) \
(combine = ties or ties-sum).\n\
Parameters:\n\
- drop_rate p_t (per task, default 0.5, in [0, 1]): probability of dropping each entry of expert t's \
task vector; one value for every expert or one per expert in input order. mergekit's per-model \
density is 1 − p_t. p_t = 0 keeps every entry (τ̃ = τ); p_t = 1 drops every entry of that expert \
(all experts at 1 give θ = θ0; never NaN, unlike FusionBench's unconditional 1/(1 − p)).\n\
- task_weights (per task, default 1.0): w_t, mergekit's per-model weight.\n\
- rescale (default inverse): inverse = r_t = 1/(1 − p_t), the paper's rescale (also MergeLM with \
--use_weight_rescale and FusionBench), which keeps E[r_t·m_t ⊙ τ_t] = τ_t; l1 = mergekit's rescale \
since 2024-04 (PR #245, its rescale: true, the default of dare_linear and dare_ties): r_t = ‖τ_t‖₁ / \
‖m_t ⊙ τ_t‖₁ per tensor, left at 1 if either norm is below 1e-7; none = r = 1 (MergeLM's command-line \
default, mergekit's rescale: false).\n\
- combine (default sum): sum = DARE followed by task arithmetic, θ0 + λ·Σ_t u_t (the paper's use, \
mergekit's dare_linear); ties = the original DARE-TIES, without trimming: per coordinate the sign s of \
Σ_t u_t is elected (mass), and the non-zero u_t that agree with it are averaged with their weights, \
Σ u_t / Σ w_t over them (with unit weights their plain mean; mergekit's dare_ties with normalize: \
true); ties-sum = the same election, then the agreeing Σ u_t (mergekit's dare_ties with its default \
normalize: false). A coordinate whose elected sign is 0 gets 0 (mergekit elects + where Σ_t u_t is \
exactly 0).\n\
- normalize (default false, mergekit's normalize): with combine = sum, divide by Σ_t w_t over every \
expert (left undivided when |Σ_t w_t| < 1e-8); with ties-sum, divide by the agreeing Σ_t w_t (a \
divisor of 0 counts as 1), which makes it ties; ties always divides. The default false leaves every \
recipe written before these parameters existed with its old result, bit for bit (ties was the mean \
already).\n\
- lambda (default 1.0): scaling of the combined task vector (1 = the paper's \"add to the base\").\n\
mergekit's dare_linear is combine = sum, rescale = l1, drop_rate = 1 − density, task_weights = weight, \
normalize and lambda as they are; its dare_ties is combine = ties-sum (normalize: false) or ties \
(normalize: true) with the same mapping. mergekit draws its masks from torch's generator, so the two \
agree on the expected result and the kept fractions, not draw for draw.\n\
Randomness: the mask of expert t on tensor `name` uses the seed s_t = splitmix64(splitmix64(seed XOR \
fnv1a64(name)) XOR t) (t 0-based, fnv1a64 of the UTF-8 name), and element j of the full tensor gets \
the host's draw bernoulli(s_t, j, 1 − p). The same seed therefore gives the same merge on any device, \
thread count or chunk size. Every tensor of every role is dropped (no linear-weights-only scope).";

mergescope_plugin_api::choice_enum! {
    /// How the kept entries are rescaled.
    enum Rescale {
        /// 1/(1 − p) (paper).
        Inverse = "inverse",
        /// ‖τ‖₁ / ‖m ⊙ τ‖₁ per tensor (mergekit).
        L1 = "l1",
        /// No rescaling.
        None = "none",
    }
}

mergescope_plugin_api::choice_enum! {
    /// How the sparsified task vectors are combined.
    enum Combine {
        /// θ0 + λ·Σ u (optionally / Σ w).
        Sum = "sum",
        /// Mass sign election and weighted disjoint mean on u, no trimming.
        Ties = "ties",
        /// Mass sign election and disjoint sum on u (weighted mean with normalize).
        TiesSum = "ties-sum",
    }
}

/// The DARE method.
pub struct Dare {
    /// Per expert: the drop probability p_t.
    drop_rate: Vec<f64>,
    /// Per expert: the weight w_t.
    weights: Vec<f64>,
    normalize: bool,
    rescale: Rescale,
    combine: Combine,
    lambda: f64,
    seed: u64,
}

/// The seed rule of the masks, shared with the other plugins through the SDK (re-exported so
/// tests and users of this crate keep their paths).
pub use mergescope_plugin_api::sdk::{expert_seed, fnv1a64, splitmix64};

impl MergeMethod for Dare {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "dare",
            name: "DARE",
            version: "",
            description: "Randomly drops task-vector entries, rescales the rest, and adds them to the base.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "drop_rate",
                    0.5,
                    "Probability p of dropping each task-vector entry (one for all experts, or one per expert; mergekit's density is 1 − p).",
                )
                .range(0.0, 1.0)
                .per_task(),
                ParamSpec::choice_of(
                    "rescale",
                    Rescale::Inverse,
                    "Rescale of kept entries: 1/(1−p) (paper), L1-norm match per tensor (mergekit), or none.",
                ),
                ParamSpec::choice_of(
                    "combine",
                    Combine::Sum,
                    "How the sparsified task vectors are combined: task arithmetic (dare_linear), TIES sign election + weighted disjoint mean, or + disjoint sum (dare_ties).",
                ),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the combined task vector."),
                ParamSpec::float("task_weights", 1.0, "Weight w_t of each expert's sparsified task vector (mergekit's weight).")
                    .per_task(),
                ParamSpec::bool(
                    "normalize",
                    false,
                    "Divide by the summed weights (sum: all of them; ties-sum: the agreeing ones, as ties always does).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (drop_rate in [0, 1], λ and the weights
        // finite, one value per expert).
        let drop_rate = params.per_task("drop_rate")?;
        let weights = params.per_task("task_weights")?;
        let normalize = params.bool("normalize")?;
        let rescale = params.choice_of("rescale")?;
        let combine = params.choice_of("combine")?;
        let lambda = params.float("lambda")?;
        if drop_rate.len() != weights.len() {
            return Err(Error::Message(format!(
                "dare: parameter 'drop_rate' has {} values and 'task_weights' {}; give one value for all experts or \
                 one per expert for each",
                drop_rate.len(),
                weights.len()
            )));
        }
        Ok(Dare {
            drop_rate,
            weights,
            normalize,
            rescale,
            combine,
            lambda,
            seed: ctx.seed,
        })
    }

    fn capabilities(&self) -> Option<u64> {
        // The L1 rescale needs whole-tensor norms; everything else is elementwise (the masks are
        // drawn per element of the full tensor, whatever the chunking).
        let elementwise = if self.rescale == Rescale::L1 {
            0
        } else {
            CAP_ELEMENTWISE
        };
        Some(CAP_THREAD_SAFE | CAP_NEEDS_BASE | elementwise)
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("dare")?;
        if experts.len() != self.drop_rate.len() {
            return Err(Error::Message(format!(
                "tensor '{}': dare was created for {} experts but got {} (internal error)",
                tensor.name,
                self.drop_rate.len(),
                experts.len()
            )));
        }
        if self.drop_rate.iter().all(|p| *p >= 1.0) {
            // Everything is dropped: τ̃ = 0 and θ = θ0 (no 0/0).
            return host.affine(base, 1.0, 0.0);
        }
        // Sparsified task vectors m_t ⊙ τ_t with their rescale factors r_t and weights w_t. Every
        // input and intermediate is released as soon as it is dead, so that a whole-tensor call
        // (l1 rescale) keeps few tensor-sized buffers alive.
        let mut dropped = Vec::with_capacity(experts.len());
        for (t, (e, (p, w))) in experts.iter().zip(self.drop_rate.iter().zip(&self.weights)).enumerate() {
            host.check_cancelled()?;
            let (p, w) = (*p, *w);
            if p >= 1.0 || w == 0.0 {
                // Every entry dropped, or weight 0: nothing to add, nothing to vote (its weight
                // still counts in the divisor of combine = sum with normalize).
                host.release(*e)?;
                continue;
            }
            let tau = host.sub(*e, base)?;
            host.release(*e)?;
            if p <= 0.0 {
                // Nothing is dropped: m ⊙ τ = τ, and the l1 rescale is ‖τ‖₁/‖τ‖₁ = 1.
                dropped.push((tau, 1.0, w));
                continue;
            }
            let keep = 1.0 - p;
            let mask = host.bernoulli_mask(tau, keep, expert_seed(self.seed, tensor.name, t), tensor.offset)?;
            let masked = host.mul(mask, tau)?;
            host.release(mask)?;
            let factor = match self.rescale {
                Rescale::Inverse => 1.0 / keep,
                Rescale::None => 1.0,
                Rescale::L1 => {
                    let full = host.reduce(REDUCE_SUM_ABS, tau)?;
                    let kept = host.reduce(REDUCE_SUM_ABS, masked)?;
                    if full < 1e-7 || kept < 1e-7 { 1.0 } else { full / kept }
                }
            };
            host.release(tau)?;
            dropped.push((masked, factor, w));
        }
        if dropped.is_empty() {
            // Every expert dropped everything or has weight 0: θ = θ0.
            return host.affine(base, 1.0, 0.0);
        }
        match self.combine {
            Combine::Sum => {
                // mergekit's dare_linear divisor: Σ_t w_t over every expert, 1 when it is ~0.
                let total: f64 = self.weights.iter().sum();
                let divisor = if self.normalize && total.abs() >= 1e-8 {
                    Some(total)
                } else {
                    None
                };
                let mut terms = Vec::with_capacity(dropped.len() + 1);
                terms.push(base);
                terms.extend(dropped.iter().map(|(d, _, _)| *d));
                let mut coefficients = Vec::with_capacity(dropped.len() + 1);
                coefficients.push(1.0);
                // w = 1 leaves w·r = r exactly, so unit weights give the coefficients λ·r as before.
                coefficients.extend(dropped.iter().map(|(_, r, w)| match divisor {
                    Some(total) => self.lambda * (w * r) / total,
                    None => self.lambda * (w * r),
                }));
                host.weighted_sum(&terms, Some(&coefficients))
            }
            Combine::Ties | Combine::TiesSum => {
                // Mass election over u_t = w_t·r_t·τ̃_t, then the agreeing u_t (a coordinate
                // whose elected sign is 0 gets 0), averaged with their weights or summed.
                let mut scaled = Vec::with_capacity(dropped.len());
                let mut weights = Vec::with_capacity(dropped.len());
                for (d, r, w) in dropped {
                    let factor = w * r;
                    if factor == 1.0 {
                        scaled.push(d);
                    } else {
                        scaled.push(host.scale(d, factor)?);
                        host.release(d)?;
                    }
                    weights.push(w);
                }
                let elected = host.elect_sign(&scaled, ELECT_MASS)?;
                let normalized = self.combine == Combine::Ties || self.normalize;
                let combined = if !normalized {
                    host.disjoint_merge(&scaled, elected, DISJOINT_SUM)?
                } else if weights.iter().all(|w| *w == 1.0) {
                    // Unit weights: Σ u / Σ w over the agreeing entries is their plain mean (the
                    // host's, as before weights existed).
                    host.disjoint_merge(&scaled, elected, DISJOINT_MEAN)?
                } else {
                    weighted_disjoint_mean(host, &scaled, &weights, elected)?
                };
                host.release(elected)?;
                for s in scaled {
                    host.release(s)?;
                }
                host.weighted_sum(&[base, combined], Some(&[1.0, self.lambda]))
            }
        }
    }
}

mergescope_plugin_api::export_plugin!(Dare);
