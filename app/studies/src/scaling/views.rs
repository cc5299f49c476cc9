//! Seed 002's checkpoint-only views and the bound calculator as figures: the heterogeneity
//! proxy before and after a TIES or DARE mask with its signed reduction δ_i (Algorithm 002-D),
//! the effective task weights from the step counts the experts record (Algorithm 002-B), and
//! the bound's stability and optimisation parts (Algorithm 002-C).

use super::bound::{Bound, BoundInputs, ChiSquare, TaskTerms, bound};
use super::estimate::gradient_statistics;
use super::heterogeneity::{Heterogeneity, dare_masks, heterogeneity, ties_masks};
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::{EngineError, Result};
use mergescope_figures::{Bars, Figure, format_number};
use mergescope_lab::data::TaskData;
use mergescope_lab::demo::Benchmark;
use mergescope_lab::demo::load_params;
use mergescope_lab::train::STEPS_KEY;
use std::path::{Path, PathBuf};

/// Which mask the heterogeneity proxy is measured under.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mask {
    /// TIES: keep each task's `density` largest-magnitude entries, then the elected sign.
    Ties {
        /// Fraction kept.
        density: f64,
    },
    /// DARE: drop each entry with probability `drop`.
    Dare {
        /// Drop probability.
        drop: f64,
        /// Seed of the draws.
        seed: u64,
    },
}

impl Mask {
    /// Label in figures.
    pub fn label(self) -> String {
        match self {
            Mask::Ties { density } => format!("TIES (density {})", format_number(density)),
            Mask::Dare { drop, .. } => format!("DARE (drop {})", format_number(drop)),
        }
    }
}

/// Task vectors θ_i − θ_0 of `experts` over `base`, flattened in tensor-name order.
pub fn task_vectors(base: &Path, experts: &[PathBuf]) -> Result<Vec<Vec<f32>>> {
    let device = candle_core::Device::Cpu;
    let flat = |p: &Path| -> Result<Vec<f32>> {
        let host = mergescope_lab::nn::to_host(&load_params(p, &device)?)?;
        Ok(host.into_values().flat_map(|(_, v)| v).collect())
    };
    let b = flat(base)?;
    experts
        .iter()
        .map(|e| {
            let x = flat(e)?;
            if x.len() != b.len() {
                return Err(EngineError::Incompatible(format!(
                    "'{}' has {} parameters and the base '{}' {}: pick experts fine-tuned from this base",
                    e.display(),
                    x.len(),
                    base.display(),
                    b.len()
                )));
            }
            Ok(x.iter().zip(&b).map(|(a, b)| a - b).collect())
        })
        .collect()
}

/// The heterogeneity proxy of `experts` merged with weights `lambdas` (default 1/N) under `mask`.
pub fn heterogeneity_of_files(
    base: &Path,
    experts: &[PathBuf],
    lambdas: Option<&[f64]>,
    mask: Mask,
) -> Result<Heterogeneity> {
    if experts.len() < 2 {
        return Err(EngineError::Param(
            "the heterogeneity proxy needs at least two experts".into(),
        ));
    }
    let taus = task_vectors(base, experts)?;
    let refs: Vec<&[f32]> = taus.iter().map(Vec::as_slice).collect();
    let n = experts.len();
    let uniform = vec![1.0 / n as f64; n];
    let lambdas = lambdas.unwrap_or(&uniform);
    if lambdas.len() != n {
        return Err(EngineError::Param(format!(
            "{} weights for {n} experts: give one λ per expert",
            lambdas.len()
        )));
    }
    let masks = match mask {
        Mask::Ties { density } => ties_masks(&refs, density),
        Mask::Dare { drop, seed } => dare_masks(n, refs[0].len(), drop, seed),
    };
    Ok(heterogeneity(&refs, lambdas, &masks))
}

/// What a fine-tuned checkpoint records about its training run.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainFacts {
    /// Steps K_i.
    pub steps: f64,
    /// Batch size b_i (None for full batch).
    pub batch: Option<f64>,
    /// Training examples n_i.
    pub examples: Option<f64>,
    /// Learning rate η.
    pub lr: Option<f64>,
    /// The task it was fine-tuned on (`mergescope.demo.task`), when recorded.
    pub task: Option<String>,
}

/// The training facts each of `experts` records in its metadata; an expert without a step
/// count is an error naming the file.
pub fn train_facts(experts: &[PathBuf]) -> Result<Vec<TrainFacts>> {
    experts
        .iter()
        .map(|p| {
            let ck = Checkpoint::open(p)?;
            let meta = ck.files.first().map(|f| f.metadata.clone()).unwrap_or_default();
            let num = |k: &str| meta.get(k).and_then(|v| v.parse::<f64>().ok());
            let steps = num(STEPS_KEY).ok_or_else(|| {
                EngineError::Invalid(format!(
                    "'{}' records no step count ({STEPS_KEY} metadata); experts fine-tuned by this version of mergescope record it: rebuild the demo with `mergescope demo build --force` or use a sweep's experts",
                    p.display()
                ))
            })?;
            Ok(TrainFacts {
                steps,
                batch: num("mergescope.train.batch"),
                examples: num("mergescope.train.examples"),
                lr: num("mergescope.train.lr"),
                task: meta.get("mergescope.demo.task").cloned(),
            })
        })
        .collect()
}

