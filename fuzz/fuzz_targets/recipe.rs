//! A merge recipe of arbitrary bytes: loading it and turning it into a merge request gives a
//! result or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mergescope_interop::recipe::Recipe;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("a temporary folder");
}

fuzz_target!(|data: &[u8]| {
    DIR.with(|d| {
        let path = d.path().join("recipe.toml");
        std::fs::write(&path, data).expect("write the input");
        if let Ok(r) = Recipe::load(&path) {
            let _ = r.to_request(false);
            let _ = r.params_json();
        }
    });
});
