//! The remaining items of mergekit parity (#22), against the reference libraries' own outputs:
//!
//! - a PEFT adapter with `lora_B.bias` (`lora_bias=True`, `tests/fixtures/peft/adapter-bias` on
//!   `base-bias`, made by `scripts/peft-fixtures.py`) reads as PEFT's `merge_and_unload()`
//!   (`merged-bias`): the layer's bias gets lora_B.bias · scaling;
//! - `tokenizer_source: union` with `slices` (`tests/fixtures/mergekit/tokenizer_union`,
//!   `*_slices_union`, made by `scripts/mergekit-parity.py --only tokenizer-union`) gives
//!   mergekit 0.1.5's vocabulary and tensors, rows matched by token;
//! - `extract-lora --sv-epsilon` gives mergekit-extract-lora's ranks, and `--include-regex`/
//!   `--exclude-regex` its modules.

use super::mergekit_tokenizer::{manifest_vocab, max_diff, run_yaml};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::merge::MemTensor;
use mergescope_interop::lora;
use mergescope_interop::request::open_expert;
use mergescope_tests::{assert_contains, max_difference, read_model, tensors_of, vocab_of};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

// --- lora_B.bias --------------------------------------------------------------------------------

#[test]
fn an_adapter_with_lora_bias_reads_as_peft_merges_it() {
    let peft = fixtures().join("peft");
    let base = peft.join("base-bias");
    let applied = open_expert(&peft.join("adapter-bias"), Some(&base)).unwrap();
    let ours = tensors_of(&applied);
    let theirs = read_model(&peft.join("merged-bias"));
    let worst = max_difference(&ours, &theirs);
    println!("lora_bias: max |Δ| against PEFT's merge_and_unload {worst:.2e}");
    // PEFT adds in float32 to the bf16 base upcast to float32; mergescope in f64.
    assert!(worst < 1e-6, "{worst}");
    // The adapted weights and their biases changed, nothing else.
    let plain = read_model(&base);
    let changed: Vec<&str> = ours
        .keys()
        .filter(|n| ours[*n].data != plain[*n].data)
        .map(String::as_str)
        .collect();
    let mut expected = Vec::new();
    for l in 0..2 {
        for m in ["q_proj", "v_proj"] {
            for p in ["bias", "weight"] {
                expected.push(format!("model.layers.{l}.self_attn.{m}.{p}"));
            }
        }
    }
    assert_eq!(changed, expected);
    // The bias update alone: b + (alpha / r) · lora_B.bias, alpha 4, r 2.
    let bias = "model.layers.1.self_attn.v_proj.bias";
    let adapter = read_model(&peft.join("adapter-bias/adapter_model.safetensors"));
    let update = &adapter["base_model.model.model.layers.1.self_attn.v_proj.lora_B.bias"].data;
    for ((o, b), u) in ours[bias].data.iter().zip(&plain[bias].data).zip(update) {
        assert!((f64::from(*o) - (f64::from(*b) + 2.0 * f64::from(*u))).abs() < 1e-6);
    }
    // Ranges of the bias read alone are the whole tensor's.
    let t = &applied.tensors[bias];
    let whole = applied.read_f32(t).unwrap();
    for (from, len) in [(0, 5), (7, 20), (31, 1)] {
        assert_eq!(applied.read_f32_range(t, from, len).unwrap(), whole[from..from + len]);
    }
}

#[test]
fn lora_bias_on_a_base_without_that_bias_names_the_tensor() {
    let e = open_expert(
        &fixtures().join("peft/adapter-bias"),
        Some(&fixtures().join("mergekit/inputs/base")),
    )
    .unwrap_err()
    .to_string();
    assert_contains(
        &e,
        &[
            "model.layers.0.self_attn.q_proj.lora_B.bias",
            "'model.layers.0.self_attn.q_proj.bias'",
            "lora_bias=True",
            "the base has no such tensor",
            "base_model_name_or_path",
        ],
    );
}

// --- tokenizer union with slices ----------------------------------------------------------------

fn union_fixtures() -> PathBuf {
    fixtures().join("mergekit/tokenizer_union")
}

