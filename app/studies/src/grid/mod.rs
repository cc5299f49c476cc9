//! Grids of independent cells (a sweep's cells, a comparison's merges, a landscape's points)
//! and the executors that run them: `local` (in this process) and `slurm` (one Slurm array job,
//! a task per cell, see [`slurm`]).
//!
//! An executor that runs cells elsewhere needs each cell to leave its result where the driver
//! finds it: [`CellFiles`] keeps one result file per cell (written atomically, so a cell killed
//! mid-write leaves nothing) and one failure file with the error of a cell that failed. The job
//! file ([`write_job`], `grid.json` in the work folder) tells a cell on its node what to run; its
//! `kind` (`sweep`, `compare`, `landscape`) picks the code, so every array task runs the one
//! door `mergescope grid run-cell GRID.json INDEX`. Each kind's job struct is a [`GridJob`] (one
//! writer and reader of the job file, one place for its cells' files and keys). [`GridPlan`] is
//! what the CLI drives: a grid prepared for Slurm, whatever its kind
//! ([`crate::scaling::sweep::executor::SlurmSweep`], [`compare::SlurmCompare`],
//! [`landscape::SlurmLandscape`]; what differs between them is their [`SlurmJob`]), through the
//! one driver [`drive::drive`], and [`GridOutcome`] what it says at the end.

pub mod compare;
pub mod drive;
pub mod landscape;
pub mod slurm;

use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::writer::write_atomic;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use slurm::{CellFailure, SlurmGrid, SlurmOptions, SlurmOutcome, SlurmProgress, sbatch_script};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The job file's name in the work folder.
pub const JOB_FILE: &str = "grid.json";

/// The `MERGESCOPE_*` variables of this process: what locates data, plugins and caches, which
/// travels with the job.
pub fn mergescope_env() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| k.starts_with("MERGESCOPE_")).collect()
}

/// `p` made absolute (a job file is read on other machines).
pub fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(|e| EngineError::io("cannot make absolute", p, e))
}

/// Writes `job` to `<workdir>/grid.json` atomically, tagged with its `kind`; returns the path.
pub fn write_job<T: Serialize>(workdir: &Path, kind: &str, job: &T) -> Result<PathBuf> {
    std::fs::create_dir_all(workdir).map_err(|e| EngineError::io("cannot create", workdir, e))?;
    let path = workdir.join(JOB_FILE);
    let mut value = serde_json::to_value(job)
        .map_err(|e| EngineError::Invalid(format!("cannot write the {kind} job file: {e}")))?;
    if let Value::Object(m) = &mut value {
        m.insert("kind".to_owned(), Value::from(kind));
    }
    let text = serde_json::to_string_pretty(&value)
        .map_err(|e| EngineError::Invalid(format!("cannot write the {kind} job file: {e}")))?;
    write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// The kind of the job file at `path` (`sweep` for files written before kinds) and its fields.
pub fn read_job_value(path: &Path) -> Result<(String, Value)> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        EngineError::io(
            "cannot read the grid's job file (is the work folder on storage this node sees?)",
            path,
            e,
        )
    })?;
    let mut value: Value = serde_json::from_str(&text).map_err(|e| {
        EngineError::Invalid(format!(
            "'{}' is not a grid job file ({e}); submit the grid again",
            path.display()
        ))
    })?;
    let kind = match &mut value {
        Value::Object(m) => match m.remove("kind") {
            Some(Value::String(k)) => k,
            _ => "sweep".to_owned(),
        },
        _ => {
            return Err(EngineError::Invalid(format!(
                "'{}' is not a grid job file (no JSON object); submit the grid again",
                path.display()
            )));
        }
    };
    Ok((kind, value))
}

/// Reads the job file at `path`, which must be of `kind`.
pub fn read_job<T: DeserializeOwned>(path: &Path, kind: &str) -> Result<T> {
    let (found, value) = read_job_value(path)?;
    if found != kind {
        return Err(EngineError::Invalid(format!(
            "'{}' is a {found} job file, not a {kind} one; run `mergescope grid run-cell` on it",
            path.display()
        )));
    }
    serde_json::from_value(value).map_err(|e| {
        EngineError::Invalid(format!(
            "'{}' is not a {kind} job file ({e}); submit the {kind} again",
            path.display()
        ))
    })
}

