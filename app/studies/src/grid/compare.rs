//! A comparison whose cells run elsewhere (`mergescope compare --executor slurm`): the table's
//! merges as a grid of independent cells, each one merge and evaluation: the base on the test
//! data (`pretrained`), each (method, λ) candidate of a λ search on the calibration data, and
//! each method's final merge (with the λ its candidates chose, or its defaults) on the test
//! data. A final merge needs its method's candidates first (and, for a suite, the pretrained
//! cell, which computes the experts' reference scores), so it goes in a later array job. The
//! gathered table is the one the local executor writes: same values, same order (only the
//! `seconds` column, the time the cells took, differs). [`compare_on_slurm`] is what the
//! command runs: the grid planned from the methods and models, driven on Slurm.

use super::drive::{Report, RunError, RunResult, SlurmSettings, absolute_path, drive};
use super::slurm::{SlurmOptions, SlurmProgress, run_in_stages};
use super::{CellState, GridJob, GridOutcome, GridPlan, SlurmJob, absolute, mergescope_env, settle};
use crate::compare::{
    CompareConfig, CompareInputs, CompareTable, LambdaChoice, MethodResult, choose_lambda, extend_lambda_search,
    final_merge, lambda_grid, lambda_max, lambda_trial, leave_out_one_expert,
};
use mergescope_engine::device::Device;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::merge::ExecOptions;
use mergescope_engine::plugin::loader::Plugin;
use mergescope_lab::demo::resolve_benchmark;
use mergescope_lab::evaluate::suite_models;
use mergescope_lab::evaluator::suite::{Suite, is_suite_path};
use mergescope_lab::evaluator::{EvalReport, References};
use mergescope_lab::nn::Arch;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// One cell of a comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CompareCell {
    /// The base on the test data (and, for a suite, the experts' reference scores).
    Pretrained,
    /// Method `method` (an index into the job's methods) merged with λ = `lambda`, scored on the
    /// calibration data.
    Lambda {
        /// The method.
        method: usize,
        /// The candidate λ.
        lambda: f64,
    },
    /// Method `method`'s merge of the table, scored on the test data.
    Final {
        /// The method.
        method: usize,
    },
}

/// A method of the comparison, as the driver found it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompareMethod {
    /// Plugin id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Whether it is a model-level method.
    pub model_level: bool,
    /// The λ values searched on calibration data (None: it keeps its default λ).
    pub lambdas: Option<Vec<f64>>,
}

/// What a comparison's cell needs on a compute node: every path absolute.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareJob {
    /// Folder of the merged checkpoints and the tables.
    pub out_dir: PathBuf,
    /// The work folder (this file, the batch script, `logs/`, `cells/`, `scratch/`).
    pub workdir: PathBuf,
    /// The demo benchmark's folder, or the suite file.
    pub benchmark: String,
    /// A suite's base, when given on the command line.
    pub base: Option<PathBuf>,
    /// A suite's experts, when given on the command line.
    pub experts: Vec<PathBuf>,
    /// `--plugin-dir`s of the submitting command.
    pub plugin_dirs: Vec<PathBuf>,
    /// `cpu`, `cuda` or `metal`.
    pub device: String,
    /// Seed of every merge.
    pub seed: u64,
    /// The λ grid asked for.
    pub lambda_grid: Vec<f64>,
    /// Whether a method's final cell continues its search above the grid
    /// ([`CompareConfig::extend_lambda`]).
    #[serde(default)]
    pub extend_lambda: bool,
    /// The methods, in the table's order.
    pub methods: Vec<CompareMethod>,
    /// Every cell, by index.
    pub cells: Vec<CompareCell>,
}

impl GridJob for CompareJob {
    const KIND: &'static str = "compare";

    fn workdir(&self) -> &Path {
        &self.workdir
    }

    fn cells(&self) -> usize {
        self.cells.len()
    }

    /// `pretrained`, `ties λ=0.3`, `ties`.
    fn key(&self, index: usize) -> String {
        let id = |m: usize| self.methods.get(m).map_or("?", |x| x.id.as_str());
        match self.cells.get(index) {
            Some(CompareCell::Pretrained) => "pretrained".to_owned(),
            Some(CompareCell::Lambda { method, lambda }) => format!("{} λ={lambda}", id(*method)),
            Some(CompareCell::Final { method }) => id(*method).to_owned(),
            None => "(out of range)".to_owned(),
        }
    }
}

