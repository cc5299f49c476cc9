//! One test per malformed input a user can hand mergescope: broken safetensors files, wrong
//! places, mismatched experts, bad method names and parameters, broken recipes, and outputs it
//! must not write. docs/reliability.md lists every case with the message it gives.

use super::refuses;
use crate::common::*;
use mergescope_engine::dtype::DType;
use std::path::{Path, PathBuf};

/// A safetensors file: 8-byte little-endian header length `len`, then `header`, then `data`.
fn raw(len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v.extend_from_slice(data);
    v
}

/// A file whose header is `header` (its true length) and data 16 bytes of f32.
fn with_header(header: &str) -> Vec<u8> {
    let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    raw(header.len() as u64, header.as_bytes(), &data)
}

const W: &str = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;

/// `inspect` and a merge taking the file as an expert both refuse `bytes`, naming the file and
/// the fault (`needles`), and leave every file as it was.
fn refuse_file(name: &str, bytes: &[u8], needles: &[&str]) {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let p = env.path(&format!("{name}.safetensors"));
    std::fs::write(&p, bytes).unwrap();
    let mut n = vec![name];
    n.extend_from_slice(needles);
    refuses(&env, &["inspect", s(&p)], &n);
    refuses(&env, &merge_args(&base, &[&e1, s(&p)], &env.path("o.safetensors")), &n);
}

fn merge_args<'a>(base: &'a str, experts: &[&'a str], out: &'a Path) -> Vec<&'a str> {
    let mut a = vec!["merge", "--method", "task-arithmetic", "--base", base];
    for e in experts {
        a.extend(["--expert", e]);
    }
    a.extend(["--out", s(out)]);
    a
}

#[test]
fn an_empty_file() {
    refuse_file("empty", b"", &["8-byte header length"]);
}

#[test]
fn a_file_cut_short_in_its_data() {
    let full = with_header(W);
    refuse_file(
        "truncated",
        &full[..full.len() - 5],
        &["tensor 'w'", "outside the 11 data bytes", "truncated"],
    );
}

#[test]
fn a_header_length_of_zero() {
    refuse_file(
        "zero-header",
        &raw(0, b"", &[0u8; 16]),
        &["header length is 0", "not safetensors"],
    );
}

#[test]
fn a_header_longer_than_the_file() {
    refuse_file(
        "long-header",
        &raw(1000, W.as_bytes(), &[]),
        &["header claims 1000 bytes", "file has only 65", "truncated"],
    );
}

#[test]
fn a_header_length_of_two_to_the_63() {
    refuse_file(
        "huge-header",
        &raw(1 << 63, W.as_bytes(), &[]),
        &["claims 9223372036854775808 bytes", "limit"],
    );
}

#[test]
fn a_header_that_is_not_utf8() {
    refuse_file(
        "latin1",
        &raw(4, &[0xff, 0xfe, 0xfd, 0xfc], &[]),
        &["not UTF-8", "offset 8"],
    );
}

#[test]
fn a_header_that_is_not_json() {
    refuse_file(
        "not-json",
        &with_header("hello, world"),
        &["JSON header is corrupt", "line 1 column 1"],
    );
}

#[test]
fn a_header_with_fields_of_the_wrong_type() {
    refuse_file(
        "wrong-types",
        &with_header(r#"{"w":{"dtype":"F32","shape":"2x2","data_offsets":[0,16]}}"#),
        &["tensor 'w'", "\"2x2\"", "expected a sequence"],
    );
}

#[test]
fn data_offsets_beyond_the_data() {
    refuse_file(
        "beyond",
        &with_header(r#"{"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}"#),
        &["tensor 'w'", "64"],
    );
}

#[test]
fn data_offsets_that_do_not_match_shape_and_dtype() {
    refuse_file(
        "mismatch",
        &with_header(
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]},"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
        ),
        &["tensor 'w'", "16 bytes"],
    );
}

#[test]
fn an_unknown_dtype() {
    refuse_file(
        "dtype",
        &with_header(r#"{"w":{"dtype":"F31","shape":[2,2],"data_offsets":[0,16]}}"#),
        &["tensor 'w'", "F31"],
    );
}

#[test]
fn a_folder_with_no_checkpoint_in_it() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let dir = env.path("empty-folder");
    std::fs::create_dir(&dir).unwrap();
    refuses(
        &env,
        &merge_args(&base, &[&e1, s(&dir)], &env.path("o.safetensors")),
        &["empty-folder", "folder without .safetensors files"],
    );
}

#[test]
fn a_symlink_loop() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let (a, b) = (env.path("a.safetensors"), env.path("b.safetensors"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    refuses(
        &env,
        &merge_args(&base, &[&e1, s(&a)], &env.path("o.safetensors")),
        &["a.safetensors"],
    );
}

#[test]
fn a_shard_index_naming_a_missing_shard() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let dir = env.path("sharded");
    write_checkpoint(
        &dir,
        &[
            ("w", DType::F32, &[2, 2], &[2.0, 2.0, 3.0, 5.0]),
            ("b", DType::F32, &[2], &[1.0, 0.0]),
        ],
        Some(8),
    );
    let shard = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("of-00002.safetensors"))
        .unwrap();
    let name = shard.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::remove_file(&shard).unwrap();
    refuses(
        &env,
        &merge_args(&base, &[&e1, s(&dir)], &env.path("o.safetensors")),
        &["model.safetensors.index.json", &name],
    );
}