/// Bars of the proxy per task: before, after the mask, and the signed reduction δ_i.
pub fn heterogeneity_figure(tasks: &[String], h: &Heterogeneity, mask: Mask) -> Figure {
    let negative = h.delta.iter().filter(|d| **d < 0.0).count();
    let mut notes =
        vec!["|τ_i − Σ_k λ_k τ_k|² per task; δ_i(M) is the reduction by the mask, with its sign".to_owned()];
    if negative > 0 {
        notes.push(format!(
            "δ_i < 0 for {negative} task(s): the mask raised their heterogeneity (the paper assumes δ_i > 0)"
        ));
    }
    Figure::Bars(Bars {
        title: format!("Heterogeneity proxy before and after {}", mask.label()),
        x_label: "task".into(),
        y_label: "squared distance to the weighted mean".into(),
        categories: tasks.to_vec(),
        series: vec![
            ("before".into(), h.before.clone()),
            (format!("after {}", mask.label()), h.after.clone()),
            ("δ_i(M)".into(), h.delta.clone()),
        ],
        stacked: false,
        notes,
    })
}

/// Bars of the effective weights λ_i = K_i / Σ_j K_j beside the uniform 1/N.
pub fn weights_figure(tasks: &[String], steps: &[f64]) -> Figure {
    let lambdas = super::bound::effective_weights(steps);
    let n = tasks.len().max(1) as f64;
    let ks: Vec<String> = tasks
        .iter()
        .zip(steps)
        .map(|(t, k)| format!("{t} {}", format_number(*k)))
        .collect();
    Figure::Bars(Bars {
        title: "Effective task weights of plain averaging (λ_i = K_i / Σ_j K_j)".into(),
        x_label: "task".into(),
        y_label: "weight".into(),
        categories: tasks.to_vec(),
        series: vec![
            ("effective λ_i".into(), lambdas),
            ("uniform 1/N".into(), vec![1.0 / n; tasks.len()]),
        ],
        stacked: false,
        notes: vec![format!("steps K_i: {}", ks.join(", "))],
    })
}

/// Stacked bars of the bound's stability and optimisation parts, one bar per variant.
pub fn bound_figure(variants: &[(String, Bound)]) -> Figure {
    // Short series names keep the legend inside narrow plots; the formulas go in the notes.
    let mut notes: Vec<String> = vec!["stability = 8(L+1)·η²·Σλ_i·S_i, optimisation = (2C+1)·O'".into()];
    for (_, b) in variants {
        for w in &b.warnings {
            if !notes.contains(w) {
                notes.push(w.clone());
            }
        }
    }
    for (name, b) in variants {
        notes.push(format!(
            "{name}: total {}, χ² {}, ε_sgd {}",
            format_number(b.total()),
            format_number(b.chi2),
            format_number(b.eps_sgd)
        ));
    }
    Figure::Bars(Bars {
        title: "Excess-risk bound (seed 002, Theorem 3): stability and optimisation".into(),
        x_label: "variant".into(),
        y_label: "bound".into(),
        categories: variants.iter().map(|(n, _)| n.clone()).collect(),
        series: vec![
            ("stability".into(), variants.iter().map(|(_, b)| b.stability).collect()),
            (
                "optimisation".into(),
                variants.iter().map(|(_, b)| b.optimisation).collect(),
            ),
        ],
        stacked: true,
        notes,
    })
}

/// The name of a bound variant.
pub fn variant_name(chi: ChiSquare, constant: f64) -> String {
    let c = match chi {
        ChiSquare::AsPrinted => "χ² as printed",
        ChiSquare::Standard => "standard χ²",
    };
    format!("{c}, constant {}", format_number(constant))
}

/// The constants of the bound a user chooses (the rest is measured).
#[derive(Clone, Debug, PartialEq)]
pub struct BoundSettings {
    /// Merge weights λ_i (normalised); None: 1/N each.
    pub lambdas: Option<Vec<f64>>,
    /// Smoothness L.
    pub smoothness: f64,
    /// PL-type constant C.
    pub pl: f64,
    /// Δ0; None: the λ-weighted calibration loss at the base (f̃_inf taken as 0).
    pub delta0: Option<f64>,
    /// Calibration examples per task for σ² and ζ².
    pub examples: usize,
    /// Learning rate η when the experts record none.
    pub lr: Option<f64>,
}

impl Default for BoundSettings {
    fn default() -> Self {
        BoundSettings {
            lambdas: None,
            smoothness: 1.0,
            pl: 1.0,
            delta0: None,
            examples: 50,
            lr: None,
        }
    }
}

