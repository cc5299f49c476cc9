//! The host side of a model-level session (ABI 1.1): the [`SessionApiV1`] table a model-level
//! plugin's `run_model` calls back into. Candidates are tensor handles of the call's arena
//! ([`CallCtx`]); evaluation, gradients and fine-tuning are the model family's
//! [`CalibrationTasks`]; this module only translates the C table to them.

use crate::evaluator::calibration::{CalibrationTasks, Objective, Subset};
use crate::nn::Params;
use crate::train::{BatchSize, Budget, OptimConfig, TrainConfig};
use candle_core::Tensor;
use mergescope_engine::error::{EngineError, Result};
use mergescope_engine::plugin::call::CallCtx;
use mergescope_engine::plugin::instance::{CallEnv, Instance};
use mergescope_plugin_api::abi::{self, EvalMetrics, FinetuneOptions, SessionApiV1, Status, Str, TensorHandle};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Iterates kept in memory at most; beyond that every other one is dropped (the first and the
/// latest are always kept), so a long run's trajectory stays bounded but spans the whole run.
pub const MAX_KEPT_ITERATES: usize = 256;

/// Bytes the kept iterates may hold together: fewer of a large model's iterates are kept (a
/// 22.7 M-parameter f32 model: 11), but never fewer than [`MIN_KEPT_ITERATES`].
pub const MAX_TRAJECTORY_BYTES: usize = 1 << 30;

/// Iterates kept whatever their size.
pub const MIN_KEPT_ITERATES: usize = 8;

/// The models and tasks a model-level method runs on.
pub struct SessionModel<'a> {
    /// Tensor names, in the session's order.
    pub names: Vec<String>,
    /// Their shapes.
    pub shapes: Vec<Vec<usize>>,
    /// The base model's tensors, in order.
    pub base: Vec<Tensor>,
    /// Each expert's tensors, in order.
    pub experts: Vec<Vec<Tensor>>,
    /// One task per expert: how candidates are evaluated, differentiated and fine-tuned.
    pub tasks: Box<dyn CalibrationTasks + 'a>,
}

/// A point of a method's trajectory.
#[derive(Clone, Debug)]
pub struct Iterate {
    /// Position in the order of reports (0-based; thinning leaves gaps).
    pub index: usize,
    /// The method's label ("step 10", "round 2").
    pub label: String,
    /// The method's metrics (a JSON object).
    pub metrics: serde_json::Value,
    /// The candidate's tensors, in the session's order.
    pub tensors: Vec<Tensor>,
}

/// The iterates of a run, thinned to at most [`MAX_KEPT_ITERATES`] and
/// [`MAX_TRAJECTORY_BYTES`] (but at least [`MIN_KEPT_ITERATES`]): evenly, every `stride`-th
/// report and the latest one, the stride doubling whenever the kept ones exceed the cap.
#[derive(Clone, Debug, Default)]
pub struct Trajectory {
    /// Kept iterates, in report order.
    pub iterates: Vec<Iterate>,
    /// Iterates reported in all.
    pub reported: usize,
    /// Reports kept besides the latest: those whose index is a multiple of this (0: 1).
    stride: usize,
}

impl Trajectory {
    fn push(&mut self, it: Iterate) {
        self.reported += 1;
        let bytes: usize = it
            .tensors
            .iter()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum();
        let cap = (MAX_TRAJECTORY_BYTES / bytes.max(1)).clamp(MIN_KEPT_ITERATES, MAX_KEPT_ITERATES);
        let mut stride = self.stride.max(1);
        // The previous latest stays only if it is on the stride.
        if self.iterates.last().is_some_and(|l| l.index % stride != 0) {
            self.iterates.pop();
        }
        self.iterates.push(it);
        while self.iterates.len() > cap {
            stride *= 2;
            let latest = self.iterates.pop();
            self.iterates.retain(|i| i.index % stride == 0);
            self.iterates.extend(latest);
        }
        self.stride = stride;
    }
}

/// State behind a session table, for one `run_model` call.
pub struct SessionCtx<'a, 'c> {
    model: &'a SessionModel<'a>,
    // Raw: the host table of the same call points at this context too; both are only used
    // from the plugin's thread, one call at a time.
    call: *mut CallCtx<'c>,
    /// What the method reported.
    pub trajectory: Trajectory,
    /// Receives each reported iterate's label and the plugin's last progress fraction.
    on_iterate: &'a mut dyn FnMut(&str, f64),
}

