//! A sweep whose cells run elsewhere (the Slurm executor, [`crate::grid::slurm`]): the job
//! file a cell reads on its node, each cell's rows in its own result file, and the gathering of
//! every finished cell into the results file, in the order the local executor writes it.

use super::run::{CellRun, RESULTS_FILE, SweepInputs, prepare_cells, rows_per_cell};
use super::store::{ResultsFile, Row, parse_rows, rows_text, write_rows};
use crate::grid::drive::{Report, RunResult, SlurmSettings, drive};
use crate::grid::slurm::{CellFailure, SlurmOptions, SlurmOutcome, SlurmProgress, run_array};
use crate::grid::{CellFiles, CellState, GridJob, GridOutcome, GridPlan, SlurmJob, absolute, settle};
pub use crate::grid::{JOB_FILE, mergescope_env};
use mergescope_engine::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

/// What a cell needs to run on a compute node: every path absolute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepJob {
    /// The sweep folder (its `sweep.toml`, `models/`, `results.csv`).
    pub out_dir: PathBuf,
    /// The work folder (this file, the batch script, `logs/`, `cells/`).
    pub workdir: PathBuf,
    /// The benchmark folder.
    pub benchmark: PathBuf,
    /// `--plugin-dir`s of the submitting command.
    pub plugin_dirs: Vec<PathBuf>,
    /// `cpu`, `cuda` or `metal`.
    pub device: String,
    /// Every cell's key, by index.
    pub cells: Vec<String>,
}

impl GridJob for SweepJob {
    const KIND: &'static str = "sweep";

    fn workdir(&self) -> &Path {
        &self.workdir
    }

    fn cells(&self) -> usize {
        self.cells.len()
    }

    fn key(&self, index: usize) -> String {
        self.cells
            .get(index)
            .map_or("(out of range)", String::as_str)
            .to_owned()
    }
}

/// Writes the rows of a finished cell to its result file (atomically).
pub fn write_cell_result(files: &CellFiles, index: usize, run: &CellRun) -> Result<()> {
    files.write_result(index, rows_text(&run.rows).as_bytes())
}

/// The sweep's cells as its folders tell: finished in the results file, finished in a cell's
/// result file, failed, or missing.
pub struct SweepGrid {
    keys: Vec<String>,
    files: CellFiles,
    results: PathBuf,
    /// Complete cells of the results file, by key.
    in_results: BTreeMap<String, Vec<Row>>,
    /// Cells found finished in their result files (a result never changes once written).
    seen: Mutex<BTreeMap<usize, Vec<Row>>>,
}

impl SweepGrid {
    /// The cells `keys` (in order) of the sweep in `out_dir` whose cell files are `files`.
    pub fn open(out_dir: &Path, keys: Vec<String>, files: CellFiles) -> Result<SweepGrid> {
        let results = out_dir.join(RESULTS_FILE);
        let mut in_results: BTreeMap<String, Vec<Row>> = BTreeMap::new();
        if results.exists() {
            let (_, rows) = ResultsFile::open(&results, &rows_per_cell)?;
            for r in rows {
                in_results.entry(r.cell()).or_default().push(r);
            }
        }
        Ok(SweepGrid {
            keys,
            files,
            results,
            in_results,
            seen: Mutex::new(BTreeMap::new()),
        })
    }

    /// Cells in the sweep.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the sweep has no cells.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The rows of cell `index` if it is finished: from the results file, else from its
    /// result file when that holds exactly the cell's complete rows.
    pub fn rows(&self, index: usize) -> Option<Vec<Row>> {
        let key = self.keys.get(index)?;
        if let Some(rows) = self.in_results.get(key) {
            return Some(rows.clone());
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rows) = seen.get(&index) {
            return Some(rows.clone());
        }
        let text = self.files.read_result(index)?;
        let rows = parse_rows(&text, &self.files.result(index)).ok()?;
        let first = rows.first()?;
        let whole = rows.iter().all(|r| r.cell() == *key) && rows_per_cell(first) == Some(rows.len());
        if whole {
            seen.insert(index, rows.clone());
        }
        whole.then_some(rows)
    }

