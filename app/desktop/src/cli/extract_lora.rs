//! `mergescope extract-lora`: a PEFT LoRA adapter of a fine-tuned model over its base, by
//! truncated SVD of each layer matrix's task vector, with every other tensor that differs
//! (embeddings, output head, norms) saved whole as PEFT's modules_to_save
//! (mergekit-extract-lora's job).

use anyhow::Context as _;
use clap::Args;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_interop::lora;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
#[command(
    after_help = "As mergekit-extract-lora does: each layer matrix's difference from the base, truncated to \
rank r by SVD, becomes a LoRA pair; every other tensor that differs from the base (embeddings, output head, norms, \
biases) is saved whole in the adapter as PEFT's modules_to_save (listed in adapter_config.json), so that base + \
adapter gives the model back up to the rank truncation. Tensors equal to the base's are left out. adapter_config.json's r \
is the largest rank written (with --sv-epsilon, or matrices smaller than --rank, the others are in rank_pattern)."
)]
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
    /// LoRA for the input embeddings too (PEFT's lora_embedding_A/B) and a LoRA pair for the
    /// output head (lm_head), instead of saving them whole; when the vocabulary sizes differ
    /// they are saved whole anyway, with a note (as mergekit does).
    #[arg(long)]
    pub embed_lora: bool,
    /// Save this module whole (PEFT modules_to_save; no LoRA for it), e.g. lm_head or
    /// model.layers.0.input_layernorm; PEFT takes every module whose name ends with it.
    /// Repeatable.
    #[arg(long = "modules-to-save", visible_alias = "save-module", value_name = "MODULE")]
    pub modules_to_save: Vec<String>,
    /// Drop singular values at or below this (mergekit-extract-lora's --sv-epsilon): each
    /// matrix gets rank min(--rank, number of singular values above it), and a matrix with none
    /// above it is left out; 0 keeps every one up to --rank.
    #[arg(long, value_name = "EPSILON", default_value_t = 0.0, allow_negative_numbers = true)]
    pub sv_epsilon: f64,
    /// Extract only modules whose name this regular expression is found in (searched, as
    /// mergekit-extract-lora's --include-regex; e.g. 'self_attn'). Repeatable: any one matches.
    #[arg(long, value_name = "REGEX")]
    pub include_regex: Vec<String>,
    /// Leave out modules whose name this regular expression is found in: neither extracted nor
    /// saved whole (also the embeddings otherwise saved whole). Repeatable.
    #[arg(long, value_name = "REGEX")]
    pub exclude_regex: Vec<String>,
    /// Put each singular value wholly on lora_A instead of √σ on each of lora_A and lora_B
    /// (mergekit-extract-lora's --no-distribute-scale); the adapter's update is the same.
    #[arg(long)]
    pub no_distribute_scale: bool,
    /// Replace --out if it is an adapter folder.
    #[arg(long)]
    pub overwrite: bool,
}

fn listed(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
    format!("{}{}", shown.join(", "), if names.len() > 5 { ", ..." } else { "" })
}

pub fn run(args: &ExtractLoraArgs) -> anyhow::Result<ExitCode> {
    let base = Checkpoint::open(&args.base)?;
    let model = Checkpoint::open(&args.model)?;
    let started = std::time::Instant::now();
    let options = lora::ExtractOptions {
        rank: args.rank,
        embed_lora: args.embed_lora,
        modules_to_save: args.modules_to_save.clone(),
        sv_epsilon: args.sv_epsilon,
        include_regex: args.include_regex.clone(),
        exclude_regex: args.exclude_regex.clone(),
        keep_scale_on_a: args.no_distribute_scale,
        overwrite: args.overwrite,
    };
    let report = lora::extract_with(&base, &model, &args.out, &options)
        .with_context(|| format!("extracting a rank-{} adapter of '{}'", args.rank, args.model.display()))?;
    for note in &report.notes {
        eprintln!("note: {note}");
    }
    if !report.saved_in_full.is_empty() {
        eprintln!(
            "saved whole (modules_to_save {}): {} tensors: {}",
            listed(&report.modules_to_save),
            report.saved_in_full.len(),
            listed(&report.saved_in_full)
        );
    }
    if !report.left_out.is_empty() {
        eprintln!(
            "note: {} tensors differ from the base but belong to no module, which a PEFT adapter cannot hold, so \
             it leaves them out: {}",
            report.left_out.len(),
            listed(&report.left_out)
        );
    }
    eprintln!(
        "extracted rank-{} LoRA of {} matrices{} in {:.2} s -> {}",
        args.rank,
        report.adapted,
        if report.embedding_lora.is_empty() {
            String::new()
        } else {
            format!(" ({} embeddings)", report.embedding_lora.len())
        },
        started.elapsed().as_secs_f64(),
        report.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
