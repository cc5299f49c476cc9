//! What the window's test files share: a small real benchmark built once per test binary, a
//! window on it, and a kittest harness of the window's size.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use egui_kittest::Harness;
use mergescope_gui::settings::{Settings, Theme};
use mergescope_gui::{MergescopeApp, SessionConfig};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A three-task MLP benchmark built once for all tests (a real `demo build` takes minutes;
/// the window runs the same code on it).
pub fn benchmark() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        use mergescope_engine::demo::{Recipe, build};
        use mergescope_engine::nn::Arch;
        use mergescope_engine::train::Budget;
        let root = tempfile::tempdir().unwrap().keep();
        let dir = root.join("bench");
        let tasks: Vec<_> = mergescope_engine::data::demo_tasks()
            .unwrap()
            .into_iter()
            .filter(|t| ["mnist", "letters", "fashion_mnist"].contains(&t.name.as_str()))
            .collect();
        let mut r = Recipe::default_for(Arch::Mlp, 0);
        r.pretrain.budget = Budget::Steps(30);
        r.head.budget = Budget::Steps(60);
        r.expert.budget = Budget::Steps(40);
        let (device, _) = mergescope_engine::device::open_device(mergescope_engine::device::DeviceChoice::Cpu);
        build(Arch::Mlp, &tasks, &r, &dir, &device, &mut |_| {}, &Default::default()).unwrap();
        dir
    })
}

/// A window on the test benchmark, its runs in `runs_dir`.
pub fn app(runs_dir: &Path, theme: Theme) -> MergescopeApp {
    let settings = Settings {
        theme,
        ..Settings::default()
    };
    let config = SessionConfig {
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
