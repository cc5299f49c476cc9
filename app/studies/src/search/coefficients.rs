//! A gradient-free search of a per-tensor method's numeric parameters (per-task weights, a
//! scalar λ, or a λ that varies across the layers), each candidate merged through the one merge
//! door and scored by any evaluator (a demo benchmark's calibration split, a suite's family or
//! an external command such as lm-evaluation-harness), with CMA-ES. What mergekit-evolve does,
//! for every installed method.

use super::cmaes::CmaEs;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::executor::{ExecOptions, Observer};
use mergescope_engine::plugin::Plugin;
use mergescope_engine::plugin::schema::{ParamSchema, ParamType};
use mergescope_interop::request::MergeRequest;
use mergescope_lab::evaluator::Evaluator;
use mergescope_lab::run;
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// How one searched parameter maps to coefficients.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// One value for the whole model.
    Scalar,
    /// One value per expert (a per-task parameter).
    PerTask,
    /// This many anchors interpolated across the layers (a layer-wise gradient).
    Layers(usize),
}

/// One parameter to search, as a user names it: `lambda`, `task_weights`, `lambda:layers=4`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Searched {
    /// Parameter name.
    pub name: String,
    /// How it maps to coefficients.
    pub layout: Layout,
}

impl Searched {
    /// Parses `name` or `name:layers=G`.
    pub fn parse(text: &str) -> Result<Searched> {
        let bad = || {
            EngineError::Param(format!(
                "--search '{text}': write a parameter name (lambda, task_weights) or name:layers=G for a value that varies across the layers"
            ))
        };
        match text.split_once(':') {
            None if !text.trim().is_empty() => Ok(Searched {
                name: text.trim().to_owned(),
                layout: Layout::Scalar,
            }),
            Some((name, rest)) => {
                let g: usize = rest
                    .trim()
                    .strip_prefix("layers=")
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?;
                if g < 2 {
                    return Err(EngineError::Param(format!(
                        "--search '{text}': a layer gradient needs at least 2 anchors"
                    )));
                }
                Ok(Searched {
                    name: name.trim().to_owned(),
                    layout: Layout::Layers(g),
                })
            }
            None => Err(bad()),
        }
    }
}

/// What to search and for how long.
#[derive(Clone, Debug)]
pub struct SearchSpec {
    /// The parameters searched.
    pub params: Vec<Searched>,
    /// Every coefficient stays in `[lo, hi]` (and in its parameter's own range).
    pub range: (f64, f64),
    /// Candidates evaluated in all (merges + evaluations).
    pub budget: usize,
    /// Candidates per generation (default: CMA-ES's 4 + ⌊3 ln n⌋).
    pub population: Option<usize>,
    /// Seed of the search and of every merge.
    pub seed: u64,
    /// Other parameters, fixed for every candidate.
    pub fixed: Map<String, Value>,
}

/// One evaluated candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// 0-based order of evaluation.
    pub index: usize,
    /// Generation it belongs to.
    pub generation: usize,
    /// The parameters it was merged with (fixed and searched).
    pub params: Value,
    /// Mean headline score over the tasks (higher is better); NaN when the merge or the
    /// evaluation failed (`error` says why).
    pub score: f64,
    /// Each task's score.
    pub tasks: Vec<(String, f64)>,
    /// Why it has no score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A finished (or cancelled) search.
#[derive(Clone, Debug, Serialize)]
pub struct SearchOutcome {
    /// The best candidate.
    pub best: Candidate,
    /// Every candidate, in order.
    pub history: Vec<Candidate>,
    /// CMA-ES's mean after each generation, as parameters (the search's trajectory).
    pub means: Vec<Value>,
    /// True when cancelled before the budget was spent.
    pub cancelled: bool,
}

/// The searched coefficients of a method: each parameter's slots and range.
struct Space {
    slots: Vec<(Searched, usize, f64, f64, f64)>,
}

