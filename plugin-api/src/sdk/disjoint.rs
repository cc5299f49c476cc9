//! The TIES combine step on f32 blocks, for fused kernels (TIES, DARE-TIES): given each
//! expert's weighted task-vector values u_t over a block, elect the sign per element, aggregate
//! the entries that agree with it, and write θ0 + λ·(aggregate) over the base. Every value is
//! computed with the f32 operations, in the order, of the host's `elect_sign`, zero-sign
//! `affine` + `sign`, `disjoint_merge` (or [`super::combine::weighted_disjoint_mean`]) and
//! `weighted_sum([θ0, τ_m], [1, λ])`, so a fused kernel gives the bits the host chain gives.

/// Elements per block: a block of every expert's values stays in the L1 cache.
pub const BLOCK: usize = 1024;

/// How the agreeing entries are aggregated.
#[derive(Clone, Debug, PartialEq)]
pub enum Aggregate {
    /// Σ of the agreeing entries (`DISJOINT_SUM`).
    Sum,
    /// Their plain mean, Σ / max(1, count) (`DISJOINT_MEAN`).
    Mean,
    /// Σ u_t / Σ w_t over the agreeing entries, a divisor of 0 counting as 1
    /// (`weighted_disjoint_mean`), with w_t as the f32 the host's `weighted_sum` multiplies by.
    WeightedMean(Vec<f32>),
    /// max |agreeing entry| · sign (`DISJOINT_MAX`).
    Max,
}

/// The settings of the combine step that are the same for every element.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Elect by the count of signs instead of the summed values.
    pub count: bool,
    /// Where the raw elected sign is 0 it becomes this (±1); `None` keeps 0.
    pub fill: Option<f32>,
    /// How the agreeing entries are aggregated.
    pub aggregate: Aggregate,
    /// λ as the f32 the host's `weighted_sum` multiplies by.
    pub lambda: f32,
}

/// The host's `sign`: −1, 0 or 1.
#[inline(always)]
pub fn sgn(x: f32) -> f32 {
    f32::from(u8::from(x > 0.0)) - f32::from(u8::from(x < 0.0))
}

/// Per-block working memory of [`merge_block`], made once per chunk.
pub struct Scratch {
    sign: [f32; BLOCK],
    acc: [f32; BLOCK],
    count: [f32; BLOCK],
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            sign: [0.0; BLOCK],
            acc: [0.0; BLOCK],
            count: [0.0; BLOCK],
        }
    }
}

crate::avx2_dispatch! {
    /// Writes θ0 + λ·(the disjoint aggregate of `u`) over `base`, one block (at most [`BLOCK`]
    /// elements). `u` holds expert t's weighted values of this block at `t * BLOCK ..`, in expert
    /// order (the order the host sums them in).
    pub fn merge_block(base: &mut [f32], u: &[f32], plan: &Plan, scratch: &mut Scratch) {
        let len = base.len();
        let sign = &mut scratch.sign[..len];
        let acc = &mut scratch.acc[..len];
        let count = &mut scratch.count[..len];

        // The elected sign: sign(Σ_t u_t) or sign(Σ_t sign(u_t)), summed in expert order.
        sign.fill(0.0);
        for u in u.chunks(BLOCK) {
            let u = &u[..len];
            if plan.count {
                sign.iter_mut().zip(u).for_each(|(s, v)| *s += sgn(*v));
            } else {
                sign.iter_mut().zip(u).for_each(|(s, v)| *s += *v);
            }
        }
        match plan.fill {
            // sign(raw + fill/2) in the host: ±1 stays, 0 becomes sign(fill).
            Some(fill) => sign.iter_mut().for_each(|s| {
                let raw = sgn(*s);
                *s = if raw == 0.0 { fill } else { raw };
            }),
            None => sign.iter_mut().for_each(|s| *s = sgn(*s)),
        }

        // The disjoint aggregation of the entries that agree with the sign (zeros never agree).
        acc.fill(0.0);
        count.fill(0.0);
        for (t, u) in u.chunks(BLOCK).enumerate() {
            let u = &u[..len];
            match &plan.aggregate {
                Aggregate::Sum => {
                    for ((a, v), s) in acc.iter_mut().zip(u).zip(&*sign) {
                        let agree = (*v > 0.0 && *s > 0.0) | (*v < 0.0 && *s < 0.0);
                        *a += if agree { *v } else { 0.0 };
                    }
                }
                Aggregate::Mean => {
                    for (((a, c), v), s) in acc.iter_mut().zip(count.iter_mut()).zip(u).zip(&*sign) {
                        let agree = (*v > 0.0 && *s > 0.0) | (*v < 0.0 && *s < 0.0);
                        *a += if agree { *v } else { 0.0 };
                        *c += f32::from(u8::from(agree));
                    }
                }
                Aggregate::WeightedMean(weights) => {
                    // The divisor Σ w_t·[agree], as the host's `weighted_sum` of the 0/1 masks.
                    let w = weights.get(t).copied().unwrap_or(0.0);
                    for (((a, c), v), s) in acc.iter_mut().zip(count.iter_mut()).zip(u).zip(&*sign) {
                        let agree = (*v > 0.0 && *s > 0.0) | (*v < 0.0 && *s < 0.0);
                        *a += if agree { *v } else { 0.0 };
                        *c += w * f32::from(u8::from(agree));
                    }
                }
                Aggregate::Max => {
                    // `count` holds the largest agreeing magnitude.
                    for ((m, v), s) in count.iter_mut().zip(u).zip(&*sign) {
                        let agree = (*v > 0.0 && *s > 0.0) | (*v < 0.0 && *s < 0.0);
                        let kept: f32 = if agree { *v } else { 0.0 };
                        *m = m.max(kept.abs());
                    }
                }
            }
        }
        match &plan.aggregate {
            Aggregate::Sum => {}
            Aggregate::Mean => acc.iter_mut().zip(&*count).for_each(|(a, c)| *a /= c.max(1.0)),
            Aggregate::WeightedMean(_) => acc.iter_mut().zip(&*count).for_each(|(a, d)| {
                let safe = *d + f32::from(u8::from(*d == 0.0));
                *a /= safe;
            }),
            Aggregate::Max => acc
                .iter_mut()
                .zip(count.iter().zip(&*sign))
                .for_each(|(a, (m, s))| *a = m * sgn(*s)),
        }

        // θ0 + λ·τ_m as the host's weighted_sum([θ0, τ_m], [1, λ]) computes it: 0 + 1·θ0 + λ·τ_m.
        let lambda = plan.lambda;
        for (b, m) in base.iter_mut().zip(&*acc) {
            *b = (0.0 + *b) + lambda * m;
        }
    }
}
