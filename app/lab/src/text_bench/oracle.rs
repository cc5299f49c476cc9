//! Seed 004's oracle ("On Task Vectors and Gradients", Zhou et al.) on the text benchmark:
//! real all-MiniLM-L6-v2 through each task's frozen linear head.
//!
//! For each learning rate η and epoch count E, every task t takes E full-batch gradient-descent
//! steps from the base on its mean cross-entropy L̄ₜ over its first N train texts, giving
//! θₜ⁽ᴱ⁾ and the task vector τₜ = θₜ⁽ᴱ⁾ − θ₀; task arithmetic is θ_TA = θ₀ + α Σₜ τₜ. The
//! multi-task run takes E full-batch steps of size αη on Σₜ L̄ₜ, giving θ_MT. Theorem 1: at
//! E = 1 the two are equal (up to rounding); Eq. 2: for E ≥ 2 they differ by a term of
//! order η², so ‖θ_TA − θ_MT‖ grows with slope 2 in η on log-log axes, and the relative gap
//! ‖θ_TA − θ_MT‖ / ‖θ_MT − θ₀‖ (the move being of order η) with slope 1.
//!
//! The loss and the forward pass are the build's ([`super::build::batch_loss`]), the step the
//! lab's SGD ([`Optimizer`]); the models are scored with the build's [`accuracy`].
//!
//! Gradient descent runs in f64 by default ([`Precision`]). In f32 the E = 1 identity holds to
//! f32 rounding, but MiniLM's loss is so sharply curved that the expansion holds only for
//! η ≲ 2·10⁻⁵, where the E ≥ 2 gap (10⁻⁸ to 10⁻⁶) is below the rounding of the weights to f32
//! (about 10⁻⁵, and each step's gradient is taken at rounded weights): no η shows the η² law
//! in f32 (measured in docs/text-benchmark.md).

use super::build::{Backbone, LinearHead, TextBenchmark, accuracy, batch_loss};
use super::data::{TextSplit, Tokenized, parse_split};
use crate::demo::BuildProgress;
use crate::family::{bert, hf};
use crate::nn::Params;
use crate::train::{OptimConfig, Optimizer, detached, from_vars, to_vars};
use candle_core::{DType, Device, Tensor};
use mergescope_engine::error::{EngineError, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

mod settings;
pub use settings::{MAX_LENGTH, OracleSettings, OracleText, Precision, parse_epochs, parse_examples, parse_lrs};

/// The two models at one learning rate and epoch count.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleRow {
    /// Learning rate η of the task runs (the multi-task run's is αη).
    pub lr: f64,
    /// Epochs (full-batch steps) E.
    pub epochs: usize,
    /// ‖θ_TA − θ_MT‖ over every backbone tensor.
    pub gap: f64,
    /// ‖θ_MT − θ₀‖.
    pub moved: f64,
    /// ‖θ_TA − θ₀‖.
    pub ta_moved: f64,
    /// ‖ulp(θ_MT)‖ over the entries that moved: the spacing of the numbers of the run's
    /// precision around θ_MT, the scale of the E = 1 gap, which is rounding only.
    pub ulp: f64,
    /// Test accuracy of θ_TA per task (empty when nothing was scored).
    pub ta_accuracy: Vec<f64>,
    /// Test accuracy of θ_MT per task.
    pub mt_accuracy: Vec<f64>,
}

impl OracleRow {
    /// ‖θ_TA − θ_MT‖ / ‖θ_MT − θ₀‖.
    pub fn relative(&self) -> f64 {
        self.gap / self.moved
    }
}

/// The log-log slope of the gap over η at one epoch count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OracleSlope {
    /// Epochs E.
    pub epochs: usize,
    /// Slope of log ‖θ_TA − θ_MT‖ against log η (≈ 2 for E ≥ 2).
    pub absolute: Option<f64>,
    /// Slope of log (‖θ_TA − θ_MT‖ / ‖θ_MT − θ₀‖) against log η (≈ 1 for E ≥ 2).
    pub relative: Option<f64>,
}

/// What the oracle measured.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleReport {
    /// Tasks, in order.
    pub tasks: Vec<String>,
    /// Train texts per task (the full batch).
    pub examples: Vec<usize>,
    /// Test texts per task scored.
    pub eval_examples: Vec<usize>,
    /// Tokens kept per text.
    pub max_length: usize,
    /// Task arithmetic's α.
    pub alpha: f64,
    /// The type gradient descent ran in.
    pub precision: Precision,
    /// Number of backbone parameters (the length of θ).
    pub parameters: usize,
    /// Test accuracy of the base per task.
    pub base_accuracy: Vec<f64>,
    /// One row per (η, E), η ascending, then E ascending.
    pub rows: Vec<OracleRow>,
    /// Seconds of gradient descent (all runs).
    pub train_seconds: f64,
    /// Seconds of scoring.
    pub eval_seconds: f64,
}

