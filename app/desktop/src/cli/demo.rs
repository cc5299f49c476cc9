//! `mergescope demo`: build and list the demo benchmark (base, heads, experts) in the cache.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use mergescope_engine::device::Device;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::{
    Benchmark, BuildProgress, BuildRecipe, build, build_replacing, demo_dir, demos_in_cache, outdated_reason,
};
use mergescope_lab::nn::Arch;
use std::path::PathBuf;
use std::process::ExitCode;

#[path = "demo_text.rs"]
mod text;

#[derive(Subcommand, Debug)]
pub enum DemoCommand {
    /// Build base, heads and one expert per task (cached: later runs reuse the build).
    Build(Box<BuildArgs>),
    /// List the built demo benchmarks with their per-task accuracies.
    List,
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// Which benchmark: `image` (the seven 28×28 tasks on a small backbone trained here) or
    /// `text` (five text tasks on a pretrained all-MiniLM-L6-v2; needs --backbone).
    #[arg(long, default_value = "image", value_parser = ["image", "text"])]
    pub benchmark: String,
    /// The text benchmark's pretrained backbone: a Hugging Face BERT folder
    /// (scripts/fetch-minilm.sh puts all-MiniLM-L6-v2 in ~/.cache/mergescope/all-minilm-l6-v2).
    #[arg(long, value_name = "DIR")]
    pub backbone: Option<PathBuf>,
    #[command(flatten)]
    pub text: text::TextArgs,
    /// Backbone architecture: mlp, cnn, vit, or all.
    #[arg(long, default_value = "cnn")]
    pub arch: String,
    /// Seed of every random choice of the build.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Build on the task files of this folder instead of the seven demo tasks (plus the
    /// user's task folder).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Build into this folder instead of the cache.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Rebuild even if the benchmark is already built (the old one is replaced only once the
    /// new one is complete).
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Device to train on: cpu, cuda or metal (falls back to the CPU with a warning when the
    /// build or the machine lacks it). A GPU build sums in the GPU's order, so its numbers differ
    /// from a CPU build's in the last bits; its manifest records `kernel_path` `cuda` or `metal`.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
}

pub fn run(command: DemoCommand) -> anyhow::Result<ExitCode> {
    match command {
        DemoCommand::Build(args) => run_build(&args),
        DemoCommand::List => {
            let built = demos_in_cache()?;
            if built.is_empty() {
                println!("no demo benchmark built yet: run `mergescope demo build`");
            }
            for b in &built {
                match outdated_reason(b) {
                    None => print_benchmark(b),
                    Some(why) => println!("outdated: {why}"),
                }
            }
            text::list_text_builds()?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn archs(s: &str) -> anyhow::Result<Vec<Arch>> {
    if s == "all" {
        return Ok(Arch::ALL.to_vec());
    }
    Ok(vec![
        Arch::parse(s).with_context(|| format!("--arch '{s}': use mlp, cnn, vit or all"))?,
    ])
}

fn run_build(args: &BuildArgs) -> anyhow::Result<ExitCode> {
    let device = super::open_device_named(&args.device)?;
    if args.benchmark == "text" {
        return text::run_text_build(args, &device);
    }
    if args.backbone.is_some() || args.text.is_set() {
        anyhow::bail!(
            "--backbone and the --text-* and --lora-* options are for the text benchmark: add --benchmark text"
        );
    }
    let archs = archs(&args.arch)?;
    if args.out.is_some() && archs.len() > 1 {
        anyhow::bail!("--out takes one architecture; pass --arch mlp, cnn or vit");
    }
    let tasks = benchmark_tasks(args.data.as_deref())?;
    let cancel = super::cancel_on_ctrl_c();
    for arch in archs {
        let dir = match &args.out {
            Some(d) => d.clone(),
            None => demo_dir(arch, args.seed)?,
        };
        if let Ok(b) = Benchmark::open(&dir)
            && b.is_current()
            && !args.force
        {
            eprintln!("{arch}: already built in '{}' (--force rebuilds it)", dir.display());
            print_benchmark(&b);
            continue;
        }
        if dir.exists() && args.out.is_some() && !args.force && Benchmark::open(&dir).is_err() {
            anyhow::bail!(
                "'{}' exists and is not a benchmark; choose another --out (nothing was written)",
                dir.display()
            );
        }
        let b = build_with_bar(arch, args.seed, &dir, &tasks, &device, args.quiet, cancel)?;
        print_benchmark(&b);
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the demo benchmark of `arch` and `seed` into `dir` with a progress bar; an old build
/// there is replaced only once the new one is complete.
pub fn build_with_bar(
    arch: Arch,
    seed: u64,
    dir: &std::path::Path,
    tasks: &[mergescope_lab::data::TaskData],
    device: &Device,
    quiet: bool,
    cancel: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<Benchmark> {
    let bar = super::progress_bar(quiet);
    let recipe = BuildRecipe::default_for(arch, seed);
    let mut on_progress = |p: &BuildProgress| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        let loss = p.loss.map(|l| format!(" loss {l:.3}")).unwrap_or_default();
        bar.set_message(format!("{arch}: {}{loss}", p.stage));
    };
    let built = build_replacing(dir, |staging| {
        build(arch, tasks, &recipe, staging, device, &mut on_progress, cancel)
    });
    bar.finish_and_clear();
    let b = built?;
    let secs: f64 = b.manifest.seconds.values().sum();
    eprintln!("{arch}: built in {secs:.0} s");
    Ok(b)
}

fn print_benchmark(b: &Benchmark) {
    let m = &b.manifest;
    println!(
        "\n{} backbone ({} parameters), seed {}: {}",
        m.arch,
        m.arch.num_params(),
        m.seed,
        b.dir.display()
    );
    println!("  {:<16} {:>8} {:>8}", "task", "base", "expert");
    for t in &m.tasks {
        println!(
            "  {:<16} {:>7.1}% {:>7.1}%",
            t.name,
            100.0 * t.base_accuracy.test,
            100.0 * t.expert_accuracy.test
        );
    }
    let n = m.tasks.len().max(1) as f64;
    println!(
        "  {:<16} {:>7.1}% {:>7.1}%",
        "mean",
        100.0 * m.tasks.iter().map(|t| t.base_accuracy.test).sum::<f64>() / n,
        100.0 * m.tasks.iter().map(|t| t.expert_accuracy.test).sum::<f64>() / n
    );
    println!(
        "  merge them: mergescope merge --method task-arithmetic --benchmark {} --out merged.safetensors --eval",
        b.dir.display()
    );
}
