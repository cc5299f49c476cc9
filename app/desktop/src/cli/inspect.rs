//! `mergescope inspect PATH`: tensors, dtypes, shapes and header metadata.

use clap::Args;
use mergescope_engine::checkpoint::Checkpoint;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A .safetensors file or a folder of shards.
    pub path: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let c = Checkpoint::open(&args.path)?;
    let params: u64 = c.tensors.values().map(|t| t.numel() as u64).sum();
    let metadata = c.metadata();
    if args.json {
        let tensors: Vec<serde_json::Value> = c
            .tensors
            .values()
            .map(|t| serde_json::json!({"name": t.name, "dtype": t.dtype.name(), "shape": t.shape}))
            .collect();
        let j = serde_json::json!({
            "path": c.path,
            "files": c.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
            "bytes": c.total_bytes(),
            "parameters": params,
            "tensors": tensors,
            "metadata": metadata,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: {} tensors, {} parameters, {} file(s), {:.1} MB",
        c.path.display(),
        c.tensors.len(),
        params,
        c.files.len(),
        c.total_bytes() as f64 / 1e6
    );
    for t in c.tensors.values() {
        println!("  {:<60} {:<5} {:?}", t.name, t.dtype.name(), t.shape);
    }
    if !metadata.is_empty() {
        println!("metadata:");
        for (k, v) in &metadata {
            println!("  {k} = {v}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
