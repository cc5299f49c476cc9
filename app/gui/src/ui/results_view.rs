//! The central area: runs in progress (progress, stage, elapsed and remaining time, Cancel),
//! the results table of every merge of the session (sortable, selectable), a per-task chart
//! of the selected merges against the experts, and the details of one run.

use crate::document::Document;
use crate::runs::{RunRecord, RunStatus, SortKey, sort_runs, task_names};
use crate::text::time_text;
use crate::ui::{ViewState, dialogs};
use egui::{RichText, Ui};
use egui_plot::{Bar, BarChart, Legend, Plot};

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}", 100.0 * v)).unwrap_or_else(|| "–".into())
}

/// Runs queued or in progress.
fn active_ui(ui: &mut Ui, doc: &mut Document) {
    let mut cancel = None;
    for r in doc.runs.iter().filter(|r| r.status.is_active()) {
        ui.horizontal(|ui| {
            ui.label(RichText::new(r.title()).strong());
            ui.label(RichText::new(r.params_summary()).weak());
            match (&r.status, &r.live) {
                (RunStatus::Running, Some(live)) => {
                    let (elapsed, left) = live.times();
                    ui.add(
                        egui::ProgressBar::new(live.fraction)
                            .desired_width(220.0)
                            .text(live.stage.clone())
                            .animate(true),
                    );
                    ui.label(RichText::new(time_text(elapsed, left)).weak());
                }
                _ => {
                    ui.label(RichText::new("queued").weak());
                }
            }
            if ui
                .button("Cancel")
                .on_hover_text("Esc cancels the running merge")
                .clicked()
            {
                cancel = Some(r.id);
            }
        });
    }
    if let Some(id) = cancel {
        doc.cancel(id);
    }
}

fn header(ui: &mut Ui, view: &mut ViewState, text: &str, key: SortKey) {
    let arrow = if view.sort == key {
        if view.descending { " ⏷" } else { " ⏶" }
    } else {
        ""
    };
    if ui
        .add(egui::Button::new(RichText::new(format!("{text}{arrow}")).strong()).frame(false))
        .on_hover_text("Sort by this column")
        .clicked()
    {
        if view.sort == key {
            view.descending = !view.descending;
        } else {
            view.sort = key;
            view.descending = !matches!(view.sort, SortKey::Id | SortKey::Method);
        }
    }
}

fn status_cell(ui: &mut Ui, r: &RunRecord) {
    let text = r.status.label();
    match r.status {
        RunStatus::Failed => {
            let msg = r.error.clone().unwrap_or_default();
            let text = match &r.error_kind {
                Some(kind) => format!("failed: {kind} ℹ"),
                None => "failed ℹ".to_owned(),
            };
            ui.label(RichText::new(text).color(ui.visuals().error_fg_color))
                .on_hover_text(msg);
        }
        RunStatus::Done if r.eval.is_none() => {
            let note = r.eval_note.clone().unwrap_or_default();
            ui.label("done ℹ").on_hover_text(note);
        }
        _ => {
            ui.label(text);
        }
    }
}