impl Space {
    /// Checks the searched parameters against `schema` and the expert count.
    fn new(
        params: &[Searched],
        schema: &[ParamSchema],
        experts: usize,
        range: (f64, f64),
        plugin: &str,
    ) -> Result<Space> {
        if params.is_empty() {
            return Err(EngineError::Param(
                "name at least one parameter to search (--search lambda, --search task_weights)".into(),
            ));
        }
        if !(range.0.is_finite() && range.1.is_finite() && range.0 < range.1) {
            return Err(EngineError::Param(format!(
                "--range {}:{} is empty; write LO:HI with LO < HI",
                range.0, range.1
            )));
        }
        let mut slots = Vec::new();
        for p in params {
            let s = schema.iter().find(|s| s.name == p.name).ok_or_else(|| {
                let numeric: Vec<&str> = schema
                    .iter()
                    .filter(|s| matches!(s.ty, ParamType::Float { .. }))
                    .map(|s| s.name.as_str())
                    .collect();
                EngineError::Param(format!(
                    "method '{plugin}' has no parameter '{}'; its numeric parameters are: {}",
                    p.name,
                    numeric.join(", ")
                ))
            })?;
            let ParamType::Float { min, max } = s.ty else {
                return Err(EngineError::Param(format!(
                    "parameter '{}' of '{plugin}' is not a real number, so it cannot be searched",
                    p.name
                )));
            };
            let lo = min.map_or(range.0, |m| m.max(range.0));
            let hi = max.map_or(range.1, |m| m.min(range.1));
            if lo >= hi {
                return Err(EngineError::Param(format!(
                    "parameter '{}' allows {}..{}, which leaves nothing of --range {}:{}",
                    p.name,
                    min.unwrap_or(f64::NEG_INFINITY),
                    max.unwrap_or(f64::INFINITY),
                    range.0,
                    range.1
                )));
            }
            let layout = match (&p.layout, s.per_task) {
                (Layout::Scalar, true) => Layout::PerTask,
                (Layout::Layers(_), true) => {
                    return Err(EngineError::Param(format!(
                        "parameter '{}' takes one value per expert; search it per task (--search {}), not across layers",
                        p.name, p.name
                    )));
                }
                (l, _) => l.clone(),
            };
            let count = match layout {
                Layout::Scalar => 1,
                Layout::PerTask => experts,
                Layout::Layers(g) => g,
            };
            let start = s.default.as_f64().unwrap_or(0.5 * (lo + hi)).clamp(lo, hi);
            slots.push((
                Searched {
                    name: p.name.clone(),
                    layout,
                },
                count,
                lo,
                hi,
                start,
            ));
        }
        if let Some(dup) = slots
            .iter()
            .enumerate()
            .find(|(i, s)| slots[..*i].iter().any(|t| t.0.name == s.0.name))
        {
            return Err(EngineError::Param(format!(
                "parameter '{}' is searched twice",
                dup.1.0.name
            )));
        }
        Ok(Space { slots })
    }

    fn start(&self) -> Vec<f64> {
        self.slots.iter().flat_map(|(_, n, _, _, s)| vec![*s; *n]).collect()
    }

    /// Each coordinate clamped to its range, and how far outside the ranges `x` was (squared,
    /// relative to each range's width).
    fn repair(&self, x: &[f64]) -> (Vec<f64>, f64) {
        let mut out = Vec::with_capacity(x.len());
        let mut outside = 0.0;
        let mut k = 0;
        for (_, n, lo, hi, _) in &self.slots {
            for _ in 0..*n {
                let v = x[k].clamp(*lo, *hi);
                outside += ((x[k] - v) / (hi - lo)).powi(2);
                out.push(v);
                k += 1;
            }
        }
        (out, outside)
    }

    /// The parameters of coefficients `x` (already in range) over `fixed`.
    fn params(&self, x: &[f64], fixed: &Map<String, Value>) -> Value {
        let mut p = fixed.clone();
        let mut k = 0;
        for (s, n, _, _, _) in &self.slots {
            let v = match s.layout {
                Layout::Scalar => Value::from(x[k]),
                Layout::PerTask | Layout::Layers(_) => Value::from(x[k..k + n].to_vec()),
            };
            p.insert(s.name.clone(), v);
            k += n;
        }
        Value::Object(p)
    }