    /// What cell `index`'s files say.
    pub fn state(&self, index: usize) -> CellState {
        self.files.state(index, self.rows(index).is_some())
    }

    /// Cells finished before any executor ran (in the results file or a cell file).
    pub fn finished(&self) -> Vec<usize> {
        (0..self.len()).filter(|&i| self.rows(i).is_some()).collect()
    }

    /// Cells still to run.
    pub fn todo(&self) -> Vec<usize> {
        (0..self.len()).filter(|&i| self.rows(i).is_none()).collect()
    }

    /// Writes every finished cell's rows to the results file (atomically), in the cells'
    /// order, as the local executor writes them; returns the rows and the cells missing.
    pub fn gather(&self) -> Result<(Vec<Row>, Vec<usize>)> {
        let mut rows = Vec::new();
        let mut missing = Vec::new();
        for i in 0..self.len() {
            match self.rows(i) {
                Some(r) => rows.extend(r),
                None => missing.push(i),
            }
        }
        write_rows(&self.results, &rows)?;
        Ok((rows, missing))
    }
}

/// Where and how a sweep's cells run on Slurm, besides the [`SlurmOptions`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlurmSweepSettings {
    /// Shared folder for the job file, batch script, logs and cell results (default:
    /// `<sweep folder>/slurm`); every node must see it at the same path.
    pub workdir: Option<PathBuf>,
    /// The `mergescope` binary the compute nodes run.
    pub bin: PathBuf,
    /// Plugin folders the cells search besides the standard ones.
    pub plugin_dirs: Vec<PathBuf>,
    /// `cpu`, `cuda` or `metal`, for the cells.
    pub device: String,
    /// Environment the cells get (exported by the batch script).
    pub env: Vec<(String, String)>,
}

/// A sweep made ready for the Slurm executor: its cells planned, the finished ones found.
pub type SlurmSweep = GridPlan<SweepJob>;

/// What a sweep on Slurm came to.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmSweepOutcome {
    /// Cells in the sweep.
    pub cells: usize,
    /// Cells finished before this run.
    pub reused: usize,
    /// What the executor did; `None` when every cell was finished already.
    pub run: Option<SlurmOutcome>,
    /// Whether the run was cancelled (the array job then was too).
    pub cancelled: bool,
    /// The results file the rows were gathered into.
    pub results: PathBuf,
    /// Every finished cell's rows, in the cells' order.
    pub rows: Vec<Row>,
    /// The cells without a result.
    pub missing: Vec<usize>,
    /// Every cell's key, by index.
    pub keys: Vec<String>,
}

impl SlurmSweepOutcome {
    /// The outcome as any grid's (what the lines below are made from).
    pub fn grid(&self) -> GridOutcome {
        GridOutcome {
            cells: self.cells,
            reused: self.reused,
            run: self.run.clone(),
            cancelled: self.cancelled,
            results: self.results.clone(),
            missing: self.missing.clone(),
            keys: self.keys.clone(),
        }
    }

    /// The line saying how many cells ran where, as `mergescope sweep` prints it.
    pub fn summary(&self) -> String {
        self.grid().summary()
    }

    /// What became of a cell that did not finish: its key, Slurm state, tries, error and log.
    pub fn failure_text(&self, f: &CellFailure) -> String {
        self.grid().failure_text(f)
    }

    /// The cells that failed, as [`Self::failure_text`] says them.
    pub fn failures(&self) -> Vec<String> {
        self.grid().failures()
    }
}

impl SlurmSweep {
    /// Plans the cells of `inputs` (preparing the sweep folder) and finds the finished ones.
    pub fn prepare(inputs: &SweepInputs<'_>, settings: &SlurmSweepSettings) -> Result<SlurmSweep> {
        let keys = prepare_cells(inputs)?;
        let out = absolute(inputs.out_dir)?;
        let workdir = absolute(&settings.workdir.clone().unwrap_or_else(|| out.join("slurm")))?;
        let job = SweepJob {
            out_dir: out.clone(),
            workdir,
            benchmark: absolute(inputs.bench.dir())?,
            plugin_dirs: settings
                .plugin_dirs
                .iter()
                .map(|p| absolute(p))
                .collect::<Result<_>>()?,
            device: settings.device.clone(),
            cells: keys.clone(),
        };
        let grid = SweepGrid::open(&out, keys, job.files())?;
        let todo = grid.todo();
        GridPlan::new(job, todo, &settings.bin, settings.env.clone(), grid)
    }

