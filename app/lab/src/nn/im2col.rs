//! 3×3, stride 1, padding 1 im2col and its adjoint col2im as candle custom ops with backward
//! passes, so a convolution is one gather plus one batched matmul in both directions. On the
//! CPU these are plain loops over the batch (in parallel); candle's own convolution backward
//! goes through a transposed convolution that is several times slower there.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

/// `[b, c, h, w]` → `[b, c·9, h·w]`: row `ci·9 + ky·3 + kx` holds the input shifted by
/// `(ky − 1, kx − 1)`, zero outside the image (the row order of a `[cout, c, 3, 3]` weight).
pub(super) struct Im2Col;

/// The adjoint of [`Im2Col`]: `[b, c·9, h·w]` → `[b, c, h, w]`, summing every column entry
/// back onto the pixel it was read from.
pub(super) struct Col2Im {
    c: usize,
    h: usize,
    w: usize,
}

fn f32_slice<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    match storage {
        CpuStorage::F32(v) if layout.is_contiguous() => {
            Ok(&v[layout.start_offset()..layout.start_offset() + layout.shape().elem_count()])
        }
        CpuStorage::F32(_) => candle_core::bail!("{op}: the input must be contiguous"),
        _ => candle_core::bail!("{op}: only f32 is supported"),
    }
}

/// For offset `k` (0..3) along an axis of length `n`, the output positions whose source
/// `pos + k − 1` is inside the image.
fn valid(k: usize, n: usize) -> std::ops::Range<usize> {
    let lo = usize::from(k == 0);
    let hi = if k == 2 { n - 1 } else { n };
    lo..hi
}

impl CustomOp1 for Im2Col {
    fn name(&self) -> &'static str {
        "im2col3x3"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, c, h, w) = layout.shape().dims4()?;
        let src = f32_slice(storage, layout, self.name())?;
        let plane = h * w;
        let mut out = vec![0f32; b * c * 9 * plane];
        out.par_chunks_mut(c * 9 * plane).enumerate().for_each(|(bi, dst)| {
            for ci in 0..c {
                let img = &src[(bi * c + ci) * plane..(bi * c + ci + 1) * plane];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let row = &mut dst[((ci * 9) + ky * 3 + kx) * plane..][..plane];
                        for y in valid(ky, h) {
                            let sy = y + ky - 1;
                            let xs = valid(kx, w);
                            let (s0, s1) = (sy * w + xs.start + kx - 1, sy * w + xs.end + kx - 1);
                            row[y * w + xs.start..y * w + xs.end].copy_from_slice(&img[s0..s1]);
                        }
                    }
                }
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((b, c * 9, plane))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (_, c, h, w) = arg.dims4()?;
        Ok(Some(grad_res.contiguous()?.apply_op1(Col2Im { c, h, w })?))
    }
}

impl CustomOp1 for Col2Im {
    fn name(&self) -> &'static str {
        "col2im3x3"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, rows, plane) = layout.shape().dims3()?;
        let (c, h, w) = (self.c, self.h, self.w);
        if rows != c * 9 || plane != h * w {
            candle_core::bail!(
                "col2im3x3: input {:?} does not match c={c}, h={h}, w={w}",
                layout.shape()
            );
        }
        let src = f32_slice(storage, layout, self.name())?;
        let mut out = vec![0f32; b * c * plane];
        out.par_chunks_mut(c * plane).enumerate().for_each(|(bi, dst)| {
            for ci in 0..c {
                let img = &mut dst[ci * plane..(ci + 1) * plane];
                for ky in 0..3 {
                    for kx in 0..3 {
                        let row = &src[((bi * c + ci) * 9 + ky * 3 + kx) * plane..][..plane];
                        for y in valid(ky, h) {
                            let sy = y + ky - 1;
                            let xs = valid(kx, w);
                            let target = &mut img[sy * w + xs.start + kx - 1..sy * w + xs.end + kx - 1];
                            for (t, s) in target.iter_mut().zip(&row[y * w + xs.start..y * w + xs.end]) {
                                *t += s;
                            }
                        }
                    }
                }
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((b, c, h, w))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.contiguous()?.apply_op1(Im2Col)?))
    }
}
