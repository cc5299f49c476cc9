//! A landscape whose points are evaluated elsewhere (`mergescope analyze landscape --executor
//! slurm`): the grid's points, in row-major order, cut into cells of a few points each (a row
//! by default), each cell evaluated by one array task, and gathered into the same grid, cache
//! entry and figure as the local executor's. The driver prepares the landscape as the local
//! run does (models loaded, family built), so the figure and the cache key are the local
//! run's; a cell prepares the same landscape on its node and checks that it has the same key
//! (same inputs, unchanged since submission) before it evaluates its points.

use super::slurm::{SlurmOptions, SlurmProgress, run_array};
use super::{CellState, GridJob, GridOutcome, GridPlan, SlurmJob, absolute, settle};
use crate::analysis::landscape::LandscapeGrid;
use crate::analysis::landscape_run::{LandscapeSource, LandscapeSpec, PreparedLandscape, prepare_landscape};
use mergescope_engine::device::{DeviceChoice, open_device};
use mergescope_engine::error::{EngineError, Result};
use mergescope_lab::data::benchmark_tasks;
use mergescope_lab::demo::Benchmark;
use mergescope_lab::evaluate::{EvaluatorSpec, open_normalised};
use mergescope_lab::evaluator::EvalReport;
use mergescope_lab::evaluator::suite::is_suite_path;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

/// What a landscape's cell needs on a compute node: every path absolute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandscapeJob {
    /// The work folder (this file, the batch script, `logs/`, `cells/`).
    pub workdir: PathBuf,
    /// The demo benchmark's folder, or the suite file.
    pub benchmark: String,
    /// Folder of task files, for a benchmark built with `demo build --data DIR`.
    pub data: Option<PathBuf>,
    /// The base checkpoint.
    pub base: PathBuf,
    /// The experts, in task order.
    pub experts: Vec<PathBuf>,
    /// `cpu`, `cuda` or `metal`.
    pub device: String,
    /// The landscape.
    pub spec: LandscapeSpec,
    /// Points per cell (consecutive in row-major order).
    pub points_per_cell: usize,
    /// The landscape's cache key, as the driver computed it (empty until prepared).
    pub key: String,
    /// The grid's columns.
    pub nx: usize,
    /// The grid's rows.
    pub ny: usize,
}

impl GridJob for LandscapeJob {
    const KIND: &'static str = "landscape";

    fn workdir(&self) -> &Path {
        &self.workdir
    }

    fn cells(&self) -> usize {
        (self.nx * self.ny).div_ceil(self.points_per_cell.max(1))
    }

    /// Its points: `point (r, c)` or `points (r, c)–(r, c)`.
    fn key(&self, index: usize) -> String {
        match self.points(index).as_slice() {
            [] => "(out of range)".to_owned(),
            [(r, c)] => format!("point ({r}, {c})"),
            [first, .., last] => format!("points ({}, {})–({}, {})", first.0, first.1, last.0, last.1),
        }
    }
}

impl LandscapeJob {
    /// Every path made absolute (the job is read on other machines).
    pub fn absolute(mut self) -> Result<LandscapeJob> {
        self.workdir = absolute(&self.workdir)?;
        if !is_suite_path(&self.benchmark) || Path::new(&self.benchmark).exists() {
            self.benchmark = absolute(Path::new(&self.benchmark))?.to_string_lossy().into_owned();
        }
        self.data = self.data.as_deref().map(absolute).transpose()?;
        self.base = absolute(&self.base)?;
        self.experts = self.experts.iter().map(|p| absolute(p)).collect::<Result<_>>()?;
        self.spec.through = match &self.spec.through {
            Some((a, b)) => Some((absolute(a)?, absolute(b)?)),
            None => None,
        };
        self.spec.trajectories = self
            .spec
            .trajectories
            .iter()
            .map(|p| absolute(p))
            .collect::<Result<_>>()?;
        self.spec.cache_root = self.spec.cache_root.as_deref().map(absolute).transpose()?;
        Ok(self)
    }

