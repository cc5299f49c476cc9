//! Figures rendered to PNG with plotters' bitmap backend: no window, GPU or system fonts, so
//! `mergescope analyze` makes the same pictures on a server as the GUI's export.

use crate::FigureError;
use crate::colormap::{color, series_color, text_on};
use crate::contour::{contour, levels};
use crate::model::{
    Axis, Bars, Figure, Heatmap, Lines, Path, Point, Radar, Scatter, Side, finite_range, format_number,
};
use crate::radar::{axis_direction, polygon};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::sync::Once;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a font that egui ships and parses; failure would only lose text.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT);
    });
}

fn rgb(c: [u8; 3]) -> RGBColor {
    RGBColor(c[0], c[1], c[2])
}

fn err<E: std::fmt::Debug>(e: E) -> FigureError {
    FigureError::Render(format!("{e:?}"))
}

/// Renders `figure` as a `width`×`height` PNG and returns the file's bytes.
pub fn render_png(figure: &Figure, width: u32, height: u32) -> Result<Vec<u8>, FigureError> {
    register_font();
    let (w, h) = (width.max(200), height.max(150));
    let mut pixels = vec![255u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        match figure {
            Figure::Scatter(f) => scatter(&root, f)?,
            Figure::Heatmap(f) => heatmap(&root, f)?,
            Figure::Lines(f) => lines(&root, f)?,
            Figure::Radar(f) => radar(&root, f)?,
            Figure::Bars(f) => bars(&root, f)?,
        }
        root.present().map_err(err)?;
    }
    encode_png(&pixels, w, h)
}

fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, FigureError> {
    let img = image::RgbImage::from_raw(w, h, rgb.to_vec())
        .ok_or_else(|| FigureError::Render("pixel buffer of the wrong size".into()))?;
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).map_err(err)?;
    Ok(out.into_inner())
}

/// `[lo, hi]` of `values` widened by `pad` of the span (and to a unit span when flat).
fn padded(values: impl Iterator<Item = f64>, pad: f64) -> (f64, f64) {
    let Some((lo, hi)) = finite_range(values) else {
        return (0.0, 1.0);
    };
    let span = if hi > lo { hi - lo } else { lo.abs().max(1.0) };
    (lo - pad * span, hi + pad * span)
}

fn caption_style() -> TextStyle<'static> {
    (FONT, 22).into_font().color(&BLACK)
}

fn small(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK)
}

/// An arrow from `a` to `b` in pixels: the shaft and a filled head.
fn arrow(area: &Area, a: (i32, i32), b: (i32, i32), c: RGBColor) -> Result<(), FigureError> {
    area.draw(&PathElement::new(vec![a, b], c.stroke_width(2)))
        .map_err(err)?;
    let (dx, dy) = (f64::from(b.0 - a.0), f64::from(b.1 - a.1));
    let len = (dx * dx + dy * dy).sqrt();
    if len < 4.0 {
        return Ok(());
    }
    let (ux, uy) = (dx / len, dy / len);
    let size = 9.0_f64.min(len * 0.6);
    let base = (f64::from(b.0) - ux * size, f64::from(b.1) - uy * size);
    let left = ((base.0 - uy * size * 0.45) as i32, (base.1 + ux * size * 0.45) as i32);
    let right = ((base.0 + uy * size * 0.45) as i32, (base.1 - ux * size * 0.45) as i32);
    area.draw(&Polygon::new(vec![b, left, right], c.filled())).map_err(err)
}

fn draw_paths(
    chart: &Chart,
    root: &Area,
    paths: &[Path],
    colors: impl Fn(usize) -> RGBColor,
) -> Result<(), FigureError> {
    let area = chart.plotting_area();
    for (i, p) in paths.iter().enumerate() {
        let c = colors(i);
        for w in p.points.windows(2) {
            let a = area.map_coordinate(&(w[0][0], w[0][1]));
            let b = area.map_coordinate(&(w[1][0], w[1][1]));
            arrow(root, a, b, c)?;
        }
        if let Some(first) = p.points.first() {
            let at = area.map_coordinate(&(first[0], first[1]));
            root.draw(&Circle::new(at, 3, c.filled())).map_err(err)?;
        }
    }
    Ok(())
}

