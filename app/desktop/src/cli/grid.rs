//! `mergescope grid run-cell GRID.json INDEX`: the one door every Slurm array task goes
//! through, whichever grid it belongs to (a sweep's, a comparison's or a landscape's cell, as the
//! job file's kind says).

use anyhow::{Context as _, bail};
use mergescope_engine::error::EngineError;
use mergescope_studies::grid::compare::CompareJob;
use mergescope_studies::grid::landscape::LandscapeJob;
use mergescope_studies::grid::{GridJob, read_job_value};
use mergescope_studies::scaling::sweep::executor::SweepJob;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Subcommand, Debug)]
pub enum GridCommand {
    /// Run one cell of a grid submitted with `--executor slurm` (what each array task runs):
    /// a sweep's, a comparison's or a landscape's, as its job file says. Its result goes to the
    /// work folder's cells/INDEX.out, an error to cells/INDEX.failed.
    RunCell {
        /// The grid's job file (`grid.json` in the work folder).
        #[arg(value_name = "GRID.json")]
        job: PathBuf,
        /// The cell's index (the array task id).
        index: usize,
    },
}

/// `mergescope grid ...`.
pub fn run_grid(plugin_dirs: &[PathBuf], command: &GridCommand) -> anyhow::Result<ExitCode> {
    match command {
        GridCommand::RunCell { job, index } => run_grid_cell(plugin_dirs, job, *index),
    }
}

/// `mergescope grid run-cell GRID.json INDEX`: runs one cell of the grid on this node, by the
/// job file's kind.
pub fn run_grid_cell(plugin_dirs: &[PathBuf], job_path: &Path, index: usize) -> anyhow::Result<ExitCode> {
    let (kind, _) = read_job_value(job_path)?;
    match kind.as_str() {
        SweepJob::KIND => cell_door(&SweepJob::read(job_path)?, index, |job| {
            let runs = super::sweep_slurm::cell(plugin_dirs, job, index)?;
            Ok(format!("{runs} fine-tuning runs made"))
        }),
        CompareJob::KIND => cell_door(&CompareJob::read(job_path)?, index, |job| {
            super::compare::run_cell(plugin_dirs, job, index)
        }),
        LandscapeJob::KIND => cell_door(&LandscapeJob::read(job_path)?, index, |job| {
            let n = job.run_cell(index, super::cancel_on_ctrl_c())?;
            Ok(format!("{n} points evaluated"))
        }),
        other => bail!(
            "'{}' is a job file of kind '{other}', which this mergescope does not know (sweep, compare, landscape): run the cells with the mergescope that submitted them",
            job_path.display()
        ),
    }
}

/// Runs cell `index` of `job` with `work`, which writes its result and says what it did: an
/// error goes to the cell's failure file (exit code 1); a signal (scancel, time limit) leaves no
/// failure, so the driver sees the task's Slurm state and submits it again.
fn cell_door<J: GridJob>(
    job: &J,
    index: usize,
    work: impl FnOnce(&J) -> anyhow::Result<String>,
) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let files = job.files();
    eprintln!(
        "cell {index} of {} on {}: {}",
        job.cells(),
        std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| "this machine".into()),
        job.key(index),
    );
    match work(job) {
        Ok(what) => {
            eprintln!(
                "cell {index} finished in {:.1} s ({what}): {}",
                started.elapsed().as_secs_f64(),
                files.result(index).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if matches!(e.downcast_ref::<EngineError>(), Some(EngineError::Cancelled)) => {
            eprintln!("cell {index} stopped by a signal before it finished");
            Ok(ExitCode::from(143))
        }
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("cell {index} failed: {msg}");
            files
                .write_failure(index, &msg)
                .with_context(|| format!("and its failure could not be recorded either ({msg})"))?;
            Ok(ExitCode::FAILURE)
        }
    }
}
