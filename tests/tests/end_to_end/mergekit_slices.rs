//! mergekit's `slices` with per-source parameters in every slice, against mergekit 0.1.5's own
//! outputs (`tests/fixtures/mergekit/slices/`, made by `scripts/mergekit-parity.py --only
//! slices`: a tiny 6-layer Llama stored as float32, a base and three experts). Each slice's
//! sources carry their own parameters (TIES density and weight, task-arithmetic and linear
//! weights, passthrough scale), slices carry their own `parameters`, gradients restart in every
//! slice, slices list the base in another place, their models in another order, or other models.
//! Every configuration is converted and merged as `mergescope merge --config` does, compared with
//! mergekit's output tensor by tensor, and run again from its converted recipe (`mergescope recipe
//! convert`), which must give the same tensors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::MemModel;
use mergescope_engine::mergekit;
use mergescope_engine::recipe::Recipe;
use mergescope_tests::{assert_contains, merge_to_files, read_model};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mergekit/slices")
}

/// The inputs and mergekit's outputs are float32 and values are of order 0.01 to 1: a few units
/// in the last place of f32 (mergekit sums in float32 torch, mergescope in f64 and fused).
const AGREEMENT: f64 = 1e-6;

/// Converts the YAML `text` as if it lay in the fixtures folder (mergekit ran there) and merges
/// it into `out`; the converted recipe.
fn run_yaml(text: &str, out: &Path) -> Result<Recipe, String> {
    let converted = mergekit::convert(text, &root().join("merge.yml"), out).map_err(|e| e.to_string())?;
    let lib = format!("mergescope_plugin_{}", converted.recipe.method.replace('-', "_"));
    merge_to_files(&lib, &converted.to_request(false).map_err(|e| e.to_string())?)?;
    Ok(converted.recipe)
}

/// (largest |Δ|, the tensor it is in), after checking both have the same tensors and shapes.
fn tensor_by_tensor(case: &str, ours: &MemModel, theirs: &MemModel) -> (f64, String) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{case}: tensor names"
    );
    let mut worst = (0f64, String::new());
    for (name, t) in ours {
        assert_eq!(t.shape, theirs[name].shape, "{case}: {name}: shape");
        let d = t
            .data
            .iter()
            .zip(&theirs[name].data)
            .map(|(x, y)| f64::from((x - y).abs()))
            .fold(0.0, f64::max);
        assert!(d <= AGREEMENT, "{case}: {name}: max |Δ| {d:e} against mergekit");
        if d >= worst.0 {
            worst = (d, name.clone());
        }
    }
    worst
}