fn draw_points(chart: &Chart, root: &Area, points: &[Point], groups: &[&str]) -> Result<(), FigureError> {
    let area = chart.plotting_area();
    for p in points {
        let g = groups.iter().position(|g| *g == p.group).unwrap_or(0);
        let at = area.map_coordinate(&(p.x, p.y));
        root.draw(&Circle::new(at, 6, rgb(series_color(g)).filled()))
            .map_err(err)?;
        root.draw(&Circle::new(at, 6, BLACK.stroke_width(1))).map_err(err)?;
        root.draw(&Text::new(p.label.clone(), (at.0 + 8, at.1 - 14), small(14)))
            .map_err(err)?;
    }
    Ok(())
}

/// Splits a strip off the right of `root` wide enough for `entries`, draws the legend there
/// and returns the area left for the chart.
fn with_legend<'a>(root: &Area<'a>, entries: &[(String, RGBColor)]) -> Result<Area<'a>, FigureError> {
    if entries.is_empty() {
        return Ok(root.clone());
    }
    let (w, _) = root.dim_in_pixel();
    let width = entries.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0) as u32 * 8 + 50;
    let (main, strip) = root.split_horizontally(w.saturating_sub(width.min(w / 3)));
    legend(&strip, entries)?;
    Ok(main)
}

/// A legend box of `(label, colour)` entries at the top of `area`.
fn legend(area: &Area, entries: &[(String, RGBColor)]) -> Result<(), FigureError> {
    let (w, _) = area.dim_in_pixel();
    let (x0, y0, x1) = (5, 50, w as i32 - 10);
    let height = entries.len() as i32 * 20 + 10;
    area.draw(&Rectangle::new(
        [(x0, y0), (x1, y0 + height)],
        BLACK.mix(0.4).stroke_width(1),
    ))
    .map_err(err)?;
    for (i, (label, c)) in entries.iter().enumerate() {
        let y = y0 + 15 + i as i32 * 20;
        area.draw(&Rectangle::new([(x0 + 8, y - 5), (x0 + 24, y + 5)], c.filled()))
            .map_err(err)?;
        area.draw(&Text::new(
            label.clone(),
            (x0 + 30, y),
            small(14).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(err)?;
    }
    Ok(())
}

fn scatter(root: &Area, f: &Scatter) -> Result<(), FigureError> {
    let xs = f
        .points
        .iter()
        .map(|p| p.x)
        .chain(f.paths.iter().flat_map(|p| p.points.iter().map(|q| q[0])));
    let ys = f
        .points
        .iter()
        .map(|p| p.y)
        .chain(f.paths.iter().flat_map(|p| p.points.iter().map(|q| q[1])));
    let (x0, x1) = padded(xs, 0.12);
    let (y0, y1) = padded(ys, 0.12);
    let groups = f.groups();
    let entries: Vec<(String, RGBColor)> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (g.to_string(), rgb(series_color(i))))
        .collect();
    let path_color = |i: usize| {
        let g = groups.iter().position(|g| *g == f.paths[i].label).unwrap_or(0);
        rgb(series_color(g))
    };
    let main = with_legend(root, &entries)?;
    let mut chart = ChartBuilder::on(&main)
        .caption(&f.title, caption_style())
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(&f.x_label)
        .y_desc(&f.y_label)
        .label_style(small(14))
        .axis_desc_style(small(16))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)?;
    draw_paths(&chart, &main, &f.paths, path_color)?;
    draw_points(&chart, &main, &f.points, &groups)
}

