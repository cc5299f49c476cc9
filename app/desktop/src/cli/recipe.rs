//! `mergescope recipe convert`: a mergekit YAML configuration written as a mergescope recipe.

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use mergescope_engine::writer::write_atomic;
use mergescope_interop::mergekit;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand, Debug)]
pub enum RecipeCommand {
    /// Convert a mergekit YAML configuration into the equivalent mergescope recipe (TOML).
    Convert(ConvertArgs),
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The mergekit configuration (merge.yml).
    #[arg(value_name = "MERGE.yml")]
    pub config: PathBuf,
    /// Where to write the recipe (default: print it).
    #[arg(long, short, value_name = "RECIPE.toml")]
    pub output: Option<PathBuf>,
    /// The merge's output folder written into the recipe.
    #[arg(long, value_name = "FOLDER", default_value = "merged")]
    pub out: PathBuf,
    /// Replace --output if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(plugin_dirs: &[PathBuf], command: RecipeCommand) -> anyhow::Result<ExitCode> {
    let RecipeCommand::Convert(args) = command;
    let registry = super::registry(plugin_dirs)?;
    let ids: Vec<&str> = registry.plugins.iter().map(|p| p.id()).collect();
    let converted = mergekit::load_with_plugins(&args.config, &args.out, &ids)?;
    for n in &converted.notes {
        eprintln!("note: {n}");
    }
    let text = format!(
        "# Converted by mergescope {} from the mergekit configuration '{}'.\n{}",
        env!("CARGO_PKG_VERSION"),
        args.config.display(),
        toml::to_string(&converted.recipe).context("cannot write the recipe as TOML")?
    );
    match &args.output {
        None => print!("{text}"),
        Some(path) => {
            if path.exists() && !args.overwrite {
                bail!(
                    "'{}' already exists; mergescope never replaces a file silently: choose another --output or pass \
                     --overwrite",
                    path.display()
                );
            }
            write_atomic(path, text.as_bytes())?;
            eprintln!(
                "wrote {} (run it with `mergescope merge {}`)",
                path.display(),
                path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
