//! The fused loops of DARE: the sparsified task vectors m_t ⊙ (θ_t − θ0), the l1 norms of the
//! rescale, and the combine step (a weighted sum, or a TIES sign election with a disjoint sum or
//! mean) in one sweep, block by block so that a block of every expert's values stays in the L1
//! cache. Plain loops over f32 slices, which the compiler vectorises.
//!
//! Every value is computed with exactly the f32 operations, in exactly the order, of the chain of
//! host operations it replaces (`sub`, `mul` by the host's 0/1 mask, `scale` = `affine(r·w, 0)`,
//! `elect_sign`, `disjoint_merge` or the SDK's `weighted_disjoint_mean`, and `weighted_sum`), and
//! the l1 norms are the f64 sums the host's `reduce(REDUCE_SUM_ABS)` makes, in its lane order,
//! so the merged bits are the same as through the host operations.

use mergescope_plugin_api::sdk::disjoint::{Aggregate, BLOCK, Plan, Scratch, merge_block};
use mergescope_plugin_api::sdk::sums::{LaneSum, accumulate};

use crate::kept_masks::MaskBits;

mergescope_plugin_api::avx2_dispatch! {
    /// m_t ⊙ (θ_t − θ0) in place over `values` (θ_t in, the sparsified task vector out); `mask` is
    /// the host's 0/1 mask, `None` when nothing is dropped (then τ itself, not 1·τ).
    pub(crate) fn sparsify(values: &mut [f32], base: &[f32], mask: Option<&[f32]>) {
        match mask {
            Some(mask) => {
                for ((v, b), m) in values.iter_mut().zip(base).zip(mask) {
                    *v = m * (*v - b);
                }
            }
            None => values.iter_mut().zip(base).for_each(|(v, b)| *v -= b),
        }
    }
}

mergescope_plugin_api::avx2_dispatch! {
    /// For every expert t (θ_t in `values[t]`, its 0/1 mask in `masks[t]`): continues Σ_j |τ_j|
    /// in `full[t]` and Σ_j |m_j·τ_j| in `kept[t]`, τ = θ_t − θ0 in f32, in f64 in the SDK's lane
    /// order, the first element being element `at` of the tensor: exactly the host's
    /// `reduce(REDUCE_SUM_ABS)` over the whole tensor's τ and m ⊙ τ, however the tensor is cut
    /// into calls. The inputs are only read (they may be the host's lent storage).
    pub(crate) fn l1_norms(
        values: &[&[f32]],
        base: &[f32],
        masks: &[&[f32]],
        full: &mut [LaneSum],
        kept: &mut [LaneSum],
        at: usize,
    ) {
        // Both sums of an expert in one sweep (each in its own lanes, so the same bits as two).
        for (((v, m), f), k) in values.iter().zip(masks).zip(full).zip(kept) {
            let mut sums = [*f, *k];
            accumulate(&mut sums, at, [v, m, base], |[x, m, b]| {
                let d = x - b;
                [f64::from(d).abs(), f64::from(m * d).abs()]
            });
            [*f, *k] = sums;
        }
    }
}

/// An expert's 0/1 mask over a chunk.
#[derive(Clone, Copy)]
pub(crate) enum Mask<'v> {
    /// The host's values, one per element of the chunk.
    Values(&'v [f32]),
    /// The bits the statistics pass kept for the whole tensor; the chunk starts at this element.
    Bits(&'v MaskBits, usize),
}

/// One expert's sparsified task vector d_t = m_t ⊙ τ_t over the chunk and its factor r_t·w_t.
pub(crate) struct Term<'v> {
    /// d_t, or θ_t when `raw` (then d_t is made block by block, as [`sparsify`] makes it).
    pub values: &'v [f32],
    /// With `raw`: the 0/1 mask m_t (`None`: nothing dropped, d_t = τ_t).
    pub mask: Option<Mask<'v>>,
    /// `values` holds θ_t rather than d_t.
    pub raw: bool,
    /// combine = sum: the f32 coefficient λ·w_t·r_t (÷ Σ w) of the host's `weighted_sum`;
    /// ties: w_t·r_t as the f32 the host's `scale` multiplies by, `None` for exactly 1 (no
    /// multiplication).
    pub factor: Option<f32>,
}

