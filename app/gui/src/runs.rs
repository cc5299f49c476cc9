//! The merges of a session: what each was asked to do, how far it got, and its per-task
//! scores. Records are plain data so a project file can store them and the table can sort
//! and export them.

use crate::inputs::InputRef;
use mergescope_engine::device::DeviceChoice;
use mergescope_lab::evaluator::EvalReport;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Instant;

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Waiting for the runs before it.
    Queued,
    /// Running now.
    Running,
    /// Finished; the output exists.
    Done,
    /// Stopped by an error (see the record's `error`).
    Failed,
    /// Cancelled by the user; nothing was written.
    Cancelled,
}

impl RunStatus {
    /// Whether the run is queued or running.
    pub fn is_active(self) -> bool {
        matches!(self, RunStatus::Queued | RunStatus::Running)
    }

    /// A word for tables.
    pub fn label(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Done => "done",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

/// Progress of a running job, for the progress bar (not saved).
#[derive(Clone, Debug)]
pub struct Live {
    /// When it started.
    pub started: Instant,
    /// Fraction of the current stage done.
    pub fraction: f32,
    /// Current stage.
    pub stage: String,
}

impl Live {
    /// Seconds since the start and the estimated seconds left (when the fraction allows).
    pub fn times(&self) -> (f64, Option<f64>) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let f = f64::from(self.fraction);
        let left = (f > 0.02 && f < 1.0).then(|| elapsed * (1.0 - f) / f);
        (elapsed, left)
    }
}

/// One merge of the doc.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// Number in the session ("#3").
    pub id: u64,
    /// Plugin id.
    pub method: String,
    /// Plugin version.
    pub plugin_version: String,
    /// Parameters the user set (those left at their defaults are omitted).
    pub params: Map<String, Value>,
    /// Every parameter as the plugin received it (after the run).
    #[serde(default)]
    pub resolved: Value,
    /// Seed.
    pub seed: u64,
    /// Device asked for.
    pub device: DeviceChoice,
    /// Device used (after any fallback).
    #[serde(default)]
    pub device_used: Option<String>,
    /// Base input.
    pub base: Option<InputRef>,
    /// Expert inputs, in order.
    pub experts: Vec<InputRef>,
    /// Output file.
    pub output: PathBuf,
    /// Benchmark the result is evaluated on.
    pub benchmark: Option<PathBuf>,
    /// State.
    pub status: RunStatus,
    /// Seconds the merge took.
    pub seconds: Option<f64>,
    /// Per-task evaluation.
    pub eval: Option<EvalReport>,
    /// Why there is no evaluation, when there is none.
    pub eval_note: Option<String>,
    /// Why the run failed.
    pub error: Option<String>,
    /// What was at fault when it failed (`ErrorKind::label`: input, parameter, plugin, …).
    #[serde(default)]
    pub error_kind: Option<String>,
    /// Notes of the engine and log lines of the plugin.
    pub log: Vec<String>,
    /// Progress while running.
    #[serde(skip)]
    pub live: Option<Live>,
    /// The layer slices the run merged (an opened recipe's; empty: whole models).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<mergescope_interop::slices::Slice>,
}

impl RunRecord {
    /// "#3 ties".
    pub fn title(&self) -> String {
        format!("#{} {}", self.id, self.method)
    }

    /// One line on where the run stands, for the status bar: queued, running (stage and
    /// percentage), done (seconds and mean accuracy), failed (why) or cancelled.
    pub fn state_line(&self) -> String {
        let id = self.id;
        match self.status {
            RunStatus::Queued => format!("run #{id} queued"),
            RunStatus::Running => match &self.live {
                Some(l) => format!("run #{id} running: {} {:.0} %", l.stage, 100.0 * l.fraction),
                None => format!("run #{id} running"),
            },
            RunStatus::Done => {
                let took = self.seconds.map(|s| format!(" in {s:.2} s")).unwrap_or_default();
                let acc = self
                    .eval
                    .as_ref()
                    .map(|e| format!(", mean accuracy {:.1} %", 100.0 * e.mean_accuracy))
                    .unwrap_or_default();
                format!("run #{id} done{took}{acc}")
            }
            RunStatus::Failed => format!("run #{id} failed: {}", self.error.as_deref().unwrap_or("see the log")),
            RunStatus::Cancelled => format!("run #{id} cancelled"),
        }
    }

