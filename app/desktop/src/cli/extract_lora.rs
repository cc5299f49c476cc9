//! `mergescope extract-lora`: a PEFT LoRA adapter of a fine-tuned model over its base, by
//! truncated SVD of each layer matrix's task vector (mergekit-extract-lora's job).

use anyhow::Context as _;
use clap::Args;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::lora;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ExtractLoraArgs {
    /// The base model (checkpoint file or Hugging Face folder).
    #[arg(long)]
    pub base: PathBuf,
    /// The fine-tuned model whose difference from the base becomes the adapter.
    #[arg(long)]
    pub model: PathBuf,
    /// LoRA rank r (smaller matrices keep their full rank; alpha = r, so the scale is 1).
    #[arg(long)]
    pub rank: usize,
    /// Output folder (adapter_config.json + adapter_model.safetensors, as PEFT saves them).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it is an adapter folder.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(args: &ExtractLoraArgs) -> anyhow::Result<ExitCode> {
    let base = Checkpoint::open(&args.base)?;
    let model = Checkpoint::open(&args.model)?;
    let started = std::time::Instant::now();
    let report = lora::extract(&base, &model, args.rank, &args.out, args.overwrite)
        .with_context(|| format!("extracting a rank-{} adapter of '{}'", args.rank, args.model.display()))?;
    if !report.left_out.is_empty() {
        let shown: Vec<&str> = report.left_out.iter().take(5).map(String::as_str).collect();
        eprintln!(
            "note: {} tensors differ from the base but are not layer matrices, so the adapter leaves them out: {}{}",
            report.left_out.len(),
            shown.join(", "),
            if report.left_out.len() > 5 { ", ..." } else { "" }
        );
    }
    eprintln!(
        "extracted rank-{} LoRA of {} matrices in {:.2} s -> {}",
        args.rank,
        report.adapted,
        started.elapsed().as_secs_f64(),
        report.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
