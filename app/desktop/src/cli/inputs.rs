//! The `--benchmark/--arch/--base/--expert` options that say which models a command works on,
//! shared by `compare`, `search` and `analyze`.

use anyhow::{Context, bail};
use clap::Args;
use mergescope_lab::demo::{Benchmark, resolve_benchmark};
use mergescope_lab::evaluate::suite_models;
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_lab::nn::Arch;
use std::path::{Path, PathBuf};

/// The base and the experts a command works on.
pub use mergescope_lab::evaluator::suite::SuiteModels as Models;

/// Where the base and the experts come from.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// `demo` (the built demo benchmark of --arch), `demo/<arch>-seed<N>`, a benchmark folder,
    /// or a suite file (`.toml`): gives the base and the experts unless --base/--expert are
    /// given (a suite through its [models] table), and the tasks they are scored on.
    #[arg(long, default_value = "demo", value_name = "SPEC")]
    pub benchmark: String,
    /// Architecture of the demo benchmark: mlp, cnn or vit.
    #[arg(long, default_value = "cnn")]
    pub arch: String,
    /// Base checkpoint (instead of the benchmark's or the suite's).
    #[arg(long, value_name = "PATH", requires = "experts")]
    pub base: Option<PathBuf>,
    /// Expert checkpoints, one per task in the benchmark's order (repeatable).
    #[arg(long = "expert", value_name = "PATH")]
    pub experts: Vec<PathBuf>,
}

impl ModelArgs {
    /// The base and expert files: --base/--expert, else the suite's [models] or the benchmark's.
    pub fn paths(&self) -> anyhow::Result<Models> {
        if let Some(base) = &self.base {
            return Ok(Models {
                base: base.clone(),
                experts: self.experts.clone(),
            });
        }
        if !self.experts.is_empty() {
            bail!("--expert needs --base too (or leave both out to use the benchmark's)");
        }
        if is_suite_path(&self.benchmark) {
            return Ok(suite_models(&Suite::load(Path::new(&self.benchmark))?, None, &[])?);
        }
        let bench = self.benchmark()?;
        Ok(Models {
            base: bench.base_path(),
            experts: bench.expert_paths(),
        })
    }

    /// The parsed --arch.
    pub fn arch(&self) -> anyhow::Result<Arch> {
        Arch::parse(&self.arch).with_context(|| format!("--arch '{}': use mlp, cnn or vit", self.arch))
    }

    /// The demo benchmark or benchmark folder --benchmark names (not a suite).
    pub fn benchmark(&self) -> anyhow::Result<Benchmark> {
        Ok(resolve_benchmark(&self.benchmark, Some(self.arch()?))?)
    }
}
