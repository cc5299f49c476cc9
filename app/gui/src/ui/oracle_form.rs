//! The analysis panel's form for seed 004's oracle on the text benchmark: train texts per task,
//! learning rates, epoch counts and precision, as `mergescope analyze oracle`'s `--examples`,
//! `--lr`, `--epochs` and `--precision` take them, with the same defaults, parsed and checked
//! by the lab's one door (`OracleText::settings`), so a bad value reads as the CLI's message.
//! The fields are disabled while the oracle runs; Run starts it again with them.

use crate::analysis::ViewKind;
use crate::document::Document;
use crate::ui::ViewState;
use egui::RichText;
use mergescope_lab::text_bench::oracle::{OracleSettings, OracleText, Precision};

/// The fields, the build they run on, Run and Defaults; a message under them when a field is
/// wrong (Run is then disabled).
pub fn oracle_controls(ui: &mut egui::Ui, doc: &mut Document, view: &ViewState) {
    let text = match &doc.analysis.inputs.text_build {
        Some(dir) => format!("On the text build '{}' (`mergescope analyze oracle`)", dir.display()),
        None => "No text benchmark build: Benchmark > Build text benchmark makes one".to_owned(),
    };
    ui.label(RichText::new(text).weak().small());
    let running = doc.analysis.running();
    let mut run = false;
    let checked = doc.analysis.options.oracle.settings(OracleSettings::default());
    ui.add_enabled_ui(!running, |ui| {
        ui.horizontal_wrapped(|ui| {
            let form = &mut doc.analysis.options.oracle;
            field(
                ui,
                "train texts / task",
                "--examples: the first N train texts of each task, the full batch of every gradient step",
                &mut form.examples,
                40.0,
            );
            field(
                ui,
                "learning rates η",
                "--lr: the task runs' step sizes, separated by commas (the multi-task run steps αη)",
                &mut form.lrs,
                170.0,
            );
            field(
                ui,
                "epochs",
                "--epochs: epoch counts E, one full-batch step each, separated by commas",
                &mut form.epochs,
                70.0,
            );
            let hover = "--precision: the type gradient descent runs in (f32 rounding hides the η² gap)";
            ui.label("precision").on_hover_text(hover);
            for p in Precision::ALL {
                ui.selectable_value(&mut form.precision, p, p.name())
                    .on_hover_text(hover);
            }
            run = ui
                .add_enabled(checked.is_ok(), egui::Button::new("▶ Run oracle"))
                .on_hover_text("Fine-tunes MiniLM with these settings (minutes on a CPU)")
                .clicked();
            if ui
                .add_enabled(*form != OracleText::default(), egui::Button::new("Defaults"))
                .on_hover_text("The CLI's defaults")
                .clicked()
            {
                *form = OracleText::default();
            }
        });
    });
    if let Err(e) = &checked {
        ui.label(RichText::new(e.to_string()).color(ui.visuals().error_fg_color));
    }
    if run {
        doc.analyze(ViewKind::Oracle, &view.selected);
    }
}

/// A labelled one-line text field of `width` points.
fn field(ui: &mut egui::Ui, name: &str, hover: &str, value: &mut String, width: f32) {
    let label = ui.label(name).on_hover_text(hover);
    ui.add(egui::TextEdit::singleline(value).desired_width(width))
        .labelled_by(label.id)
        .on_hover_text(hover);
}
