//! What the window's test files share: a small real benchmark (committed under
//! `tests/fixtures/bench`, copied once per test binary), a window on it, and a kittest harness
//! of the window's size.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use egui_kittest::Harness;
use mergescope_gui::settings::{Settings, Theme};
use mergescope_gui::{DocumentConfig, MergescopeApp};
use mergescope_lab::demo::{Benchmark, BuildRecipe, build};
use mergescope_lab::nn::Arch;
use mergescope_lab::train::Budget;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The committed inputs of the window's tests (`tests/fixtures/README.md` says how they were
/// made).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// The tasks of the test benchmark.
pub const TASKS: [&str; 3] = ["fashion_mnist", "letters", "mnist"];

/// The recipe of the test benchmark: the MLP's default for seed 0 with tiny budgets.
pub fn recipe() -> BuildRecipe {
    let mut r = BuildRecipe::default_for(Arch::Mlp, 0);
    r.pretrain.budget = Budget::Steps(30);
    r.head.budget = Budget::Steps(60);
    r.expert.budget = Budget::Steps(40);
    r
}

/// Builds the test benchmark into `dir` (which must not exist) by training it, as
/// `mergescope demo build` does. Training sums in an order that depends on the CPU (its SIMD
/// width, its cache sizes), and the steps compound the last-bit differences, so two CPUs build
/// different weights: the tests use the committed build instead (see [`benchmark`]).
pub fn build_benchmark(dir: &Path) -> Benchmark {
    let tasks: Vec<_> = mergescope_lab::data::demo_tasks()
        .unwrap()
        .into_iter()
        .filter(|t| TASKS.contains(&t.name.as_str()))
        .collect();
    let (device, _) = mergescope_engine::device::open_device(mergescope_engine::device::DeviceChoice::Cpu);
    build(
        Arch::Mlp,
        &tasks,
        &recipe(),
        dir,
        &device,
        &mut |_| {},
        &Default::default(),
    )
    .unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The three-task MLP benchmark of [`build_benchmark`], as committed in `tests/fixtures/bench`
/// (fixed weights, so that every machine evaluates the same models and draws the same
/// pictures), copied once per test binary into a temporary folder (the tests never write into
/// the repository).
pub fn benchmark() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = tempfile::tempdir().unwrap().keep();
        let dir = root.join("bench");
        copy_dir(&fixtures().join("bench"), &dir);
        let b = Benchmark::open(&dir).unwrap();
        let regenerate = "regenerate the fixtures with scripts/regenerate-gui-fixtures.sh";
        assert!(
            b.is_current(),
            "tests/fixtures/bench was built by recipe version {}, the engine's is {}: {regenerate}",
            b.manifest.recipe_version,
            mergescope_lab::demo::RECIPE_VERSION
        );
        assert_eq!(
            (b.manifest.arch, &b.manifest.recipe),
            (Arch::Mlp, &recipe()),
            "tests/fixtures/bench was not built by common::recipe(): {regenerate}"
        );
        assert_eq!(b.task_names(), TASKS);
        dir
    })
}

/// A window on the test benchmark, its runs in `runs_dir`.
pub fn app(runs_dir: &Path, theme: Theme) -> MergescopeApp {
    let settings = Settings {
        theme,
        ..Settings::default()
    };
    let config = DocumentConfig {
        plugin_dirs: Vec::new(),
        runs_dir: Some(runs_dir.to_path_buf()),
        benchmark: Some(benchmark().to_path_buf()),
        build_demo_if_missing: false,
        demo_arch: None,
    };
    MergescopeApp::new(&egui::Context::default(), settings, &config)
}

/// A kittest harness of the window at its snapshot size.
pub fn harness(app: MergescopeApp) -> Harness<'static, MergescopeApp> {
    Harness::builder()
        .with_size(egui::vec2(1360.0, 820.0))
        .build_ui_state(|ui, app: &mut MergescopeApp| app.show(ui), app)
}
