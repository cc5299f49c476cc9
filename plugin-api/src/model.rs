//! The safe SDK for model-level methods (ABI 1.1): implement [`ModelMethod`], call
//! [`export_model_plugin!`](crate::export_model_plugin), build the crate as a `cdylib`.
//!
//! A model-level method sees whole models through a [`Session`]: the base and the experts as
//! lists of tensors in the session's order, the tasks' calibration data through `evaluate` and
//! `loss_and_grad`, and fine-tuning. It returns the merged model as one tensor per entry of
//! [`Session::tensors`].

use crate::abi::{self, EvalMetrics, FinetuneOptions, HostApiV1, SessionApiV1, Status, Str, TensorHandle, TensorInfo};
use crate::sdk::{
    CreateContext, Descriptor, Error, Host, MethodKind, ParamSpec, Params, Result, StaticTable, Tensor, TensorMeta,
    check, described_table, guard, instance,
};
use std::ffi::c_void;

crate::choice_enum! {
    /// The calibration objective of a data-driven method: labelled cross-entropy, or prediction
    /// entropy (unlabelled, AdaMerging's). Shared so every method offers the same choice.
    pub enum ObjectiveChoice {
        CrossEntropy = "cross-entropy",
        Entropy = "entropy",
    }
}

impl ObjectiveChoice {
    /// The `abi::OBJECTIVE_*` the session's `loss_and_grad` takes.
    pub fn abi(self) -> abi::Objective {
        match self {
            ObjectiveChoice::CrossEntropy => abi::OBJECTIVE_CROSS_ENTROPY,
            ObjectiveChoice::Entropy => abi::OBJECTIVE_ENTROPY,
        }
    }
}

crate::choice_enum! {
    /// The optimiser of the session's `finetune` (AdamW, SGD with momentum, plain SGD). Shared,
    /// like [`ObjectiveChoice`], so that a method fine-tuning through the session offers the
    /// host's optimisers by their names and maps none of them itself.
    pub enum OptimizerChoice {
        AdamW = "adamw",
        Momentum = "momentum",
        Sgd = "sgd",
    }
}

impl OptimizerChoice {
    /// The `abi::OPTIMIZER_*` of [`FinetuneOptions::optimizer`].
    pub fn abi(self) -> abi::OptimizerKind {
        match self {
            OptimizerChoice::AdamW => abi::OPTIMIZER_ADAMW,
            OptimizerChoice::Momentum => abi::OPTIMIZER_MOMENTUM,
            OptimizerChoice::Sgd => abi::OPTIMIZER_SGD,
        }
    }
}

crate::choice_enum! {
    /// Which y the session's diagonal Fisher differentiates log p(y | x) of: the calibration
    /// label (the empirical Fisher), or the model's own prediction (no labels needed).
    pub enum FisherLabelsChoice {
        True = "true",
        Predicted = "predicted",
    }
}

impl FisherLabelsChoice {
    /// The `abi::FISHER_LABELS_*` of [`Session::diag_fisher`].
    pub fn abi(self) -> abi::FisherLabels {
        match self {
            FisherLabelsChoice::True => abi::FISHER_LABELS_TRUE,
            FisherLabelsChoice::Predicted => abi::FISHER_LABELS_PREDICTED,
        }
    }
}

crate::choice_enum! {
    /// One coefficient (or vertex) per task for the whole model, or one per task and tensor.
    pub enum Granularity {
        Task = "task",
        Layer = "layer",
    }
}

/// The `batch_size` parameter of a method that steps on calibration mini-batches
/// ([`Session::loss_and_grad_minibatch`]): examples per task in each step, 16 by default
/// (AdaMerging's batch), 0 for all of them. `help` says what the steps are in that method.
pub fn minibatch_param(help: &'static str) -> ParamSpec {
    ParamSpec::int("batch_size", 16, help).min(0.0)
}

/// The value of [`minibatch_param`] (0: every calibration example).
pub fn minibatch_size(params: &Params<'_>) -> Result<u64> {
    Ok(params.int("batch_size")?.max(0) as u64)
}

/// Which tasks a session call covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tasks {
    /// Every task: means for `evaluate`, sums for `loss_and_grad`.
    All,
    /// Task t (= expert t).
    One(usize),
}

impl Tasks {
    fn raw(self) -> usize {
        match self {
            Tasks::All => abi::ALL_TASKS,
            Tasks::One(t) => t,
        }
    }
}

/// Safe view of the host's session table, for the duration of `run`.
#[derive(Clone, Copy)]
pub struct Session<'a> {
    api: &'a SessionApiV1,
}

