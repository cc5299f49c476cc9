//! `multislerp`: Multi-SLERP, mergekit's barycentric interpolation of several models (or of
//! their task vectors, with a base) on the hypersphere (mergekit/merge_methods/multislerp.py,
//! 0.1.5; after C. Goddard, "Multi-SLERP"), over whole tensors in f64.
//!
//! For vectors v_i (the experts, or θ_i − θ0 with a base) and weights w_i (normalised to sum to
//! 1 unless `normalize_weights` is false): u_i = v_i/(‖v_i‖ + eps); μ = Σ w_i·u_i, normalised
//! (if ‖μ‖ < eps: the linear w_1·v_1 + w_2·v_2 for two experts, an error for more); the tangent
//! t = Σ w_i·(u_i − ⟨u_i, μ⟩·μ), τ = ‖t‖ + eps; v = (cos τ·μ + sin τ/τ·t)·Σ w_i‖v_i‖ (+ θ0).

use mergescope_plugin_api::abi::CAP_THREAD_SAFE;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Multi-SLERP (mergekit's `multislerp`, after C. Goddard's Multi-SLERP post): weighted \
interpolation of any number of experts on the hypersphere, one whole tensor at a time. Without a base the \
experts θ_i themselves are interpolated; with a base θ0 their task vectors v_i = θ_i − θ0 are, and θ0 is \
added back. With weights w_i (divided by their sum when normalize_weights):\n\
- project: u_i = v_i/(‖v_i‖ + eps);\n\
- mean direction: μ = Σ w_i·u_i, divided by its norm; where ‖μ‖ < eps (antipodal vectors with balancing \
weights, or all vectors zero) two experts fall back to the linear w_1·v_1 + w_2·v_2, and three or more \
are an error, as in mergekit;\n\
- tangent step: t = Σ w_i·(u_i − ⟨u_i, μ⟩·μ), τ = ‖t‖ + eps, direction cos τ·μ + (sin τ/τ)·t;\n\
- scale by Σ w_i·‖v_i‖ (the weighted mean norm).\n\
One expert is returned unchanged (also with a base). Two experts with equal weights and equal norms give \
SLERP at t = 1/2.\n\
Parameters:\n\
- weights (per task, default 1.0): w_i, the weight of each expert (mergekit's per-model weight). mergekit requires a weight for every \
model; here an unset weight is 1, so the default is the equal-weight mean.\n\
- normalize_weights (default true): divide the weights by their sum (which must then not be 0). When \
false the weights are used as given, and Σ w_i·‖v_i‖ scales the result accordingly.\n\
- eps (default 1e-8, > 0): the constant added to the norms, and mergekit's threshold for a zero mean.\n\
The base is optional.\n\
As mergekit, and unlike a true spherical barycentre (the geodesic mean the post motivates): the tangent \
vectors are orthogonal projections onto the tangent plane at the normalised Euclidean mean μ, not \
log-map vectors, and their weighted sum is 0 up to round-off (Σ w_i·u_i is parallel to μ), so the result \
is the normalised weighted mean of the directions times the weighted mean norm: one step, no iteration \
(for the iterated geodesic mean see the karcher method).";

/// The Multi-SLERP method.
pub struct Multislerp {
    weights: Vec<f64>,
    eps: f64,
}

/// Where the weighted mean of the unit vectors vanishes (‖μ‖ < eps) for three or more experts:
/// mergekit's error (`The weighted sum of the input tensors is zero`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZeroMean {
    /// ‖Σ w_i·u_i‖.
    pub norm: f64,
}