    /// The user's parameters as `name=value` pairs, or "defaults".
    pub fn params_summary(&self) -> String {
        if self.params.is_empty() {
            return "defaults".to_owned();
        }
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Mean accuracy over tasks, when evaluated.
    pub fn mean_accuracy(&self) -> Option<f64> {
        self.eval.as_ref().map(|e| e.mean_accuracy)
    }

    /// Mean normalised accuracy, when evaluated against experts.
    pub fn mean_normalized(&self) -> Option<f64> {
        self.eval.as_ref().and_then(|e| e.mean_normalized)
    }

    /// Accuracy on `task`, when evaluated.
    pub fn task_accuracy(&self, task: &str) -> Option<f64> {
        self.eval.as_ref()?.task(task).map(|t| t.accuracy)
    }
}

/// A parameter value as the CLI and tables write it (lists comma-separated).
pub fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(value_text).collect::<Vec<_>>().join(","),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format_float(f),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A float with as few digits as show it exactly (up to 6 significant), e.g. 0.3, 1e-05.
pub fn format_float(f: f64) -> String {
    let s = format!("{f:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "0" && f != 0.0 {
        format!("{f:e}")
    } else {
        s.to_owned()
    }
}

/// Columns a results table can be sorted by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SortKey {
    /// Run number.
    Id,
    /// Method id.
    Method,
    /// Mean accuracy.
    MeanAccuracy,
    /// Mean normalised accuracy.
    MeanNormalized,
    /// Accuracy on a task.
    Task(String),
    /// Merge time.
    Seconds,
}

/// Sorts `runs` (records or references to them) by `key` (runs without a value last,
/// whatever the direction).
pub fn sort_runs<R: std::borrow::Borrow<RunRecord>>(runs: &mut [R], key: &SortKey, descending: bool) {
    let num = |r: &RunRecord| -> Option<f64> {
        match key {
            SortKey::Id => Some(r.id as f64),
            SortKey::MeanAccuracy => r.mean_accuracy(),
            SortKey::MeanNormalized => r.mean_normalized(),
            SortKey::Task(t) => r.task_accuracy(t),
            SortKey::Seconds => r.seconds,
            SortKey::Method => None,
        }
    };
    runs.sort_by(|a, b| {
        use std::cmp::Ordering;
        let (a, b) = (a.borrow(), b.borrow());
        let ord = if *key == SortKey::Method {
            a.method.cmp(&b.method).then(a.id.cmp(&b.id))
        } else {
            match (num(a), num(b)) {
                (Some(x), Some(y)) => x.total_cmp(&y),
                (Some(_), None) => return Ordering::Less,
                (None, Some(_)) => return Ordering::Greater,
                (None, None) => a.id.cmp(&b.id),
            }
        };
        if descending { ord.reverse() } else { ord }
    });
}

/// The task names of the evaluated runs, in first-seen order.
pub fn task_names<'a>(runs: impl IntoIterator<Item = &'a RunRecord>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in runs {
        for t in r.eval.iter().flat_map(|e| &e.tasks) {
            if !names.contains(&t.task) {
                names.push(t.task.clone());
            }
        }
    }
    names
}

