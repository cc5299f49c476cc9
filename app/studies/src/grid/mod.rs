//! Grids of independent cells (a sweep's cells now; comparisons and landscapes later) and the
//! executors that run them: `local` (in this process, one cell after another) and `slurm`
//! (one Slurm array job, a task per cell, see [`slurm`]).
//!
//! An executor that runs cells elsewhere needs each cell to leave its result where the driver
//! finds it: [`CellFiles`] keeps one result file per cell (written atomically, so a cell killed
//! mid-write leaves nothing) and one failure file with the error of a cell that failed.

pub mod slurm;

use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::writer::write_atomic;
use std::path::{Path, PathBuf};

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
