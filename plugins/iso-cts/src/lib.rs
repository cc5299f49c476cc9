//! `iso-cts`: isotropic merging in the common and task-specific subspaces (Marczak et al., "No
//! Task Left Behind: Isotropic Model Merging with Common and Task-Specific Subspaces", ICML 2025),
//! as FusionBench 0.2.33's `iso_utils.iso_cts` computes it.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::subspace::{self, Spectrum, Triplets};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Iso-CTS, isotropic merging in common and task-specific subspaces (Marczak et al., ICML \
2025). With the task vectors τ_t = θ_t − θ0 of T experts, for every 2-D tensor (r = min(m, n)):\n\
1. sizes: c = ⌊r·f⌋ with f = common_space_fraction, then the task-specific total \
s = round((r − c)/T)·T (round half to even, as Python's round) and c = r − s, so each task gets \
s/T directions;\n\
2. the common subspace: the top c left and right singular vectors (U_c, V_c) and values of \
Δ = Σ_t τ_t;\n\
3. each task's own subspace: the top s/T singular triplets of τ_t − U_c·U_cᵀ·τ_t (the task vector \
with its common part projected out);\n\
4. the r triplets together: U = [task parts, U_c] and Vᵀ likewise, orthogonalised by their \
polar factors, every singular value replaced by the mean of the r gathered ones (σ̄): \
τ = σ̄·polar(U)·polar(Vᵀ), θ = θ0 + λ·τ.\n\
Every other tensor: θ = θ0 + λ·(1/T)·Σ_t τ_t.\n\
Parameters:\n\
- lambda (default 1.0): FusionBench's `scaling_factor`.\n\
- common_space_fraction (default 0.8, strictly between 0 and 1): the share f of each matrix's \
rank given to the common subspace (the paper's default 0.8).\n\
Reference: FusionBench 0.2.33, method/isotropic_merging/iso_utils.py::iso_cts, then \
ISO_CTS_Merge.run's θ0 + scaling_factor·τ. Where the reference's sizes would ask for more \
task-specific directions than the matrix has (a rank r below T with a small f: it fails there), \
each task gets ⌊(r − c)/T⌋ instead. SVDs are the host's, in f64.";

/// The Iso-CTS method.
pub struct IsoCts {
    lambda: f64,
    fraction: f64,
}

/// (common directions c, directions per task) for rank `r`, `t` tasks and fraction `f`, in the
/// reference's arithmetic.
fn subspace_sizes(r: usize, t: usize, f: f64) -> (usize, usize) {
    let common = (r as f64 * f) as usize;
    let mut per_task = ((r - common) as f64 / t as f64).round_ties_even() as usize;
    if per_task * t > r {
        per_task = (r - common) / t;
    }
    (r - per_task * t, per_task)
}

impl MergeMethod for IsoCts {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "iso-cts",
            name: "Iso-CTS",
            version: "",
            description: "Isotropic merging with common and task-specific subspaces: the sum's top directions plus each task's own, with a flat spectrum.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "lambda",
                    1.0,
                    "Scaling factor λ of the merged task vector: θ = θ0 + λ·τ.",
                ),
                ParamSpec::float(
                    "common_space_fraction",
                    0.8,
                    "Share of each matrix's rank given to the subspace common to all tasks (strictly between 0 and 1).",
                )
                .range(0.0, 1.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let fraction = params.float_strictly_between(
            "common_space_fraction",
            0.0,
            1.0,
            "0 leaves no common subspace and 1 no task-specific one (for that, use iso-c); the paper's default is 0.8",
        )?;
        Ok(IsoCts {
            lambda: params.float("lambda")?,
            fraction,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let all = input.base_and_experts("iso-cts")?;
        let (base, experts) = (all[0], &all[1..]);
        let Some((m, n)) = subspace::matrix_shape(&host.shape(base)?) else {
            return subspace::base_plus_mean_task_vector(host, &all, self.lambda);
        };
        let (common, per_task) = subspace_sizes(m.min(n), experts.len(), self.fraction);
        let common_svd = if common > 0 {
            let sum = subspace::task_vector_sum(host, &all)?;
            let svd = host.svd(sum, common)?;
            host.release(sum)?;
            Some(svd)
        } else {
            None
        };
        let mut triplets = Triplets::new(m, n);
        if per_task > 0 {
            // U_c and U_cᵀ, to project the common part out of each task vector.
            let projection = common_svd
                .map(|(u, _, _)| host.transpose(u).map(|ut| (u, ut)))
                .transpose()?;
            for e in experts {
                host.check_cancelled()?;
                let tau = host.sub(*e, base)?;
                let own = match projection {
                    Some((u, ut)) => {
                        let coordinates = host.matmul(ut, tau)?;
                        let projected = host.matmul(u, coordinates)?;
                        let own = host.sub(tau, projected)?;
                        for x in [coordinates, projected, tau] {
                            host.release(x)?;
                        }
                        own
                    }
                    None => tau,
                };
                triplets.append(host, host.svd(own, per_task)?, per_task)?;
                host.release(own)?;
            }
            if let Some((_, ut)) = projection {
                host.release(ut)?;
            }
        }
        if let Some(svd) = common_svd {
            triplets.append(host, svd, common)?;
        }
        let tau = triplets.orthogonalised_product(host, base, Spectrum::Mean)?;
        subspace::base_plus(host, base, tau, self.lambda)
    }
}

mergescope_plugin_api::export_plugin!(IsoCts);

#[cfg(test)]
mod tests {
    use super::subspace_sizes;

    #[test]
    fn sizes_follow_the_reference_rounding() {
        // r = 20, T = 4, f = 0.5: c = 10, (20 − 10)/4 = 2.5 rounds to 2 (half to even), c = 12.
        assert_eq!(subspace_sizes(20, 4, 0.5), (12, 2));
        // r = 16, T = 4, f = 0.8: c = 12, 4/4 = 1.
        assert_eq!(subspace_sizes(16, 4, 0.8), (12, 1));
        // r = 3, T = 4, f = 0.8: c = 2, 1/4 rounds to 0, so c = 3 and no task-specific directions.
        assert_eq!(subspace_sizes(3, 4, 0.8), (3, 0));
        // r = 3, T = 4, f = 0.1: 3/4 rounds to 1, 4 > 3 directions; the reference fails, we give 0.
        assert_eq!(subspace_sizes(3, 4, 0.1), (3, 0));
        // r = 768, T = 8, f = 0.8: c = 614, 154/8 = 19.25 → 19, c = 616.
        assert_eq!(subspace_sizes(768, 8, 0.8), (616, 19));
    }
}