impl OracleReport {
    /// The epoch counts measured, ascending.
    pub fn epoch_counts(&self) -> Vec<usize> {
        let mut e: Vec<usize> = self.rows.iter().map(|r| r.epochs).collect();
        e.sort_unstable();
        e.dedup();
        e
    }

    /// The log-log slopes over η, per epoch count.
    pub fn slopes(&self) -> Vec<OracleSlope> {
        self.epoch_counts()
            .into_iter()
            .map(|e| {
                let rows: Vec<&OracleRow> = self.rows.iter().filter(|r| r.epochs == e).collect();
                let abs: Vec<[f64; 2]> = rows.iter().map(|r| [r.lr, r.gap]).collect();
                let rel: Vec<[f64; 2]> = rows.iter().map(|r| [r.lr, r.relative()]).collect();
                OracleSlope {
                    epochs: e,
                    absolute: log_log_slope(&abs),
                    relative: log_log_slope(&rel),
                }
            })
            .collect()
    }

    /// The rows as CSV: η, E, the norms, the relative gap, and every accuracy (the base's
    /// repeated on each row).
    pub fn to_csv(&self) -> String {
        let mut out = String::from("lr,epochs,gap,relative_gap,moved_mt,moved_ta,ulp_norm");
        for prefix in ["base", "ta", "mt"] {
            for t in &self.tasks {
                let _ = write!(out, ",{prefix}_accuracy_{t}");
            }
        }
        out.push('\n');
        for r in &self.rows {
            let _ = write!(
                out,
                "{},{},{},{},{},{},{}",
                r.lr,
                r.epochs,
                r.gap,
                r.relative(),
                r.moved,
                r.ta_moved,
                r.ulp
            );
            for a in self.base_accuracy.iter().chain(&r.ta_accuracy).chain(&r.mt_accuracy) {
                let _ = write!(out, ",{a}");
            }
            out.push('\n');
        }
        out
    }
}

/// Least-squares slope of log y against log x over the points with x, y > 0 and finite; `None`
/// with fewer than two such points at distinct x.
pub fn log_log_slope(points: &[[f64; 2]]) -> Option<f64> {
    let logs: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p[0] > 0.0 && p[1] > 0.0 && p[0].is_finite() && p[1].is_finite())
        .map(|p| (p[0].ln(), p[1].ln()))
        .collect();
    let n = logs.len() as f64;
    let (mx, my) = (
        logs.iter().map(|p| p.0).sum::<f64>() / n,
        logs.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (logs.len() >= 2 && sxx > 0.0).then(|| sxy / sxx)
}

/// One task of the oracle: its frozen head, its full batch, its scored test texts.
struct OracleTask {
    head: LinearHead,
    train: Tokenized,
    test: Tokenized,
}

/// How to make a text build, for the messages that refuse a folder.
const MAKE_ONE: &str = "pass the folder `mergescope demo build --benchmark text --backbone DIR` writes (~/.cache/mergescope/demo/text-minilm-seed0, with manifest.json, base/, heads/, data/ and suite.toml), or its suite.toml";

/// How to repair a damaged text build.
const REBUILD: &str = "rebuild it with `mergescope demo build --benchmark text --backbone DIR --force` (--out FOLDER for a build outside the cache)";

/// The text build in `dir` (or the folder of a `suite.toml` in it), with a message that says
/// what a text build is when `dir` is not one, and how to rebuild one that is incomplete.
fn open_text_build(dir: &Path) -> Result<TextBenchmark> {
    if !dir.exists() {
        return Err(EngineError::invalid(format!(
            "--text-bench '{}' does not exist: {MAKE_ONE}",
            dir.display()
        )));
    }
    let dir = if dir.is_file() && dir.file_name().is_some_and(|n| n == "suite.toml") {
        dir.parent().unwrap_or(Path::new("."))
    } else {
        dir
    };
    let missing = |why: &str| {
        EngineError::invalid(format!(
            "'{}' is not a text benchmark build ({why}): {MAKE_ONE}",
            dir.display()
        ))
    };
    if !dir.is_dir() {
        return Err(missing("it is a file, not a folder"));
    }
    if !dir.join("manifest.json").is_file() {
        return Err(missing("no manifest.json"));
    }
    if !dir.join("base").is_dir() {
        // An image demo build has a manifest too, and base.safetensors instead of base/.
        return Err(missing("no base/ folder; an image demo build is not one"));
    }
    let bench = TextBenchmark::open(dir)?;
    for f in ["config.json", "tokenizer.json"] {
        let p = bench.dir.join("base").join(f);
        if !p.is_file() {
            return Err(EngineError::invalid(format!(
                "the text benchmark in '{}' is incomplete: '{}' is missing; {REBUILD}",
                bench.dir.display(),
                p.display()
            )));
        }
    }
    Ok(bench)
}

