//! A grid driven on Slurm as a command asks it (`--executor slurm` of `mergescope sweep`,
//! `compare` and `analyze landscape`): the executor's settings checked ([`SlurmSettings`]), and
//! the one driver, [`drive`]: with a dry run the batch script, else the grid's missing cells as
//! Slurm array jobs, watched until done, and what became of them. What the user is told goes to
//! a [`Report`] callback (the CLI prints it), so every grid kind says it in the same words.

use super::slurm::{SlurmOptions, SlurmProgress};
use super::{GridOutcome, GridPlan, SlurmJob};
use mergescope_engine::error::{EngineError, Result};
use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Why a grid could not be run: an error of the engine, the lab or the executor, or a step that
/// failed on an OS error, said as the step with the OS error as its cause.
#[derive(Debug)]
pub enum RunError {
    /// An error of the engine, the lab or the executor.
    Engine(EngineError),
    /// A step failed on an OS error.
    Os {
        /// What failed, e.g. "cannot create the output folder 'out'".
        step: String,
        /// The OS error.
        cause: std::io::Error,
    },
}

impl RunError {
    /// `step` failed on `cause`.
    pub fn os(step: impl Into<String>, cause: std::io::Error) -> RunError {
        RunError::Os {
            step: step.into(),
            cause,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Engine(e) => fmt::Display::fmt(e, f),
            RunError::Os { step, .. } => f.write_str(step),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Engine(e) => e.source(),
            RunError::Os { cause, .. } => Some(cause),
        }
    }
}

impl From<EngineError> for RunError {
    fn from(e: EngineError) -> Self {
        RunError::Engine(e)
    }
}

/// Result of a grid's run.
pub type RunResult<T> = std::result::Result<T, RunError>;

/// `p` made absolute, the error naming it (a job file is read on other machines).
pub fn absolute_path(p: &Path) -> RunResult<PathBuf> {
    std::path::absolute(p).map_err(|e| RunError::os(format!("cannot make '{}' absolute", p.display()), e))
}

/// The Slurm executor's settings as a command takes them (the CLI's `--partition`, `--time`, …,
/// `--dry-run`): the array job's [`SlurmOptions`] once checked, and where the grid's files and
/// the nodes' binary are.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmSettings {
    /// The array job as asked for (partition, time, CPUs, GPUs, memory, parallelism, retries,
    /// setup lines, more `#SBATCH` options); [`Self::options`] checks it and sets its poll
    /// interval and name.
    pub job: SlurmOptions,
    /// Shared folder for the job file, batch script, logs and cell results (None: the grid
    /// kind's default).
    pub workdir: Option<PathBuf>,
    /// The mergescope binary the compute nodes run (None: this executable).
    pub mergescope_bin: Option<PathBuf>,
    /// Seconds between two looks at the queue.
    pub poll_seconds: f64,
    /// Print the batch script of the cells still to run, and submit nothing.
    pub dry_run: bool,
}

impl SlurmSettings {
    /// The binary the compute nodes run: [`Self::mergescope_bin`], else this executable.
    pub fn node_binary(&self) -> RunResult<PathBuf> {
        match &self.mergescope_bin {
            Some(b) => absolute_path(b),
            None => std::env::current_exe()
                .map_err(|e| RunError::os("cannot find this executable's path: give --mergescope-bin", e)),
        }
    }

    /// The options of an array job named `job_name`, checked.
    pub fn options(&self, job_name: &str) -> Result<SlurmOptions> {
        if !(self.poll_seconds.is_finite() && self.poll_seconds > 0.0) {
            return Err(EngineError::Param(format!(
                "--poll-seconds {}: give a positive number of seconds",
                self.poll_seconds
            )));
        }
        if self.job.cpus_per_task == 0 || self.job.array_parallelism == Some(0) {
            return Err(EngineError::Param(
                "--cpus-per-task and --array-parallelism must be at least 1".into(),
            ));
        }
        Ok(SlurmOptions {
            poll: Duration::from_secs_f64(self.poll_seconds),
            job_name: job_name.to_owned(),
            ..self.job.clone()
        })
    }
}

