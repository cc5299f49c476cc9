//! Results tables (like Table 1 of seed 001): every method on a benchmark with its defaults,
//! its λ chosen on calibration data where it has one, evaluated per task on the test split.
//! Each merge goes through the same code as `mergescope merge` and is kept on disk.

use candle_core::Device;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::merge::{ExecOptions, Observer, Progress};
use mergescope_engine::plugin::loader::Plugin;
use mergescope_engine::plugin::schema::ParamType;
use mergescope_interop::request::MergeRequest;
use mergescope_lab::data::{SplitKind, TaskData};
use mergescope_lab::demo::Benchmark;
use mergescope_lab::evaluator::suite::Suite;
use mergescope_lab::evaluator::{EvalReport, Evaluator, Normalised, References};
use mergescope_lab::run::{self, TaskSource};
use mergescope_plugin_api::abi;
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The parameter a λ search tunes.
pub const LAMBDA_PARAM: &str = "lambda";

/// The default λ grid: 0.1, 0.2, …, 2.0 (cut to each method's allowed range).
pub fn default_lambda_grid() -> Vec<f64> {
    (1..=20).map(|i| f64::from(i) / 10.0).collect()
}

/// Points a λ search may add above the default grid, one grid step at a time, when its best λ
/// is the grid's top (the optimum may lie beyond it): as many as the default grid has, so the
/// search at most doubles its range.
pub const LAMBDA_EXTENSION: usize = 20;

/// An extended λ search stops once this many points above its best did not beat it (the
/// calibration curve of a small calibration set has dips of a point or two).
pub const LAMBDA_PATIENCE: usize = 3;

/// What to compare and where the merges go.
#[derive(Clone, Debug)]
pub struct CompareConfig {
    /// Folder for the merged checkpoints (`<method>.safetensors`); created if missing.
    pub out_dir: PathBuf,
    /// Replace merges left in `out_dir` by an earlier run.
    pub overwrite: bool,
    /// Candidate λ values for methods with a `lambda` parameter (empty: keep the default).
    pub lambda_grid: Vec<f64>,
    /// Continue each search above the grid while its best λ is the largest tried (at most
    /// [`LAMBDA_EXTENSION`] points, within the method's range): for the default grid; a grid the
    /// user gave is tried as given.
    pub extend_lambda: bool,
    /// Seed of every merge.
    pub seed: u64,
}

/// The λ a method got from the calibration search.
#[derive(Clone, Debug, PartialEq)]
pub struct LambdaChoice {
    /// The chosen value (best mean calibration accuracy; the smallest on ties).
    pub value: f64,
    /// Every (λ, mean calibration accuracy) tried.
    pub grid: Vec<(f64, f64)>,
    /// How many of them the search added above its grid ([`extend_lambda_search`]).
    pub extended: usize,
}

/// One method's line of the table.
#[derive(Clone, Debug)]
pub struct MethodResult {
    /// Plugin id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Whether it is a model-level method (uses calibration data itself).
    pub model_level: bool,
    /// The λ search, when the method has a `lambda` parameter.
    pub lambda: Option<LambdaChoice>,
    /// Parameters the final merge ran with, as the plugin resolved them.
    pub params: Value,
    /// Test-split evaluation, or the error that stopped this method.
    pub outcome: std::result::Result<EvalReport, String>,
    /// Seconds for this method, λ search included.
    pub seconds: f64,
    /// The merged checkpoint.
    pub output: PathBuf,
}

/// What a comparison merges and how it scores the merges.
pub struct CompareInputs<'a> {
    /// What the table is about (a benchmark folder or a suite file), for its heading.
    pub source: PathBuf,
    /// What the models are: the demo architecture, or the suite's evaluator.
    pub kind: String,
    /// The base checkpoint.
    pub base: PathBuf,
    /// The experts, in task order.
    pub experts: Vec<PathBuf>,
    /// Scores every merge on the test data.
    pub test: Box<dyn Evaluator + 'a>,
    /// Scores λ candidates; `None`: methods keep their default λ.
    pub calibration: Option<Box<dyn Evaluator + 'a>>,
    /// Each expert's score on its own task, in task order (empty when unknown).
    pub individual: Vec<f64>,
    /// The tasks model-level methods run on (`None`: they cannot run).
    pub tasks: Option<TaskSource<'a>>,
}

