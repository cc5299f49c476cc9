//! A safetensors file of arbitrary bytes: opening it and reading every tensor it claims gives a
//! result or an error, never a panic, a hang or an allocation beyond the file's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mergescope_engine::checkpoint::Checkpoint;

thread_local! {
    static DIR: tempfile::TempDir = tempfile::tempdir().expect("a temporary folder");
}

fuzz_target!(|data: &[u8]| {
    DIR.with(|d| {
        let path = d.path().join("f.safetensors");
        std::fs::write(&path, data).expect("write the input");
        if let Ok(c) = Checkpoint::open(&path) {
            for t in c.tensors.values() {
                let _ = c.read_f32(t);
            }
            let _ = c.metadata();
        }
    });
});
