//! The Method panel: every loaded plugin with its description and version, the parameter
//! form built from its schema, seed and device, plugin approvals, and the Run button.

use crate::document::Document;
use crate::ui::{ViewState, dialogs, form_view};
use egui::{RichText, Ui};
use mergescope_engine::device::DeviceChoice;

/// Whether this build can use `d`.
pub fn device_compiled(d: DeviceChoice) -> bool {
    match d {
        DeviceChoice::Cpu => true,
        DeviceChoice::Cuda => cfg!(feature = "cuda"),
        DeviceChoice::Metal => cfg!(feature = "metal"),
    }
}

fn device_label(d: DeviceChoice) -> &'static str {
    match d {
        DeviceChoice::Cpu => "CPU",
        DeviceChoice::Cuda => "CUDA",
        DeviceChoice::Metal => "Metal",
    }
}

/// The most methods of one kind listed in one column of the method list.
const METHODS_PER_COLUMN: usize = 12;

/// The panel.
pub fn method_ui(ui: &mut Ui, doc: &mut Document, view: &mut ViewState) {
    ui.heading("Merge method");
    let current = doc.method.clone().unwrap_or_default();
    let mut chosen = current.clone();
    let selected_text = doc
        .plugin()
        .map(|p| p.info.name.clone())
        .unwrap_or_else(|| "choose a method".into());
    egui::ComboBox::from_label("Method")
        .selected_text(selected_text)
        .width(200.0)
        // Every method visible without scrolling (the popup still stops at the window's edge).
        .height(f32::INFINITY)
        .show_ui(ui, |ui| {
            // The two kinds side by side, so that twenty-odd methods fit without scrolling.
            ui.horizontal_top(|ui| {
                for (model_level, heading) in [(false, "Per tensor"), (true, "Model level · calibration data")] {
                    let group: Vec<_> = doc
                        .registry
                        .by_name()
                        .into_iter()
                        .filter(|p| p.is_model_level() == model_level)
                        .collect();
                    if group.is_empty() {
                        continue;
                    }
                    // Columns of at most METHODS_PER_COLUMN, so that a long kind stays in view.
                    let rows = group.len().div_ceil(group.len().div_ceil(METHODS_PER_COLUMN));
                    for (i, column) in group.chunks(rows).enumerate() {
                        ui.vertical(|ui| {
                            ui.label(RichText::new(if i == 0 { heading } else { " " }).weak().small());
                            for p in column {
                                ui.selectable_value(&mut chosen, p.id().to_owned(), &p.info.name)
                                    .on_hover_text(&p.info.description);
                            }
                        });
                    }
                }
            });
        });
    if chosen != current {
        doc.select_method(&chosen);
        doc.dirty = true;
    }
    if let Some(p) = doc.plugin() {
        ui.label(&p.info.description);
        ui.label(
            RichText::new(format!(
                "{} {} · {} · ABI {}",
                p.id(),
                p.version(),
                p.info.kind,
                p.info.abi
            ))
            .weak()
            .small(),
        )
        .on_hover_text(p.path.display().to_string());
        if !p.info.help.is_empty() {
            egui::CollapsingHeader::new("Help")
                .id_salt(("help", p.id()))
                .show(ui, |ui| {
                    ui.label(&p.info.help);
                });
        }
    }
    approvals_ui(ui, doc, view);
    ui.separator();

    let experts: Vec<String> = doc.inputs.experts.iter().map(|e| e.label.clone()).collect();
    if let Some(form) = &mut doc.form {
        ui.horizontal(|ui| {
            ui.label(RichText::new("Parameters").strong());
            if ui
                .small_button("Reset")
                .on_hover_text("Back to the method's defaults")
                .clicked()
            {
                form.reset();
            }
        });
        let before = form.to_json();
        if form.fields.is_empty() {
            ui.label(RichText::new("This method has no parameters.").weak());
        }
        form.fit_experts(experts.len());
        form_view::form_ui(ui, form, &experts);
        if form.to_json() != before {
            doc.dirty = true;
        }
    }
    ui.separator();
    ui.horizontal(|ui| {
        let label = ui.label("Seed");
        ui.add(egui::DragValue::new(&mut doc.seed).range(0..=u64::MAX))
            .labelled_by(label.id)
            .on_hover_text("Seed given to the method (random drops, sampling) and recorded in the output");
    });
    ui.horizontal(|ui| {
        ui.label("Device");
        for d in [DeviceChoice::Cpu, DeviceChoice::Cuda, DeviceChoice::Metal] {
            let ok = device_compiled(d);
            let r = ui.add_enabled(ok, egui::RadioButton::new(doc.device == d, device_label(d)));
            if r.clicked() {
                doc.device = d;
            }
            if !ok {
                r.on_disabled_hover_text(format!(
                    "This build has no {} support: build with `--features {}`",
                    device_label(d),
                    device_label(d).to_lowercase()
                ));
            }
        }
    });
    ui.add_space(8.0);
    let ready = doc.can_run();
    let run = ui
        .add_enabled(
            ready.is_ok(),
            egui::Button::new(RichText::new("▶ Run merge").strong()).min_size(egui::vec2(160.0, 28.0)),
        )
        .on_hover_text("Ctrl+Enter: merge, then evaluate every task");
    if run.clicked() {
        view.start_run(doc);
    }
    if let Err(why) = ready {
        ui.label(RichText::new(why.to_string()).color(ui.visuals().warn_fg_color).small());
    }
}

fn approvals_ui(ui: &mut Ui, doc: &mut Document, view: &mut ViewState) {
    for p in &doc.registry.pending {
        ui.horizontal_wrapped(|ui| {
            let why = if p.changed {
                "⚠ changed since you approved it:"
            } else {
                "⚠ needs approval:"
            };
            ui.label(RichText::new(why).color(ui.visuals().warn_fg_color));
            ui.label(RichText::new(p.path.display().to_string()).monospace().small());
            if ui.small_button("Review…").clicked() {
                view.approval = Some(p.path.clone());
            }
        });
    }
    for f in &doc.registry.failures {
        ui.label(
            RichText::new(format!("🗑 {}: {}", f.path.display(), f.error))
                .color(ui.visuals().error_fg_color)
                .small(),
        );
    }
    if ui.small_button("Load plugin…").clicked() {
        dialogs::pick_plugin(doc, view);
    }
}