impl<'a> CompareInputs<'a> {
    /// A demo benchmark's base and experts, test and calibration splits of `task_data`, and the
    /// experts' test accuracies from its manifest.
    pub fn of_benchmark(bench: &'a Benchmark, task_data: &'a [TaskData], device: &Device) -> Result<Self> {
        Ok(CompareInputs {
            source: bench.dir.clone(),
            kind: bench.manifest.arch.to_string(),
            base: bench.base_path(),
            experts: bench.expert_paths(),
            test: Box::new(bench.evaluator(task_data, None, SplitKind::Test, device)?),
            calibration: Some(Box::new(bench.evaluator(
                task_data,
                None,
                SplitKind::Calibration,
                device,
            )?)),
            individual: bench
                .manifest
                .tasks
                .iter()
                .map(|t| t.expert_accuracy.get(SplitKind::Test))
                .collect(),
            tasks: Some(TaskSource::Benchmark {
                bench,
                tasks: task_data,
            }),
        })
    }

    /// A suite's base and experts (`experts` one per task, in task order), its test data
    /// normalised by the experts, and its calibration data when every task has some (which
    /// model-level methods then learn on: a bert, clip or causal-lm suite).
    pub fn of_suite(
        suite: &'a Suite,
        base: PathBuf,
        experts: Vec<PathBuf>,
        device: &Device,
        cancel: &AtomicBool,
    ) -> Result<Self> {
        let references = suite.expert_references(&experts, device, cancel)?;
        Self::of_suite_with(suite, base, experts, references, device)
    }

    /// [`Self::of_suite`] with the experts' references already known (a comparison's cell on
    /// a compute node reads them from the cell that computed them).
    pub fn of_suite_with(
        suite: &'a Suite,
        base: PathBuf,
        experts: Vec<PathBuf>,
        references: References,
        device: &Device,
    ) -> Result<Self> {
        let individual = suite
            .task_names()
            .iter()
            .map(|t| references.0.get(t).copied().unwrap_or(f64::NAN))
            .collect();
        let test = Normalised::new(suite.evaluator(None, device)?, references);
        Ok(CompareInputs {
            source: suite.path.clone(),
            kind: format!("suite '{}'", suite.name),
            base,
            experts,
            test: Box::new(test),
            calibration: suite.calibration_evaluator(device)?,
            individual,
            tasks: suite
                .model_level_unavailable()
                .is_none()
                .then_some(TaskSource::Suite(suite)),
        })
    }
}

/// A finished comparison.
#[derive(Clone, Debug)]
pub struct CompareTable {
    /// Benchmark folder or suite file.
    pub benchmark: PathBuf,
    /// What the models are (the demo architecture, or the suite).
    pub arch: String,
    /// Task names, in column order.
    pub tasks: Vec<String>,
    /// The base with each task's head.
    pub pretrained: EvalReport,
    /// Each expert on its own task (test accuracy), in task order.
    pub individual: Vec<f64>,
    /// One entry per method, in the order run.
    pub rows: Vec<MethodResult>,
}

/// Runs every plugin of `plugins` on `inputs`; a method that fails becomes a row with its
/// error, so one bad plugin does not lose the others. `progress` receives one line per step.
pub fn compare(
    plugins: &[&Plugin],
    inputs: &CompareInputs<'_>,
    cfg: &CompareConfig,
    opts: &ExecOptions,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &AtomicBool,
) -> Result<CompareTable> {
    std::fs::create_dir_all(&cfg.out_dir).map_err(|e| EngineError::io("create the output folder", &cfg.out_dir, e))?;
    if !cfg.overwrite
        && let Some(p) = plugins.iter().map(|p| output_path(cfg, p)).find(|p| p.exists())
    {
        return Err(EngineError::Invalid(format!(
            "'{}' exists from an earlier comparison; pass --overwrite to replace it or choose another --out-dir",
            p.display()
        )));
    }
    let test = inputs.test.as_ref();
    progress("evaluating the base");
    let pretrained = test.evaluate_file(&inputs.base, cancel)?;
    let mut rows = Vec::new();
    for plugin in plugins {
        if cancel.load(Ordering::Relaxed) {
            return Err(EngineError::Cancelled);
        }
        let started = Instant::now();
        let out = output_path(cfg, plugin);
        let mut lambda = None;
        let run = (|| -> Result<(Value, EvalReport)> {
            if let Some(grid) = searched_lambdas(plugin, inputs, cfg) {
                let scratch = cfg.out_dir.join(format!(".{}.lambda-search.safetensors", plugin.id()));
                let mut tried = Vec::new();
                for l in grid {
                    tried.push((
                        l,
                        lambda_trial(plugin, inputs, cfg, l, &scratch, opts, progress, cancel)?,
                    ));
                }
                let mut choice = choose_lambda(tried);
                if cfg.extend_lambda {
                    choice = extend_lambda_search(choice, lambda_max(plugin), |l| {
                        lambda_trial(plugin, inputs, cfg, l, &scratch, opts, progress, cancel)
                    })?;
                }
                let _ = std::fs::remove_file(&scratch);
                lambda = Some(choice);
            }
            let chosen = lambda.as_ref().map(|l| l.value);
            final_merge(plugin, inputs, cfg, chosen, opts, progress, cancel)
        })();
        let (params, outcome) = match run {
            Ok((p, r)) => (p, Ok(r)),
            Err(EngineError::Cancelled) => return Err(EngineError::Cancelled),
            Err(e) => (Value::Null, Err(e.to_string())),
        };
        rows.push(MethodResult {
            id: plugin.id().to_owned(),
            name: plugin.info.name.clone(),
            model_level: plugin.is_model_level(),
            lambda,
            params,
            outcome,
            seconds: started.elapsed().as_secs_f64(),
            output: out,
        });
    }
    Ok(CompareTable {
        benchmark: inputs.source.clone(),
        arch: inputs.kind.clone(),
        tasks: test.task_names(),
        pretrained,
        individual: inputs.individual.clone(),
        rows,
    })
}