fn heatmap(root: &Area, f: &Heatmap) -> Result<(), FigureError> {
    if f.x.is_empty() || f.y.is_empty() {
        return Err(FigureError::Empty(f.title.clone()));
    }
    let (w, _) = root.dim_in_pixel();
    let (main, bar) = root.split_horizontally(w.saturating_sub(110));
    let (x0, _) = f.x.cell_span(0);
    let (_, x1) = f.x.cell_span(f.x.len() - 1);
    let (y0, _) = f.y.cell_span(0);
    let (_, y1) = f.y.cell_span(f.y.len() - 1);
    let x_cat = matches!(f.x, Axis::Categories(_));
    let y_cat = matches!(f.y, Axis::Categories(_));
    let longest = (0..f.y.len()).map(|i| f.y.name(i).chars().count()).max().unwrap_or(4) as u32;
    let mut chart = ChartBuilder::on(&main)
        .caption(&f.title, caption_style())
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(if y_cat { 40 + 8 * longest } else { 70 })
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(&f.x_label)
        .y_desc(&f.y_label)
        .label_style(small(14))
        .axis_desc_style(small(16))
        .disable_mesh();
    if x_cat {
        mesh.x_labels(0);
    }
    if y_cat {
        mesh.y_labels(0);
    }
    mesh.draw().map_err(err)?;
    let (lo, hi) = f.range().unwrap_or((0.0, 1.0));
    for (r, row) in f.values.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            let (xa, xb) = f.x.cell_span(c);
            let (ya, yb) = f.y.cell_span(r);
            let fill = if v.is_nan() {
                RGBColor(225, 225, 225)
            } else {
                rgb(color(f.scale, v, lo, hi))
            };
            chart
                .draw_series(std::iter::once(Rectangle::new([(xa, ya), (xb, yb)], fill.filled())))
                .map_err(err)?;
            if f.annotate && !v.is_nan() {
                let at = chart.plotting_area().map_coordinate(&(f.x.coord(c), f.y.coord(r)));
                let ink = rgb(text_on(color(f.scale, v, lo, hi)));
                let style = small(13).color(&ink).pos(Pos::new(HPos::Center, VPos::Center));
                main.draw(&Text::new(format!("{v:.2}"), at, style)).map_err(err)?;
            }
        }
    }
    category_labels(&chart, &main, f, x_cat, y_cat)?;
    if f.contours > 0 && !(x_cat && y_cat) {
        // Categorical axes contour over cell indices.
        let xs: Vec<f64> = (0..f.x.len()).map(|i| f.x.coord(i)).collect();
        let ys: Vec<f64> = (0..f.y.len()).map(|i| f.y.coord(i)).collect();
        for level in levels(lo, hi, f.contours) {
            for [a, b] in contour(&xs, &ys, &f.values, level) {
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(a[0], a[1]), (b[0], b[1])],
                        WHITE.mix(0.7).stroke_width(1),
                    )))
                    .map_err(err)?;
            }
        }
    }
    draw_paths(&chart, &main, &f.overlay, |_| WHITE)?;
    draw_points(&chart, &main, &f.marks, &[])?;
    if let Some((r, c, v)) = f.best() {
        let at = chart.plotting_area().map_coordinate(&(f.x.coord(c), f.y.coord(r)));
        main.draw(&Cross::new(at, 8, RED.stroke_width(3))).map_err(err)?;
        main.draw(&Text::new(
            format!("best {} at ({}, {})", format_number(v), f.x.name(c), f.y.name(r)),
            (at.0 + 10, at.1 + 4),
            small(14).color(&RED),
        ))
        .map_err(err)?;
    }
    color_bar(&bar, f, lo, hi)
}

