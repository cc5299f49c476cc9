//! Normalised scores for evaluators that do not know their tasks' experts (suites): each
//! expert scored on its own task gives that task's reference, and every report then carries
//! headline metric ÷ reference, as the demo benchmark's do.

use super::{EvalReport, Evaluator, summarise};
use mergescope_engine::error::{EngineError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// An evaluator whose reports are normalised by its experts' scores.
pub struct Normalised {
    inner: Box<dyn Evaluator>,
    references: BTreeMap<String, f64>,
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
        Ok(Normalised { inner, references })
    }

    /// Each task's reference (its expert's headline score).
    pub fn references(&self) -> &BTreeMap<String, f64> {
        &self.references
    }

    /// `report` with every task's normalised score (and their mean) filled in.
    pub fn apply(&self, report: EvalReport) -> EvalReport {
        let tasks = report
            .tasks
            .into_iter()
            .map(|mut t| {
                t.normalized = self
                    .references
                    .get(&t.task)
                    .filter(|r| **r > 0.0)
                    .map(|r| t.accuracy / r);
                t
            })
            .collect();
        summarise(report.split, tasks)
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
        Ok(self.apply(self.inner.evaluate_file(path, cancel)?))
    }
}
