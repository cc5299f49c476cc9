//! `slerp`: spherical linear interpolation between the base model and one expert, tensor by
//! tensor, as mergekit's `slerp` computes it (mergekit/merge_methods/slerp.py).
//!
//! Per tensor, with v0 the base's and v1 the expert's values flattened: the cosine of their
//! angle is c = ⟨v0, v1⟩ / (‖v0‖·‖v1‖) (a norm ≤ 1e-8 counts as 1, as mergekit normalises only
//! above that). If |c| > 0.9995 the vectors are nearly colinear and the result is the linear
//! interpolation (1 − t)·v0 + t·v1; otherwise, with θ = arccos c,
//! v = sin((1 − t)θ)/sin θ · v0 + sin(tθ)/sin θ · v1. The norms and the dot product are
//! accumulated in f64 (mergekit 0.1.5: float32 torch) in a statistics pass over chunks, whose
//! partial sums are added in offset order (so the result does not depend on the threads); the
//! merge pass is then elementwise, one fused weighted sum per chunk, in parallel.

use mergescope_plugin_api::abi::{
    CAP_CHUNKED_STATISTICS, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_ONE_EXPERT, CAP_TENSOR_STATISTICS, CAP_THREAD_SAFE,
};
use mergescope_plugin_api::sdk::{ChunkSums, PerTensor, gram_sums};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput, TensorMeta,
};

const HELP: &str = "SLERP (spherical linear interpolation, Shoemake 1985; mergekit's `slerp`). \
Interpolates each tensor between the base model θ0 (t = 0) and one expert θ1 (t = 1) along the \
great circle through their directions: with c = ⟨θ0, θ1⟩/(‖θ0‖‖θ1‖) and θ = arccos c, \
θ_t = sin((1 − t)θ)/sin θ·θ0 + sin(tθ)/sin θ·θ1. Norms and angles are taken over the whole tensor, \
flattened. Choices follow mergekit: where |c| > 0.9995 (nearly colinear tensors, for example norm \
weights that barely moved) the linear interpolation (1 − t)·θ0 + t·θ1 is used instead; a norm at \
most 1e-8 is treated as 1.\n\
Parameters:\n\
- t (default 0.5, in [0, 1]): how far from the base towards the expert. mergekit requires it and \
has no default; 0.5 is the midpoint. (mergekit's per-layer gradients of t are not supported yet.)\n\
Exactly one expert is merged with the base (give a base and one expert).";

/// Above this |cos| the tensors count as colinear and are interpolated linearly (mergekit's
/// `DOT_THRESHOLD`).
const DOT_THRESHOLD: f64 = 0.9995;

/// A norm at most this is not divided by (mergekit's `eps`).
const EPS: f64 = 1e-8;

/// The SLERP method.
pub struct Slerp {
    t: f64,
    /// Statistics pass: per tensor and chunk, ‖v0‖², ‖v1‖² and ⟨v0, v1⟩.
    sums: ChunkSums,
    /// After the pass: per tensor, the coefficients (s0, s1).
    coefficients: PerTensor<(f64, f64)>,
}

/// The coefficients (s0, s1) of θ_t = s0·v0 + s1·v1 for interpolation fraction `t`, given the
/// squared norms of v0 and v1 and their dot product.
pub fn coefficients(t: f64, norm0_sq: f64, norm1_sq: f64, dot: f64) -> (f64, f64) {
    let scale = |sq: f64| {
        let n = sq.sqrt();
        if n > EPS { n } else { 1.0 }
    };
    let cos = (dot / (scale(norm0_sq) * scale(norm1_sq))).clamp(-1.0, 1.0);
    if cos.abs() > DOT_THRESHOLD {
        return (1.0 - t, t);
    }
    let theta = cos.acos();
    let sin_theta = theta.sin();
    (((1.0 - t) * theta).sin() / sin_theta, (t * theta).sin() / sin_theta)
}

