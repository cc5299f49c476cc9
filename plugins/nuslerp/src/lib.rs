//! `nuslerp`: mergekit's NuSLERP (mergekit/merge_methods/nuslerp.py, 0.1.5): spherical
//! interpolation of two experts, or of their task vectors when a base is given, at
//! t = w₂ / (w₁ + w₂), over the whole tensor (the default), per row, or per column.
//!
//! For directions v0, v1 with c = ⟨v0/‖v0‖, v1/‖v1‖⟩ (norms clamped to ≥ 1e-7, c to [−1, 1]) and
//! θ = arccos c: v = (sin((1 − t)θ)·v0 + sin(tθ)·v1) / sin θ (summed, then divided, then added to
//! the base, in mergekit's order), or (1 − t)·v0 + t·v1 where
//! 1 − c² ≤ 1e-16 (colinear). With a base θ0: θ = θ0 + nuslerp(t, θ1 − θ0, θ2 − θ0).

use mergescope_plugin_api::abi::CAP_THREAD_SAFE;
use mergescope_plugin_api::sdk::gram_sums;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "NuSLERP (mergekit's `nuslerp`): spherical interpolation of exactly two experts θ1, θ2 \
at t = w2/(w1 + w2) (t = 0.5 when the weights sum to about 0). Without a base the experts themselves \
are interpolated; with a base θ0 their task vectors are, and θ = θ0 + the interpolated task vector. For \
vectors v0, v1 at angle θ (cos from the normalised vectors, each norm at least 1e-7, clamped to \
[−1, 1]): v = (sin((1 − t)θ)·v0 + sin(tθ)·v1)/sin θ, and the linear (1 − t)·v0 + t·v1 where \
1 − cos² ≤ 1e-16.\n\
Parameters:\n\
- weights (per task, default 1.0): w1 and w2, the relative weights of the two experts.\n\
- flatten (default true): one angle for the whole tensor (mergekit's `nuslerp_flatten`). When false, \
one angle per row (vector along the last dimension), or per column with row_wise.\n\
- row_wise (default false): with flatten = false, interpolate the vectors along the first dimension \
(mergekit's `nuslerp_row_wise`, which transposes dimension 0 to the last).\n\
The base is optional.";

/// Smallest norm a vector is divided by (mergekit's `_normalize` eps).
const MIN_NORM: f64 = 1e-7;

/// Vectors count as colinear where 1 − cos² is at most this (mergekit's eps²).
const COLINEAR: f64 = 1e-16;

/// The NuSLERP method.
pub struct Nuslerp {
    t: f64,
    flatten: bool,
    row_wise: bool,
}

/// The coefficients (s0, s1, d) of v = (s0·v0 + s1·v1) / d at fraction `t`, given the squared
/// norms of v0 and v1 and their dot product. The division comes last, as in mergekit: near
/// antipodal vectors sin θ is tiny and s0·v0 + s1·v1 must cancel before it is divided.
pub fn coefficients(t: f64, norm0_sq: f64, norm1_sq: f64, dot: f64) -> (f64, f64, f64) {
    let cos = (dot / (norm0_sq.sqrt().max(MIN_NORM) * norm1_sq.sqrt().max(MIN_NORM))).clamp(-1.0, 1.0);
    if 1.0 - cos * cos <= COLINEAR {
        return (1.0 - t, t, 1.0);
    }
    let theta = cos.acos();
    (((1.0 - t) * theta).sin(), (t * theta).sin(), theta.sin())
}

/// Interpolates `v0` and `v1` vector by vector: the vectors run along the last axis of `shape`,
/// or along the first when `first_axis`.
fn per_vector(t: f64, shape: &[usize], v0: &[f32], v1: &[f32], first_axis: bool) -> Vec<f32> {
    let n = v0.len();
    let (len, stride, count) = match (first_axis, shape) {
        (true, [first, ..]) if shape.len() > 1 => (*first, n / first.max(&1), n / first.max(&1)),
        _ => {
            let last = shape.last().copied().unwrap_or(n).max(1);
            (last, 1, n / last)
        }
    };
    // Vector k holds the elements start(k) + i·stride, i < len.
    let start = |k: usize| if stride == 1 { k * len } else { k };
    let mut out = vec![0f32; n];
    for k in 0..count {
        let at = |i: usize| start(k) + i * stride;
        let (mut n0, mut n1, mut dot) = (0f64, 0f64, 0f64);
        for i in 0..len {
            let (a, b) = (f64::from(v0[at(i)]), f64::from(v1[at(i)]));
            n0 += a * a;
            n1 += b * b;
            dot += a * b;
        }
        let (s0, s1, d) = coefficients(t, n0, n1, dot);
        for i in 0..len {
            let j = at(i);
            out[j] = ((s0 * f64::from(v0[j]) + s1 * f64::from(v1[j])) / d) as f32;
        }
    }
    out
}

