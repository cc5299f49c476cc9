//! What the window's test files share: a small real benchmark (committed under
//! `tests/fixtures/bench`, copied once per test binary), a window on it, a kittest harness
//! of the window's size, and what the recipe tests do (a converted recipe opened in the window,
//! its run waited for and compared with the CLI's).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use egui_kittest::Harness;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::merge::{ExecOptions, MergeReport, Observer};
use mergescope_gui::runs::{RunRecord, RunStatus};
use mergescope_gui::settings::{Settings, Theme};
use mergescope_gui::{DocumentConfig, MergescopeApp};
use mergescope_interop::request::{MergeRequest, merge_files};
use mergescope_lab::demo::{Benchmark, BuildRecipe, build};
use mergescope_lab::nn::Arch;
use mergescope_lab::train::Budget;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// What a helper of the recipe tests fails with.
pub type TestResult<T> = Result<T, Box<dyn Error>>;

/// A checkpoint's tensor: name, shape and values.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// The mergekit configuration `yaml` (its paths relative to `config`) converted into `dir` as
/// `mergescope recipe convert` converts it: the recipe file, and the output it names.
pub fn convert_recipe(yaml: &str, config: &Path, dir: &Path) -> TestResult<(PathBuf, PathBuf)> {
    let out = dir.join("cli");
    let converted = mergescope_interop::mergekit::convert(yaml, config, &out)?;
    let recipe_file = dir.join("recipe.toml");
    std::fs::write(&recipe_file, converted.recipe.to_toml()?)?;
    Ok((recipe_file, out))
}

/// A window on the test benchmark, its runs in `dir/runs`, with `recipe_file` opened.
pub fn open_recipe(dir: &Path, recipe_file: &Path) -> Harness<'static, MergescopeApp> {
    let mut h = harness(app(&dir.join("runs"), Theme::Light));
    h.run_steps(3);
    h.state_mut().doc.open_recipe(recipe_file);
    h.run_steps(3);
    h
}

/// Steps the window until `done` holds; fails the test, naming `what`, after `limit`.
pub fn step_until(
    h: &mut Harness<'static, MergescopeApp>,
    what: &str,
    limit: Duration,
    mut done: impl FnMut(&MergescopeApp) -> bool,
) {
    let start = Instant::now();
    while !done(h.state()) {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        h.step();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (at most a minute) for the window's last run to finish, done or failed, and returns it.
pub fn wait_for_run(h: &mut Harness<'static, MergescopeApp>) -> Option<RunRecord> {
    step_until(h, "the run", Duration::from_secs(60), |a| {
        matches!(
            a.doc.runs.last().map(|r| r.status),
            Some(RunStatus::Done | RunStatus::Failed)
        )
    });
    h.state().doc.runs.last().cloned()
}

/// Merges `request` with the window's plugin `method`, as `mergescope merge RECIPE.toml` does.
pub fn merge_as_cli(
    h: &Harness<'static, MergescopeApp>,
    method: &str,
    request: &MergeRequest,
) -> TestResult<MergeReport> {
    let plugin = h
        .state()
        .doc
        .registry
        .plugins
        .iter()
        .find(|p| p.id() == method)
        .ok_or_else(|| format!("no plugin '{method}'"))?;
    let cancel = std::sync::atomic::AtomicBool::new(false);
    Ok(merge_files(
        plugin,
        request,
        &ExecOptions::default(),
        Observer::silent(),
        &cancel,
    )?)
}

/// Every tensor of the checkpoint `p` (a file or a folder): name, shape and values.
pub fn tensors(p: &Path) -> TestResult<Vec<NamedTensor>> {
    let c = Checkpoint::open(p)?;
    let mut out = Vec::with_capacity(c.tensors.len());
    for t in c.tensors.values() {
        out.push((t.name.clone(), t.shape.clone(), c.read_f32(t)?));
    }
    Ok(out)
}

/// Checks that the checkpoints `ours` (the window's output) and `cli` hold the same tensors,
/// bit for bit, and returns ours.
pub fn same_tensors(ours: &Path, cli: &Path) -> TestResult<Vec<NamedTensor>> {
    let (ours, cli) = (tensors(ours)?, tensors(cli)?);
    assert_eq!(ours.len(), cli.len());
    for ((n, s, a), (m, t, b)) in ours.iter().zip(&cli) {
        assert_eq!((n, s), (m, t));
        assert!(a == b, "{n} differs from the CLI's");
    }
    Ok(ours)
}
