//! The fused merge pass of TIES: one sweep over a chunk's inputs that takes the task vectors,
//! trims and weights them, elects the sign (with the zero-sign rule), aggregates the agreeing
//! entries and adds λ·τ_m to the base, block by block so that a block of every expert's
//! weighted trimmed values stays in the L1 cache. Plain loops over f32 slices, which the
//! compiler vectorises.
//!
//! Every value is computed with exactly the f32 operations, in exactly the order, of the chain of
//! host operations it replaces (`sub`, `trim_abs`, `scale` = `affine(w, 0)`, `elect_sign`, the
//! zero-sign `affine` + `sign`, `disjoint_merge` or the SDK's `weighted_disjoint_mean`, and the
//! final `weighted_sum([θ0, τ_m], [1, λ])`), so the merged bits are the same as before.

pub(crate) use mergescope_plugin_api::sdk::disjoint::{Aggregate, Plan};
use mergescope_plugin_api::sdk::disjoint::{BLOCK, Scratch, merge_block};

/// One expert that keeps something: its values θ_t and how its task vector is trimmed and weighted.
pub(crate) struct Voter<'v> {
    /// θ_t over the chunk.
    pub values: &'v [f32],
    /// Entries with |τ| below this are zeroed (`trim_abs`); 0 keeps every entry.
    pub threshold: f32,
    /// w_t as the f32 the host's `scale` multiplies by; `None` for w_t = 1 (no multiplication).
    pub weight: Option<f32>,
}

mergescope_plugin_api::avx2_dispatch! {
    /// θ0 + λ·τ_m over `base` (the chunk), written over `base` (every voter's values at least as
    /// long).
    pub(crate) fn merge(base: &mut [f32], voters: &[Voter<'_>], plan: &Plan) {
        let n_voters = voters.len();
        // Per voter, its weighted trimmed values u_t of the current block.
        let mut u = vec![0f32; n_voters * BLOCK];
        let mut scratch = Scratch::default();
        for (bi, base) in base.chunks_mut(BLOCK).enumerate() {
            let from = bi * BLOCK;
            let len = base.len();

            // u_t = w_t·trim(θ_t − θ0), the host's `sub`, `trim_abs` and `affine(w, 0)`.
            for (v, u) in voters.iter().zip(u.chunks_mut(BLOCK)) {
                let (u, e) = (&mut u[..len], &v.values[from..from + len]);
                let thr = v.threshold;
                match v.weight {
                    None => {
                        for ((u, e), b) in u.iter_mut().zip(e).zip(&*base) {
                            let tau = e - b;
                            *u = if tau.abs() >= thr { tau } else { 0.0 };
                        }
                    }
                    Some(w) => {
                        for ((u, e), b) in u.iter_mut().zip(e).zip(&*base) {
                            let tau = e - b;
                            let trimmed = if tau.abs() >= thr { tau } else { 0.0 };
                            *u = trimmed * w + 0.0;
                        }
                    }
                }
            }
            // The sign election, disjoint aggregation and θ0 + λ·τ_m: the SDK's one copy.
            merge_block(base, &u, plan, &mut scratch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_plugin_api::sdk::disjoint::sgn;
    use mergescope_plugin_api::sdk::testing::awkward_values as values;

    /// The chain of host operations the kernel replaces, written out op by op as the host's CPU
    /// paths compute them (each op a full pass with its own temporary).
    fn reference(base: &[f32], voters: &[Voter<'_>], plan: &Plan) -> Vec<f32> {
        let n = base.len();
        let us: Vec<Vec<f32>> = voters
            .iter()
            .map(|v| {
                let tau: Vec<f32> = v.values.iter().zip(base).map(|(e, b)| e - b).collect();
                let trimmed: Vec<f32> = tau
                    .iter()
                    .map(|x| if x.abs() >= v.threshold { *x } else { 0.0 })
                    .collect();
                match v.weight {
                    None => trimmed,
                    Some(w) => trimmed.iter().map(|x| x * w + 0.0).collect(),
                }
            })
            .collect();
        let mut total = vec![0f32; n];
        for u in &us {
            for (t, v) in total.iter_mut().zip(u) {
                *t += if plan.count { sgn(*v) } else { *v };
            }
        }
        let raw: Vec<f32> = total.iter().map(|t| sgn(*t)).collect();
        let sign: Vec<f32> = match plan.fill {
            None => raw,
            Some(fill) => raw.iter().map(|r| sgn(r * 1.0 + 0.5 * fill)).collect(),
        };
        let agree = |v: f32, s: f32| (v > 0.0 && s > 0.0) | (v < 0.0 && s < 0.0);
        let mut sum = vec![0f32; n];
        let mut count = vec![0f32; n];
        let mut max_abs = vec![0f32; n];
        for u in &us {
            for i in 0..n {
                let kept = if agree(u[i], sign[i]) { u[i] } else { 0.0 };
                sum[i] += kept;
                count[i] += f32::from(u8::from(agree(u[i], sign[i])));
                max_abs[i] = max_abs[i].max(kept.abs());
            }
        }
        let merged: Vec<f32> = match &plan.aggregate {
            Aggregate::Sum => sum,
            Aggregate::Mean => sum.iter().zip(&count).map(|(s, c)| s / c.max(1.0)).collect(),
            Aggregate::Max => max_abs.iter().zip(&sign).map(|(m, s)| m * sgn(*s)).collect(),
            Aggregate::WeightedMean(w) => {
                let mut divisor = vec![0f32; n];
                for (u, w) in us.iter().zip(w) {
                    for i in 0..n {
                        divisor[i] += w * f32::from(u8::from(sgn(u[i]) * sign[i] > 0.0));
                    }
                }
                (0..n)
                    .map(|i| {
                        let zero = f32::from(u8::from(divisor[i] == 0.0));
                        sum[i] / (divisor[i] + zero)
                    })
                    .collect()
            }
        };
        base.iter()
            .zip(&merged)
            .map(|(b, m)| {
                let mut o = 0f32;
                o += 1.0 * b;
                o += plan.lambda * m;
                o
            })
            .collect()
    }

    #[test]
    fn fused_kernel_equals_the_host_operations_bit_for_bit() {
        let n = 3 * BLOCK + 17;
        let base = values(n, 1);
        let experts: Vec<Vec<f32>> = (0..3)
            .map(|t| values(n, 10 + t).iter().zip(&base).map(|(d, b)| b + d).collect())
            .collect();
        let aggregates = [
            Aggregate::Sum,
            Aggregate::Mean,
            Aggregate::Max,
            Aggregate::WeightedMean(vec![0.5, 1.0, 2.0]),
        ];
        for count in [false, true] {
            for fill in [None, Some(1.0), Some(-1.0)] {
                for aggregate in &aggregates {
                    for weights in [[None, None, None], [Some(0.5), None, Some(2.0)]] {
                        let voters: Vec<Voter<'_>> = experts
                            .iter()
                            .zip(weights)
                            .zip([0.004f32, 0.0, 0.006])
                            .map(|((e, weight), threshold)| Voter {
                                values: e,
                                threshold,
                                weight,
                            })
                            .collect();
                        let plan = Plan {
                            count,
                            fill,
                            aggregate: aggregate.clone(),
                            lambda: 0.7,
                        };
                        let mut out = base.clone();
                        merge(&mut out, &voters, &plan);
                        let want = reference(&base, &voters, &plan);
                        let same = out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "count {count}, fill {fill:?}, {aggregate:?}, weights {weights:?}");
                    }
                }
            }
        }
    }
}
