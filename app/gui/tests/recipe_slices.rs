#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A recipe that builds the model from layer slices (issue #22: mergekit's `slices`, here slices
//! that merge different numbers of models) opens in the window, and its run gives the tensors
//! `mergescope merge RECIPE.toml` gives; once its inputs are changed the slices no longer apply.

mod common;

use common::{convert_recipe, merge_as_cli, open_recipe, same_tensors, wait_for_run};
use egui_kittest::kittest::Queryable as _;
use mergescope_gui::runs::RunStatus;
use mergescope_interop::recipe::Recipe;
use std::path::Path;

#[test]
fn a_sliced_recipe_runs_from_the_window_as_the_cli_runs_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/mergekit/slices")
        .canonicalize()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // TIES over a base, three experts on layers 0–3 and two on layers 3–6, parameters per slice.
    let yaml = std::fs::read_to_string(root.join("mergekit/ties_slices_3_then_2.yml")).unwrap();
    let (recipe_file, cli_out) = convert_recipe(&yaml, &root.join("merge.yml"), dir.path()).unwrap();

    let mut h = open_recipe(dir.path(), &recipe_file);
    let doc = &h.state().doc;
    let log: Vec<&String> = doc.log.iter().map(|l| &l.text).collect();
    assert_eq!(doc.method.as_deref(), Some("ties"), "{log:?}");
    let settings = doc.recipe_settings.as_ref().expect("the slices are kept");
    assert_eq!(settings.slices.len(), 2);
    assert_eq!(doc.inputs.experts.len(), 3, "the first slice's models are the inputs");
    assert!(log.iter().any(|l| l.contains("2 layer slices")), "{log:?}");
    doc.can_run().unwrap();
    h.get_by_label("▶ Run merge").click();
    let r = wait_for_run(&mut h).unwrap();
    assert_eq!(r.status, RunStatus::Done, "{:?}", r.error);

    // The CLI's run of the same recipe file.
    let recipe = Recipe::load(&recipe_file).unwrap();
    let request = recipe.to_request(false).unwrap();
    assert!(!request.slices.is_empty());
    merge_as_cli(&h, &recipe.method, &request).unwrap();
    let ours = same_tensors(&r.output, &cli_out).unwrap();
    assert!(ours.iter().any(|t| t.0.contains("layers.5.")), "six output layers");

    // Saved with its recipe: the recipe keeps the slices, so it replays the run.
    let dest = dir.path().join("saved.safetensors");
    h.state_mut().doc.save_output(r.id, &dest).unwrap();
    let saved = Recipe::load(Path::new(&format!("{}.recipe.toml", dest.display()))).unwrap();
    assert_eq!(saved.slices, recipe.slices);

    // Other inputs: the slices no longer apply, and the next run says so.
    let doc = &mut h.state_mut().doc;
    doc.inputs.remove_expert(2);
    doc.run().unwrap();
    assert!(doc.recipe_settings.is_none());
    assert!(
        doc.log.iter().any(|l| l.text.contains("do not apply the layer slices")),
        "{:?}",
        doc.log.iter().map(|l| &l.text).collect::<Vec<_>>()
    );
}