impl MergeMethod for Nuslerp {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "nuslerp",
            name: "NuSLERP",
            version: "",
            description: "Spherical interpolation of two experts (or of their task vectors, with a base), per tensor, row or column.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE,
            params: vec![
                ParamSpec::float("weights", 1.0, "Relative weight of each of the two experts.").per_task(),
                ParamSpec::bool("flatten", true, "One angle per tensor (else per row or column)."),
                ParamSpec::bool(
                    "row_wise",
                    false,
                    "With flatten = false: per column instead of per row.",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        if ctx.n_experts != 2 {
            return Err(Error::Message(format!(
                "nuslerp interpolates exactly two experts, but this merge has {}; give two --expert (and \
                 optionally a --base whose task vectors are interpolated)",
                ctx.n_experts
            )));
        }
        let w = params.per_task("weights")?;
        let total = w[0] + w[1];
        Ok(Nuslerp {
            t: if total.abs() < 1e-6 { 0.5 } else { w[1] / total },
            flatten: params.bool("flatten")?,
            row_wise: params.bool("row_wise")?,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (base, experts) = (input.base, input.experts);
        let (v0, v1) = match base {
            Some(b) => (host.sub(experts[0], b)?, host.sub(experts[1], b)?),
            None => (experts[0], experts[1]),
        };
        let merged = if self.flatten {
            // ‖v0‖², ‖v1‖², ⟨v0, v1⟩ in one read: the host's `reduce` and `dot` sums, same bits.
            let g = gram_sums(&[&host.view_f32(v0)?, &host.view_f32(v1)?], None);
            let (s0, s1, d) = coefficients(self.t, g[0], g[1], g[2]);
            let sum = host.weighted_sum(&[v0, v1], Some(&[s0, s1]))?;
            if d == 1.0 {
                sum
            } else {
                host.div(sum, host.from_f32(&[d as f32], &[1])?)?
            }
        } else {
            let shape = host.shape(v0)?;
            let values = per_vector(self.t, &shape, &host.view_f32(v0)?, &host.view_f32(v1)?, self.row_wise);
            host.from_f32(&values, &shape)?
        };
        match base {
            Some(b) => host.add(b, merged),
            None => Ok(merged),
        }
    }
}

mergescope_plugin_api::export_plugin!(Nuslerp);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_directions_follow_the_circle() {
        // v0 = (1, 0), v1 = (0, 1): θ = π/2, v = (cos(tπ/2), sin(tπ/2)).
        let (s0, s1, d) = coefficients(1.0 / 3.0, 1.0, 1.0, 0.0);
        assert!((s0 / d - 3f64.sqrt() / 2.0).abs() < 1e-12 && (s1 / d - 0.5).abs() < 1e-12);
        // Colinear: linear.
        assert_eq!(coefficients(0.25, 1.0, 4.0, 2.0), (0.75, 0.25, 1.0));
    }

    #[test]
    fn rows_and_columns_take_their_own_angles() {
        // [[1, 0], [0, 1]] and [[0, 1], [0, 2]] at t = 1/2:
        // rows: row 0 orthogonal → (√½, √½); row 1 colinear → (0, 1.5).
        let v0 = [1.0f32, 0.0, 0.0, 1.0];
        let v1 = [0.0f32, 1.0, 0.0, 2.0];
        let h = std::f64::consts::FRAC_1_SQRT_2 as f32;
        let rows = per_vector(0.5, &[2, 2], &v0, &v1, false);
        assert!((rows[0] - h).abs() < 1e-6 && (rows[1] - h).abs() < 1e-6, "{rows:?}");
        assert!(rows[2].abs() < 1e-6 && (rows[3] - 1.5).abs() < 1e-6, "{rows:?}");
        // Columns: column 0 is (1, 0) vs (0, 0): the zero vector has cos 0 → θ = π/2 →
        // √½·(1, 0); column 1 is (0, 1) vs (1, 2): cos = 2/√5.
        let cols = per_vector(0.5, &[2, 2], &v0, &v1, true);
        assert!((cols[0] - h).abs() < 1e-6 && cols[2].abs() < 1e-6, "{cols:?}");
        let theta = (2.0 / 5f64.sqrt()).acos();
        let s = (0.5 * theta).sin() / theta.sin();
        assert!((f64::from(cols[1]) - s).abs() < 1e-6, "{cols:?}");
        assert!((f64::from(cols[3]) - 3.0 * s).abs() < 1e-6, "{cols:?}");
    }
}
