#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Experiments window driven by clicks (egui_kittest, through its AccessKit tree) on a
//! small real benchmark: open it from the View menu, shrink the `paper-002` preset to a tiny
//! sweep in its form, run it, cancel it, resume it, and check the results file, the plots
//! (against `analyse()` of that file) and the fits table; plus a snapshot of the window.
//!
//! The sweep trains its experts, so its numbers depend on the CPU's rounding (see
//! [`SWEEP_ACCURACY_TOLERANCE`]): they are checked against a reference run, committed in
//! `tests/fixtures/sweep/results.csv`, within a tolerance, and the snapshot is drawn from that
//! reference file, so that it is the same picture on every machine.

mod common;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{Queryable as _, by};
use mergescope_gui::MergescopeApp;
use mergescope_gui::experiments::Outcome;
use mergescope_gui::settings::Theme;
use mergescope_studies::scaling::sweep::spec::{EXPERT, Hyper, task_groups};
use mergescope_studies::scaling::sweep::store::{Row, read_rows};
use mergescope_studies::scaling::sweep::{SweepSpec, Variable, analyse, figures};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn harness(runs_dir: &Path) -> Harness<'static, MergescopeApp> {
    common::harness(common::app(runs_dir, Theme::Light))
}

/// Steps frames until `done` holds (or fails after 90 s), checking that frames keep coming.
fn step_until(h: &mut Harness<'static, MergescopeApp>, what: &str, done: impl Fn(&MergescopeApp) -> bool) {
    let start = Instant::now();
    while !done(h.state()) {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "timed out waiting for {what}"
        );
        let frames = h.state().view.frames;
        h.step();
        assert!(h.state().view.frames > frames, "the window draws while the sweep runs");
        std::thread::sleep(Duration::from_millis(5));
    }
    h.run_steps(3);
}

/// Types `text` into the grid field of `name` (its whole value replaced).
fn set_grid(h: &mut Harness<'static, MergescopeApp>, name: &str, text: &str) {
    h.get(by().role(Role::TextInput).label(name))
        .set_text_value_accesskit(text);
    h.run_steps(2);
}

/// Sets the number field labelled `name`.
fn set_number(h: &mut Harness<'static, MergescopeApp>, name: &str, value: f64) {
    h.get(by().role(Role::SpinButton).label(name))
        .set_value_accesskit(value);
    h.run_steps(2);
}

/// The cells a sweep has: each point's task groups merged by each method, and the experts of
/// those groups (one cell per run and task, whatever N).
fn expected_cells(spec: &SweepSpec, pool: usize) -> usize {
    let mut experts = BTreeSet::new();
    let mut merges = 0;
    for h in spec.points() {
        for group in task_groups(pool, h.tasks, spec.groups, spec.seed) {
            for t in group {
                experts.insert((format!("{:?}", Hyper { tasks: 0, ..h.clone() }), t));
            }
            merges += spec.methods.len();
        }
    }
    experts.len() + merges
}

/// The finished cells in a results file.
fn cells_in(path: &Path) -> usize {
    let rows = read_rows(path).unwrap();
    let cells: BTreeSet<String> = rows
        .iter()
        .map(|r| {
            if r.method == EXPERT {
                format!("{}|{}", r.cell(), r.task)
            } else {
                r.cell()
            }
        })
        .collect();
    cells.len()
}

/// The reference results of the tiny sweep below, made on one machine (see
/// `tests/fixtures/README.md`).
fn reference_results() -> PathBuf {
    common::fixtures().join("sweep").join("results.csv")
}

