//! An evaluator that is an external command: mergescope runs it with the checkpoint's path
//! substituted for `{model}` and reads per-task metrics as JSON from its standard output (or
//! from a file it writes).
//!
//! Accepted JSON (the last JSON object the command prints, or the whole file):
//! - `{"<task>": {"<metric>": number, ...}, ...}`;
//! - lm-evaluation-harness's results file, `{"results": {"<task>": {"<metric>,<filter>":
//!   number, ...}}, ...}`: a metric `acc` matches the key `acc,none`.
//!
//! Non-numeric values (lm-evaluation-harness's `alias`) are ignored.

use super::report::TaskScore;
use super::{EvalReport, Evaluator, summarise};
use crate::data::SplitKind;
use mergescope_engine::error::{EngineError, Result};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The placeholder replaced by the candidate's path in every argument of the command.
pub const MODEL_PLACEHOLDER: &str = "{model}";

/// Lines of the command's standard error quoted when it fails.
const STDERR_LINES: usize = 12;

/// Runs an external command per checkpoint and reads its per-task metrics.
#[derive(Clone, Debug)]
pub struct CommandEvaluator {
    /// Name shown in messages (the suite's name).
    pub name: String,
    /// Program and arguments; `{model}` is replaced by the checkpoint's path.
    pub command: Vec<String>,
    /// Folder the command runs in (the suite file's folder).
    pub workdir: PathBuf,
    /// The headline metric read for every task.
    pub metric: String,
    /// The tasks, in report order.
    pub tasks: Vec<String>,
    /// The command is stopped after this long.
    pub timeout: Duration,
    /// Read the metrics from this file (`{model}` substituted, relative to `workdir`) instead
    /// of standard output.
    pub output_file: Option<String>,
    /// Hand the command a Hugging Face folder instead of the bare checkpoint: the candidate's
    /// weights beside this folder's config, tokenizer and other non-weight files (what
    /// `transformers` and lm-evaluation-harness load).
    pub model_folder: Option<PathBuf>,
}

/// Extensions of weight files, which a staged folder takes from the candidate, never from the
/// model folder.
const WEIGHT_EXTENSIONS: &[&str] = &["safetensors", "bin", "pt", "pth", "ckpt", "gguf", "h5", "msgpack"];

fn is_weight_file(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".index.json")
        || Path::new(&lower)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| WEIGHT_EXTENSIONS.contains(&e))
}

/// Puts `to` in place as a link to `from` (a hard link, else a symbolic link, else a copy):
/// the candidate's weights are never copied when the file system allows otherwise.
fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    #[cfg(unix)]
    if let Ok(abs) = std::fs::canonicalize(from)
        && std::os::unix::fs::symlink(abs, to).is_ok()
    {
        return Ok(());
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| EngineError::io("copy", from, e))
}

