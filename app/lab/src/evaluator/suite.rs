//! Task suites: a TOML file naming how checkpoints are evaluated. The smallest suite names an
//! external command, the metric it reports and the tasks:
//!
//! ```toml
//! name = "my-eval"
//!
//! [evaluator]
//! command = ["python3", "score.py", "{model}"]
//! metric = "accuracy"
//! tasks = ["task_a", "task_b", "task_c"]
//! # optional: timeout_s = 3600, output = "results/{model}.json" (read instead of stdout),
//! # model_folder = "models/base" ({model} is then a Hugging Face folder: the candidate's
//! # weights with that folder's config and tokenizer)
//! ```
//!
//! The command runs in the suite file's folder with `{model}` replaced by the checkpoint's path
//! (a file or a shard folder); see [`super::CommandEvaluator`] for the JSON it prints.
//!
//! A suite may instead name a built-in model family and its tasks; paths are relative to the
//! suite file:
//!
//! ```toml
//! name = "text-tasks"
//!
//! [model]
//! family = "bert"                    # by config.json's model_type: bert (BERT, MiniLM),
//!                                    # distilbert, roberta, xlm-roberta, and their fine-tunes
//! config = "models/base/config.json" # default: config.json beside the evaluated checkpoint,
//!                                    # else beside the [models] base
//! tokenizer = "models/base/tokenizer.json" # default: the same way
//! max_length = 128                   # tokens kept per example (default 128; causal-lm 2048)
//! batch_size = 32                    # examples per forward pass (default 32; causal-lm:
//!                                    # questions, all their choices together, or text
//!                                    # windows, default 4)
//!
//! [[task]]
//! name = "sst2"
//! data = "data/sst2.jsonl"           # or .csv; fields text, label (and text_pair)
//! calibration = "data/sst2-val.jsonl" # optional: what `compare` searches λ and model-level
//!                                    # methods (AdaMerging, Frank-Wolfe, Fisher) learn on
//! train = "data/sst2-train.jsonl"    # optional: what MIMA fine-tunes on
//!                                    # (causal-lm: both in the format of data, .jsonl
//!                                    # questions or a .txt text)
//! head = "models/sst2"               # its fine-tuned model (its classifier: classifier.*,
//!                                    # DistilBERT's pre_classifier.* too);
//!                                    # default: the evaluated checkpoint's own head (the
//!                                    # task's expert's in model-level methods)
//! labels = ["negative", "positive"]  # optional: class names used as labels in the data
//! ```
//!
//! Either kind may name the models that commands such as `analyze radar` use when no
//! `--base`/`--expert` is given; experts listed one per task, in task order, also give each
//! task's reference for normalised accuracy:
//!
//! ```toml
//! [models]
//! base = "models/base"
//! experts = ["models/sst2", "models/mnli"]
//! ```

use super::calibration::CalibrationTasks;
use super::family_calibration::FamilyCalibration;
use super::image_classifier::{ClipModelSpec, ImageClassifierEvaluator, ImageTask};
use super::language_model::{LmEvaluator, LmModelSpec, read_lm_task};
use super::text_classifier::{TextClassifierEvaluator, TextModelSpec, TextTask};
use super::{CommandEvaluator, Evaluator, References};
use crate::family::bert::ClassifierHead;
use crate::family::image_data::read_image_folder;
use crate::family::text_data::read_text_task;
use candle_core::Device;
use candle_core::Tensor;
use mergescope_engine::checkpoint::Checkpoint;
use mergescope_engine::error::{EngineError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The model families a suite's `[model] family` may name.
pub const FAMILIES: &[&str] = &["bert", "clip", "causal-lm"];

/// The prompt template of CLIP zero-shot heads unless a suite names others.
pub const DEFAULT_TEMPLATE: &str = "a photo of a {}.";

/// How long an evaluator command may run on one checkpoint unless the suite says otherwise.
pub const DEFAULT_TIMEOUT_S: u64 = 3600;

/// True when `spec` names a suite file rather than a built-in benchmark.
pub fn is_suite_path(spec: &str) -> bool {
    Path::new(spec)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
}

/// A suite file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    name: String,
    #[serde(default)]
    evaluator: Option<EvaluatorTable>,
    #[serde(default)]
    model: Option<ModelTable>,
    #[serde(default)]
    task: Vec<TaskTable>,
    #[serde(default)]
    models: Option<ModelsTable>,
}

