//! What the app remembers between launches (apart from the window geometry, which eframe
//! keeps): theme, recent projects, the device of the last run, panel visibility, the backbone
//! folder of the last text-benchmark build, and the Experiments window's executor (Local or
//! Slurm with its fields). Every field has a default, so a settings file written by an older
//! version loads.

use crate::experiments::ExecutorSettings;
use mergescope_engine::device::DeviceChoice;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Light, dark, or as the system says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Theme {
    /// Follow the operating system.
    #[default]
    System,
    /// Light.
    Light,
    /// Dark.
    Dark,
}

impl Theme {
    /// The egui preference.
    pub fn preference(self) -> egui::ThemePreference {
        match self {
            Theme::System => egui::ThemePreference::System,
            Theme::Light => egui::ThemePreference::Light,
            Theme::Dark => egui::ThemePreference::Dark,
        }
    }
}

/// How many recent projects the File menu lists.
pub const MAX_RECENT: usize = 8;

/// Persisted settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Colour theme.
    pub theme: Theme,
    /// Recently opened or saved projects, newest first.
    pub recent: Vec<PathBuf>,
    /// Device of the last run.
    pub device: DeviceChoice,
    /// Whether the log panel is open.
    pub show_log: bool,
    /// The backbone folder of the last text-benchmark build (Benchmark > Build text benchmark).
    pub text_backbone: Option<PathBuf>,
    /// The Experiments window's executor: Local or Slurm, and the Slurm fields.
    pub sweep_executor: ExecutorSettings,
}

impl Settings {
    /// Key under which eframe stores the settings.
    pub const KEY: &'static str = "mergescope.settings";

    /// Puts `path` first in the recent list (no duplicates, at most [`MAX_RECENT`]).
    pub fn remember(&mut self, path: &Path) {
        self.recent.retain(|p| p != path);
        self.recent.insert(0, path.to_path_buf());
        self.recent.truncate(MAX_RECENT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::ExecutorKind;

    #[test]
    fn recent_projects_are_unique_newest_first_and_bounded() {
        let mut s = Settings::default();
        for i in 0..10 {
            s.remember(Path::new(&format!("/p/{i}.msproj")));
        }
        s.remember(Path::new("/p/5.msproj"));
        assert_eq!(s.recent.len(), MAX_RECENT);
        assert_eq!(s.recent[0], Path::new("/p/5.msproj"));
        assert_eq!(s.recent[1], Path::new("/p/9.msproj"));
        assert_eq!(s.recent.iter().filter(|p| p.ends_with("5.msproj")).count(), 1);
        let back: Settings = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let old: Settings = serde_json::from_str(r#"{"theme":"Dark"}"#).unwrap();
        assert_eq!(old.theme, Theme::Dark);
    }

    #[test]
    fn the_executor_and_backbone_round_trip_and_older_settings_files_load() {
        let mut s = Settings {
            text_backbone: Some(PathBuf::from("/models/all-minilm-l6-v2")),
            ..Settings::default()
        };
        s.sweep_executor.executor = ExecutorKind::Slurm;
        let f = &mut s.sweep_executor.slurm;
        f.partition = "gpu".into();
        f.time = "01:30:00".into();
        f.cpus_per_cell = 8;
        f.gpus_per_cell = 2;
        f.max_parallel = 16;
        f.workdir = "/scratch/sweeps".into();
        f.setup = "module load cuda".into();
        f.poll_seconds = 5.0;
        let text = serde_json::to_string(&s).unwrap();
        let back: Settings = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        assert!(text.contains(r#""executor":"Slurm""#), "{text}");

        // A settings file of the version before: none of the new fields.
        let old = r#"{"theme":"Light","recent":["/p/a.msproj"],"device":"cpu","show_log":true}"#;
        let old: Settings = serde_json::from_str(old).unwrap();
        assert_eq!(old.theme, Theme::Light);
        assert!(old.show_log);
        assert_eq!(old.text_backbone, None);
        assert_eq!(old.sweep_executor, ExecutorSettings::default());
        assert_eq!(old.sweep_executor.executor, ExecutorKind::Local);
        assert_eq!(old.sweep_executor.slurm.cpus_per_cell, 1);
        // Some Slurm fields only (written by a later version that dropped others).
        let some: Settings =
            serde_json::from_str(r#"{"sweep_executor":{"executor":"Slurm","slurm":{"partition":"long"}}}"#).unwrap();
        assert_eq!(some.sweep_executor.executor, ExecutorKind::Slurm);
        assert_eq!(some.sweep_executor.slurm.partition, "long");
        assert_eq!(some.sweep_executor.slurm.poll_seconds, 2.0);
    }
}
