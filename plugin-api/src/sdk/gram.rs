//! [`gram_sums`]: the squared norms and pairwise dot products of a few vectors over one chunk,
//! as f64 sums in the lane order of [`super::sums`], for the statistics passes of SLERP, Model
//! Stock and the like.

use super::sums::{LaneSum, accumulate, gram_blocked, gram3_minus_fused};

/// Over one chunk, with d_i = v_i − `minus` in f32 (or v_i itself when `minus` is `None`):
/// ‖d_i‖² of every vector, then ⟨d_i, d_j⟩ of every pair i < j (row-major). Each is the f64
/// sum, in the lane order of [`super::sums`], of f64(d_i)·f64(d_j): the same bits as the host's
/// `sub`, then `reduce(REDUCE_SUM_SQUARES)` and `dot` on the chunk, without chunk-sized
/// temporaries; the inputs are only read, so they may be the host's lent views.
pub fn gram_sums(vectors: &[&[f32]], minus: Option<&[f32]>) -> Vec<f64> {
    let n = vectors.len();
    let len = vectors
        .iter()
        .map(|v| v.len())
        .chain(minus.map(<[f32]>::len))
        .min()
        .unwrap_or(0);
    let vectors: Vec<&[f32]> = vectors.iter().map(|v| &v[..len]).collect();
    let minus = minus.map(|m| &m[..len]);
    match (n, minus) {
        (2, None) => gram2(vectors[0], vectors[1]).to_vec(),
        (2, Some(m)) => gram2_minus(vectors[0], vectors[1], m).to_vec(),
        (3, Some(m)) => gram3_minus_fused(vectors[0], vectors[1], vectors[2], m).to_vec(),
        // Any other count: pair by pair, norms first, then the pairs i < j row by row.
        _ => (0..n)
            .map(|i| (i, i))
            .chain((0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))))
            .map(|(a, b)| pair_sum(vectors[a], vectors[b], minus))
            .collect(),
    }
}

/// One entry of the Gram matrix: Σ f64(a − m)·f64(b − m) (or of a and b themselves).
fn pair_sum(a: &[f32], b: &[f32], minus: Option<&[f32]>) -> f64 {
    match minus {
        None => super::sums::dot(a, b),
        Some(m) => dot_minus(a, b, m),
    }
}

crate::avx2_dispatch! {
    /// Σ f64(a − m)·f64(b − m), the differences in f32.
    fn dot_minus(a: &[f32], b: &[f32], m: &[f32]) -> f64 {
        let mut s = [LaneSum::default()];
        accumulate(&mut s, 0, [a, b, m], |[a, b, m]| [f64::from(a - m) * f64::from(b - m)]);
        s[0].total()
    }
}

crate::avx2_dispatch! {
    /// ‖a‖², ‖b‖², ⟨a, b⟩ side by side (SLERP, NuSLERP).
    fn gram2(a: &[f32], b: &[f32]) -> [f64; 3] {
        gram_blocked([a, b], None, [(0, 0), (1, 1), (0, 1)])
    }
}

crate::avx2_dispatch! {
    /// [`gram2`] of a − m and b − m.
    fn gram2_minus(a: &[f32], b: &[f32], m: &[f32]) -> [f64; 3] {
        gram_blocked([a, b], Some(m), [(0, 0), (1, 1), (0, 1)])
    }
}

#[cfg(test)]
mod tests {
    use super::gram_sums;
    use crate::sdk::sums;

    #[test]
    fn the_sums_are_the_hosts_sums_bit_for_bit() {
        // The host's chain: d = v − minus in f32 (or v), then Σ f64(d)² and Σ f64(d_i)·f64(d_j) in
        // the lane order (the host's `reduce` and `dot` are these kernels), for 1 to 5 vectors
        // (the side-by-side and the pair-by-pair paths), with and without `minus`, over lengths
        // that end mid-group.
        let value = |seed: usize, k: usize| ((k * 7919 + seed * 104_729) % 2003) as f32 * 1e-3 - 1.0;
        for n in 1..=5 {
            for len in [0, 1, 7, 9, 1023, 1024, 3000] {
                let base: Vec<f32> = (0..len).map(|k| value(0, k)).collect();
                let vs: Vec<Vec<f32>> = (1..=n).map(|i| (0..len).map(|k| value(i, k) * 0.5).collect()).collect();
                for minus in [None, Some(base.as_slice())] {
                    let ds: Vec<Vec<f32>> = vs
                        .iter()
                        .map(|v| match minus {
                            Some(b) => v.iter().zip(b).map(|(x, y)| x - y).collect(),
                            None => v.clone(),
                        })
                        .collect();
                    let mut want: Vec<f64> = ds.iter().map(|d| sums::sum_squares(d)).collect();
                    for i in 0..n {
                        for j in i + 1..n {
                            want.push(sums::dot(&ds[i], &ds[j]));
                        }
                    }
                    let refs: Vec<&[f32]> = vs.iter().map(Vec::as_slice).collect();
                    let got = gram_sums(&refs, minus);
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{n} vectors, {len} elements, minus {}",
                        minus.is_some()
                    );
                }
            }
        }
        // A golden value by hand: (1, 2) and (3, −1) → ‖·‖² 5 and 10, dot 1.
        assert_eq!(gram_sums(&[&[1.0, 2.0], &[3.0, -1.0]], None), vec![5.0, 10.0, 1.0]);
    }
}