/// The tasks `settings` names (all the build's when it names none), checked against the build's.
fn task_names(bench: &TextBenchmark, settings: &OracleSettings) -> Result<Vec<String>> {
    let built: Vec<&str> = bench.manifest.tasks.iter().map(|t| t.name.as_str()).collect();
    if settings.tasks.is_empty() {
        return Ok(built.iter().map(|s| (*s).to_owned()).collect());
    }
    if let Some(name) = settings.tasks.iter().find(|t| !built.contains(&t.as_str())) {
        return Err(EngineError::Param(format!(
            "unknown task '{name}' in --tasks: the text benchmark in '{}' has {}; name some of them, or leave --tasks out for all",
            bench.dir.display(),
            built.join(", ")
        )));
    }
    Ok(settings.tasks.clone())
}

/// The data of `split` of build task `name` with `classes`: the first `n` texts tokenized,
/// how many the split has, and its file.
fn read_split(
    dir: &Path,
    name: &str,
    classes: &[String],
    split: TextSplit,
    n: usize,
    backbone: &Backbone,
) -> Result<(Tokenized, usize, PathBuf)> {
    let path = dir.join("data").join(format!("{name}.{}.jsonl", split.name()));
    let damaged = |why: String| {
        EngineError::invalid(format!(
            "the text benchmark in '{}' is damaged: '{}': {why}; {REBUILD}",
            dir.display(),
            path.display()
        ))
    };
    let text = std::fs::read_to_string(&path).map_err(|e| damaged(format!("cannot read it ({e})")))?;
    let examples = parse_split(name, split, &text, classes).map_err(|e| {
        // The parser's advice is for the data compiled into mergescope, not for a build's copy.
        let e = e.to_string();
        damaged(
            e.trim_end_matches("; rebuild assets/text with scripts/text-bench-data.py")
                .to_owned(),
        )
    })?;
    let tokens = Tokenized::new(&backbone.tokenizer, &examples[..n.min(examples.len())])?;
    Ok((tokens, examples.len(), path))
}

/// The tasks `names` of the build, with their heads and data; refused when a task has fewer
/// train texts than the full batch asks for.
fn load_tasks(
    bench: &TextBenchmark,
    names: &[String],
    settings: &OracleSettings,
    backbone: &Backbone,
    device: &Device,
) -> Result<Vec<OracleTask>> {
    let mut tasks = Vec::new();
    let mut short = Vec::new();
    for name in names {
        let meta = (bench.manifest.tasks.iter().find(|t| &t.name == name))
            .ok_or_else(|| EngineError::Bug(format!("task '{name}' was checked against the build")))?;
        let path = bench.dir.join("heads").join(format!("{name}.safetensors"));
        let rebuild = |why: String| {
            EngineError::invalid(format!(
                "the text benchmark in '{}' is damaged: {why}; {REBUILD}",
                bench.dir.display()
            ))
        };
        let mut head = hf::load_weights(&path, device).map_err(|e| rebuild(e.to_string()))?;
        let mut take = |key: &str| {
            head.remove(key)
                .ok_or_else(|| rebuild(format!("the head '{}' has no {key}", path.display())))
        };
        let head = LinearHead {
            weight: take(bert::HEAD_WEIGHT)?,
            bias: take(bert::HEAD_BIAS)?,
        };
        let read = |split, n| read_split(&bench.dir, name, &meta.classes, split, n, backbone);
        let (train, available, file) = read(TextSplit::Train, settings.examples)?;
        if available < settings.examples {
            short.push((name.clone(), available, file));
        }
        let test = if settings.eval_examples == 0 {
            Tokenized {
                ids: Vec::new(),
                type_ids: Vec::new(),
                labels: Vec::new(),
            }
        } else {
            read(TextSplit::Test, settings.eval_examples)?.0
        };
        tasks.push(OracleTask { head, train, test });
    }
    if let Some(fewest) = short.iter().map(|s| s.1).min() {
        let which: Vec<String> = short
            .iter()
            .map(|(name, n, file)| format!("'{name}' has {n} ('{}')", file.display()))
            .collect();
        return Err(EngineError::Param(format!(
            "--examples {}: every task's full batch is its first {} train texts, but {}; give --examples {fewest} or fewer, or name other --tasks",
            settings.examples,
            settings.examples,
            which.join(", ")
        )));
    }
    Ok(tasks)
}