/// How the terms are combined.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Combine {
    /// θ0 + Σ_t c_t·d_t (`Term::factor` holds c_t; `None` counts as 1).
    Sum,
    /// θ0 + λ·(the agreeing Σ u_t) with the mass-elected sign.
    TiesSum(f32),
    /// θ0 + λ·(their plain mean).
    TiesMean(f32),
    /// θ0 + λ·(Σ u_t / Σ w_t over the agreeing entries, a divisor of 0 counting as 1), with
    /// the f32 weights of the host's `weighted_sum`.
    TiesWeightedMean(f32, Vec<f32>),
}

/// Scratch blocks of the combine step: one d_t, one mask.
struct Blocks {
    d: Vec<f32>,
    mask: Vec<f32>,
}

/// d_t over `from..from + len` of the chunk: the term's values, or m_t ⊙ (θ_t − θ0) made into
/// the scratch block for a raw term (a kept mask expanded into the scratch mask block first).
fn term_block<'s>(term: &'s Term<'_>, base: &[f32], from: usize, scratch: &'s mut Blocks) -> &'s [f32] {
    let len = base.len();
    let v = &term.values[from..from + len];
    if !term.raw {
        return v;
    }
    let mask = match term.mask {
        None => None,
        Some(Mask::Values(m)) => Some(&m[from..from + len]),
        Some(Mask::Bits(bits, at)) => {
            let m = &mut scratch.mask[..len];
            bits.expand(at + from, m);
            Some(&*m)
        }
    };
    let buf = &mut scratch.d[..len];
    buf.copy_from_slice(v);
    sparsify(buf, base, mask);
    buf
}

