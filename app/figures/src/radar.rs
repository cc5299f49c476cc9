//! Radar chart geometry, shared by the PNG renderer and the GUI.

/// The direction of axis `i` of `n`: clockwise from the top, as a unit vector (x right, y up).
pub fn axis_direction(i: usize, n: usize) -> [f64; 2] {
    let angle = std::f64::consts::FRAC_PI_2 - std::f64::consts::TAU * i as f64 / n.max(1) as f64;
    [angle.cos(), angle.sin()]
}

/// The polygon of `values` (one per axis) with radius `value / max`, closed (first vertex
/// repeated at the end).
pub fn polygon(values: &[f64], max: f64) -> Vec<[f64; 2]> {
    let n = values.len();
    let mut out: Vec<[f64; 2]> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let r = if max > 0.0 { v.max(0.0) / max } else { 0.0 };
            let [dx, dy] = axis_direction(i, n);
            [r * dx, r * dy]
        })
        .collect();
    if let Some(first) = out.first().copied() {
        out.push(first);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: [f64; 2], b: [f64; 2]) -> bool {
        (a[0] - b[0]).abs() < 1e-12 && (a[1] - b[1]).abs() < 1e-12
    }

    #[test]
    fn four_axes_start_at_the_top_and_go_clockwise() {
        let p = polygon(&[1.0, 0.5, 1.0, 0.5], 1.0);
        let expected = [[0.0, 1.0], [0.5, 0.0], [0.0, -1.0], [-0.5, 0.0], [0.0, 1.0]];
        assert_eq!(p.len(), 5);
        for (a, b) in p.iter().zip(expected) {
            assert!(close(*a, b), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn radius_is_value_over_max_and_negative_values_sit_at_the_centre() {
        let p = polygon(&[0.8, -0.3, 0.4], 2.0);
        assert!(close(p[0], [0.0, 0.4]));
        assert!(close(p[1], [0.0, 0.0]));
        // Third of three axes: 240° clockwise from the top.
        let d = axis_direction(2, 3);
        assert!(close(p[2], [0.2 * d[0], 0.2 * d[1]]));
        assert!((d[0] + (3f64).sqrt() / 2.0).abs() < 1e-12 && (d[1] + 0.5).abs() < 1e-12);
    }
}