fn handles(ts: &[Tensor]) -> Vec<TensorHandle> {
    ts.iter().map(|t| t.0).collect()
}

impl<'a> Session<'a> {
    /// Wraps a session table.
    ///
    /// # Safety
    /// `api` must be the table the host passed to the current `run_model` call.
    pub unsafe fn from_raw(api: *const SessionApiV1) -> Option<Session<'a>> {
        // SAFETY: guaranteed by the caller; null is rejected.
        unsafe { api.as_ref() }.map(|api| Session { api })
    }

    /// Number of tensors of a candidate model.
    pub fn tensor_count(&self) -> usize {
        // SAFETY: valid table for the call.
        unsafe { (self.api.tensor_count)(self.api.ctx) }
    }

    /// Name, role and shape of every tensor, in the session's order.
    pub fn tensors(&self) -> Result<Vec<TensorMeta<'a>>> {
        (0..self.tensor_count())
            .map(|i| {
                let mut info = TensorInfo {
                    struct_size: std::mem::size_of::<TensorInfo>(),
                    name: Str::EMPTY,
                    role: abi::ROLE_OTHER,
                    index: 0,
                    count: 0,
                    offset: 0,
                    full_numel: 0,
                    full_shape: std::ptr::null(),
                    full_rank: 0,
                };
                // SAFETY: valid table; `info` is writable.
                check(unsafe { (self.api.tensor_info)(self.api.ctx, i, &mut info) })?;
                // SAFETY: the host keeps the strings and shapes alive until `run_model` returns.
                unsafe { TensorMeta::from_raw(&info) }
            })
            .collect()
    }

    /// Number of experts (= tasks).
    pub fn expert_count(&self) -> usize {
        // SAFETY: valid table for the call.
        unsafe { (self.api.expert_count)(self.api.ctx) }
    }

    /// Name of task `task`.
    pub fn task_name(&self, task: usize) -> Result<&'a str> {
        let mut s = Str::EMPTY;
        // SAFETY: valid table; `s` is writable.
        check(unsafe { (self.api.task_name)(self.api.ctx, task, &mut s) })?;
        // SAFETY: the host keeps the name alive until `run_model` returns.
        unsafe { s.as_str() }.map_err(|_| Error::Message("task name is not UTF-8".into()))
    }

    /// One handle per session tensor from `get(index, &mut handle)`.
    fn model_tensors(&self, get: impl Fn(usize, &mut TensorHandle) -> Status) -> Result<Vec<Tensor>> {
        (0..self.tensor_count())
            .map(|i| {
                let mut h = 0;
                check(get(i, &mut h))?;
                Ok(Tensor(h))
            })
            .collect()
    }

    /// The base model's tensors.
    pub fn base(&self) -> Result<Vec<Tensor>> {
        // SAFETY: valid table; `h` is writable.
        self.model_tensors(|i, h| unsafe { (self.api.base_tensor)(self.api.ctx, i, h) })
    }

    /// Expert `expert`'s tensors.
    pub fn expert(&self, expert: usize) -> Result<Vec<Tensor>> {
        // SAFETY: valid table; `h` is writable.
        self.model_tensors(|i, h| unsafe { (self.api.expert_tensor)(self.api.ctx, expert, i, h) })
    }

    /// Loss and accuracy of `candidate` on the calibration examples of `tasks`.
    pub fn evaluate(&self, candidate: &[Tensor], tasks: Tasks) -> Result<EvalMetrics> {
        let c = handles(candidate);
        let mut m = EvalMetrics {
            struct_size: std::mem::size_of::<EvalMetrics>(),
            ..EvalMetrics::default()
        };
        // SAFETY: valid table; `c` holds `c.len()` handles; `m` is writable.
        check(unsafe { (self.api.evaluate)(self.api.ctx, c.as_ptr(), c.len(), tasks.raw(), &mut m) })?;
        Ok(m)
    }

    /// The objective (`abi::OBJECTIVE_*`) of `candidate` on the calibration data of `tasks`.
    pub fn loss(&self, candidate: &[Tensor], tasks: Tasks, objective: abi::Objective) -> Result<f64> {
        self.objective(candidate, tasks, objective, None, None)
    }

    /// The objective and its gradient with respect to every candidate tensor.
    pub fn loss_and_grad(
        &self,
        candidate: &[Tensor],
        tasks: Tasks,
        objective: abi::Objective,
    ) -> Result<(f64, Vec<Tensor>)> {
        self.loss_and_grad_minibatch(candidate, tasks, objective, 0, 0, 0)
    }

    /// The objective on mini-batch `step` of `size` examples per task (seeded shuffles,
    /// reshuffled every epoch; see [`abi::Minibatch`]) and its gradient with respect to every
    /// candidate tensor: a stochastic gradient whose cost is that of the batch, not of the whole
    /// calibration set. `size` 0 means every example ([`Self::loss_and_grad`]). Needs the
    /// host's [`abi::SESSION_EXT_MINIBATCH_V1`] when `size` > 0.
    pub fn loss_and_grad_minibatch(
        &self,
        candidate: &[Tensor],
        tasks: Tasks,
        objective: abi::Objective,
        size: u64,
        seed: u64,
        step: u64,
    ) -> Result<(f64, Vec<Tensor>)> {
        let batch = (size > 0).then_some(abi::Minibatch {
            struct_size: std::mem::size_of::<abi::Minibatch>(),
            size,
            seed,
            step,
        });
        let mut grads = vec![0 as TensorHandle; candidate.len()];
        let loss = self.objective(candidate, tasks, objective, batch.as_ref(), Some(&mut grads))?;
        Ok((loss, grads.into_iter().map(Tensor).collect()))
    }

    /// The host's session extension `id`, whose table (of type `T`, starting with its
    /// `struct_size`) must be at least as long as this SDK's.
    fn extension<T>(&self, id: &str) -> Result<&'a T> {
        // SAFETY: valid table; the id is borrowed for the call.
        let ext = unsafe { (self.api.get_extension)(self.api.ctx, Str::new(id)) };
        // SAFETY: the host returns null or its static table for this id, which begins with
        // its size.
        let size = unsafe { ext.cast::<usize>().as_ref() }
            .copied()
            .ok_or_else(|| Error::Message(format!("this host has no '{id}' session extension: update mergescope")))?;
        if size < std::mem::size_of::<T>() {
            return Err(Error::Message(format!(
                "the host's '{id}' extension table is too short ({size} bytes): update mergescope"
            )));
        }
        // SAFETY: non-null, static, and long enough for `T`.
        Ok(unsafe { &*ext.cast::<T>() })
    }

    /// `loss_and_grad` of the session table, or of the mini-batch extension when `batch` is
    /// given: the value, and the gradient into `grads` (one handle per candidate tensor) when
    /// given.
    fn objective(
        &self,
        candidate: &[Tensor],
        tasks: Tasks,
        objective: abi::Objective,
        batch: Option<&abi::Minibatch>,
        grads: Option<&mut [TensorHandle]>,
    ) -> Result<f64> {
        let c = handles(candidate);
        let mut loss = 0.0;
        let grads = grads.map_or(std::ptr::null_mut(), <[TensorHandle]>::as_mut_ptr);
        let status = match batch {
            // SAFETY: valid table; `grads` is null (value only) or has room for `c.len()` handles.
            None => unsafe {
                (self.api.loss_and_grad)(
                    self.api.ctx,
                    c.as_ptr(),
                    c.len(),
                    tasks.raw(),
                    objective,
                    &mut loss,
                    grads,
                )
            },
            Some(b) => {
                let ext = self.extension::<abi::SessionMinibatchV1>(abi::SESSION_EXT_MINIBATCH_V1)?;
                // SAFETY: valid extension of this session; `grads` as above.
                unsafe {
                    (ext.loss_and_grad)(
                        self.api.ctx,
                        c.as_ptr(),
                        c.len(),
                        tasks.raw(),
                        objective,
                        b,
                        &mut loss,
                        grads,
                    )
                }
            }
        };
        check(status)?;
        Ok(loss)
    }

    /// `candidate` fine-tuned on the train split of `task`.
    pub fn finetune(&self, candidate: &[Tensor], task: usize, options: &FinetuneOptions) -> Result<Vec<Tensor>> {
        let c = handles(candidate);
        let mut out = vec![0 as TensorHandle; c.len()];
        let options = FinetuneOptions {
            struct_size: std::mem::size_of::<FinetuneOptions>(),
            ..*options
        };
        // SAFETY: valid table; `out` has room for `c.len()` handles.
        check(unsafe { (self.api.finetune)(self.api.ctx, c.as_ptr(), c.len(), task, &options, out.as_mut_ptr()) })?;
        Ok(out.into_iter().map(Tensor).collect())
    }

    /// Records `candidate` as the next iterate of the trajectory; `metrics_json` is a JSON
    /// object (or empty).
    pub fn report_iterate(&self, candidate: &[Tensor], label: &str, metrics_json: &str) -> Result<()> {
        let c = handles(candidate);
        // SAFETY: valid table; borrowed strings for the call.
        check(unsafe {
            (self.api.report_iterate)(
                self.api.ctx,
                c.as_ptr(),
                c.len(),
                Str::new(label),
                Str::new(metrics_json),
            )
        })
    }

    /// The diagonal Fisher information of `candidate` on the calibration data of `task`: per
    /// tensor, the mean over examples of the squared gradient of log p(y | x), with y the true
    /// label (`abi::FISHER_LABELS_TRUE`) or the candidate's prediction
    /// (`abi::FISHER_LABELS_PREDICTED`). Needs the host's [`abi::SESSION_EXT_FISHER_V1`].
    pub fn diag_fisher(&self, candidate: &[Tensor], task: usize, labels: abi::FisherLabels) -> Result<Vec<Tensor>> {
        let ext = self.extension::<abi::SessionFisherV1>(abi::SESSION_EXT_FISHER_V1)?;
        let c = handles(candidate);
        let mut out = vec![0 as TensorHandle; c.len()];
        // SAFETY: valid extension of this session; `out` has room for `c.len()` handles.
        check(unsafe { (ext.diag_fisher)(self.api.ctx, c.as_ptr(), c.len(), task, labels, out.as_mut_ptr()) })?;
        Ok(out.into_iter().map(Tensor).collect())
    }

    /// A mark of the handles made so far.
    pub fn mark(&self) -> u64 {
        // SAFETY: valid table.
        unsafe { (self.api.mark)(self.api.ctx) }
    }

    /// Releases every handle made after `mark` except those in `keep`.
    pub fn release_since(&self, mark: u64, keep: &[Tensor]) -> Result<()> {
        let k = handles(keep);
        // SAFETY: valid table; `k` holds `k.len()` handles.
        check(unsafe { (self.api.release_since)(self.api.ctx, mark, k.as_ptr(), k.len()) })
    }
}

