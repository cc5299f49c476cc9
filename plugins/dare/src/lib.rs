//! `dare`: DARE, Drop And REscale (Yu et al., 2024, "Language Models are Super Mario").
//!
//! τ̃_t = r_t·(m_t ⊙ τ_t) with m_t ~ Bernoulli(1 − p) drawn by the host's counter-based
//! generator, so a merge is reproducible from its seed whatever the device or chunking.

use mergescope_plugin_api::abi::{
    CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE, DISJOINT_MEAN, ELECT_MASS, REDUCE_SUM_ABS,
};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "DARE, Drop And REscale (Yu et al., 2024). With task vectors τ_t = θ_t − θ0 (a base \
model is required), each expert's task vector is sparsified at random and rescaled:\n\
  τ̃_t = r_t·(m_t ⊙ τ_t),  m_t,j ~ Bernoulli(1 − p) i.i.d. (1 = kept),\n\
then combined: θ = θ0 + λ·Σ_t τ̃_t (combine = sum) or θ = θ0 + λ·TIES(τ̃) (combine = ties).\n\
Parameters:\n\
- drop_rate p (default 0.5, in [0, 1]): probability of dropping each entry. p = 0 keeps every entry \
(τ̃ = τ); p = 1 drops every entry, giving θ = θ0 (never NaN, unlike FusionBench's unconditional \
1/(1 − p)).\n\
- rescale (default inverse): inverse = r = 1/(1 − p), the paper's rescale (also MergeLM with \
--use_weight_rescale and FusionBench), which keeps E[τ̃] = τ; l1 = mergekit's rescale since 2024-04 \
(PR #245): r_t = ‖τ_t‖₁ / ‖m_t ⊙ τ_t‖₁ per tensor, left at 1 if either norm is below 1e-7; \
none = r = 1 (MergeLM's command-line default).\n\
- combine (default sum): sum = DARE followed by task arithmetic, θ0 + λ·Σ_t τ̃_t (the paper's use); \
ties = DARE-TIES without trimming: per coordinate the sign of Σ_t τ̃_t is elected (mass), and the \
mean of the τ̃_t that agree with it (non-zero ones only) is taken; a coordinate whose elected sign is \
0 gets 0.\n\
- lambda (default 1.0): scaling of the combined task vector (1 = the paper's \"add to the base\").\n\
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
        /// θ0 + λ·Σ τ̃.
        Sum = "sum",
        /// Mass sign election and disjoint mean on τ̃, no trimming.
        Ties = "ties",
    }
}

/// The DARE method.
pub struct Dare {
    drop_rate: f64,
    rescale: Rescale,
    combine: Combine,
    lambda: f64,
    seed: u64,
}

/// FNV-1a, 64-bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The splitmix64 finaliser (Steele et al.), a bijective 64-bit mixer.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seed of expert `expert`'s drop mask on tensor `tensor_name` in a merge with seed `merge_seed`.
pub fn expert_seed(merge_seed: u64, tensor_name: &str, expert: usize) -> u64 {
    splitmix64(splitmix64(merge_seed ^ fnv1a64(tensor_name.as_bytes())) ^ expert as u64)
}

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
                ParamSpec::float("drop_rate", 0.5, "Probability p of dropping each task-vector entry.").range(0.0, 1.0),
                ParamSpec::choice_of(
                    "rescale",
                    Rescale::Inverse,
                    "Rescale of kept entries: 1/(1−p) (paper), L1-norm match per tensor (mergekit), or none.",
                ),
                ParamSpec::choice_of(
                    "combine",
                    Combine::Sum,
                    "How the sparsified task vectors are combined: task arithmetic, or TIES sign election + disjoint mean.",
                ),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the combined task vector."),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (drop_rate in [0, 1], λ finite).
        let drop_rate = params.float("drop_rate")?;
        let rescale = params.choice_of("rescale")?;
        let combine = params.choice_of("combine")?;
        let lambda = params.float("lambda")?;
        Ok(Dare {
            drop_rate,
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
        if self.drop_rate >= 1.0 {
            // Everything is dropped: τ̃ = 0 and θ = θ0 (no 0/0).
            return host.affine(base, 1.0, 0.0);
        }
        let keep = 1.0 - self.drop_rate;
        // Sparsified task vectors m_t ⊙ τ_t and their rescale factors r_t. Every input and
        // intermediate is released as soon as it is dead, so that a whole-tensor call (l1
        // rescale) keeps few tensor-sized buffers alive.
        let mut dropped = Vec::with_capacity(experts.len());
        let mut factors = Vec::with_capacity(experts.len());
        for (t, e) in experts.iter().enumerate() {
            host.check_cancelled()?;
            let tau = host.sub(*e, base)?;
            host.release(*e)?;
            if self.drop_rate <= 0.0 {
                // Nothing is dropped: m ⊙ τ = τ, and the l1 rescale is ‖τ‖₁/‖τ‖₁ = 1.
                dropped.push(tau);
                factors.push(1.0);
                continue;
            }
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
            dropped.push(masked);
            factors.push(factor);
        }
        match self.combine {
            Combine::Sum => {
                let mut terms = Vec::with_capacity(dropped.len() + 1);
                terms.push(base);
                terms.extend_from_slice(&dropped);
                let mut coefficients = Vec::with_capacity(dropped.len() + 1);
                coefficients.push(1.0);
                coefficients.extend(factors.iter().map(|r| self.lambda * r));
                host.weighted_sum(&terms, Some(&coefficients))
            }
            Combine::Ties => {
                // Mass election over r_t·τ̃_t, then the mean of the non-zero entries that agree
                // (a coordinate whose elected sign is 0 gets 0).
                let mut scaled = Vec::with_capacity(dropped.len());
                for (d, r) in dropped.iter().zip(&factors) {
                    if *r == 1.0 {
                        scaled.push(*d);
                    } else {
                        scaled.push(host.scale(*d, *r)?);
                        host.release(*d)?;
                    }
                }
                let elected = host.elect_sign(&scaled, ELECT_MASS)?;
                let mean = host.disjoint_merge(&scaled, elected, DISJOINT_MEAN)?;
                host.release(elected)?;
                for s in scaled {
                    host.release(s)?;
                }
                host.weighted_sum(&[base, mean], Some(&[1.0, self.lambda]))
            }
        }
    }
}

mergescope_plugin_api::export_plugin!(Dare);