/// A temporary Hugging Face folder holding `weights` (a `.safetensors` file, as
/// `model.safetensors`, or a shard folder's files) and every non-weight file of `support`;
/// removed when dropped.
pub fn stage_hf_folder(weights: &Path, support: &Path) -> Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("mergescope-candidate-")
        .tempdir()
        .map_err(|e| EngineError::io("create a temporary folder in", std::env::temp_dir(), e))?;
    let entries = std::fs::read_dir(support).map_err(|e| EngineError::io("read the model folder", support, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::io("read the model folder", support, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_file() && !is_weight_file(&name) {
            std::fs::copy(entry.path(), dir.path().join(&name))
                .map_err(|e| EngineError::io("copy", entry.path(), e))?;
        }
    }
    if weights.is_dir() {
        let shards = std::fs::read_dir(weights).map_err(|e| EngineError::io("read", weights, e))?;
        for entry in shards {
            let entry = entry.map_err(|e| EngineError::io("read", weights, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_weight_file(&name) {
                link_or_copy(&entry.path(), &dir.path().join(&name))?;
            }
        }
    } else {
        link_or_copy(weights, &dir.path().join("model.safetensors"))?;
    }
    Ok(dir)
}

impl CommandEvaluator {
    fn substitute(&self, text: &str, model: &Path) -> String {
        text.replace(MODEL_PLACEHOLDER, &model.display().to_string())
    }

    /// Runs the command on `model` and returns its standard output.
    fn run(&self, model: &Path, cancel: &AtomicBool) -> Result<String> {
        let Some((program, args)) = self.command.split_first() else {
            return Err(EngineError::Param(format!(
                "suite '{}': [evaluator] command is empty; write e.g. command = [\"python3\", \"score.py\", \"{{model}}\"]",
                self.name
            )));
        };
        let shown = self.command.join(" ");
        let mut child = Command::new(self.substitute(program, model))
            .args(args.iter().map(|a| self.substitute(a, model)))
            .current_dir(&self.workdir)
            .env("MERGESCOPE_MODEL", model)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                EngineError::Evaluator(format!(
                    "suite '{}': cannot start the evaluator command '{shown}' in '{}': {e}; check that \
                     '{program}' is installed and on PATH",
                    self.name,
                    self.workdir.display()
                ))
            })?;
        // Drain both pipes on their own threads so a chatty command never blocks on a full pipe.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut text = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut text);
                }
                String::from_utf8_lossy(&text).into_owned()
            })
        };
        let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(|e| EngineError::io("wait for", &self.workdir, e))?
            {
                break status;
            }
            let stop = if cancel.load(Ordering::Relaxed) {
                Some(EngineError::Cancelled)
            } else if started.elapsed() > self.timeout {
                Some(EngineError::Evaluator(format!(
                    "suite '{}': the evaluator command '{shown}' ran longer than {} s on '{}' and was stopped; \
                     raise timeout_s in the suite's [evaluator] table if it needs longer",
                    self.name,
                    self.timeout.as_secs(),
                    model.display()
                )))
            } else {
                None
            };
            if let Some(e) = stop {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = stdout.join().unwrap_or_default();
        let err = stderr.join().unwrap_or_default();
        if !status.success() {
            let tail: Vec<&str> = err.lines().rev().take(STDERR_LINES).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(EngineError::Evaluator(format!(
                "suite '{}': the evaluator command '{shown}' failed on '{}' ({status}){}",
                self.name,
                model.display(),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; its last error output:\n{}", tail.join("\n"))
                }
            )));
        }
        Ok(out)
    }
}

impl Evaluator for CommandEvaluator {
    fn describe(&self) -> String {
        format!("suite '{}' (command: {})", self.name, self.command.join(" "))
    }

    fn task_names(&self) -> Vec<String> {
        self.tasks.clone()
    }

    fn evaluate_file(&self, path: &Path, cancel: &AtomicBool) -> Result<EvalReport> {
        let staged = match &self.model_folder {
            Some(folder) => Some(stage_hf_folder(path, folder)?),
            None => None,
        };
        let path = staged.as_ref().map_or(path, |d| d.path());
        let stdout = self.run(path, cancel)?;
        let (text, source) = match &self.output_file {
            Some(f) => {
                let file = self.workdir.join(self.substitute(f, path));
                let text = std::fs::read_to_string(&file).map_err(|e| EngineError::io("read", &file, e))?;
                (text, format!("'{}'", file.display()))
            }
            None => (stdout, "its standard output".to_owned()),
        };
        let tasks = parse_metrics_json(&text, &self.tasks, &self.metric)
            .map_err(|e| EngineError::Evaluator(format!("suite '{}': reading {source}: {e}", self.name)))?;
        Ok(summarise(SplitKind::Test, tasks))
    }
}

/// The last JSON object in `text`: the whole text, or its last line that starts with `{`
/// through the end (a command may log before printing its result).
fn last_json_object(text: &str) -> std::result::Result<serde_json::Value, String> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(trimmed) {
        return Ok(v);
    }
    let mut starts: Vec<usize> = trimmed.match_indices("\n{").map(|(i, _)| i + 1).collect();
    starts.reverse();
    for s in starts {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&trimmed[s..]) {
            return Ok(v);
        }
    }
    let head: String = trimmed.chars().take(200).collect();
    Err(if trimmed.is_empty() {
        "it is empty; the command must print {\"<task>\": {\"<metric>\": number}, ...}".to_owned()
    } else {
        format!("it holds no JSON object (it begins: {head:?}); print {{\"<task>\": {{\"<metric>\": number}}, ...}}")
    })
}

