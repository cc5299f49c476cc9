//! The masks the l1 statistics pass draws, kept as bits for the merge pass of the same tensor, so
//! that the merge does not draw them a second time. They are the same draws either way (the
//! host's generator is counter-based: element i's draw depends on the seed and i alone), so the
//! merged bits do not depend on whether a tensor's masks were kept.
//!
//! At most [`KEEP_MAX_BYTES`] of bits are kept at a time; a tensor that would not fit is drawn
//! again in its merge, as before. A host that merges each tensor right after its statistics
//! (ABI 1.5, `CAP_TENSOR_STATISTICS`) holds the masks of the tensors in flight only.

use std::collections::HashMap;
use std::sync::Arc;

/// The most bytes of kept mask bits, over all tensors.
pub(crate) const KEEP_MAX_BYTES: usize = 64 << 20;

/// One expert's 0/1 mask over the first `len` elements of a tensor, 64 to a word (element i in
/// bit i mod 64 of word i / 64).
#[derive(Debug, Default)]
pub(crate) struct MaskBits {
    words: Vec<u64>,
    len: usize,
}

impl MaskBits {
    /// An empty mask with room for `n` elements.
    pub(crate) fn with_capacity(n: usize) -> MaskBits {
        MaskBits {
            words: Vec::with_capacity(n.div_ceil(64)),
            len: 0,
        }
    }

    /// Elements so far.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends the host's 0/1 mask values (1.0 kept, 0.0 dropped).
    pub(crate) fn push(&mut self, mask: &[f32]) {
        let mut rest = mask;
        // Up to a word boundary one element at a time (only after a length that is not a
        // multiple of 64, which a tensor's last block alone has), then 64 at a time.
        while !self.len.is_multiple_of(64) {
            let Some((m, tail)) = rest.split_first() else {
                return;
            };
            if let Some(w) = self.words.last_mut() {
                *w |= u64::from(kept_bit(*m)) << (self.len % 64);
            }
            self.len += 1;
            rest = tail;
        }
        pack_words(rest, &mut self.words);
        self.len += rest.len();
    }

    /// Elements `from..from + out.len()` as the host's values, 1.0 (kept) or 0.0 (dropped).
    pub(crate) fn expand(&self, from: usize, out: &mut [f32]) {
        if from.is_multiple_of(64) {
            expand_words(&self.words[from / 64..], out);
            return;
        }
        for (k, o) in out.iter_mut().enumerate() {
            let i = from + k;
            *o = one_or_zero((self.words[i / 64] >> (i % 64)) as u32);
        }
    }
}

/// The bits of 1.0f32; 0.0 has none of them.
const ONE_BITS: u32 = 0x3F80_0000;

/// Whether a mask value (exactly 0.0 or 1.0) is 1.0, as a bit: bit 29 is set in 1.0 alone.
#[inline(always)]
fn kept_bit(m: f32) -> u32 {
    (m.to_bits() >> 29) & 1
}

/// 1.0 where the lowest bit of `bit` is set, else 0.0 (branch-free, so it vectorises).
#[inline(always)]
fn one_or_zero(bit: u32) -> f32 {
    f32::from_bits(0u32.wrapping_sub(bit & 1) & ONE_BITS)
}

mergescope_plugin_api::avx2_dispatch! {
    /// Appends the bits of mask values, 64 to a word, element j of a word in bit j (the last
    /// word partly filled when the values do not fill it). Each half word is made from 32
    /// values in 32-bit lanes, which vectorises.
    fn pack_words(values: &[f32], words: &mut Vec<u64>) {
        let half = |c: &[f32]| c.iter().enumerate().fold(0u32, |w, (j, m)| w | (kept_bit(*m) << j));
        for c in values.chunks(64) {
            let (lo, hi) = c.split_at(c.len().min(32));
            words.push(u64::from(half(lo)) | (u64::from(half(hi)) << 32));
        }
    }
}

mergescope_plugin_api::avx2_dispatch! {
    /// Mask values 1.0 or 0.0 from bits written by [`pack_words`], from element 0 of `words`.
    fn expand_words(words: &[u64], out: &mut [f32]) {
        for (o, w) in out.chunks_mut(64).zip(words) {
            let (lo, hi) = o.split_at_mut(o.len().min(32));
            for (half, bits) in [(lo, *w as u32), (hi, (*w >> 32) as u32)] {
                for (j, o) in half.iter_mut().enumerate() {
                    *o = one_or_zero(bits >> j);
                }
            }
        }
    }
}

/// The kept masks of one tensor: per expert index t, its bits.
#[derive(Debug, Default)]
pub(crate) struct TensorMasks {
    /// (t, the mask of expert t).
    pub(crate) experts: Vec<(usize, MaskBits)>,
}

