//! The bad-input suite: one test per way a careless or hostile user can hurt mergescope's
//! inputs or outputs. Each case asserts a non-zero exit, a message that names the file,
//! tensor or parameter and the fix, no panic text, every file in the test folder byte-identical
//! afterwards (inputs untouched, no partial output left behind).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod cases;
mod faults;
mod files;
mod oracle;
mod plugins;
mod suites;

use common::Env;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file under the test folder with its bytes, leaving out mergescope's own state
/// (configuration, caches, user plugins, task data).
fn tree(env: &Env) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if dir == root
                && ["config", "cache", "user-plugins", "tasks"]
                    .iter()
                    .any(|s| rel == Path::new(s))
            {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(rel.join(""), Vec::new());
                walk(&p, root, out);
            } else if ft.is_file() {
                out.insert(rel, std::fs::read(&p).unwrap());
            } else {
                out.insert(rel, b"<special>".to_vec());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(env.dir.path(), env.dir.path(), &mut out);
    out
}

/// Runs `args`, which must fail: non-zero exit, no panic, every `needle` in the message, and
/// the test folder exactly as before. Returns the message.
fn refuses(env: &Env, args: &[&str], needles: &[&str]) -> String {
    let before = tree(env);
    let o = env.run(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} should have failed; stderr:\n{err}");
    assert_eq!(
        o.status.code(),
        Some(1),
        "{args:?} must exit with 1, not die by a signal:\n{err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: the message lacks '{n}':\n{err}");
    }
    let after = tree(env);
    let changed: Vec<_> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(changed.is_empty(), "{args:?} changed or left files: {changed:?}\n{err}");
    record(args, &err);
    err
}

/// With `MERGESCOPE_CASES_OUT` set, appends the case (test name, command, message) to that
/// file as a JSON line: `scripts/reliability-table.py` turns it into docs/reliability.md's table.
fn record(args: &[&str], err: &str) {
    let Some(out) = std::env::var_os("MERGESCOPE_CASES_OUT") else {
        return;
    };
    let test = std::thread::current().name().unwrap_or("").to_owned();
    let line = serde_json::json!({"test": test, "args": args, "message": err.trim()}).to_string();
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(out).unwrap();
    // One write per line: with O_APPEND, lines of tests running in parallel do not interleave.
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}
