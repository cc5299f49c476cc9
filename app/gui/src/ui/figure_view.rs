//! Any [`Figure`] drawn interactively with egui_plot (zoom, drag, hover values): the same
//! data `mergescope analyze` renders to PNG.

use egui::{Color32, Stroke, Ui};
use egui_plot::{
    Arrows, AxisHints, Corner, HoverPosition, Legend, Line, LineStyle, Plot, PlotPoint, PlotPoints, Points, Polygon,
    Text,
};
use mergescope_figures::colormap::{color, series_color};
use mergescope_figures::contour::{contour, levels};
use mergescope_figures::radar::{axis_direction, polygon};
use mergescope_figures::{Axis, Figure, Heatmap, Lines, Radar, Scatter, Series, Side, finite_range, format_number};

fn c32(c: [u8; 3]) -> Color32 {
    Color32::from_rgb(c[0], c[1], c[2])
}

/// Draws `figure` filling the available width, `height` points tall.
pub fn figure_ui(ui: &mut Ui, id: &str, figure: &Figure, height: f32) {
    match figure {
        Figure::Scatter(f) => scatter(ui, id, f, height),
        Figure::Heatmap(f) => heatmap(ui, id, f, height),
        Figure::Lines(f) => lines(ui, id, f, height, false),
        Figure::Radar(f) => radar(ui, id, f, height),
        Figure::Bars(f) => super::bars_view::bars(ui, id, f, height),
    }
}

/// As [`figure_ui`], for small plots with many curves: line plots get a small legend in the
/// corner with the fewest points (other figures are drawn as [`figure_ui`] draws them).
pub fn figure_ui_compact(ui: &mut Ui, id: &str, figure: &Figure, height: f32) {
    match figure {
        Figure::Lines(f) => lines(ui, id, f, height, true),
        other => figure_ui(ui, id, other, height),
    }
}

/// The corner of the points' bounding box holding the fewest of them (a legend there hides
/// the least), preferring the top right.
fn emptiest_corner(points: &[[f64; 2]]) -> Corner {
    let (Some((x0, x1)), Some((y0, y1))) = (span(points.iter().map(|p| p[0])), span(points.iter().map(|p| p[1])))
    else {
        return Corner::RightTop;
    };
    let count = |corner: Corner| {
        let (left, top) = match corner {
            Corner::LeftTop => (true, true),
            Corner::RightTop => (false, true),
            Corner::LeftBottom => (true, false),
            Corner::RightBottom => (false, false),
        };
        points
            .iter()
            .filter(|p| {
                let fx = (p[0] - x0) / (x1 - x0);
                let fy = (p[1] - y0) / (y1 - y0);
                (if left { fx < 0.5 } else { fx > 0.5 }) && (if top { fy > 0.6 } else { fy < 0.4 })
            })
            .count()
    };
    [
        Corner::RightTop,
        Corner::LeftTop,
        Corner::RightBottom,
        Corner::LeftBottom,
    ]
    .into_iter()
    .min_by_key(|c| count(*c))
    .unwrap_or(Corner::RightTop)
}

fn position(pos: &HoverPosition<'_>) -> PlotPoint {
    match pos {
        HoverPosition::NearDataPoint { position, .. } | HoverPosition::Elsewhere { position } => *position,
    }
}

fn scatter(ui: &mut Ui, id: &str, f: &Scatter, height: f32) {
    let groups = f.groups();
    let colour = |g: &str| c32(series_color(groups.iter().position(|x| *x == g).unwrap_or(0)));
    let hover_points = f.points.clone();
    Plot::new(id)
        .height(height)
        .legend(Legend::default())
        .x_axis_label(f.x_label.clone())
        .y_axis_label(f.y_label.clone())
        .data_aspect(1.0)
        .label_formatter(move |pos| {
            let at = position(pos);
            let nearest = hover_points.iter().min_by(|a, b| {
                let d = |p: &mergescope_figures::Point| (p.x - at.x).powi(2) + (p.y - at.y).powi(2);
                d(a).total_cmp(&d(b))
            })?;
            let mut lines = vec![if nearest.label.is_empty() {
                nearest.group.clone()
            } else {
                nearest.label.clone()
            }];
            lines.extend(nearest.info.iter().cloned());
            Some(lines.join("\n"))
        })
        .show(ui, |plot| {
            for p in &f.paths {
                let origins: Vec<[f64; 2]> = p.points.windows(2).map(|w| w[0]).collect();
                let tips: Vec<[f64; 2]> = p.points.windows(2).map(|w| w[1]).collect();
                plot.arrows(
                    Arrows::new(p.label.clone(), origins, tips)
                        .color(colour(&p.label))
                        .tip_length(10.0),
                );
            }
            for g in &groups {
                let pts: Vec<[f64; 2]> = f.points.iter().filter(|p| p.group == *g).map(|p| [p.x, p.y]).collect();
                if !pts.is_empty() {
                    plot.points(
                        Points::new(g.to_string(), pts)
                            .color(colour(g))
                            .radius(5.0)
                            .filled(true),
                    );
                }
            }
            for p in f.points.iter().filter(|p| !p.label.is_empty()) {
                plot.text(
                    Text::new("", PlotPoint::new(p.x, p.y), format!("  {}", p.label)).anchor(egui::Align2::LEFT_BOTTOM),
                );
            }
        });
}