/// Multi-SLERP of one tensor: `experts` (each as long as `base`, when given) with `weights`
/// already normalised as the method uses them, and mergekit's `eps`.
pub fn multislerp(
    base: Option<&[f32]>,
    experts: &[&[f32]],
    weights: &[f64],
    eps: f64,
) -> std::result::Result<Vec<f32>, ZeroMean> {
    let [first, rest @ ..] = experts else {
        return Ok(base.map(<[f32]>::to_vec).unwrap_or_default());
    };
    if rest.is_empty() {
        // "No interpolation needed": the expert itself, with or without a base.
        return Ok(first.to_vec());
    }
    let n = first.len();
    let origin = |j: usize| base.map_or(0.0, |b| f64::from(b[j]));
    let vector = |i: usize, j: usize| f64::from(experts[i][j]) - origin(j);
    let norms: Vec<f64> = (0..experts.len())
        .map(|i| (0..n).map(|j| vector(i, j).powi(2)).sum::<f64>().sqrt())
        .collect();
    let unit = |i: usize, j: usize| vector(i, j) / (norms[i] + eps);

    let mut mean: Vec<f64> = (0..n)
        .map(|j| weights.iter().enumerate().map(|(i, w)| unit(i, j) * w).sum())
        .collect();
    let mean_norm = mean.iter().map(|m| m * m).sum::<f64>().sqrt();
    if mean_norm < eps {
        if experts.len() == 2 {
            // mergekit's fallback to linear interpolation.
            return Ok((0..n)
                .map(|j| (vector(0, j) * weights[0] + vector(1, j) * weights[1] + origin(j)) as f32)
                .collect());
        }
        return Err(ZeroMean { norm: mean_norm });
    }
    mean.iter_mut().for_each(|m| *m /= mean_norm);

    let dots: Vec<f64> = (0..experts.len())
        .map(|i| (0..n).map(|j| unit(i, j) * mean[j]).sum())
        .collect();
    let tangent: Vec<f64> = (0..n)
        .map(|j| {
            weights
                .iter()
                .enumerate()
                .map(|(i, w)| (unit(i, j) - dots[i] * mean[j]) * w)
                .sum()
        })
        .collect();
    let tangent_norm = tangent.iter().map(|t| t * t).sum::<f64>().sqrt() + eps;
    let (c, s) = (tangent_norm.cos(), tangent_norm.sin() / tangent_norm);
    let avg_norm: f64 = norms.iter().zip(weights).map(|(r, w)| r * w).sum();
    Ok((0..n)
        .map(|j| ((mean[j] * c + tangent[j] * s) * avg_norm + origin(j)) as f32)
        .collect())
}

/// The weights the method uses: `raw`, divided by their sum when `normalize`; an error naming
/// the parameter when that sum is 0.
pub fn effective_weights(raw: &[f64], normalize: bool) -> Result<Vec<f64>> {
    if !normalize {
        return Ok(raw.to_vec());
    }
    let total: f64 = raw.iter().sum();
    if total == 0.0 {
        return Err(Error::Message(format!(
            "parameter 'weights' = {raw:?} sums to 0, and normalize_weights = true divides the weights by their \
             sum; give weights with a non-zero sum, or set normalize_weights = false"
        )));
    }
    Ok(raw.iter().map(|w| w / total).collect())
}

