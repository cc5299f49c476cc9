//! Checkpoint files, shard folders and outputs.

use super::refuses;
use crate::common::*;
use mergescope_engine::dtype::DType;
use std::path::Path;
use std::time::{Duration, Instant};

/// A safetensors file with `header` as its JSON header and `data` after it.
fn raw_file(path: &Path, header: &str, data: &[u8]) {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    std::fs::write(path, v).unwrap();
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `e1` written as a folder of two shards with its index.
fn sharded_copy(env: &Env) -> std::path::PathBuf {
    let dir = env.path("sharded");
    write_checkpoint(
        &dir,
        &[
            ("w", DType::F32, &[2, 2], &[2.0, 2.0, 3.0, 5.0]),
            ("b", DType::F32, &[2], &[1.0, 0.0]),
        ],
        Some(8),
    );
    assert!(dir.join("model.safetensors.index.json").is_file());
    dir
}

#[test]
fn the_index_of_a_sharded_input_is_never_overwritten() {
    let env = Env::new();
    let (base, _, e2) = three_models(&env);
    let sharded = sharded_copy(&env);
    let index = sharded.join("model.safetensors.index.json");
    let args = |out: &Path, input_as_base: bool| {
        let mut a: Vec<String> = vec!["merge".into(), "--method".into(), "ties".into()];
        if input_as_base {
            a.extend(["--base".into(), s(&sharded).into(), "--expert".into(), e2.clone()]);
        } else {
            a.extend(["--base".into(), base.clone(), "--expert".into(), e2.clone()]);
            a.extend(["--expert".into(), s(&sharded).into()]);
        }
        a.extend(["--out".into(), s(out).into(), "--overwrite".into()]);
        a
    };
    for as_base in [false, true] {
        let a = args(&index, as_base);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refuses(
            &env,
            &a,
            &[
                "model.safetensors.index.json",
                "inside the input folder",
                "--out outside",
            ],
        );
        // Any new file inside the input folder is refused too.
        let a = args(&sharded.join("merged.safetensors"), as_base);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refuses(&env, &a, &["inside the input folder"]);
    }
    // The folder that holds an input cannot be the output either.
    refuses(
        &env,
        &[
            "merge",
            "--method",
            "ties",
            "--base",
            &base,
            "--expert",
            &e2,
            "--expert",
            s(&sharded),
            "--out",
            s(env.dir.path()),
            "--overwrite",
            "--shard-size",
            "8B",
        ],
        &["holding the input"],
    );
}

#[test]
fn overwrite_never_empties_a_folder_mergescope_did_not_write() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let other = env.path("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("keep.txt"), "keep").unwrap();
    let merge = |out: &Path| {
        vec![
            "merge".to_owned(),
            "--method".into(),
            "task-arithmetic".into(),
            "--base".into(),
            base.clone(),
            "--expert".into(),
            e1.clone(),
            "--expert".into(),
            e2.clone(),
            "--shard-size".into(),
            "1B".into(),
            "--out".into(),
            s(out).into(),
            "--overwrite".into(),
        ]
    };
    let a = merge(&other);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    refuses(
        &env,
        &a,
        &["'", "other", "did not write", "keep.txt", "choose another --out"],
    );
    assert_eq!(std::fs::read_to_string(other.join("keep.txt")).unwrap(), "keep");

    // mergescope's own shard folder is replaced, as --overwrite promises.
    let own = env.path("own");
    env.ok(&a
        .iter()
        .map(|x| if *x == s(&other) { s(&own) } else { x })
        .collect::<Vec<_>>());
    let first = std::fs::read(own.join("model.safetensors.index.json")).unwrap();
    let again = merge(&own);
    env.ok(&again.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(std::fs::read(own.join("model.safetensors.index.json")).unwrap(), first);
    // ...but not once the user put a file of theirs in it.
    std::fs::write(own.join("notes.md"), "mine").unwrap();
    refuses(
        &env,
        &again.iter().map(String::as_str).collect::<Vec<_>>(),
        &["notes.md", "did not write"],
    );
}

#[test]
fn f16_output_refuses_values_beyond_its_range() {
    let env = Env::new();
    let base = env.write("base.safetensors", &[("w", DType::F32, &[4], &[0.0; 4])]);
    let e1 = env.write("e1.safetensors", &[("w", DType::F32, &[4], &[1.0, 7.0e4, -1.0e5, 2.0])]);
    let out = env.path("o.safetensors");
    let e = refuses(
        &env,
        &[
            "merge",
            "--method",
            "task-arithmetic",
            "--param",
            "lambda=1",
            "--base",
            &base,
            "--expert",
            &e1,
            "--dtype",
            "f16",
            "--out",
            s(&out),
        ],
        &["tensor 'w'", "F16", "65504", "Inf", "--dtype"],
    );
    assert!(
        e.contains("1e5") || e.contains("100000"),
        "the message gives the tensor's range: {e}"
    );
    // bf16 holds these values.
    env.ok(&[
        "merge",
        "--method",
        "task-arithmetic",
        "--param",
        "lambda=1",
        "--base",
        &base,
        "--expert",
        &e1,
        "--dtype",
        "bf16",
        "--out",
        s(&out),
    ]);
    close(&read(&out, "w"), &[1.0, 70144.0, -99840.0, 2.0]);
}

#[test]
fn headers_must_tile_the_data_exactly_and_name_each_tensor_once() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cases = [
        (
            "overlap",
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
            &data[..16],
            vec!["overlap", "tensor '"],
        ),
        (
            "hole",
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[20,28]}}"#,
            &[&data[..], &data[..4]].concat()[..],
            vec!["tensor 'b'", "4 bytes unused"],
        ),
        (
            "trailing",
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}"#,
            &[&data[..], &data[..8]].concat()[..],
            vec!["bytes follow the last tensor"],
        ),
        (
            "duplicate",
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}"#,
            &data[..],
            vec!["'w'", "twice"],
        ),
    ];
    for (name, header, bytes, needles) in cases {
        let p = env.path(&format!("{name}.safetensors"));
        raw_file(&p, header, bytes);
        let mut n: Vec<&str> = needles.clone();
        n.push(name);
        refuses(&env, &["inspect", s(&p)], &n);
        refuses(
            &env,
            &[
                "merge",
                "--method",
                "ties",
                "--base",
                &base,
                "--expert",
                &e1,
                "--expert",
                s(&p),
                "--out",
                s(&env.path("o.safetensors")),
            ],
            &n,
        );
    }
}

