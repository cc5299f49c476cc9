//! What an evaluation gives: per-task scores and their means.

use crate::data::SplitKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The headline metric of the demo benchmark's tasks.
pub const ACCURACY: &str = "accuracy";

fn accuracy_name() -> String {
    ACCURACY.to_owned()
}

/// One task's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskScore {
    /// Task name.
    pub task: String,
    /// The task's headline metric, higher is better: the fraction classified correctly for
    /// classification tasks, else the metric [`TaskScore::metric`] names.
    pub accuracy: f64,
    /// Name of the headline metric (`accuracy` unless a suite names another).
    #[serde(default = "accuracy_name")]
    pub metric: String,
    /// Mean cross-entropy, when the evaluator computes one.
    pub loss: Option<f64>,
    /// Headline metric ÷ the task's expert's on the same split, when known.
    pub normalized: Option<f64>,
    /// Examples evaluated (0 when the evaluator does not say).
    pub examples: usize,
    /// Every metric the evaluator reported for the task, by name (an external command's
    /// whole JSON object; empty for the built-in evaluators, whose metrics are the fields).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
}

impl TaskScore {
    /// A classification task's score: accuracy, loss, examples and (with the expert's accuracy
    /// `reference`) normalised accuracy.
    pub fn classification(
        task: impl Into<String>,
        accuracy: f64,
        loss: f64,
        reference: Option<f64>,
        examples: usize,
    ) -> TaskScore {
        TaskScore {
            task: task.into(),
            accuracy,
            metric: accuracy_name(),
            loss: Some(loss),
            normalized: reference.filter(|r| *r > 0.0).map(|r| accuracy / r),
            examples,
            metrics: BTreeMap::new(),
        }
    }
}

/// Results on every task, with their unweighted means.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Split evaluated.
    pub split: SplitKind,
    /// Per-task results, in task order.
    pub tasks: Vec<TaskScore>,
    /// Mean headline metric over tasks.
    pub mean_accuracy: f64,
    /// Mean loss over tasks, when every task has one.
    pub mean_loss: Option<f64>,
    /// Mean normalised accuracy, when every task has a reference.
    pub mean_normalized: Option<f64>,
}

impl EvalReport {
    /// The score of task `name`.
    pub fn task(&self, name: &str) -> Option<&TaskScore> {
        self.tasks.iter().find(|t| t.task == name)
    }

    /// The report as `{"tasks": {"<task>": {"<metric>": value, ...}}, "average": {...}}`: every
    /// metric of every task, and each metric's mean over the tasks that have it.
    pub fn metrics_json(&self) -> serde_json::Value {
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        let mut tasks = serde_json::Map::new();
        for t in &self.tasks {
            let mut m: BTreeMap<String, f64> = t.metrics.clone();
            m.insert(t.metric.clone(), t.accuracy);
            if let Some(l) = t.loss {
                m.insert("loss".into(), l);
            }
            if let Some(n) = t.normalized {
                m.insert(format!("normalized_{}", t.metric), n);
            }
            for (k, v) in &m {
                let e = sums.entry(k.clone()).or_insert((0.0, 0));
                e.0 += v;
                e.1 += 1;
            }
            tasks.insert(t.task.clone(), serde_json::json!(m));
        }
        let average: BTreeMap<String, f64> = sums.into_iter().map(|(k, (s, n))| (k, s / n as f64)).collect();
        serde_json::json!({ "tasks": tasks, "average": average })
    }
}

/// The report of `tasks` with their means.
pub fn summarise(split: SplitKind, tasks: Vec<TaskScore>) -> EvalReport {
    let n = tasks.len().max(1) as f64;
    let mean_of = |v: Option<Vec<f64>>| {
        v.filter(|v| !v.is_empty())
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mean_normalized = mean_of(tasks.iter().map(|t| t.normalized).collect());
    let mean_loss = mean_of(tasks.iter().map(|t| t.loss).collect());
    EvalReport {
        split,
        mean_accuracy: tasks.iter().map(|t| t.accuracy).sum::<f64>() / n,
        mean_loss,
        mean_normalized,
        tasks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_cover_only_metrics_every_task_has() {
        let mut b = TaskScore::classification("b", 0.5, 2.0, None, 10);
        b.loss = None;
        let r = summarise(
            SplitKind::Test,
            vec![TaskScore::classification("a", 0.9, 1.0, Some(0.9), 10), b],
        );
        assert!((r.mean_accuracy - 0.7).abs() < 1e-12);
        assert_eq!(r.mean_loss, None);
        assert_eq!(r.mean_normalized, None);
        let j = r.metrics_json();
        assert_eq!(j["tasks"]["a"]["accuracy"], 0.9);
        assert_eq!(j["tasks"]["a"]["normalized_accuracy"], 1.0);
        assert_eq!(j["tasks"]["b"].get("loss"), None);
        // Averages are over the tasks that report the metric.
        assert_eq!(j["average"]["loss"], 1.0);
        assert!((j["average"]["accuracy"].as_f64().unwrap() - 0.7).abs() < 1e-12);
    }
}
