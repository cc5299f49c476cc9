#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Experiments window's benchmark control and the text benchmark, driven by clicks
//! (egui_kittest, through its AccessKit tree): without a text build the control says how to
//! make one and the sweep cannot start; with one (the cache's, or the open suite's folder)
//! choosing it puts the sweep on the text benchmark (`arch = "text"`, the `paper-002` preset
//! for it), and the open image benchmark can be chosen back. The builds here are folders with
//! the files that mark a text build, not real ones: nothing is trained; Run on such a folder
//! fails before any training, saying what the folder lacks. The analysis panel's oracle view
//! (seed 004) says how to make a text build without one, and runs on the open suite's build.
//! Its form takes `analyze oracle`'s --examples, --lr, --epochs and --precision with the CLI's
//! defaults and messages, is locked while the oracle runs, and runs it to its figure on a text
//! build of a tiny random BERT. State is checked, not pixels (the form shows the build's
//! temporary path).

mod common;

use candle_core::Device;
use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT as _, Queryable as _, by};
use mergescope_gui::MergescopeApp;
use mergescope_gui::analysis::{ORACLE_NEEDS_TEXT, ViewKind};
use mergescope_gui::experiments::benchmark_id;
use mergescope_gui::settings::Theme;
use mergescope_lab::text_bench::build_text;
use mergescope_lab::text_bench::oracle::{OracleSettings, OracleText, Precision};
use mergescope_lab::text_bench::tiny::{tasks_named, tiny_backbone, tiny_recipe};
use std::path::Path;

/// Writes the files that make `dir` look like a text build (`suite.toml`, `base/config.json`).
fn fake_text_build(dir: &Path) {
    std::fs::create_dir_all(dir.join("base")).unwrap();
    std::fs::write(dir.join("suite.toml"), "name = \"text\"\n").unwrap();
    std::fs::write(dir.join("base").join("config.json"), "{}").unwrap();
}