/// The results table.
fn table_ui(ui: &mut Ui, doc: &mut Document, view: &mut ViewState) {
    let mut rows: Vec<&RunRecord> = doc.runs.iter().filter(|r| !r.status.is_active()).collect();
    if rows.is_empty() {
        ui.label(RichText::new("No merges yet: pick a method and press Run merge.").weak());
        return;
    }
    sort_runs(&mut rows, &view.sort, view.descending);
    let tasks = task_names(rows.iter().copied());
    egui::ScrollArea::horizontal().id_salt("results-scroll").show(ui, |ui| {
        egui::Grid::new("results")
            .striped(true)
            .spacing([12.0, 4.0])
            .show(ui, |ui| {
                ui.label("");
                header(ui, view, "Run", SortKey::Id);
                header(ui, view, "Method", SortKey::Method);
                ui.label(RichText::new("Parameters").strong());
                ui.label(RichText::new("Status").strong());
                header(ui, view, "Time s", SortKey::Seconds);
                header(ui, view, "Mean acc %", SortKey::MeanAccuracy);
                header(ui, view, "Norm. acc %", SortKey::MeanNormalized);
                for t in &tasks {
                    header(ui, view, t, SortKey::Task(t.clone()));
                }
                ui.end_row();
                if let Some(b) = &doc.benchmark {
                    let m = &b.manifest;
                    for (name, get) in [
                        (
                            "base",
                            (|t: &mergescope_lab::demo::BenchmarkTask| t.base_accuracy.test) as fn(&_) -> f64,
                        ),
                        ("experts", |t| t.expert_accuracy.test),
                    ] {
                        ui.label("");
                        ui.label(RichText::new(name).italics().weak());
                        ui.label(RichText::new("reference").italics().weak());
                        ui.label("");
                        ui.label("");
                        ui.label("");
                        let n = m.tasks.len().max(1) as f64;
                        let mean = m.tasks.iter().map(get).sum::<f64>() / n;
                        ui.label(RichText::new(pct(Some(mean))).italics().weak());
                        let norm = (name == "experts").then_some(1.0);
                        ui.label(RichText::new(pct(norm)).italics().weak());
                        for t in &tasks {
                            let v = m.tasks.iter().find(|x| &x.name == t).map(get);
                            ui.label(RichText::new(pct(v)).italics().weak());
                        }
                        ui.end_row();
                    }
                }
                for r in &rows {
                    let mut sel = view.selected.contains(&r.id);
                    if ui
                        .checkbox(&mut sel, "")
                        .on_hover_text("Select to compare, save or copy")
                        .changed()
                    {
                        if sel {
                            view.selected.insert(r.id);
                        } else {
                            view.selected.remove(&r.id);
                        }
                    }
                    ui.label(format!("#{}", r.id));
                    ui.label(&r.method);
                    ui.label(r.params_summary());
                    status_cell(ui, r);
                    ui.label(r.seconds.map(|s| format!("{s:.2}")).unwrap_or_else(|| "–".into()));
                    ui.label(RichText::new(pct(r.mean_accuracy())).strong());
                    ui.label(RichText::new(pct(r.mean_normalized())).strong());
                    for t in &tasks {
                        ui.label(pct(r.task_accuracy(t)));
                    }
                    ui.end_row();
                }
            });
    });
}

/// Buttons acting on the selection.
fn actions_ui(ui: &mut Ui, doc: &mut Document, view: &mut ViewState) {
    let chosen: Vec<u64> = doc
        .runs
        .iter()
        .filter(|r| view.selected.contains(&r.id))
        .map(|r| r.id)
        .collect();
    let one = (chosen.len() == 1).then(|| chosen[0]);
    ui.horizontal(|ui| {
        let done = one
            .and_then(|id| doc.run_record(id))
            .is_some_and(|r| r.status == RunStatus::Done);
        if ui
            .add_enabled(done, egui::Button::new("Save merge…"))
            .on_hover_text("Save the selected merge as .safetensors, with its recipe")
            .on_disabled_hover_text("Select one finished merge")
            .clicked()
            && let Some(id) = one
        {
            dialogs::save_merge(doc, id);
        }
        if ui
            .add_enabled(one.is_some(), egui::Button::new("Copy CLI command"))
            .on_hover_text("The `mergescope merge` command that repeats the selected run")
            .on_disabled_hover_text("Select one run")
            .clicked()
            && let Some(r) = one.and_then(|id| doc.run_record(id))
        {
            ui.ctx().copy_text(crate::runs::cli_command(r));
            view.toast("CLI command copied");
        }
        if ui
            .add_enabled(!doc.runs.is_empty(), egui::Button::new("Export CSV…"))
            .clicked()
        {
            dialogs::export_csv(doc);
        }
        if ui
            .add_enabled(!chosen.is_empty(), egui::Button::new("Clear selection"))
            .clicked()
        {
            view.selected.clear();
        }
    });
    if !doc.analysis.open {
        ui.horizontal_wrapped(|ui| crate::ui::analysis_view::open_buttons(ui, doc, view));
    }
}

