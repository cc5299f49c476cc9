//! `mergescope bench`: builds synthetic LLM-shaped checkpoints (cached) and times merge
//! methods on them, each in a fresh process so its peak memory is its own.

use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::synthetic::{SyntheticConfig, generate};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Where to keep the synthetic checkpoints (default: the user's cache folder).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Hidden size.
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    /// MLP intermediate size.
    #[arg(long, default_value_t = 5632)]
    pub intermediate: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 16)]
    pub layers: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 32000)]
    pub vocab: usize,
    /// Experts besides the base.
    #[arg(long, default_value_t = 3)]
    pub experts: usize,
    /// Stored dtype: F32, F16 or BF16.
    #[arg(long, default_value = "BF16")]
    pub dtype: String,
    /// Methods to time, each `id` or `id:name=value:name=value`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "task-arithmetic,ties:trim_scope=tensor,ties,dare"
    )]
    pub methods: Vec<String>,
    /// Device: cpu, cuda or metal.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Worker threads per merge (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("mergescope")
}

pub fn run(plugin_dirs: &[PathBuf], args: BenchArgs) -> anyhow::Result<ExitCode> {
    let cfg = SyntheticConfig {
        hidden: args.hidden,
        intermediate: args.intermediate,
        layers: args.layers,
        vocab: args.vocab,
        experts: args.experts,
        dtype: args.dtype.to_ascii_uppercase(),
        ..SyntheticConfig::default()
    };
    let params = cfg.param_count()?;
    let dir = args.dir.clone().unwrap_or_else(|| {
        cache_dir().join(format!(
            "bench-h{}-l{}-v{}-{}",
            cfg.hidden,
            cfg.layers,
            cfg.vocab,
            cfg.dtype.to_lowercase()
        ))
    });
    eprintln!(
        "synthetic models: {params} parameters each ({}), base + {} experts, in {}",
        cfg.dtype,
        cfg.experts,
        dir.display()
    );
    let started = std::time::Instant::now();
    let models = generate(&dir, &cfg, &|done, total| {
        eprint!("\rpreparing checkpoints: {done}/{total}")
    })?;
    eprintln!(" ({:.1} s)", started.elapsed().as_secs_f64());
    let exe = std::env::current_exe().context("cannot find the mergescope executable")?;
    let out_dir = dir.join("outputs");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("cannot create '{}'", out_dir.display()))?;
    println!(
        "{:<32} {:>9} {:>12} {:>14}",
        "method", "wall s", "input GB/s", "peak RSS GB"
    );
    for spec in &args.methods {
        let mut parts = spec.split(':');
        let id = parts.next().unwrap_or_default();
        let out = out_dir.join(format!("{}.safetensors", spec.replace([':', '='], "_")));
        let mut cmd = Command::new(&exe);
        for d in plugin_dirs {
            cmd.arg("--plugin-dir").arg(d);
        }
        cmd.args([
            "merge",
            "--method",
            id,
            "--quiet",
            "--json",
            "--overwrite",
            "--shard-size",
            "0",
        ])
        .arg("--base")
        .arg(&models[0])
        .args(["--device", &args.device, "--threads", &args.threads.to_string()])
        .arg("--out")
        .arg(&out);
        for m in &models[1..] {
            cmd.arg("--expert").arg(m);
        }
        for p in parts {
            cmd.arg("--param").arg(p);
        }
        let output = cmd
            .output()
            .with_context(|| format!("cannot run '{}'", exe.display()))?;
        if !output.status.success() {
            bail!(
                "benchmark of '{spec}' failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .with_context(|| format!("unexpected output of the merge of '{spec}'"))?;
        let secs = report["seconds"].as_f64().unwrap_or(f64::NAN);
        let gbps = report["input_gb_per_s"].as_f64().unwrap_or(f64::NAN);
        let rss = report["peak_rss_bytes"].as_f64().map_or(f64::NAN, |b| b / 1e9);
        println!("{spec:<32} {secs:>9.2} {gbps:>12.2} {rss:>14.2}");
        std::fs::remove_file(&out).ok();
    }
    Ok(ExitCode::SUCCESS)
}
