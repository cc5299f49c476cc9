//! The analysis views as figures ([`mergescope_figures::Figure`]): what the CLI renders to
//! PNG/CSV and the GUI draws, built here once from the analyses' numbers.

use super::landscape::{LandscapeGrid, Metric};
use super::spectrum::MatrixSpectra;
use super::{PointSet, Projection};
use mergescope_engine::error::{EngineError, Result};
use mergescope_figures::{
    Axis, Bars, Better, ColorScale, Figure, Heatmap, Lines, Path, Point, Radar, Scatter, Series, Side, format_number,
};
use mergescope_lab::evaluator::EvalReport;

/// How a point of a PCA view is drawn: its group (colour) by role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The pretrained model.
    Base,
    /// A fine-tuned expert.
    Expert,
    /// A merge result or any other checkpoint.
    Merge,
}

fn metric_lines(v: &serde_json::Value) -> Vec<String> {
    match v {
        serde_json::Value::Object(m) => m.iter().map(|(k, v)| format!("{k} = {}", metric_text(v))).collect(),
        _ => Vec::new(),
    }
}

/// Longest list of numbers a hover line shows in full.
const HOVER_LIST: usize = 8;
/// Longest other value a hover line shows before cutting it.
const HOVER_CHARS: usize = 60;

/// A metric's value as hover text: numbers formatted, short lists of numbers in full, longer
/// lists and tables by their size (a layer-wise method reports a weight per tensor), anything
/// else cut to a line.
fn metric_text(v: &serde_json::Value) -> String {
    if let Some(x) = v.as_f64() {
        return format_number(x);
    }
    if let Some(items) = v.as_array() {
        let numbers: Option<Vec<f64>> = items.iter().map(serde_json::Value::as_f64).collect();
        match (numbers, items.first().and_then(serde_json::Value::as_array)) {
            (Some(xs), _) if xs.len() <= HOVER_LIST => {
                let shown: Vec<String> = xs.iter().map(|x| format_number(*x)).collect();
                return format!("[{}]", shown.join(", "));
            }
            (Some(xs), _) => return format!("{} values", xs.len()),
            (None, Some(row)) => return format!("{}×{} table", items.len(), row.len()),
            (None, None) => {}
        }
    }
    let text = v.to_string();
    match text.char_indices().nth(HOVER_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Points (base, experts, merges) and trajectories on principal components `pcs` (0-based)
/// of the point set: labelled points for checkpoints, arrows through each trajectory's
/// iterates in order, explained variance on the axes.
pub fn pca_figure(
    points: &PointSet,
    roles: &[Role],
    trajectory_names: &[String],
    pcs: (usize, usize),
) -> Result<Figure> {
    let need = pcs.0.max(pcs.1) + 1;
    let proj: Projection = points.gram.pca(need)?;
    if proj.explained.len() < need {
        return Err(EngineError::Param(format!(
            "component {} asked, but {} points span only {} components",
            need,
            points.labels.len(),
            proj.explained.len()
        )));
    }
    let at = |i: usize| (proj.coords[i][pcs.0], proj.coords[i][pcs.1]);
    let mut scatter_points = Vec::new();
    let mut paths: Vec<Path> = trajectory_names
        .iter()
        .map(|n| Path {
            label: n.clone(),
            points: Vec::new(),
        })
        .collect();
    for i in 0..points.labels.len() {
        let (x, y) = at(i);
        match points.trajectory[i] {
            Some(t) => paths[t].points.push([x, y]),
            None => {
                let group = match roles.get(i) {
                    Some(Role::Base) => "base",
                    Some(Role::Expert) => "expert",
                    _ => "merge",
                };
                scatter_points.push(Point {
                    x,
                    y,
                    label: points.labels[i].clone(),
                    group: group.to_owned(),
                    info: metric_lines(&points.metrics[i]),
                });
            }
        }
    }
    // Iterates are points too (hover shows their metrics), grouped by trajectory.
    for (i, label) in points.labels.iter().enumerate() {
        if let Some(t) = points.trajectory[i] {
            let (x, y) = at(i);
            scatter_points.push(Point {
                x,
                y,
                label: String::new(),
                group: trajectory_names[t].clone(),
                info: std::iter::once(label.clone())
                    .chain(metric_lines(&points.metrics[i]))
                    .collect(),
            });
        }
    }
    let pct = |c: usize| format!("PC{} ({:.1}% of variance)", c + 1, 100.0 * proj.explained[c]);
    Ok(Figure::Scatter(Scatter {
        title: "Checkpoints and trajectories on their principal components".into(),
        x_label: pct(pcs.0),
        y_label: pct(pcs.1),
        points: scatter_points,
        paths,
    }))
}

/// The cosine-similarity matrix of the points (task vectors when the Gram was taken minus the
/// base), annotated.
pub fn cosine_figure(points: &PointSet, title: &str) -> Figure {
    let n = points.labels.len();
    let c = points.gram.cosines();
    Figure::Heatmap(Heatmap {
        title: title.to_owned(),
        x_label: String::new(),
        y_label: String::new(),
        value_label: "cosine".into(),
        x: Axis::Categories(points.labels.clone()),
        y: Axis::Categories(points.labels.clone()),
        values: (0..n).map(|i| c[i * n..(i + 1) * n].to_vec()).collect(),
        scale: ColorScale::Diverging,
        better: None,
        contours: 0,
        annotate: n <= 12,
        overlay: vec![],
        marks: vec![],
    })
}

/// Singular values of each task matrix (log scale), original solid and centred dashed.
pub fn spectrum_figure(s: &MatrixSpectra) -> Figure {
    let mut series = Vec::new();
    for (centred, svds) in [(false, &s.original), (true, &s.centered)] {
        for (i, (t, svd)) in s.tasks.iter().zip(svds).enumerate() {
            // Values below f32 round-off of the largest are numerically zero: not drawn.
            let floor = svd.sigma.first().copied().unwrap_or(0.0) * 1e-6;
            series.push(Series {
                label: if centred {
                    format!("{t} (centred, dashed)")
                } else {
                    t.clone()
                },
                points: svd
                    .sigma
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v > floor)
                    .map(|(j, v)| [(j + 1) as f64, *v])
                    .collect(),
                side: Side::Left,
                dashed: centred,
                color: Some(i),
                errors: Vec::new(),
            });
        }
    }
    Figure::Lines(Lines {
        title: format!(
            "Singular values of the task matrices of {} ({}×{})",
            s.tensor, s.shape.0, s.shape.1
        ),
        x_label: "index j".into(),
        y_label: "σ_j".into(),
        y2_label: None,
        log_x: false,
        log_y: true,
        series,
        better: None,
        notes: Vec::new(),
    })
}

/// CART's trade-off (seed 001 Figs. 2–3): reconstruction error R(k) on the left axis and
/// row-space interference I(k) on the right, centred solid and original dashed.
pub fn rank_curves_figure(s: &MatrixSpectra) -> Figure {
    let c = s.rank_curves();
    let pts = |v: &[f64]| c.ks.iter().zip(v).map(|(k, v)| [*k as f64, *v]).collect::<Vec<_>>();
    let series = vec![
        Series {
            label: "R(k) centred".into(),
            points: pts(&c.r_centered),
            side: Side::Left,
            dashed: false,
            color: None,
            errors: Vec::new(),
        },
        Series {
            label: "R(k) original".into(),
            points: pts(&c.r_original),
            side: Side::Left,
            dashed: true,
            color: None,
            errors: Vec::new(),
        },
        Series {
            label: "I(k) centred".into(),
            points: pts(&c.i_centered),
            side: Side::Right,
            dashed: false,
            color: None,
            errors: Vec::new(),
        },
        Series {
            label: "I(k) original".into(),
            points: pts(&c.i_original),
            side: Side::Right,
            dashed: true,
            color: None,
            errors: Vec::new(),
        },
    ];
    Figure::Lines(Lines {
        title: format!(
            "Reconstruction error and interference of {} ({}×{})",
            s.tensor, s.shape.0, s.shape.1
        ),
        x_label: "rank k".into(),
        y_label: "R(k) = Σ_t Σ_{j>k} σ²".into(),
        y2_label: Some("I(k)".into()),
        log_x: false,
        log_y: false,
        series,
        better: None,
        notes: Vec::new(),
    })
}

/// Per-task normalised accuracy of each evaluated model, with the experts' 100 % ring.
pub fn radar_figure(models: &[(String, EvalReport)]) -> Result<Figure> {
    let first = models
        .first()
        .ok_or_else(|| EngineError::Param("a radar chart needs at least one evaluated model".into()))?;
    let axes: Vec<String> = first.1.tasks.iter().map(|t| t.task.clone()).collect();
    // Normalised scores when every model has them (the demo benchmark's, or a suite's with one
    // expert per task); the raw headline metric otherwise.
    let normalised = models
        .iter()
        .all(|(_, r)| r.tasks.iter().all(|t| t.normalized.is_some()));
    let series = models
        .iter()
        .map(|(label, r)| {
            let values = axes
                .iter()
                .map(|a| {
                    r.task(a)
                        .and_then(|t| if normalised { t.normalized } else { Some(t.accuracy) })
                        .unwrap_or(f64::NAN)
                })
                .collect();
            (label.clone(), values)
        })
        .collect::<Vec<(String, Vec<f64>)>>();
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    let metric = first.1.tasks.first().map_or("accuracy", |t| t.metric.as_str());
    let (title, reference) = if normalised {
        (
            format!("Normalised {metric} per task ({metric} ÷ the task's expert)"),
            Some(("experts (100 %)".into(), 1.0)),
        )
    } else {
        (
            format!("{metric} per task (no expert references: give one expert per task to normalise)"),
            None,
        )
    };
    if axes.len() < 3 {
        // A polar chart of one or two axes is a line: grouped bars say the same legibly.
        return Ok(Figure::Bars(Bars {
            title,
            x_label: "task".into(),
            y_label: if normalised {
                format!("normalised {metric}")
            } else {
                metric.to_owned()
            },
            categories: axes,
            series,
            stacked: false,
            notes: vec!["fewer than three tasks: bars instead of a radar".into()],
        }));
    }
    Ok(Figure::Radar(Radar {
        title,
        axes,
        series,
        max: (max * 10.0).ceil() / 10.0,
        reference,
    }))
}

/// Labels of a landscape's axes and title.
pub struct LandscapeLabels {
    /// Title.
    pub title: String,
    /// Horizontal axis.
    pub x: String,
    /// Vertical axis.
    pub y: String,
}

/// A landscape grid as a heatmap of `metric` (preview values while it fills in), with
/// contours, the best cell, and `overlay` paths / `marks` drawn on top.
pub fn landscape_figure(
    grid: &LandscapeGrid,
    metric: &Metric,
    labels: &LandscapeLabels,
    overlay: Vec<Path>,
    marks: Vec<Point>,
) -> Figure {
    let complete = grid.done() == grid.cells.len();
    Figure::Heatmap(Heatmap {
        title: if complete {
            labels.title.clone()
        } else {
            format!("{} ({} of {} points)", labels.title, grid.done(), grid.cells.len())
        },
        x_label: labels.x.clone(),
        y_label: labels.y.clone(),
        value_label: metric.label(),
        x: Axis::Numeric(grid.xs.clone()),
        y: Axis::Numeric(grid.ys.clone()),
        values: if complete {
            grid.values(metric)
        } else {
            grid.preview(metric)
        },
        scale: ColorScale::Sequential,
        better: Some(if metric.lower_is_better() {
            Better::Lower
        } else {
            Better::Higher
        }),
        contours: if grid.xs.len() >= 4 && grid.ys.len() >= 4 { 6 } else { 0 },
        annotate: false,
        overlay,
        marks,
    })
}

/// Curves of `metric` along the x coordinates of a grid, one per row (`row_label(r)`), with
/// the best point of the first marked; `reference` adds dashed horizontal lines (the base,
/// the experts' mean).
pub fn line_figure(
    grid: &LandscapeGrid,
    metric: &Metric,
    title: &str,
    x_label: &str,
    row_label: &dyn Fn(usize) -> String,
    reference: &[(String, f64)],
) -> Figure {
    let values = grid.values(metric);
    let mut series: Vec<Series> = values
        .iter()
        .enumerate()
        .map(|(r, row)| Series {
            label: row_label(r),
            points: grid.xs.iter().zip(row).map(|(x, v)| [*x, *v]).collect(),
            side: Side::Left,
            dashed: false,
            color: None,
            errors: Vec::new(),
        })
        .collect();
    let (lo, hi) = (
        grid.xs.first().copied().unwrap_or(0.0),
        grid.xs.last().copied().unwrap_or(1.0),
    );
    for (label, v) in reference {
        series.push(Series {
            label: label.clone(),
            points: vec![[lo, *v], [hi, *v]],
            side: Side::Left,
            dashed: true,
            color: None,
            errors: Vec::new(),
        });
    }
    Figure::Lines(Lines {
        title: title.to_owned(),
        x_label: x_label.to_owned(),
        y_label: metric.label(),
        y2_label: None,
        log_x: false,
        log_y: false,
        series,
        better: Some(if metric.lower_is_better() {
            Better::Lower
        } else {
            Better::Higher
        }),
        notes: Vec::new(),
    })
}

/// Seed 004's oracle on the text benchmark
/// ([`mergescope_lab::text_bench::oracle`]): ||θ_TA − θ_MT|| against the learning rate on
/// log-log axes, one curve per epoch count; dashed, a slope-2 reference (at a third of the
/// first E ≥ 2 curve, beside it rather than on it) and the spacing of the run's floating-point numbers around θ_MT
/// (what the E = 1 gap, rounding only, is measured against); the fitted slopes as notes.
pub fn oracle_figure(report: &mergescope_lab::text_bench::OracleReport) -> Figure {
    let positive =
        |pts: Vec<[f64; 2]>| -> Vec<[f64; 2]> { pts.into_iter().filter(|p| p[1] > 0.0 && p[1].is_finite()).collect() };
    let at = |e: usize, value: &dyn Fn(&mergescope_lab::text_bench::oracle::OracleRow) -> f64| {
        positive(
            report
                .rows
                .iter()
                .filter(|r| r.epochs == e)
                .map(|r| [r.lr, value(r)])
                .collect(),
        )
    };
    let epochs = report.epoch_counts();
    let mut series: Vec<Series> = epochs
        .iter()
        .enumerate()
        .map(|(i, &e)| Series {
            color: Some(i),
            ..Series::new(format!("E = {e}"), at(e, &|r| r.gap))
        })
        .collect();
    if let Some(e) = epochs.iter().copied().find(|&e| e >= 2) {
        let points = at(e, &|r| r.gap);
        if let (Some(first), Some(last)) = (points.first(), points.last()) {
            let y = |x: f64| first[1] / 3.0 * (x / first[0]).powi(2);
            series.push(Series {
                dashed: true,
                color: Some(epochs.len()),
                ..Series::new(
                    "slope 2 (reference)".to_owned(),
                    vec![[first[0], y(first[0])], [last[0], y(last[0])]],
                )
            });
        }
    }
    if let Some(&first) = epochs.first() {
        series.push(Series {
            dashed: true,
            color: Some(epochs.len() + 1),
            ..Series::new(
                format!("||ulp(θ_MT)||, E = {first} ({} spacing)", report.precision.name()),
                at(first, &|r| r.ulp),
            )
        });
    }
    let slope = |s: Option<f64>| s.map_or("–".to_owned(), |s| format!("{s:.2}"));
    let notes = report
        .slopes()
        .iter()
        .map(|s| {
            if s.epochs == 1 {
                let worst = at(1, &|r| r.gap / r.ulp).iter().map(|p| p[1]).fold(0.0, f64::max);
                format!("E = 1: gap ≤ {worst:.2} × ||ulp(θ_MT)|| (rounding only)")
            } else {
                format!(
                    "E = {}: slope {} (gap), {} (gap / ||θ_MT − θ0||)",
                    s.epochs,
                    slope(s.absolute),
                    slope(s.relative)
                )
            }
        })
        .collect();
    Figure::Lines(Lines {
        title: format!(
            "Task arithmetic vs multi-task GD (seed 004): {} tasks, α = {}, {}",
            report.tasks.len(),
            format_number(report.alpha),
            report.precision.name()
        ),
        x_label: "learning rate η".to_owned(),
        y_label: "||θ_TA − θ_MT||".to_owned(),
        y2_label: None,
        log_x: true,
        log_y: true,
        series,
        better: None,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hover_lines_show_numbers_short_lists_and_the_size_of_large_ones() {
        let lines = metric_lines(&json!({
            "loss": 3.949_788_853_526_115_4,
            "vertices": [1, 2, 0],
            "lambda": [-0.112_257_029_624_983_55, 0.5],
            "lambda_per_tensor": vec![vec![0.1; 5]; 103],
            "history": vec![0.5; 40],
            "note": "x".repeat(100),
        }));
        assert_eq!(
            lines,
            [
                "history = 40 values".to_owned(),
                "lambda = [-0.1123, 0.5]".to_owned(),
                "lambda_per_tensor = 103×5 table".to_owned(),
                "loss = 3.95".to_owned(),
                format!("note = \"{}…", "x".repeat(59)),
                "vertices = [1, 2, 0]".to_owned(),
            ]
        );
        assert!(metric_lines(&json!(null)).is_empty());
    }
}