/// `[models]`: the base and experts the suite's commands use when no --base/--expert is given.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsTable {
    base: String,
    #[serde(default)]
    experts: Vec<String>,
}

/// The base and experts a suite names, as paths (relative ones from the suite's folder).
#[derive(Clone, Debug, PartialEq)]
pub struct SuiteModels {
    /// The base checkpoint.
    pub base: PathBuf,
    /// The experts, in task order when there is one per task.
    pub experts: Vec<PathBuf>,
}

/// `[model]`: a built-in family and how its inputs are found.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelTable {
    family: String,
    #[serde(default)]
    config: Option<String>,
    #[serde(default)]
    tokenizer: Option<String>,
    #[serde(default)]
    max_length: Option<usize>,
    #[serde(default)]
    batch_size: Option<usize>,
    #[serde(default)]
    zeroshot_from: Option<String>,
    #[serde(default)]
    templates: Option<Vec<String>>,
}

impl ModelTable {
    /// Examples per forward pass: the suite's, else the family's default.
    fn batch_size(&self) -> usize {
        self.batch_size.unwrap_or_else(|| default_batch_size(&self.family))
    }
}

/// `[[task]]`: one task of a family suite.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskTable {
    name: String,
    data: String,
    #[serde(default)]
    calibration: Option<String>,
    #[serde(default)]
    train: Option<String>,
    #[serde(default)]
    head: Option<String>,
    #[serde(default)]
    labels: Option<Vec<String>>,
    #[serde(default)]
    templates: Option<Vec<String>>,
}

/// Examples per forward pass unless the suite says otherwise: a causal LM's are questions with
/// all their choices, or windows of up to `max_length` tokens, each scored over the vocabulary.
fn default_batch_size(family: &str) -> usize {
    if family == "causal-lm" { 4 } else { 32 }
}

/// Every task paired with the file `pick` names for it (its calibration or train data), when
/// every task names one.
fn paired(tasks: &[TaskTable], pick: fn(&TaskTable) -> Option<&str>) -> Option<Vec<(&TaskTable, &str)>> {
    tasks.iter().map(|t| pick(t).map(|d| (t, d))).collect()
}

/// What a suite evaluates with.
#[derive(Clone, Debug)]
enum SuiteKind {
    /// An external command.
    Command(EvaluatorTable),
    /// A built-in family on the suite's tasks.
    Family { model: ModelTable, tasks: Vec<TaskTable> },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvaluatorTable {
    command: Vec<String>,
    #[serde(default = "default_metric")]
    metric: String,
    tasks: Vec<String>,
    #[serde(default = "default_timeout")]
    timeout_s: u64,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    model_folder: Option<String>,
}

fn default_metric() -> String {
    super::report::ACCURACY.to_owned()
}

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_S
}

/// A loaded, checked suite.
#[derive(Clone, Debug)]
pub struct Suite {
    /// The suite's name.
    pub name: String,
    /// The file it was read from.
    pub path: PathBuf,
    kind: SuiteKind,
    models: Option<ModelsTable>,
}

