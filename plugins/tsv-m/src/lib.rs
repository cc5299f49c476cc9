//! `tsv-m`: Task Singular Vectors merging (Gargiulo et al., "Task Singular Vectors: Reducing
//! Task Interference in Model Merging", CVPR 2025), as FusionBench 0.2.33's
//! `TSVM_utils.compute_and_sum_svd_mem_reduction` computes it.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::subspace::{self, Spectrum, Triplets};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "TSV-M, Task Singular Vectors merging (Gargiulo et al., CVPR 2025). With the task vectors \
τ_t = θ_t − θ0 of T experts:\n\
- every 2-D tensor (m×n, r = min(m, n)): each τ_t keeps its top k = ⌊r/T⌋ singular triplets \
(U_t, Σ_t, V_t); the T·k triplets are concatenated, U = [U_1 … U_T] and Vᵀ = [V_1 … V_T]ᵀ are \
replaced by their polar factors (the nearest orthogonal matrices, which removes the interference \
between tasks' singular vectors), and τ = polar(U)·diag(Σ_1 … Σ_T)·polar(Vᵀ); θ = θ0 + λ·τ. A \
matrix of rank r < T keeps no triplet, so its τ is 0 (as in the reference).\n\
- every other tensor (biases, norms, kernels, scalars): θ = θ0 + λ·(1/T)·Σ_t τ_t.\n\
Parameters:\n\
- lambda (default 1.0): the scaling α of the merged task vector (FusionBench's `alpha`, whose \
default is 1).\n\
Reference: FusionBench 0.2.33, method/task_singular_vector/utils/TSVM_utils.py::\
compute_and_sum_svd_mem_reduction, then TaskSingularVectorMerging.run's θ0 + α·τ. SVDs are \
computed by the host in f64 (the reference: torch in f32). Memory: the T task vectors of one \
tensor and their k-rank factors.";

/// The TSV-M method.
pub struct TsvM {
    lambda: f64,
}

impl MergeMethod for TsvM {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "tsv-m",
            name: "TSV-M",
            version: "",
            description: "Task Singular Vectors: each task's top singular vectors, orthogonalised across tasks, then summed.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![ParamSpec::float(
                "lambda",
                1.0,
                "Scaling α of the merged task vector: θ = θ0 + α·τ.",
            )],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(TsvM {
            lambda: params.float("lambda")?,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let all = input.base_and_experts("tsv-m")?;
        let (base, experts) = (all[0], &all[1..]);
        let Some((m, n)) = subspace::matrix_shape(&host.shape(base)?) else {
            return subspace::base_plus_mean_task_vector(host, &all, self.lambda);
        };
        let t = experts.len();
        // The reference's int(r · (1/T)), in the same floating-point operations.
        let k = (m.min(n) as f64 * (1.0 / t as f64)) as usize;
        let mut triplets = Triplets::new(m, n);
        if k > 0 {
            for e in experts {
                host.check_cancelled()?;
                let tau = host.sub(*e, base)?;
                triplets.append(host, host.svd(tau, k)?, k)?;
                host.release(tau)?;
            }
        }
        let tau = triplets.orthogonalised_product(host, base, Spectrum::Own)?;
        subspace::base_plus(host, base, tau, self.lambda)
    }
}

mergescope_plugin_api::export_plugin!(TsvM);