/// The command an array task runs (its index is appended): `BIN grid run-cell GRID.json`.
pub fn cell_command(bin: &Path, job_path: &Path) -> Result<Vec<String>> {
    Ok(vec![
        absolute(bin)?.to_string_lossy().into_owned(),
        "grid".into(),
        "run-cell".into(),
        absolute(job_path)?.to_string_lossy().into_owned(),
    ])
}

/// A grid's job file: what its cells read on their nodes (`grid.json` in the work folder, tagged
/// with the grid's kind), and where their results go. The sweep's, the comparison's and the
/// landscape's job structs are written, read and named through it.
pub trait GridJob: Serialize + DeserializeOwned {
    /// The job file's kind: `sweep`, `compare` or `landscape`.
    const KIND: &'static str;

    /// The work folder (the job file, the batch script, `logs/`, `cells/`).
    fn workdir(&self) -> &Path;

    /// Cells in the grid.
    fn cells(&self) -> usize;

    /// Cell `index`'s key, as the CLI's lines name it (`(out of range)` past the last cell).
    fn key(&self, index: usize) -> String;

    /// Writes the job file to `<workdir>/grid.json` atomically; returns its path.
    fn write(&self) -> Result<PathBuf> {
        write_job(self.workdir(), Self::KIND, self)
    }

    /// Reads a job file, which must be of this kind.
    fn read(path: &Path) -> Result<Self> {
        read_job(path, Self::KIND)
    }

    /// The job file's path.
    fn path(&self) -> PathBuf {
        self.workdir().join(JOB_FILE)
    }

    /// The cells' result and failure files.
    fn files(&self) -> CellFiles {
        CellFiles::new(&self.workdir().join("cells"))
    }

    /// Every cell's key, by index.
    fn keys(&self) -> Vec<String> {
        (0..self.cells()).map(|i| self.key(i)).collect()
    }
}

/// What a kind of grid does on Slurm beyond what [`GridPlan`] does for every kind: how its
/// cells' results are told, what it submits and what it gathers.
pub trait SlurmJob: GridJob + Sized {
    /// What the plan keeps of the cells besides their files (a sweep's rows, a landscape's
    /// points).
    type Found;
    /// What a run comes to (the grid's own gathered results included).
    type Outcome;

    /// What cell `index`'s files say.
    fn state(plan: &GridPlan<Self>, index: usize) -> CellState;

    /// Writes the job file and returns the batch script of the cells that would be submitted
    /// first (submits nothing): by default every cell still to run.
    fn dry_run(plan: &GridPlan<Self>, opts: &SlurmOptions) -> Result<String> {
        plan.script(opts, &plan.todo)
    }

    /// Submits the cells still to run (see [`GridPlan::submit`]), watches them and gathers every
    /// finished cell. A cancelled run is an outcome, not an error.
    fn run(
        plan: &GridPlan<Self>,
        opts: &SlurmOptions,
        progress: &dyn Fn(&SlurmProgress),
        cancel: &AtomicBool,
    ) -> Result<Self::Outcome>;

    /// What the outcome says of the cells.
    fn grid_outcome(outcome: &Self::Outcome) -> GridOutcome;
}

/// A grid made ready for the Slurm executor, whatever its kind: its job, the cells still to
/// run (finished ones found), the command and environment of its array tasks, and what its kind
/// found of the cells. What the CLI drives for sweeps, comparisons and landscapes alike.
pub struct GridPlan<J: SlurmJob> {
    /// The job file's contents.
    pub job: J,
    /// The cells still to run.
    pub todo: Vec<usize>,
    command: Vec<String>,
    env: Vec<(String, String)>,
    pub(crate) found: J::Found,
}

