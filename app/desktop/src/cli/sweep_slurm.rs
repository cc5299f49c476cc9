//! The Slurm executor's door for every grid: `--executor slurm` of `mergescope sweep`,
//! `mergescope compare` and `mergescope analyze landscape` (one set of options, [`SlurmArgs`],
//! and one driver, [`drive`]: the grid's missing cells as one Slurm array job, watched until
//! done, killed cells retried, failures reported with their logs), with `--quiet` and
//! `--executor` ([`GridRunArgs`]), and
//! `mergescope grid run-cell GRID.json INDEX`, what every array task runs (the job file's kind
//! picks the sweep's, comparison's or landscape's per-cell code, the same as the local
//! executor's). See docs/slurm.md.

use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::loader::Plugin;
use mergescope_studies::grid::slurm::{SlurmOptions, SlurmProgress};
use mergescope_studies::grid::{ExecutorKind, GridJob, GridOutcome, GridPlan, SlurmJob};
use mergescope_studies::scaling::sweep::executor::{
    SlurmSweep, SlurmSweepSettings, SweepJob, mergescope_env, write_cell_result,
};
use mergescope_studies::scaling::sweep::run::SPEC_FILE;
use mergescope_studies::scaling::sweep::store::Row;
use mergescope_studies::scaling::sweep::{OpenBench, SweepBench, SweepInputs, SweepProgress, SweepSpec, run_one_cell};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot make '{}' absolute", p.display()))
}

/// The binary the compute nodes run: --mergescope-bin, else this executable.
pub fn node_binary(a: &SlurmArgs) -> anyhow::Result<PathBuf> {
    match &a.mergescope_bin {
        Some(b) => absolute(b),
        None => std::env::current_exe().context("cannot find this executable's path: give --mergescope-bin"),
    }
}

/// The Slurm options of `a`, for an array job named `job_name`.
pub fn options(a: &SlurmArgs, job_name: &str) -> anyhow::Result<SlurmOptions> {
    if !(a.poll_seconds.is_finite() && a.poll_seconds > 0.0) {
        bail!("--poll-seconds {}: give a positive number of seconds", a.poll_seconds);
    }
    if a.cpus_per_task == 0 || a.array_parallelism == Some(0) {
        bail!("--cpus-per-task and --array-parallelism must be at least 1");
    }
    Ok(SlurmOptions {
        partition: a.partition.clone(),
        time: a.time.clone(),
        cpus_per_task: a.cpus_per_task,
        gpus: a.gpus,
        mem: a.mem.clone(),
        array_parallelism: a.array_parallelism,
        max_retries: a.max_retries,
        poll: Duration::from_secs_f64(a.poll_seconds),
        job_name: job_name.to_owned(),
        setup: a.setup.clone(),
        sbatch_args: a.sbatch_args.clone(),
    })
}

/// How the sweep command runs the Slurm executor.
pub struct SlurmRun<'a> {
    /// `--quiet` and the Slurm options.
    pub args: &'a GridRunArgs,
    /// `--plugin-dir`s.
    pub plugin_dirs: &'a [PathBuf],
    /// `--device`, for the cells.
    pub device: &'a str,
    /// The sweep's name, for messages.
    pub name: &'a str,
    /// Draws the plots and fits from the gathered rows.
    pub draw: &'a dyn Fn(&[Row]) -> anyhow::Result<()>,
}

/// Drives `plan` on Slurm (`headline` says what it is): with --dry-run prints the batch script
/// and returns None; else submits the missing cells, shows their progress (unless --quiet),
/// and prints what became of them (the summary, the submit-to-first-result time, each failure
/// with its log). The caller writes the gathered results and chooses the exit code (see
/// [`exit_code`]).
pub fn drive<J: SlurmJob>(
    a: &GridRunArgs,
    plan: &GridPlan<J>,
    opts: &SlurmOptions,
    headline: &str,
    cancel: &AtomicBool,
) -> anyhow::Result<Option<(J::Outcome, GridOutcome)>> {
    let cells = plan.cells();
    let todo = &plan.todo;
    if a.slurm.dry_run {
        let script = plan.dry_run(opts)?;
        if todo.is_empty() {
            eprintln!("all {cells} cells are finished: nothing to submit");
        } else {
            eprintln!(
                "{} of {cells} cells to submit (job file {}); the script sbatch would get:",
                todo.len(),
                plan.job_path().display()
            );
            print!("{script}");
        }
        return Ok(None);
    }
    eprintln!("{headline} on Slurm (work folder {})", plan.workdir().display());
    let reused = cells - todo.len();
    let bar = super::progress_bar(a.quiet || todo.is_empty());
    // Cells done in earlier array jobs of this run (a later stage, a resubmission).
    let jobs = std::cell::RefCell::new((String::new(), 0usize, 0usize));
    let progress = |p: &SlurmProgress| {
        if let Some(e) = &p.event {
            bar.suspend(|| eprintln!("{e}"));
        }
        let mut j = jobs.borrow_mut();
        if j.0 != p.job {
            j.1 += j.2;
            j.0.clone_from(&p.job);
        }
        j.2 = p.done;
        let done = reused + j.1 + j.2;
        bar.set_position((done * 1000 / cells.max(1)) as u64);
        bar.set_message(format!(
            "{done}/{cells} cells (job {}: {} running, {} pending)",
            p.job, p.running, p.pending
        ));
    };
    let outcome = plan.run(opts, &progress, cancel);
    bar.finish_and_clear();
    let outcome = outcome?;
    let grid = GridPlan::<J>::grid_outcome(&outcome);
    eprintln!("{}", grid.summary());
    if grid.cancelled {
        return Ok(Some((outcome, grid)));
    }
    if let Some(s) = grid.run.as_ref().and_then(|r| r.first_result) {
        eprintln!("first cell result {s:.1} s after submission");
    }
    for f in grid.failures() {
        eprintln!("{f}");
    }
    if !grid.missing.is_empty() {
        eprintln!(
            "{} of {cells} cells have no result; fix what their logs say and run the same command again: only they are submitted",
            grid.missing.len(),
        );
    }
    Ok(Some((outcome, grid)))
}

/// 130 when cancelled, 1 when cells have no result, else success.
pub fn exit_code(grid: &GridOutcome) -> ExitCode {
    if grid.cancelled {
        ExitCode::from(130)
    } else if grid.missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the sweep `inputs` on Slurm: submits its missing cells, watches them, gathers the rows
/// (the work is the lab's [`SlurmSweep`]; this prints it).
pub fn run(r: &SlurmRun<'_>, inputs: &SweepInputs<'_>, cancel: &AtomicBool) -> anyhow::Result<ExitCode> {
    let SlurmRun {
        args: a,
        plugin_dirs,
        device,
        name,
        draw,
    } = *r;
    let opts = options(&a.slurm, "mergescope-sweep")?;
    let settings = SlurmSweepSettings {
        workdir: a.slurm.workdir.clone(),
        bin: node_binary(&a.slurm)?,
        plugin_dirs: plugin_dirs.to_vec(),
        device: device.to_owned(),
        env: mergescope_env(),
    };
    let sweep = SlurmSweep::prepare(inputs, &settings)?;
    let headline = format!("sweep '{name}' into {}", sweep.job.out_dir.display());
    let Some((outcome, grid)) = drive(a, &sweep, &opts, &headline, cancel)? else {
        return Ok(ExitCode::SUCCESS);
    };
    if !grid.cancelled {
        draw(&outcome.rows)?;
    }
    Ok(exit_code(&grid))
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