/// Steps frames until the analysis in flight ends (or fails after 30 s).
fn wait_for_analysis(h: &mut Harness<'static, MergescopeApp>) {
    let start = std::time::Instant::now();
    while h.state().doc.analysis.running() {
        assert!(start.elapsed().as_secs() < 30, "timed out waiting for the analysis");
        h.step();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    h.run_steps(3);
}

/// Opens the benchmark control's list and clicks its entry `entry`.
fn choose(h: &mut Harness<'static, MergescopeApp>, entry: &str) {
    h.get(by().role(Role::ComboBox).label("Benchmark")).click();
    h.run_steps(3);
    h.get_by_label(entry).click();
    h.run_steps(3);
}

#[test]
fn the_text_benchmark_is_chosen_in_the_experiments_window_and_says_how_to_build_one() {
    let cache = tempfile::tempdir().unwrap();
    // SAFETY: set before the window (or any other thread of this test binary) starts.
    unsafe { std::env::set_var("MERGESCOPE_CACHE_DIR", cache.path()) };
    let runs = tempfile::tempdir().unwrap();
    let mut h = common::harness(common::app(runs.path(), Theme::Light));
    h.run_steps(3);
    h.get_by_label("View").click();
    h.run_steps(2);
    h.get_by_label_contains("Experiments: fine-tuning sweeps…").click();
    h.run_steps(3);
    assert_eq!(h.state().doc.experiments.spec.arch, "mlp");

    // No text build: the list offers none, and says how to make one.
    h.get(by().role(Role::ComboBox).label("Benchmark")).click();
    h.run_steps(3);
    assert!(h.query_by_label_contains("text · all-MiniLM-L6-v2").is_none());
    let hint = h.get_by_label("text · none built: Benchmark > Build text benchmark makes one");
    assert!(hint.accesskit_node().is_disabled());
    h.get(by().role(Role::ComboBox).label("Benchmark")).click();
    h.run_steps(3);

    // The oracle view without a text build says how to make one (and trains nothing).
    let selected = Default::default();
    h.state_mut().doc.analyze(ViewKind::Oracle, &selected);
    wait_for_analysis(&mut h);
    let error = h.state().doc.analysis.error.clone().unwrap_or_default();
    assert_eq!(error, ORACLE_NEEDS_TEXT);
    assert!(h.state().doc.analysis.figure.is_none());
    h.get_by_label("No text benchmark build: Benchmark > Build text benchmark makes one");
    h.get_by_label("Close").click();
    h.run_steps(2);

    // A text sweep whose build is missing names the menu entry and cannot run.
    let ids: Vec<String> = h
        .state()
        .doc
        .registry
        .plugins
        .iter()
        .map(|p| p.id().to_owned())
        .collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    h.state_mut().doc.experiments.use_text_benchmark("demo", &ids);
    h.run_steps(3);
    let why = h.state().doc.experiments.check(None, &ids).unwrap_err().to_string();
    assert!(why.contains("Benchmark > Build text benchmark"), "{why}");
    h.get_by_label_contains("no text benchmark build in");
    assert!(
        h.get_by_label("▶ Run sweep").accesskit_node().is_disabled(),
        "no build, no run"
    );
    choose(&mut h, "mlp seed 0 (the open benchmark)");
    assert_eq!(h.state().doc.experiments.spec.arch, "mlp");

    // The cache's build and the open suite's folder are offered; choosing one makes the sweep
    // the text benchmark's paper-002.
    let cached = cache.path().join("demo").join("text-minilm-seed0");
    fake_text_build(&cached);
    let mine = runs.path().join("my-text-build");
    fake_text_build(&mine);
    h.state_mut().doc.suite = Some(mine.join("suite.toml"));
    h.run_steps(3);
    choose(&mut h, "text · all-MiniLM-L6-v2 (text-minilm-seed0)");
    let e = &h.state().doc.experiments;
    assert_eq!(e.spec.arch, "text");
    assert_eq!(e.name, "paper-002");
    assert_eq!(e.spec.benchmark, cached.display().to_string());
    assert_eq!(e.spec.defaults.optimizer, "adamw", "the text preset, not the image one");
    assert!(e.folder.ends_with("paper-002-text"), "{}", e.folder.display());
    e.check(None, &ids).unwrap();
    h.state_mut().doc.experiments.spec.eval_examples = Some(200);
    let why = h.state().doc.experiments.check(None, &ids).unwrap_err().to_string();
    assert!(why.contains("tick 'all'"), "{why}");
    h.state_mut().doc.experiments.spec.eval_examples = None;
    choose(&mut h, "text · all-MiniLM-L6-v2 (my-text-build)");
    assert_eq!(h.state().doc.experiments.spec.benchmark, mine.display().to_string());
    assert_eq!(h.state().doc.experiments.spec.arch, "text");

    // Run on a folder that only looks like a build fails before training, saying why.
    h.get_by_label("▶ Run sweep").click();
    h.run_steps(3);
    let e = &h.state().doc.experiments;
    assert!(!e.running());
    let error = e.error.clone().unwrap_or_default();
    assert!(error.contains("my-text-build"), "{error}");

    // The oracle runs on the open suite's build: this one is no real build, so it fails
    // before any training, naming the folder.
    h.state_mut().doc.analyze(ViewKind::Oracle, &selected);
    assert_eq!(
        h.state().doc.analysis.inputs.text_build.as_deref(),
        Some(mine.as_path())
    );
    wait_for_analysis(&mut h);
    let error = h.state().doc.analysis.error.clone().unwrap_or_default();
    assert!(
        error.starts_with("the oracle on '") && error.contains("my-text-build"),
        "{error}"
    );
    h.get_by_label("Close").click();
    h.run_steps(2);

    // And back to the open image benchmark.
    choose(&mut h, "mlp seed 0 (the open benchmark)");
    let e = &h.state().doc.experiments;
    assert_eq!(e.spec.arch, "mlp");
    let open = h.state().doc.benchmark.as_ref().unwrap();
    assert_eq!(e.spec.benchmark, benchmark_id(open));
}

/// The text input labelled `name`, its whole value replaced by `text`.
fn set_field(h: &mut Harness<'static, MergescopeApp>, name: &str, text: &str) {
    h.get(by().role(Role::TextInput).label(name))
        .set_text_value_accesskit(text);
    h.run_steps(2);
}

fn disabled(h: &Harness<'static, MergescopeApp>, role: Role, name: &str) -> bool {
    h.get(by().role(role).label(name)).accesskit_node().is_disabled()
}

#[test]
fn the_oracle_form_takes_the_cli_options_is_locked_while_it_runs_and_draws_the_figure() {
    // The open suite's build comes before the cache's, so the cache is left as it is (the other
    // test of this binary points it elsewhere).
    let runs = tempfile::tempdir().unwrap();
    // A real text build of a tiny random BERT: two tasks, 8 train and test texts each.
    let backbone = tiny_backbone(runs.path()).unwrap();
    let tasks = tasks_named(&["word_sentiment", "name_gender"]).unwrap();
    let recipe = tiny_recipe(4, 8, 8);
    let build = runs.path().join("tiny-text");
    let no = std::sync::atomic::AtomicBool::new(false);
    build_text(&backbone, &tasks, &recipe, &build, &Device::Cpu, &mut |_| {}, &no).unwrap();

    let mut h = common::harness(common::app(runs.path(), Theme::Light));
    h.state_mut().doc.suite = Some(build.join("suite.toml"));
    h.run_steps(3);
    // The fields hold the CLI's defaults; on a build of 8 texts per task the default batch of
    // 32 is refused as the CLI refuses it, naming the task and what to give.
    let selected = Default::default();
    h.state_mut().doc.analyze(ViewKind::Oracle, &selected);
    wait_for_analysis(&mut h);
    let error = h.state().doc.analysis.error.clone().unwrap_or_default();
    assert!(
        error.contains("--examples 32:") && error.contains("give --examples 8 or fewer"),
        "{error}"
    );
    assert_eq!(h.state().doc.analysis.options.oracle, OracleText::default());
    for (name, value) in [
        ("train texts / task", "32"),
        ("learning rates η", "2.5e-6, 5e-6, 1e-5, 2e-5"),
        ("epochs", "1, 2, 4"),
    ] {
        let field = h.get(by().role(Role::TextInput).label(name));
        assert_eq!(field.accesskit_node().value().as_deref(), Some(value), "{name}");
    }
    assert!(!disabled(&h, Role::Button, "▶ Run oracle"));
    assert!(disabled(&h, Role::Button, "Defaults"), "nothing to reset");

    // A bad value reads as the CLI's message for the same option, and Run is disabled.
    for (name, text, message) in [
        (
            "learning rates η",
            "0",
            "--lr 0: every learning rate η must be a positive number",
        ),
        (
            "learning rates η",
            "1e-5,,2e-5",
            "--lr '1e-5,,2e-5': an empty entry between commas",
        ),
        ("epochs", "-2", "--epochs '-2' is negative"),
        (
            "train texts / task",
            "0",
            "--examples 0: each task needs at least one train text",
        ),
    ] {
        set_field(&mut h, name, text);
        h.get_by_label_contains(message);
        assert!(disabled(&h, Role::Button, "▶ Run oracle"), "{text}");
        h.get_by_label("Defaults").click();
        h.run_steps(2);
    }
    set_field(&mut h, "train texts / task", "8");
    set_field(&mut h, "learning rates η", "0.01, 0.02");
    set_field(&mut h, "epochs", "1,2");
    h.get(by().role(Role::Button).label("f32")).click();
    h.run_steps(2);
    let settings = (h.state().doc.analysis.options.oracle)
        .settings(OracleSettings::default())
        .unwrap();
    assert_eq!(
        (settings.examples, &settings.lrs, &settings.epochs, settings.precision),
        (8, &vec![0.01, 0.02], &vec![1, 2], Precision::F32)
    );

    // While it runs, the form is locked: a train file that is a pipe holds the oracle at
    // reading its data until the test writes the texts into it.
    let train = build.join("data").join("name_gender.train.jsonl");
    let texts = std::fs::read(&train).unwrap();
    std::fs::remove_file(&train).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&train).status().unwrap();
    assert!(made.success());
    h.get_by_label("▶ Run oracle").click();
    h.run_steps(2);
    assert!(h.state().doc.analysis.running(), "{:?}", h.state().doc.analysis.error);
    for name in ["train texts / task", "learning rates η", "epochs"] {
        assert!(disabled(&h, Role::TextInput, name), "{name} while running");
    }
    assert!(disabled(&h, Role::Button, "▶ Run oracle"));
    assert!(disabled(&h, Role::Button, "f64"));
    // Opening a pipe to write waits for its reader: the oracle's thread, held at it.
    std::thread::spawn(move || std::fs::write(&train, texts).unwrap());
    wait_for_analysis(&mut h);
    let a = &h.state().doc.analysis;
    assert!(a.error.is_none(), "{:?}", a.error);
    let figure = a.figure.as_ref().expect("the oracle's figure");
    assert!(
        figure.title().contains("multi-task GD (seed 004): 2 tasks, α = 1, f32"),
        "{}",
        figure.title()
    );
    assert!(!disabled(&h, Role::TextInput, "epochs"), "unlocked when done");
}
