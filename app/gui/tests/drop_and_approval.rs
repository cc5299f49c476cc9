#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Drag and drop and plugin approval, in their own test process: approvals live in the
//! configuration folder, which this process points at a temporary one before anything reads
//! the environment.

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable as _;
use mergescope_gui::settings::Settings;
use mergescope_gui::{DocumentConfig, MergescopeApp};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file dropped on the window, as the windowing integration hands it over.
#[derive(Debug)]
struct Dropped(PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

fn drop_file(h: &mut Harness<'static, MergescopeApp>, path: &Path) {
    h.input_mut().dropped_files.push(Arc::new(Dropped(path.to_path_buf())));
    h.run_steps(2);
}

fn checkpoint(path: &Path, rows: usize, value: f32) {
    let t = candle_core::Tensor::full(value, (rows, 3), &candle_core::Device::Cpu).unwrap();
    let params = BTreeMap::from([("layer.weight".to_owned(), t)]);
    mergescope_lab::demo::save_params(path, &params, &BTreeMap::new()).unwrap();
}

#[test]
fn dropped_checkpoints_become_experts_and_outside_plugins_ask_for_approval_once() {
    let root = tempfile::tempdir().unwrap();
    // SAFETY: this is the only test of this process and it has started no thread yet.
    unsafe {
        std::env::set_var("MERGESCOPE_CONFIG_DIR", root.path().join("config"));
        std::env::set_var("MERGESCOPE_PLUGIN_HOME", root.path().join("user-plugins"));
        // An empty cache: no demo benchmark of the user's fills the inputs.
        std::env::set_var("MERGESCOPE_CACHE_DIR", root.path().join("cache"));
    }
    let config = DocumentConfig {
        plugin_dirs: Vec::new(),
        runs_dir: Some(root.path().join("runs")),
        benchmark: None,
        build_demo_if_missing: false,
        demo_arch: None,
    };
    let new_window = || {
        let app = MergescopeApp::new(&egui::Context::default(), Settings::default(), &config);
        Harness::builder()
            .with_size(egui::vec2(1360.0, 820.0))
            .build_ui_state(|ui, app: &mut MergescopeApp| app.show(ui), app)
    };
    let mut h = new_window();
    h.run_steps(2);

    // Two checkpoints dropped: two experts named after their files; a third of another shape
    // is listed with its problem named.
    let (a, b, odd) = (
        root.path().join("math.safetensors"),
        root.path().join("code.safetensors"),
        root.path().join("odd.safetensors"),
    );
    checkpoint(&a, 2, 1.0);
    checkpoint(&b, 2, 3.0);
    checkpoint(&odd, 4, 0.0);
    drop_file(&mut h, &a);
    drop_file(&mut h, &b);
    let labels: Vec<String> = h.state().doc.inputs.experts.iter().map(|e| e.label.clone()).collect();
    assert_eq!(labels, ["math", "code"]);
    h.get_by_label("Experts (2)");
    drop_file(&mut h, &odd);
    let odd_input = &h.state().doc.inputs.experts[2];
    assert!(
        odd_input.problems.iter().any(|p| p.contains("layer.weight")),
        "{:?}",
        odd_input.problems
    );
    assert!(
        h.get_all_by_label_contains("layer.weight").count() >= 1,
        "the problem is shown inline"
    );
    drop_file(&mut h, &a);
    assert_eq!(
        h.state().doc.inputs.experts.len(),
        3,
        "a file already listed is not added twice"
    );

    // A plugin library from outside the app's folder: the approval dialog shows its path.
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let name = format!(
        "{}mstest_slow{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let outside = root.path().join("downloads");
    std::fs::create_dir_all(&outside).unwrap();
    let lib = outside.join(&name);
    std::fs::copy(deps.join(&name), &lib).unwrap();
    drop_file(&mut h, &lib);
    assert_eq!(h.state().view.approval.as_deref(), Some(lib.as_path()));
    h.get_by_label("Load a plugin from outside mergescope?");
    h.get_by_label(&lib.display().to_string());
    h.get_by_label("Cancel").click();
    h.run_steps(2);
    assert!(h.state().view.approval.is_none());
    assert!(
        h.state().doc.registry.find("mstest-slow").is_err(),
        "cancelled: not loaded"
    );

    drop_file(&mut h, &lib);
    h.get_by_label("Approve and load").click();
    h.run_steps(2);
    assert_eq!(h.state().doc.method.as_deref(), Some("mstest-slow"));
    let approvals = std::fs::read_to_string(root.path().join("config/approved-plugins.json")).unwrap();
    assert!(approvals.contains("mstest_slow"), "{approvals}");

    // Approved once: a new window loads the same file without asking.
    let mut again = new_window();
    again.run_steps(2);
    assert!(!again.state().doc.needs_approval(&lib));
    drop_file(&mut again, &lib);
    assert!(again.state().view.approval.is_none());
    assert_eq!(again.state().doc.method.as_deref(), Some("mstest-slow"));
}
