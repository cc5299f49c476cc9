//! Every action of the menu bar, with its shortcut: one table that the menu draws, the keyboard
//! applies and Help > Keyboard shortcuts lists, so the three cannot disagree. Choices from lists
//! (recent projects, built demos) are the only menu entries without a key.

use crate::document::Document;
use crate::settings::{Settings, Theme};
use crate::ui::{ViewState, dialogs};
use egui::{Key, KeyboardShortcut, Modifiers, Ui};
use mergescope_lab::nn::Arch;
use mergescope_lab::text_bench::TextBuildRequest;
use std::path::PathBuf;

/// What an action asks of the window's project file (only the window can do that).
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

/// What the actions change.
pub struct MenuTarget<'a> {
    /// The document.
    pub doc: &'a mut Document,
    /// The remembered settings.
    pub settings: &'a mut Settings,
    /// The window's transient state.
    pub view: &'a mut ViewState,
}

/// One thing the user can ask of the window from the menu or the keyboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open a project file.
    OpenProject,
    /// Save the project.
    SaveProject,
    /// Save the project under a new name.
    SaveProjectAs,
    /// Open a mergescope or mergekit recipe.
    OpenRecipe,
    /// Choose the base checkpoint.
    SetBase,
    /// Add expert checkpoints.
    AddExperts,
    /// Add a sharded expert (a folder).
    AddExpertFolder,
    /// Load a method plugin.
    LoadPlugin,
    /// Open a suite file.
    OpenSuite,
    /// Close the window.
    Quit,
    /// Queue a merge with the form's method and parameters.
    RunMerge,
    /// Close the dialog on top, else cancel the running merge.
    Escape,
    /// Build the demo benchmark of an architecture.
    BuildDemo(Arch),
    /// Build the text benchmark on a backbone folder the user chooses.
    BuildText,
    /// Show or hide the analysis panel.
    ToggleAnalysis,
    /// Show or hide the log panel.
    ToggleLog,
    /// Switch the theme: system, light, dark.
    CycleTheme,
    /// Open the Experiments window.
    Experiments,
    /// List the keyboard shortcuts.
    Shortcuts,
    /// Show the About box.
    About,
}

const fn key(modifiers: Modifiers, key: Key) -> KeyboardShortcut {
    KeyboardShortcut::new(modifiers, key)
}

const CMD_SHIFT: Modifiers = Modifiers::COMMAND.plus(Modifiers::SHIFT);

/// `sections` one after another, which must make exactly `N` actions (checked at compile time).
const fn concat<const N: usize>(sections: &[&[Action]]) -> [Action; N] {
    let mut out = [Action::About; N];
    let mut n = 0;
    let mut s = 0;
    while s < sections.len() {
        let mut i = 0;
        while i < sections[s].len() {
            out[n] = sections[s][i];
            n += 1;
            i += 1;
        }
        s += 1;
    }
    assert!(n == N, "the menus' sections do not make Action::ALL");
    out
}

impl Action {
    /// File: the project file (the recent projects follow).
    pub const FILE_PROJECT: [Action; 1] = [Action::OpenProject];
    /// File: saving the project.
    pub const FILE_SAVE: [Action; 2] = [Action::SaveProject, Action::SaveProjectAs];
    /// File: the merge's inputs.
    pub const FILE_INPUTS: [Action; 6] = [
        Action::OpenRecipe,
        Action::SetBase,
        Action::AddExperts,
        Action::AddExpertFolder,
        Action::LoadPlugin,
        Action::OpenSuite,
    ];
    /// File: the last entry.
    pub const FILE_QUIT: [Action; 1] = [Action::Quit];
    /// Run.
    pub const RUN: [Action; 2] = [Action::RunMerge, Action::Escape];
    /// Benchmark: the builds (every demo architecture, then the text benchmark; the built demos
    /// follow).
    pub const BENCHMARK_BUILDS: [Action; 4] = [
        Action::BuildDemo(Arch::ALL[0]),
        Action::BuildDemo(Arch::ALL[1]),
        Action::BuildDemo(Arch::ALL[2]),
        Action::BuildText,
    ];
    /// View: the theme (after the theme's radio buttons).
    pub const VIEW_THEME: [Action; 1] = [Action::CycleTheme];
    /// View: the panels.
    pub const VIEW_PANELS: [Action; 2] = [Action::ToggleAnalysis, Action::ToggleLog];
    /// View: the windows.
    pub const VIEW_WINDOWS: [Action; 1] = [Action::Experiments];
    /// Help.
    pub const HELP: [Action; 2] = [Action::Shortcuts, Action::About];

    /// Every action, in the order of the menus (Help > Keyboard shortcuts lists them so): the
    /// menus' sections above, which the menu bar draws.
    pub const ALL: [Action; 22] = concat(&[
        &Action::FILE_PROJECT,
        &Action::FILE_SAVE,
        &Action::FILE_INPUTS,
        &Action::FILE_QUIT,
        &Action::RUN,
        &Action::BENCHMARK_BUILDS,
        &Action::VIEW_THEME,
        &Action::VIEW_PANELS,
        &Action::VIEW_WINDOWS,
        &Action::HELP,
    ]);