/// Where `plugin`'s merge of the comparison goes.
pub fn output_path(cfg: &CompareConfig, plugin: &Plugin) -> PathBuf {
    cfg.out_dir.join(format!("{}.safetensors", plugin.id()))
}

/// The λ values searched for `plugin` on calibration data: its grid when it has a `lambda`
/// parameter and the inputs have calibration data, else None (it keeps its default).
pub fn searched_lambdas(plugin: &Plugin, inputs: &CompareInputs<'_>, cfg: &CompareConfig) -> Option<Vec<f64>> {
    inputs.calibration.as_ref()?;
    lambda_grid(plugin, &cfg.lambda_grid)
}

/// One candidate of a λ search: `plugin` merged with λ = `lambda` into `scratch`, scored on the
/// calibration data; returns the mean calibration accuracy.
#[allow(clippy::too_many_arguments)]
pub fn lambda_trial(
    plugin: &Plugin,
    inputs: &CompareInputs<'_>,
    cfg: &CompareConfig,
    lambda: f64,
    scratch: &Path,
    opts: &ExecOptions,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &AtomicBool,
) -> Result<f64> {
    let calibration = inputs.calibration.as_ref().ok_or_else(|| {
        EngineError::Param(format!(
            "{} has no calibration data, so no λ can be chosen on it",
            inputs.kind
        ))
    })?;
    progress(&format!("{}: λ = {lambda} on calibration data", plugin.id()));
    let p = Value::Object(Map::from_iter([(LAMBDA_PARAM.to_owned(), Value::from(lambda))]));
    run_one(plugin, inputs, p, cfg.seed, scratch, opts, cancel, progress)?;
    Ok(calibration.evaluate_file(scratch, cancel)?.mean_accuracy)
}

/// The table's merge of `plugin` (with λ = `lambda` when one was chosen, else its defaults)
/// into [`output_path`], scored on the test data; returns the resolved parameters and the
/// report.
pub fn final_merge(
    plugin: &Plugin,
    inputs: &CompareInputs<'_>,
    cfg: &CompareConfig,
    lambda: Option<f64>,
    opts: &ExecOptions,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &AtomicBool,
) -> Result<(Value, EvalReport)> {
    let mut params = Map::new();
    if let Some(l) = lambda {
        params.insert(LAMBDA_PARAM.to_owned(), Value::from(l));
    }
    let out = output_path(cfg, plugin);
    progress(&format!("{}: merging", plugin.id()));
    let resolved = run_one(
        plugin,
        inputs,
        Value::Object(params),
        cfg.seed,
        &out,
        opts,
        cancel,
        progress,
    )?;
    progress(&format!("{}: evaluating", plugin.id()));
    Ok((resolved, inputs.test.evaluate_file(&out, cancel)?))
}

