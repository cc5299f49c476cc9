#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Renders the screenshots in `docs/screenshots/` from a real demo benchmark (the CNN when it is
//! built, else another architecture's): the window as a new user sees it, and after three
//! merges compared. Needs a demo built (`mergescope demo build`), so it is ignored by default:
//!
//! ```sh
//! cargo test --release -p mergescope-gui --test docs_screenshots -- --ignored
//! ```

use egui_kittest::Harness;
use egui_kittest::kittest::{Queryable as _, by};
use mergescope_gui::runs::RunStatus;
use mergescope_gui::settings::{Settings, Theme};
use mergescope_gui::{DocumentConfig, MergescopeApp};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn save(h: &mut Harness<'static, MergescopeApp>, name: &str) {
    let path = out_dir().join(format!("{name}.png"));
    h.render().unwrap().save(&path).unwrap();
    println!("wrote {}", path.display());
}

fn choose(h: &mut Harness<'static, MergescopeApp>, method: &str) {
    h.get(by().role(egui::accesskit::Role::ComboBox).label("Method"))
        .click();
    h.run_steps(2);
    h.get_by_label(method).click();
    h.run_steps(2);
}

#[test]
#[ignore = "needs a demo benchmark (mergescope demo build); writes docs/screenshots"]
fn docs_screenshots() {
    let bench = mergescope_lab::demo::resolve_benchmark("demo", None).expect("build a demo benchmark first");
    let runs = tempfile::tempdir().unwrap();
    for (theme, suffix) in [(Theme::Light, "light"), (Theme::Dark, "dark")] {
        let settings = Settings {
            theme,
            ..Settings::default()
        };
        let config = DocumentConfig {
            plugin_dirs: Vec::new(),
            runs_dir: Some(runs.path().join(suffix)),
            benchmark: Some(bench.dir.clone()),
            build_demo_if_missing: false,
            demo_arch: None,
        };
        let app = MergescopeApp::new(&egui::Context::default(), settings, &config);
        let mut h = Harness::builder()
            .with_size(egui::vec2(1500.0, 860.0))
            .build_ui_state(|ui, app: &mut MergescopeApp| app.show(ui), app);
        h.run_steps(3);
        if theme == Theme::Light {
            save(&mut h, "01-first-launch-demo-inputs");
        }
        for (method, param) in [
            ("Weight averaging", None),
            ("Task arithmetic", Some(("lambda", 0.3))),
            ("TIES-Merging", Some(("lambda", 0.6))),
        ] {
            choose(&mut h, method);
            if let Some((name, v)) = param {
                h.get(by().role(egui::accesskit::Role::Slider).label(name))
                    .set_value_accesskit(v);
                h.run_steps(2);
            }
            h.get_by_label("▶ Run merge").click();
            h.run_steps(2);
        }
        let start = Instant::now();
        while h.state().doc.runs.iter().any(|r| r.status.is_active()) {
            assert!(start.elapsed() < Duration::from_secs(300));
            h.step();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(h.state().doc.runs.iter().all(|r| r.status == RunStatus::Done));
        let ids: Vec<u64> = h.state().doc.runs.iter().map(|r| r.id).collect();
        h.state_mut().view.selected.extend(ids);
        h.get_by_label("Norm. acc %").click();
        h.state_mut().view.message = None;
        h.run_steps(4);
        save(&mut h, &format!("02-three-merges-compared-{suffix}"));
    }
}
