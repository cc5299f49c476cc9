#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A recipe's tokenizer settings (issue #22) travel with it into the window: a recipe whose
//! inputs' vocabularies differ, with a `[tokenizer]` table and a chat template, opens in the
//! window and its run gives the tensors, tokenizer, config and chat template that `mergescope
//! merge RECIPE.toml` gives.

mod common;

use common::{app, harness};
use egui_kittest::kittest::Queryable as _;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::merge::{ExecOptions, Observer, merge_files};
use mergescope_engine::recipe::Recipe;
use mergescope_gui::runs::RunStatus;
use mergescope_gui::settings::Theme;
use std::path::Path;
use std::time::{Duration, Instant};

fn tensors(p: &Path) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let c = Checkpoint::open(p).unwrap();
    c.tensors
        .values()
        .map(|t| (t.name.clone(), t.shape.clone(), c.read_f32(t).unwrap()))
        .collect()
}

#[test]
fn a_recipe_with_tokenizer_settings_runs_from_the_window_as_the_cli_runs_it() {
    let tk = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mergekit/tokenizer_union")
        .canonicalize()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // `mergescope recipe convert` of the tokenizer-block configuration: union of three
    // vocabularies (64, 66 and 65 rows), per-token sources, padding to 8, `chat_template: auto`.
    let yaml = std::fs::read_to_string(tk.join("mergekit/task_arithmetic_tokenizer_block.yml")).unwrap();
    let cli_out = dir.path().join("cli");
    let converted = mergescope_engine::mergekit::convert(&yaml, &tk.join("merge.yml"), &cli_out).unwrap();
    let recipe_file = dir.path().join("recipe.toml");
    std::fs::write(&recipe_file, converted.recipe.to_toml().unwrap()).unwrap();

    let mut h = harness(app(&dir.path().join("runs"), Theme::Light));
    h.run_steps(3);
    h.state_mut().doc.open_recipe(&recipe_file);
    h.run_steps(3);
    let doc = &h.state().doc;
    assert_eq!(doc.method.as_deref(), Some("task-arithmetic"));
    let settings = doc.recipe_settings.as_ref().expect("the tokenizer settings are kept");
    assert_eq!(
        settings
            .folder
            .as_ref()
            .unwrap()
            .tokenizer
            .as_ref()
            .unwrap()
            .pad_to_multiple_of,
        Some(8)
    );
    assert!(
        doc.log.iter().any(|l| l.text.contains("tokenizer settings apply")),
        "{:?}",
        doc.log.iter().map(|l| &l.text).collect::<Vec<_>>()
    );
    // The inputs' vocabulary tensors differ in size; the merge aligns them, so the run is allowed.
    doc.can_run().unwrap();
    h.get_by_label("▶ Run merge").click();
    let start = Instant::now();
    while !matches!(
        h.state().doc.runs.last().map(|r| r.status),
        Some(RunStatus::Done | RunStatus::Failed)
    ) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for the run"
        );
        h.step();
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = h.state().doc.runs[0].clone();
    assert_eq!(r.status, RunStatus::Done, "{:?}", r.error);
    assert!(r.output.is_dir(), "a Hugging Face folder: {}", r.output.display());

    // The CLI's run of the same recipe file.
    let recipe = Recipe::load(&recipe_file).unwrap();
    let plugin = h
        .state()
        .doc
        .registry
        .plugins
        .iter()
        .find(|p| p.id() == recipe.method)
        .unwrap()
        .clone();
    let cancel = std::sync::atomic::AtomicBool::new(false);
    merge_files(
        &plugin,
        &recipe.to_request(false).unwrap(),
        &ExecOptions::default(),
        Observer::silent(),
        &cancel,
    )
    .unwrap();
    let (ours, cli) = (tensors(&r.output), tensors(&cli_out));
    assert_eq!(ours.len(), cli.len());
    for ((n, s, a), (m, t, b)) in ours.iter().zip(&cli) {
        assert_eq!((n, s), (m, t));
        assert!(a == b, "{n} differs from the CLI's");
    }
    assert_eq!(ours.iter().find(|t| t.0 == "lm_head.weight").unwrap().1, [72, 32]);
    for file in [
        "tokenizer.json",
        "config.json",
        "chat_template.jinja",
        "tokenizer_config.json",
    ] {
        assert_eq!(
            std::fs::read(r.output.join(file)).unwrap(),
            std::fs::read(cli_out.join(file)).unwrap(),
            "{file}"
        );
    }

    // Other inputs: the settings no longer apply, and the size check is back.
    let doc = &mut h.state_mut().doc;
    doc.inputs.remove_expert(1);
    let e = doc.can_run().unwrap_err().to_string();
    assert!(e.contains("does not match"), "{e}");
    // Inputs of one vocabulary: the run goes without the settings (a bare file), and says so.
    let twin = dir.path().join("expert1-twin");
    std::fs::create_dir(&twin).unwrap();
    for f in std::fs::read_dir(tk.join("inputs/expert1")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, twin.join(f.file_name().unwrap())).unwrap();
    }
    doc.inputs.base = None;
    doc.inputs.add_expert(&twin, None);
    doc.inputs.recheck();
    doc.run().unwrap();
    assert!(doc.recipe_settings.is_none());
    assert!(
        doc.log
            .iter()
            .any(|l| l.text.contains("do not apply the tokenizer settings")),
        "{:?}",
        doc.log.iter().map(|l| &l.text).collect::<Vec<_>>()
    );
    assert_eq!(doc.runs[1].output.extension().unwrap(), "safetensors");
    let start = Instant::now();
    while h.state().doc.runs[1].status.is_active() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for the second run"
        );
        h.step();
        std::thread::sleep(Duration::from_millis(10));
    }
    let doc = &mut h.state_mut().doc;

    // The configuration itself opens with the same settings (and keeps itself in the folder).
    let yml = dir.path().join("merge.yml");
    std::fs::write(&yml, yaml.replace("inputs/", &format!("{}/inputs/", tk.display()))).unwrap();
    doc.open_recipe(&yml);
    let settings = doc
        .recipe_settings
        .as_ref()
        .expect("the YAML's tokenizer settings are kept");
    assert_eq!(
        settings.folder.as_ref().unwrap().tokenizer.as_ref().map(|t| &t.tokens),
        recipe.tokenizer_spec("").unwrap().as_ref().map(|t| &t.tokens)
    );
    assert_eq!(
        settings
            .folder
            .as_ref()
            .unwrap()
            .source_recipe
            .as_ref()
            .map(|(name, _)| name.as_str()),
        Some("mergekit_config.yml")
    );
    doc.can_run().unwrap();
}
