//! The Slurm executor's door for every grid: `--executor slurm` of `mergescope sweep`,
//! `mergescope compare` and `mergescope analyze landscape` (one set of options, [`SlurmArgs`],
//! handed to the studies' driver, `mergescope_studies::grid::drive`, whose reports [`shown`]
//! prints), with `--quiet` and `--executor` ([`GridRunArgs`]), and
//! `mergescope grid run-cell GRID.json INDEX`, what every array task runs (the job file's kind
//! picks the sweep's, comparison's or landscape's per-cell code, the same as the local
//! executor's). See docs/slurm.md.

use anyhow::{Context as _, bail};
use clap::Args;
use indicatif::ProgressBar;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::loader::Plugin;
use mergescope_studies::grid::drive::{Report, SlurmSettings};
use mergescope_studies::grid::slurm::SlurmOptions;
use mergescope_studies::grid::{ExecutorKind, GridJob};
use mergescope_studies::scaling::sweep::executor::{SweepJob, write_cell_result};
use mergescope_studies::scaling::sweep::run::SPEC_FILE;
use mergescope_studies::scaling::sweep::{OpenBench, SweepBench, SweepInputs, SweepProgress, SweepSpec, run_one_cell};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Options of the Slurm executor.
#[derive(Args, Debug, Default)]
pub struct SlurmArgs {
    /// Slurm partition (default: the cluster's default).
    #[arg(long, help_heading = "Slurm executor")]
    pub partition: Option<String>,
    /// Time limit per cell, as sbatch takes it (e.g. 00:30:00).
    #[arg(long, help_heading = "Slurm executor")]
    pub time: Option<String>,
    /// CPUs per cell (also its thread count).
    #[arg(long, default_value_t = 1, help_heading = "Slurm executor")]
    pub cpus_per_task: usize,
    /// GPUs per cell (--gres=gpu:G); use with --device cuda.
    #[arg(long, help_heading = "Slurm executor")]
    pub gpus: Option<u32>,
    /// Memory per cell, as sbatch takes it (e.g. 4G).
    #[arg(long, help_heading = "Slurm executor")]
    pub mem: Option<String>,
    /// At most K cells at once (--array=...%K).
    #[arg(long, value_name = "K", help_heading = "Slurm executor")]
    pub array_parallelism: Option<usize>,
    /// Times a cell the scheduler killed (time limit, node failure, scancel) is submitted again.
    #[arg(long, default_value_t = 2, help_heading = "Slurm executor")]
    pub max_retries: usize,
    /// Shared folder for the job file, batch script, logs and cell results; every node must
    /// see it at the same path (default: <out>/slurm).
    #[arg(long, value_name = "DIR", help_heading = "Slurm executor")]
    pub workdir: Option<PathBuf>,
    /// The mergescope binary the compute nodes run (default: this executable).
    #[arg(long, value_name = "PATH", help_heading = "Slurm executor")]
    pub mergescope_bin: Option<PathBuf>,
    /// A shell line each cell runs first, e.g. "module load cuda" (repeatable).
    #[arg(long, value_name = "LINE", help_heading = "Slurm executor")]
    pub setup: Vec<String>,
    /// One more #SBATCH option, e.g. --account=proj (repeatable).
    #[arg(long = "sbatch-arg", value_name = "OPTION", help_heading = "Slurm executor")]
    pub sbatch_args: Vec<String>,
    /// Seconds between two looks at the queue.
    #[arg(long, default_value_t = 2.0, help_heading = "Slurm executor")]
    pub poll_seconds: f64,
    /// Print the batch script of the cells still to run, and submit nothing.
    #[arg(long, help_heading = "Slurm executor")]
    pub dry_run: bool,
}