/// Leaves out of `plugins` those `drop` selects (methods not asked for by name that cannot run
/// on these inputs); returns the note naming them and `why`, if any were.
pub fn leave_out(plugins: &mut Vec<&Plugin>, drop: impl Fn(&Plugin) -> bool, why: &str) -> Option<String> {
    let skipped: Vec<&str> = plugins.iter().filter(|p| drop(p)).map(|p| p.id()).collect();
    if skipped.is_empty() {
        return None;
    }
    let note = format!("note: not run ({}): {why}", skipped.join(", "));
    plugins.retain(|p| !drop(p));
    Some(note)
}

/// Leaves out of `plugins` the methods that merge the base with exactly one expert, unless
/// there is `experts` = 1; returns the note naming them, if any were.
pub fn leave_out_one_expert(plugins: &mut Vec<&Plugin>, experts: usize) -> Option<String> {
    if experts == 1 {
        return None;
    }
    let why = format!("they merge the base with exactly one expert and there are {experts}");
    leave_out(plugins, |p| p.has_capability(abi::CAP_ONE_EXPERT), &why)
}

/// The grid for `plugin`'s `lambda` parameter, cut to its range; None when it has none (or the
/// grid is empty).
pub fn lambda_grid(plugin: &Plugin, grid: &[f64]) -> Option<Vec<f64>> {
    let (min, max) = lambda_range(plugin)?;
    let g: Vec<f64> = grid
        .iter()
        .copied()
        .filter(|l| min.is_none_or(|m| *l >= m) && max.is_none_or(|m| *l <= m))
        .collect();
    (!g.is_empty()).then_some(g)
}

/// The largest λ `plugin` allows (None: no bound, or no `lambda` parameter).
pub fn lambda_max(plugin: &Plugin) -> Option<f64> {
    lambda_range(plugin).and_then(|(_, max)| max)
}

/// The range of `plugin`'s float `lambda` parameter; None when it has none.
fn lambda_range(plugin: &Plugin) -> Option<(Option<f64>, Option<f64>)> {
    let spec = plugin.info.params.iter().find(|p| p.name == LAMBDA_PARAM)?;
    match spec.ty {
        ParamType::Float { min, max } => Some((min, max)),
        _ => None,
    }
}

/// The λ with the best calibration accuracy; the smallest among equals (the least change to
/// the base).
pub fn choose_lambda(tried: Vec<(f64, f64)>) -> LambdaChoice {
    let mut best = (f64::NAN, f64::NEG_INFINITY);
    for &(l, acc) in &tried {
        if acc > best.1 || (acc == best.1 && l < best.0) {
            best = (l, acc);
        }
    }
    LambdaChoice {
        value: best.0,
        grid: tried,
        extended: 0,
    }
}

/// `choice` continued above its grid when its best λ is the grid's top: `trial` scores the next
/// point, one step of the grid's top spacing higher, until [`LAMBDA_PATIENCE`] points above the
/// best have not beaten it, or after [`LAMBDA_EXTENSION`] points, or at `max` (the top of the
/// method's range: [`lambda_max`]). A grid of one value is not extended.
pub fn extend_lambda_search(
    choice: LambdaChoice,
    max: Option<f64>,
    mut trial: impl FnMut(f64) -> Result<f64>,
) -> Result<LambdaChoice> {
    let mut values: Vec<f64> = choice.grid.iter().map(|t| t.0).collect();
    values.sort_by(f64::total_cmp);
    let [.., below, mut top] = values[..] else {
        return Ok(choice);
    };
    let step = top - below;
    if choice.value != top {
        return Ok(choice);
    }
    let above_best = |c: &LambdaChoice| c.grid.iter().filter(|t| t.0 > c.value).count();
    let mut current = choice;
    while step > 0.0 && current.extended < LAMBDA_EXTENSION && above_best(&current) < LAMBDA_PATIENCE {
        // Rounded so that 1.9 + 0.1 is written 2, not 2.0000000000000004.
        let next = ((top + step) * 1e9).round() / 1e9;
        if max.is_some_and(|m| next > m) {
            break;
        }
        let mut tried = std::mem::take(&mut current.grid);
        tried.push((next, trial(next)?));
        current = LambdaChoice {
            extended: current.extended + 1,
            ..choose_lambda(tried)
        };
        top = next;
    }
    Ok(current)
}