/// What a cell computed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CellResult {
    /// The base's evaluation and what the table's heading needs.
    Pretrained {
        /// Benchmark folder or suite file.
        source: PathBuf,
        /// What the models are.
        kind: String,
        /// Task names, in column order.
        tasks: Vec<String>,
        /// Each expert's score on its own task, in task order.
        individual: Vec<f64>,
        /// The base on the test data.
        report: EvalReport,
    },
    /// A λ candidate's mean calibration accuracy.
    Lambda {
        /// Mean calibration accuracy.
        accuracy: f64,
        /// Seconds the cell took.
        seconds: f64,
    },
    /// A method's merge of the table.
    Final {
        /// The λ it ran with (None: defaults).
        lambda: Option<f64>,
        /// The (λ, mean calibration accuracy) pairs it tried above the grid before merging.
        #[serde(default)]
        extension: Vec<(f64, f64)>,
        /// Parameters as the plugin resolved them.
        params: Value,
        /// The test evaluation.
        report: EvalReport,
        /// Seconds the cell took.
        seconds: f64,
    },
}

impl CompareJob {
    /// The cells of a comparison of `methods`: the base first, then each method's λ
    /// candidates and its final merge.
    pub fn plan_cells(methods: &[CompareMethod]) -> Vec<CompareCell> {
        let mut cells = vec![CompareCell::Pretrained];
        for (m, method) in methods.iter().enumerate() {
            for &lambda in method.lambdas.iter().flatten() {
                cells.push(CompareCell::Lambda { method: m, lambda });
            }
            cells.push(CompareCell::Final { method: m });
        }
        cells
    }

    /// The comparison's settings, as the local executor takes them.
    pub fn config(&self) -> CompareConfig {
        CompareConfig {
            out_dir: self.out_dir.clone(),
            overwrite: true,
            lambda_grid: self.lambda_grid.clone(),
            extend_lambda: self.extend_lambda,
            seed: self.seed,
        }
    }

    /// Whether the models are a suite's (whose final merges read the experts' references
    /// from the pretrained cell).
    pub fn is_suite(&self) -> bool {
        is_suite_path(&self.benchmark)
    }

