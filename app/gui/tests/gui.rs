#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The desktop window driven by clicks (egui_kittest, through its AccessKit tree) on a small
//! real benchmark: pick a method, change a parameter, run, read the result row, compare,
//! cancel; plus snapshots of the main screens rendered with wgpu (lavapipe on CI).

mod common;

use common::{app, benchmark, harness};
use egui_kittest::Harness;
use egui_kittest::kittest::{Queryable as _, by};
use mergescope_gui::MergescopeApp;
use mergescope_gui::runs::RunStatus;
use mergescope_gui::settings::Theme;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn slow_plugin() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    deps.join(format!(
        "{}mstest_slow{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

/// A window whose selected method is the slow fixture, with `delay_ms` set in its form.
fn app_with_slow_plugin(runs_dir: &Path, delay_ms: i64) -> MergescopeApp {
    let mut a = app(runs_dir, Theme::Light);
    a.doc.load_plugin_file(&slow_plugin(), false).unwrap();
    a.doc.form.as_mut().unwrap().fields[0].value = mergescope_gui::form::FieldValue::Int(delay_ms);
    a
}

/// Steps frames until `done` holds (or fails after 60 s).
fn step_until(h: &mut Harness<'static, MergescopeApp>, what: &str, done: impl Fn(&MergescopeApp) -> bool) {
    let start = Instant::now();
    while !done(h.state()) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        h.step();
        std::thread::sleep(Duration::from_millis(5));
    }
    h.run_steps(3);
}

fn choose_method(h: &mut Harness<'static, MergescopeApp>, name: &str) {
    h.get(by().role(egui::accesskit::Role::ComboBox).label("Method"))
        .click();
    h.run_steps(2);
    h.get_by_label(name).click();
    h.run_steps(2);
}

/// The slider of parameter `name` (its text label is a node of its own).
fn slider<'h>(h: &'h Harness<'static, MergescopeApp>, name: &'h str) -> egui_kittest::Node<'h> {
    h.get(by().role(egui::accesskit::Role::Slider).label(name))
}

fn last_status(app: &MergescopeApp) -> Option<RunStatus> {
    app.doc.runs.last().map(|r| r.status)
}

#[test]
fn merge_three_methods_by_clicking_and_compare_them() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    // The benchmark's base and experts are the inputs, with their accuracies.
    h.get_by_label("Experts (3)");
    h.get_by_label_contains("letters: ");

    // 1. Task arithmetic with λ changed from its default 0.3 to 0.5.
    choose_method(&mut h, "Task arithmetic");
    slider(&h, "lambda").set_value_accesskit(0.5);
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the task-arithmetic run", |a| {
        last_status(a) == Some(RunStatus::Done)
    });
    let r = &h.state().doc.runs[0];
    assert_eq!(r.method, "task-arithmetic");
    assert_eq!(r.params["lambda"], serde_json::json!(0.5));
    assert_eq!(
        r.resolved["lambda"],
        serde_json::json!(0.5),
        "the plugin received λ = 0.5"
    );
    let eval = r.eval.as_ref().expect("the merge was evaluated");
    assert_eq!(eval.tasks.len(), 3);
    assert!(eval.tasks.iter().all(|t| t.examples == 500));
    // The row shows the parameters and the mean accuracy.
    let mean = format!("{:.1}", 100.0 * eval.mean_accuracy);
    h.get_by_label("lambda=0.5");
    h.get_by_label(&mean);
    // The status bar said "queued" when the run was; now it gives the outcome.
    h.run_steps(1);
    h.get_by_label_contains("run #1 done in ");
    assert!(h.query_by_label_contains("run #1 queued").is_none());

    // 2. Weight averaging with defaults; 3. TIES with a lower density.
    choose_method(&mut h, "Weight averaging");
    h.get_by_label("▶ Run merge").click();
    choose_method(&mut h, "TIES-Merging");
    slider(&h, "density").set_value_accesskit(0.4);
    h.run_steps(1);
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the two queued runs", |a| {
        a.doc.runs.len() == 3 && a.doc.runs.iter().all(|r| r.status == RunStatus::Done)
    });
    let methods: Vec<&str> = h.state().doc.runs.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["task-arithmetic", "weight-average", "ties"]);

    // Weight averaging is the mean of the experts: check one tensor against the inputs.
    let wa = &h.state().doc.runs[1];
    let (device, _) = mergescope_engine::device::open_device(mergescope_engine::device::DeviceChoice::Cpu);
    let merged = mergescope_lab::demo::load_params(&wa.output, &device).unwrap();
    let name = merged.keys().next().unwrap().clone();
    let got: Vec<f32> = merged[&name].flatten_all().unwrap().to_vec1().unwrap();
    let inputs: Vec<Vec<f32>> = wa
        .experts
        .iter()
        .map(|e| {
            let p = mergescope_lab::demo::load_params(&e.path, &device).unwrap();
            p[&name].flatten_all().unwrap().to_vec1().unwrap()
        })
        .collect();
    let err = (0..got.len())
        .map(|i| (got[i] - inputs.iter().map(|x| x[i]).sum::<f32>() / 3.0).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-5, "weight average of '{name}' off by {err}");

    // Sort by mean accuracy (descending) by clicking the header.
    h.get_by_label("Mean acc %").click();
    h.run_steps(2);
    assert_eq!(h.state().view.sort, mergescope_gui::runs::SortKey::MeanAccuracy);
    assert!(h.state().view.descending);

    // Select two runs to compare: the chart follows the selection.
    h.state_mut().view.selected.extend([1, 3]);
    h.run_steps(3);
    h.get_by_label("Test accuracy per task (%)");
    let csv = mergescope_gui::runs::to_csv(&h.state().doc.runs);
    assert_eq!(csv.lines().count(), 4);

    // Save one merge with its recipe; the file is the run's output, byte for byte.
    let dest = runs.path().join("saved").join("ties.safetensors");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let recipe = h.state_mut().doc.save_output(3, &dest).unwrap();
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        std::fs::read(&h.state().doc.runs[2].output).unwrap()
    );
    let text = std::fs::read_to_string(&recipe).unwrap();
    assert!(
        text.contains("method = \"ties\"") && text.contains("density = 0.4"),
        "{text}"
    );

    // The project round-trips: reopen it in a fresh window and the table is back.
    let project = runs.path().join("session.msproj");
    h.state_mut().doc.save_project(&project).unwrap();
    let mut again = harness(app(runs.path(), Theme::Light));
    again.state_mut().open_project(&project);
    again.run_steps(3);
    let back = &again.state().doc.runs;
    assert_eq!(back.len(), 3);
    assert_eq!(back[2].params["density"], serde_json::json!(0.4));
    assert_eq!(back[0].eval, h.state().doc.runs[0].eval);
    again.get_by_label("density=0.4");
}

