//! The one order of mergescope's f64 sums over tensor elements: eight interleaved lanes.
//!
//! Element `i` of a sum (its index within the tensor or chunk summed) is added to lane `i mod 8`,
//! each lane in element order from −0; the total adds the lanes pairwise in a fixed tree,
//! `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`. The host's `reduce` and `dot`, the SDK's
//! [`gram_sums`](super::gram_sums) and the fused loops of plugins all add in this order, so a
//! fused loop gives the bits of the chain of
//! host operations it replaces. The order is fixed (not the hardware's): every build, SIMD width
//! and thread count gives the same bits. One sequential chain waits on every addition (four
//! cycles a term); eight lanes run as vector registers, so a sum goes at the speed the inputs
//! are read.

/// Lanes of every sum.
pub const LANES: usize = 8;

/// A running f64 sum in lane order: continue it over consecutive pieces of a tensor with
/// [`accumulate`] (the lane of an element is its index within the whole tensor), read it with
/// [`LaneSum::total`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaneSum {
    lanes: [f64; LANES],
}

impl Default for LaneSum {
    fn default() -> Self {
        LaneSum { lanes: [-0.0; LANES] }
    }
}

impl LaneSum {
    /// The sum: the lanes added pairwise in a fixed tree.
    pub fn total(&self) -> f64 {
        let l = &self.lanes;
        ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
    }
}

/// Elements a block of [`accumulate`] works on at a time: its terms (S × 2 KiB) stay in the L1
/// cache.
const BLOCK: usize = 256;

/// Adds the `S` terms `terms([x_0[j], …, x_{K−1}[j]])` of every element `j = 0..n` of the `K`
/// input slices to `sums` (n: the shortest input), element `j` going to lane `(at + j) mod 8`:
/// `at` is the index in the whole tensor of the first element, so a sum continued over pieces
/// gives the bits of one sum over all of them. Inline it into a loop compiled for the wide
/// vector units (`avx2_dispatch!`): the terms of a block are made in one loop and added lane by
/// lane in another, and both become vector operations.
#[inline(always)]
pub fn accumulate<const K: usize, const S: usize>(
    sums: &mut [LaneSum; S],
    at: usize,
    inputs: [&[f32]; K],
    terms: impl Fn([f32; K]) -> [f64; S],
) {
    let n = inputs.iter().map(|x| x.len()).min().unwrap_or(0);
    let mut acc: [[f64; LANES]; S] = std::array::from_fn(|s| sums[s].lanes);
    // One element at a time, into its lane (the ends of the range).
    let one = |acc: &mut [[f64; LANES]; S], j: usize| {
        let t = terms(std::array::from_fn(|k| inputs[k][j]));
        for (lanes, term) in acc.iter_mut().zip(t) {
            lanes[(at + j) % LANES] += term;
        }
    };
    let head = ((LANES - at % LANES) % LANES).min(n);
    for j in 0..head {
        one(&mut acc, j);
    }
    let mut t = [[0f64; BLOCK]; S];
    let mut j = head;
    while j + BLOCK <= n {
        let block: [&[f32]; K] = std::array::from_fn(|k| &inputs[k][j..j + BLOCK]);
        for i in 0..BLOCK {
            let x = terms(std::array::from_fn(|k| block[k][i]));
            for (t, x) in t.iter_mut().zip(x) {
                t[i] = x;
            }
        }
        // Lane l of a block starting on lane 0 takes its elements l, l + 8, … in order.
        for (lanes, t) in acc.iter_mut().zip(&t) {
            let mut a = *lanes;
            for group in t.chunks_exact(LANES) {
                for (a, x) in a.iter_mut().zip(group) {
                    *a += x;
                }
            }
            *lanes = a;
        }
        j += BLOCK;
    }
    for j in j..n {
        one(&mut acc, j);
    }
    for (sum, lanes) in sums.iter_mut().zip(acc) {
        sum.lanes = lanes;
    }
}

