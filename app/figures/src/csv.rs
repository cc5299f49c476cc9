//! Figures as CSV: the numbers behind every picture, one row per point or cell (long format),
//! so they can be re-plotted elsewhere.

use crate::model::{Bars, Figure, Heatmap, Lines, Radar, Scatter, Side};
use std::fmt::Write;

/// Quotes a CSV field when it needs it.
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn num(x: f64) -> String {
    if x.is_nan() { String::new() } else { format!("{x}") }
}

/// The figure's numbers as CSV text.
pub fn to_csv(figure: &Figure) -> String {
    match figure {
        Figure::Scatter(f) => scatter(f),
        Figure::Heatmap(f) => heatmap(f),
        Figure::Lines(f) => lines(f),
        Figure::Radar(f) => radar(f),
        Figure::Bars(f) => bars(f),
    }
}

fn scatter(f: &Scatter) -> String {
    let mut out = format!(
        "kind,series,index,label,{},{},info\n",
        field(&f.x_label),
        field(&f.y_label)
    );
    for p in &f.points {
        let _ = writeln!(
            out,
            "point,{},,{},{},{},{}",
            field(&p.group),
            field(&p.label),
            num(p.x),
            num(p.y),
            field(&p.info.join("; "))
        );
    }
    for path in &f.paths {
        for (i, q) in path.points.iter().enumerate() {
            let _ = writeln!(out, "path,{},{i},,{},{},", field(&path.label), num(q[0]), num(q[1]));
        }
    }
    out
}

fn heatmap(f: &Heatmap) -> String {
    let mut out = format!(
        "{},{},{}\n",
        field(&f.x_label),
        field(&f.y_label),
        field(&f.value_label)
    );
    for (r, row) in f.values.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            let _ = writeln!(out, "{},{},{}", field(&f.x.name(c)), field(&f.y.name(r)), num(*v));
        }
    }
    out
}

/// One row per point; a `standard_error` column when some series has error bars.
fn lines(f: &Lines) -> String {
    let with_errors = f.series.iter().any(|s| !s.errors.is_empty());
    let mut out = format!(
        "series,{},value,axis{}\n",
        field(&f.x_label),
        if with_errors { ",standard_error" } else { "" }
    );
    for s in &f.series {
        let axis = match s.side {
            Side::Left => f.y_label.as_str(),
            Side::Right => f.y2_label.as_deref().unwrap_or("right"),
        };
        for (i, p) in s.points.iter().enumerate() {
            let _ = write!(out, "{},{},{},{}", field(&s.label), num(p[0]), num(p[1]), field(axis));
            if with_errors {
                let _ = write!(out, ",{}", s.errors.get(i).map_or(String::new(), |e| num(*e)));
            }
            out.push('\n');
        }
    }
    out
}

/// One row per category, one column per series.
fn bars(f: &Bars) -> String {
    let mut out = field(&f.x_label);
    for (label, _) in &f.series {
        out.push(',');
        out.push_str(&field(label));
    }
    out.push('\n');
    for (c, name) in f.categories.iter().enumerate() {
        out.push_str(&field(name));
        for (_, values) in &f.series {
            out.push(',');
            out.push_str(&values.get(c).map_or(String::new(), |v| num(*v)));
        }
        out.push('\n');
    }
    out
}

fn radar(f: &Radar) -> String {
    let mut out = String::from("series");
    for a in &f.axes {
        out.push(',');
        out.push_str(&field(a));
    }
    out.push('\n');
    for (label, values) in &f.series {
        out.push_str(&field(label));
        for v in values {
            out.push(',');
            out.push_str(&num(*v));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Axis, ColorScale};

    #[test]
    fn heatmap_rows_name_their_cells_and_leave_missing_values_empty() {
        let f = Figure::Heatmap(Heatmap {
            title: "t".into(),
            x_label: "λ".into(),
            y_label: "rank, %".into(),
            value_label: "accuracy".into(),
            x: Axis::Numeric(vec![0.5, 1.0]),
            y: Axis::Categories(vec!["a".into()]),
            values: vec![vec![0.25, f64::NAN]],
            scale: ColorScale::Sequential,
            better: None,
            contours: 0,
            annotate: false,
            overlay: vec![],
            marks: vec![],
        });
        assert_eq!(to_csv(&f), "λ,\"rank, %\",accuracy\n0.5,a,0.25\n1,a,\n");
    }

    #[test]
    fn radar_is_one_row_per_series() {
        let f = Figure::Radar(Radar {
            title: "r".into(),
            axes: vec!["mnist".into(), "ising".into()],
            series: vec![("ties".into(), vec![0.5, 1.0])],
            max: 1.0,
            reference: None,
        });
        assert_eq!(to_csv(&f), "series,mnist,ising\nties,0.5,1\n");
    }
}
