//! The figure kinds as plain data. Analyses produce them; [`crate::csv`] and [`crate::png`]
//! write them; the GUI draws them with egui_plot.

use serde::{Deserialize, Serialize};

/// A figure of one of the five kinds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Figure {
    /// Labelled points and ordered paths (PCA projections, trajectories).
    Scatter(Scatter),
    /// Values over a grid (landscapes) or a labelled matrix (cosine similarity).
    Heatmap(Heatmap),
    /// Curves against one x axis (λ lines, spectra, R(k)/I(k)).
    Lines(Lines),
    /// Per-axis values of several series on a polar chart (per-task normalised accuracy).
    Radar(Radar),
    /// Bars per category, grouped or stacked (heterogeneity, task weights, bound terms).
    Bars(Bars),
}

impl Figure {
    /// The figure's title.
    pub fn title(&self) -> &str {
        match self {
            Figure::Scatter(f) => &f.title,
            Figure::Heatmap(f) => &f.title,
            Figure::Lines(f) => &f.title,
            Figure::Radar(f) => &f.title,
            Figure::Bars(f) => &f.title,
        }
    }
}

/// One labelled point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Position.
    pub x: f64,
    /// Position.
    pub y: f64,
    /// Name shown beside the point.
    pub label: String,
    /// Group (colour): "base", "expert", "merge", or a trajectory's name.
    pub group: String,
    /// Extra lines shown on hover (metrics).
    pub info: Vec<String>,
}

/// An ordered sequence of positions drawn as arrows from one to the next.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Path {
    /// Name in the legend.
    pub label: String,
    /// Positions in order.
    pub points: Vec<[f64; 2]>,
}

/// Points and paths in a plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scatter {
    /// Title.
    pub title: String,
    /// Horizontal axis name.
    pub x_label: String,
    /// Vertical axis name.
    pub y_label: String,
    /// Points.
    pub points: Vec<Point>,
    /// Paths (trajectories), drawn under the points.
    pub paths: Vec<Path>,
}

impl Scatter {
    /// The colour groups in first-seen order: the points' groups, then the paths not named
    /// after one. A path shares the colour of the group of the same name (a trajectory's
    /// iterates and its arrows).
    pub fn groups(&self) -> Vec<&str> {
        let mut groups: Vec<&str> = Vec::new();
        for g in self
            .points
            .iter()
            .map(|p| p.group.as_str())
            .chain(self.paths.iter().map(|p| p.label.as_str()))
        {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        groups
    }
}

/// A heatmap axis: numeric grid coordinates or category names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Axis {
    /// Cell centres, increasing.
    Numeric(Vec<f64>),
    /// One name per cell.
    Categories(Vec<String>),
}

impl Axis {
    /// Number of cells along the axis.
    pub fn len(&self) -> usize {
        match self {
            Axis::Numeric(v) => v.len(),
            Axis::Categories(v) => v.len(),
        }
    }

    /// Whether the axis has no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name of cell `i` (its coordinate for numeric axes).
    pub fn name(&self, i: usize) -> String {
        match self {
            Axis::Numeric(v) => v.get(i).map(|x| format_number(*x)).unwrap_or_default(),
            Axis::Categories(v) => v.get(i).cloned().unwrap_or_default(),
        }
    }

    /// Cell `i`'s extent: halfway to its neighbours (unit cells around the index for
    /// categories).
    pub fn cell_span(&self, i: usize) -> (f64, f64) {
        match self {
            Axis::Categories(_) => (i as f64 - 0.5, i as f64 + 0.5),
            Axis::Numeric(v) => {
                let here = v[i];
                let lo = if i > 0 {
                    (v[i - 1] + here) / 2.0
                } else {
                    here - v.get(1).map_or(0.5, |n| (n - here) / 2.0)
                };
                let hi = if i + 1 < v.len() {
                    (v[i + 1] + here) / 2.0
                } else {
                    here + if i > 0 { (here - v[i - 1]) / 2.0 } else { 0.5 }
                };
                (lo, hi)
            }
        }
    }

    /// The coordinate of cell `i` (its index for categorical axes).
    pub fn coord(&self, i: usize) -> f64 {
        match self {
            Axis::Numeric(v) => v.get(i).copied().unwrap_or(f64::NAN),
            Axis::Categories(_) => i as f64,
        }
    }
}

/// Which colours a heatmap uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColorScale {
    /// Perceptually uniform, low = dark (viridis).
    Sequential,
    /// Blue–white–red, centred at zero (similarities).
    Diverging,
}

/// Whether lower or higher values are better (where the best point is marked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Better {
    /// Losses.
    Lower,
    /// Accuracies.
    Higher,
}