/// A model-level method runs on the open benchmark's calibration data: the run shows the
/// method's iterates and progress as it goes, and leaves the merge, its trajectory and its
/// evaluation.
#[test]
fn a_model_level_method_shows_its_iterates_and_leaves_a_trajectory() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    choose_method(&mut h, "Frank-Wolfe merging");
    slider(&h, "iterations").set_value_accesskit(4.0);
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    // What the run shows while it goes: the method's latest iterate and its progress.
    let seen = std::cell::RefCell::new(Vec::new());
    step_until(&mut h, "the Frank-Wolfe run", |a| {
        if let Some(l) = a.doc.runs.last().and_then(|r| r.live.as_ref()) {
            seen.borrow_mut().push((l.stage.clone(), l.fraction));
        }
        last_status(a) == Some(RunStatus::Done)
    });
    let seen = seen.into_inner();
    assert!(
        seen.iter()
            .any(|(s, f)| s.starts_with("optimising: iteration") && *f > 0.0 && *f <= 1.0),
        "{seen:?}"
    );
    let r = h.state().doc.runs.last().unwrap();
    assert_eq!(r.method, "frank-wolfe");
    assert_eq!(r.resolved["iterations"], serde_json::json!(4));
    let trajectory = r.output.with_extension("trajectory.safetensors");
    assert!(r.output.exists() && trajectory.exists(), "{}", trajectory.display());
    let eval = r.eval.as_ref().expect("the merge was evaluated");
    assert_eq!(eval.tasks.len(), 3);
    // init + 4 iterations, each a full model in the trajectory file.
    let iterates = mergescope_engine::checkpoint::Checkpoint::open(&trajectory)
        .unwrap()
        .tensors
        .keys()
        .filter(|k| k.starts_with("iterate."))
        .count();
    assert_eq!(iterates, 5);
}

