//! Long work off the UI thread: a queue of jobs (merges, demo and text-benchmark builds) run one
//! at a time by a worker thread, reporting through a channel. The UI polls the events each
//! frame; the worker wakes it with `notify` so progress shows without busy repainting. Every
//! job can be cancelled, queued or running; a panic in a job fails that job, not the app.

use crossbeam_channel::{Receiver, Sender, unbounded};
use mergescope_engine::device::{DeviceChoice, device_name, open_device};
use mergescope_engine::error::{EngineError, ErrorKind, Result};
use mergescope_engine::merge::{ExecOptions, MergeReport, Observer, Phase, Progress};
use mergescope_engine::plugin::Plugin;
use mergescope_interop::request::MergeRequest;
use mergescope_lab::data::{SplitKind, TaskData, benchmark_tasks};
use mergescope_lab::demo::{self, Benchmark, BuildProgress};
use mergescope_lab::evaluate::{self, EvaluatorSpec, open_normalised};
use mergescope_lab::evaluator::suite::Suite;
use mergescope_lab::evaluator::{EvalReport, Evaluator};
use mergescope_lab::nn::Arch;
use mergescope_lab::run::{self, TaskSource};
use mergescope_lab::text_bench::{TextBenchmark, TextBuild};
use mergescope_plugin_api::abi;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Identifies a job for its whole life.
pub type JobId = u64;

/// A merge, optionally evaluated on a benchmark right after.
#[derive(Clone, Debug)]
pub struct MergeJob {
    /// The method.
    pub plugin: Arc<Plugin>,
    /// Inputs, parameters and output.
    pub request: MergeRequest,
    /// Where the tensor operations run.
    pub device: DeviceChoice,
    /// Benchmark to evaluate the result on (when its architecture matches).
    pub benchmark: Option<Benchmark>,
    /// Suite file to evaluate the result with, when no benchmark is open.
    pub suite: Option<PathBuf>,
}

/// Building a demo benchmark into the cache.
#[derive(Clone, Debug)]
pub struct BuildJob {
    /// Architecture.
    pub arch: Arch,
    /// Seed.
    pub seed: u64,
    /// Folder to build into (an outdated build there is replaced when the new one is done).
    pub dir: PathBuf,
}

/// Work for the queue.
#[derive(Clone, Debug)]
pub enum Job {
    /// A merge (then an evaluation).
    Merge(Box<MergeJob>),
    /// A demo benchmark build.
    Build(BuildJob),
    /// A text benchmark build (the lab's, as `mergescope demo build --benchmark text` runs it),
    /// on the document's device.
    BuildText(Box<TextBuild>, DeviceChoice),
}

/// What a merge job produced.
#[derive(Clone, Debug)]
pub struct MergeOutcome {
    /// The engine's report (files, seconds, notes, parameters as resolved).
    pub report: MergeReport,
    /// The device it ran on (after any fallback).
    pub device: String,
    /// Per-task evaluation, or why there is none.
    pub eval: Option<std::result::Result<EvalReport, Arc<EngineError>>>,
}

/// Reports from the worker.
#[derive(Clone, Debug)]
pub enum Event {
    /// The job left the queue and started.
    Started(JobId),
    /// Progress of a running job: fraction of the current stage done, and the stage.
    Progress {
        /// Job.
        id: JobId,
        /// 0..=1.
        fraction: f32,
        /// What it is doing, e.g. "merging" or "expert mnist".
        stage: String,
    },
    /// A log line (from a plugin, or a device fallback note).
    Log {
        /// Job.
        id: JobId,
        /// `abi::LOG_*` level.
        level: abi::LogLevel,
        /// The message.
        text: String,
    },
    /// A merge finished.
    Merged(JobId, Box<MergeOutcome>),
    /// A demo build finished.
    Built(JobId, Box<Benchmark>),
    /// A text benchmark build finished.
    BuiltText(JobId, Box<TextBenchmark>),
    /// The job failed; the message says why and what to do, the kind what is at fault.
    Failed(JobId, String, ErrorKind),
    /// The job was cancelled (queued or running); nothing was written.
    Cancelled(JobId),
}

