//! Normalised scores for evaluators that do not know their tasks' experts (suites): each
//! expert scored on its own task gives that task's reference, and every report then carries
//! headline metric ÷ reference, as the demo benchmark's do.

use super::{EvalReport, Evaluator, InMemoryEvaluator, summarise};
use crate::nn::Params;
use mergescope_engine::error::{EngineError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// Each task's reference score (its expert's headline score on it).
#[derive(Clone, Debug, PartialEq)]
pub struct References(pub BTreeMap<String, f64>);

impl References {
    /// `report` with every task's normalised score (and their mean) filled in.
    pub fn apply(&self, report: EvalReport) -> EvalReport {
        let tasks = report
            .tasks
            .into_iter()
            .map(|mut t| {
                t.normalized = self.0.get(&t.task).filter(|r| **r > 0.0).map(|r| t.accuracy / r);
                t
            })
            .collect();
        summarise(report.split, tasks)
    }
}

/// An evaluator whose reports are normalised by its experts' scores.
pub struct Normalised {
    inner: Box<dyn Evaluator>,
    references: References,
}

impl Normalised {
    /// Scores expert `i` on task `i` (experts in the evaluator's task order, one per task) and
    /// wraps `inner` so that its reports carry the normalised scores.
    pub fn by_experts(inner: Box<dyn Evaluator>, experts: &[PathBuf], cancel: &AtomicBool) -> Result<Normalised> {
        let tasks = inner.task_names();
        if experts.len() != tasks.len() {
            return Err(EngineError::Param(format!(
                "normalised scores need one expert per task, in task order: {} has {} tasks ({}) but {} experts were given",
                inner.describe(),
                tasks.len(),
                tasks.join(", "),
                experts.len()
            )));
        }
        let mut references = BTreeMap::new();
        for (task, expert) in tasks.iter().zip(experts) {
            let report = inner.evaluate_file(expert, cancel)?;
            let score = report.task(task).map(|t| t.accuracy).ok_or_else(|| {
                EngineError::Bug(format!(
                    "the report of '{}' lacks its own task '{task}'",
                    expert.display()
                ))
            })?;
            references.insert(task.clone(), score);
        }
        Ok(Normalised {
            inner,
            references: References(references),
        })
    }

    /// Each task's reference.
    pub fn references(&self) -> &References {
        &self.references
    }
}

impl Evaluator for Normalised {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn task_names(&self) -> Vec<String> {
        self.inner.task_names()
    }

    fn evaluate_file(&self, path: &Path, cancel: &AtomicBool) -> Result<EvalReport> {
        Ok(self.references.apply(self.inner.evaluate_file(path, cancel)?))
    }

    fn in_memory(&self, like: &Path, samples: usize) -> Result<Option<Box<dyn InMemoryEvaluator>>> {
        Ok(self.inner.in_memory(like, samples)?.map(|inner| {
            Box::new(NormalisedInMemory {
                inner,
                references: self.references.clone(),
            }) as Box<dyn InMemoryEvaluator>
        }))
    }
}

/// The in-memory side of [`Normalised`].
struct NormalisedInMemory {
    inner: Box<dyn InMemoryEvaluator>,
    references: References,
}

impl InMemoryEvaluator for NormalisedInMemory {
    fn evaluate(&self, model: &Params) -> Result<EvalReport> {
        Ok(self.references.apply(self.inner.evaluate(model)?))
    }
}
