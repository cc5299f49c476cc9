//! `iso-c`: isotropic merging in the common subspace (Marczak et al., "No Task Left Behind:
//! Isotropic Model Merging with Common and Task-Specific Subspaces", ICML 2025), as FusionBench
//! 0.2.33's `iso_utils.iso_c` computes it.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::subspace;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Iso-C, isotropic merging in the common subspace (Marczak et al., ICML 2025). With the \
task vectors τ_t = θ_t − θ0 of T experts:\n\
- every 2-D tensor: the sum Δ = Σ_t τ_t = U·diag(σ)·Vᵀ (thin SVD, r = min(m, n) singular values) is \
made isotropic: every singular value is replaced by their mean σ̄ = (1/r)·Σ_i σ_i, so τ = σ̄·U·Vᵀ \
and θ = θ0 + λ·τ. Flattening the spectrum lifts the directions that only one task uses, which the \
sum's few large singular values otherwise drown.\n\
- every other tensor: θ = θ0 + λ·(1/T)·Σ_t τ_t.\n\
Parameters:\n\
- lambda (default 1.0): FusionBench's `scaling_factor` (its default 1.0; the paper tunes it on \
validation data).\n\
Reference: FusionBench 0.2.33, method/isotropic_merging/iso_utils.py::iso_c, then ISO_C_Merge.run's \
θ0 + scaling_factor·τ. The SVD is the host's, in f64.";

/// The Iso-C method.
pub struct IsoC {
    lambda: f64,
}

impl MergeMethod for IsoC {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "iso-c",
            name: "Iso-C",
            version: "",
            description: "Isotropic merging: the summed task matrix with a flat spectrum (every singular value set to their mean).",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![ParamSpec::float(
                "lambda",
                1.0,
                "Scaling factor λ of the merged task vector: θ = θ0 + λ·τ.",
            )],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(IsoC {
            lambda: params.float("lambda")?,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let all = input.base_and_experts("iso-c")?;
        let base = all[0];
        let Some((m, n)) = subspace::matrix_shape(&host.shape(base)?) else {
            return subspace::base_plus_mean_task_vector(host, &all, self.lambda);
        };
        let sum = subspace::task_vector_sum(host, &all)?;
        let (u, s, vt) = host.svd(sum, m.min(n))?;
        host.release(sum)?;
        let sigma = host.read_f32(s)?;
        host.release(s)?;
        let mean = sigma.iter().map(|&x| f64::from(x)).sum::<f64>() / sigma.len().max(1) as f64;
        let directions = host.matmul(u, vt)?;
        host.release(u)?;
        host.release(vt)?;
        subspace::base_plus(host, base, directions, self.lambda * mean)
    }
}

mergescope_plugin_api::export_plugin!(IsoC);