impl<'a, 'c> SessionCtx<'a, 'c> {
    /// A session over `model`, handing out handles from `call`'s arena.
    pub fn new(
        model: &'a SessionModel<'a>,
        call: &'a mut CallCtx<'c>,
        on_iterate: &'a mut dyn FnMut(&str, f64),
    ) -> SessionCtx<'a, 'c> {
        SessionCtx {
            model,
            call: call as *mut CallCtx<'c>,
            trajectory: Trajectory::default(),
            on_iterate,
        }
    }

    fn call(&self) -> &CallCtx<'c> {
        // SAFETY: `call` outlives the session (see `new`); no `&mut` to it is live now.
        unsafe { &*self.call }
    }

    fn call_mut(&mut self) -> &mut CallCtx<'c> {
        // SAFETY: as in `call`; `&mut self` makes this the only reference.
        unsafe { &mut *self.call }
    }

    /// `loss_and_grad` of both tables: the objective of `candidate` over `subset` of the
    /// calibration examples of `task`, into `loss`, and its gradient into `grads` when not null.
    #[allow(clippy::too_many_arguments)]
    fn objective(
        &mut self,
        candidate: *const TensorHandle,
        n: usize,
        task: usize,
        objective: abi::Objective,
        subset: Subset,
        loss: *mut f64,
        grads: *mut TensorHandle,
    ) -> std::result::Result<(), String> {
        let p = self.candidate(candidate, n)?;
        let tasks = self.task_list(task)?;
        let objective = match objective {
            abi::OBJECTIVE_CROSS_ENTROPY => Objective::CrossEntropy,
            abi::OBJECTIVE_ENTROPY => Objective::Entropy,
            k => {
                return Err(format!(
                    "unknown objective {k}; use OBJECTIVE_CROSS_ENTROPY or OBJECTIVE_ENTROPY"
                ));
            }
        };
        let (value, g) = self
            .model
            .tasks
            .objective(&p, &self.model.names, &tasks, subset, objective, !grads.is_null())
            .map_err(engine_err)?;
        write(loss, value)?;
        match g {
            Some(g) => self.insert_all(g, grads, n),
            None => Ok(()),
        }
    }

    /// The session table; it points at `self`: keep `self` alive and unmoved while the plugin
    /// runs.
    pub fn table(&mut self) -> SessionApiV1 {
        SessionApiV1 {
            struct_size: std::mem::size_of::<SessionApiV1>(),
            ctx: (self as *mut SessionCtx<'a, 'c>).cast::<c_void>(),
            tensor_count: s_tensor_count,
            tensor_info: s_tensor_info,
            expert_count: s_expert_count,
            task_name: s_task_name,
            base_tensor: s_base_tensor,
            expert_tensor: s_expert_tensor,
            evaluate: s_evaluate,
            loss_and_grad: s_loss_and_grad,
            finetune: s_finetune,
            report_iterate: s_report_iterate,
            mark: s_mark,
            release_since: s_release_since,
            get_extension: s_get_extension,
        }
    }

    fn candidate(&self, ptr: *const TensorHandle, n: usize) -> std::result::Result<Params, String> {
        let want = self.model.names.len();
        if n != want || (ptr.is_null() && n > 0) {
            return Err(format!(
                "a candidate has {want} tensors (one per session tensor), not {n}"
            ));
        }
        // SAFETY: the plugin passes `n` handles.
        let hs = if n == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(ptr, n) }
        };
        let mut p = Params::new();
        for (i, h) in hs.iter().enumerate() {
            let t = self
                .call()
                .get(*h)
                .ok_or_else(|| format!("candidate tensor {i} ('{}'): unknown handle {h}", self.model.names[i]))?;
            if t.dims() != self.model.shapes[i].as_slice() {
                return Err(format!(
                    "candidate tensor {i} ('{}') has shape {:?}, expected {:?}",
                    self.model.names[i],
                    t.dims(),
                    self.model.shapes[i]
                ));
            }
            p.insert(self.model.names[i].clone(), t.clone());
        }
        Ok(p)
    }

    /// Registers `tensors` in the arena and writes their handles to the plugin's `out` array of
    /// `n` handles.
    fn insert_all(
        &mut self,
        tensors: Vec<Tensor>,
        out: *mut TensorHandle,
        n: usize,
    ) -> std::result::Result<(), String> {
        if out.is_null() {
            return Err("null output pointer".into());
        }
        if tensors.len() != n {
            return Err(format!(
                "the model family computed {} tensors for a candidate of {n}; this is a bug in mergescope, please report it",
                tensors.len()
            ));
        }
        // SAFETY: checked for null; the plugin gives room for `n` handles.
        let dst = unsafe { std::slice::from_raw_parts_mut(out, n) };
        for (d, t) in dst.iter_mut().zip(tensors) {
            *d = self.call_mut().insert(t);
        }
        Ok(())
    }

    fn task_count(&self) -> usize {
        self.model.tasks.task_names().len()
    }

    fn task_list(&self, task: usize) -> std::result::Result<Vec<usize>, String> {
        let n = self.task_count();
        if task == abi::ALL_TASKS {
            Ok((0..n).collect())
        } else if task < n {
            Ok(vec![task])
        } else {
            Err(format!("task {task} does not exist; the session has {n} tasks"))
        }
    }

    /// The task's fine-tuning settings from the plugin's options.
    fn train_config(o: &FinetuneOptions) -> Result<TrainConfig> {
        let optim = match o.optimizer {
            abi::OPTIMIZER_SGD => OptimConfig::sgd(o.learning_rate),
            abi::OPTIMIZER_MOMENTUM => OptimConfig::momentum(o.learning_rate),
            abi::OPTIMIZER_ADAMW => OptimConfig::adamw(o.learning_rate, o.weight_decay),
            k => return Err(EngineError::Param(format!("unknown optimizer {k} in finetune options"))),
        };
        if !(o.learning_rate.is_finite() && o.learning_rate > 0.0) {
            return Err(EngineError::Param(format!(
                "finetune learning rate must be positive, not {}",
                o.learning_rate
            )));
        }
        Ok(TrainConfig {
            optim,
            batch: if o.batch_size == 0 {
                BatchSize::Full
            } else {
                BatchSize::Size(o.batch_size as usize)
            },
            budget: Budget::Steps(o.steps as usize),
            seed: o.seed,
            augment_shift: 0,
        })
    }
}

