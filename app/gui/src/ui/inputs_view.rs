//! The Inputs panel: the benchmark, the base and the experts with their size, dtypes, tensor
//! count, accuracy on the benchmark and compatibility problems; reorder, rename, remove.

use crate::document::Document;
use crate::inputs::{InputFile, human_bytes};
use crate::ui::{ViewState, dialogs};
use egui::{RichText, Ui};
use mergescope_lab::demo::Benchmark;

/// What the user asked for in a row.
enum RowAction {
    Up,
    Remove,
    MakeBase,
}

fn percent(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

/// Accuracy line of an input on the benchmark: its own task for an expert, the mean for the base.
fn accuracy_line(b: &Benchmark, file: &InputFile, is_base: bool) -> Option<String> {
    let tasks = &b.manifest.tasks;
    if is_base {
        if file.path != b.base_path() || tasks.is_empty() {
            return None;
        }
        let mean = tasks.iter().map(|t| t.base_accuracy.test).sum::<f64>() / tasks.len() as f64;
        return Some(format!("mean test accuracy {}", percent(mean)));
    }
    let paths = b.expert_paths();
    let t = paths
        .iter()
        .zip(tasks)
        .find(|(p, _)| **p == file.path)
        .map(|(_, t)| t)?;
    Some(format!(
        "{}: {} (base {})",
        t.name,
        percent(t.expert_accuracy.test),
        percent(t.base_accuracy.test)
    ))
}

fn input_row(
    ui: &mut Ui,
    file: &mut InputFile,
    bench: Option<&Benchmark>,
    is_base: bool,
    index: usize,
    view: &mut ViewState,
) -> Option<RowAction> {
    let mut action = None;
    let editing = view.renaming == Some((is_base, index));
    ui.horizontal(|ui| {
        if editing {
            let r = ui.text_edit_singleline(&mut file.label);
            if r.lost_focus() || ui.input(|i| i.key_pressed(egui::Key::Enter)) {
                view.renaming = None;
            } else {
                r.request_focus();
            }
        } else {
            let ok = file.is_ok();
            let mark = if ok { "✔" } else { "⚠" };
            let color = if ok {
                ui.visuals().widgets.noninteractive.fg_stroke.color
            } else {
                ui.visuals().error_fg_color
            };
            ui.label(RichText::new(mark).color(color));
            ui.label(RichText::new(&file.label).strong())
                .on_hover_text(file.path.display().to_string());
        }
        // The buttons sit at the row's right edge but are made left to right, so that Tab
        // visits them in the order they read (rename, move up, remove): their width is the one
        // measured on the previous frame (at first a generous guess, so the row never grows the
        // panel; that frame is discarded).
        let width_id = egui::Id::unique(("input-row-buttons", is_base, index));
        let width: f32 = ui.ctx().data(|d| d.get_temp(width_id)).unwrap_or(120.0);
        ui.add_space((ui.available_width() - width).max(0.0));
        let buttons = ui.horizontal(|ui| {
            if ui.small_button("✏").on_hover_text("Rename").clicked() {
                view.renaming = Some((is_base, index));
            }
            if !is_base {
                if index > 0 && ui.small_button("⏶").on_hover_text("Move up").clicked() {
                    action = Some(RowAction::Up);
                }
                if ui.small_button("🗑").on_hover_text("Remove this expert").clicked() {
                    action = Some(RowAction::Remove);
                }
            }
        });
        let measured = buttons.response.rect.width();
        if (measured - width).abs() > 0.5 {
            ui.ctx().data_mut(|d| d.insert_temp(width_id, measured));
            ui.ctx().request_discard("the input row's buttons were measured");
        }
    })
    .response
    .context_menu(|ui| {
        if !is_base && ui.button("Make this the base").clicked() {
            action = Some(RowAction::MakeBase);
            ui.close();
        }
        if ui.button("Copy path").clicked() {
            ui.ctx().copy_text(file.path.display().to_string());
            ui.close();
        }
    });
    ui.indent(("input", is_base, index), |ui| {
        match &file.summary {
            Ok(s) => {
                let files = if s.files > 1 {
                    format!(" in {} shards", s.files)
                } else {
                    String::new()
                };
                ui.label(
                    RichText::new(format!(
                        "{}{files} · {} · {} tensors",
                        human_bytes(s.bytes),
                        s.dtypes,
                        s.tensors
                    ))
                    .weak(),
                );
            }
            Err(e) => {
                ui.label(RichText::new(e.to_string()).color(ui.visuals().error_fg_color));
            }
        }
        if let Some(line) = bench.and_then(|b| accuracy_line(b, file, is_base)) {
            ui.label(RichText::new(line).weak());
        }
        for p in &file.problems {
            ui.label(RichText::new(p).color(ui.visuals().error_fg_color).small());
        }
    });
    action
}

/// The panel.
pub fn inputs_ui(ui: &mut Ui, doc: &mut Document, view: &mut ViewState) {
    ui.heading("Inputs");
    if let Some(b) = &doc.benchmark {
        ui.label(
            RichText::new(format!(
                "Benchmark: {} demo, seed {}, {} tasks",
                b.manifest.arch.to_string().to_uppercase(),
                b.manifest.seed,
                b.manifest.tasks.len()
            ))
            .weak(),
        )
        .on_hover_text(b.dir.display().to_string());
    }
    if let Some(build) = &doc.build {
        let (elapsed, left) = build.live.times();
        ui.label(format!(
            "Building {} (once; it is cached for the next launches)",
            build.what.title()
        ));
        ui.add(
            egui::ProgressBar::new(build.live.fraction)
                .text(build.live.stage.clone())
                .animate(true),
        );
        ui.horizontal(|ui| {
            ui.label(RichText::new(crate::text::time_text(elapsed, left)).weak());
            if ui.button("Cancel build").clicked() {
                doc.cancel_current();
            }
        });
    }
    ui.separator();
    let bench = doc.benchmark.clone();
    egui::ScrollArea::vertical().auto_shrink([false, false]).show(ui, |ui| {
        ui.label(RichText::new("Base").strong());
        let mut changed = false;
        match &mut doc.inputs.base {
            Some(base) => {
                let before = base.label.clone();
                input_row(ui, base, bench.as_ref(), true, 0, view);
                changed |= base.label != before;
            }
            None => {
                ui.label(RichText::new("No base: methods that need one will say so.").weak());
            }
        }
        ui.horizontal(|ui| {
            if ui.button("Set base…").clicked() {
                dialogs::pick_base(doc);
            }
            if doc.inputs.base.is_some() && ui.button("Clear base").clicked() {
                doc.inputs.base = None;
                doc.inputs.recheck();
                doc.dirty = true;
            }
        });
        ui.add_space(6.0);
        ui.label(RichText::new(format!("Experts ({})", doc.inputs.experts.len())).strong());
        let mut act = None;
        for i in 0..doc.inputs.experts.len() {
            let before = doc.inputs.experts[i].label.clone();
            if let Some(a) = input_row(ui, &mut doc.inputs.experts[i], bench.as_ref(), false, i, view) {
                act = Some((i, a));
            }
            changed |= doc.inputs.experts[i].label != before;
        }
        if changed {
            doc.dirty = true;
        }
        if let Some((i, a)) = act {
            match a {
                RowAction::Up => doc.inputs.move_up(i),
                RowAction::Remove => doc.inputs.remove_expert(i),
                RowAction::MakeBase => {
                    let e = doc.inputs.experts.remove(i);
                    if let Some(old) = doc.inputs.base.replace(e) {
                        doc.inputs.experts.insert(i, old);
                    }
                    doc.inputs.recheck();
                }
            }
            view.renaming = None;
            doc.dirty = true;
        }
        ui.horizontal(|ui| {
            if ui.button("Add experts…").on_hover_text("Ctrl+E").clicked() {
                dialogs::pick_experts(doc);
            }
            if ui
                .button("Add folder…")
                .on_hover_text("A sharded checkpoint: a folder with model.safetensors.index.json")
                .clicked()
            {
                dialogs::pick_expert_folder(doc);
            }
            if !doc.inputs.experts.is_empty() && ui.button("Clear").clicked() {
                doc.inputs.experts.clear();
                doc.inputs.recheck();
                doc.dirty = true;
            }
        });
        ui.label(
            RichText::new("Drop .safetensors files or shard folders on the window to add experts.")
                .weak()
                .small(),
        );
    });
}