    /// The key that performs the action.
    pub fn shortcut(self) -> KeyboardShortcut {
        match self {
            Action::OpenProject => key(Modifiers::COMMAND, Key::O),
            Action::SaveProject => key(Modifiers::COMMAND, Key::S),
            Action::SaveProjectAs => key(CMD_SHIFT, Key::S),
            Action::OpenRecipe => key(CMD_SHIFT, Key::O),
            Action::SetBase => key(Modifiers::COMMAND, Key::B),
            Action::AddExperts => key(Modifiers::COMMAND, Key::E),
            Action::AddExpertFolder => key(CMD_SHIFT, Key::E),
            Action::LoadPlugin => key(Modifiers::COMMAND, Key::P),
            Action::OpenSuite => key(Modifiers::COMMAND, Key::T),
            Action::Quit => key(Modifiers::COMMAND, Key::Q),
            Action::RunMerge => key(Modifiers::COMMAND, Key::Enter),
            Action::Escape => key(Modifiers::NONE, Key::Escape),
            Action::BuildDemo(arch) => {
                let at = Arch::ALL.iter().position(|a| *a == arch).unwrap_or(0);
                key(Modifiers::COMMAND, [Key::Num1, Key::Num2, Key::Num3][at.min(2)])
            }
            Action::BuildText => key(Modifiers::COMMAND, Key::Num4),
            Action::ToggleAnalysis => key(CMD_SHIFT, Key::A),
            Action::ToggleLog => key(Modifiers::COMMAND, Key::L),
            Action::CycleTheme => key(CMD_SHIFT, Key::T),
            Action::Experiments => key(CMD_SHIFT, Key::X),
            Action::Shortcuts => key(Modifiers::NONE, Key::F1),
            Action::About => key(Modifiers::SHIFT, Key::F1),
        }
    }

    /// The menu entry's text.
    pub fn label(self) -> String {
        match self {
            Action::OpenProject => "Open project…".into(),
            Action::SaveProject => "Save project".into(),
            Action::SaveProjectAs => "Save project as…".into(),
            Action::OpenRecipe => "Open recipe…".into(),
            Action::SetBase => "Set base…".into(),
            Action::AddExperts => "Add experts…".into(),
            Action::AddExpertFolder => "Add sharded expert (folder)…".into(),
            Action::LoadPlugin => "Load plugin…".into(),
            Action::OpenSuite => "Open suite…".into(),
            Action::Quit => "Quit".into(),
            Action::RunMerge => "Run merge".into(),
            Action::Escape => "Cancel running".into(),
            Action::BuildDemo(arch) => format!("Build {} demo", arch.to_string().to_uppercase()),
            Action::BuildText => "Build text benchmark…".into(),
            Action::ToggleAnalysis => "Analysis panel".into(),
            Action::ToggleLog => "Log panel".into(),
            Action::CycleTheme => "Next theme".into(),
            Action::Experiments => "Experiments: fine-tuning sweeps…".into(),
            Action::Shortcuts => "Keyboard shortcuts".into(),
            Action::About => "About mergescope".into(),
        }
    }

    /// What the action does, for the shortcuts list where the label is not enough.
    pub fn description(self) -> String {
        match self {
            Action::Escape => "Close the dialog on top; with none open, cancel the running merge".into(),
            Action::CycleTheme => "Switch the theme (system, light, dark)".into(),
            Action::ToggleAnalysis => "Show or hide the analysis panel".into(),
            Action::ToggleLog => "Show or hide the log panel".into(),
            Action::BuildText => {
                "Build the text benchmark on a MiniLM/BERT folder, then evaluate with its suite".into()
            }
            other => other.label().trim_end_matches('…').to_string(),
        }
    }

