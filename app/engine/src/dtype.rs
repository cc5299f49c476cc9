//! Element types of safetensors files and conversion of raw bytes to and from f32.

use half::f16;
use serde::{Deserialize, Serialize};

/// A safetensors element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit float.
    F64,
    /// A non-float type (integers, bool, fp8): copied byte for byte, never merged.
    Other {
        /// Bytes per element.
        size: usize,
        /// Index into [`OTHER_NAMES`].
        code: u8,
    },
}

/// Names of the non-float dtypes mergescope copies through.
pub const OTHER_NAMES: [&str; 12] = [
    "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0",
];
const OTHER_SIZES: [usize; 12] = [8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1, 1];

impl DType {
    /// Parses the safetensors name (`"BF16"`).
    pub fn parse(name: &str) -> Option<DType> {
        match name {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            "F64" => Some(DType::F64),
            other => OTHER_NAMES.iter().position(|n| *n == other).map(|i| DType::Other {
                size: OTHER_SIZES[i],
                code: i as u8,
            }),
        }
    }

    /// The safetensors name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            DType::Other { code, .. } => OTHER_NAMES.get(code as usize).copied().unwrap_or("?"),
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 => 8,
            DType::Other { size, .. } => size,
        }
    }

    /// Whether mergescope merges tensors of this type (computing in f32).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::Other { .. })
    }
}

/// Output dtype a user can choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutDType {
    /// f32
    F32,
    /// f16
    F16,
    /// bf16
    Bf16,
}

impl OutDType {
    /// Parses `f32`, `f16`, `bf16` (any case).
    pub fn parse(s: &str) -> Option<OutDType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Some(OutDType::F32),
            "f16" | "float16" | "fp16" => Some(OutDType::F16),
            "bf16" | "bfloat16" => Some(OutDType::Bf16),
            _ => None,
        }
    }

    /// The matching storage dtype.
    pub fn dtype(self) -> DType {
        match self {
            OutDType::F32 => DType::F32,
            OutDType::F16 => DType::F16,
            OutDType::Bf16 => DType::BF16,
        }
    }
}

/// Decodes little-endian float bytes of `dtype` into a new vector (no zero-fill first).
pub fn decode_f32_vec(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    decode_f32_checked(dtype, bytes).0
}

/// Decodes little-endian float bytes of `dtype` into a new vector, and says `true` where it
/// found every value finite as it decoded: bf16 (the dtype of most checkpoints), checked block by
/// block while the words are in the L1 cache, so at no second pass over memory. `false` means
/// "not checked" (other dtypes), or a NaN or Inf among the values.
pub fn decode_f32_checked(dtype: DType, bytes: &[u8]) -> (Vec<f32>, bool) {
    let values: Vec<f32> = match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        // bf16 is the top half of an f32: widening is a shift (exact). Read as u16 words when the
        // bytes are aligned (they are, from the reader's buffers), so the loop vectorises.
        DType::BF16 => match bytemuck::try_cast_slice::<u8, u16>(&bytes[..bytes.len() & !1]) {
            Ok(words) => return widen_bf16_checked(words),
            Err(_) => bytes
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect(),
        },
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        DType::Other { size, .. } => vec![0.0; bytes.len() / size.max(1)],
    };
    (values, false)
}

/// The exponent bits of a bf16 word.
const BF16_EXPONENT: u16 = 0x7F80;

mergescope_plugin_api::avx2_dispatch! {
    /// bf16 words (little-endian) widened to f32 (a shift, exact), and whether every value is
    /// finite. Each block of 4096 words is checked right after it is widened, while it is in L1,
    /// on the words themselves: a bf16 value is NaN or infinite exactly when its eight exponent
    /// bits are all set, so the largest masked exponent of the block says it (two vector
    /// operations per sixteen words).
    fn widen_bf16_checked(words: &[u16]) -> (Vec<f32>, bool) {
        let mut out = Vec::with_capacity(words.len());
        let mut finite = true;
        for block in words.chunks(4096) {
            out.extend(block.iter().map(|w| f32::from_bits(u32::from(u16::from_le(*w)) << 16)));
            let top = block.iter().fold(0u16, |m, w| m.max(u16::from_le(*w) & BF16_EXPONENT));
            finite &= top != BF16_EXPONENT;
        }
        (out, finite)
    }
}

