//! [`gram_sums`]: the squared norms and pairwise dot products of a few vectors over one chunk,
//! as sequential f64 sums, for the statistics passes of SLERP, Model Stock and the like.

/// Elements per block: the vectors' f64 values of a block stay in the L1/L2 caches.
const BLOCK: usize = 1024;

/// Over one chunk, with d_i = v_i − `minus` in f32 (or v_i itself when `minus` is `None`):
/// ‖d_i‖² of every vector, then ⟨d_i, d_j⟩ of every pair i < j (row-major). Each is the
/// sequential f64 sum, from −0 in element order, of f64(d_i)·f64(d_j): the same bits as the
/// host's `sub`, then `reduce(REDUCE_SUM_SQUARES)` and `dot` on the chunk. The sums' chains run
/// side by side (one chain alone waits on each addition), block by block, without chunk-sized
/// temporaries; the inputs are only read, so they may be the host's lent views.
pub fn gram_sums(vectors: &[&[f32]], minus: Option<&[f32]>) -> Vec<f64> {
    let n = vectors.len();
    let pairs: Vec<(usize, usize)> = (0..n)
        .map(|i| (i, i))
        .chain((0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))))
        .collect();
    let len = vectors
        .iter()
        .map(|v| v.len())
        .chain(minus.map(<[f32]>::len))
        .min()
        .unwrap_or(0);
    match pairs.len() {
        3 => sums_of::<3>(vectors, minus, &pairs, len),
        6 => sums_of::<6>(vectors, minus, &pairs, len),
        10 => sums_of::<10>(vectors, minus, &pairs, len),
        _ => {
            let mut sums = vec![-0.0; pairs.len()];
            let mut values = vec![0f64; n * BLOCK];
            for from in (0..len).step_by(BLOCK) {
                let m = BLOCK.min(len - from);
                widen(&mut values, vectors, minus, from, m);
                for (s, (a, b)) in sums.iter_mut().zip(&pairs) {
                    let (x, y) = (&values[a * BLOCK..a * BLOCK + m], &values[b * BLOCK..b * BLOCK + m]);
                    for (x, y) in x.iter().zip(y) {
                        *s += x * y;
                    }
                }
            }
            sums
        }
    }
}

/// [`gram_sums`] with its `S` sums held in registers, advanced together element by element.
fn sums_of<const S: usize>(
    vectors: &[&[f32]],
    minus: Option<&[f32]>,
    pairs: &[(usize, usize)],
    len: usize,
) -> Vec<f64> {
    let mut sums = [-0.0f64; S];
    let mut values = vec![0f64; vectors.len() * BLOCK];
    let pairs: [(usize, usize); S] = std::array::from_fn(|s| pairs[s]);
    for from in (0..len).step_by(BLOCK) {
        let m = BLOCK.min(len - from);
        widen(&mut values, vectors, minus, from, m);
        for j in 0..m {
            for (s, (a, b)) in sums.iter_mut().zip(&pairs) {
                *s += values[a * BLOCK + j] * values[b * BLOCK + j];
            }
        }
    }
    sums.to_vec()
}

/// f64(v_i − minus) (the f32 difference, widened exactly) or f64(v_i) of elements
/// `from..from + m` of every vector, at `i * BLOCK` in `values`.
fn widen(values: &mut [f64], vectors: &[&[f32]], minus: Option<&[f32]>, from: usize, m: usize) {
    for (v, d) in vectors.iter().zip(values.chunks_mut(BLOCK)) {
        let (v, d) = (&v[from..from + m], &mut d[..m]);
        match minus {
            Some(b) => {
                for ((d, x), y) in d.iter_mut().zip(v).zip(&b[from..from + m]) {
                    *d = f64::from(x - y);
                }
            }
            None => d.iter_mut().zip(v).for_each(|(d, x)| *d = f64::from(*x)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gram_sums;

    #[test]
    fn the_sums_are_the_hosts_sequential_sums_bit_for_bit() {
        // The host's chain: d = v − minus in f32 (or v), then Σ f64(d)² and Σ f64(d_i)·f64(d_j) as
        // iterator sums (from −0, in element order), for 1 to 5 vectors (the register and the
        // general paths), with and without `minus`, over lengths that end mid-block.
        let value = |seed: usize, k: usize| ((k * 7919 + seed * 104_729) % 2003) as f32 * 1e-3 - 1.0;
        for n in 1..=5 {
            for len in [0, 1, 1023, 1024, 3000] {
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
                    let mut want: Vec<f64> = ds
                        .iter()
                        .map(|d| d.iter().map(|x| f64::from(*x)).map(|x| x * x).sum())
                        .collect();
                    for i in 0..n {
                        for j in i + 1..n {
                            want.push(
                                ds[i]
                                    .iter()
                                    .zip(&ds[j])
                                    .map(|(x, y)| f64::from(*x) * f64::from(*y))
                                    .sum(),
                            );
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
