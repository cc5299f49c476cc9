//! `mergescope demo build --benchmark text --backbone DIR`: the text benchmark on a pretrained
//! BERT-family backbone (mergescope_lab::text_bench), built into the cache or --out.

use super::BuildArgs;
use anyhow::Context as _;
use clap::Args;
use mergescope_lab::demo::BuildProgress;
use mergescope_lab::text_bench::lora::{LORA_TARGETS, TEXT_LORA_LR};
use mergescope_lab::text_bench::{FineTuning, LoraRecipe, TextBenchmark, TextBuildPlan, TextBuildRequest, TextRecipe};

/// Options of the text benchmark's recipe (defaults: `TextRecipe::default_for`).
#[derive(Args, Debug, Default)]
pub struct TextArgs {
    /// Text benchmark: fine-tuning steps per expert.
    #[arg(long, value_name = "N")]
    pub text_steps: Option<usize>,
    /// Text benchmark: peak learning rate of the experts.
    #[arg(long, value_name = "LR")]
    pub text_lr: Option<f64>,
    /// Text benchmark: examples per fine-tuning step.
    #[arg(long, value_name = "N")]
    pub text_batch: Option<usize>,
    /// Text benchmark: tokens kept per example (at most 128).
    #[arg(long, value_name = "N")]
    pub text_max_length: Option<usize>,
    /// Text benchmark: train each linear probe on this many examples per class, or `all` for
    /// the whole train split (default: 10).
    #[arg(long, value_name = "N|all")]
    pub text_head_shots: Option<String>,
    /// Text benchmark: keep at most N train examples per task (a quick, reduced build).
    #[arg(long, value_name = "N")]
    pub text_max_train: Option<usize>,
    /// Text benchmark: keep at most N calibration and N test examples per task.
    #[arg(long, value_name = "N")]
    pub text_max_eval: Option<usize>,
    /// Text benchmark: only these tasks (comma-separated).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub text_tasks: Vec<String>,
    /// Text benchmark: fine-tune the experts with LoRA of rank R (only the factors train; the
    /// experts are written merged, with PEFT adapters in adapters/) instead of fully; the peak
    /// learning rate is then 1e-3 unless --text-lr says otherwise.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// Text benchmark, with --lora-rank: LoRA's alpha (updates scaled by alpha / R; default 2R).
    #[arg(long, value_name = "ALPHA")]
    pub lora_alpha: Option<f64>,
    /// Text benchmark, with --lora-rank: the weights to adapt in each layer (comma-separated;
    /// default: attention.self.query, attention.self.key, attention.self.value,
    /// attention.output.dense, intermediate.dense, output.dense).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub lora_targets: Vec<String>,
}

impl TextArgs {
    /// Whether any text option was given.
    pub fn is_set(&self) -> bool {
        self.text_steps.is_some()
            || self.text_lr.is_some()
            || self.text_batch.is_some()
            || self.text_max_length.is_some()
            || self.text_head_shots.is_some()
            || self.text_max_train.is_some()
            || self.text_max_eval.is_some()
            || !self.text_tasks.is_empty()
            || self.lora_rank.is_some()
            || self.lora_alpha.is_some()
            || !self.lora_targets.is_empty()
    }

    fn recipe(&self, seed: u64) -> anyhow::Result<TextRecipe> {
        let mut r = TextRecipe::default_for(seed);
        if let Some(n) = self.text_steps {
            r.expert_steps = n;
            r.warmup_steps = r.warmup_steps.min(n / 10);
        }
        if let Some(lr) = self.text_lr {
            r.lr = lr;
        }
        if let Some(b) = self.text_batch {
            r.batch_size = b;
        }
        if let Some(n) = self.text_max_length {
            r.max_length = n;
        }
        match self.text_head_shots.as_deref() {
            None => {}
            Some("all") => r.head_shots = None,
            Some(n) => {
                r.head_shots = Some(n.parse().ok().filter(|n| *n > 0).with_context(|| {
                    format!("--text-head-shots '{n}': give a number of examples per class (1 or more) or `all`")
                })?)
            }
        }
        r.max_train = self.text_max_train.or(r.max_train);
        r.max_eval = self.text_max_eval.or(r.max_eval);
        match self.lora_rank {
            None if self.lora_alpha.is_some() || !self.lora_targets.is_empty() => {
                anyhow::bail!("--lora-alpha and --lora-targets set up LoRA: add --lora-rank R (8 is usual)")
            }
            None => {}
            Some(rank) => {
                if rank == 0 {
                    anyhow::bail!(
                        "--lora-rank 0: give a LoRA rank of 1 or more (8 is usual), or leave --lora-rank out for full fine-tuning"
                    );
                }
                let mut lora = LoraRecipe::new(rank);
                if let Some(alpha) = self.lora_alpha {
                    if !(alpha.is_finite() && alpha > 0.0) {
                        anyhow::bail!(
                            "--lora-alpha {alpha}: give a positive number (the updates are scaled by alpha / rank; default 2 × rank)"
                        );
                    }
                    lora.alpha = alpha;
                }
                if !self.lora_targets.is_empty() {
                    if let Some(bad) = self.lora_targets.iter().find(|t| !LORA_TARGETS.contains(&t.as_str())) {
                        anyhow::bail!(
                            "--lora-targets: unknown weight '{bad}'; name some of {}",
                            LORA_TARGETS.join(", ")
                        );
                    }
                    lora.targets = self.lora_targets.clone();
                }
                r.fine_tuning = FineTuning::Lora(lora);
                if self.text_lr.is_none() {
                    r.lr = TEXT_LORA_LR;
                }
            }
        }
        Ok(r)
    }
}

