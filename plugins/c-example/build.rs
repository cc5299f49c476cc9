//! Compiles `src/plugin.c` into a real shared library, `libmergescope_plugin_c_example.so`
//! (`.dylib` on macOS, `mergescope_plugin_c_example.dll` on Windows), with the C compiler the
//! `cc` crate picks for the target, and copies it next to the Rust plugins: into
//! `target/<profile>/` and `target/<profile>/deps/`.

use std::env;
use std::error::Error;
use std::fs;
use std::path::PathBuf;

const LIB: &str = "mergescope_plugin_c_example";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let source = manifest_dir.join("src").join("plugin.c");
    let include = manifest_dir.join("..").join("..").join("plugin-api").join("include");
    let header = include.join("mergescope_plugin.h");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", header.display());

    let target = env::var("TARGET")?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // OUT_DIR is target/<profile>/build/<package>-<hash>/out.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .ok_or_else(|| format!("cannot derive the profile directory from OUT_DIR {}", out_dir.display()))?
        .to_path_buf();

    let file_name = if target.contains("windows") {
        format!("{LIB}.dll")
    } else if target.contains("apple") {
        format!("lib{LIB}.dylib")
    } else {
        format!("lib{LIB}.so")
    };
    let built = out_dir.join(&file_name);

    let compiler = cc::Build::new().warnings(true).extra_warnings(true).get_compiler();
    let mut cmd = compiler.to_command();
    if compiler.is_like_msvc() {
        cmd.arg("/LD")
            .arg(format!("/I{}", include.display()))
            .arg(&source)
            .arg(format!("/Fe{}", built.display()));
        // Keep the object file out of the source tree.
        cmd.arg(format!("/Fo{}\\", out_dir.display()));
    } else {
        cmd.args(["-shared", "-fPIC", "-fvisibility=hidden"]);
        cmd.arg("-I").arg(&include).arg(&source).arg("-o").arg(&built);
        if !target.contains("apple") && !target.contains("windows") {
            cmd.arg("-lm");
        }
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run the C compiler {:?}: {e}", compiler.path()))?;
    // Show the compiler's diagnostics as cargo warnings (a build script's own stderr is hidden).
    for line in String::from_utf8_lossy(&output.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&output.stdout).lines())
    {
        println!("cargo:warning={line}");
    }
    if !output.status.success() {
        return Err(format!("compiling {} failed ({}): {cmd:?}", source.display(), output.status).into());
    }

    for dir in [profile_dir.clone(), profile_dir.join("deps")] {
        fs::create_dir_all(&dir)?;
        // Copy to a temporary name and rename, so a reader never sees a half-written library.
        let tmp = dir.join(format!(".{file_name}.tmp"));
        fs::copy(&built, &tmp)?;
        fs::rename(&tmp, dir.join(&file_name))?;
    }
    Ok(())
}