mergescope_plugin_api::avx2_dispatch! {
    /// f32 values written to `out` (two bytes each) as little-endian bf16 (round to nearest
    /// even): a loop over bytes by index, which the compiler vectorises at the dispatched width
    /// (an `extend` over a flat_map stays a separate, narrower function).
    fn narrow_bf16(values: &[f32], out: &mut [u8]) {
        for (o, v) in out.chunks_exact_mut(2).zip(values) {
            o.copy_from_slice(&bf16_bits(*v).to_le_bytes());
        }
    }
}

/// f32 to bf16 bits, rounding to nearest even (NaN stays NaN); branch-free so it vectorises.
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        0x7FC0 | ((b >> 16) as u16 & 0x8000)
    } else {
        rounded
    }
}

/// The largest finite magnitude a dtype stores, when it is below f32's.
pub(crate) fn largest_finite(dtype: DType) -> Option<f32> {
    match dtype {
        DType::F16 => Some(f16::MAX.to_f32()),
        // Values between bf16::MAX and f32::MAX round up to Inf.
        DType::BF16 => Some(half::bf16::MAX.to_f32()),
        _ => None,
    }
}

mergescope_plugin_api::avx2_dispatch! {
    /// Whether every |value| ≤ `max` (so none is NaN): one branch-free pass per block in the
    /// common case (the position is searched only on failure).
    pub(crate) fn all_within(values: &[f32], max: f32) -> bool {
        values
            .chunks(4096)
            .all(|c| c.iter().fold(true, |ok, v| ok & (v.abs() <= max)))
    }
}

/// [`encode_f32_into`], and whether every value is finite and within `dtype`'s range: each
/// block of 4096 values is checked right after it is encoded, while it is in L1, instead of in
/// passes of their own over the whole chunk before (the output's finiteness and range checks
/// were 5 % of a task-arithmetic merge's samples).
pub fn encode_f32_checked(dtype: DType, values: &[f32], out: &mut [u8]) -> bool {
    const BLOCK: usize = 4096;
    let max = largest_finite(dtype).unwrap_or(f32::MAX);
    let mut ok = true;
    for (v, o) in values.chunks(BLOCK).zip(out.chunks_mut(BLOCK * dtype.size())) {
        encode_f32_into(dtype, v, o);
        ok &= all_within(v, max);
    }
    ok
}

/// Encodes f32 values as little-endian bytes of `dtype` (round to nearest even) into `out`,
/// which it replaces.
pub fn encode_f32(dtype: DType, values: &[f32], out: &mut Vec<u8>) {
    out.clear();
    match dtype {
        // f32 bits are their little-endian bytes on a little-endian machine: one copy.
        DType::F32 | DType::Other { .. } if cfg!(target_endian = "little") => {
            out.extend_from_slice(bytemuck::cast_slice(values));
        }
        DType::F32 | DType::Other { .. } => {
            out.resize(values.len() * 4, 0);
            encode_f32_into(dtype, values, out);
        }
        _ => {
            out.resize(values.len() * dtype.size(), 0);
            encode_f32_into(dtype, values, out);
        }
    }
}

