//! `c-example`: a mergescope merge method written in plain C (`src/plugin.c`), built against
//! `plugin-api/include/mergescope_plugin.h` only: weight averaging,
//! θ = Σ_t w_t θ_t / Σ_t w_t, with the same parameter (`weights`, per task, default 1.0) and
//! the same numbers as the Rust `weight-average` plugin.
//!
//! This Rust crate holds no code. Its build script compiles the C file with the C compiler the
//! `cc` crate finds, as a shared library (`-shared -fPIC -fvisibility=hidden`), and copies
//! `libmergescope_plugin_c_example.so` (`.dylib` on macOS) into `target/<profile>/` and
//! `target/<profile>/deps/`, where the app and the tests find plugins. To build it by hand:
//!
//! ```sh
//! cc -shared -fPIC -fvisibility=hidden -I plugin-api/include \
//!    plugins/c-example/src/plugin.c -o libmergescope_plugin_c_example.so
//! ```