    /// Loads the models and builds the landscape (the same on the driver and on every node).
    pub fn prepare(&self, cancel: &AtomicBool) -> Result<PreparedLandscape> {
        let choice = DeviceChoice::parse(&self.device).ok_or_else(|| {
            EngineError::Param(format!("device '{}' is unknown: use cpu, cuda or metal", self.device))
        })?;
        let (device, note) = open_device(choice);
        if let Some(n) = note {
            eprintln!("warning: {n}");
        }
        if is_suite_path(&self.benchmark) {
            let mut spec = EvaluatorSpec::new(self.benchmark.clone(), &device);
            spec.data.clone_from(&self.data);
            let evaluator = open_normalised(&spec, &self.base, &self.experts, cancel)?;
            let source = LandscapeSource::Evaluator(evaluator.as_ref(), vec![PathBuf::from(&self.benchmark)]);
            prepare_landscape(source, &self.base, &self.experts, &self.spec, &device)
        } else {
            let bench = Benchmark::open(Path::new(&self.benchmark))?;
            let tasks = benchmark_tasks(self.data.as_deref())?;
            let source = LandscapeSource::Benchmark(&bench, &tasks);
            prepare_landscape(source, &self.base, &self.experts, &self.spec, &device)
        }
    }

    /// The points `(row, col)` of cell `index`.
    pub fn points(&self, index: usize) -> Vec<(usize, usize)> {
        let k = self.points_per_cell.max(1);
        let n = self.nx * self.ny;
        (index * k..((index + 1) * k).min(n))
            .map(|i| (i / self.nx, i % self.nx))
            .collect()
    }

    fn result_key(&self, index: usize) -> String {
        format!("{} {}", self.key, GridJob::key(self, index))
    }

    /// Cell `index`'s reports, if it has them for this landscape.
    pub fn result(&self, index: usize) -> Option<Vec<EvalReport>> {
        let reports: Vec<EvalReport> = self.files().read_json(index, &self.result_key(index))?;
        (reports.len() == self.points(index).len()).then_some(reports)
    }

    /// Runs cell `index` on this node (what `mergescope grid run-cell` does for a landscape):
    /// prepares the landscape, checks it is the one submitted, evaluates the cell's points and
    /// writes their reports; returns how many.
    pub fn run_cell(&self, index: usize, cancel: &AtomicBool) -> Result<usize> {
        let points = self.points(index);
        if points.is_empty() {
            return Err(EngineError::Param(format!(
                "cell {index} is out of range: the landscape has {} cells",
                self.cells()
            )));
        }
        let prepared = self.prepare(cancel)?;
        if prepared.key() != self.key {
            return Err(EngineError::Invalid(format!(
                "the landscape this node prepares (key {}) is not the one submitted (key {}): an input file differs here (rewritten since submission, or another file at the same path); submit the landscape again",
                prepared.key(),
                self.key
            )));
        }
        let reports = prepared.evaluate_points(&points, cancel)?;
        self.files().write_json(index, &self.result_key(index), &reports)?;
        Ok(reports.len())
    }
}

/// A landscape made ready for the Slurm executor: prepared as the local run prepares it, its
/// cached points found.
pub type SlurmLandscape = GridPlan<LandscapeJob>;

/// What a landscape plan keeps besides its job: the landscape as prepared here and its points
/// found so far.
pub struct LandscapePoints {
    prepared: PreparedLandscape,
    grid: Mutex<LandscapeGrid>,
    results: PathBuf,
}

/// What a landscape on Slurm came to.
pub struct SlurmLandscapeOutcome {
    /// What became of the cells.
    pub grid: GridOutcome,
    /// Every point found (NaN in the figure where a cell has no result), cached.
    pub landscape: LandscapeGrid,
}