#[test]
fn slices_with_a_union_vocabulary_give_mergekits_tensors() {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(union_fixtures().join("manifest.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<&Value> = manifest["configs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"].as_str().unwrap().contains("_slices_"))
        .collect();
    assert_eq!(cases.len(), 2);
    for config in cases {
        let case = config["name"].as_str().unwrap();
        let text = std::fs::read_to_string(union_fixtures().join(config["config"].as_str().unwrap())).unwrap();
        let out = dir.path().join(case);
        run_yaml(&text, &out).unwrap_or_else(|e| panic!("{case}: {e}"));

        let ours_vocab = vocab_of(&out.join("tokenizer.json"));
        let theirs_vocab = manifest_vocab(config);
        assert_eq!(
            ours_vocab.keys().collect::<Vec<_>>(),
            theirs_vocab.keys().collect::<Vec<_>>(),
            "{case}: tokens"
        );
        let cfg: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["vocab_size"], config["vocab_size_in_config"], "{case}: vocab_size");
        assert_eq!(cfg["num_hidden_layers"], 2, "{case}");

        let (ours, theirs) = (
            read_model(&out),
            read_model(&union_fixtures().join(config["output"].as_str().unwrap())),
        );
        let worst = max_diff(case, &ours, &theirs, &ours_vocab, &theirs_vocab);
        println!(
            "{case}: {} tokens, max |Δ| against mergekit {worst:.2e}",
            ours_vocab.len()
        );
        assert!(worst <= 1e-6, "{case}: max |Δ| {worst}");
    }
}

// --- extract-lora --sv-epsilon ------------------------------------------------------------------

#[test]
fn sv_epsilon_gives_mergekits_ranks() {
    let base = fixtures().join("mergekit/inputs/base");
    let base_ck = Checkpoint::open(&base).unwrap();
    let model_path = fixtures().join("peft/merged-plain");
    let model = Checkpoint::open(&model_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sv");
    let options = lora::ExtractOptions {
        rank: 4,
        sv_epsilon: 0.17,
        ..Default::default()
    };
    let report = lora::extract_with(&base_ck, &model, &out, &options).unwrap();
    let config: Value = serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap()).unwrap();
    // mergekit-extract-lora --model tests/fixtures/peft/merged-plain --base-model
    // tests/fixtures/mergekit/inputs/base --max-rank 4 --sv-epsilon 0.17 (mergekit 0.1.5) writes
    // r 4 and these ranks (layers.1.mlp.up_proj keeps 4), and rank 0 for the matrices whose
    // singular values are all below 0.17 (the unchanged ones and layers.1.self_attn.v_proj),
    // which PEFT cannot load: mergescope leaves those out, with a note.
    let expected = serde_json::json!({
        "model.layers.0.mlp.up_proj": 3,
        "model.layers.0.self_attn.q_proj": 1,
        "model.layers.0.self_attn.v_proj": 2,
        "model.layers.1.self_attn.q_proj": 2,
    });
    assert_eq!(config["r"], 4);
    assert_eq!(config["rank_pattern"], expected);
    assert_eq!(report.adapted, 5);
    assert_contains(
        &report.notes.join("\n"),
        &["--sv-epsilon 0.17", "model.layers.1.self_attn.v_proj.weight"],
    );
    // The truncation error is the dropped singular values (torch.linalg.svdvals of the task
    // vectors: layers.0.mlp.up_proj's 4th is 0.16726).
    let back = tensors_of(&open_expert(&out, Some(&base)).unwrap());
    let full = read_model(&model_path);
    let name = "model.layers.0.mlp.up_proj.weight";
    let err: f64 = back[name]
        .data
        .iter()
        .zip(&full[name].data)
        .map(|(x, y)| f64::from(x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((err - 0.16726).abs() < 1e-4, "{err}");
    // Dropped entirely: layers.1.self_attn.v_proj is the base's.
    let v = "model.layers.1.self_attn.v_proj.weight";
    assert_eq!(back[v].data, read_model(&base)[v].data);

    // A threshold above every singular value leaves nothing; a negative one is refused.
    for (eps, needles) in [
        (10.0, &["nothing to extract", "smaller --sv-epsilon"][..]),
        (-1.0, &["--sv-epsilon -1", "not a threshold"][..]),
    ] {
        let e = lora::extract_with(
            &base_ck,
            &model,
            &dir.path().join(format!("bad{eps}")),
            &lora::ExtractOptions {
                rank: 4,
                sv_epsilon: eps,
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert_contains(&e, needles);
    }
}

// --- extract-lora --include-regex / --exclude-regex ----------------------------------------------

#[test]
fn include_and_exclude_regexes_pick_mergekits_modules() {
    let base = fixtures().join("mergekit/inputs/base");
    let base_ck = Checkpoint::open(&base).unwrap();
    let model = Checkpoint::open(&fixtures().join("peft/merged-plain")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("filtered");
    let options = lora::ExtractOptions {
        rank: 4,
        include_regex: vec!["self_attn".to_owned()],
        exclude_regex: vec![r"layers\.1\.".to_owned()],
        ..Default::default()
    };
    let report = lora::extract_with(&base_ck, &model, &out, &options).unwrap();
    // mergekit-extract-lora --model tests/fixtures/peft/merged-plain --base-model
    // tests/fixtures/mergekit/inputs/base --max-rank 4 --include-regex self_attn --exclude-regex
    // 'layers\.1\.' (mergekit 0.1.5) writes LoRA pairs for exactly these modules (and saves the
    // embeddings and lm_head whole, which here equal the base's, so mergescope leaves them out).
    let expected: Vec<String> = ["k_proj", "o_proj", "q_proj", "v_proj"]
        .iter()
        .flat_map(|m| ["A", "B"].map(|h| format!("base_model.model.model.layers.0.self_attn.{m}.lora_{h}.weight")))
        .collect();
    let written = Checkpoint::open(&out.join("adapter_model.safetensors")).unwrap();
    let mut names: Vec<String> = written.tensors.keys().cloned().collect();
    names.sort();
    assert_eq!(names, expected);
    assert_eq!(report.adapted, 4);
    assert_contains(
        &report.notes.join("\n"),
        &["left out by --include-regex/--exclude-regex"],
    );

    // A bad pattern names itself and the flag; filters that leave nothing say so.
    let bad = |include: &str, exclude: &str| {
        lora::extract_with(
            &base_ck,
            &model,
            &dir.path().join("bad"),
            &lora::ExtractOptions {
                rank: 4,
                include_regex: vec![include.to_owned()],
                exclude_regex: vec![exclude.to_owned()],
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string()
    };
    assert_contains(
        &bad("self_attn(", "x"),
        &["--include-regex 'self_attn('", "not a regular expression"],
    );
    assert_contains(
        &bad("self_attn", "(?<=q)_proj"),
        &["--exclude-regex '(?<=q)_proj'", "look-around"],
    );
    assert_contains(&bad("no_such_module", "x"), &["left out", "loosen them"]);
}

// --- extract-lora --no-distribute-scale --------------------------------------------------------

#[test]
fn no_distribute_scale_puts_the_singular_values_on_lora_a() {
    let base = fixtures().join("mergekit/inputs/base");
    let base_ck = Checkpoint::open(&base).unwrap();
    let model = Checkpoint::open(&fixtures().join("peft/merged-plain")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extract = |keep_scale_on_a: bool, name: &str| {
        let out = dir.path().join(name);
        let options = lora::ExtractOptions {
            rank: 2,
            keep_scale_on_a,
            ..Default::default()
        };
        lora::extract_with(&base_ck, &model, &out, &options).unwrap();
        read_model(&out.join("adapter_model.safetensors"))
    };
    let split = extract(false, "split");
    let on_a = extract(true, "on-a");
    let module = "base_model.model.model.layers.0.mlp.up_proj";
    let (a1, b1) = (
        &split[&format!("{module}.lora_A.weight")],
        &split[&format!("{module}.lora_B.weight")],
    );
    let (a2, b2) = (
        &on_a[&format!("{module}.lora_A.weight")],
        &on_a[&format!("{module}.lora_B.weight")],
    );
    let (k, cols, rows) = (a1.shape[0], a1.shape[1], b1.shape[0]);
    let norm = |v: Box<dyn Iterator<Item = f32> + '_>| v.map(|x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    for i in 0..k {
        // Default: √σ on each side, so A's row and B's column have the same norm, √σᵢ; without
        // distribution A's row has norm σᵢ (= the product of the two) and B's column norm 1, as
        // in mergekit's TaskVectorDecompositionTask.
        let a_row = |a: &MemTensor| norm(Box::new(a.data[i * cols..(i + 1) * cols].iter().copied()));
        let b_col = |b: &MemTensor| norm(Box::new((0..rows).map(move |r| b.data[r * k + i])));
        let (ra, cb) = (a_row(a1), b_col(b1));
        assert!((ra - cb).abs() < 1e-5 * ra.max(1.0), "{ra} {cb}");
        assert!((a_row(a2) - ra * cb).abs() < 1e-5, "{} {}", a_row(a2), ra * cb);
        assert!((b_col(b2) - 1.0).abs() < 1e-5, "{}", b_col(b2));
    }
    // The update B·A is the same.
    let product = |a: &MemTensor, b: &MemTensor| -> Vec<f64> {
        (0..rows * cols)
            .map(|x| {
                (0..k)
                    .map(|i| f64::from(b.data[(x / cols) * k + i]) * f64::from(a.data[i * cols + x % cols]))
                    .sum()
            })
            .collect()
    };
    let worst = product(a1, b1)
        .iter()
        .zip(product(a2, b2))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-5, "{worst}");
}
