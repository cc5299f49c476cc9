//! Finding plugins: next to the executable (trusted), in the user's plugin folder and in
//! folders the user names. Loading a library runs its code, so a library from outside the
//! app's own folder is only loaded once the user approved that exact file (by SHA-256).

use super::loader::{Plugin, PluginOrigin, load_plugin_as};
use super::schema::did_you_mean;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether a file name is a mergescope plugin library (`libmergescope_plugin_*.so`,
/// `mergescope_plugin_*.dll`, `libmergescope_plugin_*.dylib`).
pub fn is_plugin_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let stem = name.strip_prefix("lib").unwrap_or(name);
    stem.starts_with("mergescope_plugin_") && name.ends_with(std::env::consts::DLL_SUFFIX)
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
}

/// The user's configuration folder: `$MERGESCOPE_CONFIG_DIR`, else `$XDG_CONFIG_HOME/mergescope`,
/// else `~/.config/mergescope`.
pub fn config_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MERGESCOPE_CONFIG_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("mergescope"));
    }
    home().map(|h| h.join(".config").join("mergescope"))
}

/// The user's plugin folder: `$MERGESCOPE_PLUGIN_HOME`, else `$XDG_DATA_HOME/mergescope/plugins`,
/// else `~/.local/share/mergescope/plugins`.
pub fn user_plugin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MERGESCOPE_PLUGIN_HOME") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("mergescope").join("plugins"));
    }
    home().map(|h| h.join(".local").join("share").join("mergescope").join("plugins"))
}

/// SHA-256 of a file, hex.
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    let digest = Sha256::digest(&bytes);
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// One approved library.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// Absolute path.
    pub path: PathBuf,
    /// SHA-256 of the file when approved; a changed file needs approval again.
    pub sha256: String,
}

/// Whether a plugin library outside the app's folder may be loaded ([`Approvals::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApprovalState {
    /// Approved as it is, or in a trusted folder.
    Approved,
    /// Needs the user's approval; `changed`: it was approved with other contents before.
    Pending {
        /// Approved before with other contents (rebuilt or replaced since).
        changed: bool,
    },
}

/// The list of approved plugin files, kept in `approved-plugins.json` in the config folder.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Approvals {
    /// Approved files.
    pub approved: Vec<Approval>,
    /// Development folders (absolute) whose libraries load without approval, rebuilt or not:
    /// a plugin author's own build output (`plugins approve --folder DIR`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_folders: Vec<PathBuf>,
    #[serde(skip)]
    file: Option<PathBuf>,
}

impl Approvals {
    /// Loads the user's approvals (empty when there are none yet).
    pub fn load() -> Result<Approvals, String> {
        let Some(dir) = config_dir() else {
            return Ok(Approvals::default());
        };
        let file = dir.join("approved-plugins.json");
        let mut a: Approvals = match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                format!(
                    "'{}' is corrupt ({e}); delete it and approve your plugins again",
                    file.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Approvals::default(),
            Err(e) => return Err(format!("cannot read '{}': {e}", file.display())),
        };
        a.file = Some(file);
        Ok(a)
    }

    /// Whether the library at the absolute `path` may load: it lies in a trusted folder (not
    /// read), or this exact file (path and SHA-256) was approved; else whether it was approved
    /// with other contents before (it changed since).
    pub fn state(&self, path: &Path) -> ApprovalState {
        if path
            .parent()
            .is_some_and(|dir| self.trusted_folders.iter().any(|t| t == dir))
        {
            return ApprovalState::Approved;
        }
        let Ok(sha256) = file_sha256(path) else {
            return ApprovalState::Pending { changed: false };
        };
        let mut changed = false;
        for a in self.approved.iter().filter(|a| a.path == path) {
            if a.sha256 == sha256 {
                return ApprovalState::Approved;
            }
            changed = true;
        }
        ApprovalState::Pending { changed }
    }

    /// Approves a library file and saves the list atomically.
    pub fn approve(&mut self, path: &Path) -> Result<Approval, String> {
        let abs = std::fs::canonicalize(path).map_err(|e| format!("cannot approve '{}': {e}", path.display()))?;
        let sha256 = file_sha256(&abs).map_err(|e| format!("cannot read '{}': {e}", abs.display()))?;
        self.approved.retain(|a| a.path != abs);
        let a = Approval { path: abs, sha256 };
        self.approved.push(a.clone());
        self.save()?;
        Ok(a)
    }