    /// What every result depends on besides its cell (models, seed, device): a result written
    /// for other inputs in the same work folder is not taken for this comparison's.
    fn fingerprint(&self) -> String {
        let identity = serde_json::json!([
            self.out_dir,
            self.benchmark,
            self.base,
            self.experts,
            self.device,
            self.seed
        ]);
        let digest = Sha256::digest(identity.to_string().as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    fn result_key(&self, index: usize) -> String {
        format!("{} {}", self.fingerprint(), self.key(index))
    }

    /// Cell `index`'s result, if it has one for these inputs.
    pub fn result(&self, index: usize) -> Option<CellResult> {
        self.files().read_json(index, &self.result_key(index))
    }

    /// Writes cell `index`'s result.
    pub fn write_result(&self, index: usize, result: &CellResult) -> Result<()> {
        self.files().write_json(index, &self.result_key(index), result)
    }

    /// What cell `index`'s files say.
    pub fn state(&self, index: usize) -> CellState {
        self.files().state(index, self.result(index).is_some())
    }

    /// The cells whose results cell `index` reads.
    pub fn needs(&self, index: usize) -> Vec<usize> {
        let Some(CompareCell::Final { method }) = self.cells.get(index) else {
            return Vec::new();
        };
        let mut needs: Vec<usize> = if self.is_suite() { vec![0] } else { vec![] };
        needs.extend(
            self.cells
                .iter()
                .enumerate()
                .filter(|(_, c)| matches!(c, CompareCell::Lambda { method: m, .. } if m == method))
                .map(|(i, _)| i),
        );
        needs
    }

    /// The experts' references the pretrained cell found (a suite's final merges need them).
    pub fn references(&self) -> Result<References> {
        match self.result(0) {
            Some(CellResult::Pretrained { tasks, individual, .. }) => Ok(References(
                tasks
                    .into_iter()
                    .zip(individual)
                    .filter(|(_, v)| !v.is_nan())
                    .collect(),
            )),
            _ => Err(EngineError::Invalid(
                "the comparison's pretrained cell (0) has no result, and the final merges need its reference scores; submit the comparison again".into(),
            )),
        }
    }

    /// The λ method `method`'s candidates chose (None: it keeps its default), from their
    /// results.
    pub fn lambda_choice(&self, method: usize) -> Result<Option<LambdaChoice>> {
        let mut tried = Vec::new();
        for (i, cell) in self.cells.iter().enumerate() {
            if let CompareCell::Lambda { method: m, lambda } = cell
                && *m == method
            {
                match self.result(i) {
                    Some(CellResult::Lambda { accuracy, .. }) => tried.push((*lambda, accuracy)),
                    _ => {
                        return Err(EngineError::Invalid(format!(
                            "cell {i} ({}) has no result, and the final merge needs every λ candidate's; submit the comparison again",
                            self.key(i)
                        )));
                    }
                }
            }
        }
        Ok((!tried.is_empty()).then(|| choose_lambda(tried)))
    }

    /// Where cell `index` writes its λ candidates' merges (the work folder's `scratch/`, made if
    /// missing).
    fn scratch(&self, index: usize) -> Result<PathBuf> {
        let dir = self.workdir.join("scratch");
        std::fs::create_dir_all(&dir).map_err(|e| EngineError::io("cannot create", &dir, e))?;
        Ok(dir.join(format!("cell-{index}.safetensors")))
    }

    /// Runs cell `index` with `plugin` (its method's, for a λ or final cell) on `inputs`; the
    /// result is written by the caller ([`Self::write_result`]).
    pub fn run_cell(
        &self,
        index: usize,
        plugin: Option<&Plugin>,
        inputs: &CompareInputs<'_>,
        opts: &ExecOptions,
        progress: &(dyn Fn(&str) + Sync),
        cancel: &AtomicBool,
    ) -> Result<CellResult> {
        let started = Instant::now();
        let cell = self.cells.get(index).ok_or_else(|| {
            EngineError::Param(format!(
                "cell {index} is out of range: the comparison has {} cells",
                self.cells.len()
            ))
        })?;
        let need_plugin = || {
            plugin.ok_or_else(|| EngineError::Bug(format!("cell {index} ({}) was given no plugin", self.key(index))))
        };
        let cfg = self.config();
        Ok(match cell {
            CompareCell::Pretrained => {
                progress("evaluating the base");
                CellResult::Pretrained {
                    source: inputs.source.clone(),
                    kind: inputs.kind.clone(),
                    tasks: inputs.test.task_names(),
                    individual: inputs.individual.clone(),
                    report: inputs.test.evaluate_file(&inputs.base, cancel)?,
                }
            }
            CompareCell::Lambda { lambda, .. } => {
                let scratch = self.scratch(index)?;
                let accuracy = lambda_trial(need_plugin()?, inputs, &cfg, *lambda, &scratch, opts, progress, cancel);
                let _ = std::fs::remove_file(&scratch);
                CellResult::Lambda {
                    accuracy: accuracy?,
                    seconds: started.elapsed().as_secs_f64(),
                }
            }
            CompareCell::Final { method } => {
                let choice = match self.lambda_choice(*method)? {
                    Some(c) if self.extend_lambda => {
                        let scratch = self.scratch(index)?;
                        let c = extend_lambda_search(c, lambda_max(need_plugin()?), |l| {
                            lambda_trial(need_plugin()?, inputs, &cfg, l, &scratch, opts, progress, cancel)
                        });
                        let _ = std::fs::remove_file(&scratch);
                        Some(c?)
                    }
                    c => c,
                };
                let extension = choice
                    .as_ref()
                    .map(|c| c.grid[c.grid.len() - c.extended..].to_vec())
                    .unwrap_or_default();
                let lambda = choice.map(|c| c.value);
                let (params, report) = final_merge(need_plugin()?, inputs, &cfg, lambda, opts, progress, cancel)?;
                CellResult::Final {
                    extension,
                    lambda,
                    params,
                    report,
                    seconds: started.elapsed().as_secs_f64(),
                }
            }
        })
    }

    /// The table of the finished cells, as the local executor makes it; None while the
    /// pretrained cell has no result. A method whose cells failed is a row with the error.
    pub fn table(&self) -> Option<CompareTable> {
        let Some(CellResult::Pretrained {
            source,
            kind,
            tasks,
            individual,
            report,
        }) = self.result(0)
        else {
            return None;
        };
        let mut rows = Vec::new();
        for (m, method) in self.methods.iter().enumerate() {
            let mut seconds = 0.0;
            let mut error = None;
            for (i, cell) in self.cells.iter().enumerate() {
                let mine = match cell {
                    CompareCell::Lambda { method: x, .. } | CompareCell::Final { method: x } => *x == m,
                    CompareCell::Pretrained => false,
                };
                if !mine {
                    continue;
                }
                match self.result(i) {
                    Some(CellResult::Lambda { seconds: s, .. } | CellResult::Final { seconds: s, .. }) => seconds += s,
                    _ if error.is_none() => {
                        error = Some(match self.files().read_failure(i) {
                            Some(e) => format!("cell {i} ({}): {}", self.key(i), e.trim()),
                            None => format!("cell {i} ({}) has no result", self.key(i)),
                        });
                    }
                    _ => {}
                }
            }
            let final_index = self.cells.iter().position(|c| *c == CompareCell::Final { method: m });
            let (params, outcome) = match (final_index.and_then(|i| self.result(i)), error) {
                (Some(CellResult::Final { params, report, .. }), None) => (params, Ok(report)),
                (_, e) => (
                    Value::Null,
                    Err(e.unwrap_or_else(|| format!("{} has no final merge", method.id))),
                ),
            };
            let extension = match final_index.and_then(|i| self.result(i)) {
                Some(CellResult::Final { extension, .. }) => extension,
                _ => Vec::new(),
            };
            let lambda = self.lambda_choice(m).ok().flatten().map(|c| {
                let extended = extension.len();
                let mut tried = c.grid;
                tried.extend(extension);
                LambdaChoice {
                    extended,
                    ..choose_lambda(tried)
                }
            });
            rows.push(MethodResult {
                id: method.id.clone(),
                name: method.name.clone(),
                model_level: method.model_level,
                lambda,
                params,
                outcome,
                seconds,
                output: self.out_dir.join(format!("{}.safetensors", method.id)),
            });
        }
        Some(CompareTable {
            benchmark: source,
            arch: kind,
            tasks,
            pretrained: report,
            individual,
            rows,
        })
    }
}

/// A comparison made ready for the Slurm executor.
pub type SlurmCompare = GridPlan<CompareJob>;

/// What a comparison on Slurm came to.
#[derive(Clone, Debug)]
pub struct SlurmCompareOutcome {
    /// What became of the cells.
    pub grid: GridOutcome,
    /// The gathered table (None while the pretrained cell has no result).
    pub table: Option<CompareTable>,
}

impl SlurmCompare {
    /// `job` ready to run its unfinished cells with `bin grid run-cell` and environment `env`
    /// (the results of earlier runs are reused where they were computed for the same inputs).
    pub fn prepare(mut job: CompareJob, bin: &Path, env: Vec<(String, String)>) -> Result<SlurmCompare> {
        job.out_dir = absolute(&job.out_dir)?;
        job.workdir = absolute(&job.workdir)?;
        job.plugin_dirs = job.plugin_dirs.iter().map(|p| absolute(p)).collect::<Result<_>>()?;
        let todo = (0..job.cells.len()).filter(|&i| job.result(i).is_none()).collect();
        GridPlan::new(job, todo, bin, env, ())
    }

    fn first_stage(&self) -> Vec<usize> {
        self.todo
            .iter()
            .copied()
            .filter(|&i| self.job.needs(i).iter().all(|&d| !self.todo.contains(&d)))
            .collect()
    }
}

impl SlurmJob for CompareJob {
    type Found = ();
    type Outcome = SlurmCompareOutcome;

    fn state(plan: &SlurmCompare, index: usize) -> CellState {
        plan.job.state(index)
    }

    /// The first stage's script (the final merges wait for their candidates' results).
    fn dry_run(plan: &SlurmCompare, opts: &SlurmOptions) -> Result<String> {
        let first = plan.first_stage();
        let mut script = plan.script(opts, &first)?;
        if first.len() < plan.todo.len() {
            script.push_str(&format!(
                "# Then, once these have results, a second array job of the final merges: {}\n",
                super::ranges(
                    &plan
                        .todo
                        .iter()
                        .copied()
                        .filter(|i| !first.contains(i))
                        .collect::<Vec<_>>()
                )
            ));
        }
        Ok(script)
    }

    fn run(
        plan: &SlurmCompare,
        opts: &SlurmOptions,
        progress: &dyn Fn(&SlurmProgress),
        cancel: &AtomicBool,
    ) -> Result<SlurmCompareOutcome> {
        let needs = |i: usize| plan.job.needs(i);
        let ran = plan.submit(|g, todo| run_in_stages(opts, g, todo, &needs, progress, cancel))?;
        let ran = settle(ran)?;
        let missing = (0..plan.job.cells.len())
            .filter(|&i| plan.job.result(i).is_none())
            .collect();
        Ok(SlurmCompareOutcome {
            grid: plan.outcome(ran, plan.job.out_dir.join("results.csv"), missing),
            table: plan.job.table(),
        })
    }

    fn grid_outcome(outcome: &SlurmCompareOutcome) -> GridOutcome {
        outcome.grid.clone()
    }
}

/// Where a comparison's models come from.
#[derive(Clone, Copy, Debug)]
pub enum CompareModels<'a> {
    /// A suite's, with the base and experts given on the command line (no base: the suite's own).
    Suite {
        /// The suite.
        suite: &'a Suite,
        /// The base given.
        base: Option<&'a Path>,
        /// The experts given.
        experts: &'a [PathBuf],
    },
    /// A demo benchmark's.
    Demo {
        /// Its name or folder.
        benchmark: &'a str,
        /// Its backbone.
        arch: Arch,
    },
}

/// A comparison to run as a grid of cells on Slurm (`mergescope compare --executor slurm`).
pub struct CompareOnSlurm<'a> {
    /// The methods, in the table's order.
    pub plugins: Vec<&'a Plugin>,
    /// Whether the methods were named (else those that merge the base with exactly one expert
    /// are left out when there are more).
    pub named: bool,
    /// The models.
    pub models: CompareModels<'a>,
    /// Output folder, λ grid, seed; `overwrite` replaces checkpoints of an earlier comparison.
    pub config: CompareConfig,
    /// `--plugin-dir`s, which the cells search too.
    pub plugin_dirs: &'a [PathBuf],
    /// `cpu`, `cuda` or `metal`, for the cells.
    pub device: &'a str,
    /// The work folder.
    pub workdir: PathBuf,
    /// Whether the work folder holds this comparison's job file from an earlier run (which it
    /// resumes: its checkpoints are replaced).
    pub resuming: bool,
    /// The Slurm executor's settings.
    pub slurm: &'a SlurmSettings,
}

