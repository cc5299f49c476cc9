//! Widgets for a [`ParamForm`]: a slider per number (bounded by the schema, or a soft range
//! that typed values may leave), a checkbox per flag, a combo box per choice, per-task
//! values on request, help on hover, and the field's error right under it.

use crate::form::{FieldValue, ParamForm};
use egui::{RichText, Ui};
use mergescope_engine::plugin::schema::ParamType;

/// The range a slider shows for a number: the schema's bounds, or a soft range around the
/// default where the schema leaves a side open.
pub fn soft_range(min: Option<f64>, max: Option<f64>, default: f64) -> (f64, f64) {
    let lo = min.unwrap_or_else(|| default.min(0.0));
    let hi = max.unwrap_or_else(|| (2.0 * default.abs()).max(lo + 1.0));
    (lo, hi.max(lo + f64::EPSILON))
}

/// Shows the form; expert labels name the per-task rows.
pub fn form_ui(ui: &mut Ui, form: &mut ParamForm, experts: &[String]) {
    let n = experts.len();
    for i in 0..form.fields.len() {
        let error = form.field_error(i, n);
        let f = &mut form.fields[i];
        let help = f.schema.help.clone();
        let name = f.schema.name.clone();
        let default = f.schema.default.as_f64().unwrap_or(0.0);
        if let Some(v) = form.layer_wise.get(&name) {
            let mut one_value = false;
            ui.horizontal(|ui| {
                ui.label(format!("{name}: layer-wise"))
                    .on_hover_text(format!("{help}\n\nFrom the opened recipe, resolved per tensor: {v}"));
                one_value = ui
                    .small_button("one value")
                    .on_hover_text("Replace the layer-wise value by one value for every tensor")
                    .clicked();
            });
            ui.label(RichText::new(v.to_string()).monospace().small());
            if one_value {
                form.layer_wise.remove(&name);
            }
            continue;
        }
        ui.horizontal(|ui| match (&f.schema.ty, &mut f.value) {
            (ParamType::Float { min, max }, FieldValue::Float(x)) => {
                let (lo, hi) = soft_range(*min, *max, default);
                let enabled = f.per_task.is_none();
                ui.add_enabled(
                    enabled,
                    egui::Slider::new(x, lo..=hi)
                        .text(&name)
                        .clamping(egui::SliderClamping::Never)
                        .max_decimals(4),
                )
                .on_hover_text(&help);
            }
            (ParamType::Int { min, max }, FieldValue::Int(k)) => {
                let (lo, hi) = soft_range(min.map(|m| m as f64), max.map(|m| m as f64), default);
                ui.add(
                    egui::Slider::new(k, lo.round() as i64..=hi.round() as i64)
                        .text(&name)
                        .clamping(egui::SliderClamping::Never),
                )
                .on_hover_text(&help);
            }
            (ParamType::Bool, FieldValue::Bool(b)) => {
                ui.checkbox(b, &name).on_hover_text(&help);
            }
            (ParamType::Choice { choices }, FieldValue::Choice(s)) => {
                egui::ComboBox::from_label(&name)
                    .selected_text(s.as_str())
                    .show_ui(ui, |ui| {
                        for c in choices {
                            ui.selectable_value(s, c.clone(), c);
                        }
                    })
                    .response
                    .on_hover_text(&help);
            }
            _ => {
                ui.label(format!("{name}: this parameter's value does not match its type"));
            }
        });
        if f.schema.per_task && n > 0 {
            let mut on = f.per_task.is_some();
            if ui
                .checkbox(&mut on, format!("{name} per expert"))
                .on_hover_text("Give each expert its own value, in the order of the expert list")
                .changed()
            {
                f.set_per_task(on, n);
            }
            if let Some(list) = &mut f.per_task {
                list.resize(n, default);
                ui.indent(("per-task", i), |ui| {
                    for (v, label) in list.iter_mut().zip(experts) {
                        ui.horizontal(|ui| {
                            let r = ui.add(egui::DragValue::new(v).speed(0.01).max_decimals(4));
                            let l = ui.label(label);
                            r.labelled_by(l.id);
                        });
                    }
                });
            }
        }
        if let Some(e) = error {
            ui.label(RichText::new(e).color(ui.visuals().error_fg_color).small());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::soft_range;

    #[test]
    fn soft_ranges_keep_schema_bounds_and_open_sides_around_the_default() {
        assert_eq!(soft_range(Some(0.0), Some(1.0), 0.2), (0.0, 1.0));
        assert_eq!(soft_range(None, None, 0.3), (0.0, 1.0));
        assert_eq!(soft_range(Some(1.0), None, 8.0), (1.0, 16.0));
        assert_eq!(soft_range(None, Some(0.5), -2.0), (-2.0, 0.5));
    }
}