    /// Writes every finished cell's rows to the results file now (while the job runs, for
    /// plots that fill in); returns the rows and the cells missing.
    pub fn gather(&self) -> Result<(Vec<Row>, Vec<usize>)> {
        self.found.gather()
    }
}

impl SlurmJob for SweepJob {
    type Found = SweepGrid;
    type Outcome = SlurmSweepOutcome;

    fn state(plan: &SlurmSweep, index: usize) -> CellState {
        plan.found.state(index)
    }

    /// One array job of the cells still to run; every finished cell's rows are gathered into
    /// the results file.
    fn run(
        plan: &SlurmSweep,
        opts: &SlurmOptions,
        progress: &dyn Fn(&SlurmProgress),
        cancel: &AtomicBool,
    ) -> Result<SlurmSweepOutcome> {
        let ran = plan.submit(|g, todo| run_array(opts, g, todo, progress, cancel))?;
        let gathered = plan.gather();
        let ran = settle(ran)?;
        let (rows, missing) = gathered?;
        let grid = plan.outcome(ran, plan.job.out_dir.join(RESULTS_FILE), missing);
        Ok(SlurmSweepOutcome {
            cells: grid.cells,
            reused: grid.reused,
            run: grid.run,
            cancelled: grid.cancelled,
            results: grid.results,
            rows,
            missing: grid.missing,
            keys: grid.keys,
        })
    }

    fn grid_outcome(outcome: &SlurmSweepOutcome) -> GridOutcome {
        outcome.grid()
    }
}

