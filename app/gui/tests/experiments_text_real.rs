#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The window's text-benchmark paths on a real text build (the cache's,
//! `~/.cache/mergescope/demo/text-minilm-seed0`, which `mergescope demo build --benchmark text`
//! or Benchmark > Build text benchmark writes): the Experiments window's `paper-002` sweep on it
//! starts, reports progress and is cancelled, and the analysis panel's oracle view starts,
//! reports its steps with its form locked, and is cancelled. It loads all-MiniLM-L6-v2 and
//! fine-tunes it until the first progress, so it is ignored by default:
//!
//! ```sh
//! cargo test -p mergescope-gui --test experiments_text_real -- --ignored
//! ```

mod common;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT as _, Queryable as _, by};
use mergescope_gui::MergescopeApp;
use mergescope_gui::analysis::ViewKind;
use mergescope_gui::experiments::{Outcome, known_text_builds};
use mergescope_gui::settings::Theme;
use std::time::{Duration, Instant};

fn step_until(h: &mut Harness<'static, MergescopeApp>, what: &str, done: impl Fn(&MergescopeApp) -> bool) {
    let start = Instant::now();
    while !done(h.state()) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "timed out waiting for {what}"
        );
        h.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    h.run_steps(2);
}

#[test]
#[ignore = "needs the cache's text build (mergescope demo build --benchmark text); fine-tunes MiniLM"]
fn a_text_sweep_and_the_oracle_start_report_progress_and_cancel_on_a_real_build() {
    let Some(build) = known_text_builds(None).into_iter().next() else {
        panic!("no text build in the cache: build one with `mergescope demo build --benchmark text`");
    };
    let runs = tempfile::tempdir().unwrap();
    let mut h = common::harness(common::app(runs.path(), Theme::Light));
    h.run_steps(3);
    h.get_by_label("View").click();
    h.run_steps(2);
    h.get_by_label_contains("Experiments: fine-tuning sweeps…").click();
    h.run_steps(3);
    h.get(
        egui_kittest::kittest::by()
            .role(egui::accesskit::Role::ComboBox)
            .label("Benchmark"),
    )
    .click();
    h.run_steps(3);
    h.get_by_label_contains("text · all-MiniLM-L6-v2").click();
    h.run_steps(3);
    let e = &h.state().doc.experiments;
    assert_eq!(e.spec.arch, "text");
    assert_eq!(e.spec.benchmark, build.display().to_string());
    assert!(e.folder.starts_with(runs.path()), "{}", e.folder.display());
    h.get_by_label("▶ Run sweep").click();
    let started = Instant::now();
    h.run_steps(2);
    assert!(
        h.state().doc.experiments.running(),
        "{:?}",
        h.state().doc.experiments.error
    );
    step_until(&mut h, "the sweep's first steps", |a| {
        let e = &a.doc.experiments;
        e.error.is_some() || !e.running() || e.progress.as_ref().is_some_and(|p| p.steps_done > 0)
    });
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    assert!(e.running(), "still going");
    eprintln!(
        "first fine-tuning step after {:.1} s: {:?}",
        started.elapsed().as_secs_f64(),
        e.progress
    );
    h.get_by_label("■ Cancel").click();
    step_until(&mut h, "the cancellation", |a| !a.doc.experiments.running());
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    assert!(matches!(e.outcome, Some(Outcome::Cancelled { .. })), "{:?}", e.outcome);
    h.state_mut().doc.experiments.open = false;
    h.run_steps(2);

    // The oracle: started, its steps counted, cancelled.
    let selected = Default::default();
    h.state_mut().doc.analyze(ViewKind::Oracle, &selected);
    let started = Instant::now();
    assert_eq!(h.state().doc.analysis.inputs.text_build.as_ref(), Some(&build));
    step_until(&mut h, "the oracle's first steps", |a| {
        let x = &a.doc.analysis;
        !x.running() || x.progress.is_some_and(|(d, _)| d > 0)
    });
    assert!(h.state().doc.analysis.running(), "{:?}", h.state().doc.analysis.error);
    eprintln!(
        "oracle: {:?} after {:.1} s",
        h.state().doc.analysis.progress,
        started.elapsed().as_secs_f64()
    );
    h.get_by_label_contains(" steps, ");
    // Its form is locked while it runs.
    for name in ["train texts / task", "learning rates η", "epochs"] {
        let field = h.get(by().role(Role::TextInput).label(name));
        assert!(field.accesskit_node().is_disabled(), "{name} while the oracle runs");
    }
    h.get_by_label("Cancel").click();
    step_until(&mut h, "the oracle's cancellation", |a| !a.doc.analysis.running());
    let error = h.state().doc.analysis.error.clone().unwrap_or_default();
    assert!(error.contains("cancelled"), "{error}");
}