#[test]
fn a_fifo_or_a_device_is_refused_at_once() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let fifo = env.path("pipe.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let started = Instant::now();
    let mut child = env
        .cmd()
        .args([
            "merge",
            "--method",
            "ties",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            s(&fifo),
            "--out",
        ])
        .arg(env.path("o.safetensors"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("mergescope hangs on a FIFO input");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("pipe.safetensors") && err.contains("not a regular file"),
        "{err}"
    );
    refuses(&env, &["inspect", "/dev/zero"], &["/dev/zero", "not a regular file"]);
}

#[test]
fn shard_indexes_stay_inside_their_folder_and_list_each_tensor_once() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let outside = env.path("sharded-escape");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(
        outside.join("model.safetensors.index.json"),
        r#"{"weight_map":{"w":"../e1.safetensors","b":"../e1.safetensors"}}"#,
    )
    .unwrap();
    refuses(
        &env,
        &["inspect", s(&outside)],
        &["'../e1.safetensors'", "plain file names", "index.json"],
    );
    std::fs::write(
        outside.join("model.safetensors.index.json"),
        format!(r#"{{"weight_map":{{"w":"{e1}","b":"{e1}"}}}}"#),
    )
    .unwrap();
    refuses(&env, &["inspect", s(&outside)], &["plain file names"]);

    let twice = sharded_copy(&env);
    let index = twice.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let listed = text.replacen("\"b\":", "\"w\": \"model-00002-of-00002.safetensors\", \"b\":", 1);
    assert_ne!(listed, text);
    std::fs::write(&index, listed).unwrap();
    refuses(
        &env,
        &[
            "merge",
            "--method",
            "ties",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            s(&twice),
            "--out",
            s(&env.path("o.safetensors")),
        ],
        &["tensor 'w' twice", "index.json"],
    );
}

#[test]
fn a_non_finite_input_is_named_with_its_file_and_tensor() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let nan = env.write(
        "nan.safetensors",
        &[
            ("w", DType::F32, &[2, 2], &[1.0, f32::NAN, 3.0, 4.0]),
            ("b", DType::F32, &[2], &[0.0, 0.0]),
        ],
    );
    for method in ["ties", "task-arithmetic", "weight-average"] {
        refuses(
            &env,
            &[
                "merge",
                "--method",
                method,
                "--base",
                &base,
                "--expert",
                &e1,
                "--expert",
                &nan,
                "--out",
                s(&env.path("o.safetensors")),
            ],
            &["nan.safetensors", "tensor 'w'", "NaN", "element 1"],
        );
    }
    // A bf16 input is checked as it is decoded (from a memory map): the same message.
    let inf = env.write(
        "inf.safetensors",
        &[
            ("w", DType::BF16, &[2, 2], &[1.0, 2.0, f32::NEG_INFINITY, 4.0]),
            ("b", DType::BF16, &[2], &[0.0, 0.0]),
        ],
    );
    refuses(
        &env,
        &[
            "merge",
            "--method",
            "slerp",
            "--base",
            &base,
            "--expert",
            &inf,
            "--out",
            s(&env.path("o.safetensors")),
        ],
        &["inf.safetensors", "tensor 'w'", "-inf", "element 2"],
    );
}