/// What a comparison on Slurm came to.
#[derive(Clone, Debug)]
pub struct ComparedOnSlurm {
    /// The cells and the gathered table.
    pub outcome: SlurmCompareOutcome,
    /// Whether λ was chosen on calibration data (else methods kept their defaults).
    pub calibration: bool,
}

/// Runs the comparison `r` as a grid of cells on Slurm: finds how many experts its models have
/// and whether they have calibration data (on `device`), leaves out the methods that cannot run
/// on them, plans the cells and [`drive`]s them (`report` hears what the user is told, notes
/// included); None after a dry run. The caller writes the gathered table.
pub fn compare_on_slurm(
    r: CompareOnSlurm<'_>,
    device: &Device,
    report: &dyn Fn(Report<'_>),
    cancel: &AtomicBool,
) -> RunResult<Option<ComparedOnSlurm>> {
    let (benchmark, experts, calibration) = match r.models {
        CompareModels::Suite { suite, base, experts } => {
            let m = suite_models(suite, base, experts)?;
            let calibration = suite.calibration_evaluator(device)?.is_some();
            (absolute_path(&suite.path)?, m.experts.len(), calibration)
        }
        CompareModels::Demo { benchmark, arch } => {
            let bench = resolve_benchmark(benchmark, Some(arch))?;
            (absolute_path(&bench.dir)?, bench.expert_paths().len(), true)
        }
    };
    let mut plugins = r.plugins;
    if !r.named
        && let Some(note) = leave_out_one_expert(&mut plugins, experts)
    {
        report(Report::Line(&note));
    }
    let cfg = r.config;
    if !calibration && !cfg.lambda_grid.is_empty() {
        report(Report::Line(&format!(
            "note: '{}' has no calibration data (give every [[task]] a calibration file), so λ keeps each method's default",
            benchmark.display()
        )));
    }
    let methods: Vec<CompareMethod> = plugins
        .iter()
        .map(|p| CompareMethod {
            id: p.id().to_owned(),
            name: p.info.name.clone(),
            model_level: p.is_model_level(),
            lambdas: if calibration {
                lambda_grid(p, &cfg.lambda_grid)
            } else {
                None
            },
        })
        .collect();
    if !r.resuming
        && !cfg.overwrite
        && let Some(p) = methods
            .iter()
            .map(|m| cfg.out_dir.join(format!("{}.safetensors", m.id)))
            .find(|p| p.exists())
    {
        return Err(EngineError::Invalid(format!(
            "'{}' exists from an earlier comparison; pass --overwrite to replace it or choose another --out-dir",
            p.display()
        ))
        .into());
    }
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| {
        RunError::os(
            format!("cannot create the output folder '{}'", cfg.out_dir.display()),
            e,
        )
    })?;
    let (base, experts) = match r.models {
        CompareModels::Suite {
            base: Some(base),
            experts,
            ..
        } => (
            Some(absolute_path(base)?),
            experts.iter().map(|p| absolute_path(p)).collect::<RunResult<_>>()?,
        ),
        _ => (None, Vec::new()),
    };
    let job = CompareJob {
        out_dir: cfg.out_dir.clone(),
        workdir: r.workdir,
        benchmark: benchmark.to_string_lossy().into_owned(),
        base,
        experts,
        plugin_dirs: r.plugin_dirs.to_vec(),
        device: r.device.to_owned(),
        seed: cfg.seed,
        lambda_grid: cfg.lambda_grid,
        extend_lambda: cfg.extend_lambda,
        cells: CompareJob::plan_cells(&methods),
        methods,
    };
    let plan = SlurmCompare::prepare(job, &r.slurm.node_binary()?, mergescope_env())?;
    let opts = r.slurm.options("mergescope-compare")?;
    let headline = format!(
        "comparison of {} methods on '{}' into {}",
        plan.job.methods.len(),
        benchmark.display(),
        cfg.out_dir.display()
    );
    Ok(drive(&plan, &opts, r.slurm.dry_run, &headline, report, cancel)?
        .map(|(outcome, _)| ComparedOnSlurm { outcome, calibration }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergescope_lab::data::SplitKind;
    use mergescope_lab::evaluator::{TaskScore, summarise};

    fn report(acc: f64) -> EvalReport {
        summarise(
            SplitKind::Test,
            vec![TaskScore::classification("t", acc, 1.0 - acc, None, 1)],
        )
    }

    fn job(dir: &Path) -> CompareJob {
        let methods = vec![
            CompareMethod {
                id: "ta".into(),
                name: "Task arithmetic".into(),
                model_level: false,
                lambdas: Some(vec![0.5, 1.0]),
            },
            CompareMethod {
                id: "avg".into(),
                name: "Average".into(),
                model_level: false,
                lambdas: None,
            },
        ];
        CompareJob {
            out_dir: dir.join("out"),
            workdir: dir.join("w"),
            benchmark: dir.join("bench").to_string_lossy().into_owned(),
            base: None,
            experts: vec![],
            plugin_dirs: vec![],
            device: "cpu".into(),
            seed: 0,
            lambda_grid: vec![0.5, 1.0],
            extend_lambda: false,
            cells: CompareJob::plan_cells(&methods),
            methods,
        }
    }

    /// Cells: the base, each λ candidate, each final merge; a final merge waits for its
    /// candidates; the table picks the λ of the best calibration accuracy and reports a method
    /// whose cell failed with that cell's error.
    /// The pretrained cell's result of a one-task job in `dir`.
    fn pretrained_cell(dir: &Path) -> CellResult {
        CellResult::Pretrained {
            source: dir.join("bench"),
            kind: "mlp".into(),
            tasks: vec!["t".into()],
            individual: vec![0.9],
            report: report(0.1),
        }
    }

    #[test]
    fn cells_are_planned_chained_and_gathered_into_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let job = job(dir.path());
        assert_eq!(job.keys(), ["pretrained", "ta λ=0.5", "ta λ=1", "ta", "avg"]);
        assert_eq!(job.needs(3), [1, 2]);
        assert!(job.needs(4).is_empty() && job.needs(1).is_empty());
        assert!(job.table().is_none());
        let pretrained = pretrained_cell(dir.path());
        job.write_result(0, &pretrained).unwrap();
        job.write_result(
            1,
            &CellResult::Lambda {
                accuracy: 0.7,
                seconds: 1.0,
            },
        )
        .unwrap();
        assert_eq!(job.state(2), CellState::Missing);
        assert!(
            job.lambda_choice(0)
                .unwrap_err()
                .to_string()
                .contains("cell 2 (ta λ=1) has no result")
        );
        job.write_result(
            2,
            &CellResult::Lambda {
                accuracy: 0.8,
                seconds: 1.0,
            },
        )
        .unwrap();
        assert_eq!(job.lambda_choice(0).unwrap().unwrap().value, 1.0);
        job.write_result(
            3,
            &CellResult::Final {
                lambda: Some(1.0),
                extension: Vec::new(),
                params: serde_json::json!({"lambda": 1.0}),
                report: report(0.6),
                seconds: 2.0,
            },
        )
        .unwrap();
        job.files().write_failure(4, "bad parameter").unwrap();
        assert_eq!(job.state(4), CellState::Failed("bad parameter".into()));
        let table = job.table().unwrap();
        assert_eq!(table.rows.len(), 2);
        assert_eq!(table.rows[0].seconds, 4.0);
        assert_eq!(table.rows[0].outcome.as_ref().unwrap().mean_accuracy, 0.6);
        assert_eq!(
            table.rows[1].outcome.as_ref().unwrap_err(),
            "cell 4 (avg): bad parameter"
        );
        assert!(table.csv().contains("\"ta\",\"λ = 1 (calibration)\",t,0.6,"));
        // A final cell that searched above the grid: its points join the λ choice.
        job.write_result(
            3,
            &CellResult::Final {
                lambda: Some(1.5),
                extension: vec![(1.5, 0.9), (2.0, 0.85)],
                params: serde_json::json!({"lambda": 1.5}),
                report: report(0.6),
                seconds: 2.0,
            },
        )
        .unwrap();
        let choice = job.table().unwrap().rows[0].lambda.clone().unwrap();
        assert_eq!((choice.value, choice.extended, choice.grid.len()), (1.5, 2, 4));
        assert!(
            job.table()
                .unwrap()
                .csv()
                .contains("\"ta\",\"λ = 1.5 (calibration, searched above the grid up to 2)\",t,0.6,")
        );
        // A result of other inputs (another seed) is not this comparison's.
        let mut other = job.clone();
        other.seed = 1;
        assert!(other.result(0).is_none());
        assert_eq!(CompareJob::read(&job.write().unwrap()).unwrap(), job);
    }

    /// What a dry run reports: the cells to submit, then the first stage's script (the final
    /// merges wait for their candidates); once every cell has a result, that nothing is to be
    /// submitted.
    #[test]
    fn a_dry_run_reports_the_first_stage_script_or_nothing_to_submit() {
        let dir = tempfile::tempdir().unwrap();
        let dry_run = |job: CompareJob| {
            let plan = SlurmCompare::prepare(job, Path::new("/shared/mergescope"), Vec::new()).unwrap();
            let said = std::cell::RefCell::new(Vec::new());
            let hear = |r: Report<'_>| {
                said.borrow_mut().push(match r {
                    Report::Line(l) => format!("line: {l}"),
                    Report::Script(s) => format!("script: {s}"),
                    other => format!("{other:?}"),
                });
            };
            let ran = drive(
                &plan,
                &SlurmOptions::default(),
                true,
                "comparison",
                &hear,
                &AtomicBool::new(false),
            );
            assert!(ran.unwrap().is_none(), "a dry run runs nothing");
            said.into_inner()
        };
        let said = dry_run(job(dir.path()));
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said[0].starts_with("line: 5 of 5 cells to submit (job file "),
            "{said:?}"
        );
        assert!(
            said[0].ends_with("grid.json); the script sbatch would get:"),
            "{said:?}"
        );
        assert!(said[1].starts_with("script: #!/bin/bash"), "{said:?}");
        assert!(said[1].contains("#SBATCH --array=0-2,4\n"), "{said:?}");
        assert!(
            said[1].ends_with("a second array job of the final merges: 3\n"),
            "{said:?}"
        );
        let job = job(dir.path());
        let lambda = CellResult::Lambda {
            accuracy: 0.5,
            seconds: 1.0,
        };
        let merged = CellResult::Final {
            lambda: None,
            extension: Vec::new(),
            params: Value::Null,
            report: report(0.5),
            seconds: 1.0,
        };
        let pretrained = pretrained_cell(dir.path());
        for (i, r) in [&pretrained, &lambda, &lambda, &merged, &merged]
            .into_iter()
            .enumerate()
        {
            job.write_result(i, r).unwrap();
        }
        assert_eq!(dry_run(job), ["line: all 5 cells are finished: nothing to submit"]);
    }
}
