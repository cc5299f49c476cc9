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
use crate::runs::{RunRecord, SortKey};
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
    /// The run the status bar's message follows (the last one started), until it ends.
    pub followed_run: Option<u64>,
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
            followed_run: None,
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

    /// Keeps the status bar's message on the followed run's state: it reads queued, then running,
    /// while the run is; its outcome then stays for the usual few seconds (a message posted when
    /// the run was queued would otherwise outlive it).
    pub fn follow_run(&mut self, runs: &[RunRecord]) {
        let Some(id) = self.followed_run else {
            return;
        };
        let Some(run) = runs.iter().find(|r| r.id == id) else {
            self.followed_run = None;
            return;
        };
        if run.status.is_active() {
            self.message = Some((run.state_line(), Instant::now()));
        } else {
            self.toast(run.state_line());
            self.followed_run = None;
        }
    }

    /// Queues a merge; a refusal goes to the status bar and the log.
    pub fn start_run(&mut self, doc: &mut Document) {
        match doc.run() {
            Ok(id) => {
                // The message then reads the run's state ("run #N queued" first).
                self.followed_run = Some(id);
                self.follow_run(&doc.runs);
            }
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
    use crate::runs::RunStatus;

    #[test]
    fn the_status_bar_follows_a_run_from_queued_to_its_outcome() {
        let mut view = ViewState::default();
        let mut r = crate::runs::tests::run(4, "ties", &[("a", 0.8), ("b", 0.6)]);
        r.status = RunStatus::Queued;
        view.toast("run #4 queued");
        view.followed_run = Some(4);
        let text = |v: &ViewState| v.message.as_ref().map(|m| m.0.clone());
        view.follow_run(std::slice::from_ref(&r));
        assert_eq!(text(&view).as_deref(), Some("run #4 queued"));
        r.status = RunStatus::Running;
        r.live = Some(crate::runs::Live {
            started: Instant::now(),
            fraction: 0.25,
            stage: "merging".into(),
        });
        view.follow_run(std::slice::from_ref(&r));
        assert_eq!(text(&view).as_deref(), Some("run #4 running: merging 25 %"));
        r.status = RunStatus::Done;
        r.live = None;
        view.follow_run(std::slice::from_ref(&r));
        // The fixture's run took 4 s (its id) and scored 0.8 and 0.6.
        assert_eq!(
            text(&view).as_deref(),
            Some("run #4 done in 4.00 s, mean accuracy 70.0 %")
        );
        assert_eq!(view.followed_run, None);
        // Once it is over, the message is no longer touched (it expires as any other).
        view.message = None;
        view.follow_run(std::slice::from_ref(&r));
        assert!(view.message.is_none());
        // A failed run says why; a run that is gone stops the following.
        r.status = RunStatus::Failed;
        r.error = Some("disk full".into());
        view.followed_run = Some(4);
        view.follow_run(std::slice::from_ref(&r));
        assert_eq!(text(&view).as_deref(), Some("run #4 failed: disk full"));
        view.followed_run = Some(9);
        view.follow_run(std::slice::from_ref(&r));
        assert_eq!(view.followed_run, None);
    }

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
