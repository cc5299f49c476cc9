//! A sweep whose cells run elsewhere (the Slurm executor, [`crate::grid::slurm`]): the job
//! file a cell reads on its node, each cell's rows in its own result file, and the gathering of
//! every finished cell into the results file, in the order the local executor writes it.

use super::run::{CellRun, RESULTS_FILE, rows_per_cell};
use super::store::{ResultsFile, Row, parse_rows, rows_text, write_rows};
use crate::grid::{CellFiles, CellState};
use mergescope_engine::error::{EngineError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The job file's name in the work folder.
pub const JOB_FILE: &str = "grid.json";

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

impl SweepJob {
    /// Writes the job to `<workdir>/grid.json` atomically; returns the path.
    pub fn write(&self) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.workdir).map_err(|e| EngineError::io("cannot create", &self.workdir, e))?;
        let path = self.workdir.join(JOB_FILE);
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| EngineError::Invalid(format!("cannot write the sweep's job file: {e}")))?;
        mergescope_engine::writer::write_atomic(&path, text.as_bytes())?;
        Ok(path)
    }

    /// Reads a job file.
    pub fn read(path: &Path) -> Result<SweepJob> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            EngineError::io(
                "cannot read the grid's job file (is the work folder on storage this node sees?)",
                path,
                e,
            )
        })?;
        serde_json::from_str(&text).map_err(|e| {
            EngineError::Invalid(format!(
                "'{}' is not a sweep job file ({e}); submit the sweep again",
                path.display()
            ))
        })
    }

    /// The cells' result and failure files.
    pub fn files(&self) -> CellFiles {
        CellFiles::new(&self.workdir.join("cells"))
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
        if self.rows(index).is_some() {
            CellState::Done
        } else if let Some(e) = self.files.read_failure(index) {
            CellState::Failed(e.trim().to_owned())
        } else {
            CellState::Missing
        }
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
