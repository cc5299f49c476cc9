#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The keyboard: every menu action has a shortcut, shown beside its menu entry and in
//! Help > Keyboard shortcuts, and pressing it does what the entry does; Escape closes the dialog
//! on top before it cancels anything.

mod common;

use common::{app, harness};
use egui::{Key, Modifiers};
use egui_kittest::kittest::{NodeT as _, Queryable as _};
use mergescope_gui::settings::Theme;
use mergescope_gui::ui::actions::Action;
use std::collections::HashSet;

const CMD: Modifiers = Modifiers::COMMAND;
const CMD_SHIFT: Modifiers = Modifiers::COMMAND.plus(Modifiers::SHIFT);

#[test]
fn every_action_has_its_own_shortcut() {
    let keys: HashSet<_> = Action::ALL.iter().map(|a| a.shortcut()).collect();
    assert_eq!(keys.len(), Action::ALL.len(), "two actions share a shortcut");
    let labels: HashSet<_> = Action::ALL.iter().map(|a| a.label()).collect();
    assert_eq!(labels.len(), Action::ALL.len(), "two actions share a label");
}

#[test]
fn shortcuts_do_what_the_menu_does_and_escape_closes_dialogs() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);

    // F1 lists every action with its key; Escape closes the list (and cancels nothing).
    h.key_press(Key::F1);
    h.run_steps(2);
    assert!(h.state().view.shortcuts);
    h.get_by_label("Close the dialog on top; with none open, cancel the running merge");
    h.get_by_label("Build MLP demo");
    h.get_by_label("Show or hide the analysis panel");
    h.key_press(Key::Escape);
    h.run_steps(2);
    assert!(!h.state().view.shortcuts);

    // Shift+F1 is About; F1 then Escape closes the list first, the About box next.
    h.key_press_modifiers(Modifiers::SHIFT, Key::F1);
    h.run_steps(2);
    assert!(
        h.state().view.about && !h.state().view.shortcuts,
        "Shift+F1 opened the shortcuts"
    );
    h.key_press(Key::F1);
    h.run_steps(2);
    h.key_press(Key::Escape);
    h.run_steps(2);
    assert!(!h.state().view.shortcuts && h.state().view.about);
    h.key_press(Key::Escape);
    h.run_steps(2);
    assert!(!h.state().view.about);

    // The Experiments window opens by key and Escape closes it.
    h.key_press_modifiers(CMD_SHIFT, Key::X);
    h.run_steps(2);
    assert!(h.state().doc.experiments.open);
    h.key_press(Key::Escape);
    h.run_steps(2);
    assert!(!h.state().doc.experiments.open);

    // Panels and theme.
    let log = h.state().settings.show_log;
    h.key_press_modifiers(CMD, Key::L);
    h.run_steps(2);
    assert_eq!(h.state().settings.show_log, !log);
    h.key_press_modifiers(CMD_SHIFT, Key::T);
    h.run_steps(2);
    assert_eq!(h.state().settings.theme, Theme::Dark);
    assert!(!h.state().doc.analysis.open);
    h.key_press_modifiers(CMD_SHIFT, Key::A);
    h.run_steps(2);
    assert!(h.state().doc.analysis.open);
    h.key_press_modifiers(CMD_SHIFT, Key::A);
    h.run_steps(2);
    assert!(!h.state().doc.analysis.open);

    // Ctrl+Enter queues a merge of the form's method, as Run > Run merge does.
    assert!(h.state().doc.runs.is_empty());
    h.key_press_modifiers(CMD, Key::Enter);
    h.run_steps(2);
    assert_eq!(h.state().doc.runs.len(), 1);
}

#[test]
fn menu_entries_show_their_shortcuts() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    h.get_by_label("View").click();
    h.run_steps(2);
    for action in [
        Action::ToggleAnalysis,
        Action::ToggleLog,
        Action::CycleTheme,
        Action::Experiments,
    ] {
        let shown = h.ctx.format_shortcut(&action.shortcut());
        let label = action.label();
        let entry = h.get_by_label_contains(&label);
        assert!(
            format!("{entry:?}").contains(&shown),
            "'{}' does not show its shortcut {shown}",
            action.label()
        );
    }
}

/// Tab visits an input row's buttons in the order they read: rename, move up, remove (they are
/// right-aligned, which used to make Tab visit them right to left).
#[test]
fn tab_visits_an_input_rows_buttons_left_to_right() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    // The second expert's row (the base's and the first expert's come before it).
    h.get_all_by_label("✏").nth(2).unwrap().focus();
    h.run_steps(2);
    let focused = |h: &egui_kittest::Harness<'static, mergescope_gui::MergescopeApp>| {
        h.query_all(egui_kittest::kittest::by())
            .find(|n| n.accesskit_node().is_focused())
            .map(|n| n.accesskit_node().label().unwrap_or_default())
    };
    assert_eq!(focused(&h).as_deref(), Some("✏"));
    h.key_press(Key::Tab);
    h.run_steps(2);
    assert_eq!(focused(&h).as_deref(), Some("⏶"));
    h.key_press(Key::Tab);
    h.run_steps(2);
    assert_eq!(focused(&h).as_deref(), Some("🗑"));
}