fn category_labels(chart: &Chart, area: &Area, f: &Heatmap, x_cat: bool, y_cat: bool) -> Result<(), FigureError> {
    let plot = chart.plotting_area();
    for c in (0..f.x.len()).filter(|_| x_cat) {
        let (px, _) = plot.map_coordinate(&(c as f64, 0.0));
        let (_, py) = plot.map_coordinate(&(0.0, f.y.cell_span(0).0));

        let style = small(13).pos(Pos::new(HPos::Center, VPos::Top));
        area.draw(&Text::new(f.x.name(c), (px, py + 6), style)).map_err(err)?;
    }
    for r in (0..f.y.len()).filter(|_| y_cat) {
        let (px, py) = plot.map_coordinate(&(f.x.cell_span(0).0, r as f64));
        let style = small(13).pos(Pos::new(HPos::Right, VPos::Center));
        area.draw(&Text::new(f.y.name(r), (px - 6, py), style)).map_err(err)?;
    }
    Ok(())
}

fn color_bar(area: &Area, f: &Heatmap, lo: f64, hi: f64) -> Result<(), FigureError> {
    let mut chart = ChartBuilder::on(area)
        .margin_top(60)
        .margin_bottom(60)
        .margin_right(55)
        .y_label_area_size(0)
        .right_y_label_area_size(50)
        .build_cartesian_2d(0.0..1.0, lo..hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(6)
        .y_label_formatter(&|v| format_number(*v))
        .label_style(small(13))
        .draw()
        .map_err(err)?;
    let steps = 100;
    chart
        .draw_series((0..steps).map(|i| {
            let a = lo + (hi - lo) * i as f64 / steps as f64;
            let b = lo + (hi - lo) * (i + 1) as f64 / steps as f64;
            Rectangle::new(
                [(0.0, a), (1.0, b)],
                rgb(color(f.scale, (a + b) / 2.0, lo, hi)).filled(),
            )
        }))
        .map_err(err)?;
    area.draw(&Text::new(f.value_label.clone(), (5, 35), small(14)))
        .map_err(err)
}

fn lines(root: &Area, f: &Lines) -> Result<(), FigureError> {
    let tx = |x: f64| if f.log_x { x.log10() } else { x };
    let ty = |y: f64| if f.log_y { y.log10() } else { y };
    let on = |side: Side| f.series.iter().filter(move |s| s.side == side);
    let (x0, x1) = padded(f.series.iter().flat_map(|s| s.points.iter().map(|p| tx(p[0]))), 0.03);
    let (y0, y1) = padded(
        on(Side::Left).flat_map(|s| {
            s.points.iter().enumerate().flat_map(|(i, p)| {
                let e = s.error(i);
                [ty(p[1] - e), ty(p[1] + e)]
            })
        }),
        0.06,
    );
    let has_right = on(Side::Right).next().is_some();
    let entries: Vec<(String, RGBColor)> = f
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let side = if has_right && s.side == Side::Right {
                " (right axis)"
            } else {
                ""
            };
            (format!("{}{side}", s.label), rgb(series_color(s.color.unwrap_or(i))))
        })
        .collect();
    let main = with_legend(root, &entries)?;
    let root = &main;
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, caption_style())
        .margin(15)
        .margin_right(if has_right { 90 } else { 15 })
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let fmt_x = |v: &f64| {
        if f.log_x {
            format_significant(10f64.powf(*v), 2)
        } else {
            format_number(*v)
        }
    };
    let fmt_y = |v: &f64| format_number(if f.log_y { 10f64.powf(*v) } else { *v });
    draw_mesh(&mut chart, &f.x_label, &f.y_label, Some(&fmt_x), &fmt_y)?;
    let draw = |chart: &mut Chart, i: usize, s: &crate::model::Series, y: &dyn Fn(f64) -> f64| {
        let c = rgb(series_color(s.color.unwrap_or(i)));
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p[1].is_finite())
            .map(|p| (tx(p[0]), y(p[1])))
            .collect();
        let style = c.stroke_width(2);
        let drawn = if s.dashed {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))
        };
        drawn.map_err(err)?;
        for (i, p) in s.points.iter().enumerate() {
            let e = s.error(i);
            if e > 0.0 && p[1].is_finite() {
                let x = tx(p[0]);
                let (lo, hi) = (y(p[1] - e), y(p[1] + e));
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x, lo), (x, hi)],
                        c.stroke_width(1),
                    )))
                    .map_err(err)?;
                let (a, b) = (
                    chart.plotting_area().map_coordinate(&(x, lo)),
                    chart.plotting_area().map_coordinate(&(x, hi)),
                );
                for end in [a, b] {
                    root.draw(&PathElement::new(
                        vec![(end.0 - 4, end.1), (end.0 + 4, end.1)],
                        c.stroke_width(1),
                    ))
                    .map_err(err)?;
                }
            }
        }
        if pts.len() <= 40 && !s.dashed {
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                .map_err(err)?;
        }
        Ok::<(), FigureError>(())
    };
    for (i, s) in f.series.iter().enumerate().filter(|(_, s)| s.side == Side::Left) {
        draw(&mut chart, i, s, &ty)?;
    }
    if let Some(best) = f.best() {
        let at = chart.plotting_area().map_coordinate(&(tx(best[0]), ty(best[1])));
        root.draw(&Cross::new(at, 8, RED.stroke_width(3))).map_err(err)?;
        root.draw(&Text::new(
            format!("best {} at {}", format_number(best[1]), format_number(best[0])),
            (at.0 + 10, at.1 + 6),
            small(14).color(&RED),
        ))
        .map_err(err)?;
    }
    for (k, note) in f.notes.iter().enumerate() {
        let at = chart.plotting_area().map_coordinate(&(x0, y1));
        root.draw(&Text::new(
            note.clone(),
            (at.0 + 8, at.1 + 6 + 18 * k as i32),
            small(14).color(&BLACK),
        ))
        .map_err(err)?;
    }
    if has_right {
        // Right-axis series are mapped linearly onto the left range; their ticks are drawn
        // on the right edge.
        let (r0, r1) = padded(on(Side::Right).flat_map(|s| s.points.iter().map(|p| p[1])), 0.06);
        let to_left = |r: f64| y0 + (r - r0) / (r1 - r0) * (y1 - y0);
        for (i, s) in f.series.iter().enumerate().filter(|(_, s)| s.side == Side::Right) {
            draw(&mut chart, i, s, &to_left)?;
        }
        right_axis(&chart, root, f, x1, (r0, r1), &to_left)?;
    }
    Ok(())
}

