//! mergekit's `slices` with per-source parameters in every slice, against mergekit 0.1.5's own
//! outputs (`tests/fixtures/mergekit/slices/`, made by `scripts/mergekit-parity.py --only
//! slices`: a tiny 6-layer Llama stored as float32, a base and three experts). Each slice's
//! sources carry their own parameters (TIES density and weight, task-arithmetic and linear
//! weights, passthrough scale), slices carry their own `parameters`, gradients restart in every
//! slice, slices list the base in another place, their models in another order, or other models,
//! or merge different numbers of models (each slice then merged on its own, as mergekit does).
//! Every configuration is converted and merged as `mergescope merge --config` does, compared with
//! mergekit's output tensor by tensor, and run again from its converted recipe (`mergescope recipe
//! convert`), which must give the same tensors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed test is a panic by design

use mergescope_engine::merge::MemModel;
use mergescope_interop::mergekit;
use mergescope_interop::recipe::Recipe;
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
    assert_eq!(configs.len(), 7, "the slices fixtures");
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
        // A slice with a base of its own where the next has none (a method whose base is
        // optional): mergescope merges every slice with a base or every slice without.
        (
            format!(
                "merge_method: multislerp\n{}",
                two(
                    src("base", 0, 3, "") + &src("expert1", 0, 3, "") + &src("expert2", 0, 3, ""),
                    src("expert1", 3, 6, "") + &src("expert2", 3, 6, "")
                )
                .replacen("  - sources:\n", "  - base_model: inputs/base\n    sources:\n", 1)
            ),
            &[
                "slices[1].sources",
                "slices[1] merges without a base",
                "slices[0] with one",
                "give every slice a base_model",
            ],
        ),
        // Slices listing only the base (one alone keeps the base's layers, as mergekit does).
        (
            format!("{ties}{}", two(src("base", 0, 3, ""), src("base", 3, 6, ""))),
            &["every slice lists only the base", "nothing to merge"],
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

/// Slices that merge different numbers of models become a recipe whose slices carry their own
/// sources and `params`, each merged on its own; the recipe's TOML reads back the same.
#[test]
fn slices_with_different_numbers_of_models_become_slices_with_their_own_params() {
    let text = std::fs::read_to_string(root().join("mergekit/ties_slices_3_then_2.yml")).unwrap();
    let converted = mergekit::convert(&text, &root().join("merge.yml"), &root().join("x")).unwrap();
    let r = &converted.recipe;
    assert_eq!(r.experts.len(), 3, "the recipe's experts are slices[0]'s");
    assert!(r.params.is_empty(), "{:?}", r.params);
    let counts: Vec<usize> = r.slices.iter().map(|s| s.sources.len()).collect();
    assert_eq!(counts, [4, 3], "the base first, then each slice's models");
    assert_eq!(r.slices[1].sources[0].model, root().join("inputs/base"));
    let p1 = r.slices[1].params.as_ref().unwrap();
    // Slice 1: expert3 (density 0.8) then expert1 (the top level's 0.6); its own lambda; the
    // top-level weight gradient kept as a gradient, which restarts in the slice.
    assert_eq!(p1["density"].as_array().map(Vec::len), Some(2), "{p1}");
    assert_eq!(p1["lambda"].as_float(), Some(0.9), "{p1}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.toml");
    let text = r.to_toml().unwrap();
    std::fs::write(&path, &text).unwrap();
    assert_eq!(&Recipe::load(&path).unwrap(), r, "{text}");
}

/// mergescope's own `[[slices]]` recipes express mergekit's per-slice merges and gradients the
/// same way: a slice with `params` (or another number of sources) is merged on its own, its
/// gradients running over its own layers. Here mergekit's `slerp_slices` written by hand.
#[test]
fn a_hand_written_recipe_restarts_gradients_in_each_slice() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = root().join("inputs");
    let at = |m: &str| inputs.join(m).display().to_string().replace('\\', "/");
    // With `params` on the slices every slice is merged on its own; without them the top-level
    // gradient spreads over all six output layers.
    let recipe = |own: bool, out: &str| {
        let (first, second) = if own {
            (
                "params = {}\n",
                "params = { t = [{ filter = \"self_attn\", value = [0.9, 0.1] }, { value = [0.2, 0.7] }] }\n",
            )
        } else {
            ("", "")
        };
        format!(
            "method = \"slerp\"\nbase = \"{base}\"\nexperts = [\"{e1}\"]\nout = \"{out}\"\n[params]\nt = [0.0, 1.0]\n\
             [[slices]]\nsources = [{{ model = \"{base}\", layers = [0, 3] }}, {{ model = \"{e1}\", layers = [0, 3] }}]\n\
             {first}[[slices]]\nsources = [{{ model = \"{base}\", layers = [3, 6] }}, {{ model = \"{e2}\", layers = [3, 6] }}]\n\
             {second}",
            base = at("base"),
            e1 = at("expert1"),
            e2 = at("expert2"),
            out = dir.path().join(out).display().to_string().replace('\\', "/"),
        )
    };
    let run = |own: bool, out: &str| {
        let path = dir.path().join(format!("{out}.toml"));
        std::fs::write(&path, recipe(own, out)).unwrap();
        let r = Recipe::load(&path).unwrap();
        merge_to_files("mergescope_plugin_slerp", &r.to_request(false).unwrap()).unwrap();
        read_model(&r.out)
    };
    let ours = run(true, "own");
    let theirs = read_model(&root().join("mergekit/slerp_slices"));
    let (worst, at) = tensor_by_tensor("hand-written slerp_slices", &ours, &theirs);
    println!("hand-written recipe: max |Δ| = {worst:.2e} (largest in {at})");
    let spread = run(false, "spread");
    let l1 = "model.layers.1.mlp.up_proj.weight";
    assert!(
        mergescope_tests::max_difference(&spread, &ours) > 1e-4 && spread[l1].data != ours[l1].data,
        "a gradient over all layers differs from one restarting in each slice"
    );
}

