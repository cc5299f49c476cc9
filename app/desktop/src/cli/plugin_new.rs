//! `mergescope plugins new ID --rust|--c`: a plugin project that builds anywhere, offline.
//!
//! The templates are the workspace's own tested plugins (`weight-average` in Rust, `c-example`
//! in C) with the id and name replaced, and the SDK travels with the project (the Rust SDK's
//! sources, or the C header), so the new project depends on nothing but a compiler.

use anyhow::{Context as _, bail};
use std::path::{Path, PathBuf};

/// The Rust SDK's sources, as this build of mergescope has them (`plugin-api/`).
const SDK_FILES: &[(&str, &str)] = &[
    ("src/lib.rs", include_str!("../../../../plugin-api/src/lib.rs")),
    ("src/abi.rs", include_str!("../../../../plugin-api/src/abi.rs")),
    ("src/model.rs", include_str!("../../../../plugin-api/src/model.rs")),
    ("src/sdk/mod.rs", include_str!("../../../../plugin-api/src/sdk/mod.rs")),
    (
        "src/sdk/combine.rs",
        include_str!("../../../../plugin-api/src/sdk/combine.rs"),
    ),
    (
        "src/sdk/disjoint.rs",
        include_str!("../../../../plugin-api/src/sdk/disjoint.rs"),
    ),
    (
        "src/sdk/gram.rs",
        include_str!("../../../../plugin-api/src/sdk/gram.rs"),
    ),
    (
        "src/sdk/host.rs",
        include_str!("../../../../plugin-api/src/sdk/host.rs"),
    ),
    (
        "src/sdk/params.rs",
        include_str!("../../../../plugin-api/src/sdk/params.rs"),
    ),
    ("src/sdk/ram.rs", include_str!("../../../../plugin-api/src/sdk/ram.rs")),
    (
        "src/sdk/simd.rs",
        include_str!("../../../../plugin-api/src/sdk/simd.rs"),
    ),
    (
        "src/sdk/stats.rs",
        include_str!("../../../../plugin-api/src/sdk/stats.rs"),
    ),
    (
        "src/sdk/subspace.rs",
        include_str!("../../../../plugin-api/src/sdk/subspace.rs"),
    ),
    (
        "src/sdk/sums.rs",
        include_str!("../../../../plugin-api/src/sdk/sums.rs"),
    ),
    (
        "src/sdk/testing.rs",
        include_str!("../../../../plugin-api/src/sdk/testing.rs"),
    ),
];

const HEADER: &str = include_str!("../../../../plugin-api/include/mergescope_plugin.h");
const RUST_TEMPLATE: &str = include_str!("../../../../plugins/weight-average/src/lib.rs");
const C_TEMPLATE: &str = include_str!("../../../../plugins/c-example/src/plugin.c");

/// The language of a new plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// A Cargo crate with the Rust SDK beside it.
    Rust,
    /// One C file with the header beside it, and a Makefile.
    C,
}

/// Checks a method id: lowercase letters, digits and dashes, starting with a letter.
fn check_id(id: &str) -> anyhow::Result<()> {
    let ok = id.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !id.ends_with('-');
    if !ok {
        bail!(
            "'{id}' is not a method id: use lowercase letters, digits and dashes, starting with a letter \
             (e.g. my-method); it is what users type after --method"
        );
    }
    Ok(())
}