    /// A tooltip for the menu entry, where the label needs one.
    fn hint(self) -> Option<&'static str> {
        match self {
            Action::OpenRecipe => Some(
                "A mergescope recipe (.toml) or a mergekit configuration (.yml): its inputs, method and parameters",
            ),
            Action::OpenSuite => {
                Some("Evaluate merges with a suite file: your model family (BERT, CLIP, causal LM) or your own command")
            }
            Action::Experiments => Some("Seed 002's sweeps: fine-tune, merge, evaluate and fit the scaling laws"),
            Action::BuildText => Some(
                "Choose the all-MiniLM-L6-v2 folder (scripts/fetch-minilm.sh): heads and one expert per text task are trained into the cache (minutes), then merges are evaluated with its suite",
            ),
            _ => None,
        }
    }

    /// Carries the action out; what only the window can do comes back as a [`ProjectCommand`].
    pub fn perform(self, ui: &Ui, app: &mut MenuTarget<'_>) -> Option<ProjectCommand> {
        match self {
            Action::OpenProject => return Some(ProjectCommand::OpenDialog),
            Action::SaveProject => return Some(ProjectCommand::Save { choose_path: false }),
            Action::SaveProjectAs => return Some(ProjectCommand::Save { choose_path: true }),
            Action::OpenRecipe => dialogs::pick_recipe(app.doc),
            Action::SetBase => dialogs::pick_base(app.doc),
            Action::AddExperts => dialogs::pick_experts(app.doc),
            Action::AddExpertFolder => dialogs::pick_expert_folder(app.doc),
            Action::LoadPlugin => dialogs::pick_plugin(app.doc, app.view),
            Action::OpenSuite => dialogs::pick_suite(app.doc),
            Action::Quit => ui.send_viewport_cmd(egui::ViewportCommand::Close),
            Action::RunMerge => app.view.start_run(app.doc),
            Action::Escape => escape(app),
            Action::BuildDemo(arch) => app.doc.build_demo(arch, 0),
            Action::BuildText => build_text(app),
            Action::ToggleAnalysis => {
                if app.doc.analysis.open {
                    app.doc.analysis.open = false;
                } else {
                    let kind = app.doc.analysis.kind;
                    app.doc.analyze(kind, &app.view.selected);
                }
            }
            Action::ToggleLog => app.settings.show_log = !app.settings.show_log,
            Action::CycleTheme => {
                app.settings.theme = match app.settings.theme {
                    Theme::System => Theme::Light,
                    Theme::Light => Theme::Dark,
                    Theme::Dark => Theme::System,
                }
            }
            Action::Experiments => app.doc.open_experiments(),
            Action::Shortcuts => app.view.shortcuts = true,
            Action::About => app.view.about = true,
        }
        None
    }

    /// The menu entry: its label with its shortcut; clicking it performs the action.
    pub fn menu_item(self, ui: &mut Ui, app: &mut MenuTarget<'_>) -> Option<ProjectCommand> {
        let text = ui.ctx().format_shortcut(&self.shortcut());
        let mut response = ui.add(egui::Button::new(self.label()).shortcut_text(text));
        if let Some(hint) = self.hint() {
            response = response.on_hover_text(hint);
        }
        if response.clicked() {
            self.perform(ui, app)
        } else {
            None
        }
    }
}

/// Asks for the backbone folder (starting at the last one used, else the one
/// scripts/fetch-minilm.sh fills, when it is there), remembers it, and queues the text
/// benchmark's build on it; a refusal goes to the status bar and the log.
fn build_text(app: &mut MenuTarget<'_>) {
    let start = app.settings.text_backbone.clone().or_else(|| {
        mergescope_lab::demo::cache_dir()
            .ok()
            .map(|d| d.join("all-minilm-l6-v2"))
            .filter(|d| d.is_dir())
    });
    let mut dialog =
        rfd::FileDialog::new().set_title("Backbone of the text benchmark: the all-MiniLM-L6-v2 folder (a BERT model)");
    if let Some(d) = start.filter(|d| d.is_dir()) {
        dialog = dialog.set_directory(d);
    }
    let Some(dir) = dialog.pick_folder() else { return };
    app.settings.text_backbone = Some(dir.clone());
    match app.doc.build_text_benchmark(&TextBuildRequest::new(dir, 0)) {
        Ok(true) => app.view.toast("building the text benchmark: see the Inputs panel"),
        Ok(false) => app.view.toast("the text benchmark is already built: its suite is open"),
        Err(e) => app.view.toast(e),
    }
}

/// Escape: closes the dialog on top (a modal's Escape is its Cancel: the plugin is not loaded,
/// the window stays open), else the shortcuts, About or Experiments window; with none open, it
/// cancels the running merge.
fn escape(app: &mut MenuTarget<'_>) {
    let view = &mut *app.view;
    if view.approval.is_some() {
        view.approval = None;
    } else if view.confirm_close {
        view.confirm_close = false;
    } else if view.shortcuts {
        view.shortcuts = false;
    } else if view.about {
        view.about = false;
    } else if app.doc.experiments.open {
        app.doc.experiments.open = false;
    } else {
        app.doc.cancel_current();
    }
}

/// Performs the actions whose shortcuts were pressed this frame.
pub fn apply_shortcuts(ui: &mut Ui, app: &mut MenuTarget<'_>) -> Option<ProjectCommand> {
    // egui matches Ctrl+S on Ctrl+Shift+S too: the shortcuts with more modifiers go first.
    let mut order = Action::ALL;
    order.sort_by_key(|a| {
        let m = a.shortcut().modifiers;
        std::cmp::Reverse(u8::from(m.shift) + u8::from(m.alt) + u8::from(m.command || m.ctrl))
    });
    let pressed: Vec<Action> = ui.input_mut(|i| {
        order
            .into_iter()
            .filter(|a| i.consume_shortcut(&a.shortcut()))
            .collect()
    });
    let mut command = None;
    for action in pressed {
        command = action.perform(ui, app).or(command);
    }
    command
}