    /// The mean width of the ranges (CMA-ES's starting step is a quarter of it).
    fn width(&self) -> f64 {
        let total: usize = self.slots.iter().map(|s| s.1).sum();
        self.slots
            .iter()
            .map(|(_, n, lo, hi, _)| *n as f64 * (hi - lo))
            .sum::<f64>()
            / total as f64
    }
}

/// Progress of a search, after each candidate.
#[derive(Clone, Debug)]
pub struct SearchProgress<'a> {
    /// The candidate just evaluated.
    pub candidate: &'a Candidate,
    /// The best so far.
    pub best: &'a Candidate,
    /// Candidates evaluated.
    pub done: usize,
    /// The budget.
    pub budget: usize,
}

/// Searches `spec`'s parameters of `plugin` (a per-tensor method) for the best mean score of
/// `evaluator` on merges of `base` and `experts`, each written to `scratch` (replaced each
/// time, removed at the end). Stops after `spec.budget` candidates or when `cancel` is set
/// (then the best so far is returned, marked cancelled).
#[allow(clippy::too_many_arguments)]
pub fn search_coefficients(
    plugin: &Plugin,
    base: &Path,
    experts: &[PathBuf],
    spec: &SearchSpec,
    evaluator: &dyn Evaluator,
    scratch: &Path,
    opts: &ExecOptions,
    progress: &mut dyn FnMut(&SearchProgress<'_>),
    cancel: &AtomicBool,
) -> Result<SearchOutcome> {
    if plugin.is_model_level() {
        return Err(EngineError::Param(format!(
            "'{}' is a model-level method that searches its own coefficients; search a per-tensor method (task-arithmetic, ties, dare, ...)",
            plugin.id()
        )));
    }
    if spec.budget == 0 {
        return Err(EngineError::Param("--budget must be at least 1 candidate".into()));
    }
    let space = Space::new(&spec.params, plugin.schema(), experts.len(), spec.range, plugin.id())?;
    // The scratch candidate goes however the search ends (done, cancelled or failed).
    let _scratch = RemoveOnDrop(scratch);
    let mut es = CmaEs::new(space.start(), 0.25 * space.width(), spec.population, spec.seed)?;
    let mut history: Vec<Candidate> = Vec::new();
    let mut best: Option<Candidate> = None;
    let mut means = Vec::new();
    let mut cancelled = false;
    'search: while history.len() < spec.budget {
        let generation = es.generation();
        let xs = es.ask();
        let mut values = Vec::with_capacity(xs.len());
        for x in &xs {
            if history.len() >= spec.budget || cancel.load(Ordering::Relaxed) {
                cancelled = cancel.load(Ordering::Relaxed);
                break 'search;
            }
            let (inside, outside) = space.repair(x);
            let params = space.params(&inside, &spec.fixed);
            let candidate = score(
                plugin, base, experts, &params, spec.seed, evaluator, scratch, opts, cancel,
            );
            let candidate = match candidate {
                Err(EngineError::Cancelled) => {
                    cancelled = true;
                    break 'search;
                }
                Err(e) => Candidate {
                    index: history.len(),
                    generation,
                    params,
                    score: f64::NAN,
                    tasks: Vec::new(),
                    error: Some(e.to_string()),
                },
                Ok((score, tasks)) => Candidate {
                    index: history.len(),
                    generation,
                    params,
                    score,
                    tasks,
                    error: None,
                },
            };
            // Minimise: −score, plus a penalty for leaving the ranges (the candidate itself
            // was merged at the nearest point inside them).
            values.push(-candidate.score + outside);
            if candidate.score.is_finite() && best.as_ref().is_none_or(|b| candidate.score > b.score) {
                best = Some(candidate.clone());
            }
            history.push(candidate);
            if let (Some(b), Some(c)) = (&best, history.last()) {
                progress(&SearchProgress {
                    candidate: c,
                    best: b,
                    done: history.len(),
                    budget: spec.budget,
                });
            }
        }
        es.tell(&values)?;
        means.push(space.params(&space.repair(es.mean()).0, &spec.fixed));
    }
    let best = best.ok_or_else(|| match history.first().and_then(|c| c.error.clone()) {
        Some(e) => EngineError::Param(format!(
            "no candidate could be merged and scored; the first failed with: {e}"
        )),
        None => EngineError::Cancelled,
    })?;
    Ok(SearchOutcome {
        best,
        history,
        means,
        cancelled,
    })
}