/// Runs a session function body: resolves the context, catches panics, records errors.
fn with_session(
    ctx: *mut c_void,
    f: impl FnOnce(&mut SessionCtx<'_, '_>) -> std::result::Result<(), String>,
) -> Status {
    let ptr = ctx.cast::<SessionCtx<'static, 'static>>();
    if ptr.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    // SAFETY: `ctx` is the pointer `SessionCtx::table` put in the table; it outlives the call.
    let result = catch_unwind(AssertUnwindSafe(|| f(unsafe { &mut *ptr })));
    // SAFETY: as above; the closure's borrow has ended.
    let s = unsafe { &mut *ptr };
    match result {
        Ok(Ok(())) => abi::STATUS_OK,
        Ok(Err(m)) if m == "cancelled" => abi::STATUS_CANCELLED,
        Ok(Err(m)) => {
            s.call_mut().fail(m);
            abi::STATUS_ERROR
        }
        Err(_) => {
            s.call_mut().fail("internal error in a session function".into());
            abi::STATUS_ERROR
        }
    }
}

/// Writes `value` through a plugin's output pointer.
fn write<T>(out: *mut T, value: T) -> std::result::Result<(), String> {
    if out.is_null() {
        return Err("null output pointer".into());
    }
    // SAFETY: checked for null; the plugin passes a writable pointer.
    unsafe { *out = value };
    Ok(())
}

fn engine_err(e: EngineError) -> String {
    match e {
        EngineError::Cancelled => "cancelled".into(),
        e => e.to_string(),
    }
}

/// Item `index` of `items`, or the error naming it as `what` `index` of their count.
fn nth<'a, T>(items: &'a [T], index: usize, what: &str) -> std::result::Result<&'a T, String> {
    items
        .get(index)
        .ok_or_else(|| format!("{what} {index} of {}", items.len()))
}

/// What `count` says of the session (0 when `ctx` is null).
fn session_count(ctx: *mut c_void, count: impl FnOnce(&SessionCtx<'_, '_>) -> usize) -> usize {
    let mut n = 0;
    with_session(ctx, |s| {
        n = count(s);
        Ok(())
    });
    n
}

unsafe extern "C" fn s_tensor_count(ctx: *mut c_void) -> usize {
    session_count(ctx, |s| s.model.names.len())
}