/// Values over a grid. `values[row][col]` lies at (`x` cell `col`, `y` cell `row`); NaN marks a
/// cell not computed (yet).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heatmap {
    /// Title.
    pub title: String,
    /// Horizontal axis name.
    pub x_label: String,
    /// Vertical axis name.
    pub y_label: String,
    /// Name of the value (colour bar).
    pub value_label: String,
    /// Horizontal cells.
    pub x: Axis,
    /// Vertical cells.
    pub y: Axis,
    /// Values, row-major (`y.len()` rows of `x.len()`).
    pub values: Vec<Vec<f64>>,
    /// Colours.
    pub scale: ColorScale,
    /// Mark the best cell, if the values have a direction.
    pub better: Option<Better>,
    /// Draw contour lines at this many levels (0: none; numeric axes only).
    pub contours: usize,
    /// Write each cell's value in it (small matrices).
    pub annotate: bool,
    /// Points and paths drawn on top, in the axes' coordinates.
    pub overlay: Vec<Path>,
    /// Labelled points drawn on top.
    pub marks: Vec<Point>,
}

impl Heatmap {
    /// The best computed cell `(row, col, value)`, by `better`.
    pub fn best(&self) -> Option<(usize, usize, f64)> {
        let better = self.better?;
        let mut best: Option<(usize, usize, f64)> = None;
        for (r, row) in self.values.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                if v.is_nan() {
                    continue;
                }
                let wins = match (best, better) {
                    (None, _) => true,
                    (Some((_, _, b)), Better::Higher) => v > b,
                    (Some((_, _, b)), Better::Lower) => v < b,
                };
                if wins {
                    best = Some((r, c, v));
                }
            }
        }
        best
    }

    /// The smallest and largest computed values (symmetric around 0 for diverging scales).
    pub fn range(&self) -> Option<(f64, f64)> {
        let (lo, hi) = finite_range(self.values.iter().flatten().copied())?;
        Some(match self.scale {
            ColorScale::Sequential => (lo, hi),
            ColorScale::Diverging => {
                let m = lo.abs().max(hi.abs()).max(f64::MIN_POSITIVE);
                (-m, m)
            }
        })
    }
}

/// Which vertical axis a series is read on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Side {
    /// The main axis.
    Left,
    /// The secondary axis (twin-axis plots such as R(k) and I(k)).
    Right,
}

/// One curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Name in the legend.
    pub label: String,
    /// Positions, in x order.
    pub points: Vec<[f64; 2]>,
    /// Axis the values are read on.
    pub side: Side,
    /// Dashed (reference curves: the base, the experts, "original" beside "centred").
    pub dashed: bool,
    /// Palette index of the colour (default: the series' position).
    pub color: Option<usize>,
    /// Half-width of an error bar at each point (standard errors), or empty for none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<f64>,
}

impl Series {
    /// A solid left-axis curve in the palette colour of its position, without error bars.
    pub fn new(label: impl Into<String>, points: Vec<[f64; 2]>) -> Series {
        Series {
            label: label.into(),
            points,
            side: Side::Left,
            dashed: false,
            color: None,
            errors: Vec::new(),
        }
    }

    /// The error bar's half-width at point `i` (0 when there is none).
    pub fn error(&self, i: usize) -> f64 {
        self.errors.get(i).copied().filter(|e| e.is_finite()).unwrap_or(0.0)
    }
}

/// Curves against one x axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lines {
    /// Title.
    pub title: String,
    /// Horizontal axis name.
    pub x_label: String,
    /// Main vertical axis name.
    pub y_label: String,
    /// Secondary vertical axis name (when some series are on the right).
    pub y2_label: Option<String>,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic main y axis.
    pub log_y: bool,
    /// Curves.
    pub series: Vec<Series>,
    /// Mark the best point of the first series, if values have a direction.
    pub better: Option<Better>,
    /// Short statements shown in the plot's corner (a fitted law, a prediction's verdict).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Lines {
    /// The best point `(x, y)` of the first series, by `better`.
    pub fn best(&self) -> Option<[f64; 2]> {
        let better = self.better?;
        let s = self.series.first()?;
        s.points
            .iter()
            .filter(|p| p[1].is_finite())
            .copied()
            .reduce(|a, b| match better {
                Better::Higher if b[1] > a[1] => b,
                Better::Lower if b[1] < a[1] => b,
                _ => a,
            })
    }
}

/// Per-axis values of several series on a polar chart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Radar {
    /// Title.
    pub title: String,
    /// Axis names, clockwise from the top.
    pub axes: Vec<String>,
    /// `(label, one value per axis)`.
    pub series: Vec<(String, Vec<f64>)>,
    /// The radius of the outer ring (1.0 = the experts' 100 %).
    pub max: f64,
    /// A labelled reference ring drawn dashed (the experts at 1.0).
    pub reference: Option<(String, f64)>,
}