impl Suite {
    /// Reads and checks the suite at `path`; errors name the file, the key and the fix.
    pub fn load(path: &Path) -> Result<Suite> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io("read the suite", path, e))?;
        let file: SuiteFile = toml::from_str(&text)
            .map_err(|e| EngineError::Param(format!("suite '{}': {}", path.display(), e.to_string().trim_end())))?;
        let at = |key: &str, what: String| EngineError::Param(format!("suite '{}', {key}: {what}", path.display()));
        let kind = match (file.evaluator, file.model) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "[evaluator] and [model]",
                    "a suite evaluates with a command or a built-in family, not both; keep one of the two tables"
                        .into(),
                ));
            }
            (None, None) => {
                return Err(at(
                    "[evaluator] or [model]",
                    "is missing; name an external command ([evaluator] command = [...]) or a family ([model] family = \"bert\")"
                        .into(),
                ));
            }
            (Some(ev), None) => {
                if !file.task.is_empty() {
                    return Err(at(
                        "[[task]]",
                        "belongs to [model] suites; an [evaluator] command lists its tasks as tasks = [...]".into(),
                    ));
                }
                Self::check_command(&ev, &at)?;
                if let Some(f) = &ev.model_folder {
                    let dir = path.parent().unwrap_or(Path::new(".")).join(f);
                    if !dir.join("config.json").is_file() {
                        return Err(at(
                            "[evaluator] model_folder",
                            format!(
                                "'{}' has no config.json; name the base model's Hugging Face folder, whose config and tokenizer go beside each candidate",
                                dir.display()
                            ),
                        ));
                    }
                }
                SuiteKind::Command(ev)
            }
            (None, Some(model)) => {
                Self::check_family(&model, &file.task, &at)?;
                SuiteKind::Family {
                    model,
                    tasks: file.task,
                }
            }
        };
        Ok(Suite {
            name: file.name,
            path: path.to_owned(),
            kind,
            models: file.models,
        })
    }

    /// The `[models]` table's base and experts, if the suite has one.
    pub fn models(&self) -> Option<SuiteModels> {
        let dir = self.folder();
        self.models.as_ref().map(|m| SuiteModels {
            base: dir.join(&m.base),
            experts: m.experts.iter().map(|e| dir.join(e)).collect(),
        })
    }

    fn check_family(model: &ModelTable, tasks: &[TaskTable], at: &dyn Fn(&str, String) -> EngineError) -> Result<()> {
        if !FAMILIES.contains(&model.family.as_str()) {
            return Err(at(
                "[model] family",
                format!(
                    "'{}' is not a family mergescope knows; use one of: {} (or an [evaluator] command for any other model)",
                    model.family,
                    FAMILIES.join(", ")
                ),
            ));
        }
        if tasks.is_empty() {
            return Err(at(
                "[[task]]",
                "is missing; add a [[task]] table with a name and data for each task".into(),
            ));
        }
        if model.family != "clip"
            && (model.zeroshot_from.is_some()
                || model.templates.is_some()
                || tasks.iter().any(|t| t.templates.is_some()))
        {
            return Err(at(
                "[model] zeroshot_from / templates",
                format!(
                    "belong to the clip family's zero-shot heads; the {} family does not read them",
                    model.family
                ),
            ));
        }
        if let Some((i, t)) = tasks
            .iter()
            .enumerate()
            .find(|(i, t)| tasks[..*i].iter().any(|u| u.name == t.name))
        {
            return Err(at(
                &format!("[[task]] {}", i + 1),
                format!("the name '{}' is used twice", t.name),
            ));
        }
        Ok(())
    }

    fn check_command(ev: &EvaluatorTable, at: &dyn Fn(&str, String) -> EngineError) -> Result<()> {
        if ev.command.is_empty() || ev.command[0].trim().is_empty() {
            return Err(at(
                "[evaluator] command",
                "is empty; write the program and its arguments, e.g. [\"python3\", \"score.py\", \"{model}\"]".into(),
            ));
        }
        if !ev.command.iter().any(|a| a.contains(super::command::MODEL_PLACEHOLDER)) {
            return Err(at(
                "[evaluator] command",
                "never mentions {model}; put \"{model}\" where the command takes the checkpoint's path".into(),
            ));
        }
        if ev.tasks.is_empty() {
            return Err(at(
                "[evaluator] tasks",
                "is empty; list the tasks the command reports".into(),
            ));
        }
        if let Some(dup) = ev.tasks.iter().enumerate().find(|(i, t)| ev.tasks[..*i].contains(t)) {
            return Err(at("[evaluator] tasks", format!("'{}' is listed twice", dup.1)));
        }
        if ev.metric.trim().is_empty() {
            return Err(at(
                "[evaluator] metric",
                "is empty; name the metric to read, e.g. \"accuracy\"".into(),
            ));
        }
        if ev.timeout_s == 0 {
            return Err(at("[evaluator] timeout_s", "must be at least 1 (seconds)".into()));
        }
        Ok(())
    }

    /// The tasks, in order.
    pub fn task_names(&self) -> Vec<String> {
        match &self.kind {
            SuiteKind::Command(ev) => ev.tasks.clone(),
            SuiteKind::Family { tasks, .. } => tasks.iter().map(|t| t.name.clone()).collect(),
        }
    }

    /// Each task's reference for normalised scores: expert `i` (one per task, in task order)
    /// scored on task `i` alone.
    pub fn expert_references(&self, experts: &[PathBuf], device: &Device, cancel: &AtomicBool) -> Result<References> {
        let tasks = self.task_names();
        if experts.len() != tasks.len() {
            return Err(EngineError::Param(format!(
                "normalised scores need one expert per task, in task order: suite '{}' has {} tasks ({}) but {} experts were given",
                self.path.display(),
                tasks.len(),
                tasks.join(", "),
                experts.len()
            )));
        }
        let mut references = BTreeMap::new();
        for (task, expert) in tasks.iter().zip(experts) {
            let report = self
                .evaluator(Some(std::slice::from_ref(task)), device)?
                .evaluate_file(expert, cancel)?;
            let score = report.task(task).map(|t| t.accuracy).ok_or_else(|| {
                EngineError::Bug(format!(
                    "the report of '{}' lacks its own task '{task}'",
                    expert.display()
                ))
            })?;
            references.insert(task.clone(), score);
        }
        Ok(References(references))
    }

    /// The `[models]` base, when the suite names one: its config and tokenizer serve checkpoints
    /// that carry none (merged files).
    fn base_model(&self) -> Option<PathBuf> {
        self.models().map(|m| m.base)
    }

    /// The suite file's folder, which its relative paths start from.
    fn folder(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        }
    }

    /// The suite's evaluator on `device`, restricted to `only` when given (every name must be
    /// a task). A family suite reads its tasks' data and heads here.
    pub fn evaluator(&self, only: Option<&[String]>, device: &Device) -> Result<Box<dyn Evaluator>> {
        let mut tasks = self.task_names();
        if let Some(only) = only {
            if let Some(bad) = only.iter().find(|t| !tasks.contains(t)) {
                return Err(EngineError::Param(format!(
                    "unknown task '{bad}'; suite '{}' has: {}",
                    self.path.display(),
                    tasks.join(", ")
                )));
            }
            tasks.retain(|t| only.contains(t));
        }
        match &self.kind {
            SuiteKind::Command(ev) => Ok(Box::new(CommandEvaluator {
                name: self.name.clone(),
                command: ev.command.clone(),
                workdir: self.folder(),
                metric: ev.metric.clone(),
                tasks,
                timeout: Duration::from_secs(ev.timeout_s),
                output_file: ev.output.clone(),
                model_folder: ev.model_folder.as_ref().map(|f| self.folder().join(f)),
            })),
            SuiteKind::Family { model, tasks: tables } => {
                let chosen: Vec<(&TaskTable, &str)> = tables
                    .iter()
                    .filter(|t| tasks.contains(&t.name))
                    .map(|t| (t, t.data.as_str()))
                    .collect();
                self.family_evaluator(model, &chosen, device)
            }
        }
    }

    /// The evaluator of the tasks' `calibration` data (what λ searches score on), when every
    /// task of a family suite has some; `None` otherwise (methods then keep their defaults).
    pub fn calibration_evaluator(&self, device: &Device) -> Result<Option<Box<dyn Evaluator>>> {
        let SuiteKind::Family { model, tasks } = &self.kind else {
            return Ok(None);
        };
        let Some(chosen) = paired(tasks, |t| t.calibration.as_deref()) else {
            return Ok(None);
        };
        Ok(Some(self.family_evaluator(model, &chosen, device)?))
    }

    /// A family evaluator of `tasks`, each scored on the data file paired with it.
    fn family_evaluator(
        &self,
        model: &ModelTable,
        tasks: &[(&TaskTable, &str)],
        device: &Device,
    ) -> Result<Box<dyn Evaluator>> {
        Ok(match model.family.as_str() {
            "clip" => Box::new(self.clip_evaluator(model, tasks, device)?),
            "causal-lm" => Box::new(self.lm_evaluator(model, tasks, device)?),
            _ => Box::new(self.bert_evaluator(model, tasks, None, device)?),
        })
    }

    /// The CLIP evaluator of `tasks` (each with its image folder).
    fn clip_evaluator(
        &self,
        model: &ModelTable,
        tasks: &[(&TaskTable, &str)],
        device: &Device,
    ) -> Result<ImageClassifierEvaluator> {
        let dir = self.folder();
        let task_list = tasks
            .iter()
            .map(|(t, data)| self.image_task(t, model, &dir.join(data), &dir, device))
            .collect::<Result<Vec<_>>>()?;
        let spec = ClipModelSpec {
            config: model.config.as_ref().map(|p| dir.join(p)),
            tokenizer: model.tokenizer.as_ref().map(|p| dir.join(p)),
            zeroshot_from: model.zeroshot_from.as_ref().map(|p| dir.join(p)),
            batch_size: model.batch_size(),
            base: self.base_model(),
        };
        ImageClassifierEvaluator::new(self.name.clone(), spec, task_list, device)
    }

    /// The causal-LM evaluator of `tasks` (each with its JSONL or text file).
    fn lm_evaluator(&self, model: &ModelTable, tasks: &[(&TaskTable, &str)], device: &Device) -> Result<LmEvaluator> {
        let dir = self.folder();
        let task_list = tasks
            .iter()
            .map(|(t, data)| {
                read_lm_task(&t.name, &dir.join(data)).map_err(|e| {
                    EngineError::Param(format!("suite '{}', [[task]] '{}': {e}", self.path.display(), t.name))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let spec = LmModelSpec {
            config: model.config.as_ref().map(|p| dir.join(p)),
            tokenizer: model.tokenizer.as_ref().map(|p| dir.join(p)),
            max_length: model.max_length.unwrap_or(2048),
            base: self.base_model(),
            batch_size: model.batch_size(),
        };
        LmEvaluator::new(self.name.clone(), spec, task_list, device)
    }

    /// The BERT-family evaluator of `tasks` (each with its text file); a task without a `head`
    /// takes it from `expert_heads` (expert t for task t) when given, else from the evaluated
    /// checkpoint.
    fn bert_evaluator(
        &self,
        model: &ModelTable,
        tasks: &[(&TaskTable, &str)],
        expert_heads: Option<&[PathBuf]>,
        device: &Device,
    ) -> Result<TextClassifierEvaluator> {
        let dir = self.folder();
        let task_list = tasks
            .iter()
            .enumerate()
            .map(|(i, (t, data))| {
                let mut task = self.text_task(t, &dir.join(data), &dir, device)?;
                if task.head.is_none()
                    && let Some(expert) = expert_heads.and_then(|e| e.get(i))
                {
                    task.head = Some(ClassifierHead::load(expert, device).map_err(|e| {
                        EngineError::Param(format!(
                            "suite '{}', [[task]] '{}' has no head, so its expert's is used: {e}",
                            self.path.display(),
                            t.name
                        ))
                    })?);
                }
                Ok(task)
            })
            .collect::<Result<Vec<_>>>()?;
        let spec = TextModelSpec {
            config: model.config.as_ref().map(|p| dir.join(p)),
            tokenizer: model.tokenizer.as_ref().map(|p| dir.join(p)),
            max_length: model.max_length.unwrap_or(128),
            batch_size: model.batch_size(),
            base: self.base_model(),
        };
        TextClassifierEvaluator::new(self.name.clone(), spec, task_list, device)
    }

    /// Why model-level methods cannot run on this suite (`None`: they can, given one expert
    /// per task).
    pub fn model_level_unavailable(&self) -> Option<String> {
        self.model_level_tables().err().map(|e| e.to_string())
    }

    /// The family and tasks of a suite model-level methods can run on: a family suite whose
    /// every task has calibration data.
    fn model_level_tables(&self) -> Result<(&ModelTable, &[TaskTable])> {
        let (model, tables) = match &self.kind {
            SuiteKind::Family { model, tasks } => (model, tasks),
            SuiteKind::Command(_) => {
                return Err(EngineError::Param(format!(
                    "suite '{}' scores models with an external command, which gives no gradients: model-level methods need a family suite ([model] family = \"bert\", \"clip\" or \"causal-lm\") with calibration data; or tune a per-tensor method with `mergescope search`",
                    self.path.display()
                )));
            }
        };
        let missing: Vec<&str> = tables
            .iter()
            .filter(|t| t.calibration.is_none())
            .map(|t| t.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(EngineError::Param(format!(
                "suite '{}': model-level methods learn on each task's calibration data, and task(s) {} have none; add calibration = \"...\" (held-out examples, same format as data) to each [[task]]",
                self.path.display(),
                missing.join(", ")
            )));
        }
        Ok((model, tables))
    }

    /// The tasks a model-level (data-driven) method runs on for `base` and `experts` (one per
    /// task, in the suite's order): each task's `calibration` examples score and differentiate
    /// the candidates, its `train` examples (when every task has some) are what fine-tuning
    /// steps on. A BERT task without a head uses its expert's. A causal LM's multiple-choice
    /// questions are classified by their choices' length-normalised log-likelihoods, its texts
    /// token by token (see [`LmEvaluator`]).
    pub fn calibration_tasks(
        &self,
        base: &Path,
        experts: &[PathBuf],
        device: &Device,
    ) -> Result<Box<dyn CalibrationTasks>> {
        let (model, tables) = self.model_level_tables()?;
        if experts.len() != tables.len() {
            return Err(EngineError::Param(format!(
                "suite '{}' has {} tasks ({}) but {} experts were given; a model-level method needs one expert per task, in the suite's order",
                self.path.display(),
                tables.len(),
                self.task_names().join(", "),
                experts.len()
            )));
        }
        let calibration = paired(tables, |t| t.calibration.as_deref()).unwrap_or_default();
        let train = paired(tables, |t| t.train.as_deref());
        if model.family == "clip" {
            let train = train.map(|t| self.clip_evaluator(model, &t, device)).transpose()?;
            let cal = self.clip_evaluator(model, &calibration, device)?;
            return Ok(Box::new(FamilyCalibration::new(cal, train, base)?));
        }
        if model.family == "causal-lm" {
            let train = train.map(|t| self.lm_evaluator(model, &t, device)).transpose()?;
            let cal = self.lm_evaluator(model, &calibration, device)?;
            return Ok(Box::new(FamilyCalibration::new(cal, train, base)?));
        }
        let train = train
            .map(|t| self.bert_evaluator(model, &t, Some(experts), device))
            .transpose()?;
        let cal = self.bert_evaluator(model, &calibration, Some(experts), device)?;
        Ok(Box::new(FamilyCalibration::new(cal, train, base)?))
    }

    /// Reads one CLIP `[[task]]`: its image folder `data` (classes: `labels`, else the
    /// subfolders), templates and optional head file (a tensor `weight`, `[classes, projection]`).
    fn image_task(
        &self,
        t: &TaskTable,
        model: &ModelTable,
        data: &Path,
        dir: &Path,
        device: &Device,
    ) -> Result<ImageTask> {
        let within =
            |e: EngineError| EngineError::Param(format!("suite '{}', [[task]] '{}': {e}", self.path.display(), t.name));
        let (classes, examples) = read_image_folder(data, t.labels.as_deref()).map_err(within)?;
        let templates = t
            .templates
            .clone()
            .or_else(|| model.templates.clone())
            .unwrap_or_else(|| vec![DEFAULT_TEMPLATE.to_owned()]);
        if templates.is_empty() || templates.iter().any(|t| !t.contains("{}")) {
            return Err(within(EngineError::evaluator(
                "templates must be prompts with {} where the class name goes, e.g. [\"a photo of a {}.\"]",
            )));
        }
        let head = match &t.head {
            Some(h) => {
                let path = dir.join(h);
                let c = Checkpoint::open(&path).map_err(within)?;
                let entry = c
                    .tensors
                    .get("weight")
                    .or_else(|| (c.tensors.len() == 1).then(|| c.tensors.values().next()).flatten())
                    .ok_or_else(|| {
                        within(EngineError::evaluator(format!(
                            "head file '{}' has no tensor 'weight' ([classes, projection])",
                            path.display()
                        )))
                    })?;
                Some(Tensor::from_vec(
                    c.read_f32(entry).map_err(within)?,
                    entry.shape.clone(),
                    device,
                )?)
            }
            None => None,
        };
        Ok(ImageTask::new(t.name.clone(), classes, examples, templates, head))
    }

    /// Reads one `[[task]]`'s examples from `data` and its head; errors say which suite and task.
    fn text_task(&self, t: &TaskTable, data: &Path, dir: &Path, device: &Device) -> Result<TextTask> {
        let within =
            |e: EngineError| EngineError::Param(format!("suite '{}', [[task]] '{}': {e}", self.path.display(), t.name));
        let examples = read_text_task(data, t.labels.as_deref()).map_err(within)?;
        let head = match &t.head {
            Some(h) => Some(ClassifierHead::load(&dir.join(h), device).map_err(within)?),
            None => None,
        };
        if let (Some(h), Some(names)) = (&head, &t.labels)
            && h.classes() != names.len()
        {
            return Err(within(EngineError::evaluator(format!(
                "labels lists {} classes but the head has {} rows; list every class of the head in its order",
                names.len(),
                h.classes()
            ))));
        }
        Ok(TextTask {
            name: t.name.clone(),
            data: data.to_owned(),
            examples,
            head,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The issue's smallest suite, as users copy it, with a scoring script that reads the
    /// checkpoint it is given: the metrics reach the report.
    #[test]
    fn the_smallest_suite_runs_its_command_on_the_model() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "score.py",
            "import sys, os, json\nsize = os.path.getsize(sys.argv[1])\n\
             print('scoring', sys.argv[1])\n\
             print(json.dumps({'task_a': {'accuracy': size / 100}, 'task_b': {'accuracy': 0.5}, 'task_c': {'accuracy': 0.25, 'f1': 0.1}}))\n",
        );
        let suite = write(
            dir.path(),
            "suite.toml",
            "name = \"my-eval\"\n\n[evaluator]\ncommand = [\"python3\", \"score.py\", \"{model}\"]\n\
             metric = \"accuracy\"\ntasks = [\"task_a\", \"task_b\", \"task_c\"]\n",
        );
        let model = write(dir.path(), "model.bin", &"x".repeat(75));
        let s = Suite::load(&suite).unwrap();
        let ev = s.evaluator(None, &Device::Cpu).unwrap();
        assert_eq!(ev.task_names(), ["task_a", "task_b", "task_c"]);
        let r = ev.evaluate_file(&model, &AtomicBool::new(false)).unwrap();
        assert!((r.tasks[0].accuracy - 0.75).abs() < 1e-12);
        assert!((r.mean_accuracy - (0.75 + 0.5 + 0.25) / 3.0).abs() < 1e-12);
        assert_eq!(r.tasks[2].metrics["f1"], 0.1);
        let only = s.evaluator(Some(&["task_b".to_owned()]), &Device::Cpu).unwrap();
        let r = only.evaluate_file(&model, &AtomicBool::new(false)).unwrap();
        assert_eq!(r.tasks.len(), 1);
        assert_eq!(r.mean_accuracy, 0.5);
    }

    #[test]
    fn a_failing_slow_or_silent_command_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let model = write(dir.path(), "m.bin", "x");
        let suite = |cmd: &str, extra: &str| {
            write(
                dir.path(),
                "s.toml",
                &format!("name = \"s\"\n[evaluator]\ncommand = {cmd}\ntasks = [\"a\"]\n{extra}"),
            )
        };
        let run = |p: &Path| {
            Suite::load(p)
                .unwrap()
                .evaluator(None, &Device::Cpu)
                .unwrap()
                .evaluate_file(&model, &AtomicBool::new(false))
                .unwrap_err()
                .to_string()
        };
        let e = run(&suite(
            r#"["sh", "-c", "echo 'no such model' >&2; exit 3", "{model}"]"#,
            "",
        ));
        assert!(e.contains("failed") && e.contains("no such model"), "{e}");
        let e = run(&suite(r#"["sh", "-c", "sleep 5", "{model}"]"#, "timeout_s = 1\n"));
        assert!(e.contains("longer than 1 s") && e.contains("timeout_s"), "{e}");
        let e = run(&suite(r#"["sh", "-c", "echo hello", "{model}"]"#, ""));
        assert!(e.contains("standard output") && e.contains("no JSON object"), "{e}");
        let e = run(&suite(r#"["no-such-program-mergescope", "{model}"]"#, ""));
        assert!(e.contains("cannot start") && e.contains("PATH"), "{e}");
    }

    /// With `model_folder`, the command gets a Hugging Face folder: the candidate's weights as
    /// model.safetensors beside the folder's config and tokenizer (never its weights), removed
    /// after the command ran.
    #[test]
    fn a_model_folder_hands_the_command_a_hugging_face_folder() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        std::fs::create_dir(&base).unwrap();
        write(&base, "config.json", "{\"model_type\": \"llama\"}");
        write(&base, "tokenizer.json", "{}");
        write(&base, "model.safetensors", "the base's weights");
        write(
            dir.path(),
            "score.py",
            "import sys, os, json\nm = sys.argv[1]\nopen('seen.txt', 'w').write(m)\n\
             files = sorted(os.listdir(m))\nw = open(os.path.join(m, 'model.safetensors')).read()\n\
             print(json.dumps({'a': {'accuracy': len(files), 'weights': float(w == 'candidate')}}))\n",
        );
        let suite = write(
            dir.path(),
            "s.toml",
            "name = \"s\"\n[evaluator]\ncommand = [\"python3\", \"score.py\", \"{model}\"]\ntasks = [\"a\"]\nmodel_folder = \"base\"\n",
        );
        let model = write(dir.path(), "merged.safetensors", "candidate");
        let ev = Suite::load(&suite).unwrap().evaluator(None, &Device::Cpu).unwrap();
        let r = ev.evaluate_file(&model, &AtomicBool::new(false)).unwrap();
        // config.json, tokenizer.json and the candidate's model.safetensors.
        assert_eq!(r.tasks[0].accuracy, 3.0);
        assert_eq!(r.tasks[0].metrics["weights"], 1.0);
        let seen = std::fs::read_to_string(dir.path().join("seen.txt")).unwrap();
        assert!(!Path::new(&seen).exists(), "{seen} was left behind");
        std::fs::remove_file(base.join("config.json")).unwrap();
        let e = Suite::load(&suite).unwrap_err().to_string();
        assert!(e.contains("model_folder") && e.contains("config.json"), "{e}");
    }

    #[test]
    fn suite_mistakes_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            Suite::load(&write(dir.path(), "bad.toml", text))
                .unwrap_err()
                .to_string()
        };
        let e = load("name = \"s\"\n[evaluator]\ncommand = [\"score\"]\ntasks = [\"a\"]\n");
        assert!(e.contains("bad.toml") && e.contains("{model}"), "{e}");
        let e = load("name = \"s\"\n[evaluator]\ncommand = [\"s\", \"{model}\"]\ntasks = [\"a\"]\ntimeout = 3\n");
        assert!(e.contains("bad.toml") && e.contains("timeout"), "{e}");
        let e = load("name = \"s\"\n[evaluator]\ncommand = [\"s\", \"{model}\"]\ntasks = [\"a\", \"a\"]\n");
        assert!(e.contains("'a' is listed twice"), "{e}");
        let e = Suite::load(&dir.path().join("missing.toml")).unwrap_err().to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }

    /// Model-level methods take a causal-lm suite whose tasks have calibration data; without
    /// it the refusal names the task and what to add; an external command is refused with the
    /// families that give gradients.
    #[test]
    fn causal_lm_suites_take_model_level_methods_given_calibration_data() {
        let dir = tempfile::tempdir().unwrap();
        let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/llama-tiny");
        let p = |s: &str| fx.join(s).to_string_lossy().replace('\\', "/");
        let suite = |extra: &str| {
            let path = write(
                dir.path(),
                "lm.toml",
                &format!(
                    "name = \"lm\"\n[model]\nfamily = \"causal-lm\"\n[[task]]\nname = \"mc\"\ndata = \"{}\"\n{extra}",
                    p("mc.jsonl")
                ),
            );
            Suite::load(&path).unwrap()
        };
        let e = suite("").model_level_unavailable().unwrap();
        assert!(e.contains("mc") && e.contains("calibration = "), "{e}");
        let s = suite(&format!("calibration = \"{}\"\n", p("mc.jsonl")));
        assert_eq!(s.model_level_unavailable(), None);
        assert_eq!(
            s.calibration_tasks(&fx, std::slice::from_ref(&fx), &Device::Cpu)
                .unwrap()
                .task_names(),
            ["mc"]
        );
        let command = write(
            dir.path(),
            "cmd.toml",
            "name = \"c\"\n[evaluator]\ncommand = [\"s\", \"{model}\"]\ntasks = [\"a\"]\n",
        );
        let e = Suite::load(&command).unwrap().model_level_unavailable().unwrap();
        assert!(e.contains("gradients") && e.contains("causal-lm"), "{e}");
    }
}
