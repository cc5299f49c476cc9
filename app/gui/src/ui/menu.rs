//! The menu bar: draws the [`Action`] table's sections (each entry with its shortcut) and the lists
//! that have no key (recent projects, built demos). The Benchmark menu builds the image demos
//! and the text benchmark. The shortcuts themselves are applied by
//! [`actions::apply_shortcuts`](crate::ui::actions::apply_shortcuts).

use crate::settings::Theme;
use crate::ui::actions::{Action, MenuTarget, ProjectCommand};
use egui::Ui;
use std::path::PathBuf;

/// The menu bar.
pub fn menu_bar(ui: &mut Ui, mut app: MenuTarget<'_>) -> Option<ProjectCommand> {
    let app = &mut app;
    let mut command = None;
    // Draws the entries of `actions`; a click's project command is kept for the window.
    let mut items = |ui: &mut Ui, app: &mut MenuTarget<'_>, actions: &[Action]| {
        for a in actions {
            if let Some(c) = a.menu_item(ui, app) {
                command = Some(c);
            }
        }
    };
    let mut chosen: Option<PathBuf> = None;
    egui::MenuBar::new().ui(ui, |ui| {
        ui.menu_button("File", |ui| {
            items(ui, app, &Action::FILE_PROJECT);
            ui.menu_button("Recent projects", |ui| {
                if app.settings.recent.is_empty() {
                    ui.label("none yet");
                }
                for p in &app.settings.recent {
                    if ui.button(p.display().to_string()).clicked() {
                        chosen = Some(p.clone());
                    }
                }
            });
            items(ui, app, &Action::FILE_SAVE);
            ui.separator();
            items(ui, app, &Action::FILE_INPUTS);
            ui.separator();
            items(ui, app, &Action::FILE_QUIT);
        });
        ui.menu_button("Run", |ui| {
            items(ui, app, &Action::RUN);
        });
        ui.menu_button("Benchmark", |ui| {
            items(ui, app, &Action::BENCHMARK_BUILDS);
            ui.separator();
            built_demos(ui, app);
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
            items(ui, app, &Action::VIEW_THEME);
            ui.separator();
            items(ui, app, &Action::VIEW_PANELS);
            ui.separator();
            items(ui, app, &Action::VIEW_WINDOWS);
        });
        ui.menu_button("Help", |ui| {
            items(ui, app, &Action::HELP);
        });
    });
    if let Some(p) = chosen {
        command = Some(ProjectCommand::Open(p));
    }
    command
}

/// The demos built in the cache, each a button that makes it the window's benchmark.
fn built_demos(ui: &mut Ui, app: &mut MenuTarget<'_>) {
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
}