#[test]
fn frames_keep_coming_during_a_run_and_cancel_stops_it() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app_with_slow_plugin(runs.path(), 2000));
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the run to start", |a| {
        last_status(a) == Some(RunStatus::Running)
    });

    // The job sleeps 2 s per tensor; the window draws frame after frame meanwhile.
    let frames_before = h.state().view.frames;
    for _ in 0..20 {
        h.step();
    }
    assert_eq!(h.state().view.frames, frames_before + 20);
    assert_eq!(
        last_status(h.state()),
        Some(RunStatus::Running),
        "20 frames were drawn while the run kept going"
    );
    h.get_by_label_contains("elapsed");

    h.get_by_label("Cancel").click();
    step_until(&mut h, "the cancellation", |a| {
        last_status(a) == Some(RunStatus::Cancelled)
    });
    let r = h.state().doc.runs.last().unwrap();
    assert!(!r.output.exists(), "a cancelled run leaves no output");
    assert!(r.eval.is_none());
    h.get_by_label("cancelled");
    // Nor a temporary output, nor the crash marker of a merge in progress.
    let left: Vec<String> = std::fs::read_dir(runs.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-") || n == mergescope_gui::crash_marker::FILE)
        .collect();
    assert!(left.is_empty(), "left by the cancelled run: {left:?}");

    // Closing a window with an unsaved session asks first.
    h.input_mut()
        .viewports
        .entry(egui::ViewportId::ROOT)
        .or_default()
        .events
        .push(egui::ViewportEvent::Close);
    h.run_steps(2);
    h.get_by_label("Save the session before closing?");
    h.get_by_label("Cancel").click();
    h.run_steps(2);
    assert!(h.query_by_label("Save the session before closing?").is_none());
}

#[test]
fn bad_parameters_and_bad_inputs_are_flagged_before_a_run() {
    let runs = tempfile::tempdir().unwrap();
    // A negative delay is out of the schema's range: the form flags it and Run is refused.
    let mut h = harness(app_with_slow_plugin(runs.path(), -5));
    h.run_steps(2);
    assert!(h.get_all_by_label_contains("is out of range").count() >= 1);
    assert!(h.state().doc.can_run().is_err());
    // An unreadable expert is named inline and blocks the run.
    let bad = runs.path().join("bad.safetensors");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    h.state_mut().doc.inputs.add_expert(&bad, None);
    h.run_steps(2);
    h.get_by_label_contains("bad.safetensors");
    let why = h.state().doc.inputs.ready().unwrap_err().to_string();
    assert!(why.contains("'bad'"), "{why}");
}

#[test]
fn snapshots_of_the_main_screens() {
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    h.snapshot("main_window_light");
    assert_eq!(h.ctx.theme(), egui::Theme::Light);

    // The method list, grouped by kind, every method visible.
    h.get(by().role(egui::accesskit::Role::ComboBox).label("Method"))
        .click();
    h.run_steps(2);
    h.snapshot("method_list_light");
    h.get(by().role(egui::accesskit::Role::ComboBox).label("Method"))
        .click();
    h.run_steps(2);

    choose_method(&mut h, "Task arithmetic");
    h.get_by_label("▶ Run merge").click();
    choose_method(&mut h, "TIES-Merging");
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "two runs", |a| {
        a.doc.runs.len() == 2 && a.doc.runs.iter().all(|r| r.status == RunStatus::Done)
    });
    for r in &mut h.state_mut().doc.runs {
        r.seconds = Some(0.05); // timings vary from run to run
    }
    h.state_mut().view.selected.extend([1, 2]);
    h.state_mut().view.message = None; // toasts expire on a clock
    h.run_steps(3);
    h.snapshot("results_compared_light");

    h.state_mut().settings.theme = Theme::Dark;
    h.state_mut().view.about = true;
    h.run_steps(3);
    h.snapshot("about_dark");
}