fn cell_at(axis: &Axis, x: f64) -> Option<usize> {
    (0..axis.len()).find(|&i| {
        let (lo, hi) = axis.cell_span(i);
        (lo..hi).contains(&x)
    })
}

fn axis_names(axis: &Axis) -> Option<Vec<String>> {
    match axis {
        Axis::Categories(v) => Some(v.clone()),
        Axis::Numeric(_) => None,
    }
}

fn heatmap(ui: &mut Ui, id: &str, f: &Heatmap, height: f32) {
    let (lo, hi) = f.range().unwrap_or((0.0, 1.0));
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new(format!("{}: ", f.value_label)).weak());
        for k in 0..=4 {
            let v = lo + (hi - lo) * f64::from(k) / 4.0;
            let c = c32(color(f.scale, v, lo, hi));
            ui.label(egui::RichText::new("■").color(c));
            ui.label(egui::RichText::new(format_number(v)).small());
        }
        if let Some((r, c, v)) = f.best() {
            ui.separator();
            ui.label(format!(
                "best {} at ({}, {})",
                format_number(v),
                f.x.name(c),
                f.y.name(r)
            ));
        }
    });
    let (xn, yn) = (axis_names(&f.x), axis_names(&f.y));
    let hover = f.clone();
    let mut plot = Plot::new(id)
        .height(height)
        .x_axis_label(f.x_label.clone())
        .y_axis_label(f.y_label.clone())
        .show_grid(false)
        .label_formatter(move |pos| {
            let at = position(pos);
            let (c, r) = (cell_at(&hover.x, at.x)?, cell_at(&hover.y, at.y)?);
            let v = hover.values.get(r)?.get(c)?;
            Some(format!(
                "{} = {}\n{} = {}\n{} = {}",
                if hover.x_label.is_empty() { "x" } else { &hover.x_label },
                hover.x.name(c),
                if hover.y_label.is_empty() { "y" } else { &hover.y_label },
                hover.y.name(r),
                hover.value_label,
                if v.is_nan() {
                    "not computed yet".to_owned()
                } else {
                    format_number(*v)
                }
            ))
        });
    if let Some(names) = xn {
        plot = plot.x_axis_formatter(move |m, _| category(&names, m.value));
    }
    if let Some(names) = yn {
        plot = plot.y_axis_formatter(move |m, _| category(&names, m.value));
    }
    plot.show(ui, |plot| {
        for (r, row) in f.values.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                let (x0, x1) = f.x.cell_span(c);
                let (y0, y1) = f.y.cell_span(r);
                let fill = if v.is_nan() {
                    Color32::from_gray(225)
                } else {
                    c32(color(f.scale, *v, lo, hi))
                };
                plot.polygon(
                    Polygon::new("", PlotPoints::from(vec![[x0, y0], [x1, y0], [x1, y1], [x0, y1]]))
                        .fill_color(fill)
                        .stroke(Stroke::NONE)
                        .allow_hover(false),
                );
                if f.annotate && !v.is_nan() {
                    plot.text(Text::new(
                        "",
                        PlotPoint::new(f.x.coord(c), f.y.coord(r)),
                        format!("{v:.2}"),
                    ));
                }
            }
        }
        if f.contours > 0 {
            // The same level sets as the PNG (over cell indices on categorical axes).
            let xs: Vec<f64> = (0..f.x.len()).map(|i| f.x.coord(i)).collect();
            let ys: Vec<f64> = (0..f.y.len()).map(|i| f.y.coord(i)).collect();
            for level in levels(lo, hi, f.contours) {
                for [a, b] in contour(&xs, &ys, &f.values, level) {
                    plot.line(
                        Line::new("", vec![a, b])
                            .color(Color32::from_white_alpha(170))
                            .width(1.0)
                            .allow_hover(false),
                    );
                }
            }
        }
        for p in &f.overlay {
            let origins: Vec<[f64; 2]> = p.points.windows(2).map(|w| w[0]).collect();
            let tips: Vec<[f64; 2]> = p.points.windows(2).map(|w| w[1]).collect();
            plot.arrows(
                Arrows::new(p.label.clone(), origins, tips)
                    .color(Color32::WHITE)
                    .tip_length(8.0),
            );
        }
        for m in &f.marks {
            plot.points(
                Points::new(m.label.clone(), vec![[m.x, m.y]])
                    .radius(5.0)
                    .color(Color32::WHITE)
                    .filled(true),
            );
            plot.text(
                Text::new("", PlotPoint::new(m.x, m.y), format!("  {}", m.label)).anchor(egui::Align2::LEFT_BOTTOM),
            );
        }
        if let Some((r, c, _)) = f.best() {
            plot.points(
                Points::new("best", vec![[f.x.coord(c), f.y.coord(r)]])
                    .shape(egui_plot::MarkerShape::Cross)
                    .radius(8.0)
                    .color(Color32::RED),
            );
        }
    });
}