/// Grouped bars: accuracy per task of each selected, evaluated merge, with the experts.
fn chart_ui(ui: &mut Ui, doc: &Document, view: &ViewState) {
    let runs: Vec<&RunRecord> = doc
        .runs
        .iter()
        .filter(|r| view.selected.contains(&r.id) && r.eval.is_some())
        .collect();
    if runs.is_empty() {
        return;
    }
    let tasks = task_names(runs.iter().copied());
    let series = runs.len() + usize::from(doc.benchmark.is_some());
    let width = 0.8 / series as f64;
    let mut charts = Vec::new();
    let mut k = 0usize;
    if let Some(b) = &doc.benchmark {
        let bars = tasks
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let acc = b.manifest.tasks.iter().find(|x| &x.name == t)?.expert_accuracy.test;
                Some(
                    Bar::new(i as f64 - 0.4 + width * 0.5, 100.0 * acc)
                        .width(width * 0.9)
                        .name(t),
                )
            })
            .collect();
        charts.push(BarChart::new("experts", bars).color(egui::Color32::GRAY));
        k += 1;
    }
    for r in &runs {
        let bars = tasks
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let acc = r.task_accuracy(t)?;
                let x = i as f64 - 0.4 + width * (k as f64 + 0.5);
                Some(Bar::new(x, 100.0 * acc).width(width * 0.9).name(t))
            })
            .collect();
        charts.push(BarChart::new(format!("{} ({})", r.title(), r.params_summary()), bars));
        k += 1;
    }
    let labels = tasks.clone();
    ui.label(RichText::new("Test accuracy per task (%)").strong());
    Plot::new("compare")
        .legend(Legend::default())
        .height(220.0)
        .include_y(0.0)
        // Headroom above 100 % for the legend, one line per series.
        .include_y(110.0 + 12.0 * series as f64)
        .allow_zoom(false)
        .allow_drag(false)
        .allow_scroll(false)
        .x_axis_formatter(move |mark, _| {
            let i = mark.value.round();
            if (mark.value - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .show(ui, |plot| {
            for c in charts {
                plot.bar_chart(c);
            }
        });
}

/// Details of the one selected run: output, parameters as resolved, log, error.
fn details_ui(ui: &mut Ui, doc: &Document, view: &ViewState) {
    if view.selected.len() != 1 {
        return;
    }
    let Some(r) = view.selected.iter().next().and_then(|id| doc.run_record(*id)) else {
        return;
    };
    egui::CollapsingHeader::new(format!("Details of {}", r.title()))
        .default_open(false)
        .show(ui, |ui| {
            ui.label(format!("Output: {}", r.output.display()));
            if !r.resolved.is_null() {
                ui.label(format!("Parameters as run: {}", r.resolved));
            }
            if let Some(d) = &r.device_used {
                ui.label(format!("Device: {d}"));
            }
            if let Some(e) = &r.error {
                ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
            }
            if let Some(n) = &r.eval_note {
                ui.label(RichText::new(n).weak());
            }
            for line in &r.log {
                ui.label(RichText::new(line).monospace().small());
            }
        });
}

/// The whole central area.
pub fn results_ui(ui: &mut Ui, doc: &mut Document, view: &mut ViewState) {
    egui::ScrollArea::vertical().id_salt("central").show(ui, |ui| {
        if doc.runs.iter().any(|r| r.status.is_active()) {
            ui.heading("Running");
            active_ui(ui, doc);
            ui.separator();
        }
        ui.heading("Results");
        actions_ui(ui, doc, view);
        table_ui(ui, doc, view);
        ui.add_space(8.0);
        // With the analysis panel open, its radar shows the selected merges per task; the bars
        // here would only push the rows out of the results' share of the column.
        if !doc.analysis.open {
            chart_ui(ui, doc, view);
        }
        details_ui(ui, doc, view);
    });
}