impl<J: SlurmJob> GridPlan<J> {
    /// `job` ready to run cells `todo` with `bin grid run-cell` and environment `env` (the
    /// job's paths already absolute).
    pub(crate) fn new(
        job: J,
        todo: Vec<usize>,
        bin: &Path,
        env: Vec<(String, String)>,
        found: J::Found,
    ) -> Result<GridPlan<J>> {
        let command = cell_command(bin, &job.path())?;
        Ok(GridPlan {
            job,
            todo,
            command,
            env,
            found,
        })
    }

    /// Cells in the grid.
    pub fn cells(&self) -> usize {
        self.job.cells()
    }

    /// Cells finished before any executor ran.
    pub fn reused(&self) -> usize {
        self.cells() - self.todo.len()
    }

    /// The job file's path.
    pub fn job_path(&self) -> PathBuf {
        self.job.path()
    }

    /// The work folder.
    pub fn workdir(&self) -> &Path {
        self.job.workdir()
    }

    /// What cell `index`'s files say.
    pub fn state(&self, index: usize) -> CellState {
        J::state(self, index)
    }

    /// Writes the job file and returns the batch script of the cells that would be submitted
    /// first (submits nothing).
    pub fn dry_run(&self, opts: &SlurmOptions) -> Result<String> {
        J::dry_run(self, opts)
    }

    /// Submits the cells still to run, watches them (`progress` hears each poll; `cancel`
    /// cancels the array job) and gathers every finished cell. A cancelled run is an outcome,
    /// not an error.
    pub fn run(
        &self,
        opts: &SlurmOptions,
        progress: &dyn Fn(&SlurmProgress),
        cancel: &AtomicBool,
    ) -> Result<J::Outcome> {
        J::run(self, opts, progress, cancel)
    }

    /// What `outcome` says of the cells.
    pub fn grid_outcome(outcome: &J::Outcome) -> GridOutcome {
        J::grid_outcome(outcome)
    }

