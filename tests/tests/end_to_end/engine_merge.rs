#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The streaming file merge through real plugins: determinism across threads, chunk sizes and
//! memory budgets, progress reports, cancellation (nothing written), and logs.

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::compat::MissingPolicy;
use mergescope_engine::dtype::{DType, encode_f32};
use mergescope_engine::executor::{DEFAULT_HOLD_BYTES, PlanItem, Run, Sink, Source};
use mergescope_engine::merge::{ExecOptions, Observer, Phase, Progress, create_instance};
use mergescope_engine::plugin::instance::CallEnv;
use mergescope_engine::plugin::load_plugin;
use mergescope_engine::writer::{OutputTensor, OutputWriter};
use mergescope_interop::request::{MergeRequest, merge_files};
use mergescope_tests::plugin_path;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

/// Writes a model with a 300×40 matrix and a 40-vector whose values depend on `k`.
fn model(path: &Path, k: f32) {
    let tensors = [("a.weight", vec![300usize, 40]), ("a.bias", vec![40])];
    let specs: Vec<OutputTensor> = tensors
        .iter()
        .map(|(n, s)| OutputTensor {
            name: (*n).to_owned(),
            dtype: DType::BF16,
            shape: s.clone(),
        })
        .collect();
    let w = OutputWriter::create(path, &specs, &BTreeMap::new(), None, true).unwrap();
    for (n, s) in &tensors {
        let len: usize = s.iter().product();
        let v: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37 + k).sin() * 0.1 + k * 0.01).collect();
        let mut bytes = Vec::new();
        encode_f32(DType::BF16, &v, &mut bytes);
        w.write(n, 0, &bytes).unwrap();
    }
    w.commit().unwrap();
}

fn setup(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let base = dir.join("base.safetensors");
    model(&base, 0.0);
    let experts: Vec<PathBuf> = (1..=3)
        .map(|i| {
            let p = dir.join(format!("e{i}.safetensors"));
            model(&p, i as f32);
            p
        })
        .collect();
    (base, experts)
}

fn request(base: &Path, experts: &[PathBuf], out: PathBuf, params: serde_json::Value) -> MergeRequest {
    MergeRequest {
        params,
        seed: 3,
        base: Some(base.to_path_buf()),
        experts: experts.to_vec(),
        out,
        out_dtype: None,
        shard_bytes: None,
        on_missing: MissingPolicy::Error,
        overwrite: false,
        folder: None,
        slices: Vec::new(),
    }
}

/// Every per-tensor plugin writes the same bytes whatever the worker threads (1, 2, 3, 8), the
/// chunk size elementwise methods are cut into (whole, 7, 1000, 4096 elements) and the memory
/// budget (one tensor at a time): the merge is a function of the request alone (issue #29).
#[test]
fn outputs_do_not_depend_on_threads_chunks_or_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (base, experts) = setup(dir.path());
    let all = experts.as_slice();
    let one = &experts[..1];
    for (method, params, experts) in [
        ("mergescope_plugin_weight_average", serde_json::json!({}), all),
        (
            "mergescope_plugin_task_arithmetic",
            serde_json::json!({"lambda": 0.4}),
            all,
        ),
        (
            "mergescope_plugin_ties",
            serde_json::json!({"trim_scope": "tensor"}),
            all,
        ),
        // Three statistics passes per tensor (thresholds, then the sign votes), tensor by tensor.
        (
            "mergescope_plugin_ties",
            serde_json::json!({"trim_scope": "tensor", "zero_sign": "reference", "election": "count"}),
            all,
        ),
        (
            "mergescope_plugin_ties",
            serde_json::json!({"trim_scope": "global"}),
            all,
        ),
        ("mergescope_plugin_dare", serde_json::json!({"drop_rate": 0.3}), all),
        // The l1 rescale keeps the masks of its statistics pass for the merge, at any chunking.
        (
            "mergescope_plugin_dare",
            serde_json::json!({"drop_rate": 0.3, "rescale": "l1", "combine": "ties"}),
            all,
        ),
        ("mergescope_plugin_cart", serde_json::json!({}), all),
        ("mergescope_plugin_consensus", serde_json::json!({}), all),
        ("mergescope_plugin_model_stock", serde_json::json!({}), all),
        ("mergescope_plugin_nuslerp", serde_json::json!({}), &experts[..2]),
        (
            "mergescope_plugin_breadcrumbs",
            serde_json::json!({"consensus": "sign"}),
            all,
        ),
        ("mergescope_plugin_slerp", serde_json::json!({"t": 0.3}), one),
        ("mergescope_plugin_c_example", serde_json::json!({}), all),
        ("mergescope_plugin_tsv_m", serde_json::json!({}), all),
        ("mergescope_plugin_iso_c", serde_json::json!({}), all),
        ("mergescope_plugin_iso_cts", serde_json::json!({}), all),
        ("mergescope_plugin_wudi", serde_json::json!({"iterations": 20}), all),
    ] {
        let plugin = load_plugin(&plugin_path(method)).unwrap();
        let mut outputs = Vec::new();
        // The last run takes the statistics passes over the whole model first where the plugin
        // would take tensor by tensor (slerp, model-stock, ties with trim_scope=tensor, dare with l1):
        // the same bits.
        // The last two hold a tensor's inputs in segments of a few chunks (of 7: 2,000 bytes of
        // four bf16 inputs hold 250 elements, so segments of 35 chunks) and of one chunk each.
        let held = DEFAULT_HOLD_BYTES;
        for (i, (threads, chunk, budget, pass_by_pass, hold)) in [
            (1, 1 << 22, 2u64 << 30, false, held),
            (2, 7, 2 << 30, false, held),
            (3, 1000, 2 << 30, false, held),
            (8, 4096, 2 << 30, false, held),
            (2, 1000, 1, false, held),
            (2, 1000, 2 << 30, true, held),
            (2, 7, 2 << 30, false, 2_000),
            (3, 1000, 2 << 30, false, 1),
        ]
        .iter()
        .enumerate()
        {
            let out = dir.path().join(format!("{method}-{i}.safetensors"));
            let opts = ExecOptions {
                threads: *threads,
                chunk_elems: *chunk,
                memory_budget_bytes: *budget,
                pass_by_pass: *pass_by_pass,
                hold_bytes: *hold,
                ..Default::default()
            };
            let cancel = AtomicBool::new(false);
            merge_files(
                &plugin,
                &request(&base, experts, out.clone(), params.clone()).overwriting(true),
                &opts,
                Observer::silent(),
                &cancel,
            )
            .unwrap_or_else(|e| panic!("{method} {params}: {e}"));
            outputs.push(std::fs::read(&out).unwrap());
        }
        for (i, o) in outputs.iter().enumerate().skip(1) {
            assert!(
                o == &outputs[0],
                "{method} {params}: run {i} differs from the one-thread whole-tensor run"
            );
        }
    }
}

