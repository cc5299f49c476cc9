//! The application: a [`Document`] (the document), [`Settings`] (persisted) and [`ViewState`]
//! (this window), laid out as menu bar, Inputs | Results | Method, log and status bar.

use crate::document::{Document, DocumentConfig, Level};
use crate::settings::Settings;
use crate::ui::{
    ViewState, actions, analysis_view, dialogs, experiments_view, inputs_view, log_view, menu, method_view,
    results_view,
};
use egui::{RichText, Ui};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The mergescope window's state.
pub struct MergescopeApp {
    /// The document: inputs, method, runs.
    pub doc: Document,
    /// What is remembered between launches.
    pub settings: Settings,
    /// Transient window state.
    pub view: ViewState,
    title: String,
    applied_theme: Option<crate::settings::Theme>,
}

impl MergescopeApp {
    /// A new window over a new session; the worker thread wakes `ctx` on progress.
    pub fn new(ctx: &egui::Context, settings: Settings, config: &DocumentConfig) -> MergescopeApp {
        // Scroll bars beside the content, never floating over it: a floating bar lay over the
        // only row of a one-row table and took the click meant for its checkbox.
        ctx.all_styles_mut(|style| style.spacing.scroll = egui::style::ScrollStyle::solid());
        let repaint = ctx.clone();
        let mut doc = Document::new(config, Arc::new(move || repaint.request_repaint()));
        if method_view::device_compiled(settings.device) {
            doc.device = settings.device;
        }
        doc.experiments.restore_executor(&settings.sweep_executor);
        MergescopeApp {
            doc,
            settings,
            view: ViewState::default(),
            title: String::new(),
            applied_theme: None,
        }
    }

    /// Builds the app from eframe's creation context, restoring the settings.
    pub fn from_creation_context(cc: &eframe::CreationContext<'_>, config: &DocumentConfig) -> MergescopeApp {
        let settings: Settings = cc
            .storage
            .and_then(|s| eframe::get_value(s, Settings::KEY))
            .unwrap_or_default();
        MergescopeApp::new(&cc.egui_ctx, settings, config)
    }

    /// Asks for a project file and opens it.
    pub fn open_project_dialog(&mut self) {
        if let Some(p) = dialogs::pick_project_to_open() {
            self.open_project(&p);
        }
    }

    /// Opens the project at `path`.
    pub fn open_project(&mut self, path: &Path) {
        match self.doc.open_project(path) {
            Ok(()) => {
                self.settings.remember(path);
                self.view.selected.clear();
            }
            Err(e) => {
                self.doc.note(Level::Error, e.to_string());
                self.view.toast(e.to_string());
            }
        }
    }

    /// Saves the project (asking where when it has no file yet, or when `save_as`).
    pub fn save_project(&mut self, save_as: bool) {
        let path = match (&self.doc.project_path, save_as) {
            (Some(p), false) => Some(p.clone()),
            _ => dialogs::pick_project_to_save(),
        };
        if let Some(p) = path {
            match self.doc.save_project(&p) {
                Ok(()) => {
                    self.settings.remember(&p);
                    self.view.toast("project saved");
                }
                Err(e) => {
                    self.doc.note(Level::Error, e.to_string());
                    self.view.toast(e.to_string());
                }
            }
        }
    }

    fn take_dropped_files(&mut self, ui: &Ui) {
        let dropped = ui.input(|i| i.raw.dropped_files.clone());
        for f in dropped {
            dialogs::add_path(&mut self.doc, &mut self.view, f.path());
        }
    }

