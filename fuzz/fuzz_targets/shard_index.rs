//! A shard folder whose `model.safetensors.index.json` is arbitrary bytes, beside two valid
//! shards: opening the folder gives a checkpoint or an error, never a panic or a file outside it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mergescope_engine::checkpoint::Checkpoint;

fn shard(tensor: &str) -> Vec<u8> {
    let header = format!(r#"{{"{tensor}":{{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}}}"#);
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(&[0u8; 16]);
    v
}

thread_local! {
    static DIR: tempfile::TempDir = {
        let d = tempfile::tempdir().expect("a temporary folder");
        std::fs::write(d.path().join("model-00001-of-00002.safetensors"), shard("a")).expect("shard 1");
        std::fs::write(d.path().join("model-00002-of-00002.safetensors"), shard("b")).expect("shard 2");
        d
    };
}

fuzz_target!(|data: &[u8]| {
    DIR.with(|d| {
        std::fs::write(d.path().join("model.safetensors.index.json"), data).expect("write the input");
        if let Ok(c) = Checkpoint::open(d.path()) {
            for t in c.tensors.values() {
                let _ = c.read_f32(t);
            }
        }
    });
});