/// Removes a file when dropped.
struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Merges one candidate into `scratch` and scores it: (mean headline score, per task).
#[allow(clippy::too_many_arguments)]
fn score(
    plugin: &Plugin,
    base: &Path,
    experts: &[PathBuf],
    params: &Value,
    seed: u64,
    evaluator: &dyn Evaluator,
    scratch: &Path,
    opts: &ExecOptions,
    cancel: &AtomicBool,
) -> Result<(f64, Vec<(String, f64)>)> {
    let req = MergeRequest::new(experts.to_vec(), scratch)
        .with_base(Some(base.to_path_buf()))
        .with_params(params.clone())
        .with_seed(seed)
        .overwriting(true);
    run::merge(plugin, &req, None, opts, Observer::silent(), cancel)?;
    let report = evaluator.evaluate_file(scratch, cancel)?;
    let tasks = report.tasks.iter().map(|t| (t.task.clone(), t.accuracy)).collect();
    Ok((report.mean_accuracy, tasks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(name: &str, min: Option<f64>, max: Option<f64>, default: f64, per_task: bool) -> ParamSchema {
        ParamSchema {
            name: name.into(),
            ty: ParamType::Float { min, max },
            default: Value::from(default),
            help: String::new(),
            per_task,
            required: false,
        }
    }

    #[test]
    fn the_space_follows_the_schema() {
        let schema = vec![
            float("lambda", Some(0.0), None, 0.3, false),
            float("task_weights", None, None, 1.0, true),
            ParamSchema {
                name: "mode".into(),
                ty: ParamType::Choice {
                    choices: vec!["a".into()],
                },
                default: Value::from("a"),
                help: String::new(),
                per_task: false,
                required: false,
            },
        ];
        let parse = |s: &str| Searched::parse(s).unwrap();
        let space = Space::new(
            &[parse("lambda:layers=3"), parse("task_weights")],
            &schema,
            2,
            (-1.0, 1.5),
            "m",
        )
        .unwrap();
        // λ's own minimum 0 narrows the range; the start is each default, clamped.
        assert_eq!(space.start(), vec![0.3, 0.3, 0.3, 1.0, 1.0]);
        let (inside, outside) = space.repair(&[-0.5, 0.2, 2.0, -2.0, 0.0]);
        assert_eq!(inside, vec![0.0, 0.2, 1.5, -1.0, 0.0]);
        assert!((outside - ((0.5f64 / 1.5).powi(2) + (0.5f64 / 1.5).powi(2) + (1.0f64 / 2.5).powi(2))).abs() < 1e-12);
        let fixed = Map::from_iter([("normalize".to_owned(), Value::from(true))]);
        assert_eq!(
            space.params(&inside, &fixed),
            serde_json::json!({"lambda": [0.0, 0.2, 1.5], "task_weights": [-1.0, 0.0], "normalize": true})
        );
        let err = |s: &[Searched]| Space::new(s, &schema, 2, (0.0, 1.0), "m").err().unwrap().to_string();
        assert!(err(&[parse("mode")]).contains("not a real number"));
        assert!(err(&[parse("nope")]).contains("lambda, task_weights"));
        assert!(err(&[parse("task_weights:layers=2")]).contains("per task"));
        assert!(err(&[parse("lambda"), parse("lambda")]).contains("twice"));
        assert!(Searched::parse("lambda:layers=1").is_err());
        assert!(Searched::parse("lambda:groups=2").is_err());
    }
}