/// One merge of the inputs' base and experts into `out`; returns the resolved parameters.
/// A model-level method's iterates and progress go to `progress`.
#[allow(clippy::too_many_arguments)]
fn run_one(
    plugin: &Plugin,
    inputs: &CompareInputs<'_>,
    params: Value,
    seed: u64,
    out: &Path,
    opts: &ExecOptions,
    cancel: &AtomicBool,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Value> {
    if plugin.is_model_level() && inputs.tasks.is_none() {
        return Err(EngineError::Param(format!(
            "{} is a model-level method: it trains on calibration tasks, which {} does not provide",
            plugin.id(),
            inputs.kind
        )));
    }
    let req = MergeRequest::new(inputs.experts.clone(), out)
        .with_base(Some(inputs.base.clone()))
        .with_params(params)
        .with_seed(seed)
        .overwriting(true);
    let id = plugin.id();
    let on_progress = |p: &Progress| {
        if plugin.is_model_level() {
            progress(&format!("{id}: {} ({:.0}%)", p.tensor, p.done as f64 / 10.0));
        }
    };
    let observer = Observer {
        progress: &on_progress,
        log: Observer::silent().log,
    };
    let report = run::merge(plugin, &req, inputs.tasks, opts, observer, cancel)?.report;
    Ok(report.params)
}

fn pct(v: f64) -> String {
    format!("{:.1}", 100.0 * v)
}

fn opt_pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), pct)
}

/// The parameters worth showing: the chosen λ, or "defaults".
fn setting(r: &MethodResult) -> String {
    match &r.lambda {
        Some(l) if l.extended > 0 => format!(
            "λ = {} (calibration, searched above the grid up to {})",
            l.value,
            l.grid.iter().map(|t| t.0).fold(f64::NEG_INFINITY, f64::max)
        ),
        Some(l) => format!("λ = {} (calibration)", l.value),
        None => "defaults".into(),
    }
}

