//! `mergescope analyze`: the analysis views headless — PCA of checkpoints and trajectories,
//! task-vector cosines, spectra and CART's rank curves, per-task radar charts and loss
//! landscapes — written as PNG and CSV (the same figures the GUI draws); seed 002's views; and
//! seed 004's oracle on a text benchmark build (`analyze oracle`).

mod landscape;
mod oracle;
mod seed002;
mod views;

use super::inputs::{ModelArgs, Models};
use super::open_device_named;
use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use mergescope_engine::device::Device;
use mergescope_engine::writer::write_atomic;
use mergescope_figures::{Figure, render_png, to_csv};
use mergescope_lab::evaluate::{EvaluatorSpec, open_normalised};
use mergescope_lab::evaluator::Evaluator;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

#[derive(Subcommand, Debug)]
pub enum AnalyzeCommand {
    /// Base, experts, merges and trajectories on two principal components.
    Pca(views::PcaArgs),
    /// Cosine similarity of the task vectors (whole model, or one tensor).
    Cosine(views::CosineArgs),
    /// Singular values of one weight's task matrices, or CART's R(k)/I(k) curves (--curves).
    Spectrum(views::SpectrumArgs),
    /// Per-task normalised accuracy of merged checkpoints on a radar chart.
    Radar(views::RadarArgs),
    /// Loss/accuracy over task arithmetic's λ, CART's rank × λ, or a plane of checkpoints.
    Landscape(landscape::LandscapeArgs),
    /// Seed 002: ‖τ_i − Σλτ‖² per task before and after a TIES or DARE mask, with δ_i.
    Heterogeneity(seed002::HeterogeneityArgs),
    /// Seed 002: effective task weights K_i / Σ K_j from the experts' recorded step counts.
    Weights(seed002::WeightsArgs),
    /// Seed 002: the excess-risk bound, σ² and ζ² estimated from calibration gradients.
    Bound(seed002::BoundArgs),
    /// Seed 004 on a text benchmark build: task arithmetic of full-batch gradient-descent task
    /// vectors against multi-task gradient descent, the gap over η and epochs.
    Oracle(oracle::OracleArgs),
}

/// Where the inputs come from and where the figure goes; shared by every view.
#[derive(Args, Debug)]
pub struct Common {
    /// Which models, and the tasks they are scored on.
    #[command(flatten)]
    pub models: ModelArgs,
    /// Where the figure goes.
    #[command(flatten)]
    pub output: Output,
    /// Device the views that evaluate models (radar, landscape) run on: cpu, cuda or metal
    /// (falls back to the CPU with a warning when the build or the machine lacks it).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: String,
}

/// Where a view's picture and numbers go.
#[derive(Args, Debug)]
pub struct Output {
    /// Write the picture here (PNG).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Write the numbers here (CSV). Without --png or --csv a figure's CSV goes to stdout
    /// (`oracle` prints its table either way).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Picture size in pixels, WIDTHxHEIGHT.
    #[arg(long, default_value = "1000x720", value_name = "WxH")]
    pub size: String,
    /// Replace --png/--csv files that exist.
    #[arg(long)]
    pub overwrite: bool,
}

impl Common {
    /// The device of --device, opened (a fallback is announced on stderr).
    pub fn device(&self) -> anyhow::Result<Device> {
        open_device_named(&self.device)
    }

    /// The evaluator of --benchmark (a demo benchmark or a suite) on --device for `models`,
    /// with normalised scores (a suite's by its experts when there is one per task).
    pub fn evaluator(&self, models: &Models, data: Option<&Path>) -> anyhow::Result<Box<dyn Evaluator>> {
        let mut spec = EvaluatorSpec::new(self.models.benchmark.clone(), &self.device()?);
        spec.data = data.map(Path::to_path_buf);
        Ok(open_normalised(
            &spec,
            &models.base,
            &models.experts,
            &AtomicBool::new(false),
        )?)
    }

    /// Refuses to start when an output exists and --overwrite was not given.
    pub fn check_outputs(&self) -> anyhow::Result<()> {
        self.output.check_outputs()
    }

    /// Writes the figure as PNG and/or CSV (atomically), or its CSV to stdout.
    pub fn write(&self, figure: &Figure) -> anyhow::Result<()> {
        self.output.write(figure)
    }
}

impl Output {
    fn size(&self) -> anyhow::Result<(u32, u32)> {
        let parse = || {
            let (w, h) = self.size.split_once(['x', 'X'])?;
            Some((w.trim().parse().ok()?, h.trim().parse().ok()?))
        };
        parse()
            .filter(|(w, h): &(u32, u32)| (200..=8000).contains(w) && (150..=8000).contains(h))
            .with_context(|| format!("--size '{}': write WIDTHxHEIGHT in pixels, e.g. 1000x720", self.size))
    }

    /// Refuses to start when an output exists and --overwrite was not given (checked before
    /// long computations, so no work is lost to a late refusal).
    pub fn check_outputs(&self) -> anyhow::Result<()> {
        self.size()?;
        for p in [&self.png, &self.csv].into_iter().flatten() {
            if p.exists() && !self.overwrite {
                bail!(
                    "'{}' exists; pass --overwrite to replace it or choose another name",
                    p.display()
                );
            }
        }
        Ok(())
    }

    /// Writes the figure as PNG and/or CSV (atomically), or its CSV to stdout.
    pub fn write(&self, figure: &Figure) -> anyhow::Result<()> {
        let (w, h) = self.size()?;
        if let Some(p) = &self.png {
            let bytes = render_png(figure, w, h)?;
            write_atomic(p, &bytes)?;
            eprintln!("picture: {}", p.display());
        }
        if let Some(p) = &self.csv {
            write_atomic(p, to_csv(figure).as_bytes())?;
            eprintln!("numbers: {}", p.display());
        }
        if self.png.is_none() && self.csv.is_none() {
            print!("{}", to_csv(figure));
        }
        Ok(())
    }

    /// Writes the figure's picture to --png (atomically), if given.
    pub fn write_png(&self, figure: &Figure) -> anyhow::Result<()> {
        if let Some(p) = &self.png {
            let (w, h) = self.size()?;
            write_atomic(p, &render_png(figure, w, h)?)?;
            eprintln!("picture: {}", p.display());
        }
        Ok(())
    }
}

/// A file's name without `.safetensors` (and `.trajectory`).
pub use mergescope_studies::analysis::checkpoint_label as short_name;

pub fn run(command: &AnalyzeCommand) -> anyhow::Result<ExitCode> {
    match command {
        AnalyzeCommand::Pca(a) => views::pca(a),
        AnalyzeCommand::Cosine(a) => views::cosine(a),
        AnalyzeCommand::Spectrum(a) => views::spectrum(a),
        AnalyzeCommand::Radar(a) => views::radar(a),
        AnalyzeCommand::Landscape(a) => landscape::run(a),
        AnalyzeCommand::Heterogeneity(a) => seed002::heterogeneity(a),
        AnalyzeCommand::Weights(a) => seed002::weights(a),
        AnalyzeCommand::Bound(a) => seed002::bound_view(a),
        AnalyzeCommand::Oracle(a) => oracle::run(a),
    }?;
    Ok(ExitCode::SUCCESS)
}