/// A bound evaluated on checkpoints: each expert's task and terms, and the four variants
/// (χ² as printed or standard × constant 5 or 12).
#[derive(Clone, Debug)]
pub struct BoundReport {
    /// Each expert's task.
    pub tasks: Vec<String>,
    /// Each expert's terms (λ as given, not normalised).
    pub terms: Vec<TaskTerms>,
    /// The variants, named.
    pub variants: Vec<(String, Bound)>,
    /// Calibration examples per task used.
    pub examples: usize,
}

/// Measures σ_i², ζ_i² at the base on `bench`'s calibration data and evaluates the bound for
/// `experts` with what they record (K, b, n, η) and `settings`. An expert's task is its
/// `mergescope.demo.task` metadata, else the benchmark's task at its position.
pub fn bound_of_files(
    bench: &Benchmark,
    data: &[TaskData],
    base: &Path,
    experts: &[PathBuf],
    settings: &BoundSettings,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<BoundReport> {
    let facts = train_facts(experts)?;
    let n = experts.len();
    let lambdas = settings.lambdas.clone().unwrap_or_else(|| vec![1.0 / n as f64; n]);
    if lambdas.len() != n {
        return Err(EngineError::Param(format!(
            "{} weights for {n} experts: give one λ per expert",
            lambdas.len()
        )));
    }
    let names = bench.task_names();
    let tasks: Vec<String> = facts
        .iter()
        .zip(experts)
        .enumerate()
        .map(|(i, (f, p))| {
            f.task
                .clone()
                .or_else(|| names.get(i).map(|s| (*s).to_owned()))
                .ok_or_else(|| {
                    EngineError::Invalid(format!(
                        "'{}' names no task (mergescope.demo.task metadata)",
                        p.display()
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let device = candle_core::Device::Cpu;
    let heads = bench.heads(&device)?;
    let pairs = tasks
        .iter()
        .map(|t| {
            let d = data
                .iter()
                .find(|d| &d.name == t)
                .ok_or_else(|| EngineError::Invalid(format!("no task data for '{t}'")))?;
            let h = heads
                .get(t)
                .ok_or_else(|| EngineError::Invalid(format!("the benchmark has no head for task '{t}'")))?;
            Ok((d, h))
        })
        .collect::<Result<Vec<_>>>()?;
    let stats = gradient_statistics(
        bench.manifest.arch,
        &load_params(base, &device)?,
        &pairs,
        &lambdas,
        settings.examples,
        &device,
        cancel,
    )?;
    let total: f64 = lambdas.iter().sum();
    let delta0 = settings
        .delta0
        .unwrap_or_else(|| stats.loss.iter().zip(&lambdas).map(|(l, w)| l * w / total).sum());
    let lr = settings
        .lr
        .or_else(|| facts.iter().find_map(|f| f.lr))
        .ok_or_else(|| EngineError::Param("the experts record no learning rate: give η".into()))?;
    let terms: Vec<TaskTerms> = facts
        .iter()
        .zip(&lambdas)
        .enumerate()
        .map(|(i, (f, l))| {
            let examples = f.examples.ok_or_else(|| {
                EngineError::Invalid(format!("'{}' records no training-set size", experts[i].display()))
            })?;
            Ok(TaskTerms {
                lambda: *l,
                steps: f.steps,
                batch: f.batch.unwrap_or(examples),
                examples,
                sigma2: stats.sigma2[i],
                zeta2: stats.zeta2[i],
            })
        })
        .collect::<Result<_>>()?;
    let mut variants = Vec::new();
    for chi in [ChiSquare::AsPrinted, ChiSquare::Standard] {
        for constant in [5.0, 12.0] {
            let b = bound(&BoundInputs {
                tasks: terms.clone(),
                lr,
                smoothness: settings.smoothness,
                pl: settings.pl,
                delta0,
                last_constant: constant,
                chi,
            });
            variants.push((variant_name(chi, constant), b));
        }
    }
    Ok(BoundReport {
        tasks,
        terms,
        variants,
        examples: stats.examples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_and_bars_carry_the_numbers() {
        let tasks = vec!["a".to_owned(), "b".to_owned()];
        let Figure::Bars(b) = weights_figure(&tasks, &[100.0, 300.0]) else {
            panic!()
        };
        assert_eq!(b.series[0].1, [0.25, 0.75]);
        assert_eq!(b.series[1].1, [0.5, 0.5]);
        let h = Heterogeneity {
            before: vec![2.0, 1.0],
            after: vec![1.0, 1.5],
            delta: vec![1.0, -0.5],
        };
        let Figure::Bars(b) = heterogeneity_figure(&tasks, &h, Mask::Ties { density: 0.2 }) else {
            panic!()
        };
        assert!(
            b.notes.iter().any(|n| n.contains("δ_i < 0 for 1 task")),
            "{:?}",
            b.notes
        );
        // Grouped rects: δ_b is drawn below zero.
        let r = b.rects().into_iter().find(|r| r.0 == 2 && r.1 == 1).unwrap();
        assert_eq!((r.4, r.5), (-0.5, 0.0));
    }
}