    /// Calls `f` with the grid as the Slurm executor sees it.
    fn with_grid<T>(&self, f: impl FnOnce(&SlurmGrid<'_>) -> T) -> T {
        let state = |i: usize| self.state(i);
        let g = SlurmGrid {
            workdir: self.job.workdir(),
            command: self.command.clone(),
            env: self.env.clone(),
            state: &state,
        };
        f(&g)
    }

    /// Writes the job file and returns the batch script of cells `indices`.
    pub fn script(&self, opts: &SlurmOptions, indices: &[usize]) -> Result<String> {
        self.job.write()?;
        Ok(self.with_grid(|g| sbatch_script(opts, g, indices)))
    }

    /// Writes the job file and runs the cells still to run with `execute` (one array job, or
    /// several in stages); None when every cell was finished already. The executor's result is
    /// returned as it came, for [`settle`] once the kind has gathered what finished.
    pub fn submit(
        &self,
        execute: impl FnOnce(&SlurmGrid<'_>, &[usize]) -> Result<SlurmOutcome>,
    ) -> Result<Option<Result<SlurmOutcome>>> {
        if self.todo.is_empty() {
            return Ok(None);
        }
        self.job.write()?;
        Ok(Some(self.with_grid(|g| execute(g, &self.todo))))
    }

    /// What became of the cells: `ran` as [`settle`] returned it, `results` where the gathered
    /// results went, `missing` the cells without a result.
    pub fn outcome(&self, ran: (Option<SlurmOutcome>, bool), results: PathBuf, missing: Vec<usize>) -> GridOutcome {
        let (run, cancelled) = ran;
        GridOutcome {
            cells: self.cells(),
            reused: self.reused(),
            run,
            cancelled,
            results,
            missing,
            keys: self.job.keys(),
        }
    }
}

/// What an executor's run (as [`GridPlan::submit`] returned it) came to: what it did (None
/// when nothing was submitted) and whether it was cancelled. A cancelled run is an outcome,
/// any other error is returned.
pub fn settle(ran: Option<Result<SlurmOutcome>>) -> Result<(Option<SlurmOutcome>, bool)> {
    match ran {
        None => Ok((None, false)),
        Some(Ok(o)) => Ok((Some(o), false)),
        Some(Err(EngineError::Cancelled)) => Ok((Some(SlurmOutcome::default()), true)),
        Some(Err(e)) => Err(e),
    }
}

/// What a grid on Slurm came to, cell by cell.
#[derive(Clone, Debug, PartialEq)]
pub struct GridOutcome {
    /// Cells in the grid.
    pub cells: usize,
    /// Cells finished before this run.
    pub reused: usize,
    /// What the executor did; `None` when every cell was finished already.
    pub run: Option<SlurmOutcome>,
    /// Whether the run was cancelled (the array job then was too).
    pub cancelled: bool,
    /// Where the gathered results went.
    pub results: PathBuf,
    /// The cells without a result.
    pub missing: Vec<usize>,
    /// Every cell's key, by index.
    pub keys: Vec<String>,
}

impl GridOutcome {
    /// The line saying how many cells ran where.
    pub fn summary(&self) -> String {
        let Some(o) = &self.run else {
            return format!(
                "all {} cells were finished already -> {}",
                self.cells,
                self.results.display()
            );
        };
        if self.cancelled {
            return format!(
                "cancelled (the array job was cancelled): {} of {} cells are in {}; run the same command again to resume",
                self.cells - self.missing.len(),
                self.cells,
                self.results.display()
            );
        }
        format!(
            "{} cells ({} reused from an earlier run, {} run in Slurm job{} {}{}) -> {}",
            self.cells,
            self.reused,
            o.submitted.len(),
            if o.jobs.len() == 1 { "" } else { "s" },
            o.jobs.join(", "),
            if o.retried > 0 {
                format!(", {} resubmitted after the scheduler killed them", o.retried)
            } else {
                String::new()
            },
            self.results.display()
        )
    }

    /// What became of a cell that did not finish: its key, Slurm state, tries, error and log.
    pub fn failure_text(&self, f: &CellFailure) -> String {
        let what = f.error.as_deref().unwrap_or("no result and no error written");
        let key = self.keys.get(f.index).map_or("?", String::as_str);
        if f.tries == 0 {
            return format!("cell {} ({key}) was not submitted: {what}", f.index);
        }
        format!(
            "cell {} ({key}) failed: {} after {} tr{}: {what}\n  log: {}",
            f.index,
            f.state,
            f.tries,
            if f.tries == 1 { "y" } else { "ies" },
            f.log.display()
        )
    }

    /// The cells that failed, as [`Self::failure_text`] says them.
    pub fn failures(&self) -> Vec<String> {
        self.run
            .iter()
            .flat_map(|o| &o.failed)
            .map(|f| self.failure_text(f))
            .collect()
    }

    /// The command's exit status: 130 when cancelled, 1 when cells have no result, else 0.
    pub fn exit_status(&self) -> u8 {
        if self.cancelled {
            130
        } else if self.missing.is_empty() {
            0
        } else {
            1
        }
    }
}

/// Where a grid's cells run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExecutorKind {
    /// In this process, one cell after another (the default).
    #[default]
    Local,
    /// One Slurm array job, a task per cell.
    Slurm,
}

impl ExecutorKind {
    /// `local` or `slurm`.
    pub fn parse(s: &str) -> Result<ExecutorKind> {
        match s {
            "local" => Ok(ExecutorKind::Local),
            "slurm" => Ok(ExecutorKind::Slurm),
            _ => Err(EngineError::Param(format!(
                "executor '{s}' is unknown: use local or slurm"
            ))),
        }
    }
}

/// What a cell's files say about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CellState {
    /// Its result is there.
    Done,
    /// It ran and failed with this error (not retried: the same inputs fail again).
    Failed(String),
    /// No result and no error: never ran, still running, or killed.
    Missing,
}

/// The result and failure files of a grid's cells: `<dir>/<index>.out` and `<dir>/<index>.failed`.
#[derive(Clone, Debug)]
pub struct CellFiles {
    dir: PathBuf,
}