/// The table as CSV: one row per run, per-task accuracy and normalised accuracy columns.
pub fn to_csv(runs: &[RunRecord]) -> String {
    let tasks = task_names(runs);
    let mut header = vec![
        "run",
        "method",
        "version",
        "params",
        "seed",
        "status",
        "seconds",
        "mean_accuracy",
        "mean_normalized",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    for t in &tasks {
        header.push(format!("{t}_accuracy"));
        header.push(format!("{t}_normalized"));
    }
    header.push("output".into());
    let mut out = header.join(",");
    out.push('\n');
    let opt = |x: Option<f64>| x.map(|v| format!("{v:.6}")).unwrap_or_default();
    for r in runs {
        let mut row = vec![
            r.id.to_string(),
            csv_field(&r.method),
            csv_field(&r.plugin_version),
            csv_field(&r.params_summary()),
            r.seed.to_string(),
            r.status.label().to_owned(),
            opt(r.seconds),
            opt(r.mean_accuracy()),
            opt(r.mean_normalized()),
        ];
        for t in &tasks {
            let s = r.eval.as_ref().and_then(|e| e.task(t));
            row.push(opt(s.map(|s| s.accuracy)));
            row.push(opt(s.and_then(|s| s.normalized)));
        }
        row.push(csv_field(&r.output.display().to_string()));
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Quotes a path or value for a POSIX shell when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '=' | ',' | ':' | '+'));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The `mergescope merge` command that repeats this run.
pub fn cli_command(r: &RunRecord) -> String {
    let q = |p: &std::path::Path| shell_quote(&p.display().to_string());
    let mut cmd = format!("mergescope merge --method {}", shell_quote(&r.method));
    if let Some(b) = &r.base {
        cmd.push_str(&format!(" --base {}", q(&b.path)));
    }
    cmd.push_str(" --expert");
    for e in &r.experts {
        cmd.push(' ');
        cmd.push_str(&q(&e.path));
    }
    for (k, v) in &r.params {
        cmd.push_str(&format!(" --param {}", shell_quote(&format!("{k}={}", value_text(v)))));
    }
    cmd.push_str(&format!(" --seed {}", r.seed));
    if r.device != DeviceChoice::Cpu {
        let d = serde_json::to_value(r.device)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        cmd.push_str(&format!(" --device {d}"));
    }
    cmd.push_str(&format!(" --out {}", q(&r.output)));
    if let Some(b) = &r.benchmark {
        cmd.push_str(&format!(" --eval --benchmark {}", q(b)));
    }
    cmd
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mergescope_lab::data::SplitKind;
    use mergescope_lab::evaluator::TaskScore;
    use serde_json::json;

    /// A finished run of `method` with these test accuracies (for tests elsewhere too).
    pub(crate) fn run(id: u64, method: &str, accs: &[(&str, f64)]) -> RunRecord {
        let tasks: Vec<TaskScore> = accs
            .iter()
            .map(|(t, a)| TaskScore::classification(*t, *a, 1.0 - a, Some(0.9), 500))
            .collect();
        let n = tasks.len().max(1) as f64;
        let eval = (!tasks.is_empty()).then(|| EvalReport {
            split: SplitKind::Test,
            mean_accuracy: tasks.iter().map(|t| t.accuracy).sum::<f64>() / n,
            mean_loss: Some(0.0),
            mean_normalized: Some(tasks.iter().map(|t| t.accuracy / 0.9).sum::<f64>() / n),
            tasks,
        });
        RunRecord {
            id,
            method: method.into(),
            plugin_version: "1.0.0".into(),
            params: Map::new(),
            resolved: Value::Null,
            seed: 0,
            device: DeviceChoice::Cpu,
            device_used: None,
            base: Some(InputRef {
                path: "/m/base.safetensors".into(),
                label: "base".into(),
            }),
            experts: vec![
                InputRef {
                    path: "/m/a.safetensors".into(),
                    label: "a".into(),
                },
                InputRef {
                    path: "/m/my b.safetensors".into(),
                    label: "b".into(),
                },
            ],
            output: format!("/out/merge-{id}.safetensors").into(),
            benchmark: None,
            status: RunStatus::Done,
            seconds: Some(id as f64),
            eval,
            eval_note: None,
            error: None,
            error_kind: None,
            log: Vec::new(),
            live: None,
            slices: Vec::new(),
        }
    }

    #[test]
    fn sorting_puts_unevaluated_runs_last_both_ways() {
        let mut runs = vec![
            run(1, "ties", &[("mnist", 0.8), ("fashion", 0.7)]),
            run(2, "dare", &[]),
            run(3, "cart", &[("mnist", 0.9), ("fashion", 0.5)]),
        ];
        sort_runs(&mut runs, &SortKey::MeanAccuracy, true);
        assert_eq!(runs.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 3, 2]);
        sort_runs(&mut runs, &SortKey::Task("mnist".into()), true);
        assert_eq!(runs.iter().map(|r| r.id).collect::<Vec<_>>(), [3, 1, 2]);
        sort_runs(&mut runs, &SortKey::Task("mnist".into()), false);
        assert_eq!(runs.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 3, 2]);
        sort_runs(&mut runs, &SortKey::Method, false);
        assert_eq!(
            runs.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(),
            ["cart", "dare", "ties"]
        );
    }

    #[test]
    fn csv_has_one_column_pair_per_task_and_quotes_commas() {
        let mut a = run(1, "ties", &[("mnist", 0.8), ("fashion", 0.7)]);
        a.params.insert("density".into(), json!(0.2));
        a.params.insert("lambda".into(), json!([0.5, 1.0]));
        let csv = to_csv(&[a, run(2, "dare", &[])]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "run,method,version,params,seed,status,seconds,mean_accuracy,mean_normalized,\
             mnist_accuracy,mnist_normalized,fashion_accuracy,fashion_normalized,output"
        );
        assert!(lines[1].starts_with("1,ties,1.0.0,\"density=0.2, lambda=0.5,1\",0,done,1.000000,0.750000,"));
        assert!(
            lines[1].contains(",0.800000,0.888889,0.700000,0.777778,"),
            "{}",
            lines[1]
        );
        assert_eq!(
            lines[2],
            "2,dare,1.0.0,defaults,0,done,2.000000,,,,,,,/out/merge-2.safetensors"
        );
    }

    #[test]
    fn cli_command_repeats_the_run_with_quoted_paths() {
        let mut r = run(4, "task-arithmetic", &[]);
        r.params.insert("lambda".into(), json!(0.3));
        r.benchmark = Some("/c/demo/cnn-seed0".into());
        assert_eq!(
            cli_command(&r),
            "mergescope merge --method task-arithmetic --base /m/base.safetensors --expert /m/a.safetensors \
             '/m/my b.safetensors' --param lambda=0.3 --seed 0 --out /out/merge-4.safetensors \
             --eval --benchmark /c/demo/cnn-seed0"
        );
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn floats_print_short() {
        assert_eq!(format_float(0.3), "0.3");
        assert_eq!(format_float(1.0), "1");
        assert_eq!(format_float(0.000_001_5), "0.000002");
        assert_eq!(format_float(1e-9), "1e-9");
        assert_eq!(value_text(&json!([0.5, 1.0])), "0.5,1");
    }
}
