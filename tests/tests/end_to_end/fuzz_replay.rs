#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Deterministic fuzzing of the parsers of files mergescope did not write, on stable Rust and in
//! every test run (issue #26): safetensors headers and data, shard indexes and merge recipes,
//! each fed thousands of inputs mutated from a seed corpus by a seeded generator. Every input
//! must give a result or an error, never a panic, and none may take long (no allocation or loop
//! sized by an untrusted length). The libFuzzer targets in fuzz/ explore the same parsers with
//! coverage guidance; their crashes, once fixed, belong in the seed corpus here.

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_interop::recipe::Recipe;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

/// SplitMix64: a seeded stream, so a failure replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens that break parsers when spliced in: extreme numbers, wrong types, JSON and TOML
/// structure, and the safetensors keys.
const TOKENS: &[&str] = &[
    "18446744073709551615",
    "9223372036854775808",
    "-1",
    "1e999",
    "0",
    "\"F32\"",
    "\"BF16\"",
    "\"I64\"",
    "\"F8_E4M3\"",
    "null",
    "[]",
    "{}",
    "\"",
    ",",
    ":",
    "[",
    "]",
    "{",
    "}",
    "\\u0000",
    "\"data_offsets\"",
    "\"shape\"",
    "\"dtype\"",
    "\"__metadata__\"",
    "\"weight_map\"",
    "../",
    "=",
    "\n[params]\n",
    "\"\"\"",
    "'",
];

/// One mutation of `seed`: byte flips, cuts, splices of tokens, duplicated spans or a new
/// 8-byte header length.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => v.truncate(rng.below(v.len() + 1)),
            3 => {
                let i = rng.below(v.len() + 1);
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                v.splice(i..i, t.iter().copied());
            }
            4 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + rng.below(64)).min(v.len());
                let copy = v[a..b].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, copy);
            }
            5 if v.len() >= 8 => {
                let len = match rng.below(4) {
                    0 => 0,
                    1 => rng.next(),
                    2 => (v.len() as u64).saturating_sub(8) + rng.below(16) as u64,
                    _ => u64::from_le_bytes(v[..8].try_into().unwrap())
                        .wrapping_add(rng.below(9) as u64)
                        .wrapping_sub(4),
                };
                v[..8].copy_from_slice(&len.to_le_bytes());
            }
            _ if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + 1 + rng.below(16)).min(v.len());
                v.drain(a..b);
            }
            _ => {}
        }
    }
    v
}

fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

/// Valid files to mutate: tensors of several dtypes and ranks, metadata, an empty tensor.
fn checkpoint_corpus() -> Vec<Vec<u8>> {
    let f32s: Vec<u8> = (0..8).flat_map(|i| (i as f32 * 0.5).to_le_bytes()).collect();
    vec![
        safetensors(
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}"#,
            &f32s,
        ),
        safetensors(
            r#"{"__metadata__":{"format":"pt","mergescope.method":"ties"},"x":{"dtype":"BF16","shape":[2,2,2],"data_offsets":[0,16]},"i":{"dtype":"I64","shape":[2],"data_offsets":[16,32]}}"#,
            &f32s,
        ),
        safetensors(
            r#"{"e":{"dtype":"F16","shape":[0,3],"data_offsets":[0,0]},"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},"t":{"dtype":"U8","shape":[24],"data_offsets":[8,32]}}"#,
            &f32s,
        ),
    ]
}

/// Runs `f` on `input`: it may fail but must not panic or take more than a second.
fn survives(what: &str, n: usize, input: &[u8], f: impl FnOnce()) {
    let started = Instant::now();
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        let dump = std::env::temp_dir().join(format!("mergescope-fuzz-{what}-{n}.bin"));
        let _ = std::fs::write(&dump, input);
        panic!("{what} input {n} panicked; it is saved in {}", dump.display());
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{what} input {n} took {:?}",
        started.elapsed()
    );
}

/// Opens the file and reads every tensor it claims.
fn open_and_read(path: &Path) {
    if let Ok(c) = Checkpoint::open(path) {
        for t in c.tensors.values() {
            let _ = c.read_f32(t);
            let _ = c.raw_bytes(t);
        }
        let _ = c.metadata();
    }
}

#[test]
fn safetensors_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.safetensors");
    let corpus = checkpoint_corpus();
    let mut rng = Rng(0x5AFE);
    for n in 0..6000 {
        let input = mutate(&corpus[n % corpus.len()], &mut rng);
        std::fs::write(&path, &input).unwrap();
        survives("safetensors", n, &input, || open_and_read(&path));
    }
}

#[test]
fn shard_indexes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    let f32s: Vec<u8> = (0..4).flat_map(|i| (i as f32).to_le_bytes()).collect();
    for (name, tensor) in [
        ("model-00001-of-00002.safetensors", "a"),
        ("model-00002-of-00002.safetensors", "b"),
    ] {
        let header = format!(r#"{{"{tensor}":{{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}}}"#);
        std::fs::write(folder.join(name), safetensors(&header, &f32s)).unwrap();
    }
    let seed = br#"{"metadata":{"total_size":32},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
    let index = folder.join("model.safetensors.index.json");
    let mut rng = Rng(0x1DE7);
    for n in 0..2500 {
        let input = mutate(seed, &mut rng);
        std::fs::write(&index, &input).unwrap();
        survives("shard index", n, &input, || open_and_read(&folder));
    }
}

#[test]
fn merge_recipes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recipe.toml");
    let seed = br#"method = "ties"
base = "base.safetensors"
experts = ["a.safetensors", "b.safetensors"]
out = "merged.safetensors"
seed = 3
dtype = "bf16"
shard_size = "2GB"
on_missing = "skip"

[params]
density = 0.2
lambda = [0.5, 1.0]
trim_scope = "global"
"#;
    let mut rng = Rng(0x7EC1);
    for n in 0..2500 {
        let input = mutate(seed, &mut rng);
        std::fs::write(&path, &input).unwrap();
        survives("recipe", n, &input, || {
            if let Ok(r) = Recipe::load(&path) {
                let _ = r.to_request(false);
                let _ = r.params_json();
            }
        });
    }
}

#[test]
fn suites_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.toml");
    let seeds: [&[u8]; 2] = [
        br#"name = "my-eval"

[evaluator]
command = ["python3", "score.py", "{model}"]
metric = "accuracy"
tasks = ["task_a", "task_b", "task_c"]
timeout_s = 60
"#,
        br#"name = "text"
[model]
family = "bert"
max_length = 128
batch_size = 32
[[task]]
name = "sst2"
data = "sst2.jsonl"
calibration = "sst2-val.jsonl"
labels = ["negative", "positive"]
[models]
base = "base"
experts = ["sst2"]
"#,
    ];
    let mut rng = Rng(0x5017E);
    for n in 0..2000 {
        let input = mutate(seeds[n % 2], &mut rng);
        std::fs::write(&path, &input).unwrap();
        survives("suite", n, &input, || {
            if let Ok(s) = mergescope_lab::evaluator::suite::Suite::load(&path) {
                let _ = s.task_names();
                let _ = s.models();
                let _ = s.model_level_unavailable();
            }
        });
    }
}