impl Event {
    /// The job this event is about.
    pub fn id(&self) -> JobId {
        match self {
            Event::Started(id) | Event::Cancelled(id) | Event::Merged(id, _) | Event::Built(id, _) => *id,
            Event::BuiltText(id, _) => *id,
            Event::Failed(id, ..) => *id,
            Event::Progress { id, .. } | Event::Log { id, .. } => *id,
        }
    }
}

/// Called by the worker after each event (the UI passes `Context::request_repaint`).
pub type Notify = Arc<dyn Fn() + Send + Sync>;

/// What a background task sends: its updates, then its result (always last).
pub enum TaskMessage<M, R> {
    /// An update while it runs.
    Update(M),
    /// Its result; a panic arrives as `Err(panicked)`.
    Done(Result<R>),
}

/// Runs `work` on a thread named `name`, handing it a `send` for updates; every message is
/// followed by `notify()`, and the result comes last. A panic in `work` becomes the error
/// `panicked` instead of taking the app down. Errs (with the system's reason) when the thread
/// cannot start.
pub fn spawn_task<M: Send + 'static, R: Send + 'static>(
    name: &str,
    notify: Notify,
    panicked: &'static str,
    work: impl FnOnce(&(dyn Fn(M) + Sync)) -> Result<R> + Send + 'static,
) -> Result<Receiver<TaskMessage<M, R>>> {
    let (tx, rx) = unbounded();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let send = |m: TaskMessage<M, R>| {
                let _ = tx.send(m);
                notify();
            };
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&|m| send(TaskMessage::Update(m)))))
                    .unwrap_or_else(|_| Err(EngineError::Bug(panicked.to_owned())));
            send(TaskMessage::Done(result));
        })
        .map(|_| rx)
        .map_err(|e| {
            EngineError::invalid(format!(
                "cannot start the '{name}' thread: {e}; close other programs and try again"
            ))
        })
}

/// The one background task a window runs at a time: its messages, cancel flag and start.
pub struct Background<M, R> {
    rx: Option<Receiver<TaskMessage<M, R>>>,
    cancel: Arc<AtomicBool>,
    since: Option<Instant>,
}

impl<M, R> Default for Background<M, R> {
    fn default() -> Self {
        Background {
            rx: None,
            cancel: Arc::new(AtomicBool::new(false)),
            since: None,
        }
    }
}

impl<M: Send + 'static, R: Send + 'static> Background<M, R> {
    /// Cancels the task in flight, if any, and starts `work` with a fresh cancel flag through
    /// [`spawn_task`]; errs when the thread cannot start.
    pub fn start(
        &mut self,
        name: &str,
        notify: Notify,
        panicked: &'static str,
        work: impl FnOnce(&AtomicBool, &(dyn Fn(M) + Sync)) -> Result<R> + Send + 'static,
    ) -> Result<()> {
        self.cancel();
        self.since = None;
        let cancel = Arc::new(AtomicBool::new(false));
        self.cancel = cancel.clone();
        self.rx = Some(spawn_task(name, notify, panicked, move |send| work(&cancel, send))?);
        self.since = Some(Instant::now());
        Ok(())
    }

    /// Asks the task in flight to stop.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// When the task in flight started.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    /// The messages since the last call.
    pub fn messages(&self) -> Vec<TaskMessage<M, R>> {
        self.rx.as_ref().map(|rx| rx.try_iter().collect()).unwrap_or_default()
    }

    /// Marks the task ended (call on its result); returns the seconds it ran.
    pub fn finish(&mut self) -> Option<f64> {
        self.rx = None;
        self.since.take().map(|t| t.elapsed().as_secs_f64())
    }
}

struct Queued {
    id: JobId,
    job: Job,
    cancel: Arc<AtomicBool>,
}

/// The queue and its worker thread.
pub struct JobQueue {
    submit: Sender<Queued>,
    events: Receiver<Event>,
    cancels: HashMap<JobId, Arc<AtomicBool>>,
    next: JobId,
}

