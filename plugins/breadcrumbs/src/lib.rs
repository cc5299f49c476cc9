//! `breadcrumbs`: Model Breadcrumbs (Davari & Belilovsky, 2023), as mergekit's `breadcrumbs`
//! and `breadcrumbs_ties` compute it. Each task vector τ_t = θ_t − θ0 keeps, per tensor, the
//! entries ranked just below its largest `gamma` fraction by magnitude, `density` of them in
//! all (the smallest and the outliers are dropped); the masked vectors are weighted, optionally
//! reduced to the entries that agree with the elected sign (TIES), summed, optionally
//! normalised by the weights, scaled by λ and added to θ0.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::combine::{Consensus, combine};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Model Breadcrumbs (Davari & Belilovsky, 2023): per tensor, each task vector \
τ_t = θ_t − θ0 drops its smallest entries and its largest outliers by magnitude, keeping density·n \
entries that start above the smallest n − density·n − gamma·n; then θ = θ0 + λ·Σ_t w_t·m_t⊙τ_t, \
optionally / Σ_t w_t (normalize). With consensus = sign (mergekit's breadcrumbs_ties) an entry is \
merged only from the task vectors whose sign agrees with the sign of Σ_t w_t·m_t⊙τ_t, and \
normalize divides by the agreeing weights.\n\
Parameters (as in mergekit 0.1.5):\n\
- density (per task, default 0.9): fraction of entries kept (mergekit's default is 1, which keeps \
everything; the paper uses 0.9).\n\
- gamma (per task, default 0.01): fraction of the largest entries dropped as outliers (reduced when \
needed to keep density·n entries).\n\
- task_weights (per task, default 1.0): w_t (mergekit's weight).\n\
- lambda (default 1.0): the scaling λ.\n\
- normalize (default false): divide by the summed weights (of the agreeing entries with consensus).\n\
- consensus (default none): none (breadcrumbs) or sign (breadcrumbs_ties).\n\
Ranks come from a sort of |τ| per tensor, so tensors are merged whole (no chunking); entries of \
equal magnitude at the cut may be kept differently from mergekit, whose sort order at ties is \
unspecified.";

/// The Model Breadcrumbs method.
pub struct Breadcrumbs {
    density: Vec<f64>,
    gamma: Vec<f64>,
    weights: Vec<f64>,
    lambda: f64,
    normalize: bool,
    consensus: Consensus,
}

/// The mask of `delta`'s entries breadcrumbs keeps (mergekit's `magnitude_outliers`).
pub fn breadcrumbs_mask(delta: &[f32], density: f64, gamma: f64) -> Vec<bool> {
    let n = delta.len();
    if density >= 1.0 {
        return vec![true; n];
    }
    let target = (density * n as f64) as usize;
    let top = (gamma * n as f64) as usize;
    let bottom = n.saturating_sub(target + top);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| delta[*a].abs().total_cmp(&delta[*b].abs()));
    let mut keep = vec![false; n];
    for &i in &order[bottom..(bottom + target).min(n)] {
        keep[i] = true;
    }
    keep
}

impl MergeMethod for Breadcrumbs {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "breadcrumbs",
            name: "Model Breadcrumbs",
            version: "",
            description: "Drops each task vector's smallest entries and largest outliers, then adds the weighted sum (optionally with TIES sign consensus).",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float("density", 0.9, "Fraction of each task vector's entries kept.")
                    .range(0.0, 1.0)
                    .per_task(),
                ParamSpec::float("gamma", 0.01, "Fraction of the largest entries dropped as outliers.")
                    .range(0.0, 1.0)
                    .per_task(),
                ParamSpec::float("task_weights", 1.0, "Weight w_t of each expert's task vector.").per_task(),
                ParamSpec::float("lambda", 1.0, "Scaling coefficient λ of the merged task vector."),
                ParamSpec::bool("normalize", false, "Divide by the summed weights."),
                ParamSpec::choice_of(
                    "consensus",
                    Consensus::None,
                    "none: merge every kept entry (breadcrumbs); sign: only those agreeing with the elected sign (breadcrumbs_ties).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Breadcrumbs {
            density: params.per_task("density")?,
            gamma: params.per_task("gamma")?,
            weights: params.per_task("task_weights")?,
            lambda: params.float("lambda")?,
            normalize: params.bool("normalize")?,
            consensus: params.choice_of("consensus")?,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let experts = input.experts;
        let base = input.require_base("breadcrumbs")?;
        let shape = host.shape(base)?;
        let b = host.view_f32(base)?;
        // w_t·m_t⊙τ_t for every expert, as mergekit forms them (in f32).
        let deltas: Vec<Vec<f32>> = experts
            .iter()
            .enumerate()
            .map(|(t, e)| {
                let e = host.view_f32(*e)?;
                let d: Vec<f32> = e.iter().zip(b.iter()).map(|(x, y)| x - y).collect();
                let keep = breadcrumbs_mask(&d, self.density[t], self.gamma[t]);
                let w = self.weights[t] as f32;
                Ok(d.iter().zip(keep).map(|(v, k)| if k { v * w } else { 0.0 }).collect())
            })
            .collect::<Result<_>>()?;
        let out = combine(&b, &deltas, &self.weights, self.consensus, self.normalize, self.lambda);
        host.from_f32(&out, &shape)
    }
}

mergescope_plugin_api::export_plugin!(Breadcrumbs);

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten entries, density 0.5 and gamma 0.1: the 4 smallest and the largest go, the 5 ranked
    /// 5th to 9th stay (mergekit's indices[n_bot : n_bot + target_n]).
    #[test]
    fn the_mask_drops_the_smallest_and_the_outliers() {
        let d = [0.1, -0.9, 0.3, 10.0, -0.2, 0.5, 0.05, -0.7, 0.6, 0.4];
        let keep = breadcrumbs_mask(&d, 0.5, 0.1);
        let kept: Vec<f32> = d.iter().zip(&keep).filter(|(_, k)| **k).map(|(v, _)| *v).collect();
        assert_eq!(kept, vec![-0.9, 0.5, -0.7, 0.6, 0.4]);
        // When gamma would leave too few, fewer outliers are dropped (n_bot clamps at 0).
        assert_eq!(breadcrumbs_mask(&d, 0.95, 0.5).iter().filter(|k| **k).count(), 9);
        assert!(breadcrumbs_mask(&d, 1.0, 0.5).iter().all(|k| *k));
    }
}
