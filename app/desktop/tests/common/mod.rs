//! What the CLI's test files share: a private environment for the `mergescope` binary and
//! small checkpoints written through the engine's own writer.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod slurm;

#[path = "../../../../tests/support/external.rs"]
pub mod external;

use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::dtype::{DType, encode_f32};
use mergescope_engine::writer::{OutputTensor, OutputWriter};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `mergescope` with the plugins built for this test run as its bundled plugins and a
    /// private configuration folder.
    pub fn cmd(&self) -> Command {
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let mut c = Command::new(env!("CARGO_BIN_EXE_mergescope"));
        c.env("MERGESCOPE_BUNDLED_DIR", deps)
            .env("MERGESCOPE_CONFIG_DIR", self.path("config"))
            .env("MERGESCOPE_PLUGIN_HOME", self.path("user-plugins"))
            .env("MERGESCOPE_CACHE_DIR", self.path("cache"))
            .env("MERGESCOPE_DATA_DIR", self.path("tasks"));
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "{args:?} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Runs a command that must fail and returns its stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(!o.status.success(), "{args:?} should have failed");
        String::from_utf8_lossy(&o.stderr).into_owned()
    }

    pub fn write(&self, name: &str, tensors: &[(&str, DType, &[usize], &[f32])]) -> String {
        write_checkpoint(&self.path(name), tensors, None);
        self.path(name).to_string_lossy().into_owned()
    }
}

pub fn write_checkpoint(path: &Path, tensors: &[(&str, DType, &[usize], &[f32])], shard: Option<u64>) {
    let specs: Vec<OutputTensor> = tensors
        .iter()
        .map(|(n, d, s, _)| OutputTensor {
            name: (*n).to_owned(),
            dtype: *d,
            shape: s.to_vec(),
        })
        .collect();
    let w = OutputWriter::create(path, &specs, &BTreeMap::new(), shard, true).unwrap();
    for (n, d, _, v) in tensors {
        let mut bytes = Vec::new();
        encode_f32(*d, v, &mut bytes);
        w.write(n, 0, &bytes).unwrap();
    }
    w.commit().unwrap();
}

pub fn read(path: &Path, name: &str) -> Vec<f32> {
    let c = Checkpoint::open(path).unwrap();
    c.read_f32(&c.tensors[name]).unwrap()
}

pub fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

/// Base and two experts: w (2×2), b (2).
pub fn three_models(env: &Env) -> (String, String, String) {
    let base = env.write(
        "base.safetensors",
        &[
            ("w", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]),
            ("b", DType::F32, &[2], &[0.0, 0.0]),
        ],
    );
    let e1 = env.write(
        "e1.safetensors",
        &[
            ("w", DType::F32, &[2, 2], &[2.0, 2.0, 3.0, 5.0]),
            ("b", DType::F32, &[2], &[1.0, 0.0]),
        ],
    );
    let e2 = env.write(
        "e2.safetensors",
        &[
            ("w", DType::F32, &[2, 2], &[1.0, 4.0, 3.0, 2.0]),
            ("b", DType::F32, &[2], &[0.0, -1.0]),
        ],
    );
    (base, e1, e2)
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A small MLP benchmark on two tasks, built through the engine (a full `demo build` takes
/// minutes; its CLI path is the same code).
pub fn tiny_benchmark(dir: &Path) {
    tiny_benchmark_of(dir, &["mnist", "letters"]);
}

pub fn tiny_benchmark_of(dir: &Path, names: &[&str]) {
    use mergescope_lab::demo::{BuildRecipe, build};
    use mergescope_lab::nn::Arch;
    use mergescope_lab::train::Budget;
    let tasks: Vec<_> = mergescope_lab::data::demo_tasks()
        .unwrap()
        .into_iter()
        .filter(|t| names.contains(&t.name.as_str()))
        .collect();
    let mut r = BuildRecipe::default_for(Arch::Mlp, 0);
    r.pretrain.budget = Budget::Steps(20);
    r.head.budget = Budget::Steps(50);
    r.expert.budget = Budget::Steps(30);
    let (device, _) = mergescope_engine::device::open_device(mergescope_engine::device::DeviceChoice::Cpu);
    build(
        Arch::Mlp,
        &tasks,
        &r,
        dir,
        &device,
        &mut |_| {},
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap();
}

/// A path as the `&str` a command line takes.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
