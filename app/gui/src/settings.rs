//! What the app remembers between launches (apart from the window geometry, which eframe
//! keeps): theme, recent projects, the device of the last run, panel visibility.

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
}
