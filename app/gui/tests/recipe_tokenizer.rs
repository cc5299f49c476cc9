#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A recipe's tokenizer settings (issue #22) travel with it into the window: a recipe whose
//! inputs' vocabularies differ, with a `[tokenizer]` table and a chat template, opens in the
//! window and its run gives the tensors, tokenizer, config and chat template that `mergescope
//! merge RECIPE.toml` gives.

mod common;

use common::{convert_recipe, merge_as_cli, open_recipe, same_tensors, step_until, wait_for_run};
use egui_kittest::kittest::Queryable as _;
use mergescope_gui::runs::RunStatus;
use mergescope_interop::recipe::Recipe;
use std::path::Path;
use std::time::Duration;

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
    let (recipe_file, cli_out) = convert_recipe(&yaml, &tk.join("merge.yml"), dir.path()).unwrap();

    let mut h = open_recipe(dir.path(), &recipe_file);
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
    let r = wait_for_run(&mut h).unwrap();
    assert_eq!(r.status, RunStatus::Done, "{:?}", r.error);
    assert!(r.output.is_dir(), "a Hugging Face folder: {}", r.output.display());

    // The CLI's run of the same recipe file.
    let recipe = Recipe::load(&recipe_file).unwrap();
    merge_as_cli(&h, &recipe.method, &recipe.to_request(false).unwrap()).unwrap();
    let ours = same_tensors(&r.output, &cli_out).unwrap();
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
    step_until(&mut h, "the second run", Duration::from_secs(60), |a| {
        a.doc.runs.get(1).is_some_and(|r| !r.status.is_active())
    });
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