#[test]
fn progress_reaches_the_total_and_cancel_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (base, experts) = setup(dir.path());
    let plugin = load_plugin(&plugin_path("mergescope_plugin_task_arithmetic")).unwrap();
    let seen: Mutex<Vec<Progress>> = Mutex::new(Vec::new());
    let on_progress = |p: &Progress| seen.lock().unwrap().push(p.clone());
    let observer = Observer {
        progress: &on_progress,
        log: &|_, _| {},
    };
    let opts = ExecOptions {
        chunk_elems: 1000,
        threads: 2,
        ..Default::default()
    };
    let out = dir.path().join("ok.safetensors");
    let cancel = AtomicBool::new(false);
    let report = merge_files(
        &plugin,
        &request(&base, &experts, out.clone(), serde_json::json!({})),
        &opts,
        observer,
        &cancel,
    )
    .unwrap();
    assert_eq!(report.merged, 2);
    let seen = seen.into_inner().unwrap();
    assert!(seen.iter().all(|p| p.phase == Phase::Merge && p.total == 12_040));
    assert_eq!(seen.iter().map(|p| p.done).max(), Some(12_040));
    assert_eq!(seen.len(), 13, "12 chunks of the matrix and the bias");
    assert!(Checkpoint::open(&out).is_ok());

    let cancelled = dir.path().join("cancelled.safetensors");
    let cancel = AtomicBool::new(true);
    let err = merge_files(
        &plugin,
        &request(&base, &experts, cancelled.clone(), serde_json::json!({})),
        &opts,
        Observer::silent(),
        &cancel,
    )
    .unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    assert!(!cancelled.exists());
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("partial")),
        "temporary output left behind: {names:?}"
    );
}

#[test]
fn plugin_logs_reach_the_observer() {
    let dir = tempfile::tempdir().unwrap();
    let (base, experts) = setup(dir.path());
    let plugin = load_plugin(&plugin_path("mergescope_plugin_cart")).unwrap();
    let logs: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let on_log = |_level: u32, msg: &str| logs.lock().unwrap().push(msg.to_owned());
    let observer = Observer {
        progress: &|_| {},
        log: &on_log,
    };
    let out = dir.path().join("cart.safetensors");
    let cancel = AtomicBool::new(false);
    // Two experts: CART degenerates to weight averaging, and the plugin says so.
    merge_files(
        &plugin,
        &request(&base, &experts[..2], out, serde_json::json!({})),
        &ExecOptions::default(),
        observer,
        &cancel,
    )
    .unwrap();
    let logs = logs.into_inner().unwrap();
    assert!(logs.iter().any(|l| l.contains("weight averaging")), "{logs:?}");
}