    fn update_title(&mut self, ui: &Ui) {
        let name = self
            .doc
            .project_path
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "untitled".into());
        let title = format!("mergescope: {name}{}", if self.doc.dirty { " *" } else { "" });
        if title != self.title {
            ui.send_viewport_cmd(egui::ViewportCommand::Title(title.clone()));
            self.title = title;
        }
    }

    /// Asks before closing a window whose merges are not saved in a project.
    fn guard_close(&mut self, ui: &mut Ui) {
        let unsaved = self.doc.dirty && !self.doc.runs.is_empty();
        if ui.input(|i| i.viewport().close_requested()) && unsaved && !self.view.closing {
            ui.send_viewport_cmd(egui::ViewportCommand::CancelClose);
            self.view.confirm_close = true;
        }
        if !self.view.confirm_close {
            return;
        }
        let n = self.doc.runs.len();
        let mut choice = None;
        egui::Modal::new(egui::Id::unique("confirm-close")).show(ui.ctx(), |ui| {
            ui.heading("Save the session before closing?");
            ui.label(format!(
                "{n} merges and their results are not saved in a project. Their files stay in the \
                 runs folder, but the table is lost unless you save the project."
            ));
            ui.horizontal(|ui| {
                if ui.button("Save project…").clicked() {
                    choice = Some(0);
                }
                if ui.button("Close without saving").clicked() {
                    choice = Some(1);
                }
                if ui.button("Cancel").clicked() {
                    choice = Some(2);
                }
            });
        });
        match choice {
            Some(0) => {
                self.save_project(false);
                if !self.doc.dirty {
                    self.view.closing = true;
                    ui.send_viewport_cmd(egui::ViewportCommand::Close);
                }
                self.view.confirm_close = false;
            }
            Some(1) => {
                self.view.closing = true;
                self.view.confirm_close = false;
                ui.send_viewport_cmd(egui::ViewportCommand::Close);
            }
            Some(_) => self.view.confirm_close = false,
            None => {}
        }
    }

    fn status_bar(&mut self, ui: &mut Ui) {
        ui.horizontal(|ui| {
            if self.doc.busy() {
                ui.spinner();
            }
            let n = self.doc.registry.plugins.len();
            ui.label(RichText::new(format!("{n} method{}", if n == 1 { "" } else { "s" })).weak());
            ui.separator();
            let running = self.doc.runs.iter().filter(|r| r.status.is_active()).count();
            ui.label(RichText::new(format!("{running} running or queued")).weak());
            ui.separator();
            if let Some(suite) = &self.doc.suite {
                let name = suite
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                ui.label(RichText::new(format!("evaluating with suite {name}")).weak())
                    .on_hover_text(suite.display().to_string());
                ui.separator();
            }
            if let Some(p) = self
                .doc
                .experiments
                .progress
                .as_ref()
                .filter(|_| self.doc.experiments.running())
            {
                let text = format!("sweep: {} / {} cells", p.cells_done, p.cells);
                if ui.button(text).on_hover_text("Show the Experiments window").clicked() {
                    self.doc.open_experiments();
                }
                ui.separator();
            }
            if let Some((msg, at)) = &self.view.message {
                let shown_for = Duration::from_secs(6);
                if at.elapsed() < shown_for {
                    ui.label(msg);
                    // Without input the window would not draw again, and the message would stay.
                    ui.ctx().request_repaint_after(shown_for - at.elapsed());
                } else {
                    self.view.message = None;
                }
            }
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                ui.toggle_value(&mut self.settings.show_log, "Log");
            });
        });
    }

    fn menu_target(&mut self) -> actions::MenuTarget<'_> {
        actions::MenuTarget {
            doc: &mut self.doc,
            settings: &mut self.settings,
            view: &mut self.view,
        }
    }

    /// Carries out what the menu or a shortcut asked of the project file.
    fn carry_out(&mut self, command: Option<actions::ProjectCommand>) {
        match command {
            Some(actions::ProjectCommand::OpenDialog) => self.open_project_dialog(),
            Some(actions::ProjectCommand::Open(p)) => self.open_project(&p),
            Some(actions::ProjectCommand::Save { choose_path }) => self.save_project(choose_path),
            None => {}
        }
    }

    /// Draws one frame (the eframe entry point and the tests call this).
    pub fn show(&mut self, ui: &mut Ui) {
        self.doc.pump();
        self.view.toast_new_errors(&self.doc.log);
        self.view.follow_run(&self.doc.runs);
        self.view.frames += 1;
        if self.applied_theme != Some(self.settings.theme) {
            ui.ctx().set_theme(self.settings.theme.preference());
            self.applied_theme = Some(self.settings.theme);
        }
        self.take_dropped_files(ui);
        let command = actions::apply_shortcuts(ui, &mut self.menu_target());
        self.carry_out(command);
        self.update_title(ui);

        let command = egui::Panel::top("menu")
            .show(ui, |ui| menu::menu_bar(ui, self.menu_target()))
            .inner;
        self.carry_out(command);
        egui::Panel::bottom("status").show(ui, |ui| self.status_bar(ui));
        if self.settings.show_log {
            egui::Panel::bottom("log")
                .resizable(true)
                .default_size(150.0)
                .show(ui, |ui| log_view::log_ui(ui, &self.doc));
        }
        egui::Panel::left("inputs")
            .default_size(300.0)
            .show(ui, |ui| inputs_view::inputs_ui(ui, &mut self.doc, &mut self.view));
        egui::Panel::right("method").default_size(310.0).show(ui, |ui| {
            egui::ScrollArea::vertical()
                .id_salt("method-scroll")
                .show(ui, |ui| method_view::method_ui(ui, &mut self.doc, &mut self.view));
        });
        egui::CentralPanel::default().show(ui, |ui| {
            if self.doc.analysis.open {
                // The results on top (drag their lower edge to share the column), the analysis
                // below them, never over the rows that feed it.
                let room = ui.available_height();
                egui::Panel::top("results-area")
                    .resizable(true)
                    .default_size((room * 0.4).max(120.0))
                    .size_range(120.0..=(room - 160.0).max(120.0))
                    .show(ui, |ui| results_view::results_ui(ui, &mut self.doc, &mut self.view));
                analysis_view::analysis_panel(ui, &mut self.doc, &mut self.view);
            } else {
                results_view::results_ui(ui, &mut self.doc, &mut self.view);
            }
        });

        let ctx = ui.ctx().clone();
        dialogs::approval_ui(&ctx, &mut self.doc, &mut self.view);
        dialogs::about_ui(&ctx, &mut self.view);
        experiments_view::experiments_window(&ctx, &mut self.doc);
        let mut open = self.view.shortcuts;
        egui::Window::new("Keyboard shortcuts")
            .open(&mut open)
            .collapsible(false)
            .show(&ctx, |ui| {
                egui::Grid::new("shortcuts").show(ui, |ui| {
                    for action in actions::Action::ALL {
                        ui.label(RichText::new(ctx.format_shortcut(&action.shortcut())).monospace());
                        ui.label(action.description());
                        ui.end_row();
                    }
                });
            });
        self.view.shortcuts = open;
        self.guard_close(ui);
        self.settings.device = self.doc.device;
        self.settings.sweep_executor = self.doc.experiments.executor_settings();
        if self.doc.busy() || self.doc.experiments.running() {
            // Elapsed times tick even when no progress event comes.
            ctx.request_repaint_after(Duration::from_millis(250));
        }
    }
}

impl eframe::App for MergescopeApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, Settings::KEY, &self.settings);
    }
}