impl CompareTable {
    /// The table in Markdown: per-task test accuracy (%), the average and the average
    /// normalised accuracy (merged ÷ expert, per task), with the base and the experts on top.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| method | setting | {} | avg | norm. avg | time s |",
            self.tasks.join(" | ")
        );
        let _ = writeln!(s, "|---|---|{}---:|---:|---:|", "---:|".repeat(self.tasks.len()));
        let row = |s: &mut String, name: &str, setting: &str, accs: Vec<String>, avg: String, norm: String| {
            let _ = writeln!(s, "| {name} | {setting} | {} | {avg} | {norm} |", accs.join(" | "));
        };
        let p = &self.pretrained;
        row(
            &mut s,
            "Pretrained (base)",
            "",
            p.tasks.iter().map(|t| pct(t.accuracy)).collect(),
            pct(p.mean_accuracy),
            format!("{} | ", opt_pct(p.mean_normalized)),
        );
        if !self.individual.is_empty() {
            let ind_avg = self.individual.iter().sum::<f64>() / self.individual.len() as f64;
            row(
                &mut s,
                "Individual (experts)",
                "",
                self.individual.iter().map(|a| pct(*a)).collect(),
                pct(ind_avg),
                "100.0 | ".into(),
            );
        }
        for r in &self.rows {
            match &r.outcome {
                Ok(e) => row(
                    &mut s,
                    &r.name,
                    &setting(r),
                    e.tasks.iter().map(|t| pct(t.accuracy)).collect(),
                    pct(e.mean_accuracy),
                    format!("{} | {:.1}", opt_pct(e.mean_normalized), r.seconds),
                ),
                Err(msg) => {
                    let _ = writeln!(s, "| {} | failed: {} |", r.name, msg.replace('|', "/"));
                }
            }
        }
        s
    }

    /// Every λ search as CSV: one line per method and λ tried, in the order tried, with its mean
    /// calibration accuracy, whether it lay above the grid, and whether it was chosen.
    pub fn lambda_csv(&self) -> String {
        let mut s = String::from("method,lambda,calibration_accuracy,above_grid,chosen\n");
        for r in &self.rows {
            let Some(l) = &r.lambda else { continue };
            let first_extra = l.grid.len() - l.extended;
            for (i, (lambda, acc)) in l.grid.iter().enumerate() {
                let _ = writeln!(s, "{},{lambda},{acc},{},{}", r.id, i >= first_extra, *lambda == l.value);
            }
        }
        s
    }

    /// The table as CSV: one row per method and task, plus `average` rows, with raw fractions.
    pub fn csv(&self) -> String {
        let mut s = String::from("method,setting,task,accuracy,normalized_accuracy,seconds\n");
        let quote = |v: &str| format!("\"{}\"", v.replace('"', "\"\""));
        let mut report = |name: &str, setting: &str, e: &EvalReport, secs: String| {
            for t in &e.tasks {
                let n = t.normalized.map(|v| v.to_string()).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{},{},{},{},{n},{secs}",
                    quote(name),
                    quote(setting),
                    t.task,
                    t.accuracy
                );
            }
            let n = e.mean_normalized.map(|v| v.to_string()).unwrap_or_default();
            let _ = writeln!(
                s,
                "{},{},average,{},{n},{secs}",
                quote(name),
                quote(setting),
                e.mean_accuracy
            );
        };
        report("pretrained", "", &self.pretrained, String::new());
        for r in &self.rows {
            if let Ok(e) = &r.outcome {
                report(&r.id, &setting(r), e, format!("{:.2}", r.seconds));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The best calibration accuracy wins; among equals the smallest λ.
    #[test]
    fn lambda_choice_prefers_accuracy_then_small_lambda() {
        let c = choose_lambda(vec![(0.1, 0.5), (0.2, 0.7), (0.3, 0.7), (0.4, 0.6)]);
        assert_eq!(c.value, 0.2);
        assert_eq!(c.grid.len(), 4);
        let c = choose_lambda(vec![(0.5, 0.4), (0.3, 0.4)]);
        assert_eq!(c.value, 0.3);
    }

    /// Calibration accuracy of a λ on a curve that peaks at `peak`.
    fn peaked(peak: f64) -> impl FnMut(f64) -> Result<f64> {
        move |l| Ok(1.0 - (l - peak).abs())
    }

    /// A search whose best λ is its grid's top goes on up one grid step at a time and stops once
    /// LAMBDA_PATIENCE points above its best did not beat it (a one-point dip does not stop it),
    /// at the range's top, or after LAMBDA_EXTENSION points; an interior best, or a one-point
    /// grid, tries nothing more.
    #[test]
    fn a_best_lambda_at_the_grid_top_extends_the_search() {
        let grid = |peak: f64| -> Vec<(f64, f64)> {
            let mut f = peaked(peak);
            [0.5, 1.0, 1.5, 2.0].into_iter().map(|l| (l, f(l).unwrap())).collect()
        };
        let mut asked = Vec::new();
        let c = extend_lambda_search(choose_lambda(grid(3.2)), None, |l| {
            asked.push(l);
            peaked(3.2)(l)
        })
        .unwrap();
        assert_eq!(asked, [2.5, 3.0, 3.5, 4.0, 4.5]);
        assert_eq!((c.value, c.extended, c.grid.len()), (3.0, 5, 9));
        // A dip at 2.5 on the way to the peak at 3.5.
        let c = extend_lambda_search(choose_lambda(grid(3.5)), None, |l| {
            if l == 2.5 { Ok(0.0) } else { peaked(3.5)(l) }
        })
        .unwrap();
        assert_eq!((c.value, c.extended), (3.5, 6));
        // The range's top: 3.0 is allowed, 3.5 is not.
        let c = extend_lambda_search(choose_lambda(grid(3.2)), Some(3.0), peaked(3.2)).unwrap();
        assert_eq!((c.value, c.extended), (3.0, 2));
        // At most LAMBDA_EXTENSION points (2.5 … 7.0) on a curve that keeps rising.
        let c = extend_lambda_search(choose_lambda(grid(100.0)), None, peaked(100.0)).unwrap();
        assert_eq!(
            (c.value, c.extended),
            (2.0 + 0.5 * LAMBDA_EXTENSION as f64, LAMBDA_EXTENSION)
        );
        // The step is the grid's top spacing, and the points are rounded: 1.9 + 0.1 is 2.
        let tenths: Vec<(f64, f64)> = [1.8, 1.9].into_iter().map(|l| (l, l)).collect();
        let c = extend_lambda_search(choose_lambda(tenths), None, |l| Ok(if l <= 2.0 { l } else { 0.0 })).unwrap();
        assert_eq!(
            c.grid.iter().map(|t| t.0).collect::<Vec<_>>(),
            [1.8, 1.9, 2.0, 2.1, 2.2, 2.3]
        );
        assert_eq!(c.value, 2.0);
        let untouched = |peak: f64, grid: Vec<(f64, f64)>| {
            let c = extend_lambda_search(choose_lambda(grid), None, |_| panic!("nothing more to try")).unwrap();
            assert_eq!(c.extended, 0, "peak {peak}");
        };
        untouched(1.2, grid(1.2));
        untouched(1.6, grid(1.6));
        untouched(3.0, vec![(2.0, 0.9)]);
    }
}