/// What a slice merged on its own cannot take names the slice and the fix.
#[test]
fn slices_merged_one_by_one_name_the_slice_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = root().join("inputs");
    let at = |m: &str| inputs.join(m).display().to_string().replace('\\', "/");
    let head = format!(
        "method = \"weight-average\"\nexperts = [\"{e1}\", \"{e2}\"]\nout = \"{out}\"\n",
        e1 = at("expert1"),
        e2 = at("expert2"),
        out = dir.path().join("out").display().to_string().replace('\\', "/"),
    );
    let slices = format!(
        "[[slices]]\nsources = [{{ model = \"{e1}\", layers = [0, 3] }}, {{ model = \"{e2}\", layers = [0, 3] }}]\n\
         [[slices]]\nsources = [{{ model = \"{e3}\", layers = [3, 6] }}]\n",
        e1 = at("expert1"),
        e2 = at("expert2"),
        e3 = at("expert3"),
    );
    let path = dir.path().join("r.toml");
    // A per-model list of two weights for a slice of one model.
    std::fs::write(&path, format!("{head}[params]\nweights = [1.0, 2.0]\n{slices}")).unwrap();
    let req = Recipe::load(&path).unwrap().to_request(false).unwrap();
    let e = merge_to_files("mergescope_plugin_weight_average", &req).unwrap_err();
    assert_contains(&e, &["slices[1]", "weights"]);
    assert!(!dir.path().join("out").exists(), "nothing written");
    // Without the list it merges: the last slice is expert3's layers alone.
    std::fs::write(&path, format!("{head}{slices}")).unwrap();
    let req = Recipe::load(&path).unwrap().to_request(false).unwrap();
    merge_to_files("mergescope_plugin_weight_average", &req).unwrap();
    let out = read_model(&dir.path().join("out"));
    let e3 = read_model(&inputs.join("expert3"));
    assert_eq!(
        out["model.layers.4.mlp.up_proj.weight"],
        e3["model.layers.4.mlp.up_proj.weight"]
    );
    assert_eq!(
        out["lm_head.weight"], e3["lm_head.weight"],
        "post-layer weights from the last slice"
    );
}
