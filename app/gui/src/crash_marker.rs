//! What a crash leaves behind: a marker in the runs folder, written before a merge calls its
//! plugin and removed when the merge ends however it ends (result, error, cancel, unwinding).
//! A plugin that kills the whole process (a segfault in native code) leaves the marker, and the
//! next window names the plugin and its library instead of starting as if nothing happened.

use mergescope_engine::plugin::Plugin;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The marker's file name in the runs folder.
pub const FILE: &str = "running-merge.json";

/// What the marker records.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    plugin: String,
    library: PathBuf,
    output: PathBuf,
}

/// A merge in progress: its marker exists while this lives.
pub struct Running(PathBuf);

impl Running {
    /// Writes the marker for `plugin` merging into `output` (a marker that cannot be written is
    /// only a lost diagnosis, never a failed merge).
    pub fn begin(runs_dir: &Path, plugin: &Plugin, output: &Path) -> Running {
        let path = runs_dir.join(FILE);
        let marker = Marker {
            plugin: plugin.id().to_owned(),
            library: plugin.path.clone(),
            output: output.to_owned(),
        };
        if let Ok(text) = serde_json::to_vec_pretty(&marker) {
            let _ = mergescope_engine::writer::write_atomic(&path, &text);
        }
        Running(path)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The message for a merge the last session in `runs_dir` never finished (the process died
/// while the plugin ran), removing the marker; `None` when the last session ended cleanly.
pub fn take_last(runs_dir: &Path) -> Option<String> {
    let path = runs_dir.join(FILE);
    let bytes = std::fs::read(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    Some(match serde_json::from_slice::<Marker>(&bytes) {
        Ok(m) => format!(
            "the last session ended while method '{}' ({}) was merging into '{}': the plugin probably crashed \
             mergescope; its output was not written. Check the plugin or report it to its author before using it again",
            m.plugin,
            m.library.display(),
            m.output.display()
        ),
        Err(_) => format!(
            "the last session ended in the middle of a merge ('{}' is unreadable): a plugin probably crashed mergescope",
            path.display()
        ),
    })
}