impl TensorMasks {
    /// Expert t's mask, where it was kept.
    pub(crate) fn of(&self, t: usize) -> Option<&MaskBits> {
        self.experts.iter().find(|(e, _)| *e == t).map(|(_, m)| m)
    }
}

/// Bytes of bits for `experts` masks of `numel` elements.
pub(crate) fn bytes_for(numel: u64, experts: usize) -> usize {
    usize::try_from(numel.div_ceil(64) * 8)
        .unwrap_or(usize::MAX)
        .saturating_mul(experts)
}

/// The masks being drawn (statistics pass) and drawn (awaiting the merge), within the budget.
#[derive(Debug, Default)]
pub(crate) struct KeptMasks {
    /// Bytes reserved by the tensors below.
    bytes: usize,
    /// Tensors whose statistics are still coming in.
    filling: HashMap<String, TensorMasks>,
    /// Tensors whose masks are complete: the masks, the elements merged so far and the bytes
    /// they reserve.
    ready: HashMap<String, (Arc<TensorMasks>, u64, usize)>,
}

impl KeptMasks {
    /// The masks of tensor `name` so far, taken out to append a chunk's masks to them: at its
    /// first chunk new empty ones when `bytes` more fit the budget, `None` where they do not
    /// (then nothing is kept for it).
    pub(crate) fn take_filling(&mut self, name: &str, first_chunk: bool, bytes: usize) -> Option<TensorMasks> {
        if !first_chunk {
            return self.filling.remove(name);
        }
        if self.bytes.saturating_add(bytes) > KEEP_MAX_BYTES {
            return None;
        }
        self.bytes += bytes;
        Some(TensorMasks::default())
    }

    /// Puts a tensor's masks back after a chunk, or, once they cover all `numel` elements, makes
    /// them ready for its merge.
    pub(crate) fn put_filling(&mut self, name: &str, masks: TensorMasks, numel: u64, bytes: usize) {
        let complete = masks.experts.iter().all(|(_, m)| m.len() as u64 == numel);
        if complete {
            self.ready.insert(name.to_owned(), (Arc::new(masks), 0, bytes));
        } else {
            self.filling.insert(name.to_owned(), masks);
        }
    }

    /// Gives up keeping tensor `name`'s masks (its statistics failed part way): frees its bytes.
    pub(crate) fn drop_filling(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// The masks of tensor `name` for a merge call over `n` of its `numel` elements, where they
    /// were kept; they are let go once every element has been merged.
    pub(crate) fn for_merge(&mut self, name: &str, n: u64, numel: u64) -> Option<Arc<TensorMasks>> {
        let (masks, merged, bytes) = self.ready.get_mut(name)?;
        let masks = Arc::clone(masks);
        *merged += n;
        if *merged >= numel {
            let bytes = *bytes;
            self.ready.remove(name);
            self.bytes = self.bytes.saturating_sub(bytes);
        }
        Some(masks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(n: usize, salt: usize) -> Vec<f32> {
        (0..n).map(|i| f32::from(u8::from((i * 7 + salt) % 5 < 2))).collect()
    }

    #[test]
    fn bits_give_back_the_mask_at_any_cut_and_offset() {
        let whole = mask(1000, 3);
        for cuts in [vec![1000], vec![64, 936], vec![3, 61, 200, 736], vec![999, 1]] {
            let mut bits = MaskBits::with_capacity(1000);
            let mut at = 0;
            for c in cuts {
                bits.push(&whole[at..at + c]);
                at += c;
            }
            assert_eq!(bits.len(), 1000);
            for (from, len) in [(0, 1000), (64, 128), (5, 300), (960, 40), (999, 1)] {
                let mut out = vec![7.0; len];
                bits.expand(from, &mut out);
                assert_eq!(out, whole[from..from + len], "{from} {len}");
            }
        }
    }

    #[test]
    fn kept_masks_stay_within_the_budget_and_go_after_their_merge() {
        let mut kept = KeptMasks::default();
        let big = KEEP_MAX_BYTES / 2 + 1;
        let a = kept.take_filling("a", true, big).unwrap();
        // A second tensor of that size does not fit while the first is kept.
        assert!(kept.take_filling("b", true, big).is_none());
        let mut a = a;
        let mut bits = MaskBits::default();
        bits.push(&mask(100, 0));
        a.experts.push((2, bits));
        kept.put_filling("a", a, 100, big);
        let m = kept.for_merge("a", 60, 100).unwrap();
        assert!(m.of(2).is_some() && m.of(0).is_none());
        assert!(kept.take_filling("b", true, big).is_none());
        // The last elements merged free the bytes.
        assert!(kept.for_merge("a", 40, 100).is_some());
        assert!(kept.for_merge("a", 40, 100).is_none());
        assert!(kept.take_filling("b", true, big).is_some());
    }
}
