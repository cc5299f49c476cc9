//! `cart`: CART, centered task arithmetic with low-rank approximation (Choi et al., "Revisiting
//! Weight Averaging for Model Merging", Eq. 4 / Algorithm 1).
//!
//! Weight matrices: θ* = θ_avg + λ·Σ_t SVD_k(θ_t − θ_avg); every other tensor: θ_avg.

use mergescope_plugin_api::abi::{CAP_THREAD_SAFE, ROLE_MATRIX};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "CART (Choi et al., \"Revisiting Weight Averaging for Model Merging\", Algorithm 1). \
With θ_avg = (1/T)·Σ_t θ_t and the centered task vectors τ̄_t = θ_t − θ_avg:\n\
- weight matrices (role matrix): θ* = θ_avg + λ·Σ_t SVD_k(τ̄_t), where SVD_k is the best rank-k \
approximation (truncated SVD, computed by the host in f64);\n\
- every other tensor (biases, norms, embeddings, convolution kernels, scalars): θ* = θ_avg \
(standard weight averaging, as in the paper's implementation details).\n\
The base model is not needed and is ignored (CART centres on the average, not on θ0).\n\
Parameters:\n\
- rank_mode (default fraction): fraction uses k = ⌈r·rank_ratio⌉ with r = min(m, n) of the m×n \
matrix (the paper's \"rank ratio\"); absolute uses k = rank for every matrix.\n\
- rank_ratio (default 0.08, in [0, 1]): the paper keeps 8% of the rank (§4.3, Fig. 6). k is \
computed as ⌈r·γ − 1e-9⌉ so that products like 25·0.08 = 2.0000000000000004 give 2, and clamped to \
[0, r].\n\
- rank (default 8, ≥ 0): k when rank_mode = absolute, clamped to r.\n\
- lambda (default 1.0): the paper's CART default (λ_t = λ for all tasks and layers).\n\
k = 0 and k = r both give θ_avg (an empty sum, or Σ_t τ̄_t = 0; the plugin returns θ_avg exactly in \
both cases). With T = 2 experts τ̄_2 = −τ̄_1, so CART equals weight averaging for every k and λ; the \
plugin warns about that once.";

mergescope_plugin_api::choice_enum! {
    /// The `rank_mode` parameter.
    enum RankChoice {
        Fraction = "fraction",
        Absolute = "absolute",
    }
}

/// How the rank k of each matrix is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RankMode {
    /// k = ⌈min(m, n)·ratio⌉.
    Fraction(f64),
    /// k = rank for every matrix.
    Absolute(usize),
}

/// The CART method.
pub struct Cart {
    rank: RankMode,
    lambda: f64,
}

/// Rank k kept for a matrix of full rank `r` under `ratio` (the SDK's shared rule).
pub use mergescope_plugin_api::sdk::rank_from_ratio;

impl Cart {
    fn rank_for(&self, r: usize) -> usize {
        match self.rank {
            RankMode::Fraction(ratio) => rank_from_ratio(r, ratio),
            RankMode::Absolute(k) => k.min(r),
        }
    }
}

impl MergeMethod for Cart {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "cart",
            name: "CART",
            version: "",
            description: "Weight average plus the low-rank parts of the experts' deviations from it (centered task arithmetic).",
            help: HELP,
            capabilities: CAP_THREAD_SAFE,
            params: vec![
                ParamSpec::choice_of(
                    "rank_mode",
                    RankChoice::Fraction,
                    "How the rank k is chosen: a fraction of each matrix's full rank, or an absolute number.",
                ),
                ParamSpec::float(
                    "rank_ratio",
                    0.08,
                    "Fraction γ of the full rank kept: k = ⌈min(m, n)·γ⌉.",
                )
                .range(0.0, 1.0),
                ParamSpec::int("rank", 8, "Rank k kept in every matrix when rank_mode = absolute.").min(0.0),
                ParamSpec::float(
                    "lambda",
                    1.0,
                    "Scaling coefficient λ of the summed low-rank centered task vectors.",
                ),
            ],
        }
    }

    fn create(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (rank_ratio in [0, 1], rank ≥ 0,
        // λ finite).
        let rank = match params.choice_of("rank_mode")? {
            RankChoice::Fraction => RankMode::Fraction(params.float("rank_ratio")?),
            RankChoice::Absolute => {
                let k = params.int("rank")?;
                RankMode::Absolute(usize::try_from(k).map_err(|_| format!("parameter 'rank': {k} is negative"))?)
            }
        };
        let lambda = params.float("lambda")?;
        if ctx.n_experts == 2 {
            host.warn(
                "cart: with 2 experts the centered task vectors are opposite (τ̄_2 = −τ̄_1), so CART \
                 equals weight averaging for every rank and λ; merge at least 3 experts to see an effect",
            );
        }
        Ok(Cart { rank, lambda })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let t = experts.len();
        let avg = host.weighted_sum(experts, Some(&vec![1.0 / t as f64; t]))?;
        if tensor.role != ROLE_MATRIX {
            return Ok(avg);
        }
        let shape = host.shape(avg)?;
        let &[m, n] = shape.as_slice() else {
            return Err(Error::Message(format!(
                "tensor '{}' has the matrix role but shape {shape:?}; CART low-ranks 2-D matrices only",
                tensor.name
            )));
        };
        let r = m.min(n);
        let k = self.rank_for(r);
        // k = 0: empty sum; k = r: SVD_r(τ̄_t) = τ̄_t and Σ_t τ̄_t = 0. Both are θ_avg exactly.
        if k == 0 || k >= r || t == 1 {
            return Ok(avg);
        }
        let mut terms = Vec::with_capacity(t + 1);
        terms.push(avg);
        for e in experts {
            host.check_cancelled()?;
            let centered = host.sub(*e, avg)?;
            terms.push(host.low_rank(centered, k)?);
        }
        let mut coefficients = vec![self.lambda; t + 1];
        coefficients[0] = 1.0;
        host.weighted_sum(&terms, Some(&coefficients))
    }
}

mergescope_plugin_api::export_plugin!(Cart);