/// The Gram sums of `N` vectors over their common length: for every pair `(p, q)` of `pairs`,
/// Σ f64(v_p − m)·f64(v_q − m) (the differences in f32; v_p·v_q without `minus`), each in lane
/// order from element 0. Made block by block: the widened values of every vector once, then the
/// products of each pair added lane by lane, so that `N` vectors cost `N` conversions, not one
/// per pair (inline it into a loop compiled by `avx2_dispatch!`).
#[inline(always)]
pub(crate) fn gram_blocked<const N: usize, const S: usize>(
    vectors: [&[f32]; N],
    minus: Option<&[f32]>,
    pairs: [(usize, usize); S],
) -> [f64; S] {
    let n = vectors
        .iter()
        .map(|v| v.len())
        .chain(minus.map(<[f32]>::len))
        .min()
        .unwrap_or(0);
    let mut acc = [[-0.0f64; LANES]; S];
    let mut d = [[0f64; BLOCK]; N];
    let mut j = 0;
    while j < n {
        let len = BLOCK.min(n - j);
        for (d, v) in d.iter_mut().zip(vectors) {
            let v = &v[j..j + len];
            match minus {
                Some(m) => d
                    .iter_mut()
                    .zip(v)
                    .zip(&m[j..j + len])
                    .for_each(|((d, x), y)| *d = f64::from(x - y)),
                None => d.iter_mut().zip(v).for_each(|(d, x)| *d = f64::from(*x)),
            }
        }
        // Blocks start on lane 0 (they are multiples of 8 long), so element i of one is in lane
        // i mod 8.
        for (lanes, (p, q)) in acc.iter_mut().zip(pairs) {
            let mut a = *lanes;
            if len == BLOCK {
                for (x, y) in d[p].chunks_exact(LANES).zip(d[q].chunks_exact(LANES)) {
                    for (a, (x, y)) in a.iter_mut().zip(x.iter().zip(y)) {
                        *a += x * y;
                    }
                }
            } else {
                for (i, (x, y)) in d[p][..len].iter().zip(&d[q][..len]).enumerate() {
                    a[i % LANES] += x * y;
                }
            }
            *lanes = a;
        }
        j += len;
    }
    acc.map(|lanes| LaneSum { lanes }.total())
}

/// [`gram_blocked`] of three vectors less `m` with all six pairs ‖a‖², ‖b‖², ‖c‖², ⟨a,b⟩, ⟨a,c⟩,
/// ⟨b,c⟩ (Model Stock's three experts), in one loop: each group of 8 elements is loaded,
/// differenced and widened once and feeds all six lane sums, which stay in registers, where the
/// blocked form stores the widened blocks and reads them again for every pair. Every lane adds
/// the same terms in the same order, so the sums are the same bits.
pub(crate) fn gram3_minus_fused(a: &[f32], b: &[f32], c: &[f32], m: &[f32]) -> [f64; 6] {
    let mut acc = [[-0.0f64; LANES]; 6];
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        done = unsafe { gram3_minus_avx2(&mut acc, [a, b, c, m]) };
    }
    gram3_minus_scalar(&mut acc, [a, b, c, m], done);
    acc.map(|lanes| LaneSum { lanes }.total())
}

/// Elements `from..n` (n: the shortest input's length) of [`gram3_minus_fused`], one at a time,
/// element j into lane j mod 8: the whole range without AVX2, the last few elements with it.
fn gram3_minus_scalar(acc: &mut [[f64; LANES]; 6], [a, b, c, m]: [&[f32]; 4], from: usize) {
    let n = a.len().min(b.len()).min(c.len()).min(m.len());
    for j in from..n {
        let l = j % LANES;
        let (da, db, dc) = (f64::from(a[j] - m[j]), f64::from(b[j] - m[j]), f64::from(c[j] - m[j]));
        acc[0][l] += da * da;
        acc[1][l] += db * db;
        acc[2][l] += dc * dc;
        acc[3][l] += da * db;
        acc[4][l] += da * dc;
        acc[5][l] += db * dc;
    }
}