/// Every tensor of `p` (f32 or f64), flattened in name order, as f64 (exactly).
fn flatten(p: &Params) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for t in p.values() {
        out.extend(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?);
    }
    Ok(out)
}

/// Every tensor of `p` in `dtype`.
fn cast(p: &Params, dtype: DType) -> Result<Params> {
    p.iter().map(|(k, t)| Ok((k.clone(), t.to_dtype(dtype)?))).collect()
}

/// `values` (in [`flatten`]'s order) as f32 tensors shaped like `like`'s (what scoring reads).
fn unflatten(values: &[f64], like: &Params, device: &Device) -> Result<Params> {
    let mut at = 0;
    let mut out = Params::new();
    for (k, t) in like {
        let n = t.elem_count();
        let part = values
            .get(at..at + n)
            .ok_or_else(|| EngineError::Bug("a flattened model is shorter than the backbone".into()))?;
        let part: Vec<f32> = part.iter().map(|&x| x as f32).collect();
        out.insert(k.clone(), Tensor::from_vec(part, t.shape(), device)?);
        at += n;
    }
    Ok(out)
}

/// Gradient descent from the base (`base`, in the run's precision, with `heads` cast to it).
struct Descent<'a> {
    backbone: &'a Backbone,
    base: &'a Params,
    tasks: &'a [OracleTask],
    heads: &'a [LinearHead],
    epochs: &'a [usize],
    device: &'a Device,
    cancel: &'a AtomicBool,
}

impl Descent<'_> {
    /// `max(epochs)` full-batch steps of size `lr` on the sum of the mean losses of tasks
    /// `which`; after each epoch count of `epochs` (ascending), its index and the flattened
    /// weights go to `snapshot`.
    fn run(
        &self,
        which: &[usize],
        lr: f64,
        snapshot: &mut dyn FnMut(usize, Vec<f64>),
        on_step: &mut dyn FnMut(f32),
    ) -> Result<()> {
        let vars = to_vars(self.base)?;
        let mut opt = Optimizer::new(OptimConfig::sgd(lr), vars.iter().map(|(_, v)| v.clone()).collect())?;
        let last = self.epochs.iter().copied().max().unwrap_or(0);
        for step in 1..=last {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(EngineError::Cancelled);
            }
            let encoder = self.backbone.encoder(&from_vars(&vars), self.device)?;
            let mut total: Option<Tensor> = None;
            for &t in which {
                let task = &self.tasks[t];
                let all: Vec<usize> = (0..task.train.len()).collect();
                let loss = batch_loss(self.backbone, &encoder, &self.heads[t], &task.train, &all, self.device)?;
                total = Some(match total {
                    None => loss,
                    Some(sum) => (sum + loss)?,
                });
            }
            let loss = total.ok_or_else(|| EngineError::Bug("a descent over no task".into()))?;
            let value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            if !value.is_finite() {
                return Err(EngineError::Diverged { step, loss: value, lr });
            }
            opt.step(&loss.backward()?)?;
            on_step(value);
            if let Some(k) = self.epochs.iter().position(|&e| e == step) {
                snapshot(k, flatten(&detached(&vars))?);
            }
        }
        Ok(())
    }
}

/// A run's divergence as the option to change: `lr` is the η of that run's row.
fn diverged(e: EngineError, lr: f64, run: &str) -> EngineError {
    match e {
        EngineError::Diverged { step, loss, .. } => EngineError::Param(format!(
            "--lr {lr}: gradient descent of the {run} run diverged at step {step} (loss {loss}); give smaller learning rates (on MiniLM the gap stays second order below about 2e-5)"
        )),
        e => e,
    }
}