/// The axes and grid of a lines or bars chart: the axis descriptions, tick labels written by
/// `fmt_x` and `fmt_y`, and light grid lines. Without `fmt_x` (bars, whose categories are
/// labelled apart) there are neither x tick labels nor vertical grid lines.
fn draw_mesh(
    chart: &mut Chart,
    x_desc: &str,
    y_desc: &str,
    fmt_x: Option<&dyn Fn(&f64) -> String>,
    fmt_y: &dyn Fn(&f64) -> String,
) -> Result<(), FigureError> {
    let mut mesh = chart.configure_mesh();
    match fmt_x {
        Some(fmt_x) => mesh.x_label_formatter(fmt_x),
        None => mesh.disable_x_mesh().x_labels(0),
    };
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .y_label_formatter(fmt_y)
        .label_style(small(14))
        .axis_desc_style(small(16))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()
        .map_err(err)
}

fn bars(root: &Area, f: &Bars) -> Result<(), FigureError> {
    let entries: Vec<(String, RGBColor)> = f
        .series
        .iter()
        .enumerate()
        .map(|(i, (label, _))| (label.clone(), rgb(series_color(i))))
        .collect();
    let main = with_legend(root, &entries)?;
    let root = &main;
    let (lo, hi) = f.range();
    let pad = 0.08 * (hi - lo);
    let n = f.categories.len().max(1) as f64;
    let notes_height = 18 * f.notes.len() as u32;
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, caption_style())
        .margin(15)
        .margin_bottom(15 + notes_height)
        .x_label_area_size(60)
        .y_label_area_size(75)
        .build_cartesian_2d(-0.6..n - 0.4, (lo - if lo < 0.0 { pad } else { 0.0 })..hi + pad)
        .map_err(err)?;
    draw_mesh(&mut chart, &f.x_label, &f.y_label, None, &|v: &f64| format_number(*v))?;
    for (s, _, x0, x1, y0, y1) in f.rects() {
        let c = rgb(series_color(s));
        chart
            .draw_series(std::iter::once(Rectangle::new([(x0, y0), (x1, y1)], c.filled())))
            .map_err(err)?;
    }
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(-0.6, 0.0), (n - 0.4, 0.0)],
            BLACK.stroke_width(1),
        )))
        .map_err(err)?;
    for (c, name) in f.categories.iter().enumerate() {
        let at = chart
            .plotting_area()
            .map_coordinate(&(c as f64, lo.min(0.0) - if lo < 0.0 { pad } else { 0.0 }));
        root.draw(&Text::new(
            name.clone(),
            (at.0, at.1 + 8),
            small(14).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(err)?;
    }
    let bottom = root.dim_in_pixel().1 as i32 - notes_height as i32 - 8;
    for (k, note) in f.notes.iter().enumerate() {
        root.draw(&Text::new(
            note.clone(),
            (20, bottom + 18 * k as i32),
            small(14).color(&BLACK),
        ))
        .map_err(err)?;
    }
    Ok(())
}

/// `x` with `digits` significant digits (log-axis ticks).
fn format_significant(x: f64, digits: i32) -> String {
    if x <= 0.0 || !x.is_finite() {
        return format_number(x);
    }
    let scale = 10f64.powi(digits - 1 - x.log10().floor() as i32);
    format_number((x * scale).round() / scale)
}

/// Round tick values (1, 2 or 5 × 10ⁿ apart) inside `[lo, hi]`, about `count` of them.
pub fn nice_ticks(lo: f64, hi: f64, count: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / count.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// Ticks and name of the secondary (right) axis over `range`, drawn at the chart's right edge.
fn right_axis(
    chart: &Chart,
    root: &Area,
    f: &Lines,
    x_right: f64,
    (r0, r1): (f64, f64),
    to_left: &dyn Fn(f64) -> f64,
) -> Result<(), FigureError> {
    let plot = chart.plotting_area();
    let top = plot.map_coordinate(&(x_right, to_left(r1)));
    let bottom = plot.map_coordinate(&(x_right, to_left(r0)));
    root.draw(&PathElement::new(vec![top, bottom], BLACK.stroke_width(1)))
        .map_err(err)?;
    for r in nice_ticks(r0, r1, 6) {
        let at = plot.map_coordinate(&(x_right, to_left(r)));
        root.draw(&PathElement::new(vec![at, (at.0 + 5, at.1)], BLACK.stroke_width(1)))
            .map_err(err)?;
        let style = small(14).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(format_number(r), (at.0 + 8, at.1), style))
            .map_err(err)?;
    }
    let label = f.y2_label.clone().unwrap_or_default();
    let style = small(16).pos(Pos::new(HPos::Right, VPos::Bottom));
    root.draw(&Text::new(label, (top.0 + 80, top.1 - 8), style))
        .map_err(err)
}

fn radar(root: &Area, f: &Radar) -> Result<(), FigureError> {
    let mut entries: Vec<(String, RGBColor)> = Vec::new();
    if let Some((label, _)) = &f.reference {
        entries.push((label.clone(), BLACK));
    }
    entries.extend(
        f.series
            .iter()
            .enumerate()
            .map(|(i, (l, _))| (l.clone(), rgb(series_color(i)))),
    );
    let main = with_legend(root, &entries)?;
    let root = &main;
    let (w, h) = root.dim_in_pixel();
    root.draw(&Text::new(
        f.title.clone(),
        (w as i32 / 2, 12),
        caption_style().pos(Pos::new(HPos::Center, VPos::Top)),
    ))
    .map_err(err)?;
    let center = (w as i32 / 2, h as i32 / 2 + 15);
    let radius = f64::from((w as i32 - 160).min(h as i32 - 110) / 2).max(20.0);
    let px = |p: [f64; 2]| (center.0 + (p[0] * radius) as i32, center.1 - (p[1] * radius) as i32);
    let n = f.axes.len();
    let grid = RGBColor(200, 200, 200);
    for ring in [0.25, 0.5, 0.75, 1.0] {
        let pts: Vec<(i32, i32)> = polygon(&vec![ring; n], 1.0).into_iter().map(px).collect();
        root.draw(&PathElement::new(pts, grid.stroke_width(1))).map_err(err)?;
        let at = px([0.0, ring]);
        let label = format_number(ring * f.max);
        root.draw(&Text::new(
            label,
            (at.0 + 4, at.1),
            small(12).color(&RGBColor(120, 120, 120)),
        ))
        .map_err(err)?;
    }
    for (i, name) in f.axes.iter().enumerate() {
        let d = axis_direction(i, n);
        root.draw(&PathElement::new(vec![px([0.0, 0.0]), px(d)], grid.stroke_width(1)))
            .map_err(err)?;
        let h_pos = if d[0] > 0.2 {
            HPos::Left
        } else if d[0] < -0.2 {
            HPos::Right
        } else {
            HPos::Center
        };
        let v_pos = if d[1] > 0.2 {
            VPos::Bottom
        } else if d[1] < -0.2 {
            VPos::Top
        } else {
            VPos::Center
        };
        let at = px([d[0] * 1.06, d[1] * 1.06]);
        root.draw(&Text::new(name.clone(), at, small(15).pos(Pos::new(h_pos, v_pos))))
            .map_err(err)?;
    }
    if let Some((_, r)) = &f.reference {
        let pts: Vec<(i32, i32)> = polygon(&vec![*r; n], f.max).into_iter().map(px).collect();
        for seg in pts.windows(2) {
            dashed(root, seg[0], seg[1], BLACK)?;
        }
    }
    for (i, (_, values)) in f.series.iter().enumerate() {
        let c = rgb(series_color(i));
        let pts: Vec<(i32, i32)> = polygon(values, f.max).into_iter().map(px).collect();
        root.draw(&Polygon::new(pts.clone(), c.mix(0.12).filled()))
            .map_err(err)?;
        root.draw(&PathElement::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?;
        for p in &pts {
            root.draw(&Circle::new(*p, 3, c.filled())).map_err(err)?;
        }
    }
    Ok(())
}

/// A dashed segment in pixels.
fn dashed(root: &Area, a: (i32, i32), b: (i32, i32), c: RGBColor) -> Result<(), FigureError> {
    let (dx, dy) = (f64::from(b.0 - a.0), f64::from(b.1 - a.1));
    let len = (dx * dx + dy * dy).sqrt();
    let dashes = (len / 10.0).ceil() as usize;
    for k in 0..dashes {
        let t0 = k as f64 / dashes as f64;
        let t1 = (k as f64 + 0.6) / dashes as f64;
        let p = |t: f64| (a.0 + (dx * t) as i32, a.1 + (dy * t) as i32);
        root.draw(&PathElement::new(vec![p(t0), p(t1)], c.stroke_width(2)))
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::nice_ticks;

    #[test]
    fn ticks_are_round_and_inside_the_range() {
        assert_eq!(nice_ticks(-0.38, 6.69, 6), vec![0.0, 2.0, 4.0, 6.0]);
        assert_eq!(
            nice_ticks(0.0, 1.0, 5),
            vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
        );
        assert_eq!(nice_ticks(1.0, 1.0, 5), vec![1.0]);
    }
}