/// From a finished Frank-Wolfe run, two clicks (select the row, press a view) open the
/// analysis window: the PCA shows the base, the experts, the merge and its 5-iterate
/// trajectory; the plane landscape fills its 21 × 21 grid off the UI thread, its base cell is
/// the base's own evaluation, and the trajectory is drawn on it.
#[test]
fn analysis_views_open_from_a_result_and_show_its_trajectory() {
    use mergescope_figures::Figure;
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    choose_method(&mut h, "Frank-Wolfe merging");
    slider(&h, "iterations").set_value_accesskit(4.0);
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the Frank-Wolfe run", |a| {
        last_status(a) == Some(RunStatus::Done)
    });
    h.state_mut().view.selected.insert(1);
    h.state_mut().view.message = None;
    // The results stay in view beside the analysis: their timing varies from run to run.
    h.state_mut().doc.runs[0].seconds = Some(0.5);
    h.run_steps(2);

    h.get_by_label("PCA").click();
    step_until(&mut h, "the PCA", |a| {
        a.doc.analysis.figure.is_some() && !a.doc.analysis.running()
    });
    let Some(Figure::Scatter(s)) = h.state().doc.analysis.figure.clone() else {
        panic!("no PCA: {:?}", h.state().doc.analysis.error)
    };
    let count = |g: &str| s.points.iter().filter(|p| p.group == g).count();
    assert_eq!((count("base"), count("expert"), count("merge")), (1, 3, 1));
    assert_eq!(s.paths.len(), 1);
    assert_eq!(s.paths[0].points.len(), 5, "init + 4 iterations");
    assert!(s.x_label.starts_with("PC1 (") && s.x_label.contains("% of variance"));
    h.state_mut().doc.analysis.seconds = Some(1.0); // timings vary from run to run
    h.run_steps(2);
    h.snapshot("analysis_pca_light");

    h.get_all_by_label("Plane").last().unwrap().click();
    step_until(&mut h, "the plane", |a| {
        !a.doc.analysis.running() && a.doc.analysis.progress == Some((441, 441))
    });
    let Some(Figure::Heatmap(m)) = h.state().doc.analysis.figure.clone() else {
        panic!("no landscape: {:?}", h.state().doc.analysis.error)
    };
    assert!(m.values.iter().flatten().all(|v| v.is_finite()));
    assert_eq!(m.overlay.len(), 1);
    assert_eq!(m.overlay[0].points.len(), 5);
    // Cell (α, β) = (0, 0) is the base: index 5 of −0.5, −0.4, …, 1.5.
    let bench = mergescope_lab::demo::Benchmark::open(benchmark()).unwrap();
    let tasks = mergescope_lab::data::benchmark_tasks(None).unwrap();
    let (device, _) = mergescope_engine::device::open_device(mergescope_engine::device::DeviceChoice::Cpu);
    let base = mergescope_lab::demo::load_params(&bench.base_path(), &device).unwrap();
    let direct = bench
        .evaluator(&tasks, None, mergescope_lab::data::SplitKind::Test, &device)
        .unwrap()
        .subsample(64)
        .unwrap()
        .evaluate(&base)
        .unwrap()
        .mean_accuracy;
    assert!((m.values[5][5] - direct).abs() < 1e-9, "{} vs {direct}", m.values[5][5]);
    // The grid is cached with the session's runs: reopening computes nothing.
    assert_eq!(std::fs::read_dir(runs.path().join("landscapes")).unwrap().count(), 1);
    h.state_mut().doc.analysis.seconds = Some(10.0);
    h.run_steps(2);
    h.snapshot("analysis_plane_light");

    // Around the trajectory itself: its 5 iterates sit where the plane says they are.
    h.get_all_by_label("Trajectory plane").last().unwrap().click();
    h.run_steps(2); // the click lands in the next frame
    step_until(&mut h, "the trajectory plane", |a| {
        !a.doc.analysis.running() && a.doc.analysis.progress == Some((441, 441))
    });
    let Some(Figure::Heatmap(t)) = h.state().doc.analysis.figure.clone() else {
        panic!("no trajectory plane: {:?}", h.state().doc.analysis.error)
    };
    assert_eq!(t.overlay[0].points.len(), 5);
    assert!(t.x_label.starts_with("PC1 of the iterates"));

    // The radar of the run against the base, with the experts' ring.
    h.get_all_by_label("Radar").last().unwrap().click();
    h.run_steps(2);
    step_until(&mut h, "the radar", |a| !a.doc.analysis.running());
    let Some(Figure::Radar(r)) = h.state().doc.analysis.figure.clone() else {
        panic!("no radar: {:?}", h.state().doc.analysis.error)
    };
    assert_eq!(r.series.len(), 2, "base and the merge");
    assert_eq!(r.axes.len(), 3);
    h.state_mut().doc.analysis.seconds = Some(0.0);
    h.run_steps(2);
    h.snapshot("analysis_radar_light");

    // The other views, each opened by its button, checked and pictured.
    let open = |h: &mut Harness<'static, MergescopeApp>, label: &str| {
        h.get_all_by_label(label).last().unwrap().click();
        h.run_steps(2);
        step_until(h, label, |a| !a.doc.analysis.running());
        assert!(
            h.state().doc.analysis.error.is_none(),
            "{:?}",
            h.state().doc.analysis.error
        );
        h.state_mut().doc.analysis.seconds = Some(0.0);
        h.run_steps(2);
        h.state().doc.analysis.figure.clone().unwrap()
    };
    // Cosine of one layer: the experts' task vectors, 1 on the diagonal.
    h.state_mut().doc.analysis.options.tensor = Some("fc1.weight".into());
    let Figure::Heatmap(c) = open(&mut h, "Cosine") else {
        panic!("cosine")
    };
    assert!(c.title.contains("tensor fc1.weight"), "{}", c.title);
    assert!((0..3).all(|i| (c.values[i][i] - 1.0).abs() < 1e-9));
    h.snapshot("analysis_cosine_light");
    let Figure::Lines(sp) = open(&mut h, "Spectrum") else {
        panic!("spectrum")
    };
    assert_eq!(sp.series.len(), 6, "3 tasks, original and centred");
    h.snapshot("analysis_spectrum_light");
    // The λ line of one task's loss.
    h.state_mut().doc.analysis.options.task = Some("mnist".into());
    h.state_mut().doc.analysis.options.metric = mergescope_studies::analysis::landscape::MetricKind::Loss;
    let Figure::Lines(l) = open(&mut h, "λ line") else {
        panic!("λ line")
    };
    assert_eq!(l.y_label, "loss on mnist");
    assert_eq!(l.series[0].points.len(), 16);
    h.snapshot("analysis_ta_line_light");
    let Figure::Heatmap(g) = open(&mut h, "CART rank × λ") else {
        panic!("CART")
    };
    assert_eq!((g.values.len(), g.values[0].len()), (7, 11));
    h.snapshot("analysis_cart_light");
    let Figure::Lines(cr) = open(&mut h, "CART rank") else {
        panic!("CART rank")
    };
    // The best loss over λ of each rank is the row minimum of the grid just drawn.
    for (row, p) in g.values.iter().zip(&cr.series[0].points) {
        let best = row.iter().copied().fold(f64::INFINITY, f64::min);
        assert!((p[1] - best).abs() < 1e-12);
    }
    h.snapshot("analysis_cart_rank_light");
    let Figure::Lines(ri) = open(&mut h, "R(k) / I(k)") else {
        panic!("R(k) / I(k)")
    };
    assert_eq!(ri.series.len(), 4);
    h.snapshot("analysis_rank_curves_light");

    // Seed 002's views: the proxy equals the engine's on the same files; the demo's experts
    // record equal step counts, so their effective weights are uniform; the bound has four
    // variants of two stacked parts.
    let Figure::Bars(het) = open(&mut h, "Heterogeneity") else {
        panic!("heterogeneity")
    };
    let inputs = h.state().doc.analysis.inputs.clone();
    let experts: Vec<std::path::PathBuf> = inputs.experts.iter().map(|(_, p)| p.clone()).collect();
    let direct = mergescope_studies::scaling::views::heterogeneity_of_files(
        inputs.base.as_ref().unwrap(),
        &experts,
        None,
        mergescope_studies::scaling::views::Mask::Ties { density: 0.2 },
    )
    .unwrap();
    assert_eq!(het.series[0].1, direct.before);
    assert_eq!(het.series[2].1, direct.delta);
    let Figure::Bars(w) = open(&mut h, "Task weights") else {
        panic!("weights")
    };
    assert!(
        w.series[0].1.iter().all(|l| (l - 1.0 / 3.0).abs() < 1e-12),
        "{:?}",
        w.series
    );
    let Figure::Bars(b) = open(&mut h, "Bound") else {
        panic!("bound")
    };
    assert_eq!((b.categories.len(), b.series.len()), (4, 2));
    assert!(b.stacked && b.series[0].1.iter().all(|v| *v > 0.0));
    h.snapshot("analysis_bound_light");

    // The constants are the user's: setting η (first "set" box) and typing L = 2 recompute the
    // bound, which then equals the engine's with the same settings, and differs from the
    // default's (the demo experts record another learning rate).
    h.get_all_by_label("set").next().unwrap().click();
    h.run_steps(2);
    step_until(&mut h, "bound with η set", |a| !a.doc.analysis.running());
    h.get_by_label("L").click();
    h.run_steps(2);
    h.get_by_label("L").type_text("2");
    h.key_press(egui::Key::Enter);
    h.run_steps(2);
    step_until(&mut h, "bound with L = 2", |a| !a.doc.analysis.running());
    let settings = h.state().doc.analysis.options.bound.clone();
    assert_eq!((settings.smoothness, settings.lr), (2.0, Some(1e-3)));
    let edited = h.state().doc.analysis.figure.clone().unwrap();
    let bench = h.state().doc.benchmark.clone().unwrap();
    let direct = mergescope_studies::scaling::views::bound_of_files(
        &bench,
        &mergescope_lab::data::benchmark_tasks(None).unwrap(),
        inputs.base.as_ref().unwrap(),
        &experts,
        &settings,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(
        edited,
        mergescope_studies::scaling::views::bound_figure(&direct.variants)
    );
    assert_ne!(edited, Figure::Bars(b));
}