fn category(names: &[String], v: f64) -> String {
    let i = v.round();
    if (v - i).abs() < 1e-6 && i >= 0.0 {
        names.get(i as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// `[lo, hi]` of the finite values, widened to a unit span when flat.
fn span(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    finite_range(values).map(|(lo, hi)| (lo, if hi > lo { hi } else { lo + 1.0 }))
}

/// Draws `notes` as small lines; returns the height they took.
fn notes_ui(ui: &mut Ui, notes: &[String]) -> f32 {
    let top = ui.cursor().top();
    for note in notes {
        ui.small(note);
    }
    ui.cursor().top() - top
}

/// Vertical error bars with small caps (`cap`: half their width in plot units) at each point
/// of `s` that has one, and a marker at every point (a one-point curve shows too).
fn error_bars(
    plot: &mut egui_plot::PlotUi<'_>,
    s: &Series,
    name: &str,
    colour: Color32,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
    cap: f64,
) {
    let mut markers = Vec::new();
    for (i, p) in s.points.iter().enumerate() {
        if !p[1].is_finite() {
            continue;
        }
        let (px, e) = (x(p[0]), s.error(i));
        markers.push([px, y(p[1])]);
        let (lo, hi) = (y(p[1] - e), y(p[1] + e));
        if e <= 0.0 || !lo.is_finite() || !hi.is_finite() {
            continue;
        }
        let segment =
            |a: [f64; 2], b: [f64; 2]| Line::new(name, vec![a, b]).color(colour).width(1.2).allow_hover(false);
        plot.line(segment([px, lo], [px, hi]));
        for end in [lo, hi] {
            plot.line(segment([px - cap, end], [px + cap, end]));
        }
    }
    plot.points(Points::new(name, markers).color(colour).radius(3.0).filled(true));
}

fn lines(ui: &mut Ui, id: &str, f: &Lines, height: f32, compact: bool) {
    let (log_x, log_y) = (f.log_x, f.log_y);
    let tx = move |x: f64| if log_x { x.log10() } else { x };
    let ty = move |y: f64| if log_y { y.log10() } else { y };
    // Notes go above the plot, within the height asked for.
    let height = if f.notes.is_empty() {
        height
    } else {
        (height - notes_ui(ui, &f.notes)).max(120.0)
    };
    let x_span = span(f.series.iter().flat_map(|s| s.points.iter().map(|p| tx(p[0])))).unwrap_or((0.0, 1.0));
    let cap = 0.008 * (x_span.1 - x_span.0);
    let on = |side: Side| {
        f.series
            .iter()
            .filter(move |s| s.side == side)
            .flat_map(|s| s.points.iter().map(|p| p[1]))
    };
    // Right-axis series are drawn mapped linearly onto the left axis's range (as in the PNG);
    // the right axis and the hover labels show their own values.
    let left = span(on(Side::Left).map(ty)).unwrap_or((0.0, 1.0));
    let right = span(on(Side::Right));
    let to_left = move |r: f64| match right {
        Some((r0, r1)) => left.0 + (r - r0) / (r1 - r0) * (left.1 - left.0),
        None => r,
    };
    let from_left = move |y: f64| match right {
        Some((r0, r1)) => r0 + (y - left.0) / (left.1 - left.0) * (r1 - r0),
        None => y,
    };
    let mut axes = vec![
        AxisHints::new_y()
            .label(f.y_label.clone())
            .formatter(move |m, _| format_number(if log_y { 10f64.powf(m.value) } else { m.value })),
    ];
    if let (Some(label), Some(_)) = (&f.y2_label, right) {
        axes.push(
            AxisHints::new_y()
                .label(label.clone())
                .placement(egui_plot::HPlacement::Right)
                .formatter(move |m, _| format_number(from_left(m.value))),
        );
    }
    let right_names: Vec<String> = f
        .series
        .iter()
        .filter(|s| s.side == Side::Right)
        .map(|s| format!("{} (right axis)", s.label))
        .collect();
    let legend = if compact {
        let drawn: Vec<[f64; 2]> = f
            .series
            .iter()
            .flat_map(|s| {
                s.points
                    .iter()
                    .map(move |p| [tx(p[0]), if s.side == Side::Left { ty(p[1]) } else { to_left(p[1]) }])
            })
            .filter(|p| p[0].is_finite() && p[1].is_finite())
            .collect();
        Legend::default()
            .text_style(egui::TextStyle::Small)
            .position(emptiest_corner(&drawn))
    } else {
        Legend::default()
    };
    Plot::new(id)
        .height(height)
        .legend(legend)
        .x_axis_label(f.x_label.clone())
        .custom_y_axes(axes)
        .x_axis_formatter(move |m, _| format_number(if log_x { 10f64.powf(m.value) } else { m.value }))
        .label_formatter(move |pos| match pos {
            HoverPosition::NearDataPoint {
                plot_name, position, ..
            } if !plot_name.is_empty() => {
                let y = if right_names.iter().any(|n| n == plot_name) {
                    from_left(position.y)
                } else if log_y {
                    10f64.powf(position.y)
                } else {
                    position.y
                };
                let x = if log_x { 10f64.powf(position.x) } else { position.x };
                Some(format!("{plot_name}\n{} → {}", format_number(x), format_number(y)))
            }
            _ => None,
        })
        .show(ui, |plot| {
            for (i, s) in f.series.iter().enumerate() {
                let pts: Vec<[f64; 2]> = s
                    .points
                    .iter()
                    .filter(|p| p[1].is_finite())
                    .map(|p| [tx(p[0]), if s.side == Side::Left { ty(p[1]) } else { to_left(p[1]) }])
                    .collect();
                let label = if s.side == Side::Right {
                    format!("{} (right axis)", s.label)
                } else {
                    s.label.clone()
                };
                let mut line = Line::new(label, pts)
                    .color(c32(series_color(s.color.unwrap_or(i))))
                    .width(2.0);
                if s.dashed {
                    line = line.style(LineStyle::dashed_loose());
                }
                plot.line(line);
                if !s.errors.is_empty() {
                    let name = if s.side == Side::Right {
                        format!("{} (right axis)", s.label)
                    } else {
                        s.label.clone()
                    };
                    let y: &dyn Fn(f64) -> f64 = if s.side == Side::Left { &ty } else { &to_left };
                    let colour = c32(series_color(s.color.unwrap_or(i)));
                    error_bars(plot, s, &name, colour, &tx, y, cap);
                }
            }
            if let Some(b) = f.best() {
                plot.points(
                    Points::new("best", vec![[tx(b[0]), ty(b[1])]])
                        .shape(egui_plot::MarkerShape::Cross)
                        .radius(8.0)
                        .color(Color32::RED),
                );
            }
        });
}

fn radar(ui: &mut Ui, id: &str, f: &Radar, height: f32) {
    let n = f.axes.len();
    let hover = f.clone();
    Plot::new(id)
        .height(height)
        .legend(Legend::default())
        .data_aspect(1.0)
        .show_axes(false)
        .show_grid(false)
        .label_formatter(move |pos| {
            let at = position(pos);
            let mut best: Option<(f64, String)> = None;
            for (label, values) in &hover.series {
                for (i, p) in polygon(values, hover.max).iter().take(values.len()).enumerate() {
                    let d = (p[0] - at.x).powi(2) + (p[1] - at.y).powi(2);
                    if best.as_ref().is_none_or(|(b, _)| d < *b) {
                        best = Some((d, format!("{label}\n{}: {:.1} %", hover.axes[i], 100.0 * values[i])));
                    }
                }
            }
            best.filter(|(d, _)| *d < 0.01).map(|(_, t)| t)
        })
        .show(ui, |plot| {
            for ring in [0.25, 0.5, 0.75, 1.0] {
                plot.line(
                    Line::new("", polygon(&vec![ring; n], 1.0))
                        .color(Color32::from_gray(190))
                        .width(1.0),
                );
                plot.text(Text::new("", PlotPoint::new(0.0, ring), format_number(ring * f.max)).color(Color32::GRAY));
            }
            for (i, name) in f.axes.iter().enumerate() {
                let d = axis_direction(i, n);
                plot.line(
                    Line::new("", vec![[0.0, 0.0], d])
                        .color(Color32::from_gray(190))
                        .width(1.0),
                );
                plot.text(Text::new("", PlotPoint::new(d[0] * 1.12, d[1] * 1.12), name.clone()));
            }
            if let Some((label, r)) = &f.reference {
                plot.line(
                    Line::new(label.clone(), polygon(&vec![*r; n], f.max))
                        .color(Color32::BLACK)
                        .style(LineStyle::dashed_loose())
                        .width(2.0),
                );
            }
            for (i, (label, values)) in f.series.iter().enumerate() {
                plot.line(
                    Line::new(label.clone(), polygon(values, f.max))
                        .color(c32(series_color(i)))
                        .width(2.0),
                );
            }
        });
}
