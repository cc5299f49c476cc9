//! The benchmark a document evaluates on: the demo benchmark or a suite opened, and the image
//! demo and text benchmark builds queued on the job thread.

use super::{Document, Level};
use crate::jobs::{BuildJob, Event, Job, JobId};
use crate::runs::Live;
use mergescope_engine::error::{EngineError, Result};
use mergescope_lab::demo::{self, Benchmark};
use mergescope_lab::evaluator::suite::Suite;
use mergescope_lab::nn::Arch;
use mergescope_lab::text_bench::{TextBuildPlan, TextBuildRequest};
use std::path::Path;
use std::time::Instant;

/// What a benchmark build builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildKind {
    /// The image demo benchmark of an architecture.
    Demo(Arch),
    /// The text benchmark (a pretrained BERT-family backbone).
    Text,
}

impl BuildKind {
    /// How the window names it: "the CNN demo benchmark", "the text benchmark".
    pub fn title(self) -> String {
        match self {
            BuildKind::Demo(arch) => format!("the {} demo benchmark", arch.to_string().to_uppercase()),
            BuildKind::Text => "the text benchmark".to_owned(),
        }
    }
}

/// A benchmark build in progress (demo or text).
#[derive(Clone, Debug)]
pub struct BuildState {
    /// Its job.
    pub job: JobId,
    /// What is built.
    pub what: BuildKind,
    /// Progress.
    pub live: Live,
}

/// The lab's text-benchmark messages, written for the command line, worded for the window.
fn text_build_words(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .replace("point --backbone at", "choose")
        .replace(
            "choose another --out or pass --force to replace it",
            "remove it, or rebuild it with `mergescope demo build --benchmark text --backbone DIR --force`",
        )
        .replace(
            "rebuild it with `mergescope demo build --benchmark text --force`",
            "remove it, or rebuild it with `mergescope demo build --benchmark text --backbone DIR --force`",
        )
}

impl Document {
    /// Makes the benchmark's base and experts the inputs (labels: task names).
    pub fn use_benchmark(&mut self, b: Benchmark) {
        self.inputs.clear();
        self.inputs.set_base(&b.base_path(), Some("base".into()));
        for (path, name) in b.expert_paths().iter().zip(b.task_names()) {
            self.inputs.add_expert(path, Some(name.to_owned()));
        }
        if let Some(f) = &mut self.form {
            f.fit_experts(self.inputs.experts.len());
        }
        self.note(
            Level::Info,
            format!(
                "benchmark: {} seed {} ({} tasks) in '{}'",
                b.manifest.arch,
                b.manifest.seed,
                b.manifest.tasks.len(),
                b.dir.display()
            ),
        );
        self.benchmark = Some(b);
        self.suite = None;
        self.dirty = true;
    }

    /// Evaluates merges with the suite at `path` (its [models] table, when it has one, become
    /// the inputs, the experts labelled with the task names when there is one per task).
    pub fn use_suite(&mut self, path: &Path) {
        let suite = match Suite::load(path) {
            Ok(s) => s,
            Err(e) => {
                self.note(Level::Error, format!("cannot open the suite: {e}"));
                return;
            }
        };
        if let Some(m) = suite.models() {
            self.inputs.clear();
            self.inputs.set_base(&m.base, Some("base".into()));
            let tasks = suite.task_names();
            let named = tasks.len() == m.experts.len();
            for (i, e) in m.experts.iter().enumerate() {
                self.inputs.add_expert(e, named.then(|| tasks[i].clone()));
            }
            if let Some(f) = &mut self.form {
                f.fit_experts(self.inputs.experts.len());
            }
        }
        self.note(
            Level::Info,
            format!(
                "suite '{}' ({} tasks: {}) in '{}': merges are evaluated with it",
                suite.name,
                suite.task_names().len(),
                suite.task_names().join(", "),
                path.display()
            ),
        );
        self.benchmark = None;
        self.suite = Some(path.to_owned());
        self.dirty = true;
    }