/// Rebuilds the committed test benchmark by training it with `common::recipe()`, into
/// `tests/fixtures/bench` (or `$MERGESCOPE_FIXTURE_OUT`), its build timings zeroed so that a
/// rebuild on the same machine writes the same files. Run by
/// `scripts/regenerate-gui-fixtures.sh`; the weights depend on the CPU that trains them, which
/// is why the tests do not train them.
#[test]
#[ignore = "rebuilds tests/fixtures/bench by training; see tests/fixtures/README.md"]
fn regenerate_benchmark_fixture() {
    let out =
        std::env::var_os("MERGESCOPE_FIXTURE_OUT").map_or_else(|| common::fixtures().join("bench"), PathBuf::from);
    let staging = tempfile::tempdir().unwrap();
    let built = common::build_benchmark(&staging.path().join("bench"));
    let mut manifest = built.manifest.clone();
    manifest.seconds.values_mut().for_each(|s| *s = 0.0);
    std::fs::write(
        built.dir.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    if out.exists() {
        std::fs::remove_dir_all(&out).unwrap();
    }
    std::fs::create_dir_all(out.join("experts")).unwrap();
    for f in std::iter::once(built.base_path())
        .chain(std::iter::once(built.heads_path()))
        .chain(built.expert_paths())
        .chain(std::iter::once(built.dir.join("manifest.json")))
    {
        std::fs::copy(&f, out.join(f.strip_prefix(&built.dir).unwrap())).unwrap();
    }
    println!("wrote {}", out.display());
}

/// A suite opened in the window (`mergescope gui --benchmark text.toml`): its [models] become
/// the inputs, named by task, and a merge run by clicks is evaluated with the suite, scoring the
/// accuracies transformers gives the same merge of the real BERT experts
/// (tests/fixtures/families/bert-experts), normalised by each expert.
#[test]
fn a_suite_opened_in_the_window_evaluates_the_merges() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/families/bert-experts")
        .canonicalize()
        .unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("reference.json")).unwrap()).unwrap();
    let p = |s: &str| fx.join(s).display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("text.toml");
    std::fs::write(
        &suite,
        format!(
            "name = \"text\"\n[model]\nfamily = \"bert\"\nconfig = \"{b}/config.json\"\ntokenizer = \"{b}/tokenizer.json\"\n\
             [[task]]\nname = \"topic\"\ndata = \"{0}\"\ncalibration = \"{0}\"\nhead = \"{1}\"\n\
             [[task]]\nname = \"verdict\"\ndata = \"{2}\"\ncalibration = \"{2}\"\nhead = \"{3}\"\n\
             [models]\nbase = \"{b}\"\nexperts = [\"{1}\", \"{3}\"]\n",
            p("topic.jsonl"),
            p("topic"),
            p("verdict.jsonl"),
            p("verdict"),
            b = p("base"),
        ),
    )
    .unwrap();
    let config = mergescope_gui::DocumentConfig {
        plugin_dirs: Vec::new(),
        runs_dir: Some(dir.path().join("runs")),
        benchmark: Some(suite.clone()),
        build_demo_if_missing: false,
        demo_arch: None,
    };
    let app = MergescopeApp::new(
        &egui::Context::default(),
        mergescope_gui::settings::Settings::default(),
        &config,
    );
    let mut h = harness(app);
    h.run_steps(3);
    h.get_by_label("Experts (2)");
    choose_method(&mut h, "Task arithmetic");
    slider(&h, "lambda").set_value_accesskit(0.5);
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the task-arithmetic run on the suite", |a| {
        last_status(a) == Some(RunStatus::Done)
    });
    let eval = h.state().doc.runs[0]
        .eval
        .clone()
        .expect("the merge was evaluated with the suite");
    for task in ["topic", "verdict"] {
        let want = r["accuracy"]["task-arithmetic"][task].as_f64().unwrap();
        let t = eval.task(task).unwrap();
        assert_eq!(t.accuracy, want, "{task}");
        // Each expert scores 1.0 on its own task, so the normalised score is the accuracy.
        assert!((t.normalized.unwrap() - want / r["accuracy"][task][task].as_f64().unwrap()).abs() < 1e-12);
    }

    use mergescope_figures::Figure;
    // The window's analyses on the suite: the λ line passes through the merge at λ = 0.5 and
    // the base at 0 (models built in memory), and the radar (bars, two tasks) draws the base,
    // evaluated with the suite, beside the merge.
    let (t, v) = (
        r["accuracy"]["task-arithmetic"]["topic"].as_f64().unwrap(),
        r["accuracy"]["task-arithmetic"]["verdict"].as_f64().unwrap(),
    );
    h.get_all_by_label("λ line").last().unwrap().click();
    h.run_steps(2);
    step_until(&mut h, "the λ line", |a| {
        !a.doc.analysis.running() && a.doc.analysis.figure.is_some()
    });
    let Some(Figure::Lines(l)) = h.state().doc.analysis.figure.clone() else {
        panic!("no λ line: {:?}", h.state().doc.analysis.error)
    };
    let at = |x: f64| {
        l.series[0]
            .points
            .iter()
            .find(|p| (p[0] - x).abs() < 1e-9)
            .map(|p| p[1])
            .unwrap()
    };
    assert!((at(0.5) - (t + v) / 2.0).abs() < 1e-12, "{:?}", l.series[0].points);
    assert!((at(0.0) - 0.5).abs() < 1e-12, "{:?}", l.series[0].points);
    let id = h.state().doc.runs[0].id;
    h.state_mut().view.selected.insert(id);
    h.run_steps(2);
    h.get_all_by_label("Radar").last().unwrap().click();
    h.run_steps(2);
    step_until(&mut h, "the radar", |a| !a.doc.analysis.running());
    let Some(Figure::Bars(b)) = h.state().doc.analysis.figure.clone() else {
        panic!("no radar: {:?}", h.state().doc.analysis.error)
    };
    assert_eq!(b.categories, ["topic", "verdict"]);
    assert_eq!(b.series[0].0, "base");
    assert_eq!(b.series[0].1, vec![0.5, 0.5]);
    assert_eq!(b.series[1].1, vec![t, v]);

    // A model-level method on the suite: Fisher merging learns on the tasks' calibration data
    // and its result is evaluated with the suite like any other.
    choose_method(&mut h, "Fisher merging");
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the Fisher run on the suite", |a| {
        a.doc.runs.len() == 2 && last_status(a) == Some(RunStatus::Done)
    });
    let r = h.state().doc.runs.last().unwrap();
    assert_eq!(r.method, "fisher");
    let eval = r.eval.as_ref().expect("the Fisher merge was evaluated with the suite");
    assert_eq!(eval.tasks.len(), 2);
    assert!(r.output.with_extension("trajectory.safetensors").exists());

    // The project remembers the suite: a window with nothing open gets it back with the runs.
    let project = dir.path().join("text.msproj");
    h.state_mut().doc.save_project(&project).unwrap();
    let config = mergescope_gui::DocumentConfig {
        plugin_dirs: Vec::new(),
        runs_dir: Some(dir.path().join("runs2")),
        benchmark: None,
        build_demo_if_missing: false,
        demo_arch: None,
    };
    let mut fresh = MergescopeApp::new(
        &egui::Context::default(),
        mergescope_gui::settings::Settings::default(),
        &config,
    );
    fresh.doc.benchmark = None;
    fresh.doc.open_project(&project).unwrap();
    assert_eq!(fresh.doc.suite.as_deref(), Some(suite.as_path()));
    assert!(fresh.doc.benchmark.is_none());
    assert_eq!(fresh.doc.runs.len(), 2);
    assert_eq!(fresh.doc.inputs.experts.len(), 2);
}