#[test]
fn slices_with_per_source_parameters_agree_with_mergekit() {
    let manifest: Value = serde_json::from_slice(&std::fs::read(root().join("manifest.json")).unwrap()).unwrap();
    let configs = manifest["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 5, "the slices fixtures");
    let dir = tempfile::tempdir().unwrap();
    for cfg in configs {
        let case = cfg["name"].as_str().unwrap();
        let text = std::fs::read_to_string(root().join(cfg["config"].as_str().unwrap())).unwrap();
        let out = dir.path().join(case);
        let recipe = run_yaml(&text, &out).unwrap_or_else(|e| panic!("{case}: {e}"));
        let ours = read_model(&out);
        let theirs = read_model(&root().join(cfg["output"].as_str().unwrap()));
        let (worst, at) = tensor_by_tensor(case, &ours, &theirs);
        println!(
            "mergekit parity: {case:<26} max |Δ| = {worst:.2e} over {} tensors (largest in {at})",
            theirs.len()
        );
        let config: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(
            config["num_hidden_layers"], cfg["num_hidden_layers"],
            "{case}: layer count"
        );

        // `mergescope recipe convert` writes the same merge as a recipe.
        let toml_path = dir.path().join(format!("{case}.toml"));
        std::fs::write(&toml_path, recipe.to_toml().unwrap()).unwrap();
        let mut again = Recipe::load(&toml_path).unwrap_or_else(|e| panic!("{case}: recipe: {e}"));
        again.out = dir.path().join(format!("{case}-recipe"));
        let lib = format!("mergescope_plugin_{}", again.method.replace('-', "_"));
        merge_to_files(&lib, &again.to_request(false).unwrap()).unwrap_or_else(|e| panic!("{case}: {e}"));
        let from_recipe = read_model(&again.out);
        assert_eq!(
            mergescope_tests::max_difference(&from_recipe, &ours),
            0.0,
            "{case}: the converted recipe"
        );
    }
}

/// Per-slice values the host resolves per tensor: a parameter that differs between slices
/// becomes a `{filter, value}` list over the output layers, a gradient evaluated at each layer's
/// place in its own slice.
#[test]
fn a_gradient_restarts_in_every_slice() {
    let text = "merge_method: slerp\nbase_model: inputs/base\nparameters: {t: [0.0, 1.0]}\nslices:\n  - sources:\n      \
                - {model: inputs/base, layer_range: [0, 3]}\n      - {model: inputs/expert1, layer_range: [0, 3]}\n  - \
                sources:\n      - {model: inputs/base, layer_range: [3, 5]}\n      - {model: inputs/expert1, \
                layer_range: [3, 5]}\n";
    let converted = mergekit::convert(text, &root().join("merge.yml"), &root().join("x")).unwrap();
    let params = converted.recipe.params_json();
    let t = &params["t"];
    // Output layers 0, 1, 2 at 0, 0.5, 1; layers 3, 4 at 0, 1; every other tensor at 0 (the last
    // entry; layers at 0 need no entry of their own).
    let entries = t.as_array().unwrap_or_else(|| panic!("{t}"));
    let value_of = |filter: &str| {
        entries
            .iter()
            .find(|e| e.get("filter").and_then(|f| f.as_str()) == Some(filter))
            .map(|e| e["value"].as_f64().unwrap())
    };
    assert_eq!(value_of("model.layers.0."), None);
    assert_eq!(value_of("model.layers.1."), Some(0.5));
    assert_eq!(value_of("model.layers.2."), Some(1.0));
    assert_eq!(value_of("model.layers.3."), None);
    assert_eq!(value_of("model.layers.4."), Some(1.0));
    assert_eq!(entries.last().unwrap()["value"].as_f64(), Some(0.0));
    assert_eq!(entries.len(), 4, "{t}");
}

#[test]
fn slices_mergescope_cannot_merge_name_the_key_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let src = |m: &str, a: usize, b: usize, params: &str| {
        format!("      - {{model: inputs/{m}, layer_range: [{a}, {b}]{params}}}\n")
    };
    let two = |first: String, second: String| format!("slices:\n  - sources:\n{first}  - sources:\n{second}");
    let ties = "merge_method: ties\nbase_model: inputs/base\n";
    let cases: Vec<(String, &[&str])> = vec![
        // A different number of models in a slice: mergekit merges it, mergescope cannot.
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, "") + &src("expert2", 0, 3, ""),
                    src("base", 3, 6, "") + &src("expert1", 3, 6, "")
                )
            ),
            &["slices[1].sources", "as many sources", "1 model besides a base"],
        ),
        // The base missing from a slice: mergekit refuses it too.
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, ""),
                    src("expert2", 3, 6, "") + &src("expert1", 3, 6, "")
                )
            ),
            &["not among the sources of slices[1]", "Base input is not present"],
        ),
        // A model twice in one slice: mergekit refuses it too.
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, ""),
                    src("base", 3, 6, "") + &src("base", 3, 6, "")
                )
            ),
            &[
                "slices[1].sources[0] and slices[1].sources[1]",
                "Duplicate merge inputs",
            ],
        ),
        // A parameter that is not a number cannot vary by layer.
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, ""),
                    src("base", 3, 6, "") + &src("expert1", 3, 6, "")
                )
                .replacen(
                    "  - sources:\n",
                    "  - parameters: {normalize: false}\n    sources:\n",
                    1
                )
            ),
            &["'normalize'", "differs between the slices", "not a number"],
        ),
        // Unknown keys, in a slice and in a later slice's source's parameters.
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, ""),
                    src("base", 3, 6, "") + &src("expert1", 3, 6, "")
                )
                .replacen("  - sources:\n", "  - layer_rnge: [0, 1]\n    sources:\n", 1)
            ),
            &["slices[0]: unknown key 'layer_rnge'", "sources, parameters, base_model"],
        ),
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, ""),
                    src("base", 3, 6, "") + &src("expert1", 3, 6, ", parameters: {densty: 0.5}")
                )
            ),
            &["slices[1].sources[1].parameters", "no parameter 'densty'", "density"],
        ),
        // A parameter without a default set in some slices only.
        (
            format!(
                "merge_method: linear\n{}",
                two(
                    src("expert1", 0, 3, ", parameters: {weight: 1}")
                        + &src("expert2", 0, 3, ", parameters: {weight: 2}"),
                    src("expert1", 3, 6, "") + &src("expert2", 3, 6, "")
                )
            ),
            &["'weight'", "is set for slices[0] but not for slices[1]"],
        ),
        // Sources of a slice spanning different numbers of layers.
        (
            format!(
                "{ties}{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 2, ""),
                    src("base", 3, 6, "") + &src("expert1", 3, 6, "")
                )
            ),
            &["slices[0]", "different numbers of layers", "slices[0].sources[1]"],
        ),
    ];
    for (text, needles) in &cases {
        let e = mergekit::convert(text, &root().join("merge.yml"), &out)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_contains(&e, needles);
        assert!(e.contains("merge.yml"), "{e}: names the file");
    }
}