    /// Queues a build of the demo benchmark for `arch` (into the cache).
    pub fn build_demo(&mut self, arch: Arch, seed: u64) {
        if self.build.is_some() {
            self.note(Level::Warn, "a demo build is already running");
            return;
        }
        let dir = match demo::demo_dir(arch, seed) {
            Ok(d) => d,
            Err(e) => {
                self.note(Level::Error, format!("cannot build the demo: {e}"));
                return;
            }
        };
        if dir.exists() {
            match Benchmark::open(&dir) {
                Ok(b) if b.is_current() => {
                    self.use_benchmark(b);
                    return;
                }
                // Outdated (another recipe version): rebuilt, and replaced once complete.
                Ok(_) => {}
                Err(e) => {
                    self.note(
                        Level::Error,
                        format!(
                            "'{}' is not a usable demo build ({e}); remove it, or rebuild it with \
                             `mergescope demo build --arch {arch} --force`",
                            dir.display()
                        ),
                    );
                    return;
                }
            }
        }
        let job = self.jobs.submit(Job::Build(BuildJob { arch, seed, dir }));
        self.build = Some(BuildState {
            job,
            what: BuildKind::Demo(arch),
            live: Live {
                started: Instant::now(),
                fraction: 0.0,
                stage: "queued".into(),
            },
        });
        self.note(Level::Info, format!("building the {arch} demo benchmark (seed {seed})"));
    }

    /// Queues the text benchmark's build as `request` asks (the window asks for every task on
    /// the chosen backbone with the default recipe, into the cache); when it is done its suite
    /// becomes the window's, as opening it does. A build by the same recipe already in the
    /// folder is opened at once. The lab checks the backbone folder before it builds, and a
    /// folder that is not a BERT model fails the build with what to choose instead. Errs (and
    /// logs) when the request is refused; `Ok(false)` when the suite was opened without a build.
    pub fn build_text_benchmark(&mut self, request: &TextBuildRequest) -> Result<bool> {
        if self.build.is_some() {
            let e = EngineError::invalid("a benchmark build is already running: wait for it, or cancel it");
            self.note(Level::Warn, &e);
            return Err(e);
        }
        let plan = request.plan().map_err(|e| {
            let e = EngineError::invalid(format!("cannot build the text benchmark: {}", text_build_words(&e)));
            self.note(Level::Error, &e);
            e
        })?;
        let build = match plan {
            TextBuildPlan::Built(b) => {
                self.note(
                    Level::Info,
                    format!("the text benchmark is already built in '{}'", b.dir.display()),
                );
                self.use_suite(&b.suite_path());
                return Ok(false);
            }
            TextBuildPlan::Build(build) => build,
        };
        self.note(
            Level::Info,
            format!(
                "building the text benchmark on '{}' into '{}' ({} tasks)",
                build.backbone.display(),
                build.dir.display(),
                build.tasks.len()
            ),
        );
        let job = self.jobs.submit(Job::BuildText(Box::new(build), self.device));
        self.build = Some(BuildState {
            job,
            what: BuildKind::Text,
            live: Live {
                started: Instant::now(),
                fraction: 0.0,
                stage: "queued".into(),
            },
        });
        Ok(true)
    }

    pub(super) fn apply_build(&mut self, e: Event) {
        match e {
            Event::Started(_) => {
                if let Some(b) = &mut self.build {
                    b.live.started = Instant::now();
                    b.live.stage = "starting".into();
                }
            }
            Event::Progress { fraction, stage, .. } => {
                if let Some(b) = &mut self.build {
                    b.live.fraction = fraction;
                    b.live.stage = stage;
                }
            }
            Event::Log { text, .. } => self.note(Level::Info, text),
            Event::Built(_, bench) => {
                self.build = None;
                self.note(Level::Info, "demo benchmark built");
                self.use_benchmark(*bench);
            }
            Event::BuiltText(_, bench) => {
                self.build = None;
                self.note(
                    Level::Info,
                    format!("text benchmark built in '{}'", bench.dir.display()),
                );
                self.use_suite(&bench.suite_path());
            }
            Event::Failed(_, msg, _) => {
                let what = self.build.take().map(|b| b.what);
                match what {
                    Some(BuildKind::Text) => self.note(
                        Level::Error,
                        format!("text benchmark build failed: {}", text_build_words(&msg)),
                    ),
                    _ => self.note(Level::Error, format!("demo build failed: {msg}")),
                }
            }
            Event::Cancelled(_) => {
                let what = self.build.take().map(|b| b.what);
                let name = if what == Some(BuildKind::Text) {
                    "text benchmark"
                } else {
                    "demo"
                };
                self.note(Level::Info, format!("{name} build cancelled"));
            }
            Event::Merged(..) => {}
        }
    }
}