/// The whole groups of 8 of [`gram3_minus_fused`] (elements `0..n`, n the shortest input's
/// length rounded down to a multiple of 8, which it returns), added to `acc`: lanes 0–3 and 4–7
/// of each sum in one AVX register each, twelve in all. The f32 differences, exact widening,
/// products and sums round as the scalar code's do (no fused multiply-add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gram3_minus_avx2(acc: &mut [[f64; LANES]; 6], [a, b, c, m]: [&[f32]; 4]) -> usize {
    use std::arch::x86_64::{
        __m256d, _mm_loadu_ps, _mm_sub_ps, _mm256_add_pd, _mm256_cvtps_pd, _mm256_loadu_pd, _mm256_mul_pd,
        _mm256_storeu_pd,
    };
    let n = a.len().min(b.len()).min(c.len()).min(m.len());
    let full = n - n % LANES;
    // SAFETY (every load and store below): `acc` rows are 8 f64, read and written at lanes 0
    // and 4; the inputs are read at `j + 4h .. j + 4h + 4` ≤ `full` ≤ each one's length.
    let mut v: [__m256d; 12] = std::array::from_fn(|i| unsafe { _mm256_loadu_pd(acc[i / 2][4 * (i % 2)..].as_ptr()) });
    let mut j = 0;
    while j < full {
        for h in 0..2 {
            let o = j + 4 * h;
            let (da, db, dc) = unsafe {
                let w = _mm_loadu_ps(m.as_ptr().add(o));
                (
                    _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(a.as_ptr().add(o)), w)),
                    _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(b.as_ptr().add(o)), w)),
                    _mm256_cvtps_pd(_mm_sub_ps(_mm_loadu_ps(c.as_ptr().add(o)), w)),
                )
            };
            v[h] = _mm256_add_pd(v[h], _mm256_mul_pd(da, da));
            v[2 + h] = _mm256_add_pd(v[2 + h], _mm256_mul_pd(db, db));
            v[4 + h] = _mm256_add_pd(v[4 + h], _mm256_mul_pd(dc, dc));
            v[6 + h] = _mm256_add_pd(v[6 + h], _mm256_mul_pd(da, db));
            v[8 + h] = _mm256_add_pd(v[8 + h], _mm256_mul_pd(da, dc));
            v[10 + h] = _mm256_add_pd(v[10 + h], _mm256_mul_pd(db, dc));
        }
        j += LANES;
    }
    for (i, x) in v.iter().enumerate() {
        unsafe { _mm256_storeu_pd(acc[i / 2][4 * (i % 2)..].as_mut_ptr(), *x) };
    }
    full
}

crate::avx2_dispatch! {
    /// Σ f64(x).
    pub fn sum(v: &[f32]) -> f64 {
        let mut s = [LaneSum::default()];
        accumulate(&mut s, 0, [v], |[x]| [f64::from(x)]);
        s[0].total()
    }
}

crate::avx2_dispatch! {
    /// Σ f64(x)².
    pub fn sum_squares(v: &[f32]) -> f64 {
        let mut s = [LaneSum::default()];
        accumulate(&mut s, 0, [v], |[x]| {
            let x = f64::from(x);
            [x * x]
        });
        s[0].total()
    }
}

crate::avx2_dispatch! {
    /// Σ |f64(x)|.
    pub fn sum_abs(v: &[f32]) -> f64 {
        let mut s = [LaneSum::default()];
        accumulate(&mut s, 0, [v], |[x]| [f64::from(x).abs()]);
        s[0].total()
    }
}