unsafe extern "C" fn s_tensor_info(ctx: *mut c_void, index: usize, out: *mut abi::TensorInfo) -> Status {
    with_session(ctx, |s| {
        let count = s.model.names.len();
        let name = nth(&s.model.names, index, "tensor")?;
        let shape = &s.model.shapes[index];
        write(
            out,
            abi::TensorInfo {
                struct_size: std::mem::size_of::<abi::TensorInfo>(),
                name: Str::new(name),
                role: mergescope_engine::role::role_of(name, shape),
                index,
                count,
                offset: 0,
                full_numel: shape.iter().product::<usize>() as u64,
                full_shape: shape.as_ptr(),
                full_rank: shape.len(),
            },
        )
    })
}

unsafe extern "C" fn s_expert_count(ctx: *mut c_void) -> usize {
    session_count(ctx, |s| s.model.experts.len())
}

unsafe extern "C" fn s_task_name(ctx: *mut c_void, task: usize, out: *mut Str) -> Status {
    with_session(ctx, |s| {
        let names = s.model.tasks.task_names();
        write(out, Str::new(nth(&names, task, "task")?))
    })
}

unsafe extern "C" fn s_base_tensor(ctx: *mut c_void, index: usize, out: *mut TensorHandle) -> Status {
    with_session(ctx, |s| {
        let t = nth(&s.model.base, index, "base tensor")?.clone();
        let h = s.call_mut().insert(t);
        write(out, h)
    })
}

unsafe extern "C" fn s_expert_tensor(ctx: *mut c_void, expert: usize, index: usize, out: *mut TensorHandle) -> Status {
    with_session(ctx, |s| {
        let e = nth(&s.model.experts, expert, "expert")?;
        let t = nth(e, index, "tensor")?.clone();
        let h = s.call_mut().insert(t);
        write(out, h)
    })
}

unsafe extern "C" fn s_evaluate(
    ctx: *mut c_void,
    candidate: *const TensorHandle,
    n: usize,
    task: usize,
    out: *mut EvalMetrics,
) -> Status {
    with_session(ctx, |s| {
        let p = s.candidate(candidate, n)?;
        let tasks = s.task_list(task)?;
        let m = s.model.tasks.evaluate(&p, &tasks).map_err(engine_err)?;
        write(
            out,
            EvalMetrics {
                struct_size: std::mem::size_of::<EvalMetrics>(),
                loss: m.loss,
                accuracy: m.accuracy,
                examples: m.examples,
            },
        )
    })
}

unsafe extern "C" fn s_loss_and_grad(
    ctx: *mut c_void,
    candidate: *const TensorHandle,
    n: usize,
    task: usize,
    objective: abi::Objective,
    loss: *mut f64,
    grads: *mut TensorHandle,
) -> Status {
    with_session(ctx, |s| {
        s.objective(candidate, n, task, objective, Subset::All, loss, grads)
    })
}

unsafe extern "C" fn s_minibatch_loss_and_grad(
    ctx: *mut c_void,
    candidate: *const TensorHandle,
    n: usize,
    task: usize,
    objective: abi::Objective,
    batch: *const abi::Minibatch,
    loss: *mut f64,
    grads: *mut TensorHandle,
) -> Status {
    with_session(ctx, |s| {
        // SAFETY: the plugin passes a readable batch struct or null.
        let b = unsafe { batch.as_ref() }.ok_or("null mini-batch")?;
        if b.struct_size < std::mem::size_of::<abi::Minibatch>() {
            return Err(format!("a mini-batch of {} bytes is too short", b.struct_size));
        }
        if b.size == 0 {
            return Err(
                "a mini-batch needs at least one example per task (size 0 given); call loss_and_grad for every example"
                    .into(),
            );
        }
        let subset = Subset::Minibatch {
            size: usize::try_from(b.size).unwrap_or(usize::MAX),
            seed: b.seed,
            step: b.step,
        };
        s.objective(candidate, n, task, objective, subset, loss, grads)
    })
}