/// How far a sweep row's accuracy (on 64 test examples) may be from the reference's. The sweep
/// fine-tunes each expert for at most 6 AdamW steps from the committed base; another CPU sums
/// the matrix products in another order (SIMD width, cache blocking), which moves the weights
/// by a few units in the last place, and the few steps do not amplify that much. An example
/// whose two best logits (nearly) tie can still change its prediction, so the accuracy may
/// move by whole examples: two of 64 is allowed, which no change of method or recipe stays
/// within (those move accuracies by several points).
const SWEEP_ACCURACY_TOLERANCE: f64 = 2.0 / 64.0 + 1e-9;
/// How far a sweep row's mean cross-entropy may be from the reference's, relative: 1e-3, a
/// hundred times the spread measured between CPU paths (see the fixtures' README), and well
/// under what a change of the training or the merge would move.
const SWEEP_LOSS_TOLERANCE: f64 = 1e-3;

/// Checks the rows of a sweep against the reference rows: the same cells and tasks, the same
/// example counts, the accuracies and losses within the tolerances above.
fn assert_close_to_reference(rows: &[Row], reference: &[Row]) {
    let key = |r: &Row| format!("{} | {}", r.cell(), r.task);
    let by_key: std::collections::BTreeMap<String, _> = reference.iter().map(|r| (key(r), r)).collect();
    assert_eq!(by_key.len(), reference.len(), "one reference row per cell and task");
    let got: BTreeSet<String> = rows.iter().map(key).collect();
    assert_eq!(got.len(), rows.len(), "one row per cell and task");
    assert_eq!(
        got,
        by_key.keys().cloned().collect::<BTreeSet<_>>(),
        "the sweep's cells are the reference's"
    );
    for r in rows {
        let e = by_key[&key(r)];
        assert_eq!(r.examples, e.examples, "{}", key(r));
        assert!(
            (r.accuracy - e.accuracy).abs() <= SWEEP_ACCURACY_TOLERANCE,
            "{}: accuracy {} vs the reference's {}",
            key(r),
            r.accuracy,
            e.accuracy
        );
        assert!(
            (r.loss - e.loss).abs() <= SWEEP_LOSS_TOLERANCE * e.loss.abs().max(1.0),
            "{}: loss {} vs the reference's {}",
            key(r),
            r.loss,
            e.loss
        );
    }
}

/// Writes `results` as the reference (rows sorted, timings zeroed, so that a rerun on the same
/// machine writes the same file), when `MERGESCOPE_UPDATE_FIXTURES` is set.
fn update_reference(results: &Path) {
    if std::env::var_os("MERGESCOPE_UPDATE_FIXTURES").is_none() {
        return;
    }
    let text = std::fs::read_to_string(results).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let mut rows: Vec<String> = lines
        .map(|l| {
            let (rest, _seconds) = l.rsplit_once(',').unwrap();
            format!("{rest},0.000")
        })
        .collect();
    rows.sort();
    let out = reference_results();
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, format!("{header}\n{}\n", rows.join("\n"))).unwrap();
    println!("wrote {}", out.display());
}

fn running(a: &MergescopeApp) -> bool {
    a.doc.experiments.running()
}

