//! `karcher`: the Karcher (Riemannian, Fréchet) mean of the models' directions on the unit
//! sphere, scaled by their mean norm, as mergekit computes it (mergekit/merge_methods/karcher.py,
//! 0.1.5; Wang, Ye and Yin, 2026, arXiv:2603.04972), over whole tensors in f64.
//!
//! Inputs x_1..x_M (the experts, then the base when one is given: mergekit passes the base model
//! as one more input to a method that ignores the base role), α_i = 1/M, u_i = x_i/‖x_i‖.
//! Directions with ‖x_i‖ ≤ tol are left out (their α renormalised away). Start from the
//! normalised Σ α_i u_i (or the first valid u_i if that sum's norm is < tol), then up to
//! `max_iter` times: v = Σ α_i·θ_i/sin θ_i·(u_i − cos θ_i·μ) over the u_i with θ_i ≥ tol,
//! stop if ‖v‖ < tol, else μ ← cos‖v‖·μ + sin‖v‖·v/‖v‖ (renormalised). Result: (Σ α_i‖x_i‖)·μ.

use mergescope_plugin_api::abi::CAP_THREAD_SAFE;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Karcher mean (mergekit's `karcher`; Wang, Ye and Yin, 2026): the Riemannian (Fréchet) \
mean of the models' directions on the unit sphere, scaled by their mean norm, one whole tensor at a time. \
For the M input tensors x_i (each flattened), with equal weights α_i = 1/M and directions u_i = x_i/‖x_i‖:\n\
- directions with ‖x_i‖ ≤ tol are left out of the mean (the others' weights are renormalised to sum to 1); \
if every norm is ≤ tol the result is 0;\n\
- start: μ = Σ α_i·u_i normalised (the first valid u_i if that sum's norm is below tol);\n\
- iterate up to max_iter times: θ_i = arccos(clamp(⟨μ, u_i⟩, −1, 1)); the tangent \
v = Σ α_i·(θ_i/sin θ_i)·(u_i − cos θ_i·μ) over the u_i with θ_i ≥ tol (the Riemannian log map); stop when \
‖v‖ < tol, else μ ← cos‖v‖·μ + sin‖v‖·v/‖v‖ (the exponential map, a full step), renormalised;\n\
- result: (Σ_i α_i·‖x_i‖)·μ, the mean norm over all M inputs (those left out included).\n\
Two unit-norm models at angle φ give the unit vector halfway between them (angle φ/2 from each), \
where the linear average would have norm cos(φ/2). One model is returned unchanged.\n\
Parameters:\n\
- max_iter (default 10): most fixed-point iterations (0 keeps the normalised linear mean of the \
directions).\n\
- tol (default 1e-5, > 0): the threshold for a zero norm, a zero angle and convergence (mergekit uses \
one tolerance for all three).\n\
The base is optional: as in mergekit, which hands a method its base model as one more input, a base is \
averaged as one more model (after the experts), so M = experts + 1; give no base to average the experts \
only. The paper defines a weighted mean; mergekit's `karcher` uses equal weights and has no weight \
parameter, and neither has this plugin.";

/// The Karcher mean method.
pub struct Karcher {
    max_iter: usize,
    tol: f64,
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// The Karcher mean of `inputs` (each the same length) with equal weights, as mergekit's
/// `karcher_merge_tensors`: see the crate documentation.
pub fn karcher_mean(inputs: &[&[f32]], max_iter: usize, tol: f64) -> Vec<f32> {
    match inputs {
        [] => return Vec::new(),
        [one] => return one.to_vec(),
        _ => {}
    }
    let n = inputs[0].len();
    let alpha = 1.0 / inputs.len() as f64;
    let norms: Vec<f64> = inputs
        .iter()
        .map(|x| x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt())
        .collect();
    let valid: Vec<usize> = (0..inputs.len()).filter(|&i| norms[i] > tol).collect();
    if valid.is_empty() {
        // mergekit: `sum(tensor * 0 for tensor in tensors)`.
        return vec![0.0; n];
    }
    let weight = 1.0 / valid.len() as f64; // α_i / Σ_valid α_j, all α equal
    let unit = |i: usize, j: usize| f64::from(inputs[i][j]) / norms[i];

    let mut mean = vec![0f64; n];
    for &i in &valid {
        for (j, m) in mean.iter_mut().enumerate() {
            *m += weight * unit(i, j);
        }
    }
    let mean_norm = norm(&mean);
    if mean_norm < tol {
        let first = valid[0];
        mean.iter_mut().enumerate().for_each(|(j, m)| *m = unit(first, j));
    } else {
        mean.iter_mut().for_each(|m| *m /= mean_norm);
    }

    let mut tangent = vec![0f64; n];
    for _ in 0..max_iter {
        tangent.iter_mut().for_each(|t| *t = 0.0);
        for &i in &valid {
            let dot = (0..n).map(|j| mean[j] * unit(i, j)).sum::<f64>().clamp(-1.0, 1.0);
            let theta = dot.acos();
            if theta < tol {
                continue;
            }
            let factor = weight * (theta / theta.sin());
            for (j, t) in tangent.iter_mut().enumerate() {
                *t += factor * (unit(i, j) - dot * mean[j]);
            }
        }
        let tangent_norm = norm(&tangent);
        if tangent_norm < tol {
            break;
        }
        let (c, s) = (tangent_norm.cos(), tangent_norm.sin());
        for (m, t) in mean.iter_mut().zip(&tangent) {
            *m = c * *m + s * (t / tangent_norm);
        }
        let unit_norm = norm(&mean);
        if unit_norm > tol {
            mean.iter_mut().for_each(|m| *m /= unit_norm);
        }
    }

    // Every input's norm, valid or not, with its original weight 1/M.
    let scale: f64 = norms.iter().map(|r| alpha * r).sum();
    mean.iter().map(|m| (scale * m) as f32).collect()
}

impl MergeMethod for Karcher {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "karcher",
            name: "Karcher Mean",
            version: "",
            description: "Riemannian mean of the models' directions on the sphere, scaled by their mean norm.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE,
            params: vec![
                ParamSpec::int("max_iter", 10, "Most fixed-point iterations of the mean.").range(0.0, 100_000.0),
                ParamSpec::float(
                    "tol",
                    1e-5,
                    "Tolerance for zero norms, zero angles and convergence (greater than 0).",
                )
                .min(0.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let max_iter = params.int("max_iter")?;
        let max_iter = usize::try_from(max_iter).map_err(|_| {
            Error::Message(format!(
                "parameter 'max_iter' = {max_iter} is negative; give a number of iterations ≥ 0 (mergekit's \
                 default is 10)"
            ))
        })?;
        let tol = params.float("tol")?;
        if tol.is_nan() || tol <= 0.0 {
            return Err(Error::Message(format!(
                "parameter 'tol' = {tol} must be greater than 0: with tol = 0 an input equal to the mean has \
                 angle 0 and θ/sin θ = 0/0; give a small positive value such as mergekit's default 1e-5"
            )));
        }
        Ok(Karcher { max_iter, tol })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let first = input.experts.first().ok_or_else(|| {
            Error::Message(format!(
                "tensor '{}': the host passed no expert tensors; give at least one --expert",
                input.meta.name
            ))
        })?;
        let shape = host.shape(*first)?;
        // mergekit's order: the configured models, then the base (added as one more input).
        let mut tensors: Vec<Tensor> = input.experts.to_vec();
        tensors.extend(input.base);
        let values = tensors.iter().map(|t| host.view_f32(*t)).collect::<Result<Vec<_>>>()?;
        let n = values.first().map_or(0, |v| v.len());
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| v.len() != n) {
            let which = if i < input.experts.len() {
                format!("expert {}", i + 1)
            } else {
                "the base".to_owned()
            };
            return Err(Error::Message(format!(
                "tensor '{}': {which} has {} elements but expert 1 has {n}; the Karcher mean needs every model's \
                 tensor to have the same shape (are the checkpoints of the same architecture?)",
                input.meta.name,
                v.len()
            )));
        }
        let refs: Vec<&[f32]> = values.iter().map(AsRef::as_ref).collect();
        host.from_f32(&karcher_mean(&refs, self.max_iter, self.tol), &shape)
    }
}

mergescope_plugin_api::export_plugin!(Karcher);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_unit_vectors_meet_halfway_on_the_circle() {
        // (1, 0) and (0, 1): the mean direction is (1, 1)/√2 from the start (symmetric), norm 1.
        let out = karcher_mean(&[&[1.0, 0.0], &[0.0, 1.0]], 10, 1e-5);
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!((out[0] - h).abs() < 1e-6 && (out[1] - h).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn zero_norms_give_zero_and_are_left_out_of_the_direction() {
        assert_eq!(karcher_mean(&[&[0.0, 0.0], &[0.0, 0.0]], 10, 1e-5), vec![0.0, 0.0]);
        // (0, 0) and (2, 0): direction (1, 0), scale (0 + 2)/2 = 1.
        assert_eq!(karcher_mean(&[&[0.0, 0.0], &[2.0, 0.0]], 10, 1e-5), vec![1.0, 0.0]);
    }

    #[test]
    fn antipodal_pair_takes_the_first_direction_without_nan() {
        // (1, 0) and (−1, 0): Σ α u = 0 → μ = u_1; θ_2 = π: (u_2 − cos π·μ) = 0, so no move.
        let out = karcher_mean(&[&[1.0, 0.0], &[-1.0, 0.0]], 10, 1e-5);
        assert_eq!(out, vec![1.0, 0.0]);
    }
}
