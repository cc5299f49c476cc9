//! The menu bar and the keyboard shortcuts (the same actions). They act on the doc, the
//! settings and the view directly; what only the window can do (its project file) comes back as
//! a [`ProjectCommand`] for the window to carry out.

use crate::document::Document;
use crate::settings::{Settings, Theme};
use crate::ui::{ViewState, dialogs};
use egui::{Key, KeyboardShortcut, Modifiers, Ui};
use mergescope_lab::nn::Arch;
use std::path::PathBuf;

const OPEN: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::O);
const SAVE: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::S);
const ADD_EXPERTS: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::E);
const RUN: KeyboardShortcut = KeyboardShortcut::new(Modifiers::COMMAND, Key::Enter);
const CANCEL: KeyboardShortcut = KeyboardShortcut::new(Modifiers::NONE, Key::Escape);

/// What the menu or a shortcut asks of the window's project file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProjectCommand {
    /// Ask for a project file and open it.
    OpenDialog,
    /// Open this project file.
    Open(PathBuf),
    /// Save the project (`choose_path`: ask where, as "Save as" does).
    Save {
        /// Ask for a new path even when the project has one.
        choose_path: bool,
    },
}

/// What the menu and the shortcuts change.
pub struct MenuTarget<'a> {
    /// The document.
    pub doc: &'a mut Document,
    /// The remembered settings.
    pub settings: &'a mut Settings,
    /// The window's transient state.
    pub view: &'a mut ViewState,
}

/// Applies the keyboard shortcuts pressed this frame.
pub fn shortcuts(ui: &mut Ui, app: MenuTarget<'_>) -> Option<ProjectCommand> {
    let (open, save, add, run, cancel) = ui.input_mut(|i| {
        (
            i.consume_shortcut(&OPEN),
            i.consume_shortcut(&SAVE),
            i.consume_shortcut(&ADD_EXPERTS),
            i.consume_shortcut(&RUN),
            i.consume_shortcut(&CANCEL),
        )
    });
    let mut command = None;
    if open {
        command = Some(ProjectCommand::OpenDialog);
    }
    if save {
        command = Some(ProjectCommand::Save { choose_path: false });
    }
    if add {
        dialogs::pick_experts(app.doc);
    }
    if run {
        app.view.start_run(app.doc);
    }
    if cancel && app.view.approval.is_none() {
        app.doc.cancel_current();
    }
    command
}

/// The menu bar.
pub fn menu_bar(ui: &mut Ui, app: MenuTarget<'_>) -> Option<ProjectCommand> {
    let mut command = None;
    egui::MenuBar::new().ui(ui, |ui| {
        ui.menu_button("File", |ui| {
            if ui
                .add(egui::Button::new("Open project…").shortcut_text(ui.ctx().format_shortcut(&OPEN)))
                .clicked()
            {
                command = Some(ProjectCommand::OpenDialog);
            }
            ui.menu_button("Recent projects", |ui| {
                if app.settings.recent.is_empty() {
                    ui.label("none yet");
                }
                let mut chosen: Option<PathBuf> = None;
                for p in &app.settings.recent {
                    if ui.button(p.display().to_string()).clicked() {
                        chosen = Some(p.clone());
                    }
                }
                if let Some(p) = chosen {
                    command = Some(ProjectCommand::Open(p));
                }
            });
            if ui
                .add(egui::Button::new("Save project").shortcut_text(ui.ctx().format_shortcut(&SAVE)))
                .clicked()
            {
                command = Some(ProjectCommand::Save { choose_path: false });
            }
            if ui.button("Save project as…").clicked() {
                command = Some(ProjectCommand::Save { choose_path: true });
            }
            ui.separator();
            if ui
                .button("Open recipe…")
                .on_hover_text(
                    "A mergescope recipe (.toml) or a mergekit configuration (.yml): its inputs, method and parameters",
                )
                .clicked()
            {
                dialogs::pick_recipe(app.doc);
            }
            if ui.button("Set base…").clicked() {
                dialogs::pick_base(app.doc);
            }
            if ui
                .add(egui::Button::new("Add experts…").shortcut_text(ui.ctx().format_shortcut(&ADD_EXPERTS)))
                .clicked()
            {
                dialogs::pick_experts(app.doc);
            }
            if ui.button("Add sharded expert (folder)…").clicked() {
                dialogs::pick_expert_folder(app.doc);
            }
            if ui.button("Load plugin…").clicked() {
                dialogs::pick_plugin(app.doc, app.view);
            }
            if ui
                .button("Open suite…")
                .on_hover_text(
                    "Evaluate merges with a suite file: your model family (BERT, CLIP, causal LM) or your own command",
                )
                .clicked()
            {
                dialogs::pick_suite(app.doc);
            }
            ui.separator();
            if ui.button("Quit").clicked() {
                ui.send_viewport_cmd(egui::ViewportCommand::Close);
            }
        });
        ui.menu_button("Run", |ui| {
            if ui
                .add(egui::Button::new("Run merge").shortcut_text(ui.ctx().format_shortcut(&RUN)))
                .clicked()
            {
                app.view.start_run(app.doc);
            }
            if ui
                .add(egui::Button::new("Cancel running").shortcut_text("Esc"))
                .clicked()
            {
                app.doc.cancel_current();
            }
        });
        ui.menu_button("Benchmark", |ui| {
            for arch in Arch::ALL {
                if ui
                    .button(format!("Build {} demo", arch.to_string().to_uppercase()))
                    .clicked()
                {
                    app.doc.build_demo(arch, 0);
                }
            }
            ui.separator();
            let built = mergescope_lab::demo::demos_in_cache().unwrap_or_default();
            if built.is_empty() {
                ui.label("no demo built yet");
            }
            for b in built {
                let label = format!(
                    "Use {} seed {}",
                    b.manifest.arch.to_string().to_uppercase(),
                    b.manifest.seed
                );
                let outdated = mergescope_lab::demo::outdated_reason(&b);
                let mut button = ui.add_enabled(outdated.is_none(), egui::Button::new(label));
                if let Some(why) = outdated {
                    button = button.on_disabled_hover_text(why);
                }
                if button.clicked() {
                    app.doc.use_benchmark(b);
                }
            }
        });
        ui.menu_button("View", |ui| {
            for (t, label) in [
                (Theme::System, "System theme"),
                (Theme::Light, "Light"),
                (Theme::Dark, "Dark"),
            ] {
                if ui.radio(app.settings.theme == t, label).clicked() {
                    app.settings.theme = t;
                }
            }
            ui.separator();
            ui.checkbox(&mut app.settings.show_log, "Log panel");
            ui.separator();
            if ui
                .button("Experiments: fine-tuning sweeps…")
                .on_hover_text("Seed 002's sweeps: fine-tune, merge, evaluate and fit the scaling laws")
                .clicked()
            {
                app.doc.open_experiments();
            }
        });
        ui.menu_button("Help", |ui| {
            if ui.button("Keyboard shortcuts").clicked() {
                app.view.shortcuts = true;
            }
            if ui.button("About mergescope").clicked() {
                app.view.about = true;
            }
        });
    });
    command
}