/// What [`drive`] tells the user (the CLI prints lines to stderr, the script to stdout, and
/// shows the progress as a bar).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Report<'a> {
    /// A line.
    Line(&'a str),
    /// The batch script a dry run would submit, whole.
    Script(&'a str),
    /// The cells are watched from now on; `running` is false when none is to run (nothing
    /// will progress).
    Watch {
        /// Whether cells are to run.
        running: bool,
    },
    /// Where the grid stands.
    Progress {
        /// Cells finished, those of earlier runs and array jobs included.
        done: usize,
        /// Cells in the grid.
        cells: usize,
        /// What the array job is doing.
        status: &'a str,
    },
    /// The watch is over.
    Watched,
}

/// Drives `plan` on Slurm with `opts` (`headline` says what it is): with `dry_run` reports the
/// batch script and returns None; else submits the missing cells, reports their progress and
/// what became of them (the summary, the submit-to-first-result time, each failure with its
/// log). The caller writes the gathered results and chooses the exit code (see
/// [`GridOutcome::exit_status`]).
pub fn drive<J: SlurmJob>(
    plan: &GridPlan<J>,
    opts: &SlurmOptions,
    dry_run: bool,
    headline: &str,
    report: &dyn Fn(Report<'_>),
    cancel: &AtomicBool,
) -> Result<Option<(J::Outcome, GridOutcome)>> {
    let line = |text: &str| report(Report::Line(text));
    let cells = plan.cells();
    let todo = &plan.todo;
    if dry_run {
        let script = plan.dry_run(opts)?;
        if todo.is_empty() {
            line(&format!("all {cells} cells are finished: nothing to submit"));
        } else {
            line(&format!(
                "{} of {cells} cells to submit (job file {}); the script sbatch would get:",
                todo.len(),
                plan.job_path().display()
            ));
            report(Report::Script(&script));
        }
        return Ok(None);
    }
    line(&format!(
        "{headline} on Slurm (work folder {})",
        plan.workdir().display()
    ));
    let reused = plan.reused();
    report(Report::Watch {
        running: !todo.is_empty(),
    });
    // The array job being watched, the cells done in earlier ones of this run (a later stage, a
    // resubmission), and those done in it.
    let jobs = RefCell::new((String::new(), 0usize, 0usize));
    let progress = |p: &SlurmProgress| {
        if let Some(e) = &p.event {
            line(e);
        }
        let mut j = jobs.borrow_mut();
        if j.0 != p.job {
            j.1 += j.2;
            j.0.clone_from(&p.job);
        }
        j.2 = p.done;
        let done = reused + j.1 + j.2;
        let status = format!(
            "{done}/{cells} cells (job {}: {} running, {} pending)",
            p.job, p.running, p.pending
        );
        report(Report::Progress {
            done,
            cells,
            status: &status,
        });
    };
    let outcome = plan.run(opts, &progress, cancel);
    report(Report::Watched);
    let outcome = outcome?;
    let grid = GridPlan::<J>::grid_outcome(&outcome);
    line(&grid.summary());
    if grid.cancelled {
        return Ok(Some((outcome, grid)));
    }
    if let Some(s) = grid.run.as_ref().and_then(|r| r.first_result) {
        line(&format!("first cell result {s:.1} s after submission"));
    }
    for f in grid.failures() {
        line(&f);
    }
    if !grid.missing.is_empty() {
        line(&format!(
            "{} of {cells} cells have no result; fix what their logs say and run the same command again: only they are submitted",
            grid.missing.len(),
        ));
    }
    Ok(Some((outcome, grid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SlurmSettings {
        SlurmSettings {
            job: SlurmOptions {
                partition: Some("gpu".into()),
                cpus_per_task: 2,
                mem: Some("4G".into()),
                array_parallelism: Some(3),
                setup: vec!["module load cuda".into()],
                ..SlurmOptions::default()
            },
            workdir: None,
            mergescope_bin: Some(PathBuf::from("bin/mergescope")),
            poll_seconds: 0.5,
            dry_run: false,
        }
    }

    /// The options are the settings', named; a poll interval that is not a positive number and
    /// zero CPUs or parallelism are refused, naming the flags; the node binary is made absolute.
    #[test]
    fn settings_are_checked_into_options() {
        let s = settings();
        let o = s.options("mergescope-compare").unwrap();
        assert_eq!(o.job_name, "mergescope-compare");
        assert_eq!((o.cpus_per_task, o.array_parallelism), (2, Some(3)));
        assert_eq!(o.poll, Duration::from_millis(500));
        assert_eq!(o.setup, ["module load cuda"]);
        for poll in [0.0, -1.0, f64::NAN] {
            let bad = SlurmSettings {
                poll_seconds: poll,
                ..settings()
            };
            assert_eq!(
                bad.options("x").unwrap_err().to_string(),
                format!("--poll-seconds {poll}: give a positive number of seconds")
            );
        }
        let mut bad = settings();
        bad.job.array_parallelism = Some(0);
        assert!(bad.options("x").unwrap_err().to_string().contains("at least 1"));
        let bin = s.node_binary().unwrap();
        assert!(bin.is_absolute() && bin.ends_with("bin/mergescope"));
    }

    /// 130 when cancelled, 1 when cells have no result, else 0.
    #[test]
    fn the_exit_status_says_cancelled_missing_or_done() {
        let grid = GridOutcome {
            cells: 2,
            reused: 0,
            run: None,
            cancelled: false,
            results: PathBuf::from("results.csv"),
            missing: Vec::new(),
            keys: vec!["a".into(), "b".into()],
        };
        assert_eq!(grid.exit_status(), 0);
        let missing = GridOutcome {
            missing: vec![1],
            ..grid.clone()
        };
        assert_eq!(missing.exit_status(), 1);
        let cancelled = GridOutcome {
            cancelled: true,
            ..missing
        };
        assert_eq!(cancelled.exit_status(), 130);
    }

    /// An OS error's step is the message and the OS error its cause, as the CLI prints them; an
    /// engine error reads as itself.
    #[test]
    fn run_errors_read_as_their_step_and_cause() {
        let e = RunError::os("cannot create the output folder 'out'", std::io::Error::other("denied"));
        assert_eq!(e.to_string(), "cannot create the output folder 'out'");
        assert_eq!(
            std::error::Error::source(&e).map(ToString::to_string).as_deref(),
            Some("denied")
        );
        let e = RunError::from(EngineError::Param("bad".into()));
        assert_eq!(e.to_string(), "bad");
        assert!(std::error::Error::source(&e).is_none());
        assert!(
            absolute_path(Path::new(""))
                .unwrap_err()
                .to_string()
                .contains("cannot make '' absolute")
        );
    }
}
