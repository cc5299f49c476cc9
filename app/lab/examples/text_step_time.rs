//! Times fine-tuning steps of the text benchmark's experts on the real all-MiniLM-L6-v2: full
//! fine-tuning against LoRA r = 8 (alpha 16, every default target), through the build's own
//! loop ([`fine_tune_snapshots`]): minibatches of 32 `fortune_topic` train texts cut to 32
//! tokens (the longest texts, so every batch is 32 × 32 tokens), a fixed probe head. Runs
//! alternate (full, LoRA, full, LoRA, …) so that other jobs' load falls on both; each run's
//! first step (which also makes the variables or factors) is left out of the median. The final
//! loss (mean of the run's steps) is printed in full, so two builds can be compared bit for bit.
//!
//! ```sh
//! scripts/fetch-minilm.sh
//! cargo run --release -p mergescope-lab --example text_step_time [-- DIR [STEPS [ROUNDS]]]
//! ```
//!
//! DIR defaults to `~/.cache/mergescope/all-minilm-l6-v2`, STEPS to 6 per run, ROUNDS to 2.
//! Speed is judged from these printed figures, not asserted.

use candle_core::{Device, Tensor};
use mergescope_lab::text_bench::build::{Backbone, LinearHead, fine_tune_snapshots};
use mergescope_lab::text_bench::data::Tokenized;
use mergescope_lab::text_bench::{TextRecipe, TextSplit, builtin_tasks};
use std::error::Error;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat (NaN elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // utime and stime are fields 14 and 15, in ticks of 1/100 s on Linux.
    match (f.get(10), f.get(11)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = match args.first() {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var("HOME")?).join(".cache/mergescope/all-minilm-l6-v2"),
    };
    let steps: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(6);
    let rounds: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2);
    let device = Device::Cpu;
    let backbone = Backbone::load(&dir, 32, &device)?;
    let task = builtin_tasks()?
        .into_iter()
        .find(|t| t.name == "fortune_topic")
        .ok_or("no fortune_topic task")?;
    let tok = Tokenized::new(&backbone.tokenizer, task.split(TextSplit::Train))?;
    let (classes, hidden) = (task.classes.len(), backbone.config.hidden_size);
    let ramp = Tensor::arange(0u32, (classes * hidden) as u32, &device)?.to_dtype(candle_core::DType::F32)?;
    let head = LinearHead {
        weight: ((ramp * 0.37)?.sin()? * 0.05)?.reshape((classes, hidden))?,
        bias: Tensor::zeros(classes, candle_core::DType::F32, &device)?,
    };
    println!(
        "all-MiniLM-L6-v2 from {}, {} train texts of fortune_topic, batch 32, max length 32, {steps} steps per run, {rounds} rounds, {} threads",
        dir.display(),
        tok.len(),
        candle_core::utils::get_num_threads()
    );
    let mut full_recipe = TextRecipe::default_for(0);
    let mut lora_recipe = TextRecipe::lora_for(0, 8);
    for r in [&mut full_recipe, &mut lora_recipe] {
        (r.expert_steps, r.warmup_steps) = (steps, 1);
    }
    let never = AtomicBool::new(false);
    let mut all: [(&str, Vec<f64>); 2] = [("full", Vec::new()), ("LoRA r=8", Vec::new())];
    for round in 0..rounds {
        for (which, recipe) in [&full_recipe, &lora_recipe].into_iter().enumerate() {
            let load = load_average();
            let mut times = Vec::new();
            let mut last = Instant::now();
            let start = last;
            let cpu = cpu_seconds();
            let final_loss = fine_tune_snapshots(
                &backbone,
                &head,
                &tok,
                recipe,
                0xE0,
                &device,
                &[],
                &mut |_, _| Ok(()),
                &mut |_| {
                    let now = Instant::now();
                    times.push(now.duration_since(last).as_secs_f64());
                    last = now;
                },
                &never,
            )?;
            let total = start.elapsed().as_secs_f64();
            let cpu_per_step = (cpu_seconds() - cpu) / steps.max(1) as f64;
            let rest = times.get(1..).map(<[f64]>::to_vec).unwrap_or_default();
            println!(
                "round {round} {:>9}: first step {:.3} s, median of the others {:.3} s, run {total:.2} s, CPU {cpu_per_step:.3} s per step, final loss {final_loss:?} (load average {load})",
                all[which].0,
                times.first().copied().unwrap_or(f64::NAN),
                median(rest.clone())
            );
            all[which].1.extend(rest);
        }
    }
    let [(_, full), (_, lora)] = all;
    let least = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (fm, lm) = (least(&full), least(&lora));
    let (f, l) = (median(full), median(lora));
    println!(
        "median step: full {f:.3} s, LoRA r=8 {l:.3} s, LoRA/full {:.2}; fastest step: full {fm:.3} s, LoRA r=8 {lm:.3} s, LoRA/full {:.2} (load average now {})",
        l / f,
        lm / fm,
        load_average()
    );
    Ok(())
}