/// Fine-tuning settings with the session's defaults: `steps` of SGD at `learning_rate` on
/// minibatches of `batch_size`.
pub fn finetune_options(steps: u64, learning_rate: f64, batch_size: u64, seed: u64) -> FinetuneOptions {
    FinetuneOptions {
        struct_size: std::mem::size_of::<FinetuneOptions>(),
        steps,
        learning_rate,
        batch_size,
        optimizer: abi::OPTIMIZER_SGD,
        weight_decay: 0.0,
        seed,
    }
}

/// A model-level merge method. One instance serves one merge.
pub trait ModelMethod: Sized + 'static {
    /// Describes the method (called once, when the host loads the library).
    fn descriptor() -> Descriptor;

    /// Makes an instance from validated parameters.
    fn create(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self>;

    /// Runs the merge and returns the merged model, one tensor per entry of
    /// [`Session::tensors`]. Report iterates with [`Session::report_iterate`] so the run leaves
    /// a trajectory (and a partial result when cancelled); check
    /// [`Host::check_cancelled`] between iterations.
    fn run(&mut self, host: &Host<'_>, session: &Session<'_>) -> Result<Vec<Tensor>>;
}

#[doc(hidden)]
pub fn build_model_table<M: ModelMethod>(version: &'static str) -> StaticTable {
    let mut table = described_table::<M, ModelLevelKind>(&M::descriptor(), version);
    table.api.run_model = Some(run_model_impl::<M>);
    table
}