crate::avx2_dispatch! {
    /// Σ f64(a)·f64(b) over the shorter length.
    pub fn dot(a: &[f32], b: &[f32]) -> f64 {
        let mut s = [LaneSum::default()];
        accumulate(&mut s, 0, [a, b], |[x, y]| [f64::from(x) * f64::from(y)]);
        s[0].total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_gram_of_three_is_the_blocked_one_bit_for_bit() {
        // Lengths around the 8-element groups and the blocked form's 256-element blocks, values
        // with mixed signs and magnitudes (so rounding differs between orders).
        let value = |seed: usize, k: usize| ((k * 7919 + seed * 104_729) % 4001) as f32 * 3.7e-4 - 0.7;
        for len in [0, 1, 7, 8, 9, 255, 256, 257, 1000, 4099] {
            let v: Vec<Vec<f32>> = (0..4)
                .map(|s| (0..len).map(|k| value(s, k) * (1 + s) as f32).collect())
                .collect();
            let fused = gram3_minus_fused(&v[0], &v[1], &v[2], &v[3]);
            let blocked = gram_blocked(
                [&v[0], &v[1], &v[2]],
                Some(&v[3]),
                [(0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)],
            );
            assert_eq!(fused.map(f64::to_bits), blocked.map(f64::to_bits), "{len} elements");
            // The element-by-element path (all of it on a CPU without AVX2): the same bits.
            let mut acc = [[-0.0f64; LANES]; 6];
            gram3_minus_scalar(&mut acc, [&v[0], &v[1], &v[2], &v[3]], 0);
            let scalar = acc.map(|lanes| LaneSum { lanes }.total());
            assert_eq!(
                scalar.map(f64::to_bits),
                blocked.map(f64::to_bits),
                "{len} elements, scalar"
            );
        }
        // By hand: a − m = (1, 2), b − m = (3, −1), c − m = (0, 2).
        let m = [1.0f32, 1.0];
        let g = gram3_minus_fused(&[2.0, 3.0], &[4.0, 0.0], &[1.0, 3.0], &m);
        assert_eq!(g, [5.0, 10.0, 4.0, 1.0, 4.0, -2.0]);
    }

    /// The definition, written out: lane i mod 8 in order from −0, then the tree.
    fn by_definition(terms: &[f64]) -> f64 {
        let mut l = [-0.0f64; LANES];
        for (i, t) in terms.iter().enumerate() {
            l[i % LANES] += t;
        }
        ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|k| ((k * 7919 + seed * 104_729) % 2003) as f32 * 1e-3 - 1.0)
            .collect()
    }

    #[test]
    fn the_kernels_follow_the_definition_bit_for_bit() {
        for n in [0, 1, 7, 8, 9, 1000, 4099] {
            let (a, b) = (values(n, 1), values(n, 2));
            let w: Vec<f64> = a.iter().map(|x| f64::from(*x)).collect();
            let bits = |x: f64| x.to_bits();
            assert_eq!(bits(sum(&a)), bits(by_definition(&w)), "sum, n = {n}");
            let sq: Vec<f64> = w.iter().map(|x| x * x).collect();
            assert_eq!(bits(sum_squares(&a)), bits(by_definition(&sq)), "squares, n = {n}");
            let ab: Vec<f64> = w.iter().map(|x| x.abs()).collect();
            assert_eq!(bits(sum_abs(&a)), bits(by_definition(&ab)), "abs, n = {n}");
            let d: Vec<f64> = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).collect();
            assert_eq!(bits(dot(&a, &b)), bits(by_definition(&d)), "dot, n = {n}");
        }
        // By hand: 1 + 2 + … + 10 = 55 (lanes 0 and 1 get two terms each), and the empty sum −0.
        let ten: Vec<f32> = (1..=10).map(|x| x as f32).collect();
        assert_eq!(sum(&ten), 55.0);
        assert_eq!(sum(&[]).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn a_sum_continued_over_pieces_is_the_sum_over_the_whole() {
        let v = values(10_007, 3);
        let whole = sum(&v);
        // Pieces of odd lengths, so that most start in the middle of a group of eight lanes.
        for piece in [1, 3, 8, 13, 1000] {
            let mut s = [LaneSum::default()];
            let mut at = 0;
            while at < v.len() {
                let n = piece.min(v.len() - at);
                accumulate(&mut s, at, [&v[at..at + n]], |[x]| [f64::from(x)]);
                at += n;
            }
            assert_eq!(s[0].total().to_bits(), whole.to_bits(), "pieces of {piece}");
        }
    }
}