impl SlurmLandscape {
    /// Prepares `job` on this machine (the cells run `bin grid run-cell` with environment
    /// `env`); `use_cache` reuses the cached points and earlier cells' results (else both are
    /// computed afresh); `results` names what the gathered grid is written to, for messages.
    pub fn prepare(
        job: LandscapeJob,
        bin: &Path,
        env: Vec<(String, String)>,
        use_cache: bool,
        results: PathBuf,
        cancel: &AtomicBool,
    ) -> Result<SlurmLandscape> {
        let mut job = job.absolute()?;
        let prepared = job.prepare(cancel)?;
        job.key = prepared.key().to_owned();
        (job.nx, job.ny) = prepared.shape();
        if job.points_per_cell == 0 {
            // A row per cell; a point per cell when there is one row (the TA line).
            job.points_per_cell = if job.ny > 1 { job.nx } else { 1 };
        }
        if !use_cache {
            job.files().clear()?;
        }
        let grid = prepared.initial_grid(use_cache);
        let cached = |i: usize| job.points(i).iter().all(|&(r, c)| grid.cells[r * job.nx + c].is_some());
        let todo = (0..job.cells())
            .filter(|&i| !cached(i) && job.result(i).is_none())
            .collect();
        let found = LandscapePoints {
            prepared,
            grid: Mutex::new(grid),
            results,
        };
        GridPlan::new(job, todo, bin, env, found)
    }

    /// The landscape as prepared here (for its figure).
    pub fn prepared(&self) -> &PreparedLandscape {
        &self.found.prepared
    }

    /// Puts every finished cell's reports into the grid; true when cell `index` is finished.
    fn take(&self, index: usize) -> bool {
        let mut grid = self.found.grid.lock().unwrap_or_else(|e| e.into_inner());
        let points = self.job.points(index);
        if points.iter().all(|&(r, c)| grid.cells[r * self.job.nx + c].is_some()) {
            return true;
        }
        let Some(reports) = self.job.result(index) else {
            return false;
        };
        for ((r, c), report) in points.into_iter().zip(reports) {
            grid.cells[r * self.job.nx + c] = Some(report);
        }
        true
    }
}

impl SlurmJob for LandscapeJob {
    type Found = LandscapePoints;
    type Outcome = SlurmLandscapeOutcome;

    fn state(plan: &SlurmLandscape, index: usize) -> CellState {
        plan.job.files().state(index, plan.take(index))
    }

    fn run(
        plan: &SlurmLandscape,
        opts: &SlurmOptions,
        progress: &dyn Fn(&SlurmProgress),
        cancel: &AtomicBool,
    ) -> Result<SlurmLandscapeOutcome> {
        let ran = plan.submit(|g, todo| run_array(opts, g, todo, progress, cancel))?;
        let missing: Vec<usize> = (0..plan.job.cells()).filter(|&i| !plan.take(i)).collect();
        let landscape = plan.found.grid.lock().unwrap_or_else(|e| e.into_inner()).clone();
        plan.found.prepared.save(&landscape)?;
        Ok(SlurmLandscapeOutcome {
            grid: plan.outcome(settle(ran)?, plan.found.results.clone(), missing),
            landscape,
        })
    }

    fn grid_outcome(outcome: &SlurmLandscapeOutcome) -> GridOutcome {
        outcome.grid.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::landscape_run::LandscapeKind;

    #[test]
    fn points_are_cut_into_cells_in_row_major_order() {
        let mut job = LandscapeJob {
            workdir: PathBuf::from("/w"),
            benchmark: "/b".into(),
            data: None,
            base: PathBuf::from("/b/base.safetensors"),
            experts: vec![],
            device: "cpu".into(),
            spec: LandscapeSpec::defaults(LandscapeKind::Plane),
            points_per_cell: 3,
            key: "k".into(),
            nx: 3,
            ny: 2,
        };
        assert_eq!(job.cells(), 2);
        assert_eq!(job.points(1), [(1, 0), (1, 1), (1, 2)]);
        assert_eq!(job.key(0), "points (0, 0)–(0, 2)");
        job.points_per_cell = 4;
        assert_eq!(job.cells(), 2);
        assert_eq!(job.points(1), [(1, 1), (1, 2)]);
        assert!(job.points(2).is_empty());
        job.points_per_cell = 1;
        assert_eq!(job.key(5), "point (1, 2)");
        let dir = tempfile::tempdir().unwrap();
        job.workdir = dir.path().to_path_buf();
        assert_eq!(LandscapeJob::read(&job.write().unwrap()).unwrap(), job);
    }
}