/// Runs in a child process for `a_plugin_that_crashes_the_process_is_named_after_restart`
/// (ignored otherwise): a window in `MERGESCOPE_CRASH_RUNS` runs the segfault fixture, which
/// kills the process.
#[test]
#[ignore = "a helper the crash test runs in a child process"]
fn crash_child() {
    let Some(runs) = std::env::var_os("MERGESCOPE_CRASH_RUNS") else {
        return;
    };
    let mut a = app(Path::new(&runs), Theme::Light);
    let lib = slow_plugin().with_file_name(format!(
        "{}mstest_segfault{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    a.doc.load_plugin_file(&lib, false).unwrap();
    let mut h = harness(a);
    h.run_steps(2);
    h.get_by_label("▶ Run merge").click();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        h.step();
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the segfault fixture did not crash the process");
}

/// A plugin that kills the process (SIGSEGV in native code, nothing to catch) is named by the
/// next window started on the same runs folder, with its library and the output it never
/// wrote; the marker is then gone, and a merge that ends normally leaves none.
#[test]
fn a_plugin_that_crashes_the_process_is_named_after_restart() {
    let runs = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "crash_child", "--test-threads", "1"])
        .env("MERGESCOPE_CRASH_RUNS", runs.path())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        child.status.signal(),
        Some(11),
        "the child should die by SIGSEGV: {:?}\n{}",
        child.status,
        String::from_utf8_lossy(&child.stderr)
    );
    let marker = runs.path().join(mergescope_gui::crash_marker::FILE);
    assert!(marker.exists(), "the crash left no marker");

    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(2);
    let crash = h
        .state()
        .doc
        .log
        .iter()
        .find(|l| l.text.contains("probably crashed"))
        .map(|l| l.text.clone())
        .expect("the restarted window reports the crash");
    assert!(
        crash.contains("'mstest-segfault'") && crash.contains("mstest_segfault") && crash.contains("merge-001"),
        "{crash}"
    );
    assert!(!marker.exists(), "the report is given once");

    // A merge that ends normally leaves no marker.
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the merge", |a| last_status(a) == Some(RunStatus::Done));
    assert!(!marker.exists());
}