/// Encodes f32 values as little-endian bytes of `dtype` (round to nearest even) into `out`,
/// which holds exactly `values.len() × size` bytes (every one of them is written). Any other
/// length is a caller's bug: the values that fit are written.
pub fn encode_f32_into(dtype: DType, values: &[f32], out: &mut [u8]) {
    match dtype {
        DType::F32 | DType::Other { .. } => {
            for (o, v) in out.chunks_exact_mut(4).zip(values) {
                o.copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        DType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(values) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        DType::BF16 => narrow_bf16(values, out),
        DType::F64 => {
            for (o, v) in out.chunks_exact_mut(8).zip(values) {
                o.copy_from_slice(&f64::from(*v).to_bits().to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn a_bf16_decode_finds_nan_and_inf_in_any_block() {
        let n = 3 * 4096 + 5;
        let words = |special: Option<(usize, u16)>| -> Vec<u8> {
            (0..n)
                .flat_map(|i| {
                    // Finite values of every exponent, the largest finite (0x7F7F) among them.
                    let w = match special {
                        Some((at, w)) if at == i => w,
                        _ => [0x7F7F, 0xFF7F, 0x0001, 0x8000, 0x3F80][i % 5],
                    };
                    w.to_le_bytes()
                })
                .collect()
        };
        let (values, finite) = decode_f32_checked(DType::BF16, &words(None));
        assert!(finite);
        assert_eq!(values.len(), n);
        assert_eq!(values[0], bf16::MAX.to_f32());
        for at in [0, 4095, 4096, 3 * 4096 + 4] {
            for w in [0x7F80u16, 0xFF80, 0x7FC0, 0xFFC1] {
                let (values, finite) = decode_f32_checked(DType::BF16, &words(Some((at, w))));
                assert!(!finite, "{w:#x} at {at}");
                assert!(!values[at].is_finite());
            }
        }
    }

    #[test]
    fn a_checked_encode_is_the_encode_and_finds_nan_inf_and_overflow_in_any_block() {
        let n = 3 * 4096 + 5;
        // The largest value each dtype holds, its negative, a tiny and an ordinary value.
        let values = |dtype: DType, special: Option<(usize, f32)>| -> Vec<f32> {
            let top = largest_finite(dtype).unwrap_or(f32::MAX);
            (0..n)
                .map(|i| match special {
                    Some((at, x)) if at == i => x,
                    _ => [top, -top, 1e-30, 0.1, -3.5][i % 5],
                })
                .collect()
        };
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let v = values(dtype, None);
            let mut checked = vec![0u8; n * dtype.size()];
            let mut plain = vec![0u8; n * dtype.size()];
            assert!(encode_f32_checked(dtype, &v, &mut checked), "{dtype:?}");
            encode_f32_into(dtype, &v, &mut plain);
            assert_eq!(checked, plain, "{dtype:?}");
            let mut bad = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
            // Finite, but beyond what f16 (65504) and bf16 (≈3.39e38) hold.
            bad.extend(largest_finite(dtype).map(|top| top * 1.01));
            for at in [0, 4095, 4096, n - 1] {
                for x in &bad {
                    let v = values(dtype, Some((at, *x)));
                    assert!(!encode_f32_checked(dtype, &v, &mut checked), "{dtype:?}: {x} at {at}");
                    encode_f32_into(dtype, &v, &mut plain);
                    assert_eq!(checked, plain, "{dtype:?}: {x} at {at}");
                }
            }
        }
    }

    #[test]
    fn bf16_round_trip_and_rounding() {
        let vals = [1.0f32, -2.5, 0.1, 3.0e-3];
        let mut bytes = Vec::new();
        encode_f32(DType::BF16, &vals, &mut bytes);
        assert_eq!(bytes.len(), 8);
        let back = decode_f32_vec(DType::BF16, &bytes);
        assert_eq!(back[0], 1.0);
        assert_eq!(back[1], -2.5);
        // bf16 keeps 8 significant bits: 0.1 (0x3DCCCCCD) rounds to 0x3DCD, i.e. 0.10009765625.
        assert_eq!(back[2].to_bits(), 0x3DCD_0000);
        assert!((back[3] - 3.0e-3).abs() < 2e-5);
    }

    #[test]
    fn bf16_rounding_matches_the_half_crate() {
        // Round-to-nearest-even, ties, subnormals, infinities and NaN against `half`.
        let mut cases = vec![
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0, // a tie: rounds to even (1.0)
            1.0 + 3.0 / 256.0, // a tie: rounds to even (1.015625)
            3.4e38,
            -3.4e38,
            1e-40,
            f32::INFINITY,
            f32::MIN_POSITIVE,
        ];
        cases.extend((0..2000).map(|i| (i as f32 - 1000.0) * 0.012_345_67));
        for v in cases {
            assert_eq!(bf16_bits(v), bf16::from_f32(v).to_bits(), "{v}");
        }
        assert!(bf16::from_bits(bf16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn parse_names() {
        assert_eq!(DType::parse("BF16"), Some(DType::BF16));
        assert_eq!(DType::parse("I64").map(DType::size), Some(8));
        assert!(!DType::parse("BOOL").is_some_and(DType::is_float));
        assert_eq!(DType::parse("Q4"), None);
        assert_eq!(OutDType::parse("BF16"), Some(OutDType::Bf16));
    }
}