/// A source of four inputs (base and three experts) of one tensor that records the ranges held
/// on each thread and checks that every read falls inside the range its thread holds.
struct HoldingSource {
    held: Mutex<std::collections::HashMap<std::thread::ThreadId, Vec<(usize, usize)>>>,
    holds: Mutex<Vec<(usize, usize)>>,
    reads: std::sync::atomic::AtomicUsize,
}

impl Source for HoldingSource {
    fn read(&self, model: usize, _name: &str, from: usize, len: usize) -> mergescope_engine::error::Result<Vec<f32>> {
        let me = std::thread::current().id();
        let held = self.held.lock().unwrap().get(&me).and_then(|h| h.last().copied());
        let (at, n) = held.unwrap_or_else(|| panic!("read of {from}+{len} outside any hold"));
        assert!(
            at <= from && from + len <= at + n,
            "read of {from}+{len} outside the held {at}+{n}"
        );
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok((from..from + len)
            .map(|i| ((i * 7 + model * 13) % 29) as f32 * 0.01 + model as f32)
            .collect())
    }

    fn hold(
        &self,
        _name: &str,
        from: usize,
        len: usize,
        work: &mut dyn FnMut() -> mergescope_engine::error::Result<()>,
    ) -> mergescope_engine::error::Result<()> {
        let me = std::thread::current().id();
        self.holds.lock().unwrap().push((from, len));
        self.held.lock().unwrap().entry(me).or_default().push((from, len));
        let r = work();
        self.held.lock().unwrap().get_mut(&me).unwrap().pop();
        r
    }

    fn held_bytes_per_elem(&self, _name: &str) -> Option<u64> {
        Some(8)
    }
}

struct VecSink(Mutex<Vec<f32>>);

impl Sink for VecSink {
    fn write(&self, _name: &str, from: usize, values: &[f32]) -> mergescope_engine::error::Result<bool> {
        self.0.lock().unwrap()[from..from + values.len()].copy_from_slice(values);
        Ok(false)
    }
}

/// A tensor larger than `hold_bytes` is held in segments of whole chunks, one worker per
/// segment, every read inside its segment; a method with statistics per tensor (Model Stock)
/// holds each segment once per pass and once for the merge. The values are those of a run that
/// holds the tensor whole.
#[test]
fn a_tensor_too_large_to_hold_whole_is_held_in_segments_of_whole_chunks() {
    let chunk = 100;
    let numel = 10 * chunk + 5;
    for (method, params, holds_per_segment) in [
        (
            "mergescope_plugin_task_arithmetic",
            serde_json::json!({"lambda": 0.4}),
            1,
        ),
        ("mergescope_plugin_model_stock", serde_json::json!({}), 2),
    ] {
        let plugin = load_plugin(&plugin_path(method)).unwrap();
        let mut results = vec![];
        // Three chunks of four inputs of 8 bytes per element fit in 2,400 bytes (and 2,799);
        // 1 MB holds the tensor whole.
        for hold_bytes in [2_400, 2_799, 1 << 20] {
            let opts = ExecOptions {
                threads: 2,
                chunk_elems: chunk,
                hold_bytes,
                ..Default::default()
            };
            let cancel = AtomicBool::new(false);
            let env = CallEnv {
                device: &opts.device,
                cancel: &cancel,
                log: &|_, _| {},
                threads: 2,
            };
            let (instance, _) = create_instance(&plugin, &params, 3, true, 3, env).unwrap();
            let source = HoldingSource {
                held: Mutex::default(),
                holds: Mutex::default(),
                reads: Default::default(),
            };
            let sink = VecSink(Mutex::new(vec![f32::NAN; numel]));
            let items = [PlanItem {
                name: "w".into(),
                shape: vec![numel],
            }];
            Run {
                instance: &instance,
                plugin_id: plugin.id(),
                items: &items,
                source: &source,
                sink: &sink,
                has_base: true,
                n_experts: 3,
                opts: &opts,
                observer: Observer::silent(),
                cancel: &cancel,
            }
            .execute()
            .unwrap_or_else(|e| panic!("{method}: {e}"));
            let mut holds = source.holds.into_inner().unwrap();
            holds.sort_unstable();
            holds.dedup();
            let expected: Vec<(usize, usize)> = if hold_bytes < 1 << 20 {
                vec![(0, 300), (300, 300), (600, 300), (900, 105)]
            } else {
                vec![(0, numel)]
            };
            assert_eq!(holds, expected, "{method}, hold_bytes {hold_bytes}");
            assert_eq!(
                source.reads.into_inner(),
                4 * 11 * holds_per_segment,
                "{method}: every chunk of every input read once per pass"
            );
            results.push(sink.0.into_inner().unwrap());
        }
        assert!(
            results[0].iter().all(|v| v.is_finite()),
            "{method}: every element written"
        );
        assert_eq!(results[0], results[2], "{method}: segments change no value");
        assert_eq!(results[1], results[2], "{method}: segments change no value");
    }
}