impl JobQueue {
    /// Starts the worker thread.
    pub fn start(notify: Notify) -> JobQueue {
        let (submit, jobs) = unbounded::<Queued>();
        let (tx, events) = unbounded::<Event>();
        let spawned = std::thread::Builder::new()
            .name("mergescope-jobs".into())
            .spawn(move || Worker::new(tx, notify).run(jobs));
        if let Err(e) = spawned {
            // Without a worker every job stays queued; say so rather than crash.
            eprintln!("error: cannot start the job thread: {e}");
        }
        JobQueue {
            submit,
            events,
            cancels: HashMap::new(),
            next: 1,
        }
    }

    /// Queues a job; it runs after those queued before it.
    pub fn submit(&mut self, job: Job) -> JobId {
        let id = self.next;
        self.next += 1;
        let cancel = Arc::new(AtomicBool::new(false));
        self.cancels.insert(id, cancel.clone());
        if self.submit.send(Queued { id, job, cancel }).is_err() {
            eprintln!("error: the job thread is gone; job {id} will not run");
        }
        id
    }

    /// Asks a job to stop (a queued job is dropped when its turn comes).
    pub fn cancel(&self, id: JobId) {
        if let Some(c) = self.cancels.get(&id) {
            c.store(true, Ordering::Relaxed);
        }
    }

    /// Forgets the cancel flag of a job that has ended.
    fn forget_ended(&mut self, e: &Event) {
        if matches!(
            e,
            Event::Merged(..) | Event::Built(..) | Event::BuiltText(..) | Event::Failed(..) | Event::Cancelled(_)
        ) {
            self.cancels.remove(&e.id());
        }
    }

    /// Events since the last call.
    pub fn poll(&mut self) -> Vec<Event> {
        let events: Vec<Event> = self.events.try_iter().collect();
        for e in &events {
            self.forget_ended(e);
        }
        events
    }

    /// Blocks until the next event or the timeout (for tests and headless use).
    pub fn wait(&mut self, timeout: Duration) -> Option<Event> {
        let e = self.events.recv_timeout(timeout).ok()?;
        self.forget_ended(&e);
        Some(e)
    }
}