    /// Trusts the folder `dir`: every library in it (not in its subfolders) loads from now on
    /// without approval, whatever it contains. Saves the list atomically; the absolute folder.
    pub fn trust_folder(&mut self, dir: &Path) -> Result<PathBuf, String> {
        let abs = std::fs::canonicalize(dir).map_err(|e| format!("cannot trust '{}': {e}", dir.display()))?;
        if !abs.is_dir() {
            return Err(format!(
                "'{}' is not a folder; give the folder your plugin is built into",
                abs.display()
            ));
        }
        if !self.trusted_folders.contains(&abs) {
            self.trusted_folders.push(abs.clone());
        }
        self.save()?;
        Ok(abs)
    }

    fn save(&self) -> Result<(), String> {
        let file = self
            .file
            .clone()
            .ok_or("no configuration folder: set MERGESCOPE_CONFIG_DIR or HOME")?;
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create '{}': {e}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let tmp = file.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(|e| format!("cannot write '{}': {e}", tmp.display()))?;
        std::fs::rename(&tmp, &file).map_err(|e| format!("cannot write '{}': {e}", file.display()))
    }
}

/// The folders to search.
#[derive(Clone, Debug, Default)]
pub struct PluginDirs {
    /// The executable's folder (bundled, trusted plugins).
    pub exe_dir: Option<PathBuf>,
    /// The user's plugin folder.
    pub user_dir: Option<PathBuf>,
    /// Folders given with `--plugin-dir`.
    pub extra: Vec<PathBuf>,
}

impl PluginDirs {
    /// The executable's folder (or `$MERGESCOPE_BUNDLED_DIR`, used by tests and packagers that
    /// keep the bundled plugins elsewhere), the user's folder, and `extra`.
    pub fn standard(extra: Vec<PathBuf>) -> PluginDirs {
        let exe_dir = std::env::var_os("MERGESCOPE_BUNDLED_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
            });
        PluginDirs {
            exe_dir,
            user_dir: user_plugin_dir(),
            extra,
        }
    }
}

/// A library that was found but not loaded because it needs the user's approval.
#[derive(Clone, Debug, Serialize)]
pub struct Pending {
    /// Library path.
    pub path: PathBuf,
    /// Where it was found.
    pub origin: PluginOrigin,
    /// Approved before with other contents: the file changed (was rebuilt) since.
    pub changed: bool,
}

/// A library that failed to load, with the reason.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// Library path.
    pub path: PathBuf,
    /// User-facing reason.
    pub error: String,
}

/// Every plugin found.
#[derive(Debug, Default)]
pub struct Registry {
    /// Loaded plugins, sorted by id.
    pub plugins: Vec<Arc<Plugin>>,
    /// Libraries waiting for approval.
    pub pending: Vec<Pending>,
    /// Libraries that failed to load.
    pub failures: Vec<Failure>,
}

fn list_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| is_plugin_file(p))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

impl Registry {
    /// The loaded plugins in the order a user looks for them: by the name shown, ignoring case
    /// (ids sort "breadcrumbs" before "cart").
    pub fn by_name(&self) -> Vec<&Arc<Plugin>> {
        let mut v: Vec<&Arc<Plugin>> = self.plugins.iter().collect();
        v.sort_by_key(|p| p.info.name.to_lowercase());
        v
    }

    /// Searches the folders and loads every plugin it may.
    pub fn discover(dirs: &PluginDirs, approvals: &Approvals) -> Registry {
        let mut reg = Registry::default();
        let mut sources: Vec<(PathBuf, PluginOrigin)> = Vec::new();
        if let Some(d) = &dirs.exe_dir {
            sources.extend(list_dir(d).into_iter().map(|p| (p, PluginOrigin::Bundled)));
        }
        if let Some(d) = &dirs.user_dir {
            sources.extend(list_dir(d).into_iter().map(|p| (p, PluginOrigin::UserFolder)));
        }
        for d in &dirs.extra {
            if !d.is_dir() {
                reg.failures.push(Failure {
                    path: d.clone(),
                    error: "plugin folder does not exist".into(),
                });
                continue;
            }
            sources.extend(list_dir(d).into_iter().map(|p| (p, PluginOrigin::Extra)));
        }
        for (path, origin) in sources {
            let abs = std::fs::canonicalize(&path).unwrap_or(path);
            if reg.plugins.iter().any(|p| p.path == abs) {
                continue;
            }
            if origin != PluginOrigin::Bundled
                && let ApprovalState::Pending { changed } = approvals.state(&abs)
            {
                reg.pending.push(Pending {
                    path: abs,
                    origin,
                    changed,
                });
                continue;
            }
            reg.add(&abs, origin);
        }
        reg.plugins.sort_by(|a, b| a.id().cmp(b.id()));
        reg
    }

