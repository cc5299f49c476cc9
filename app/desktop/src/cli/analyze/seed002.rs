//! Seed 002's views headless: the heterogeneity proxy under TIES/DARE masks, the effective
//! task weights from the experts' recorded step counts, and the excess-risk bound with σ²/ζ²
//! estimated from calibration gradients.

use super::{Common, short_name};
use anyhow::bail;
use clap::{Args, ValueEnum};
use mergescope_lab::data::benchmark_tasks;
use mergescope_studies::scaling::views::{
    BoundSettings, Mask, bound_figure, bound_of_files, heterogeneity_figure, heterogeneity_of_files, train_facts,
    weights_figure,
};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MaskKind {
    Ties,
    Dare,
}

#[derive(Args, Debug)]
pub struct HeterogeneityArgs {
    #[command(flatten)]
    pub common: Common,
    /// The mask: TIES (trim + sign election) or DARE (random drop).
    #[arg(long, value_enum, default_value = "ties")]
    pub mask: MaskKind,
    /// TIES: fraction of each task vector kept.
    #[arg(long, default_value_t = 0.2)]
    pub density: f64,
    /// DARE: drop probability.
    #[arg(long, default_value_t = 0.5)]
    pub drop: f64,
    /// DARE: seed of the draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Args, Debug)]
pub struct WeightsArgs {
    #[command(flatten)]
    pub common: Common,
}

#[derive(Args, Debug)]
pub struct BoundArgs {
    #[command(flatten)]
    pub common: Common,
    /// Merge weights λ_i, comma-separated (normalised to sum 1); default 1/N each.
    #[arg(long, value_delimiter = ',', value_name = "L1,L2")]
    pub lambda: Option<Vec<f64>>,
    /// Smoothness constant L (assumed).
    #[arg(long, default_value_t = 1.0)]
    pub smoothness: f64,
    /// PL-type constant C (assumed).
    #[arg(long, default_value_t = 1.0)]
    pub pl: f64,
    /// Δ0 = f̃(x0) − f̃_inf; default: the λ-weighted calibration loss at the base (f̃_inf = 0).
    #[arg(long)]
    pub delta0: Option<f64>,
    /// Calibration examples per task for σ² and ζ².
    #[arg(long, default_value_t = 50)]
    pub examples: usize,
    /// Learning rate η when the experts do not record one.
    #[arg(long)]
    pub lr: Option<f64>,
}

fn names(experts: &[PathBuf]) -> Vec<String> {
    experts.iter().map(|p| short_name(p)).collect()
}

pub fn heterogeneity(a: &HeterogeneityArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let m = a.common.models.paths()?;
    let mask = match a.mask {
        MaskKind::Ties if (0.0..=1.0).contains(&a.density) => Mask::Ties { density: a.density },
        MaskKind::Dare if (0.0..1.0).contains(&a.drop) => Mask::Dare {
            drop: a.drop,
            seed: a.seed,
        },
        _ => bail!("--density must be in [0, 1] and --drop in [0, 1)"),
    };
    let h = heterogeneity_of_files(&m.base, &m.experts, None, mask)?;
    let tasks = names(&m.experts);
    for (i, t) in tasks.iter().enumerate() {
        eprintln!(
            "{t}: before {:.4}, after {:.4}, δ {:+.4}",
            h.before[i], h.after[i], h.delta[i]
        );
    }
    a.common.write(&heterogeneity_figure(&tasks, &h, mask))
}

pub fn weights(a: &WeightsArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let m = a.common.models.paths()?;
    let facts = train_facts(&m.experts)?;
    let steps: Vec<f64> = facts.iter().map(|f| f.steps).collect();
    a.common.write(&weights_figure(&names(&m.experts), &steps))
}

pub fn bound_view(a: &BoundArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let m = a.common.models.paths()?;
    let bench = a.common.models.benchmark()?;
    let settings = BoundSettings {
        lambdas: a.lambda.clone(),
        smoothness: a.smoothness,
        pl: a.pl,
        delta0: a.delta0,
        examples: a.examples,
        lr: a.lr,
    };
    let started = std::time::Instant::now();
    let r = bound_of_files(
        &bench,
        &benchmark_tasks(None)?,
        &m.base,
        &m.experts,
        &settings,
        &AtomicBool::new(false),
    )?;
    eprintln!(
        "σ², ζ² from {} calibration examples per task in {:.1} s",
        r.examples,
        started.elapsed().as_secs_f64()
    );
    let total: f64 = r.terms.iter().map(|t| t.lambda).sum();
    println!("| task | λ | K | b | n | σ² | ζ² |\n|---|---|---|---|---|---|---|");
    for (t, x) in r.tasks.iter().zip(&r.terms) {
        println!(
            "| {t} | {:.3} | {} | {} | {} | {:.4e} | {:.4e} |",
            x.lambda / total,
            x.steps,
            x.batch,
            x.examples,
            x.sigma2,
            x.zeta2
        );
    }
    for (name, b) in &r.variants {
        println!(
            "{name}: stability {:.4e}, optimisation {:.4e}, total {:.4e}",
            b.stability,
            b.optimisation,
            b.total()
        );
    }
    for w in r.variants.first().map(|(_, b)| b.warnings.clone()).unwrap_or_default() {
        println!("warning: {w}");
    }
    a.common.write(&bound_figure(&r.variants))
}