/// Runs the oracle on the text build in `dir` (see the module's documentation). Progress is
/// reported per gradient step and per model scored; `cancel` stops it between steps.
pub fn run_oracle(
    dir: &Path,
    settings: &OracleSettings,
    device: &Device,
    progress: &mut dyn FnMut(&BuildProgress),
    cancel: &AtomicBool,
) -> Result<OracleReport> {
    settings.validate()?;
    let bench = open_text_build(dir)?;
    let names = task_names(&bench, settings)?;
    let max_length = settings.max_length.unwrap_or(bench.manifest.recipe.max_length);
    let backbone = Backbone::load(&bench.dir.join("base"), max_length, device)?;
    let tasks = load_tasks(&bench, &names, settings, &backbone, device)?;
    let mut lrs = settings.lrs.clone();
    lrs.sort_by(f64::total_cmp);
    lrs.dedup();
    let mut epochs = settings.epochs.clone();
    epochs.sort_unstable();
    epochs.dedup();
    let last = epochs.last().copied().unwrap_or(0);
    let scoring = settings.eval_examples > 0;
    let steps = lrs.len() * last * (tasks.len() + 1);
    let scores = if scoring { 1 + 2 * lrs.len() * epochs.len() } else { 0 };
    let mut report = BuildProgress::reporter(progress, steps + scores);
    let mut done = 0usize;
    let (mut train_seconds, mut eval_seconds) = (0.0, 0.0);

    let score = |weights: &Params| -> Result<Vec<f64>> {
        if !scoring {
            return Ok(Vec::new());
        }
        tasks
            .iter()
            .map(|t| accuracy(&backbone, weights, &t.head, &t.test, device))
            .collect()
    };
    let clock = Instant::now();
    let base_accuracy = score(&backbone.weights)?;
    if scoring {
        done += 1;
        report("score the base", done, None);
    }
    eval_seconds += clock.elapsed().as_secs_f64();

    let dtype = settings.precision.dtype();
    let start = cast(&backbone.weights, dtype)?;
    let heads: Vec<LinearHead> = tasks
        .iter()
        .map(|t| {
            Ok(LinearHead {
                weight: t.head.weight.to_dtype(dtype)?,
                bias: t.head.bias.to_dtype(dtype)?,
            })
        })
        .collect::<Result<_>>()?;
    let base = flatten(&start)?;
    let descent = Descent {
        backbone: &backbone,
        base: &start,
        tasks: &tasks,
        heads: &heads,
        epochs: &epochs,
        device,
        cancel,
    };
    let alpha = settings.alpha;
    let mut rows = Vec::new();
    for &lr in &lrs {
        let clock = Instant::now();
        let all: Vec<usize> = (0..tasks.len()).collect();
        let stage = format!("η {lr}: multi-task");
        let mut mt = vec![Vec::new(); epochs.len()];
        descent
            .run(&all, alpha * lr, &mut |k, theta| mt[k] = theta, &mut |l| {
                done += 1;
                report(&stage, done, Some(l));
            })
            .map_err(|e| diverged(e, lr, "multi-task"))?;
        // Σₜ τₜ per epoch count, in f64 (no rounding of its own in f32 runs).
        let mut sums = vec![vec![0f64; base.len()]; epochs.len()];
        for (t, name) in names.iter().enumerate() {
            let stage = format!("η {lr}: {name}");
            descent
                .run(
                    &[t],
                    lr,
                    &mut |k, theta| {
                        for ((s, x), b) in sums[k].iter_mut().zip(&theta).zip(&base) {
                            *s += x - b;
                        }
                    },
                    &mut |l| {
                        done += 1;
                        report(&stage, done, Some(l));
                    },
                )
                .map_err(|e| diverged(e, lr, &format!("'{name}'")))?;
        }
        train_seconds += clock.elapsed().as_secs_f64();
        for ((&e, sum), mt) in epochs.iter().zip(&sums).zip(&mt) {
            let (mut gap, mut moved, mut ta_moved, mut spacing) = (0f64, 0f64, 0f64, 0f64);
            let mut ta = Vec::with_capacity(base.len());
            for ((s, &m), &b) in sum.iter().zip(mt).zip(&base) {
                let t = b + alpha * s;
                gap += (t - m).powi(2);
                moved += (m - b).powi(2);
                ta_moved += (t - b).powi(2);
                if m != b {
                    spacing += settings.precision.ulp(m).powi(2);
                }
                ta.push(t);
            }
            let clock = Instant::now();
            let ta_accuracy = score(&unflatten(&ta, &backbone.weights, device)?)?;
            let mt_accuracy = score(&unflatten(mt, &backbone.weights, device)?)?;
            if scoring {
                done += 2;
                report(&format!("η {lr}, E {e}: score"), done, None);
            }
            eval_seconds += clock.elapsed().as_secs_f64();
            if cancel.load(Ordering::Relaxed) {
                return Err(EngineError::Cancelled);
            }
            rows.push(OracleRow {
                lr,
                epochs: e,
                gap: gap.sqrt(),
                moved: moved.sqrt(),
                ta_moved: ta_moved.sqrt(),
                ulp: spacing.sqrt(),
                ta_accuracy,
                mt_accuracy,
            });
        }
    }
    Ok(OracleReport {
        examples: tasks.iter().map(|t| t.train.len()).collect(),
        eval_examples: tasks.iter().map(|t| t.test.len()).collect(),
        tasks: names,
        max_length,
        alpha,
        precision: settings.precision,
        parameters: base.len(),
        base_accuracy,
        rows,
        train_seconds,
        eval_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text_bench::build::build_text;
    use crate::text_bench::tiny::{tasks_named, tiny_backbone, tiny_recipe};

    #[test]
    fn the_slope_is_the_exponent_of_a_power_law() {
        let pts: Vec<[f64; 2]> = [0.5, 1.0, 2.0, 8.0].iter().map(|&x| [x, 3.0 * x * x]).collect();
        assert!((log_log_slope(&pts).unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(log_log_slope(&pts[..1]), None);
        assert_eq!(log_log_slope(&[[1.0, 0.0], [2.0, 1.0]]), None, "zero gaps are left out");
        assert_eq!(log_log_slope(&[[1.0, 1.0], [1.0, 2.0]]), None);
    }

    #[test]
    fn on_a_tiny_bert_one_epoch_is_exact_and_the_gap_after_two_is_second_order() {
        let tmp = tempfile::tempdir().unwrap();
        let backbone = tiny_backbone(tmp.path()).unwrap();
        let tasks = tasks_named(&["word_sentiment", "name_gender"]).unwrap();
        let recipe = tiny_recipe(8, 16, 16);
        let dir = tmp.path().join("build");
        let d = Device::Cpu;
        let no = AtomicBool::new(false);
        build_text(&backbone, &tasks, &recipe, &dir, &d, &mut |_| {}, &no).unwrap();

        let e = run_oracle(tmp.path(), &OracleSettings::default(), &d, &mut |_| {}, &no)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not a text benchmark build") && e.contains("demo build --benchmark text"),
            "{e}"
        );
        let mut s = OracleSettings {
            tasks: vec!["name_gender".into(), "emoji_group".into()],
            ..OracleSettings::default()
        };
        let e = run_oracle(&dir, &s, &d, &mut |_| {}, &no).unwrap_err().to_string();
        assert!(
            e.contains("unknown task 'emoji_group'") && e.contains("name_gender, word_sentiment"),
            "{e}"
        );

        s.tasks.clear();
        (s.examples, s.eval_examples, s.lrs, s.epochs) = (16, 8, vec![0.02, 0.01], vec![2, 1]);
        let mut steps = 0;
        let r = run_oracle(&dir.join("suite.toml"), &s, &d, &mut |p| steps = p.done, &no).unwrap();
        assert_eq!(steps, 2 * 2 * 3 + 1 + 2 * 2 * 2, "every step and score is reported");
        assert_eq!(r.tasks, ["name_gender", "word_sentiment"]);
        assert_eq!(
            (r.examples.clone(), r.eval_examples.clone()),
            (vec![16, 16], vec![8, 8])
        );
        let at = |lr: f64, e: usize| r.rows.iter().find(|x| x.lr == lr && x.epochs == e).unwrap();
        for lr in [0.01, 0.02] {
            let one = at(lr, 1);
            assert!(one.moved > 1e-3, "{one:?}");
            assert!(one.gap <= 4.0 * one.ulp, "Theorem 1: {one:?}");
            assert_eq!(one.ta_accuracy.len(), 2);
        }
        let (big, small) = (at(0.02, 2), at(0.01, 2));
        assert!(big.gap > 100.0 * big.ulp, "{big:?}");
        let ratio = big.gap / small.gap;
        eprintln!("{}", r.to_csv());
        assert!((3.6..4.4).contains(&ratio), "halving η divided the gap by {ratio}");
        let slopes = r.slopes();
        assert_eq!(slopes.len(), 2);
        let rel = slopes[1].relative.unwrap();
        assert!((rel - 1.0).abs() < 0.15, "{slopes:?}");
    }
}