#[test]
fn stale_temporaries_of_a_killed_run_are_cleaned_up() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = env.path("o.safetensors");
    // A process id above Linux's largest (2^22) never runs.
    let stale = env.path(".o.safetensors.partial-4194304");
    std::fs::write(&stale, vec![0u8; 4096]).unwrap();
    let other = env.path(".elsewhere.safetensors.partial-4194304");
    std::fs::write(&other, b"not ours to clean").unwrap();
    env.ok(&[
        "merge",
        "--method",
        "ties",
        "--base",
        &base,
        "--expert",
        &e1,
        "--expert",
        &e2,
        "--out",
        s(&out),
    ]);
    assert!(out.is_file());
    assert!(!stale.exists(), "the stale partial of the same destination is removed");
    assert!(other.exists(), "partials of other destinations are left alone");
}

#[test]
fn repeated_and_unrepresentable_parameters_are_refused() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = env.path("o.safetensors");
    let merge = |params: &[&str], needles: &[&str]| {
        let mut a = vec![
            "merge",
            "--method",
            "task-arithmetic",
            "--base",
            &base,
            "--expert",
            &e1,
            "--expert",
            &e2,
        ];
        for p in params {
            a.extend(["--param", p]);
        }
        a.extend(["--out", s(&out)]);
        refuses(&env, &a, needles)
    };
    merge(
        &["lambda=0.3", "lambda=0.5"],
        &["--param lambda", "twice", "lambda=0.3", "lambda=0.5", "once"],
    );
    merge(&["lambda=1e39"], &["'lambda'", "1e39", "f32 range"]);
}

/// Reads notice an input that shrinks under them (another program rewriting it): its size is
/// checked before every range, before a memory map could die with SIGBUS.
#[test]
fn an_input_that_shrinks_while_open_is_an_error_naming_it() {
    let env = Env::new();
    let (_, e1, _) = three_models(&env);
    let c = mergescope_engine::checkpoint::Checkpoint::open(Path::new(&e1)).unwrap();
    let len = std::fs::metadata(&e1).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&e1)
        .unwrap()
        .set_len(len - 12)
        .unwrap();
    let e = c.read_f32(&c.tensors["w"]).unwrap_err().to_string();
    assert!(
        e.contains("e1.safetensors") && e.contains("changed while mergescope was reading it"),
        "{e}"
    );
}

#[test]
fn output_cut_short_by_the_reader_ends_quietly() {
    // `mergescope inspect … | head -1`: the reader goes away after one line; mergescope must end
    // like other command-line tools (killed by SIGPIPE, or exit 0), never with a panic message.
    let env = Env::new();
    let (base, _, _) = three_models(&env);
    let mut child = env
        .cmd()
        .args(["inspect", &base])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader closes before reading anything
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert!(
            out.status.success() || out.status.signal() == Some(13),
            "{:?}: {err}",
            out.status
        );
    }
}
