//! The log panel: the session's notes, plugin messages and errors, newest at the bottom.

use crate::document::{Document, Level};
use egui::{RichText, Ui};

/// The panel's contents.
pub fn log_ui(ui: &mut Ui, doc: &Document) {
    egui::ScrollArea::vertical()
        .id_salt("log")
        .stick_to_bottom(true)
        .auto_shrink([false, false])
        .show(ui, |ui| {
            for l in &doc.log {
                let color = match l.level {
                    Level::Error => ui.visuals().error_fg_color,
                    Level::Warn => ui.visuals().warn_fg_color,
                    Level::Info => ui.visuals().text_color(),
                };
                ui.label(
                    RichText::new(format!("{:>7.1} s  {}", l.at, l.text))
                        .monospace()
                        .color(color),
                );
            }
        });
}