/// Runs the sweep `inputs` (`name` in the headline) on Slurm as a command asks it, its cells
/// on `device` with the plugins of `plugin_dirs` too: [`drive`]s its missing cells (`report`
/// hears what the user is told); None after a dry run. The caller draws the gathered rows.
pub fn drive_on_slurm(
    inputs: &SweepInputs<'_>,
    slurm: &SlurmSettings,
    plugin_dirs: &[PathBuf],
    device: &str,
    name: &str,
    report: &dyn Fn(Report<'_>),
    cancel: &AtomicBool,
) -> RunResult<Option<SlurmSweepOutcome>> {
    let opts = slurm.options("mergescope-sweep")?;
    let settings = SlurmSweepSettings {
        workdir: slurm.workdir.clone(),
        bin: slurm.node_binary()?,
        plugin_dirs: plugin_dirs.to_vec(),
        device: device.to_owned(),
        env: mergescope_env(),
    };
    let sweep = SlurmSweep::prepare(inputs, &settings)?;
    let headline = format!("sweep '{name}' into {}", sweep.job.out_dir.display());
    Ok(drive(&sweep, &opts, slurm.dry_run, &headline, report, cancel)?.map(|(outcome, _)| outcome))
}

/// Runs the sweep `inputs` on Slurm: its missing cells as one array job running
/// `settings.bin grid run-cell`, watched until done (see [`SlurmSweep::run`]).
pub fn run_on_slurm(
    inputs: &SweepInputs<'_>,
    opts: &SlurmOptions,
    settings: &SlurmSweepSettings,
    progress: &dyn Fn(&SlurmProgress),
    cancel: &AtomicBool,
) -> Result<SlurmSweepOutcome> {
    SlurmSweep::prepare(inputs, settings)?.run(opts, progress, cancel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::sweep::spec::{EXPERT, Hyper};

    fn expert(task: &str, steps: usize) -> Row {
        Row {
            hyper: Hyper {
                lr: 1e-3,
                batch: 16,
                steps,
                data_ratio: 1.0,
                optimizer: "adamw".into(),
                tasks: 0,
            },
            group: None,
            group_tasks: String::new(),
            method: EXPERT.into(),
            task: task.into(),
            accuracy: 0.5,
            loss: 1.0,
            examples: 10,
            seconds: 0.25,
        }
    }

    /// Finished cells come from the results file or from whole, matching cell files; the
    /// gathered results file follows the cells' order whatever order they finished in.
    #[test]
    fn cells_are_found_finished_and_gathered_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let rows = [expert("a", 2), expert("b", 2), expert("a", 4), expert("b", 4)];
        let keys: Vec<String> = rows.iter().map(Row::cell).collect();
        // Cell 2 is in the results file (an earlier local run).
        write_rows(&dir.path().join(RESULTS_FILE), &rows[2..3]).unwrap();
        let files = CellFiles::new(&dir.path().join("cells"));
        files.write_result(3, rows_text(&rows[3..4]).as_bytes()).unwrap();
        // Cell 0's file holds another cell's rows: not a result of cell 0.
        files.write_result(0, rows_text(&rows[1..2]).as_bytes()).unwrap();
        files.write_failure(1, "bad lambda\n").unwrap();
        let grid = SweepGrid::open(dir.path(), keys, files.clone()).unwrap();
        assert_eq!(grid.finished(), [2, 3]);
        assert_eq!(grid.todo(), [0, 1]);
        assert_eq!(grid.state(1), CellState::Failed("bad lambda".into()));
        assert_eq!(grid.state(0), CellState::Missing);
        files.write_result(0, rows_text(&rows[0..1]).as_bytes()).unwrap();
        assert_eq!(grid.state(0), CellState::Done);
        let (gathered, missing) = grid.gather().unwrap();
        assert_eq!(missing, [1]);
        assert_eq!(gathered, [rows[0].clone(), rows[2].clone(), rows[3].clone()]);
        let text = std::fs::read_to_string(dir.path().join(RESULTS_FILE)).unwrap();
        assert_eq!(text, rows_text(&gathered));
    }

    /// The lines the CLI prints and the window shows, for each way a run ends.
    #[test]
    fn an_outcome_says_what_ran_where_and_why_cells_failed() {
        let mut o = SlurmSweepOutcome {
            cells: 4,
            reused: 1,
            run: None,
            cancelled: false,
            results: PathBuf::from("/s/results.csv"),
            rows: vec![],
            missing: vec![],
            keys: vec!["a".into(), "b".into(), "c".into(), "d".into()],
        };
        assert_eq!(o.summary(), "all 4 cells were finished already -> /s/results.csv");
        o.run = Some(SlurmOutcome {
            jobs: vec!["7".into(), "8".into()],
            submitted: vec![1, 2, 3],
            retried: 1,
            failed: vec![CellFailure {
                index: 2,
                state: "FAILED".into(),
                error: Some("bad lambda".into()),
                log: PathBuf::from("/w/logs/cell-2.7.log"),
                tries: 1,
            }],
            first_result: Some(0.5),
        });
        o.missing = vec![2];
        assert_eq!(
            o.summary(),
            "4 cells (1 reused from an earlier run, 3 run in Slurm jobs 7, 8, 1 resubmitted after the scheduler killed them) -> /s/results.csv"
        );
        assert_eq!(
            o.failures(),
            ["cell 2 (c) failed: FAILED after 1 try: bad lambda\n  log: /w/logs/cell-2.7.log"]
        );
        o.cancelled = true;
        assert!(
            o.summary()
                .starts_with("cancelled (the array job was cancelled): 3 of 4 cells are in")
        );
    }

    #[test]
    fn a_job_file_round_trips_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let job = SweepJob {
            out_dir: dir.path().to_path_buf(),
            workdir: dir.path().join("slurm"),
            benchmark: dir.path().join("bench"),
            plugin_dirs: vec![],
            device: "cpu".into(),
            cells: vec!["k0".into(), "k1".into()],
        };
        let path = job.write().unwrap();
        assert_eq!(SweepJob::read(&path).unwrap(), job);
        std::fs::write(&path, "{}").unwrap();
        let e = SweepJob::read(&path).unwrap_err().to_string();
        assert!(
            e.contains("is not a sweep job file") && e.contains("submit the sweep again"),
            "{e}"
        );
    }
}