unsafe extern "C" fn s_finetune(
    ctx: *mut c_void,
    candidate: *const TensorHandle,
    n: usize,
    task: usize,
    options: *const FinetuneOptions,
    out: *mut TensorHandle,
) -> Status {
    with_session(ctx, |s| {
        let p = s.candidate(candidate, n)?;
        if task >= s.task_count() {
            return Err(format!("finetune needs one task (0..{}), not {task}", s.task_count()));
        }
        // SAFETY: the plugin passes a readable options struct or null.
        let o = unsafe { options.as_ref() }.ok_or("null finetune options")?;
        if o.struct_size < std::mem::size_of::<FinetuneOptions>() {
            return Err(format!("finetune options of {} bytes are too short", o.struct_size));
        }
        if out.is_null() {
            return Err("null output pointer".into());
        }
        let config = SessionCtx::train_config(o).map_err(engine_err)?;
        let call = s.call();
        let mut tuned = s
            .model
            .tasks
            .finetune(&p, task, &config, call.device(), call.cancel_flag())
            .map_err(engine_err)?;
        let ordered = s
            .model
            .names
            .iter()
            .map(|name| {
                tuned
                    .remove(name)
                    .ok_or_else(|| format!("fine-tuning lost tensor '{name}'"))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        s.insert_all(ordered, out, n)
    })
}

unsafe extern "C" fn s_report_iterate(
    ctx: *mut c_void,
    candidate: *const TensorHandle,
    n: usize,
    label: Str,
    metrics_json: Str,
) -> Status {
    with_session(ctx, |s| {
        let p = s.candidate(candidate, n)?;
        // SAFETY: borrowed strings valid for the call.
        let label = unsafe { label.as_str() }
            .map_err(|_| "iterate label is not UTF-8")?
            .to_owned();
        // SAFETY: as above.
        let metrics = unsafe { metrics_json.as_str() }.map_err(|_| "iterate metrics are not UTF-8")?;
        let metrics = if metrics.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            serde_json::from_str(metrics).map_err(|e| format!("iterate '{label}': metrics are not JSON: {e}"))?
        };
        let tensors = s.model.names.iter().map(|k| p[k].detach()).collect();
        let index = s.trajectory.reported;
        let fraction = s.call().progress;
        (s.on_iterate)(&label, fraction);
        s.trajectory.push(Iterate {
            index,
            label,
            metrics,
            tensors,
        });
        Ok(())
    })
}

unsafe extern "C" fn s_mark(ctx: *mut c_void) -> u64 {
    let mut m = 0;
    with_session(ctx, |s| {
        m = s.call().mark();
        Ok(())
    });
    m
}

unsafe extern "C" fn s_release_since(ctx: *mut c_void, mark: u64, keep: *const TensorHandle, n_keep: usize) -> Status {
    with_session(ctx, |s| {
        let keep = if n_keep == 0 {
            &[][..]
        } else if keep.is_null() {
            return Err("null keep list".into());
        } else {
            // SAFETY: the plugin passes `n_keep` handles.
            unsafe { std::slice::from_raw_parts(keep, n_keep) }
        };
        s.call_mut().release_since(mark, keep)
    })
}

/// The host's diagonal-Fisher extension table.
static FISHER_V1: abi::SessionFisherV1 = abi::SessionFisherV1 {
    struct_size: std::mem::size_of::<abi::SessionFisherV1>(),
    diag_fisher: s_diag_fisher,
};

/// The host's mini-batch extension table.
static MINIBATCH_V1: abi::SessionMinibatchV1 = abi::SessionMinibatchV1 {
    struct_size: std::mem::size_of::<abi::SessionMinibatchV1>(),
    loss_and_grad: s_minibatch_loss_and_grad,
};

unsafe extern "C" fn s_get_extension(_ctx: *mut c_void, id: Str) -> *const c_void {
    // SAFETY: a borrowed string valid for the call.
    match unsafe { id.as_str() } {
        Ok(abi::SESSION_EXT_FISHER_V1) => (&raw const FISHER_V1).cast(),
        Ok(abi::SESSION_EXT_MINIBATCH_V1) => (&raw const MINIBATCH_V1).cast(),
        _ => std::ptr::null(),
    }
}

unsafe extern "C" fn s_diag_fisher(
    ctx: *mut c_void,
    candidate: *const TensorHandle,
    n: usize,
    task: usize,
    labels: abi::FisherLabels,
    out: *mut TensorHandle,
) -> Status {
    with_session(ctx, |s| {
        let p = s.candidate(candidate, n)?;
        if task >= s.task_count() {
            return Err(format!(
                "diag_fisher needs one task (0..{}), not {task}",
                s.task_count()
            ));
        }
        let predicted = match labels {
            abi::FISHER_LABELS_TRUE => false,
            abi::FISHER_LABELS_PREDICTED => true,
            k => {
                return Err(format!(
                    "unknown Fisher labels {k}; use FISHER_LABELS_TRUE or FISHER_LABELS_PREDICTED"
                ));
            }
        };
        let f = s
            .model
            .tasks
            .diag_fisher(&p, &s.model.names, task, predicted, s.call().cancel_flag())
            .map_err(engine_err)?;
        s.insert_all(f, out, n)
    })
}

/// What a model-level run left: the merged tensors (or why there are none) and the trajectory.
pub struct ModelRunOutput {
    /// The merged model in the session's order, or the failure (`Cancelled` included).
    pub result: Result<Vec<Tensor>>,
    /// The iterates the method reported (the last one is the partial result of a cancelled run).
    pub trajectory: Trajectory,
}

/// Runs the model-level method of `instance` over `model`. `on_iterate` sees each reported
/// iterate's label and the plugin's last reported progress fraction.
pub fn run_model(
    instance: &Instance<'_>,
    env: CallEnv<'_>,
    model: &SessionModel<'_>,
    on_iterate: &mut dyn FnMut(&str, f64),
) -> ModelRunOutput {
    let failed = |e| ModelRunOutput {
        result: Err(e),
        trajectory: Trajectory::default(),
    };
    if !instance.plugin().is_model_level() {
        return failed(instance.failure(
            "(run_model)",
            abi::STATUS_UNSUPPORTED,
            Some("it is not a model-level method".into()),
        ));
    }
    let mut call = CallCtx::new(env.device, env.cancel, env.log).with_threads(env.threads);
    let host = call.table();
    let mut session = SessionCtx::new(model, &mut call, on_iterate);
    let table = session.table();
    // SAFETY: `call` and `session` outlive the call and are not moved during it.
    let outcome = unsafe { instance.call_run_model(&host, &table, model.names.len()) };
    let trajectory = std::mem::take(&mut session.trajectory);
    drop(session);
    let result = match outcome {
        Ok(out) => out
            .iter()
            .enumerate()
            .map(|(i, h)| {
                call.get(*h).cloned().ok_or_else(|| EngineError::Plugin {
                    plugin: instance.plugin().id().to_owned(),
                    tensor: model.names[i].clone(),
                    message: format!("it returned handle {h}, which is not a live tensor of the run"),
                })
            })
            .collect(),
        Err(status) => Err(instance.failure("(run_model)", status, call.error.take())),
    };
    ModelRunOutput { result, trajectory }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(i: usize) -> Iterate {
        Iterate {
            index: i,
            label: format!("step {i}"),
            metrics: serde_json::Value::Null,
            tensors: Vec::new(),
        }
    }

    /// Thinning keeps the first and the latest iterate and never more than the cap.
    #[test]
    fn trajectory_thinning_is_bounded_and_spans_the_run() {
        let mut t = Trajectory::default();
        for i in 0..1000 {
            t.push(it(i));
            assert!(t.iterates.len() <= MAX_KEPT_ITERATES);
        }
        assert_eq!(t.reported, 1000);
        assert_eq!(t.iterates.first().unwrap().index, 0);
        assert_eq!(t.iterates.last().unwrap().index, 999);
        assert!(t.iterates.windows(2).all(|w| w[0].index < w[1].index));
        assert!(t.iterates.len() > MAX_KEPT_ITERATES / 2);
        // Evenly spaced: every 4th report (0, 4, …, 996) and the latest.
        let kept: Vec<usize> = t.iterates.iter().map(|i| i.index).collect();
        assert_eq!(kept.len(), 251);
        assert!(kept[..250].iter().enumerate().all(|(k, i)| *i == 4 * k), "{kept:?}");
    }

    /// Large iterates are kept fewer, by bytes: 100 MB iterates (f32) keep at most
    /// 2^30 / 10^8 = 10 (still the first and the latest); 600 MB ones the minimum of 8.
    #[test]
    fn trajectory_thinning_is_bounded_in_bytes() {
        for (floats, cap) in [(25_000_000, 10), (150_000_000, MIN_KEPT_ITERATES)] {
            let model = vec![Tensor::zeros(floats, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap()];
            let mut t = Trajectory::default();
            for i in 0..100 {
                t.push(Iterate {
                    tensors: model.clone(),
                    ..it(i)
                });
                assert!(
                    t.iterates.len() <= cap,
                    "{} iterates of {floats} floats",
                    t.iterates.len()
                );
            }
            assert_eq!((t.iterates[0].index, t.iterates.last().unwrap().index), (0, 99));
            assert!(t.iterates.len() > cap / 2);
            // Every 16th report (0, 16, …, 96) and the latest.
            let kept: Vec<usize> = t.iterates.iter().map(|i| i.index).collect();
            assert_eq!(kept, [0, 16, 32, 48, 64, 80, 96, 99]);
        }
    }
}
