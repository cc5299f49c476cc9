//! What the tests of more than one crate find outside the repository: the real
//! all-MiniLM-L6-v2 that scripts/fetch-minilm.sh unpacks, and the single-node Slurm of
//! scripts/slurm-cluster.sh. Not a crate: app/desktop/tests and app/gui/tests include this file
//! with `#[path]`, so both look for these things in one way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The all-MiniLM-L6-v2 folder (`MERGESCOPE_MINILM_DIR`, else where scripts/fetch-minilm.sh
/// puts it), or None with the reason printed, ending with what it is needed `for`. With
/// MERGESCOPE_REQUIRE_MINILM set (CI), a missing model fails instead.
pub fn minilm(what_for: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("MERGESCOPE_MINILM_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mergescope/all-minilm-l6-v2")))?;
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("MERGESCOPE_REQUIRE_MINILM").is_none(),
        "MERGESCOPE_REQUIRE_MINILM is set but all-MiniLM-L6-v2 is not in {}: run scripts/fetch-minilm.sh",
        dir.display()
    );
    eprintln!(
        "all-MiniLM-L6-v2 not found in {}: run scripts/fetch-minilm.sh {what_for}",
        dir.display()
    );
    None
}

/// Whether the Slurm tests must fail rather than skip without a cluster
/// (MERGESCOPE_REQUIRE_SLURM=1, as CI sets it).
pub fn slurm_required() -> bool {
    std::env::var("MERGESCOPE_REQUIRE_SLURM").is_ok_and(|v| v == "1")
}

/// The `SLURM_CONF` of a running cluster: the one `SLURM_CONF` names, else the one
/// scripts/slurm-cluster.sh starts (returned with what the script said on stderr); or why
/// there is none.
pub fn start_slurm() -> Result<(String, String), String> {
    if let Ok(conf) = std::env::var("SLURM_CONF") {
        return Ok((conf, String::new()));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slurm-cluster.sh");
    let o = Command::new("bash")
        .arg(&script)
        .arg("start")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr).trim().to_owned();
    if !o.status.success() {
        return Err(format!("{} start failed: {err}", script.display()));
    }
    let conf = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("export SLURM_CONF="))
        .map(str::to_owned)
        .ok_or_else(|| format!("{} start printed no SLURM_CONF: {out}", script.display()))?;
    Ok((conf, err))
}