/// `my-method` → `My method`.
fn display_name(id: &str) -> String {
    let words = id.replace('-', " ");
    let mut chars = words.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

/// Replaces every `from` by `to` in `text`, failing when the template no longer holds `from`
/// (so a change to the template plugins cannot silently leave their id in new projects).
fn replace_required(text: &str, from: &str, to: &str, template: &str) -> anyhow::Result<String> {
    if !text.contains(from) {
        bail!("the {template} template no longer contains {from:?}; mergescope's plugins new needs updating");
    }
    Ok(text.replace(from, to))
}

/// The files of a new plugin `id` in `language`, as (relative path, contents).
pub fn project_files(id: &str, language: Language) -> anyhow::Result<Vec<(PathBuf, String)>> {
    check_id(id)?;
    let name = display_name(id);
    let lib = format!("mergescope_plugin_{}", id.replace('-', "_"));
    let version = env!("CARGO_PKG_VERSION");
    let mut files = Vec::new();
    match language {
        Language::Rust => {
            let mut src = replace_required(
                RUST_TEMPLATE,
                "id: \"weight-average\"",
                &format!("id: \"{id}\""),
                "Rust",
            )?;
            src = replace_required(&src, "name: \"Weight averaging\"", &format!("name: \"{name}\""), "Rust")?;
            src = replace_required(
                &src,
                "//! `weight-average`:",
                &format!("//! `{id}` (made by `mergescope plugins new`; as written, weighted averaging):"),
                "Rust",
            )?;
            src.push_str(&format!(
                r#"
#[cfg(test)]
mod tests {{
    use super::*;
    use mergescope_plugin_api::sdk::schema_json;

    /// The descriptor the host reads: the id users type, a help text, a schema that parses.
    #[test]
    fn the_descriptor_is_complete() {{
        let d = WeightAverage::descriptor();
        assert_eq!(d.id, "{id}");
        assert!(!d.help.is_empty() && !d.description.is_empty());
        let schema = schema_json(&d.params);
        assert!(schema.starts_with('[') && schema.contains("\"weights\""), "{{schema}}");
    }}
}}
"#
            ));
            files.push((PathBuf::from("src/lib.rs"), src));
            files.push((
                PathBuf::from("Cargo.toml"),
                format!(
                    r#"[package]
name = "{lib_dash}"
description = "{name}: a mergescope merge method."
version = "0.1.0"
edition = "2024"

# Its own workspace, wherever it lies.
[workspace]

[lib]
name = "{lib}"
crate-type = ["cdylib", "rlib"]

[dependencies]
# The SDK of mergescope {version}, copied here so that the project builds offline.
mergescope-plugin-api = {{ path = "mergescope-plugin-api" }}
"#,
                    lib_dash = lib.replace('_', "-"),
                ),
            ));
            files.push((
                PathBuf::from("mergescope-plugin-api/Cargo.toml"),
                format!(
                    "[package]\nname = \"mergescope-plugin-api\"\ndescription = \"The C ABI of mergescope plugins and its Rust SDK (copied from mergescope {version}).\"\nversion = \"{version}\"\nedition = \"2024\"\n\n[dependencies]\n"
                ),
            ));
            for (path, text) in SDK_FILES {
                files.push((Path::new("mergescope-plugin-api").join(path), (*text).to_owned()));
            }
            files.push((
                PathBuf::from("README.md"),
                format!(
                    r#"# {name} (`{id}`)

A mergescope merge method, made by `mergescope plugins new {id} --rust`. As written it is
weighted averaging (the `weight-average` plugin under your id): change `merge_tensor` in
`src/lib.rs`. The SDK (`mergescope-plugin-api/`, from mergescope {version}) is copied here, so
nothing is downloaded.

```sh
cargo test                                   # the descriptor test
cargo build --release                        # target/release/lib{lib}.so
mergescope plugins approve --folder target/release   # once: trust your build folder
mergescope --plugin-dir target/release plugins show {id}
mergescope --plugin-dir target/release merge --method {id} --expert a.safetensors --expert b.safetensors --out merged.safetensors
```

The SDK's guide: `plugin-api/README.md` in mergescope's repository.
"#
                ),
            ));
        }
        Language::C => {
            let mut src = replace_required(
                C_TEMPLATE,
                "#define ID \"c-example\"",
                &format!("#define ID \"{id}\""),
                "C",
            )?;
            src = replace_required(
                &src,
                "MS_STR_LIT(\"Weight averaging (C example)\")",
                &format!("MS_STR_LIT(\"{name}\")"),
                "C",
            )?;
            src = replace_required(
                &src,
                " * c-example: weight averaging written in plain C",
                &format!(" * {id} (made by `mergescope plugins new`; as written, weight averaging) in plain C"),
                "C",
            )?;
            let file = format!("{}.c", id.replace('-', "_"));
            files.push((PathBuf::from(&file), src));
            files.push((PathBuf::from("mergescope_plugin.h"), HEADER.to_owned()));
            let so = format!("lib{lib}.so");
            files.push((
                PathBuf::from("Makefile"),
                format!(
                    "# Builds {so} (on macOS name it .dylib; on Windows use cl /LD).\nCC ?= cc\nCFLAGS ?= -O2 -Wall -Wextra -std=c99\n\n{so}: {file} mergescope_plugin.h\n\t$(CC) $(CFLAGS) -shared -fPIC -fvisibility=hidden -I . {file} -o {so} -lm\n\nclean:\n\trm -f {so}\n"
                ),
            ));
            files.push((
                PathBuf::from("README.md"),
                format!(
                    r#"# {name} (`{id}`)

A mergescope merge method in C, made by `mergescope plugins new {id} --c`. As written it is
weight averaging (mergescope's `c-example` under your id): change `merge_tensor` in `{file}`.
`mergescope_plugin.h` (from mergescope {version}) is the whole ABI.

```sh
make                                         # {so}
mergescope plugins approve --folder .        # once: trust this folder
mergescope --plugin-dir . plugins show {id}
mergescope --plugin-dir . merge --method {id} --expert a.safetensors --expert b.safetensors --out merged.safetensors
```
"#
                ),
            ));
        }
    }
    Ok(files)
}

/// Writes the project of `id` into `dir` (which must not exist yet, or be empty) and returns
/// the files written.
pub fn create(id: &str, language: Language, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let files = project_files(id, language)?;
    if dir.exists() && std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!(
            "'{}' already exists and is not empty; nothing was written. Choose another --dir or remove it",
            dir.display()
        );
    }
    let mut written = Vec::with_capacity(files.len());
    for (rel, text) in files {
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create '{}'", parent.display()))?;
        }
        mergescope_engine::writer::write_atomic(&path, text.as_bytes())
            .with_context(|| format!("cannot write '{}'", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of the SDK travels with a new Rust plugin: a file added to plugin-api/src
    /// without a line in SDK_FILES fails here.
    #[test]
    fn the_copied_sdk_is_the_whole_sdk() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugin-api");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.join("src")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    on_disk.push(p.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/"));
                }
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = SDK_FILES.iter().map(|(p, _)| (*p).to_owned()).collect();
        listed.sort();
        assert_eq!(listed, on_disk);
    }

    #[test]
    fn ids_are_checked_and_names_derived() {
        assert!(check_id("my-method2").is_ok());
        for bad in ["My-method", "2x", "my_method", "a-", ""] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
        assert_eq!(display_name("my-method"), "My method");
        let files = project_files("my-method", Language::Rust).unwrap();
        let lib = &files.iter().find(|(p, _)| p == Path::new("src/lib.rs")).unwrap().1;
        assert!(lib.contains("id: \"my-method\"") && lib.contains("name: \"My method\""));
        assert!(!lib.contains("\"weight-average\""));
        let files = project_files("my-method", Language::C).unwrap();
        let c = &files.iter().find(|(p, _)| p == Path::new("my_method.c")).unwrap().1;
        assert!(c.contains("#define ID \"my-method\"") && !c.contains("\"c-example\""));
    }
}
