//! Colour scales: viridis for sequential values, blue–white–red for signed ones.

use crate::model::ColorScale;

const VIRIDIS: [[u8; 3]; 9] = [
    [68, 1, 84],
    [71, 44, 122],
    [59, 81, 139],
    [44, 113, 142],
    [33, 144, 141],
    [39, 173, 129],
    [92, 200, 99],
    [170, 220, 50],
    [253, 231, 37],
];

const BLUE_WHITE_RED: [[u8; 3]; 5] = [
    [33, 102, 172],
    [103, 169, 207],
    [247, 247, 247],
    [239, 138, 98],
    [178, 24, 43],
];

fn interpolate(stops: &[[u8; 3]], t: f64) -> [u8; 3] {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let pos = t * (stops.len() - 1) as f64;
    let i = (pos.floor() as usize).min(stops.len() - 2);
    let f = pos - i as f64;
    let mut out = [0u8; 3];
    for (k, o) in out.iter_mut().enumerate() {
        let a = f64::from(stops[i][k]);
        let b = f64::from(stops[i + 1][k]);
        *o = (a + (b - a) * f).round() as u8;
    }
    out
}

/// The colour of `value` on `scale` over `[lo, hi]` (clamped).
pub fn color(scale: ColorScale, value: f64, lo: f64, hi: f64) -> [u8; 3] {
    let t = if hi > lo { (value - lo) / (hi - lo) } else { 0.5 };
    match scale {
        ColorScale::Sequential => interpolate(&VIRIDIS, t),
        ColorScale::Diverging => interpolate(&BLUE_WHITE_RED, t),
    }
}

/// Black or white, whichever reads better on `background`.
pub fn text_on(background: [u8; 3]) -> [u8; 3] {
    let [r, g, b] = background.map(f64::from);
    if 0.299 * r + 0.587 * g + 0.114 * b > 140.0 {
        [0, 0, 0]
    } else {
        [255, 255, 255]
    }
}

/// A qualitative palette for series (colour-blind friendly, Okabe–Ito order).
pub fn series_color(i: usize) -> [u8; 3] {
    const PALETTE: [[u8; 3]; 8] = [
        [0, 114, 178],
        [213, 94, 0],
        [0, 158, 115],
        [204, 121, 167],
        [230, 159, 0],
        [86, 180, 233],
        [120, 120, 120],
        [240, 228, 66],
    ];
    PALETTE[i % PALETTE.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_and_middle_of_the_scales() {
        assert_eq!(color(ColorScale::Sequential, 0.0, 0.0, 1.0), VIRIDIS[0]);
        assert_eq!(color(ColorScale::Sequential, 2.0, 0.0, 1.0), VIRIDIS[8]);
        assert_eq!(color(ColorScale::Diverging, 0.0, -1.0, 1.0), [247, 247, 247]);
        assert_eq!(color(ColorScale::Diverging, -1.0, -1.0, 1.0), BLUE_WHITE_RED[0]);
        // Halfway between two stops.
        assert_eq!(color(ColorScale::Sequential, 0.0625, 0.0, 1.0), [70, 23, 103]);
    }
}
