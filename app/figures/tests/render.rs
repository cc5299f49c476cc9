#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every figure kind renders to a decodable PNG of the asked size whose pixels show the data.

use mergescope_figures::colormap::{color, series_color};
use mergescope_figures::*;

fn decode(bytes: &[u8]) -> image::RgbImage {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    image::load_from_memory(bytes).unwrap().to_rgb8()
}

fn save(name: &str, bytes: &[u8]) {
    // Set MERGESCOPE_FIGURE_DIR to look at the pictures.
    if let Ok(dir) = std::env::var("MERGESCOPE_FIGURE_DIR") {
        std::fs::write(std::path::Path::new(&dir).join(name), bytes).unwrap();
    }
}

fn count(img: &image::RgbImage, c: [u8; 3]) -> usize {
    img.pixels().filter(|p| p.0 == c).count()
}

#[test]
fn heatmap_cells_take_their_colours_and_a_missing_cell_is_grey() {
    let xs: Vec<f64> = (0..5).map(|i| i as f64 * 0.5).collect();
    let ys: Vec<f64> = (1..=4).map(|i| i as f64 * 0.1).collect();
    let mut values: Vec<Vec<f64>> = ys
        .iter()
        .map(|y| xs.iter().map(|x| -(x - 1.0f64).powi(2) - y).collect())
        .collect();
    values[3][4] = f64::NAN;
    let fig = Figure::Heatmap(Heatmap {
        title: "accuracy over rank × λ".into(),
        x_label: "λ".into(),
        y_label: "rank fraction".into(),
        value_label: "accuracy".into(),
        x: Axis::Numeric(xs),
        y: Axis::Numeric(ys),
        values: values.clone(),
        scale: ColorScale::Sequential,
        better: Some(Better::Higher),
        contours: 4,
        annotate: false,
        overlay: vec![Path {
            label: "run".into(),
            points: vec![[0.0, 0.1], [1.0, 0.2], [1.5, 0.3]],
        }],
        marks: vec![],
    });
    let png = render_png(&fig, 800, 600).unwrap();
    save("heatmap.png", &png);
    let img = decode(&png);
    assert_eq!(img.dimensions(), (800, 600));
    let (lo, hi) = match &fig {
        Figure::Heatmap(h) => h.range().unwrap(),
        _ => unreachable!(),
    };
    // The lowest cell (bottom-right... top row, x = 0) is drawn in the scale's lowest colour.
    assert!(count(&img, color(ColorScale::Sequential, lo, lo, hi)) > 500);
    assert!(count(&img, color(ColorScale::Sequential, hi, lo, hi)) > 500);
    assert!(count(&img, [225, 225, 225]) > 500, "the missing cell is grey");
}

#[test]
fn cosine_matrix_with_categories_annotates_cells() {
    let names: Vec<String> = ["mnist", "letters", "ising"].iter().map(|s| s.to_string()).collect();
    let fig = Figure::Heatmap(Heatmap {
        title: "task-vector cosine".into(),
        x_label: String::new(),
        y_label: String::new(),
        value_label: "cos".into(),
        x: Axis::Categories(names.clone()),
        y: Axis::Categories(names),
        values: vec![vec![1.0, 0.2, -0.1], vec![0.2, 1.0, 0.05], vec![-0.1, 0.05, 1.0]],
        scale: ColorScale::Diverging,
        better: None,
        contours: 0,
        annotate: true,
        overlay: vec![],
        marks: vec![],
    });
    let png = render_png(&fig, 700, 600).unwrap();
    save("cosine.png", &png);
    let img = decode(&png);
    // The diagonal (1.0) takes the top of the diverging scale.
    assert!(count(&img, color(ColorScale::Diverging, 1.0, -1.0, 1.0)) > 3000);
}

#[test]
fn lines_scatter_and_radar_draw_their_series_colours() {
    let lines = Figure::Lines(Lines {
        title: "R(k) and I(k)".into(),
        x_label: "rank k".into(),
        y_label: "R(k)".into(),
        y2_label: Some("I(k)".into()),
        log_x: false,
        log_y: false,
        series: vec![
            Series {
                label: "R(k)".into(),
                points: (0..10).map(|k| [k as f64, 1.0 / (1.0 + k as f64)]).collect(),
                side: Side::Left,
                dashed: false,
                color: None,
                errors: Vec::new(),
            },
            Series {
                label: "I(k)".into(),
                points: (0..10).map(|k| [k as f64, 10.0 * k as f64]).collect(),
                side: Side::Right,
                dashed: true,
                color: None,
                errors: Vec::new(),
            },
        ],
        better: None,
        notes: Vec::new(),
    });
    let scatter = Figure::Scatter(Scatter {
        title: "PCA".into(),
        x_label: "PC1 (60%)".into(),
        y_label: "PC2 (30%)".into(),
        points: vec![
            Point {
                x: 0.0,
                y: 0.0,
                label: "base".into(),
                group: "base".into(),
                info: vec![],
            },
            Point {
                x: 1.0,
                y: 0.5,
                label: "mnist".into(),
                group: "expert".into(),
                info: vec![],
            },
        ],
        paths: vec![Path {
            label: "frank-wolfe".into(),
            points: vec![[0.0, 0.0], [0.3, 0.2], [0.5, 0.4]],
        }],
    });
    let radar = Figure::Radar(Radar {
        title: "normalised accuracy".into(),
        axes: vec!["a".into(), "b".into(), "c".into(), "d".into(), "e".into()],
        series: vec![
            ("ties".into(), vec![0.9, 0.8, 0.7, 0.95, 0.6]),
            ("cart".into(), vec![0.7, 0.9, 0.8, 0.6, 0.9]),
        ],
        max: 1.0,
        reference: Some(("experts".into(), 1.0)),
    });
    for (name, fig, colours) in [
        ("lines.png", lines, 2),
        ("scatter.png", scatter, 3),
        ("radar.png", radar, 2),
    ] {
        let png = render_png(&fig, 900, 650).unwrap();
        save(name, &png);
        let img = decode(&png);
        for i in 0..colours {
            assert!(count(&img, series_color(i)) > 100, "{name}: series {i} not drawn");
        }
    }
}
