//! `mergescope` with no subcommand (or `mergescope gui`): the desktop window.

use clap::Args;
use mergescope_gui::DocumentConfig;
use mergescope_lab::nn::Arch;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Default)]
pub struct GuiArgs {
    /// Benchmark folder, or suite file (`.toml`) to evaluate merges with, to open (default: the
    /// built demo; built on first launch).
    #[arg(long, value_name = "DIR|SUITE")]
    pub benchmark: Option<PathBuf>,
    /// Architecture of the demo benchmark to open or build: mlp, cnn or vit.
    #[arg(long, value_name = "ARCH")]
    pub arch: Option<String>,
    /// Do not build the demo benchmark when none is built.
    #[arg(long)]
    pub no_build: bool,
}

pub fn run(plugin_dirs: &[PathBuf], args: &GuiArgs) -> anyhow::Result<ExitCode> {
    let demo_arch = match &args.arch {
        Some(a) => Some(Arch::parse(a).ok_or_else(|| anyhow::anyhow!("--arch '{a}': use mlp, cnn or vit"))?),
        None => None,
    };
    mergescope_gui::run(DocumentConfig {
        plugin_dirs: plugin_dirs.to_vec(),
        runs_dir: None,
        benchmark: args.benchmark.clone(),
        build_demo_if_missing: !args.no_build,
        demo_arch,
    })?;
    Ok(ExitCode::SUCCESS)
}