mergescope_plugin_api::avx2_dispatch! {
    /// The merged chunk: θ0 (`base`, only read, so it may be the host's lent storage) combined
    /// with the terms (every term's values at least as long), made block by block into a new
    /// vector.
    pub(crate) fn combine(base: &[f32], terms: &[Term<'_>], how: &Combine) -> Vec<f32> {
        let mut out = Vec::with_capacity(base.len());
        let mut scratch = Blocks {
            d: vec![0f32; BLOCK],
            mask: vec![0f32; BLOCK],
        };
        if *how == Combine::Sum {
            // weighted_sum([θ0, d_1, …], [1, c_1, …]): 0 + 1·θ0 + c_1·d_1 + …, blocked.
            let mut acc = [0f32; BLOCK];
            for (bi, base) in base.chunks(BLOCK).enumerate() {
                let from = bi * BLOCK;
                let acc = &mut acc[..base.len()];
                acc.iter_mut().zip(base).for_each(|(o, b)| *o = 0.0 + b);
                for term in terms {
                    let c = term.factor.unwrap_or(1.0);
                    let d = term_block(term, base, from, &mut scratch);
                    acc.iter_mut().zip(d).for_each(|(o, d)| *o += c * d);
                }
                out.extend_from_slice(acc);
            }
            return out;
        }
        let n_terms = terms.len();
        let plan = Plan {
            count: false,
            fill: None,
            aggregate: match how {
                Combine::Sum | Combine::TiesSum(_) => Aggregate::Sum,
                Combine::TiesMean(_) => Aggregate::Mean,
                Combine::TiesWeightedMean(_, weights) => Aggregate::WeightedMean(weights.clone()),
            },
            lambda: match how {
                Combine::Sum => 1.0,
                Combine::TiesSum(l) | Combine::TiesMean(l) | Combine::TiesWeightedMean(l, _) => *l,
            },
        };
        let mut u = vec![0f32; n_terms * BLOCK];
        let mut blocks = Scratch::default();
        for (bi, base) in base.chunks(BLOCK).enumerate() {
            let from = bi * BLOCK;
            let len = base.len();
            // u_t = (w_t·r_t)·d_t (the host's `scale`), or d_t itself for a factor of exactly 1.
            for (term, u) in terms.iter().zip(u.chunks_mut(BLOCK)) {
                let d = term_block(term, base, from, &mut scratch);
                let u = &mut u[..len];
                match term.factor {
                    None => u.copy_from_slice(d),
                    Some(f) => u.iter_mut().zip(d).for_each(|(u, d)| *u = d * f + 0.0),
                }
            }
            // Mass election (a sign of 0 stays 0), the disjoint aggregation and θ0 + λ·combined
            // (the SDK's one copy, shared with TIES), over this block's copy of θ0.
            out.extend_from_slice(base);
            merge_block(&mut out[from..], &u, &plan, &mut blocks);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_plugin_api::sdk::sums;
    use mergescope_plugin_api::sdk::testing::awkward_values as values;

    fn sgn_host(x: f32) -> f32 {
        (i32::from(x > 0.0) - i32::from(x < 0.0)) as f32
    }

    /// The host operations the kernel replaces, one full pass and temporary each.
    fn reference(base: &[f32], terms: &[Term<'_>], how: &Combine) -> Vec<f32> {
        let n = base.len();
        if *how == Combine::Sum {
            let mut out = vec![0f32; n];
            for (o, b) in out.iter_mut().zip(base) {
                *o += 1.0 * b;
            }
            for t in terms {
                let c = t.factor.unwrap_or(1.0);
                out.iter_mut().zip(t.values).for_each(|(o, d)| *o += c * d);
            }
            return out;
        }
        let us: Vec<Vec<f32>> = terms
            .iter()
            .map(|t| match t.factor {
                None => t.values[..n].to_vec(),
                Some(f) => t.values[..n].iter().map(|d| d * f + 0.0).collect(),
            })
            .collect();
        let mut total = vec![0f32; n];
        for u in &us {
            total.iter_mut().zip(u).for_each(|(t, v)| *t += v);
        }
        let sign: Vec<f32> = total.iter().map(|t| sgn_host(*t)).collect();
        let agree = |v: f32, s: f32| (v > 0.0 && s > 0.0) | (v < 0.0 && s < 0.0);
        let mut sum = vec![0f32; n];
        let mut count = vec![0f32; n];
        for u in &us {
            for i in 0..n {
                sum[i] += if agree(u[i], sign[i]) { u[i] } else { 0.0 };
                count[i] += f32::from(u8::from(agree(u[i], sign[i])));
            }
        }
        let (lambda, merged): (f32, Vec<f32>) = match how {
            Combine::Sum => unreachable!(),
            Combine::TiesSum(l) => (*l, sum),
            Combine::TiesMean(l) => (*l, sum.iter().zip(&count).map(|(s, c)| s / c.max(1.0)).collect()),
            Combine::TiesWeightedMean(l, w) => {
                let mut divisor = vec![0f32; n];
                for (u, w) in us.iter().zip(w) {
                    for i in 0..n {
                        divisor[i] += w * f32::from(u8::from(sgn_host(u[i]) * sign[i] > 0.0));
                    }
                }
                let mean = (0..n)
                    .map(|i| sum[i] / (divisor[i] + f32::from(u8::from(divisor[i] == 0.0))))
                    .collect();
                (*l, mean)
            }
        };
        base.iter()
            .zip(&merged)
            .map(|(b, m)| {
                let mut o = 0f32;
                o += 1.0 * b;
                o += lambda * m;
                o
            })
            .collect()
    }

    #[test]
    fn fused_combine_equals_the_host_operations_bit_for_bit() {
        let n = 3 * BLOCK + 5;
        let base = values(n, 1);
        let masks: Vec<Vec<f32>> = (0..3)
            .map(|t| {
                values(n, 20 + t)
                    .iter()
                    .map(|v| f32::from(u8::from(*v > 0.0)))
                    .collect()
            })
            .collect();
        let thetas: Vec<Vec<f32>> = (0..3)
            .map(|t| values(n, 10 + t).iter().zip(&base).map(|(d, b)| b + d).collect())
            .collect();
        let deltas: Vec<Vec<f32>> = thetas
            .iter()
            .enumerate()
            .map(|(t, theta)| {
                let mut v = theta.clone();
                sparsify(&mut v, &base, (t != 1).then_some(&masks[t][..]));
                v
            })
            .collect();
        for how in [
            Combine::Sum,
            Combine::TiesSum(0.7),
            Combine::TiesMean(1.0),
            Combine::TiesWeightedMean(0.7, vec![0.5, 1.0, 2.0]),
        ] {
            for factors in [[None, None, None], [Some(1.25), None, Some(0.3)]] {
                let terms: Vec<Term<'_>> = deltas
                    .iter()
                    .zip(factors)
                    .map(|(values, factor)| Term {
                        values,
                        mask: None,
                        raw: false,
                        factor,
                    })
                    .collect();
                let out = combine(&base, &terms, &how);
                let want = reference(&base, &terms, &how);
                // The same from the raw θ_t and masks, made block by block.
                let raw: Vec<Term<'_>> = thetas
                    .iter()
                    .zip(factors)
                    .enumerate()
                    .map(|(t, (values, factor))| Term {
                        values,
                        mask: (t != 1).then_some(Mask::Values(&masks[t][..])),
                        raw: true,
                        factor,
                    })
                    .collect();
                let from_raw = combine(&base, &raw, &how);
                // And from the masks kept as bits, the chunk starting part way into them.
                let bits: Vec<MaskBits> = masks
                    .iter()
                    .map(|m| {
                        let mut b = MaskBits::default();
                        b.push(&vec![1.0; 64]);
                        b.push(m);
                        b
                    })
                    .collect();
                let kept: Vec<Term<'_>> = thetas
                    .iter()
                    .zip(factors)
                    .enumerate()
                    .map(|(t, (values, factor))| Term {
                        values,
                        mask: (t != 1).then_some(Mask::Bits(&bits[t], 64)),
                        raw: true,
                        factor,
                    })
                    .collect();
                let from_bits = combine(&base, &kept, &how);
                assert!(
                    from_bits.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "bits {how:?} {factors:?}"
                );
                assert!(
                    from_raw.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "raw {how:?} {factors:?}"
                );
                assert!(
                    out.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{how:?} {factors:?}"
                );
            }
        }
    }

    #[test]
    fn l1_sums_are_the_hosts_sums_in_any_grouping() {
        let n = 2 * BLOCK + 3;
        let base = values(n, 50);
        let thetas: Vec<Vec<f32>> = (0..6)
            .map(|t| values(n, 30 + t).iter().zip(&base).map(|(d, b)| b + d).collect())
            .collect();
        let masks: Vec<Vec<f32>> = (0..6)
            .map(|t| {
                values(n, 40 + t)
                    .iter()
                    .map(|v| f32::from(u8::from(*v > 0.0)))
                    .collect()
            })
            .collect();
        // The host: τ = θ − θ0, then its `reduce(REDUCE_SUM_ABS)` over τ and over m·τ.
        let taus: Vec<Vec<f32>> = thetas
            .iter()
            .map(|e| e.iter().zip(&base).map(|(e, b)| e - b).collect())
            .collect();
        let want_full: Vec<f64> = taus.iter().map(|t| sums::sum_abs(t)).collect();
        let want_kept: Vec<f64> = taus
            .iter()
            .zip(&masks)
            .map(|(t, m)| sums::sum_abs(&t.iter().zip(m).map(|(x, m)| m * x).collect::<Vec<f32>>()))
            .collect();
        // Here: in calls of uneven lengths (starting mid-group of the eight lanes), six experts
        // (a group of four and one of two).
        let (mut full, mut kept) = (vec![LaneSum::default(); 6], vec![LaneSum::default(); 6]);
        for r in [0..1000, 1000..1003, 1003..n] {
            let v: Vec<&[f32]> = thetas.iter().map(|v| &v[r.clone()]).collect();
            let m: Vec<&[f32]> = masks.iter().map(|v| &v[r.clone()]).collect();
            l1_norms(&v, &base[r.clone()], &m, &mut full, &mut kept, r.start);
        }
        let totals = |s: &[LaneSum]| s.iter().map(LaneSum::total).collect::<Vec<f64>>();
        assert_eq!(totals(&full), want_full);
        assert_eq!(totals(&kept), want_kept);
    }
}
