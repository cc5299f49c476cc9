//! egui views over a [`Document`](crate::document::Document). Views only draw and turn clicks
//! into document calls; all state that outlives a frame lives in the document,
//! the settings (persisted) or [`ViewState`] (this window's transient state).

pub mod actions;
pub mod analysis_view;
pub mod bars_view;
pub mod dialogs;
pub mod experiments_view;
pub mod figure_view;
pub mod form_view;
pub mod inputs_view;
pub mod log_view;
pub mod menu;
pub mod method_view;
pub mod oracle_form;
pub mod results_view;

use crate::document::{Document, Level, LogLine};
use crate::runs::SortKey;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

/// Transient state of the window.
#[derive(Debug)]
pub struct ViewState {
    /// Column the results are sorted by.
    pub sort: SortKey,
    /// Sort direction.
    pub descending: bool,
    /// Runs selected in the results table.
    pub selected: BTreeSet<u64>,
    /// Plugin file waiting for the user's approval.
    pub approval: Option<PathBuf>,
    /// Whether the About box is open.
    pub about: bool,
    /// Whether the shortcuts window is open.
    pub shortcuts: bool,
    /// Input being renamed: (is the base, expert index).
    pub renaming: Option<(bool, usize)>,
    /// A short message in the status bar, and when it was posted.
    pub message: Option<(String, Instant)>,
    /// Log lines already looked at for errors to show in the status bar.
    pub log_seen: usize,
    /// Frames drawn (the responsiveness test counts them while a job runs).
    pub frames: u64,
    /// The close-with-unsaved-merges dialog is open.
    pub confirm_close: bool,
    /// The user chose to close; the next close request goes through.
    pub closing: bool,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            sort: SortKey::Id,
            descending: false,
            selected: BTreeSet::new(),
            approval: None,
            about: false,
            shortcuts: false,
            renaming: None,
            message: None,
            log_seen: 0,
            frames: 0,
            confirm_close: false,
            closing: false,
        }
    }
}

impl ViewState {
    /// Shows `text` in the status bar for a few seconds.
    pub fn toast(&mut self, text: impl std::fmt::Display) {
        self.message = Some((text.to_string(), Instant::now()));
    }

    /// Shows the newest error logged since the last call (a failed build or merge reported by
    /// the job thread) in the status bar, so it is seen with the log panel closed.
    pub fn toast_new_errors(&mut self, log: &[LogLine]) {
        let fresh = log.get(self.log_seen..).unwrap_or_default();
        if let Some(line) = fresh.iter().rev().find(|l| l.level == Level::Error) {
            self.toast(&line.text);
        }
        self.log_seen = log.len();
    }

    /// Queues a merge; a refusal goes to the status bar and the log.
    pub fn start_run(&mut self, doc: &mut Document) {
        match doc.run() {
            Ok(id) => self.toast(format!("run #{id} queued")),
            Err(e) => {
                self.toast(&e);
                doc.note(Level::Warn, format!("not run: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(level: Level, text: &str) -> LogLine {
        LogLine {
            at: 0.0,
            level,
            text: text.to_owned(),
        }
    }

    #[test]
    fn the_newest_error_since_last_frame_reaches_the_status_bar_once() {
        let mut view = ViewState::default();
        let mut log = vec![line(Level::Info, "demo benchmark built")];
        view.toast_new_errors(&log);
        assert!(view.message.is_none());
        log.push(line(Level::Error, "text benchmark build failed: not a BERT folder"));
        log.push(line(Level::Error, "demo build failed: disk full"));
        log.push(line(Level::Info, "run #3 queued"));
        view.toast_new_errors(&log);
        assert_eq!(
            view.message.as_ref().map(|m| m.0.as_str()),
            Some("demo build failed: disk full")
        );
        // Seen lines are not shown again once the toast is gone.
        view.message = None;
        view.toast_new_errors(&log);
        assert!(view.message.is_none());
    }
}