/// How a grid command (`sweep`, `compare`, `analyze landscape`) runs its cells: where, how
/// quietly, and the Slurm executor's options.
#[derive(Args, Debug, Default)]
pub struct GridRunArgs {
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Where the cells run: `local` (this process, one after another) or `slurm` (one Slurm
    /// array job, a task per cell; see docs/slurm.md).
    #[arg(long, default_value = "local", value_name = "local|slurm")]
    pub executor: String,
    #[command(flatten)]
    pub slurm: Box<SlurmArgs>,
}

impl GridRunArgs {
    /// The executor of --executor. With the local one, the Slurm executor's options given are
    /// refused: --dry-run and the command's own `slurm_only` (flag, whether given).
    pub fn executor(&self, slurm_only: &[(&str, bool)]) -> anyhow::Result<ExecutorKind> {
        let executor = ExecutorKind::parse(&self.executor).context("--executor")?;
        if executor == ExecutorKind::Local {
            let given: Vec<&str> = [("--dry-run", self.slurm.dry_run)]
                .iter()
                .chain(slurm_only)
                .filter(|(_, given)| *given)
                .map(|(flag, _)| *flag)
                .collect();
            match given.as_slice() {
                [] => {}
                ["--dry-run"] => bail!("--dry-run prints the Slurm batch script: add --executor slurm"),
                [one] => bail!("{one} is the Slurm executor's: add --executor slurm"),
                many => bail!("{} are the Slurm executor's: add --executor slurm", many.join(" and ")),
            }
        }
        Ok(executor)
    }
}

impl SlurmArgs {
    /// The settings the studies' Slurm executor takes.
    pub fn settings(&self) -> SlurmSettings {
        SlurmSettings {
            job: SlurmOptions {
                partition: self.partition.clone(),
                time: self.time.clone(),
                cpus_per_task: self.cpus_per_task,
                gpus: self.gpus,
                mem: self.mem.clone(),
                array_parallelism: self.array_parallelism,
                max_retries: self.max_retries,
                setup: self.setup.clone(),
                sbatch_args: self.sbatch_args.clone(),
                ..SlurmOptions::default()
            },
            workdir: self.workdir.clone(),
            mergescope_bin: self.mergescope_bin.clone(),
            poll_seconds: self.poll_seconds,
            dry_run: self.dry_run,
        }
    }
}

/// Shows what the studies' Slurm driver reports in the terminal: lines on stderr (above the
/// bar), a dry run's batch script on stdout, the cells' progress as a bar (none when `quiet`
/// or when no cell is to run).
pub fn shown(quiet: bool) -> impl Fn(Report<'_>) {
    let bar: RefCell<Option<ProgressBar>> = RefCell::new(None);
    move |r| match r {
        Report::Line(text) => match &*bar.borrow() {
            Some(b) => b.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        },
        Report::Script(script) => print!("{script}"),
        Report::Watch { running } => *bar.borrow_mut() = Some(super::progress_bar(quiet || !running)),
        Report::Progress { done, cells, status } => {
            if let Some(b) = &*bar.borrow() {
                b.set_position((done * 1000 / cells.max(1)) as u64);
                b.set_message(status.to_owned());
            }
        }
        Report::Watched => {
            if let Some(b) = bar.borrow_mut().take() {
                b.finish_and_clear();
            }
        }
    }
}

/// A sweep's cell on this node: runs cell `index` of `job` and writes its rows to its result
/// file; returns the fine-tuning runs it made.
pub(super) fn cell(plugin_dirs: &[PathBuf], job: &SweepJob, index: usize) -> anyhow::Result<usize> {
    let key = job
        .cells
        .get(index)
        .with_context(|| format!("cell {index} is out of range: the grid has {} cells", job.cells.len()))?;
    let spec_path = job.out_dir.join(SPEC_FILE);
    let text = std::fs::read_to_string(&spec_path).with_context(|| {
        format!(
            "cannot read '{}' (is the sweep folder on storage this node sees?)",
            spec_path.display()
        )
    })?;
    let spec = SweepSpec::from_toml(&text).with_context(|| format!("in '{}'", spec_path.display()))?;
    let bench = OpenBench::open_dir(spec.kind()?, &job.benchmark)?;
    let mut dirs = plugin_dirs.to_vec();
    dirs.extend(job.plugin_dirs.iter().cloned());
    let choice =
        DeviceChoice::parse(&job.device).with_context(|| format!("device '{}': use cpu, cuda or metal", job.device))?;
    let (device, note) = open_device(choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let sweep = SweepParts {
        spec: &spec,
        bench: bench.as_sweep(),
        out_dir: &job.out_dir,
    };
    with_sweep_inputs(&dirs, &sweep, device, |inputs| cell_of(inputs, job, index, key))?
}

/// What a sweep's inputs are made of, besides its plugins and device.
pub struct SweepParts<'a> {
    /// The specification.
    pub spec: &'a SweepSpec,
    /// The benchmark it starts from.
    pub bench: SweepBench<'a>,
    /// The sweep folder.
    pub out_dir: &'a Path,
}

/// Finds the sweep's method plugins (with `plugin_dirs`) and calls `f` with its inputs on
/// `device`: the one way the CLI and a cell assemble them.
pub fn with_sweep_inputs<T>(
    plugin_dirs: &[PathBuf],
    parts: &SweepParts<'_>,
    device: mergescope_engine::device::Device,
    f: impl FnOnce(&SweepInputs<'_>) -> T,
) -> anyhow::Result<T> {
    let registry = super::registry(plugin_dirs)?;
    let chosen: Vec<Arc<Plugin>> = parts
        .spec
        .methods
        .iter()
        .map(|m| registry.find(&m.plugin).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    let plugins: Vec<&Plugin> = chosen.iter().map(|p| &**p).collect();
    let opts = ExecOptions {
        device,
        ..ExecOptions::default()
    };
    Ok(f(&SweepInputs {
        spec: parts.spec,
        bench: parts.bench,
        plugins: &plugins,
        out_dir: parts.out_dir,
        opts: &opts,
    }))
}

/// Runs cell `index` (`key`) of the sweep `inputs` and writes its result; returns the
/// fine-tuning runs it made.
fn cell_of(inputs: &SweepInputs<'_>, job: &SweepJob, index: usize, key: &str) -> anyhow::Result<usize> {
    let last = std::sync::Mutex::new(String::new());
    let progress = |p: &SweepProgress| {
        let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
        if *l != p.stage {
            eprintln!("  {}", p.stage);
            l.clone_from(&p.stage);
        }
    };
    let run = run_one_cell(inputs, index, key, &progress, super::cancel_on_ctrl_c())?;
    write_cell_result(&job.files(), index, &run)?;
    Ok(run.runs_trained)
}