/// A mergekit configuration opened in the window (as File > Open recipe… or a dropped .yml):
/// its inputs, method and layer-wise parameter fill the window, and the run gives mergekit's
/// tensors (`tests/fixtures/mergekit`, the slerp case with filtered gradients).
#[test]
fn a_mergekit_yaml_opens_in_the_window_and_runs_as_mergekit_ran_it() {
    let mk = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mergekit")
        .canonicalize()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The fixture's model paths are relative to where mergekit ran: the copy names them absolutely.
    let text = std::fs::read_to_string(mk.join("mergekit/slerp_gradient.yml"))
        .unwrap()
        .replace("inputs/", &format!("{}/inputs/", mk.display()));
    let yml = dir.path().join("merge.yml");
    std::fs::write(&yml, text).unwrap();
    let mut h = harness(app(&dir.path().join("runs"), Theme::Light));
    h.run_steps(3);
    h.state_mut().doc.open_recipe(&yml);
    h.run_steps(3);
    let doc = &h.state().doc;
    assert_eq!(doc.method.as_deref(), Some("slerp"));
    assert_eq!(doc.inputs.base.as_ref().unwrap().path, mk.join("inputs/base"));
    let experts: Vec<_> = doc.inputs.experts.iter().map(|e| e.path.clone()).collect();
    assert_eq!(experts, [mk.join("inputs/expert2")]);
    assert_eq!(doc.form.as_ref().unwrap().layer_wise["t"][0]["filter"], "self_attn");
    h.get_by_label("t: layer-wise");
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the slerp run", |a| {
        matches!(last_status(a), Some(RunStatus::Done | RunStatus::Failed))
    });
    let r = &h.state().doc.runs[0];
    assert_eq!(r.status, RunStatus::Done, "{:?}", r.error);
    let read = |p: &Path| {
        let c = mergescope_engine::checkpoint::Checkpoint::open(p).unwrap();
        c.tensors
            .values()
            .map(|t| (t.name.clone(), c.read_f32(t).unwrap()))
            .collect::<Vec<_>>()
    };
    let (ours, theirs) = (read(&r.output), read(&mk.join("mergekit/slerp_gradient")));
    assert_eq!(ours.len(), theirs.len());
    for ((n, a), (m, b)) in ours.iter().zip(&theirs) {
        assert_eq!(n, m);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-6, "{n}: {worst}");
    }
}