impl MergeMethod for Multislerp {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "multislerp",
            name: "Multi-SLERP",
            version: "",
            description: "Weighted spherical interpolation of several experts (or of their task vectors, with a base).",
            help: HELP,
            capabilities: CAP_THREAD_SAFE,
            params: vec![
                ParamSpec::float("weights", 1.0, "Weight of each expert (mergekit's per-model weight).").per_task(),
                ParamSpec::bool("normalize_weights", true, "Divide the weights by their sum."),
                ParamSpec::float(
                    "eps",
                    1e-8,
                    "Added to the norms, and the threshold for a zero mean (greater than 0).",
                )
                .min(0.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let eps = params.float("eps")?;
        if eps.is_nan() || eps <= 0.0 {
            return Err(Error::Message(format!(
                "parameter 'eps' = {eps} must be greater than 0: with eps = 0 a zero vector (or a zero tangent) is \
                 divided by its zero norm; give a small positive value such as mergekit's default 1e-8"
            )));
        }
        let weights = effective_weights(&params.per_task("weights")?, params.bool("normalize_weights")?)?;
        Ok(Multislerp { weights, eps })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let name = input.meta.name;
        let first = input.experts.first().ok_or_else(|| {
            Error::Message(format!(
                "tensor '{name}': the host passed no expert tensors; give at least one --expert"
            ))
        })?;
        let shape = host.shape(*first)?;
        let experts = input
            .experts
            .iter()
            .map(|e| host.view_f32(*e))
            .collect::<Result<Vec<_>>>()?;
        let base = input.base.map(|b| host.view_f32(b)).transpose()?;
        let n = experts.first().map_or(0, |v| v.len());
        if let Some((i, e)) = experts.iter().enumerate().find(|(_, e)| e.len() != n) {
            return Err(Error::Message(format!(
                "tensor '{name}': expert {} has {} elements but expert 1 has {n}; Multi-SLERP needs every model's \
                 tensor to have the same shape (are the checkpoints of the same architecture?)",
                i + 1,
                e.len()
            )));
        }
        if let Some(b) = base.as_ref().filter(|b| b.len() != n) {
            return Err(Error::Message(format!(
                "tensor '{name}': the base has {} elements but the experts have {n}; Multi-SLERP needs the base's \
                 tensor to have the experts' shape (is the base of the same architecture?)",
                b.len()
            )));
        }
        if self.weights.len() != experts.len() {
            return Err(Error::Message(format!(
                "tensor '{name}': parameter 'weights' has {} values for {} experts; give one per expert",
                self.weights.len(),
                experts.len()
            )));
        }
        if n == 0 {
            // An empty tensor has no direction to interpolate: its merge is empty too.
            return host.from_f32(&[], &shape);
        }
        let refs: Vec<&[f32]> = experts.iter().map(AsRef::as_ref).collect();
        let merged = multislerp(base.as_deref(), &refs, &self.weights, self.eps).map_err(|z| {
            let (what, short, example) = if base.is_some() {
                (
                    "task vectors (expert − base)",
                    "task vectors",
                    ", e.g. every expert equal to the base here",
                )
            } else {
                ("tensors", "tensors", "")
            };
            Error::Message(format!(
                "tensor '{name}': the weighted sum of the {} experts' unit {what} is zero (norm {:e} < eps = {:e}): \
                 antipodal {short} whose weights balance out, or {short} that are all zero{example}. mergekit stops \
                 here too (its fallback to linear interpolation covers two experts only); change parameter 'weights' \
                 so that the directions do not cancel, or merge this tensor with another method",
                refs.len(),
                z.norm,
                self.eps,
            ))
        })?;
        host.from_f32(&merged, &shape)
    }
}

mergescope_plugin_api::export_plugin!(Multislerp);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_weights_of_two_unit_vectors_give_the_midpoint() {
        // (1, 0) and (0, 1), w = ½ each: μ = (1, 1)/√2, tangent 0, norm 1.
        let out = multislerp(None, &[&[1.0, 0.0], &[0.0, 1.0]], &[0.5, 0.5], 1e-8).unwrap();
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!((out[0] - h).abs() < 1e-6 && (out[1] - h).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn cancelling_directions_fall_back_or_fail() {
        // Two antipodal vectors: linear ½·(1, 0) + ½·(−1, 0) = 0.
        let out = multislerp(None, &[&[1.0, 0.0], &[-1.0, 0.0]], &[0.5, 0.5], 1e-8).unwrap();
        assert_eq!(out, vec![0.0, 0.0]);
        // Three zero task vectors: mergekit's error.
        let z = [1.0f32, 2.0];
        assert!(multislerp(Some(&z), &[&z, &z, &z], &[1.0 / 3.0; 3], 1e-8).is_err());
    }

    #[test]
    fn weights_are_normalised_unless_asked_not_to() {
        assert_eq!(effective_weights(&[1.0, 3.0], true).unwrap(), vec![0.25, 0.75]);
        assert_eq!(effective_weights(&[1.0, 3.0], false).unwrap(), vec![1.0, 3.0]);
        assert!(effective_weights(&[1.0, -1.0], true).is_err());
    }
}
