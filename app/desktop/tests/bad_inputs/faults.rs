//! Faults while merging: the process killed with SIGKILL or interrupted with Ctrl-C, a full or
//! read-only filesystem under the output, and a replaced plugin file. Nothing is ever left at
//! the destination but a complete output.

use super::refuses;
use crate::common::*;
use mergescope_engine::dtype::DType;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Base and two experts of one 512×512 f32 matrix each (1 MiB a model), so merges take long
/// enough to be interrupted and outputs do not fit a 1 MiB filesystem.
fn big_models(env: &Env) -> (String, String, String) {
    let n = 512 * 512;
    let v = |k: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * 0.001 + k).sin()).collect() };
    let (a, b, c) = (v(0.0), v(1.0), v(2.0));
    (
        env.write("base.safetensors", &[("w", DType::F32, &[512, 512], &a)]),
        env.write("e1.safetensors", &[("w", DType::F32, &[512, 512], &b)]),
        env.write("e2.safetensors", &[("w", DType::F32, &[512, 512], &c)]),
    )
}

/// The slow fixture plugin (an average that sleeps `delay_ms` per tensor) installed and
/// approved as `--plugin-dir` `slow`.
fn slow_plugin(env: &Env) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let (pre, suf) = (std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let dir = env.path("slow");
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join(format!("{pre}mergescope_plugin_slow{suf}"));
    std::fs::copy(deps.join(format!("{pre}mstest_slow{suf}")), &lib).unwrap();
    env.ok(&["plugins", "approve", s(&lib)]);
    dir
}

/// A slow merge of the three models into `out`, started in the background.
fn start_slow_merge(env: &Env, plugins: &Path, out: &Path) -> Child {
    let (base, e1, e2) = (
        env.path("base.safetensors"),
        env.path("e1.safetensors"),
        env.path("e2.safetensors"),
    );
    env.cmd()
        .args([
            "--plugin-dir",
            s(plugins),
            "merge",
            "--method",
            "mstest-slow",
            "--param",
            "delay_ms=60000",
        ])
        .args([
            "--base",
            s(&base),
            "--expert",
            s(&e1),
            "--expert",
            s(&e2),
            "--out",
            s(out),
            "-q",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the merge into `out` has its temporary file (so it is in the middle of writing).
fn wait_for_partial(dir: &Path, out: &Path) {
    let prefix = format!(".{}.partial-", out.file_name().unwrap().to_string_lossy());
    let started = Instant::now();
    while !std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().starts_with(&prefix))
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the merge never started writing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn sigkill_in_the_middle_of_a_merge_leaves_nothing_at_the_destination() {
    let env = Env::new();
    big_models(&env);
    let plugins = slow_plugin(&env);
    let out = env.path("o.safetensors");
    let child = start_slow_merge(&env, &plugins, &out);
    wait_for_partial(env.dir.path(), &out);
    signal(&child, "-KILL");
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert!(!out.exists(), "a killed merge left a file at its destination");
    // The next run succeeds and removes the dead run's temporary file.
    let (base, e1, e2) = (
        env.path("base.safetensors"),
        env.path("e1.safetensors"),
        env.path("e2.safetensors"),
    );
    env.ok(&[
        "merge",
        "--method",
        "weight-average",
        "--base",
        s(&base),
        "--expert",
        s(&e1),
        "--expert",
        s(&e2),
        "--out",
        s(&out),
        "-q",
    ]);
    assert!(out.is_file());
    let left: Vec<String> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn ctrl_c_cancels_a_merge_and_removes_its_temporary_output() {
    let env = Env::new();
    big_models(&env);
    let plugins = slow_plugin(&env);
    let out = env.path("o.safetensors");
    let before: Vec<PathBuf> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let child = start_slow_merge(&env, &plugins, &out);
    wait_for_partial(env.dir.path(), &out);
    let sent = Instant::now();
    signal(&child, "-INT");
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "cancel took {:?}",
        sent.elapsed()
    );
    assert!(!o.status.success() && err.contains("cancel"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let after: Vec<PathBuf> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        before.len(),
        after.len(),
        "files left by the cancelled merge: {after:?}"
    );
    assert!(!out.exists());
}

/// A filesystem of `options` mounted at `dir` for the test's life (needs root; `None` where
/// mounting is not allowed, which the caller reports).
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, options: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then(|| Mount(dir.to_owned()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A weight-average merge of the big models into a tmpfs mounted with `options` refuses with
/// `needles` and leaves the filesystem empty (skipped, saying so, where mounting is not allowed).
fn refuse_on_tmpfs(options: &str, needles: &[&str]) {
    let env = Env::new();
    let (base, e1, e2) = big_models(&env);
    let Some(m) = Mount::tmpfs(&env.path("mnt"), options) else {
        eprintln!("skipped: mounting a tmpfs ({options}) needs root");
        return;
    };
    let out = m.0.join("o.safetensors");
    let args = [
        "merge",
        "--method",
        "weight-average",
        "--base",
        &base,
        "--expert",
        &e1,
        "--expert",
        &e2,
    ];
    let err = refuses(&env, &[&args[..], &["--out", s(&out)]].concat(), needles);
    assert!(
        std::fs::read_dir(&m.0).unwrap().next().is_none(),
        "left in the filesystem: {err}"
    );
}

#[test]
fn a_full_filesystem_fails_the_merge_and_leaves_no_partial_output() {
    refuse_on_tmpfs("size=1m", &["o.safetensors", "No space left on device"]);
}

#[test]
fn a_read_only_filesystem_is_refused_before_merging() {
    refuse_on_tmpfs("ro,size=1m", &["mnt", "Read-only file system"]);
}

/// An approved plugin replaced by another file under the same name is refused until approved
/// again: approval is by content (SHA-256), not by name.
#[test]
fn a_replaced_plugin_file_needs_approval_again() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let plugins = slow_plugin(&env);
    let lib = std::fs::read_dir(&plugins).unwrap().next().unwrap().unwrap().path();
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let (pre, suf) = (std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    std::fs::copy(deps.join(format!("{pre}mstest_panics{suf}")), &lib).unwrap();
    refuses(
        &env,
        &[
            "--plugin-dir",
            s(&plugins),
            "merge",
            "--method",
            "mstest-slow",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            &e2,
            "--out",
            s(&env.path("o.safetensors")),
        ],
        &[
            "'mstest-slow'",
            "mergescope_plugin_slow",
            "changed since they were approved",
            "plugins approve",
        ],
    );
}