impl CellFiles {
    /// The cells' files in `dir` (created when the first is written).
    pub fn new(dir: &Path) -> CellFiles {
        CellFiles { dir: dir.to_path_buf() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Cell `index`'s result file.
    pub fn result(&self, index: usize) -> PathBuf {
        self.dir.join(format!("{index}.out"))
    }

    /// Cell `index`'s failure file.
    pub fn failure(&self, index: usize) -> PathBuf {
        self.dir.join(format!("{index}.failed"))
    }

    fn create_dir(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| EngineError::io("cannot create", &self.dir, e))
    }

    /// Writes cell `index`'s result atomically and clears an earlier failure.
    pub fn write_result(&self, index: usize, bytes: &[u8]) -> Result<()> {
        self.create_dir()?;
        write_atomic(&self.result(index), bytes)?;
        match std::fs::remove_file(self.failure(index)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(EngineError::io("cannot remove", self.failure(index), e))
            }
            _ => Ok(()),
        }
    }

    /// Records that cell `index` failed with `error` (atomically).
    pub fn write_failure(&self, index: usize, error: &str) -> Result<()> {
        self.create_dir()?;
        write_atomic(&self.failure(index), error.as_bytes())
    }

    /// Cell `index`'s result, if it has one.
    pub fn read_result(&self, index: usize) -> Option<String> {
        std::fs::read_to_string(self.result(index)).ok()
    }

    /// The error cell `index` failed with, if it failed.
    pub fn read_failure(&self, index: usize) -> Option<String> {
        std::fs::read_to_string(self.failure(index)).ok()
    }

    /// Writes cell `index`'s result `value` as JSON under `key` (what the cell computed, so a
    /// result left by another grid in the same folder is never taken for this one's).
    pub fn write_json<T: Serialize>(&self, index: usize, key: &str, value: &T) -> Result<()> {
        let doc = serde_json::json!({ "key": key, "value": value });
        let text = serde_json::to_string(&doc)
            .map_err(|e| EngineError::Invalid(format!("cannot write the result of cell {index}: {e}")))?;
        self.write_result(index, text.as_bytes())
    }

    /// Cell `index`'s JSON result, if it has one computed for `key`.
    pub fn read_json<T: DeserializeOwned>(&self, index: usize, key: &str) -> Option<T> {
        let text = self.read_result(index)?;
        let mut doc: Value = serde_json::from_str(&text).ok()?;
        (doc.get("key")?.as_str()? == key).then_some(())?;
        serde_json::from_value(doc.get_mut("value")?.take()).ok()
    }

    /// What cell `index`'s files say, its result being valid when `done`.
    pub fn state(&self, index: usize, done: bool) -> CellState {
        if done {
            CellState::Done
        } else if let Some(e) = self.read_failure(index) {
            CellState::Failed(e.trim().to_owned())
        } else {
            CellState::Missing
        }
    }

    /// Removes every cell's files (a grid computed afresh).
    pub fn clear(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(EngineError::io("cannot remove", &self.dir, e)),
            _ => Ok(()),
        }
    }
}

/// `indices` (sorted, distinct) as Slurm writes an array: `0-3,5,7-9`.
pub fn ranges(indices: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        out.push(if end == start {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_files_are_written_whole_and_a_result_clears_the_failure() {
        let dir = tempfile::tempdir().unwrap();
        let files = CellFiles::new(&dir.path().join("cells"));
        assert_eq!(files.read_result(3), None);
        files.write_failure(3, "bad lambda").unwrap();
        assert_eq!(files.read_failure(3).as_deref(), Some("bad lambda"));
        files.write_result(3, b"rows").unwrap();
        assert_eq!(files.read_result(3).as_deref(), Some("rows"));
        assert_eq!(files.read_failure(3), None);
        // No temporary file is left beside the result.
        let names: Vec<_> = std::fs::read_dir(files.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["3.out"]);
    }

    #[test]
    fn indices_compress_to_slurm_ranges() {
        assert_eq!(ranges(&[0, 1, 2, 3, 5, 7, 8, 9]), "0-3,5,7-9");
        assert_eq!(ranges(&[4]), "4");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ExecutorKind::parse("slurm").unwrap(), ExecutorKind::Slurm);
        assert!(
            ExecutorKind::parse("pbs")
                .unwrap_err()
                .to_string()
                .contains("local or slurm")
        );
    }
}