/// The radar follows the results table (issue #28): with nothing selected it draws every
/// evaluated merge and says so; a merge that finishes, and a row ticked, redraw it without
/// another click.
#[test]
fn the_radar_follows_the_selection_without_another_click() {
    use mergescope_figures::Figure;
    let runs = tempfile::tempdir().unwrap();
    let mut h = harness(app(runs.path(), Theme::Light));
    h.run_steps(3);
    choose_method(&mut h, "Task arithmetic");
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the first merge", |a| last_status(a) == Some(RunStatus::Done));
    let radar_series = |a: &MergescopeApp| match &a.doc.analysis.figure {
        Some(Figure::Radar(r)) => r.series.iter().map(|s| s.0.clone()).collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    h.get_by_label("Radar").click();
    step_until(&mut h, "the radar", |a| {
        !a.doc.analysis.running() && (a.doc.analysis.figure.is_some() || a.doc.analysis.error.is_some())
    });
    assert_eq!(h.state().doc.analysis.error, None);
    assert_eq!(
        radar_series(h.state()).len(),
        2,
        "the base and the one merge, none selected"
    );
    h.get_by_label_contains("No merges selected");
    // A second merge finishes: the radar redraws by itself with both.
    choose_method(&mut h, "Weight averaging");
    h.get_by_label("▶ Run merge").click();
    step_until(&mut h, "the second merge and the redraw", |a| {
        a.doc.runs.len() == 2
            && a.doc.runs.iter().all(|r| r.status == RunStatus::Done)
            && !a.doc.analysis.running()
            && radar_series(a).len() == 3
    });
    // Ticking the first row narrows it to that merge, again without a click on the view.
    let first = h.state().doc.runs[0].id;
    h.state_mut().view.selected.insert(first);
    step_until(&mut h, "the redraw for the ticked row", |a| {
        !a.doc.analysis.running()
            && a.doc.analysis.runs == (vec![a.doc.runs[0].id], false)
            && radar_series(a).len() == 2
    });
    assert!(h.query_by_label_contains("No merges selected").is_none());
}