/// Per-task scores from an evaluator's JSON `text`: every task of `tasks` must be there with
/// the headline `metric`.
pub fn parse_metrics_json(text: &str, tasks: &[String], metric: &str) -> std::result::Result<Vec<TaskScore>, String> {
    let value = last_json_object(text)?;
    let Some(mut root) = value.as_object() else {
        return Err("the JSON is not an object of tasks".to_owned());
    };
    // lm-evaluation-harness: {"results": {task: {"acc,none": ..}}, "configs": .., ...}
    if let Some(results) = root.get("results").and_then(|r| r.as_object())
        && !tasks.iter().any(|t| t == "results")
    {
        root = results;
    }
    tasks
        .iter()
        .map(|task| {
            let Some(entry) = root.get(task) else {
                let have: Vec<&str> = root.keys().map(String::as_str).collect();
                return Err(format!(
                    "task '{task}' is missing (it has: {}); the suite's tasks must be the keys the command prints",
                    have.join(", ")
                ));
            };
            let Some(entry) = entry.as_object() else {
                return Err(format!("task '{task}': expected an object of metrics, got {entry}"));
            };
            let metrics: BTreeMap<String, f64> = entry
                .iter()
                .filter_map(|(k, v)| v.as_f64().map(|v| (k.clone(), v)))
                .collect();
            let headline = metrics
                .get(metric)
                .or_else(|| {
                    metrics
                        .iter()
                        .find(|(k, _)| k.split_once(',').is_some_and(|(name, _)| name == metric))
                        .map(|(_, v)| v)
                })
                .copied();
            let Some(score) = headline else {
                let have: Vec<&str> = metrics.keys().map(String::as_str).collect();
                return Err(format!(
                    "task '{task}' has no numeric metric '{metric}' (it has: {}); set metric in the suite's \
                     [evaluator] table to one of them",
                    have.join(", ")
                ));
            };
            if !score.is_finite() {
                return Err(format!(
                    "task '{task}': metric '{metric}' is {score}, not a finite number"
                ));
            }
            Ok(TaskScore {
                task: task.clone(),
                accuracy: score,
                metric: metric.to_owned(),
                loss: metrics.get("loss").copied(),
                normalized: None,
                examples: 0,
                metrics,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_layout_after_log_lines() {
        let text = "loading model...\nscoring 2 tasks\n{\"a\": {\"accuracy\": 0.75, \"f1\": 0.5},\n \"b\": {\"accuracy\": 0.25}}\n";
        let s = parse_metrics_json(text, &names(&["a", "b"]), "accuracy").unwrap();
        assert_eq!(s[0].accuracy, 0.75);
        assert_eq!(s[0].metrics["f1"], 0.5);
        assert_eq!(s[1].accuracy, 0.25);
        assert_eq!(s[1].loss, None);
    }

    #[test]
    fn lm_evaluation_harness_results_file() {
        // The layout of lm_eval's results_*.json (trimmed): metric keys carry a filter suffix.
        let text = r#"{"results": {"arc_easy": {"alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.01,
            "acc_norm,none": 0.625}, "hellaswag": {"alias": "hellaswag", "acc,none": 0.25}},
            "configs": {}, "versions": {"arc_easy": 1.0}}"#;
        let s = parse_metrics_json(text, &names(&["hellaswag", "arc_easy"]), "acc").unwrap();
        assert_eq!((s[0].task.as_str(), s[0].accuracy), ("hellaswag", 0.25));
        assert_eq!(s[1].accuracy, 0.5);
        let s = parse_metrics_json(text, &names(&["arc_easy"]), "acc_norm").unwrap();
        assert_eq!(s[0].accuracy, 0.625);
    }

    #[test]
    fn errors_name_what_is_missing() {
        let text = r#"{"a": {"accuracy": 0.5}}"#;
        let e = parse_metrics_json(text, &names(&["a", "c"]), "accuracy").unwrap_err();
        assert!(e.contains("task 'c' is missing") && e.contains("it has: a"), "{e}");
        let e = parse_metrics_json(text, &names(&["a"]), "f1").unwrap_err();
        assert!(
            e.contains("no numeric metric 'f1'") && e.contains("it has: accuracy"),
            "{e}"
        );
        let e = parse_metrics_json("", &names(&["a"]), "f1").unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = parse_metrics_json("Traceback: boom", &names(&["a"]), "f1").unwrap_err();
        assert!(e.contains("no JSON object") && e.contains("Traceback"), "{e}");
    }
}