impl MergeMethod for Slerp {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "slerp",
            name: "SLERP",
            version: "",
            description: "Spherical linear interpolation between the base and one expert, tensor by tensor.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE
                | CAP_NEEDS_BASE
                | CAP_ELEMENTWISE
                | CAP_CHUNKED_STATISTICS
                | CAP_TENSOR_STATISTICS
                | CAP_ONE_EXPERT,
            params: vec![
                ParamSpec::float("t", 0.5, "Interpolation fraction: 0 gives the base, 1 the expert.").range(0.0, 1.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        if ctx.n_experts != 1 {
            return Err(Error::Message(format!(
                "slerp interpolates between the base and exactly one expert, but this merge has {} experts; \
                 give one --expert (to combine more models use task-arithmetic, ties or model-stock)",
                ctx.n_experts
            )));
        }
        Ok(Slerp {
            t: params.float("t")?,
            sums: ChunkSums::default(),
            coefficients: PerTensor::default(),
        })
    }

    fn prepare_passes(&self) -> u32 {
        1
    }

    fn prepare_tensor(&mut self, host: &Host<'_>, _pass: u32, input: &TensorInput<'_>) -> Result<()> {
        let (tensor, experts) = (&input.meta, input.experts);
        let v0 = input.require_base("slerp")?;
        let v1 = experts[0];
        // ‖v0‖², ‖v1‖², ⟨v0, v1⟩: the sequential sums of the host's `reduce` and `dot`, from its
        // lent values.
        let (a, b) = (host.view_f32(v0)?, host.view_f32(v1)?);
        self.sums.add(tensor, gram_sums(&[&a, &b], None));
        Ok(())
    }

    fn finish_tensor(&mut self, _host: &Host<'_>, _pass: u32, tensor: &TensorMeta<'_>) -> Result<()> {
        if let Some(s) = self.sums.take_total(tensor.name) {
            self.coefficients
                .insert(tensor.name.to_owned(), coefficients(self.t, s[0], s[1], s[2]));
        }
        Ok(())
    }

    fn finish_pass(&mut self, _host: &Host<'_>, _pass: u32) -> Result<()> {
        // The tensors `finish_tensor` did not finish (all of them, on a host older than ABI 1.5).
        for (name, s) in self.sums.take_totals() {
            self.coefficients.insert(name, coefficients(self.t, s[0], s[1], s[2]));
        }
        Ok(())
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let v0 = input.require_base("slerp")?;
        let (s0, s1) = self.coefficients.get(tensor, "slerp")?;
        host.weighted_sum(&[v0, experts[0]], Some(&[s0, s1]))
    }
}

mergescope_plugin_api::export_plugin!(Slerp);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_unit_vectors_follow_the_circle() {
        // v0 = (1, 0), v1 = (0, 1): θ = π/2, so θ_t = (cos(tπ/2), sin(tπ/2)).
        for t in [0.0, 0.25, 0.5, 1.0] {
            let (s0, s1) = coefficients(t, 1.0, 1.0, 0.0);
            let a = t * std::f64::consts::FRAC_PI_2;
            assert!((s0 - a.cos()).abs() < 1e-12 && (s1 - a.sin()).abs() < 1e-12, "t = {t}");
        }
    }

    #[test]
    fn colinear_vectors_are_interpolated_linearly() {
        // v1 = 2·v0: cos = 1 > 0.9995.
        assert_eq!(coefficients(0.3, 1.0, 4.0, 2.0), (1.0 - 0.3, 0.3));
        // Opposite directions too (|cos| = 1).
        assert_eq!(coefficients(0.3, 1.0, 1.0, -1.0), (1.0 - 0.3, 0.3));
    }

    #[test]
    fn a_zero_tensor_is_not_normalised() {
        // ‖v0‖ = 0 counts as 1: cos = 0, θ = π/2.
        let (s0, s1) = coefficients(0.5, 0.0, 1.0, 0.0);
        let h = std::f64::consts::FRAC_1_SQRT_2;
        assert!((s0 - h).abs() < 1e-12 && (s1 - h).abs() < 1e-12);
    }
}