    /// Loads one more plugin file (approval is the caller's business) and returns it; an id
    /// that is already loaded is refused.
    pub fn load_file(&mut self, path: &Path, origin: PluginOrigin) -> Result<Arc<Plugin>, String> {
        let abs = std::fs::canonicalize(path).map_err(|e| format!("cannot open '{}': {e}", path.display()))?;
        if let Some(p) = self.plugins.iter().find(|p| p.path == abs) {
            return Ok(p.clone());
        }
        let p = load_plugin_as(&abs, origin).map_err(|e| e.to_string())?;
        if let Some(other) = self.plugins.iter().find(|q| q.id() == p.id()) {
            return Err(format!(
                "'{}' provides method '{}', which '{}' already provides; remove one of them",
                abs.display(),
                p.id(),
                other.path.display()
            ));
        }
        let p = Arc::new(p);
        self.plugins.push(p.clone());
        self.plugins.sort_by(|a, b| a.id().cmp(b.id()));
        Ok(p)
    }

    fn add(&mut self, path: &Path, origin: PluginOrigin) {
        match load_plugin_as(path, origin) {
            Ok(p) => {
                if let Some(other) = self.plugins.iter().find(|q| q.id() == p.id()) {
                    self.failures.push(Failure {
                        path: path.to_path_buf(),
                        error: format!(
                            "id '{}' is already provided by '{}'; the first one found is used",
                            p.id(),
                            other.path.display()
                        ),
                    });
                } else {
                    self.plugins.push(Arc::new(p));
                }
            }
            Err(e) => self.failures.push(Failure {
                path: path.to_path_buf(),
                error: e.to_string(),
            }),
        }
    }

    /// The plugin with this id, or an error listing the known ids with a did-you-mean.
    pub fn find(&self, id: &str) -> Result<Arc<Plugin>, String> {
        if let Some(p) = self.plugins.iter().find(|p| p.id() == id) {
            return Ok(p.clone());
        }
        let stem = id.replace('-', "_");
        if let Some(f) = self
            .failures
            .iter()
            .find(|f| f.path.file_name().is_some_and(|n| n.to_string_lossy().contains(&stem)))
        {
            return Err(format!(
                "merge method '{id}' is unavailable: its plugin failed to load: {}",
                f.error
            ));
        }
        let known: Vec<&str> = self.plugins.iter().map(|p| p.id()).collect();
        let hint = did_you_mean(id, known.iter().copied())
            .map(|c| format!(" Did you mean '{c}'?"))
            .unwrap_or_default();
        let mut msg = format!(
            "unknown merge method '{id}'.{hint} Known methods: {}.",
            if known.is_empty() {
                "none (no plugins were found)".to_owned()
            } else {
                known.join(", ")
            }
        );
        if let Some(p) = self.pending.iter().find(|p| p.path.to_string_lossy().contains(&stem)) {
            msg.push_str(&format!(
                " A plugin that may provide it needs approval first: mergescope plugins approve '{}'",
                p.path.display()
            ));
        } else if !self.pending.is_empty() {
            let files: Vec<String> = self.pending.iter().map(|p| format!("'{}'", p.path.display())).collect();
            msg.push_str(&format!(
                " Not loaded until approved (new, or changed since they were approved): {}; check them and run \
                 mergescope plugins approve PATH",
                files.join(", ")
            ));
        }
        Err(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_file_names() {
        let so = std::env::consts::DLL_SUFFIX;
        assert!(is_plugin_file(Path::new(&format!("/x/libmergescope_plugin_ties{so}"))));
        assert!(is_plugin_file(Path::new(&format!("mergescope_plugin_ties{so}"))));
        assert!(!is_plugin_file(Path::new(&format!("/x/libmstest_wrong_magic{so}"))));
        assert!(!is_plugin_file(Path::new("/x/libmergescope_plugin_ties.rlib")));
    }

    #[test]
    fn unknown_method_lists_known_ones() {
        let reg = Registry::default();
        let e = reg.find("tiez").unwrap_err();
        assert!(
            e.contains("unknown merge method 'tiez'") && e.contains("no plugins"),
            "{e}"
        );
    }
}
