//! A [`Bars`] figure drawn with egui_plot: grouped or stacked bars over named categories,
//! with the category names on the x axis and each bar's value on hover.

use egui::{Color32, Ui};
use egui_plot::{AxisHints, Bar, BarChart, Legend, Plot};
use mergescope_figures::colormap::series_color;
use mergescope_figures::{Bars, format_number};

/// Draws `f` filling the available width, `height` points tall; its notes go above the plot.
pub fn bars(ui: &mut Ui, id: &str, f: &Bars, height: f32) {
    for note in &f.notes {
        ui.small(note);
    }
    let categories = f.categories.clone();
    let x_axis = AxisHints::new_x().label(f.x_label.clone()).formatter(move |mark, _| {
        let i = mark.value.round();
        if (mark.value - i).abs() < 1e-6 && i >= 0.0 {
            categories.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    });
    Plot::new(id)
        .height(height)
        .legend(Legend::default())
        .custom_x_axes(vec![x_axis])
        .y_axis_label(f.y_label.clone())
        .show(ui, |plot| {
            for (s, (label, _)) in f.series.iter().enumerate() {
                let [r, g, b] = series_color(s);
                let items: Vec<Bar> = f
                    .rects()
                    .into_iter()
                    .filter(|r| r.0 == s)
                    .map(|(_, c, x0, x1, y0, y1)| {
                        let value = f.series[s].1[c];
                        Bar::new((x0 + x1) / 2.0, y1 - y0)
                            .base_offset(y0)
                            .width(x1 - x0)
                            .name(format!("{}: {}", f.categories[c], format_number(value)))
                    })
                    .collect();
                plot.bar_chart(BarChart::new(label.clone(), items).color(Color32::from_rgb(r, g, b)));
            }
        });
}