pub fn run_text_build(
    args: &BuildArgs,
    device: &mergescope_engine::device::Device,
) -> anyhow::Result<std::process::ExitCode> {
    let backbone = args.backbone.as_deref().context(
        "--benchmark text needs --backbone DIR: the all-MiniLM-L6-v2 folder (run scripts/fetch-minilm.sh, then pass --backbone ~/.cache/mergescope/all-minilm-l6-v2)",
    )?;
    if args.arch != "cnn" || args.data.is_some() {
        anyhow::bail!("--arch and --data are for the image benchmark; the text benchmark takes --backbone");
    }
    let mut request = TextBuildRequest::new(backbone, args.seed);
    request.recipe = args.text.recipe(args.seed)?;
    request.tasks = args.text.text_tasks.clone();
    request.out = args.out.clone();
    request.force = args.force;
    let build = match request.plan()? {
        TextBuildPlan::Built(b) => {
            eprintln!("text: already built in '{}' (--force rebuilds it)", b.dir.display());
            print_text(&b);
            return Ok(std::process::ExitCode::SUCCESS);
        }
        TextBuildPlan::Build(build) => build,
    };
    let cancel = super::super::cancel_on_ctrl_c();
    let bar = super::super::progress_bar(args.quiet);
    let mut on_progress = |p: &BuildProgress| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        let loss = p.loss.map(|l| format!(" loss {l:.3}")).unwrap_or_default();
        bar.set_message(format!("text: {}{loss}", p.stage));
    };
    let clock = std::time::Instant::now();
    let built = build.run(device, &mut on_progress, cancel);
    bar.finish_and_clear();
    let b = built?;
    eprintln!("text: built in {:.0} s", clock.elapsed().as_secs_f64());
    print_text(&b);
    Ok(std::process::ExitCode::SUCCESS)
}

/// Prints the text benchmarks built in the cache (`<cache>/demo/text-*`).
pub fn list_text_builds() -> anyhow::Result<()> {
    let root = mergescope_lab::demo::cache_dir()?.join("demo");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    let mut dirs: Vec<std::path::PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("text-")))
        .collect();
    dirs.sort();
    for d in dirs {
        match TextBenchmark::open(&d) {
            Ok(b) if b.is_current() => print_text(&b),
            Ok(_) => println!(
                "outdated: the text benchmark in '{}' was built by another recipe: rebuild it with `mergescope demo build --benchmark text --backbone DIR --force`",
                d.display()
            ),
            Err(e) => println!("{e}"),
        }
    }
    Ok(())
}

fn print_text(b: &TextBenchmark) {
    let m = &b.manifest;
    println!(
        "\ntext benchmark on {}, seed {}, {} fine-tuning: {}",
        m.backbone,
        m.recipe.seed,
        m.recipe.fine_tuning.describe(),
        b.dir.display()
    );
    println!("  {:<18} {:>8} {:>8}", "task (test)", "probe", "expert");
    let get = |a: &std::collections::BTreeMap<String, f64>| a.get("test").copied().unwrap_or(f64::NAN);
    for t in &m.tasks {
        println!(
            "  {:<18} {:>7.1}% {:>7.1}%",
            t.name,
            100.0 * get(&t.base_accuracy),
            100.0 * get(&t.expert_accuracy)
        );
    }
    let n = m.tasks.len().max(1) as f64;
    println!(
        "  {:<18} {:>7.1}% {:>7.1}%",
        "mean",
        100.0 * m.tasks.iter().map(|t| get(&t.base_accuracy)).sum::<f64>() / n,
        100.0 * m.tasks.iter().map(|t| get(&t.expert_accuracy)).sum::<f64>() / n
    );
    println!(
        "  compare merges on it: mergescope compare --benchmark {} --out-dir compare-text",
        b.suite_path().display()
    );
}
