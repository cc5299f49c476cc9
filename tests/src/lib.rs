//! Helpers shared by the end-to-end tests.

use std::path::PathBuf;

/// Directory holding the plugin libraries built for this test run (target/<profile>/deps).
pub fn plugin_build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().map(PathBuf::from).unwrap_or_default()
}

/// Path of the plugin library `lib<name>.so` (or the platform's equivalent) built for this run.
pub fn plugin_path(lib_name: &str) -> PathBuf {
    let file = format!(
        "{}{lib_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    plugin_build_dir().join(file)
}
