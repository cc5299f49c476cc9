//! The checkpoint-only views (PCA, cosine, spectrum) and the radar chart.

use super::{Common, short_name};
use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_studies::analysis::gram_of_files;
use mergescope_studies::analysis::spectrum::{matrix_names, task_spectra};
use mergescope_studies::analysis::views::{
    Role, cosine_figure, pca_figure, radar_figure, rank_curves_figure, spectrum_figure,
};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

#[derive(Args, Debug)]
pub struct PcaArgs {
    #[command(flatten)]
    pub common: Common,
    /// Merged (or any) checkpoints to place among the base and experts (repeatable).
    #[arg(long = "checkpoint", value_name = "PATH")]
    pub checkpoints: Vec<PathBuf>,
    /// Trajectory files (`<merge>.trajectory.safetensors`) drawn as arrows (repeatable).
    #[arg(long = "trajectory", value_name = "PATH")]
    pub trajectories: Vec<PathBuf>,
    /// Principal components on the axes (1-based), e.g. 1,2 or 2,3.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub pcs: Vec<usize>,
    /// Leave the base and experts out (only --checkpoint and --trajectory).
    #[arg(long)]
    pub no_models: bool,
}

pub fn pca(a: &PcaArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let (&[p1, p2], true) = (a.pcs.as_slice(), a.pcs.iter().all(|p| *p >= 1)) else {
        bail!("--pcs: give two components counted from 1, e.g. 1,2");
    };
    let mut files = Vec::new();
    let mut roles = Vec::new();
    if !a.no_models {
        let m = a.common.models.paths()?;
        files.push(m.base);
        roles.push(Role::Base);
        roles.extend(m.experts.iter().map(|_| Role::Expert));
        files.extend(m.experts);
    }
    files.extend(a.checkpoints.iter().cloned());
    roles.extend(a.checkpoints.iter().map(|_| Role::Merge));
    let started = std::time::Instant::now();
    let points = gram_of_files(&files, &a.trajectories, None, None)?;
    let names: Vec<String> = a.trajectories.iter().map(|p| short_name(p)).collect();
    let fig = pca_figure(&points, &roles, &names, (p1 - 1, p2 - 1))?;
    eprintln!(
        "PCA of {} points ({} checkpoints, {} iterates) in {:.2} s",
        points.labels.len(),
        files.len(),
        points.labels.len() - files.len(),
        started.elapsed().as_secs_f64()
    );
    a.common.write(&fig)
}

#[derive(Args, Debug)]
pub struct CosineArgs {
    #[command(flatten)]
    pub common: Common,
    /// Only this tensor (a layer); default: the whole model.
    #[arg(long, value_name = "NAME")]
    pub tensor: Option<String>,
    /// Further checkpoints whose deltas from the base join the matrix (merges; repeatable).
    #[arg(long = "checkpoint", value_name = "PATH")]
    pub checkpoints: Vec<PathBuf>,
}

pub fn cosine(a: &CosineArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let m = a.common.models.paths()?;
    let mut files = m.experts.clone();
    files.extend(a.checkpoints.iter().cloned());
    if files.len() < 2 {
        bail!("a cosine matrix needs at least two checkpoints besides the base");
    }
    let points = gram_of_files(&files, &[], Some(&m.base), a.tensor.as_deref())?;
    let scope = a
        .tensor
        .as_deref()
        .map_or("whole model".to_owned(), |t| format!("tensor {t}"));
    a.common.write(&cosine_figure(
        &points,
        &format!("Cosine similarity of task vectors θ − θ_base ({scope})"),
    ))
}

#[derive(Args, Debug)]
pub struct SpectrumArgs {
    #[command(flatten)]
    pub common: Common,
    /// The 2-D weight to analyse; default: the largest.
    #[arg(long, value_name = "NAME")]
    pub tensor: Option<String>,
    /// Draw CART's reconstruction error R(k) and interference I(k) against the rank instead
    /// of the singular values.
    #[arg(long)]
    pub curves: bool,
}

pub fn spectrum(a: &SpectrumArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let m = a.common.models.paths()?;
    let matrices = matrix_names(&m.base)?;
    let tensor = match &a.tensor {
        Some(t) => t.clone(),
        None => matrices
            .iter()
            .max_by_key(|(_, (r, c))| r * c)
            .map(|(n, _)| n.clone())
            .with_context(|| format!("'{}' has no 2-D weights to take spectra of", m.base.display()))?,
    };
    let s = task_spectra(&m.base, &m.experts, &tensor)?;
    let fig = if a.curves {
        rank_curves_figure(&s)
    } else {
        spectrum_figure(&s)
    };
    a.common.write(&fig)
}

#[derive(Args, Debug)]
pub struct RadarArgs {
    #[command(flatten)]
    pub common: Common,
    /// Checkpoints to evaluate and draw (repeatable); the base is added unless --no-base.
    #[arg(long = "checkpoint", value_name = "PATH", required = true)]
    pub checkpoints: Vec<PathBuf>,
    /// Leave the base out.
    #[arg(long)]
    pub no_base: bool,
    /// Folder of task files, when the benchmark was built with `demo build --data DIR`.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
}

pub fn radar(a: &RadarArgs) -> anyhow::Result<()> {
    a.common.check_outputs()?;
    let inputs = a.common.models.paths()?;
    let mut files: Vec<PathBuf> = Vec::new();
    if !a.no_base {
        files.push(inputs.base.clone());
    }
    files.extend(a.checkpoints.iter().cloned());
    // One evaluator (task data converted once) for every checkpoint.
    let evaluator = a.common.evaluator(&inputs, a.data.as_deref())?;
    let mut models = Vec::new();
    for f in &files {
        let report = evaluator
            .evaluate_file(f, &AtomicBool::new(false))
            .with_context(|| format!("cannot evaluate '{}' on {}", f.display(), evaluator.describe()))?;
        let label = if *f == inputs.base {
            "base".to_owned()
        } else {
            short_name(f)
        };
        models.push((label, report));
    }
    a.common.write(&radar_figure(&models)?)
}
