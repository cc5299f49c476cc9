//! Normalised scores for evaluators that do not know their tasks' experts (suites): each
//! expert scored on its own task gives that task's reference, and every report then carries
//! headline metric ÷ reference, as the demo benchmark's do.

use super::{EvalReport, Evaluator, InMemoryEvaluator, summarise};
use crate::nn::Params;
use mergescope_engine::error::Result;
use std::collections::BTreeMap;
use std::path::Path;
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
    /// `inner`, its reports normalised by `references`.
    pub fn new(inner: Box<dyn Evaluator>, references: References) -> Normalised {
        Normalised { inner, references }
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