/// Base and one good expert, then `bad` as a second expert.
fn refuse_expert(bad: &[(&str, DType, &[usize], &[f32])], needles: &[&str]) {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let bad = env.write("bad.safetensors", bad);
    let mut n = vec!["bad.safetensors"];
    n.extend_from_slice(needles);
    refuses(&env, &merge_args(&base, &[&e1, &bad], &env.path("o.safetensors")), &n);
}

#[test]
fn an_expert_without_a_tensor_of_the_base() {
    refuse_expert(
        &[("w", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0])],
        &["'b'", "--on-missing"],
    );
}

#[test]
fn an_expert_with_a_tensor_the_base_lacks() {
    refuse_expert(
        &[
            ("w", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]),
            ("b", DType::F32, &[2], &[0.0, 0.0]),
            ("extra", DType::F32, &[2], &[0.0, 0.0]),
        ],
        &["'extra'"],
    );
}

#[test]
fn an_expert_with_a_tensor_of_another_shape() {
    refuse_expert(
        &[
            ("w", DType::F32, &[4], &[1.0, 2.0, 3.0, 4.0]),
            ("b", DType::F32, &[2], &[0.0, 0.0]),
        ],
        &["'w'", "[4]", "[2, 2]"],
    );
}

#[test]
fn an_expert_with_an_integer_tensor_where_the_base_has_floats() {
    refuse_expert(
        &[
            ("w", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]),
            ("b", DType::Other { size: 4, code: 1 }, &[2], &[0.0, 0.0]),
        ],
        &["'b'", "I32"],
    );
}

/// Three models and the output path `out` a merge of them must refuse to write.
fn refuse_output(out: impl Fn(&Env, &str) -> PathBuf, needles: &[&str]) {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = out(&env, &e1);
    refuses(&env, &merge_args(&base, &[&e1, &e2], &out), needles);
}

#[test]
fn an_output_that_is_one_of_the_inputs() {
    refuse_output(|_, e1| PathBuf::from(e1), &["e1.safetensors", "input"]);
}

#[test]
fn an_output_that_already_exists() {
    refuse_output(
        |env, _| {
            let p = env.path("old.safetensors");
            std::fs::write(&p, b"a result from yesterday").unwrap();
            p
        },
        &["old.safetensors", "--overwrite"],
    );
}

#[test]
fn an_output_inside_a_sharded_input_folder() {
    let env = Env::new();
    let (base, e1, _) = three_models(&env);
    let dir = env.path("sharded");
    write_checkpoint(
        &dir,
        &[
            ("w", DType::F32, &[2, 2], &[2.0, 2.0, 3.0, 5.0]),
            ("b", DType::F32, &[2], &[1.0, 0.0]),
        ],
        Some(8),
    );
    refuses(
        &env,
        &merge_args(&base, &[&e1, s(&dir)], &dir.join("merged.safetensors")),
        &["sharded", "input"],
    );
}

/// A merge of the three models with `method` and `params` refuses with `needles`.
fn refuse_method(method: &str, params: &[&str], needles: &[&str]) {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let out = env.path("o.safetensors");
    let mut a = merge_args(&base, &[&e1, &e2], &out);
    a[2] = method;
    for p in params {
        a.extend(["--param", p]);
    }
    refuses(&env, &a, needles);
}

#[test]
fn an_unknown_method_gets_a_suggestion() {
    refuse_method("tie", &[], &["'tie'", "ties"]);
}

#[test]
fn a_misspelt_parameter_gets_a_suggestion() {
    refuse_method("task-arithmetic", &["lamda=0.3"], &["'lamda'", "lambda"]);
}

#[test]
fn a_parameter_out_of_its_range() {
    refuse_method("ties", &["density=1.5"], &["'density'", "1.5"]);
}

#[test]
fn a_parameter_of_the_wrong_type() {
    refuse_method("task-arithmetic", &["lambda=half"], &["'lambda'", "half"]);
}

#[test]
fn a_recipe_that_is_not_toml() {
    let env = Env::new();
    let recipe = env.path("recipe.toml");
    std::fs::write(&recipe, "method = \"ties\"\n[params\ndensity = 0.2\n").unwrap();
    refuses(&env, &["merge", s(&recipe)], &["recipe.toml", "line 2"]);
}

#[test]
fn a_recipe_with_an_unknown_key() {
    let env = Env::new();
    let (base, e1, e2) = three_models(&env);
    let recipe = env.path("recipe.toml");
    std::fs::write(
        &recipe,
        format!("method = \"ties\"\nbase = \"{base}\"\nexperts = [\"{e1}\", \"{e2}\"]\nouptut = \"o.safetensors\"\n"),
    )
    .unwrap();
    refuses(&env, &["merge", s(&recipe)], &["recipe.toml", "ouptut"]);
}

/// A checkpoint the user may not read. As root every file is readable, so where the test runs
/// as root it runs mergescope as the user `nobody` (`setpriv`); where neither is possible it says
/// so and checks nothing.
#[test]
fn a_file_without_read_permission() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let (_, e1, _) = three_models(&env);
    let secret = env.path("secret.safetensors");
    std::fs::copy(&e1, &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let root = std::process::Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    if !root {
        refuses(
            &env,
            &["inspect", s(&secret)],
            &["secret.safetensors", "Permission denied"],
        );
        return;
    }
    let has_setpriv = std::process::Command::new("setpriv").arg("--version").output().is_ok();
    if !has_setpriv {
        eprintln!("skipped: running as root without setpriv, so no user lacks read permission");
        return;
    }
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_mergescope"))
        .args(["inspect", s(&secret)])
        .env("MERGESCOPE_CONFIG_DIR", env.path("config"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("secret.safetensors") && err.contains("Permission denied") && !err.contains("panicked"),
        "{err}"
    );
}
