//! `mergescope sweep --executor slurm`: the sweep's missing cells as one Slurm array job, a
//! task per cell running `mergescope sweep run-cell GRID.json INDEX` (the same per-cell code as
//! the local executor), watched until done, killed cells retried, every cell's rows gathered
//! into the same results file and plots. See docs/slurm.md.

use anyhow::{Context as _, bail};
use clap::Args;
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::error::EngineError;
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::loader::Plugin;
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::Benchmark;
use mergescope_studies::grid::slurm::{SlurmOptions, SlurmProgress};
use mergescope_studies::scaling::sweep::executor::{
    SlurmSweep, SlurmSweepSettings, SweepJob, mergescope_env, write_cell_result,
};
use mergescope_studies::scaling::sweep::run::SPEC_FILE;
use mergescope_studies::scaling::sweep::store::Row;
use mergescope_studies::scaling::sweep::{SweepInputs, SweepProgress, SweepSpec, run_one_cell};
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

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("cannot make '{}' absolute", p.display()))
}

fn options(a: &SlurmArgs) -> anyhow::Result<SlurmOptions> {
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
        job_name: "mergescope-sweep".to_owned(),
        setup: a.setup.clone(),
        sbatch_args: a.sbatch_args.clone(),
    })
}

/// How the sweep command runs the Slurm executor.
pub struct SlurmRun<'a> {
    /// The Slurm options.
    pub args: &'a SlurmArgs,
    /// `--plugin-dir`s.
    pub plugin_dirs: &'a [PathBuf],
    /// `--device`, for the cells.
    pub device: &'a str,
    /// No progress bar.
    pub quiet: bool,
    /// The sweep's name, for messages.
    pub name: &'a str,
    /// Draws the plots and fits from the gathered rows.
    pub draw: &'a dyn Fn(&[Row]) -> anyhow::Result<()>,
}

/// Runs the sweep `inputs` on Slurm: submits its missing cells, watches them, gathers the rows
/// (the work is the lab's [`SlurmSweep`]; this prints it).
pub fn run(r: &SlurmRun<'_>, inputs: &SweepInputs<'_>, cancel: &AtomicBool) -> anyhow::Result<ExitCode> {
    let SlurmRun {
        args: a,
        plugin_dirs,
        device,
        quiet,
        name,
        draw,
    } = *r;
    let opts = options(a)?;
    let bin = match &a.mergescope_bin {
        Some(b) => absolute(b)?,
        None => std::env::current_exe().context("cannot find this executable's path: give --mergescope-bin")?,
    };
    let settings = SlurmSweepSettings {
        workdir: a.workdir.clone(),
        bin,
        plugin_dirs: plugin_dirs.to_vec(),
        device: device.to_owned(),
        env: mergescope_env(),
    };
    let sweep = SlurmSweep::prepare(inputs, &settings)?;
    let cells = sweep.cells();
    if a.dry_run {
        let script = sweep.dry_run(&opts)?;
        if sweep.todo.is_empty() {
            eprintln!("all {cells} cells are finished: nothing to submit");
        } else {
            eprintln!(
                "{} of {cells} cells to submit (job file {}); the script sbatch would get:",
                sweep.todo.len(),
                sweep.job_path().display()
            );
            print!("{script}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "sweep '{name}' into {} on Slurm (work folder {})",
        sweep.job.out_dir.display(),
        sweep.job.workdir.display()
    );
    let reused = sweep.reused();
    let bar = super::progress_bar(quiet || sweep.todo.is_empty());
    let progress = |p: &SlurmProgress| {
        if let Some(e) = &p.event {
            bar.suspend(|| eprintln!("{e}"));
        }
        let done = reused + p.done;
        bar.set_position((done * 1000 / cells.max(1)) as u64);
        bar.set_message(format!(
            "{done}/{cells} cells (job {}: {} running, {} pending)",
            p.job, p.running, p.pending
        ));
    };
    let outcome = sweep.run(&opts, &progress, cancel);
    bar.finish_and_clear();
    let outcome = outcome?;
    eprintln!("{}", outcome.summary());
    if outcome.cancelled {
        return Ok(ExitCode::from(130));
    }
    let Some(run) = &outcome.run else {
        draw(&outcome.rows)?;
        return Ok(ExitCode::SUCCESS);
    };
    if let Some(s) = run.first_result {
        eprintln!("first cell result {s:.1} s after submission");
    }
    for f in outcome.failures() {
        eprintln!("{f}");
    }
    draw(&outcome.rows)?;
    if outcome.missing.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "{} of {cells} cells have no result; fix what their logs say and run the same command again: only they are submitted",
            outcome.missing.len(),
        );
        Ok(ExitCode::FAILURE)
    }
}

/// `mergescope sweep run-cell GRID.json INDEX`: runs one cell on this node; its rows go to its
/// result file, an error to its failure file (then the exit code is 1).
pub fn run_cell(plugin_dirs: &[PathBuf], job_path: &Path, index: usize) -> anyhow::Result<ExitCode> {
    let job = SweepJob::read(job_path)?;
    let files = job.files();
    let started = std::time::Instant::now();
    eprintln!(
        "cell {index} of {} on {}: {}",
        job.cells.len(),
        std::env::var("SLURMD_NODENAME").unwrap_or_else(|_| "this machine".into()),
        job.cells.get(index).map_or("(out of range)", String::as_str)
    );
    match cell(plugin_dirs, &job, index) {
        Ok(runs) => {
            eprintln!(
                "cell {index} finished in {:.1} s ({runs} fine-tuning runs made): {}",
                started.elapsed().as_secs_f64(),
                files.result(index).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        // Killed by the scheduler (scancel, time limit): no failure of the cell's own, so
        // the driver sees the task's Slurm state and submits it again.
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

/// Runs cell `index` of `job` and writes its result; returns the fine-tuning runs it made.
fn cell(plugin_dirs: &[PathBuf], job: &SweepJob, index: usize) -> anyhow::Result<usize> {
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
    let bench = Benchmark::open(&job.benchmark)?;
    let mut dirs = plugin_dirs.to_vec();
    dirs.extend(job.plugin_dirs.iter().cloned());
    let registry = super::registry(&dirs)?;
    let chosen: Vec<Arc<Plugin>> = spec
        .methods
        .iter()
        .map(|m| registry.find(&m.plugin).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    let plugins: Vec<&Plugin> = chosen.iter().map(|p| &**p).collect();
    let tasks = benchmark_tasks(None)?;
    let choice =
        DeviceChoice::parse(&job.device).with_context(|| format!("device '{}': use cpu, cuda or metal", job.device))?;
    let (device, note) = open_device(choice);
    if let Some(n) = note {
        eprintln!("warning: {n}");
    }
    let opts = ExecOptions {
        device,
        ..ExecOptions::default()
    };
    let inputs = SweepInputs {
        spec: &spec,
        bench: &bench,
        tasks: &tasks,
        plugins: &plugins,
        out_dir: &job.out_dir,
        opts: &opts,
    };
    let last = std::sync::Mutex::new(String::new());
    let progress = |p: &SweepProgress| {
        let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
        if *l != p.stage {
            eprintln!("  {}", p.stage);
            l.clone_from(&p.stage);
        }
    };
    let run = run_one_cell(&inputs, index, key, &progress, super::cancel_on_ctrl_c())?;
    write_cell_result(&job.files(), index, &run)?;
    Ok(run.runs_trained)
}