/// The kind of [`ModelMethod`]s.
struct ModelLevelKind;

impl<M: ModelMethod> MethodKind<M> for ModelLevelKind {
    const KIND: abi::PluginKind = abi::KIND_MODEL_LEVEL;

    fn make(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<M> {
        M::create(host, params, ctx)
    }
}

/// `merge_tensor` of a model-level table: never valid.
unsafe extern "C" fn run_model_impl<M: ModelMethod>(
    inst: *mut c_void,
    host: *const HostApiV1,
    session: *const SessionApiV1,
    out: *mut TensorHandle,
    n_out: usize,
) -> Status {
    // SAFETY: the host passes its tables for this call.
    let (Some(h), Some(s)) = (unsafe { Host::from_raw(host) }, unsafe { Session::from_raw(session) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    if out.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    guard(Some(h), || {
        // SAFETY: see `instance`.
        let m = unsafe { instance::<M>(inst) }?;
        let merged = m.run(&h, &s)?;
        if merged.len() != n_out {
            return Err(Error::Message(format!(
                "the method returned {} tensors for a model of {n_out}",
                merged.len()
            )));
        }
        // SAFETY: the host gives room for `n_out` handles.
        let dst = unsafe { std::slice::from_raw_parts_mut(out, n_out) };
        for (d, t) in dst.iter_mut().zip(&merged) {
            *d = t.0;
        }
        Ok(())
    })
}

/// Exports a [`ModelMethod`] as a mergescope plugin (ABI 1.1): the static header and the v1
/// entry. Use once per `cdylib` crate: `mergescope_plugin_api::export_model_plugin!(MyMethod);`
#[macro_export]
macro_rules! export_model_plugin {
    ($method:ty) => {
        $crate::__export_table!($crate::model::build_model_table::<$method>);
    };
}

/// Tensor by tensor, `Σ_m weight(p, m) · models[m][p]` for models given as tensor lists in the
/// session's order: how a method builds candidates from models and task vectors (per-tensor
/// weights give layer-wise coefficients).
pub fn combine(host: &Host<'_>, models: &[&[Tensor]], weight: impl Fn(usize, usize) -> f64) -> Result<Vec<Tensor>> {
    let n = models.first().map_or(0, |m| m.len());
    if let Some(bad) = models.iter().find(|m| m.len() != n) {
        return Err(Error::Message(format!(
            "combine: models of {} and {n} tensors",
            bad.len()
        )));
    }
    (0..n)
        .map(|p| {
            let ts: Vec<Tensor> = models.iter().map(|m| m[p]).collect();
            let w: Vec<f64> = (0..models.len()).map(|m| weight(p, m)).collect();
            host.weighted_sum(&ts, Some(&w))
        })
        .collect()
}

/// Tensor by tensor, `⟨a[p], b[p]⟩` (f64): per-layer inner products of a gradient with a
/// direction, whose sum is the directional derivative.
pub fn dots(host: &Host<'_>, a: &[Tensor], b: &[Tensor]) -> Result<Vec<f64>> {
    if a.len() != b.len() {
        return Err(Error::Message(format!("dots: {} and {} tensors", a.len(), b.len())));
    }
    a.iter().zip(b).map(|(x, y)| host.dot(*x, *y)).collect()
}

/// `v` as a JSON number, or `null` when it is not finite (JSON has no NaN or ∞): for the
/// metrics of [`Session::report_iterate`].
pub fn json_number(v: f64) -> String {
    if v.is_finite() { format!("{v}") } else { "null".into() }
}

/// Adam (Kingma & Ba) on a vector of coefficients, with bias correction: what data-driven
/// methods use to learn their merging coefficients from host gradients.
#[derive(Clone, Debug)]
pub struct Adam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    m: Vec<f64>,
    v: Vec<f64>,
    t: i32,
}

impl Adam {
    /// Adam with learning rate `lr`, β = (0.9, 0.999), ε = 1e-8, for `n` coefficients.
    pub fn new(n: usize, lr: f64) -> Adam {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            m: vec![0.0; n],
            v: vec![0.0; n],
            t: 0,
        }
    }

    /// One step: `x ← x − lr·m̂/(√v̂ + ε)` for the gradient `g`.
    pub fn step(&mut self, x: &mut [f64], g: &[f64]) {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t);
        let c2 = 1.0 - b2.powi(self.t);
        for i in 0..x.len().min(g.len()).min(self.m.len()) {
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g[i];
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g[i] * g[i];
            x[i] -= self.lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + self.eps);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Adam;

    /// The first Adam step moves every coordinate by exactly lr against its gradient's sign
    /// (m̂ = g, v̂ = g²), and Adam minimises a quadratic.
    #[test]
    fn adam_first_step_and_convergence() {
        let mut x = vec![1.0, -2.0, 0.5];
        let mut a = Adam::new(3, 0.1);
        a.step(&mut x, &[3.0, -0.01, 0.0]);
        assert!(
            (x[0] - 0.9).abs() < 1e-9 && (x[1] + 1.9).abs() < 1e-6 && (x[2] - 0.5).abs() < 1e-12,
            "{x:?}"
        );
        let target = [0.3, -0.7, 2.0];
        for _ in 0..3000 {
            let g: Vec<f64> = x.iter().zip(&target).map(|(a, b)| 2.0 * (a - b)).collect();
            a.step(&mut x, &g);
        }
        for (a, b) in x.iter().zip(&target) {
            assert!((a - b).abs() < 1e-3, "{x:?}");
        }
    }
}
