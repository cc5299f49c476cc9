//! Contour lines of a grid by marching squares, for landscapes.

/// A line segment between two points.
pub type Segment = [[f64; 2]; 2];

/// Segments of the level set `value = level` of `values[row][col]` sampled at (`xs[col]`,
/// `ys[row]`), linearly interpolated along cell edges. Squares with a missing (NaN) corner
/// are skipped.
pub fn contour(xs: &[f64], ys: &[f64], values: &[Vec<f64>], level: f64) -> Vec<Segment> {
    let mut out = Vec::new();
    for r in 0..ys.len().saturating_sub(1) {
        for c in 0..xs.len().saturating_sub(1) {
            // Corners counter-clockwise from bottom-left.
            let corners = [
                (xs[c], ys[r], values[r][c]),
                (xs[c + 1], ys[r], values[r][c + 1]),
                (xs[c + 1], ys[r + 1], values[r + 1][c + 1]),
                (xs[c], ys[r + 1], values[r + 1][c]),
            ];
            if corners.iter().any(|k| k.2.is_nan()) {
                continue;
            }
            let mut crossings = Vec::with_capacity(4);
            for e in 0..4 {
                let (x0, y0, v0) = corners[e];
                let (x1, y1, v1) = corners[(e + 1) % 4];
                if (v0 < level) != (v1 < level) {
                    let t = (level - v0) / (v1 - v0);
                    crossings.push([x0 + t * (x1 - x0), y0 + t * (y1 - y0)]);
                }
            }
            // Two crossings: one segment; four (a saddle): pair them in edge order.
            for pair in crossings.chunks_exact(2) {
                out.push([pair[0], pair[1]]);
            }
        }
    }
    out
}

/// `n` levels evenly inside `(lo, hi)`, excluding the ends.
pub fn levels(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (1..=n).map(|i| lo + (hi - lo) * i as f64 / (n + 1) as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plane_has_straight_contours_where_the_level_interpolates() {
        // value = x on a 3×2 grid: the 0.5 level is the vertical line x = 0.5.
        let xs = [0.0, 1.0, 2.0];
        let ys = [0.0, 1.0];
        let values = vec![vec![0.0, 1.0, 2.0], vec![0.0, 1.0, 2.0]];
        let segs = contour(&xs, &ys, &values, 0.5);
        assert_eq!(segs.len(), 1);
        let [a, b] = segs[0];
        assert!((a[0] - 0.5).abs() < 1e-12 && (b[0] - 0.5).abs() < 1e-12);
        assert!((a[1] - b[1]).abs() == 1.0);
    }

    #[test]
    fn a_bowl_gives_a_closed_ring_and_missing_cells_are_skipped() {
        // value = x² + y² on [-1, 1]², level 0.5: every square crosses once → 4 segments.
        let g = [-1.0, 0.0, 1.0];
        let values: Vec<Vec<f64>> = g.iter().map(|y| g.iter().map(|x| x * x + y * y).collect()).collect();
        assert_eq!(contour(&g, &g, &values, 0.5).len(), 4);
        let mut holed = values.clone();
        holed[0][0] = f64::NAN;
        assert_eq!(contour(&g, &g, &holed, 0.5).len(), 3);
        assert_eq!(levels(0.0, 1.0, 3), vec![0.25, 0.5, 0.75]);
    }
}