/// Bars over named categories: one bar per series side by side, or the series stacked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bars {
    /// Title.
    pub title: String,
    /// Category axis name.
    pub x_label: String,
    /// Value axis name.
    pub y_label: String,
    /// Category names, left to right.
    pub categories: Vec<String>,
    /// `(label, one value per category)`; values may be negative (drawn below zero).
    pub series: Vec<(String, Vec<f64>)>,
    /// Stack the series (their sum is the bar's height) instead of grouping them.
    pub stacked: bool,
    /// Short statements shown under the title (warnings, totals).
    pub notes: Vec<String>,
}

impl Bars {
    /// The value range the bars span, zero included.
    pub fn range(&self) -> (f64, f64) {
        let n = self.categories.len();
        let extents: Vec<f64> = if self.stacked {
            (0..n)
                .flat_map(|c| {
                    let vals = self.series.iter().filter_map(move |(_, v)| v.get(c).copied());
                    let pos: f64 = vals.clone().filter(|v| *v > 0.0).sum();
                    let neg: f64 = vals.filter(|v| *v < 0.0).sum();
                    [pos, neg]
                })
                .collect()
        } else {
            self.series.iter().flat_map(|(_, v)| v.iter().copied()).collect()
        };
        let (lo, hi) = finite_range(extents.into_iter().chain([0.0])).unwrap_or((0.0, 1.0));
        if hi > lo { (lo, hi) } else { (lo, lo + 1.0) }
    }

    /// Each bar's extent `(series, category, x0, x1, y0, y1)` in axis units: category `c`
    /// spans `[c − 0.4, c + 0.4]`; grouped bars split it, stacked bars pile up from zero
    /// (positive values upward, negative downward).
    pub fn rects(&self) -> Vec<(usize, usize, f64, f64, f64, f64)> {
        let k = self.series.len().max(1) as f64;
        let mut out = Vec::new();
        for c in 0..self.categories.len() {
            let (mut up, mut down) = (0.0, 0.0);
            for (s, (_, values)) in self.series.iter().enumerate() {
                let Some(v) = values.get(c).copied().filter(|v| v.is_finite()) else {
                    continue;
                };
                let x = c as f64;
                if self.stacked {
                    let (y0, y1) = if v >= 0.0 {
                        up += v;
                        (up - v, up)
                    } else {
                        down += v;
                        (down, down - v)
                    };
                    out.push((s, c, x - 0.35, x + 0.35, y0, y1));
                } else {
                    let w = 0.8 / k;
                    let x0 = x - 0.4 + w * s as f64;
                    out.push((s, c, x0, x0 + w * 0.9, v.min(0.0), v.max(0.0)));
                }
            }
        }
        out
    }
}

/// The smallest and largest finite values (NaN and ±∞ skipped), if there are any.
pub fn finite_range(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo <= hi).then_some((lo, hi))
}

/// A number in at most four significant digits, without trailing zeros.
pub fn format_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if !(1e-3..1e5).contains(&a) {
        let s = format!("{x:.2e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
    let decimals = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(values: Vec<Vec<f64>>, better: Better) -> Heatmap {
        Heatmap {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            value_label: String::new(),
            x: Axis::Numeric(vec![0.0, 1.0]),
            y: Axis::Numeric(vec![0.0, 1.0]),
            values,
            scale: ColorScale::Sequential,
            better: Some(better),
            contours: 0,
            annotate: false,
            overlay: vec![],
            marks: vec![],
        }
    }

    #[test]
    fn best_cell_skips_cells_not_computed_and_follows_the_direction() {
        let h = grid(vec![vec![0.5, f64::NAN], vec![0.9, 0.2]], Better::Higher);
        assert_eq!(h.best(), Some((1, 0, 0.9)));
        let h = grid(vec![vec![0.5, f64::NAN], vec![0.9, 0.2]], Better::Lower);
        assert_eq!(h.best(), Some((1, 1, 0.2)));
        assert_eq!(h.range(), Some((0.2, 0.9)));
    }

    #[test]
    fn diverging_range_is_symmetric() {
        let mut h = grid(vec![vec![-0.2, 0.7], vec![0.1, 0.3]], Better::Higher);
        h.scale = ColorScale::Diverging;
        assert_eq!(h.range(), Some((-0.7, 0.7)));
    }

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(format_number(0.30000000000000004), "0.3");
        assert_eq!(format_number(12.3456), "12.35");
        assert_eq!(format_number(1234.6), "1235");
        assert_eq!(format_number(0.0125), "0.0125");
        assert_eq!(format_number(2.5e-5), "2.5e-5");
        assert_eq!(format_number(1e-5), "1e-5");
    }
}
