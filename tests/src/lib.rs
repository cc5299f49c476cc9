//! Helpers shared by the end-to-end tests.

use std::path::PathBuf;

/// Directory holding the plugin libraries built for this test run (target/<profile>/deps).
pub fn plugin_build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().map(PathBuf::from).unwrap_or_default()
}

/// Path of the plugin library `lib<name>.so` (or the platform's equivalent) built for this run.
pub fn plugin_path(lib_name: &str) -> PathBuf {
    let file = format!(
        "{}{lib_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    plugin_build_dir().join(file)
}

/// Absolute tolerance of the golden-number tests (the plugins compute in f32).
pub const TOL: f64 = 1e-5;

/// Loads the plugin library `lib<lib_name>.so` built for this run.
pub fn load(lib_name: &str) -> mergescope_engine::plugin::Plugin {
    let path = plugin_path(lib_name);
    mergescope_engine::plugin::load_plugin(&path).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// An in-memory model from (name, shape, values) triples.
pub fn model(tensors: &[(&str, &[usize], &[f32])]) -> mergescope_engine::merge::MemModel {
    tensors
        .iter()
        .map(|(name, shape, data)| {
            (
                (*name).to_string(),
                mergescope_engine::merge::MemTensor::new(shape.to_vec(), data.to_vec()),
            )
        })
        .collect()
}

/// Asserts that tensor `name` of `model` equals `expected` within [`TOL`]; `context` prefixes
/// the failure message.
pub fn assert_close(model: &mergescope_engine::merge::MemModel, name: &str, expected: &[f64], context: &str) {
    let t = model
        .get(name)
        .unwrap_or_else(|| panic!("{context}: output has no tensor '{name}'"));
    assert_eq!(t.data.len(), expected.len(), "{context}: tensor '{name}': length");
    for (i, (a, e)) in t.data.iter().zip(expected).enumerate() {
        assert!(
            (f64::from(*a) - e).abs() <= TOL,
            "{context}: tensor '{name}'[{i}]: got {a}, expected {e}\nfull: {:?}",
            t.data
        );
    }
}

/// Asserts that a message contains every one of `parts`.
pub fn assert_contains(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "expected {p:?} in the message: {msg}");
    }
}

/// Asserts that a plugin documents itself: its help text names every parameter of its schema
/// and its description is one non-empty line.
pub fn assert_documented(p: &mergescope_engine::plugin::Plugin) {
    for spec in p.schema() {
        assert!(
            p.info.help.contains(spec.name.as_str()),
            "help does not explain '{}'",
            spec.name
        );
    }
    assert!(!p.info.description.is_empty() && !p.info.description.contains('\n'));
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a float32 checkpoint of the named tensors to `path` (through the engine's writer).
#[allow(clippy::unwrap_used)] // a test helper: a failure is a panic by design
pub fn write_model(path: &std::path::Path, tensors: &[(&str, &[usize], &[f32])]) {
    use mergescope_engine::dtype::DType;
    use mergescope_engine::writer::{OutputTensor, OutputWriter};
    let specs: Vec<OutputTensor> = tensors
        .iter()
        .map(|(name, shape, _)| OutputTensor {
            name: (*name).to_owned(),
            dtype: DType::F32,
            shape: shape.to_vec(),
        })
        .collect();
    let w = OutputWriter::create(path, &specs, &Default::default(), None, false).unwrap();
    for (name, _, values) in tensors {
        w.write_values(name, 0, values).unwrap();
    }
    w.commit().unwrap();
}

/// Every tensor of an opened checkpoint, as f32.
#[allow(clippy::unwrap_used)] // a test helper: a failure is a panic by design
pub fn tensors_of(c: &mergescope_engine::checkpoint::Checkpoint) -> mergescope_engine::merge::MemModel {
    c.tensors
        .values()
        .map(|t| {
            (
                t.name.clone(),
                mergescope_engine::merge::MemTensor::new(t.shape.clone(), c.read_f32(t).unwrap()),
            )
        })
        .collect()
}

/// Every tensor of the checkpoint at `path`, as f32.
pub fn read_model(path: &std::path::Path) -> mergescope_engine::merge::MemModel {
    let c = mergescope_engine::checkpoint::Checkpoint::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tensors_of(&c)
}

/// Runs `req` with the plugin library `lib` as the CLI does (default options, nothing
/// observed); the error as text.
pub fn merge_to_files(lib: &str, req: &mergescope_interop::request::MergeRequest) -> Result<(), String> {
    use mergescope_engine::merge::{ExecOptions, Observer};
    use mergescope_interop::request::merge_files;
    let cancel = std::sync::atomic::AtomicBool::new(false);
    merge_files(&load(lib), req, &ExecOptions::default(), Observer::silent(), &cancel)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Largest |a − b| over two candle tensors of one shape.
#[allow(clippy::unwrap_used)] // a test helper: a failure is a panic by design
pub fn tensor_max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The largest absolute difference between two models with the same tensor names (asserted).
pub fn max_difference(a: &mergescope_engine::merge::MemModel, b: &mergescope_engine::merge::MemModel) -> f64 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    a.iter()
        .flat_map(|(n, t)| t.data.iter().zip(&b[n].data).map(|(x, y)| f64::from((x - y).abs())))
        .fold(0.0, f64::max)
}

/// token → id of a tokenizer.json (the model's vocabulary and the added tokens).
#[allow(clippy::unwrap_used)] // a test helper: a bad fixture is a failed test
pub fn vocab_of(tokenizer_json: &std::path::Path) -> std::collections::BTreeMap<String, usize> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(tokenizer_json).unwrap()).unwrap();
    let mut v: std::collections::BTreeMap<String, usize> = json["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, i)| (t.clone(), i.as_u64().unwrap() as usize))
        .collect();
    for a in json["added_tokens"].as_array().unwrap() {
        v.insert(
            a["content"].as_str().unwrap().to_owned(),
            a["id"].as_u64().unwrap() as usize,
        );
    }
    v
}