#[test]
fn a_tiny_sweep_runs_from_the_experiments_window_and_its_plots_fill_in() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(runs.path());
    h.run_steps(3);

    // Two clicks: the View menu, its Experiments entry.
    h.get_by_label("View").click();
    h.run_steps(2);
    h.get_by_label_contains("Experiments: fine-tuning sweeps…").click();
    h.run_steps(3);
    let e = &h.state().doc.experiments;
    assert!(e.open);
    assert_eq!(e.name, "paper-002");
    assert_eq!(e.spec.arch, "mlp", "the preset for the open benchmark's arch");
    let methods: Vec<&str> = e.spec.methods.iter().map(|m| m.name()).collect();
    assert_eq!(
        &methods[..2],
        ["TA (λ=1/N)", "TIES"],
        "the preset's methods that are installed"
    );
    // Keep task arithmetic and TIES: untick the others (DARE and AdaMerging, where their
    // plugins are built) by their checkboxes.
    let others: Vec<String> = h
        .state()
        .doc
        .registry
        .plugins
        .iter()
        .filter(|p| e.spec.methods.iter().any(|m| m.plugin == p.id()))
        .filter(|p| !["task-arithmetic", "ties"].contains(&p.id()))
        .map(|p| p.info.name.clone())
        .collect();
    for name in others {
        h.get(by().role(Role::CheckBox).label(&name)).click();
        h.run_steps(2);
    }
    let e = &h.state().doc.experiments;
    let methods: Vec<&str> = e.spec.methods.iter().map(|m| m.plugin.as_str()).collect();
    assert_eq!(methods, ["task-arithmetic", "ties"]);
    assert_eq!(e.folder, runs.path().join("sweeps").join("paper-002-mlp"));
    // The preset merges 4 tasks (2 to 6 on its grid): the three-task benchmark refuses that,
    // inline, and Run waits for a fix.
    h.get_by_label_contains("4 tasks per group asked for; the benchmark has 3");
    h.get_by_label("▶ Run sweep").click();
    h.run_steps(2);
    assert!(!running(h.state()), "Run is disabled while the form is invalid");

    // A grid value that does not parse is named in red under the form.
    set_grid(&mut h, "steps K", "2, 4x");
    h.get_by_label_contains("steps K: '4x' is not a whole number");
    assert_eq!(h.state().doc.experiments.spec.grid.steps, [50, 100, 200, 300]);

    // The tiny sweep: K ∈ {2, 4, 6}, N ∈ {2, 3}, two task groups, 64 test examples a task.
    set_grid(&mut h, "steps K", "2, 4");
    set_grid(&mut h, "learning rate η", "");
    set_grid(&mut h, "batch size b", "");
    set_grid(&mut h, "data ratio α", "");
    set_grid(&mut h, "tasks N", "2, 3");
    set_number(&mut h, "steps K", 6.0);
    set_number(&mut h, "batch size b", 16.0);
    set_number(&mut h, "tasks N", 2.0);
    set_number(&mut h, "groups G", 2.0);
    h.get(by().role(Role::CheckBox).label("all")).click();
    h.run_steps(2);
    set_number(&mut h, "eval examples / task", 64.0);
    assert!(h.query_by_label_contains("is not a whole number").is_none());
    let spec = h.state().doc.experiments.spec.clone();
    assert_eq!(spec.swept(), [Variable::Steps, Variable::Tasks]);
    assert_eq!(
        (spec.defaults.steps, spec.defaults.batch, spec.defaults.tasks),
        (6, 16, 2)
    );
    assert_eq!((spec.groups, spec.eval_examples), (2, Some(64)));
    h.get_by_label("4 sweep points; swept: steps K, tasks N");
    let cells = expected_cells(&spec, 3);
    assert_eq!(cells, 23);

    // Run, then cancel once a few cells are in (the first group's two experts and its two
    // merges).
    h.get_by_label("▶ Run sweep").click();
    step_until(&mut h, "the first cells", |a| {
        a.doc.experiments.progress.as_ref().is_some_and(|p| p.cells_done >= 4)
    });
    assert!(running(h.state()), "the sweep was still going");
    // In the window and in the status bar (which reopens the window).
    assert_eq!(h.get_all_by_label_contains("/ 23 cells").count(), 2);
    h.get_by_label("■ Cancel").click();
    step_until(&mut h, "the cancellation", |a| !running(a));
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    let Some(Outcome::Cancelled { cells_done, cells: all }) = e.outcome.clone() else {
        panic!("not cancelled: {:?}", e.outcome)
    };
    assert_eq!(all, cells);
    let results = e.results_file();
    assert_eq!(cells_in(&results), cells_done);
    assert!(cells_done < cells, "cancelled before the end");
    h.get_by_label_contains("Resume continues from there");

    // Resume: the finished cells are reused, the others computed; the plots fill in.
    h.get_by_label("⟳ Resume").click();
    step_until(&mut h, "the resumed sweep", |a| {
        let e = &a.doc.experiments;
        !e.running() && (matches!(e.outcome, Some(Outcome::Finished { .. })) || e.error.is_some())
    });
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    let Some(Outcome::Finished {
        cells: all,
        reused,
        plots,
        ..
    }) = e.outcome.clone()
    else {
        panic!("not finished: {:?}", e.outcome)
    };
    assert_eq!(all, cells);
    // The merge cells come back from the file. (Experts' rows are re-done: the engine's
    // reopening counts an expert row's cell without its task, so two experts at one setting
    // look like an incomplete cell.)
    assert!(reused >= 2 && reused <= cells_done, "{reused} of {cells_done} reused");
    assert_eq!(cells_in(&results), cells, "every cell is in results.csv once");
    let p = e.progress.clone().unwrap();
    assert_eq!((p.cells_done, p.cells), (cells, cells));
    // As the CLI: the plots and fits.md are written into the folder.
    let plots = plots.unwrap();
    assert!(plots.join("steps-loss.png").is_file() && e.folder.join("fits.md").is_file());

    // What the window plots is `analyse()` of the file.
    let rows = read_rows(&results).unwrap();
    let expected = analyse(&e.spec, &rows);
    assert_eq!(e.results, expected);
    assert_eq!(e.figures.len(), 2);
    for (shown, r) in e.figures.iter().zip(&expected) {
        assert_eq!(shown, &figures(r));
    }
    let steps = &expected[0];
    assert_eq!(steps.variable, Variable::Steps);
    let ta = &steps.curves[0];
    assert_eq!(ta.points.iter().map(|p| p.0).collect::<Vec<_>>(), [2.0, 4.0, 6.0]);
    assert!(
        ta.points.iter().all(|p| p.1.n == 2 && p.2.se > 0.0),
        "two groups, error bars"
    );
    let methods: Vec<&str> = steps.fits.iter().map(|f| f.method.as_str()).collect();
    assert_eq!(methods, ["TA (λ=1/N)", "TIES"], "a law through 3 step counts each");

    // The window shows the steps plots and their fits; N's plots a click away.
    h.get_by_label("Merged models' average accuracy against fine-tuning steps K");
    h.get_by_label("Merged models' average loss against fine-tuning steps K");
    h.get_by_label("Loss over the grid");
    h.get_by_label_contains("Fits of the loss: a + c1·K + c2/√K");
    assert_eq!(h.get_all_by_label("a + c1·K + c2/√K").count(), 2, "a row per method");
    h.get_by_label("tasks merged N").click();
    h.run_steps(2);
    assert_eq!(h.state().doc.experiments.variable, Some(Variable::Tasks));
    h.get_by_label("Merged models' average loss against tasks merged N");
    h.get_by_label_contains("No fit yet: the law needs at least 3 values of tasks N");
    h.get_by_label("fine-tuning steps K").click();
    h.run_steps(2);

    // The numbers the sweep trained, against the reference run's.
    update_reference(&results);
    let reference = read_rows(&reference_results()).unwrap();
    assert_close_to_reference(&rows, &reference);

    // A picture of the window with the plots, drawn from the reference results (the same
    // numbers on every machine; timings vary from run to run).
    std::fs::copy(reference_results(), &results).unwrap();
    h.state_mut().doc.experiments.reload();
    let e = &h.state().doc.experiments;
    assert!(e.error.is_none(), "{:?}", e.error);
    assert_eq!(e.rows, reference);
    let expected = analyse(&e.spec, &reference);
    assert_eq!(e.results, expected);
    assert_eq!(e.variable, Some(Variable::Steps));
    for (shown, r) in e.figures.iter().zip(&expected) {
        assert_eq!(shown, &figures(r));
    }
    assert_eq!(expected[0].fits.len(), 2, "both methods' fits are in the picture");
    let e = &mut h.state_mut().doc.experiments;
    if let Some(p) = &mut e.progress {
        p.elapsed = 12.0;
    }
    e.outcome = Some(Outcome::Finished {
        cells,
        reused: 7,
        runs_trained: 3,
        seconds: 12.0,
        plots: Ok(PathBuf::new()),
    });
    h.remove_cursor();
    h.run_steps(3);
    h.snapshot("experiments_light");
}