/// What a cached evaluator evaluates on: the benchmark folder (or the suite file and the
/// request's base and experts, which give its references) and the device's name.
type EvaluatorKey = (Vec<PathBuf>, &'static str);

/// The worker's side: runs jobs, caches evaluators, sends events.
struct Worker {
    tx: Sender<Event>,
    notify: Notify,
    /// Task data, loaded once.
    tasks: Option<Vec<TaskData>>,
    /// Evaluator of the last benchmark (key: folder and device).
    evaluator: Option<(EvaluatorKey, Box<dyn Evaluator>)>,
}

impl Worker {
    fn new(tx: Sender<Event>, notify: Notify) -> Worker {
        Worker {
            tx,
            notify,
            tasks: None,
            evaluator: None,
        }
    }

    fn send(&self, e: Event) {
        // A closed channel means the UI is gone; nothing is left to tell.
        let _ = self.tx.send(e);
        (self.notify)();
    }

    fn run(mut self, jobs: Receiver<Queued>) {
        for q in jobs {
            if q.cancel.load(Ordering::Relaxed) {
                self.send(Event::Cancelled(q.id));
                continue;
            }
            self.send(Event::Started(q.id));
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &q.job {
                Job::Merge(m) => self.merge(q.id, m, &q.cancel),
                Job::Build(b) => self.build(q.id, b, &q.cancel),
                Job::BuildText(b, device) => self.build_text(q.id, b, *device, &q.cancel),
            }));
            let event = match outcome {
                Ok(Ok(e)) => e,
                Ok(Err(_)) if q.cancel.load(Ordering::Relaxed) => Event::Cancelled(q.id),
                Ok(Err(EngineError::Cancelled)) => Event::Cancelled(q.id),
                Ok(Err(e)) => Event::Failed(q.id, e.to_string(), e.kind()),
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "unknown panic".into());
                    let e = EngineError::Bug(format!("the job panicked: {what}"));
                    Event::Failed(q.id, e.to_string(), e.kind())
                }
            };
            self.send(event);
        }
    }

    fn merge(&mut self, id: JobId, job: &MergeJob, cancel: &AtomicBool) -> Result<Event> {
        let (device, note) = open_device(job.device);
        if let Some(n) = note {
            self.send(Event::Log {
                id,
                level: abi::LOG_WARN,
                text: n,
            });
        }
        let opts = ExecOptions {
            device: device.clone(),
            ..ExecOptions::default()
        };
        let model_level = job.plugin.is_model_level();
        if model_level && job.benchmark.is_some() && self.tasks.is_none() {
            self.tasks = Some(benchmark_tasks(None)?);
        }
        let last = Mutex::new(Instant::now() - Duration::from_secs(1));
        let progress = |p: &Progress| {
            let fraction = if p.total == 0 {
                if model_level { 0.0 } else { 1.0 }
            } else {
                p.done as f32 / p.total as f32
            };
            let stage = match p.phase {
                Phase::Statistics(n) => format!("statistics pass {}", n + 1),
                Phase::Merge if model_level => format!("optimising: {}", p.tensor),
                Phase::Merge => "merging".to_owned(),
            };
            if let Ok(mut t) = last.lock()
                && (t.elapsed() >= Duration::from_millis(30) || p.done == p.total)
            {
                *t = Instant::now();
                self.send(Event::Progress { id, fraction, stage });
            }
        };
        let log = |level: abi::LogLevel, text: &str| {
            self.send(Event::Log {
                id,
                level,
                text: text.to_owned(),
            })
        };
        let observer = Observer {
            progress: &progress,
            log: &log,
        };
        let suite = match (&job.suite, model_level) {
            (Some(path), true) => Some(Suite::load(path)?),
            _ => None,
        };
        let tasks = match (&job.benchmark, &suite) {
            (Some(bench), _) => Some(TaskSource::Benchmark {
                bench,
                tasks: self.tasks.as_deref().unwrap_or_default(),
            }),
            (None, Some(suite)) => Some(TaskSource::Suite(suite)),
            (None, None) if model_level => {
                return Err(EngineError::Invalid(format!(
                    "'{}' evaluates candidates on calibration data: open a benchmark or a suite with calibration data (Benchmark menu) first",
                    job.plugin.id()
                )));
            }
            (None, None) => None,
        };
        let running = job
            .request
            .out
            .parent()
            .map(|dir| crate::crash_marker::Running::begin(dir, &job.plugin, &job.request.out));
        let report = run::merge(&job.plugin, &job.request, tasks, &opts, observer, cancel).map(|o| {
            if let Some(label) = o.model.as_ref().and_then(|r| r.partial.as_ref()) {
                log(
                    abi::LOG_WARN,
                    &format!("cancelled: kept the last iterate ('{label}') as a partial result"),
                );
            }
            o.report
        })?;
        drop(running);
        if job.benchmark.is_some() || job.suite.is_some() {
            self.send(Event::Progress {
                id,
                fraction: 1.0,
                stage: "evaluating".into(),
            });
        }
        let eval = match (&job.benchmark, &job.suite) {
            (Some(b), _) => Some(self.evaluate(b, &job.request.out, &device, cancel)),
            (None, Some(suite)) => Some(self.evaluate_with_suite(suite, &job.request, &device, cancel)),
            (None, None) => None,
        };
        Ok(Event::Merged(
            id,
            Box::new(MergeOutcome {
                report,
                device: device_name(&device).to_owned(),
                eval: eval.map(|r| r.map_err(Arc::new)),
            }),
        ))
    }

    /// Evaluates the checkpoint at `path` per task on `bench`.
    fn evaluate(
        &mut self,
        bench: &Benchmark,
        path: &std::path::Path,
        device: &candle_core::Device,
        cancel: &AtomicBool,
    ) -> Result<EvalReport> {
        let key = (vec![bench.dir.clone()], device_name(device));
        let ev = self.cached_evaluator(key, |w| {
            if w.tasks.is_none() {
                w.tasks = Some(benchmark_tasks(None)?);
            }
            let tasks = w.tasks.as_deref().unwrap_or_default();
            Ok(Box::new(bench.evaluator(tasks, None, SplitKind::Test, device)?))
        })?;
        ev.evaluate_file(path, cancel)
    }

    /// The cached evaluator if it is the one for `key`, else the one `open` makes (cached in
    /// its place).
    fn cached_evaluator(
        &mut self,
        key: EvaluatorKey,
        open: impl FnOnce(&mut Self) -> Result<Box<dyn Evaluator>>,
    ) -> Result<&dyn Evaluator> {
        let ev = match self.evaluator.take() {
            Some((k, ev)) if k == key => ev,
            _ => open(self)?,
        };
        Ok(self.evaluator.insert((key, ev)).1.as_ref())
    }

    /// Evaluates the output of `req` with the suite at `suite`, normalised by the request's
    /// experts when there is one per task (the evaluator is kept for the next merge).
    fn evaluate_with_suite(
        &mut self,
        suite: &std::path::Path,
        req: &MergeRequest,
        device: &candle_core::Device,
        cancel: &AtomicBool,
    ) -> Result<EvalReport> {
        // The references come from the experts: a merge of other experts needs new ones.
        let inputs = std::iter::once(suite)
            .chain(req.base.as_deref())
            .chain(req.experts.iter().map(PathBuf::as_path));
        let key = (inputs.map(std::path::Path::to_path_buf).collect(), device_name(device));
        let ev = self.cached_evaluator(key, |_| {
            let spec = EvaluatorSpec::new(suite.display().to_string(), device);
            Ok(match &req.base {
                Some(base) => open_normalised(&spec, base, &req.experts, cancel)?,
                None => evaluate::open(&spec, None)?.evaluator,
            })
        })?;
        ev.evaluate_file(&req.out, cancel)
    }

    fn build(&mut self, id: JobId, job: &BuildJob, cancel: &AtomicBool) -> Result<Event> {
        if self.tasks.is_none() {
            self.tasks = Some(benchmark_tasks(None)?);
        }
        let tasks = self.tasks.clone().unwrap_or_default();
        let recipe = demo::BuildRecipe::default_for(job.arch, job.seed);
        let (device, _) = open_device(DeviceChoice::Cpu);
        let mut progress = self.build_progress(id, "building demo");
        // An outdated build in `dir` is replaced only once the new one is complete.
        let b = demo::build_replacing(&job.dir, |staging| {
            demo::build(job.arch, &tasks, &recipe, staging, &device, &mut progress, cancel)
        })?;
        Ok(Event::Built(id, Box::new(b)))
    }

    /// Builds the text benchmark: the lab checks the backbone folder first, then trains the
    /// heads and experts; the folder is replaced only once the build is complete.
    fn build_text(&mut self, id: JobId, job: &TextBuild, device: DeviceChoice, cancel: &AtomicBool) -> Result<Event> {
        // Where the device is missing the build runs on the CPU (the manifest's kernel_path says
        // which it was).
        let (device, _) = open_device(device);
        let mut progress = self.build_progress(id, "building text benchmark");
        let b = job.run(&device, &mut progress, cancel)?;
        Ok(Event::BuiltText(id, Box::new(b)))
    }

    /// A build's progress callback: an event at most every 50 ms (and at the end), its stage
    /// after `what`.
    fn build_progress<'a>(&'a self, id: JobId, what: &'a str) -> impl FnMut(&BuildProgress) + 'a {
        let mut last = Instant::now() - Duration::from_secs(1);
        move |p: &BuildProgress| {
            if last.elapsed() >= Duration::from_millis(50) || p.done == p.total {
                last = Instant::now();
                let fraction = if p.total == 0 {
                    1.0
                } else {
                    p.done as f32 / p.total as f32
                };
                self.send(Event::Progress {
                    id,
                    fraction,
                    stage: format!("{what}: {}", p.stage),
                });
            }
        }
    }
}
