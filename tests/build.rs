//! Compiles `c/layout_probe.c` against the plugin C header into a static library that
//! `tests/abi_header_sync.rs` links (`#[link(name = "mergescope_layout_probe")]`).
//!
//! The probe is built as C11 with warnings as errors: its typed, positional initialisers turn a
//! field or function signature that differs between the header and the probe into a build
//! failure.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=c/layout_probe.c");
    println!("cargo:rerun-if-changed=../plugin-api/include/mergescope_plugin.h");

    let mut build = cc::Build::new();
    build
        .file("c/layout_probe.c")
        .include("../plugin-api/include")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        // Only the integration test that declares the library links it.
        .cargo_metadata(false);
    if !build.get_compiler().is_like_msvc() {
        build.flag("-std=c11");
    }
    build.try_compile("mergescope_layout_probe")?;
    println!("cargo:rustc-link-search=native={}", std::env::var("OUT_DIR")?);
    Ok(())
}
