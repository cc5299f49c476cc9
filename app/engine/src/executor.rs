//! The streaming executor: runs a per-tensor plugin over a model tensor by tensor (or chunk by
//! chunk for elementwise methods), on several worker threads, inside a memory budget. Inputs
//! come from a [`Source`] and results go to a [`Sink`], so the same loop serves file merges and
//! in-memory merges (tests, GUI previews).

use crate::error::{EngineError, Result};
use crate::plugin::call::{to_f32_vec, with_cpu_f32};
use crate::plugin::instance::{CallEnv, Instance, TensorCall};
use crate::role::role_of;
use candle_core::{Device, Tensor};
use mergescope_plugin_api::abi;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// How a merge runs.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Device the tensor operations run on.
    pub device: Device,
    /// Largest chunk (elements) handed to an elementwise method at once.
    pub chunk_elems: usize,
    /// Worker threads (0: one per available core).
    pub threads: usize,
    /// Memory the workers' in-flight tensors may use, in bytes (a tensor larger than the
    /// budget still runs, alone).
    pub memory_budget_bytes: u64,
    /// Runs every statistics pass over the whole model before the merge pass even where the
    /// plugin lets the host take the tensors one at a time (`CAP_TENSOR_STATISTICS`): the same
    /// bits, more reading; for comparing the two.
    pub pass_by_pass: bool,
    /// The most bytes of one tensor's inputs a worker keeps at hand at a time ([`Source::hold`]):
    /// a larger tensor is held in segments of whole chunks, one after another.
    pub hold_bytes: u64,
}

/// The default [`ExecOptions::hold_bytes`]: 128 MiB per worker, so a Llama MLP matrix of four
/// bf16 inputs is held whole and an embedding in a few segments.
pub const DEFAULT_HOLD_BYTES: u64 = 128 << 20;

/// The default chunk: 2¹⁸ elements, 1 MiB per input in f32, so that a chunk's inputs, its
/// copies and its result stay in the caches while it is decoded, merged and encoded (chunks of
/// 2²² elements were 16 MiB per input, and each step went to memory and back; 2¹⁶ adds more
/// per-chunk overhead than it saves).
pub const DEFAULT_CHUNK_ELEMS: usize = 1 << 18;

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            device: Device::Cpu,
            chunk_elems: DEFAULT_CHUNK_ELEMS,
            threads: 0,
            memory_budget_bytes: 2 << 30,
            pass_by_pass: false,
            hold_bytes: DEFAULT_HOLD_BYTES,
        }
    }
}

/// Phase of a merge, for progress reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Statistics pass `n` (methods with model-wide statistics).
    Statistics(u32),
    /// The merge pass.
    Merge,
}

/// A progress report.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Current phase.
    pub phase: Phase,
    /// Elements done in this phase.
    pub done: u64,
    /// Elements in this phase.
    pub total: u64,
    /// Tensor just finished.
    pub tensor: String,
}

/// Callbacks of a running merge (called from worker threads).
#[derive(Clone, Copy)]
pub struct Observer<'a> {
    /// Progress reports.
    pub progress: &'a (dyn Fn(&Progress) + Sync),
    /// Log lines of the plugin: (level, message).
    pub log: &'a (dyn Fn(abi::LogLevel, &str) + Sync),
}

fn ignore_progress(_: &Progress) {}
fn ignore_log(_: abi::LogLevel, _: &str) {}

impl Observer<'static> {
    /// An observer that ignores everything.
    pub fn silent() -> Observer<'static> {
        Observer {
            progress: &ignore_progress,
            log: &ignore_log,
        }
    }
}

/// One tensor to merge.
#[derive(Clone, Debug)]
pub struct PlanItem {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
}

impl PlanItem {
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Where input tensors come from. Model 0 is the base when there is one, then the experts.
pub trait Source: Sync {
    /// Reads elements `[from, from + len)` of tensor `name` of input `model` as f32.
    fn read(&self, model: usize, name: &str, from: usize, len: usize) -> Result<Vec<f32>>;
    /// [`Source::read`], and whether the source found every value finite while reading it
    /// (`false`: not checked, so the executor checks); by default unchecked.
    fn read_checked(&self, model: usize, name: &str, from: usize, len: usize) -> Result<(Vec<f32>, bool)> {
        Ok((self.read(model, name, from, len)?, false))
    }
    /// How input `model` is named in messages (its file, for a file source).
    fn describe(&self, model: usize) -> String {
        format!("input {model}")
    }
    /// Runs `work`, which reads elements `[from, from + len)` of tensor `name` of every input
    /// on this thread (chunk after chunk, or several times over), with that range kept at hand
    /// where the source can (a file source keeps it mapped, so later reads neither map nor
    /// fault again); by default just runs it.
    fn hold(&self, name: &str, from: usize, len: usize, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let _ = (name, from, len);
        work()
    }
    /// The bytes per element of tensor `name`, over all inputs, that [`Source::hold`] keeps at
    /// hand; `None` where it keeps none of it (then a worker takes the tensor's chunks one by
    /// one, as they come, rather than a held run of them).
    fn held_bytes_per_elem(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }
}

/// Where merged values go.
pub trait Sink: Sync {
    /// Stores elements `[from, from + values.len())` of tensor `name`, and says whether it found
    /// every value finite while storing them (`false`: not checked, or not finite, so the
    /// executor checks, and fails the merge on NaN or Inf).
    fn write(&self, name: &str, from: usize, values: &[f32]) -> Result<bool>;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A counting semaphore over bytes.
struct ByteBudget {
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl ByteBudget {
    fn acquire(&self, n: u64) {
        let mut used = lock(&self.used);
        while *used > 0 && *used + n > self.limit {
            used = self.freed.wait(used).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *used += n;
    }

    fn release(&self, n: u64) {
        let mut used = lock(&self.used);
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }
}

struct Unit {
    item: usize,
    from: usize,
    len: usize,
}

impl Unit {
    /// The shape handed to the plugin: the tensor's own when whole, flat `[len]` for a chunk.
    fn shape(&self, item: &PlanItem) -> Vec<usize> {
        if self.len == item.numel() {
            item.shape.clone()
        } else {
            vec![self.len]
        }
    }
}

/// Everything one merge run needs.
pub struct Run<'a> {
    /// The plugin instance.
    pub instance: &'a Instance<'a>,
    /// Plugin id, for messages.
    pub plugin_id: &'a str,
    /// Tensors to merge, in order.
    pub items: &'a [PlanItem],
    /// Inputs.
    pub source: &'a dyn Source,
    /// Outputs.
    pub sink: &'a dyn Sink,
    /// Whether input 0 is a base model.
    pub has_base: bool,
    /// Number of experts.
    pub n_experts: usize,
    /// Options.
    pub opts: &'a ExecOptions,
    /// Callbacks.
    pub observer: Observer<'a>,
    /// Cancel flag.
    pub cancel: &'a AtomicBool,
}

impl Run<'_> {
    fn env(&self) -> CallEnv<'_> {
        CallEnv {
            device: &self.opts.device,
            cancel: self.cancel,
            log: self.observer.log,
            threads: self.opts.threads,
        }
    }

    fn load(&self, item: &PlanItem, from: usize, len: usize, shape: &[usize]) -> Result<(Option<Tensor>, Vec<Tensor>)> {
        let n_inputs = self.n_experts + usize::from(self.has_base);
        let mut tensors = Vec::with_capacity(n_inputs);
        for m in 0..n_inputs {
            let (v, finite) = self.source.read_checked(m, &item.name, from, len)?;
            // Checked here (or by the source as it decoded), once for every method, so the
            // message names the input rather than blaming whichever method first trips over the
            // NaN.
            if !finite && let Some((i, x)) = crate::finite::first_non_finite(&v) {
                return Err(crate::finite::non_finite_input(
                    &self.source.describe(m),
                    &item.name,
                    from + i,
                    x,
                ));
            }
            tensors.push(Tensor::from_vec(v, shape, &self.opts.device)?);
        }
        let base = if self.has_base { Some(tensors.remove(0)) } else { None };
        Ok((base, tensors))
    }

    fn call<'c>(&self, index: usize, item: &'c PlanItem, from: usize) -> TensorCall<'c> {
        TensorCall {
            name: &item.name,
            role: role_of(&item.name, &item.shape),
            index,
            count: self.items.len(),
            offset: from as u64,
            full_shape: &item.shape,
        }
    }

    /// Runs the statistics passes, then the merge pass; or, for statistics per tensor
    /// ([`Instance::tensor_statistics`]), both for one tensor after another.
    pub fn execute(&self) -> Result<()> {
        if self.instance.tensor_statistics() && !self.opts.pass_by_pass {
            return self.tensor_by_tensor();
        }
        for pass in 0..self.instance.passes {
            self.statistics_pass(pass)?;
        }
        self.merge_pass()
    }

    /// Statistics and merge tensor by tensor: a worker takes a whole tensor and, with its inputs
    /// held by the source, hands its chunks in order to every statistics pass, calls
    /// `finish_tensor` after each, then merges the chunks; so each tensor's inputs are read
    /// while they are still mapped, not once per pass over the whole model. The largest tensors
    /// go first, so that the workers end together. `finish_pass` follows for every pass.
    fn tensor_by_tensor(&self) -> Result<()> {
        let mut tensors = self.units(false);
        tensors.sort_by_key(|u| std::cmp::Reverse(u.len));
        self.run_units(&tensors, Phase::Merge, true, self.opts.chunk_elems, |whole, advance| {
            let item = &self.items[whole.item];
            let finish = |pass| {
                self.instance
                    .finish_tensor(self.env(), pass, &self.call(whole.item, item, 0))
            };
            let prepare =
                |pass, segment: &Unit| self.in_order(&self.chunks_in(segment), None, |u| self.prepare_unit(pass, u));
            let merge =
                |segment: &Unit| self.in_order(&self.chunks_in(segment), Some(advance), |u| self.run_unit(u, None));
            match self.segments_of(whole.item).as_deref() {
                // Held whole (or not at all): every pass and the merge inside one hold.
                None | Some([_]) => self.hold(whole, &mut || {
                    for pass in 0..self.instance.passes {
                        prepare(pass, whole)?;
                        finish(pass)?;
                    }
                    merge(whole)
                }),
                // Too large to hold whole: each pass, and then the merge, holds one segment
                // after another.
                Some(segments) => {
                    for pass in 0..self.instance.passes {
                        for segment in segments {
                            self.hold(segment, &mut || prepare(pass, segment))?;
                        }
                        finish(pass)?;
                    }
                    segments
                        .iter()
                        .try_for_each(|segment| self.hold(segment, &mut || merge(segment)))
                }
            }
        })?;
        for pass in 0..self.instance.passes {
            self.instance.finish_pass(self.env(), pass)?;
        }
        Ok(())
    }

    /// One statistics pass: every tensor to `prepare_tensor`, whole (or in chunks when the
    /// plugin accepts chunked statistics); in order on one thread unless the plugin is
    /// thread-safe, then in parallel like the merge pass.
    /// With `CAP_ORDERED_STATISTICS` (and chunked statistics) a worker takes a whole tensor and
    /// hands its chunks over in order, so a running sum over a tensor sees its elements in index
    /// order; different tensors still run in parallel.
    fn statistics_pass(&self, pass: u32) -> Result<()> {
        let caps = self.instance.capabilities;
        let chunked = caps & abi::CAP_CHUNKED_STATISTICS != 0;
        let ordered = chunked && caps & abi::CAP_ORDERED_STATISTICS != 0;
        let parallel = caps & abi::CAP_THREAD_SAFE != 0;
        let prepare = |unit: &Unit| self.prepare_unit(pass, unit);
        if ordered {
            let tensors = self.units(false);
            self.run_units(
                &tensors,
                Phase::Statistics(pass),
                parallel,
                self.opts.chunk_elems,
                |whole, advance| self.in_order(&self.chunks_of(whole.item, true), Some(advance), prepare),
            )?;
        } else {
            let units = self.units(chunked);
            self.run_units(&units, Phase::Statistics(pass), parallel, usize::MAX, |unit, _| {
                prepare(unit)
            })?;
        }
        self.instance.finish_pass(self.env(), pass)
    }

    /// Statistics pass `pass` over one unit.
    fn prepare_unit(&self, pass: u32, unit: &Unit) -> Result<()> {
        let item = &self.items[unit.item];
        let (base, experts) = self.load(item, unit.from, unit.len, &unit.shape(item))?;
        self.instance
            .prepare_tensor(self.env(), pass, &self.call(unit.item, item, unit.from), base, experts)
    }

    /// Work units: whole tensors, or chunks of at most `chunk_elems` when `chunked`.
    fn units(&self, chunked: bool) -> Vec<Unit> {
        (0..self.items.len()).flat_map(|i| self.chunks_of(i, chunked)).collect()
    }

    /// The units of tensor `i` in index order: chunks of at most `chunk_elems` when `chunked`,
    /// else the whole tensor.
    fn chunks_of(&self, i: usize, chunked: bool) -> Vec<Unit> {
        let n = self.items[i].numel();
        let whole = Unit {
            item: i,
            from: 0,
            len: n,
        };
        if chunked { self.chunks_in(&whole) } else { vec![whole] }
    }

    /// The chunks of `unit` in index order: pieces of at most `chunk_elems`.
    fn chunks_in(&self, unit: &Unit) -> Vec<Unit> {
        pieces(unit, self.opts.chunk_elems)
    }

    /// Tensor `i` in the segments a worker holds one at a time ([`Source::hold`]): runs of
    /// whole chunks with at most `hold_bytes` of input bytes each (at least one chunk), so that
    /// a segment's chunks are the tensor's own chunks; `None` where the source holds none of it.
    fn segments_of(&self, i: usize) -> Option<Vec<Unit>> {
        let item = &self.items[i];
        let per_elem = self.source.held_bytes_per_elem(&item.name)?.max(1);
        let chunk = self.opts.chunk_elems.max(1);
        let fit = usize::try_from(self.opts.hold_bytes / per_elem).unwrap_or(usize::MAX);
        let whole = Unit {
            item: i,
            from: 0,
            len: item.numel(),
        };
        Some(pieces(&whole, (fit / chunk).max(1).saturating_mul(chunk)))
    }

    /// Runs `work` with `unit`'s range of its tensor held by the source.
    fn hold(&self, unit: &Unit, work: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.source.hold(&self.items[unit.item].name, unit.from, unit.len, work)
    }

    fn run_unit(&self, unit: &Unit, instance_lock: Option<&Mutex<()>>) -> Result<()> {
        let item = &self.items[unit.item];
        let shape = unit.shape(item);
        let (base, experts) = self.load(item, unit.from, unit.len, &shape)?;
        let call = self.call(unit.item, item, unit.from);
        let result = {
            let _guard = instance_lock.map(lock);
            self.instance.merge_tensor(self.env(), &call, base, experts)?
        };
        let plugin_err = |message: String| EngineError::Plugin {
            plugin: self.plugin_id.to_owned(),
            tensor: item.name.clone(),
            message,
        };
        if result.dims() != shape.as_slice() {
            return Err(plugin_err(format!(
                "it returned a tensor of shape {:?} where shape {shape:?} was expected",
                result.dims()
            )));
        }
        // The sink checks the values as it encodes them (one pass over them instead of two);
        // where it did not, or found one that is not finite, the merge fails naming the
        // plugin, before its output gets its final name.
        let store = |values: &[f32]| -> Result<()> {
            let stored = self.sink.write(&item.name, unit.from, values);
            if matches!(stored, Ok(true)) {
                return Ok(());
            }
            if let Some((i, v)) = crate::finite::first_non_finite(values) {
                return Err(crate::finite::non_finite_output(
                    self.plugin_id,
                    &item.name,
                    unit.from + i,
                    v,
                ));
            }
            stored.map(|_| ())
        };
        match with_cpu_f32(&result, store) {
            Some(r) => r?,
            None => store(&to_f32_vec(&result)?)?,
        }
        Ok(())
    }

    /// The merge pass. An elementwise merge goes in chunks; a tensor the source can hold
    /// ([`Source::can_hold`]) goes to one worker whole, which merges its chunks in order while
    /// the source holds its inputs (mapped once per tensor, not once per chunk), the largest
    /// tensors first; the other tensors' chunks spread over the workers.
    fn merge_pass(&self) -> Result<()> {
        let lock = (self.instance.capabilities & abi::CAP_THREAD_SAFE == 0).then(|| Mutex::new(()));
        if self.instance.capabilities & abi::CAP_ELEMENTWISE == 0 {
            let units = self.units(false);
            return self.run_units(&units, Phase::Merge, true, usize::MAX, |unit, _| {
                self.run_unit(unit, lock.as_ref())
            });
        }
        let mut units: Vec<Unit> = (0..self.items.len())
            .flat_map(|i| {
                let held = self.items[i].numel() > self.opts.chunk_elems;
                held.then(|| self.segments_of(i))
                    .flatten()
                    .unwrap_or_else(|| self.chunks_of(i, true))
            })
            .collect();
        units.sort_by_key(|u| std::cmp::Reverse(u.len));
        self.run_units(&units, Phase::Merge, true, self.opts.chunk_elems, |unit, advance| {
            if unit.len <= self.opts.chunk_elems {
                return self.run_unit(unit, lock.as_ref());
            }
            self.hold(unit, &mut || {
                self.in_order(&self.chunks_in(unit), Some(advance), |chunk| {
                    self.run_unit(chunk, lock.as_ref())
                })
            })
        })
    }

    /// Runs `f` on `chunks` in order, checking for a cancel before each, and reports each
    /// chunk's elements as done through `advance` when given.
    fn in_order(
        &self,
        chunks: &[Unit],
        advance: Option<&dyn Fn(u64)>,
        mut f: impl FnMut(&Unit) -> Result<()>,
    ) -> Result<()> {
        for chunk in chunks {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(EngineError::Cancelled);
            }
            f(chunk)?;
            if let Some(advance) = advance {
                advance(chunk.len as u64);
            }
        }
        Ok(())
    }

    /// Runs `work` on every unit on worker threads (one when `parallel` is false), each unit
    /// inside the memory budget (for at most `held` elements of it at a time: a unit that works
    /// through a tensor chunk by chunk holds one chunk); stops at the first error or on cancel;
    /// reports progress: each unit's elements when it is done, or as it goes where `work` calls
    /// the `advance` it is given with the elements it has finished.
    fn run_units(
        &self,
        units: &[Unit],
        phase: Phase,
        parallel: bool,
        held: usize,
        work: impl Fn(&Unit, &dyn Fn(u64)) -> Result<()> + Sync,
    ) -> Result<()> {
        let total: u64 = units.iter().map(|u| u.len as u64).sum();
        let threads = match (parallel, self.opts.threads) {
            (false, _) => 1,
            (true, 0) => crate::sys::available_cores(),
            (true, t) => t,
        }
        .clamp(1, units.len().max(1));
        let n_inputs = (self.n_experts + usize::from(self.has_base)) as u64;
        let budget = ByteBudget {
            limit: self.opts.memory_budget_bytes,
            used: Mutex::new(0),
            freed: Condvar::new(),
        };
        let next = AtomicUsize::new(0);
        let done = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<EngineError>> = Mutex::new(None);
        let fail = |e: EngineError| {
            failed.store(true, Ordering::Relaxed);
            lock(&first_error).get_or_insert(e);
        };
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while !failed.load(Ordering::Relaxed) {
                        if self.cancel.load(Ordering::Relaxed) {
                            fail(EngineError::Cancelled);
                            return;
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(unit) = units.get(i) else { return };
                        // Inputs, the output, and about two temporaries per input, in f32.
                        let cost = unit.len.min(held) as u64 * 4 * (2 * n_inputs + 2);
                        let advanced = std::cell::Cell::new(0u64);
                        let advance = |n: u64| {
                            advanced.set(advanced.get() + n);
                            let d = done.fetch_add(n, Ordering::Relaxed) + n;
                            (self.observer.progress)(&Progress {
                                phase,
                                done: d,
                                total,
                                tensor: self.items[unit.item].name.clone(),
                            });
                        };
                        budget.acquire(cost);
                        let r = work(unit, &advance);
                        budget.release(cost);
                        if let Err(e) = r {
                            fail(e);
                            return;
                        }
                        // What `work` did not report (all of it, usually; a unit of no elements
                        // still reports once).
                        let reported = advanced.get();
                        let rest = (unit.len as u64).saturating_sub(reported);
                        if rest > 0 || reported == 0 {
                            advance(rest);
                        }
                    }
                });
            }
        });
        match first_error
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `unit`'s range in index order, in pieces of at most `size` elements (one empty piece for an
/// empty range).
fn pieces(unit: &Unit, size: usize) -> Vec<Unit> {
    let size = size.max(1);
    let end = unit.from + unit.len;
    let mut out = vec![];
    let mut from = unit.from;
    loop {
        let len = size.min(end - from);
        out.push(Unit {
            item: unit.item,
            from,
            len,
        });
        from += len;
        if from >= end {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_lets_one_oversized_request_through() {
        let b = ByteBudget {
            limit: 10,
            used: Mutex::new(0),
            freed: Condvar::new(),
        };
        b.acquire(100);
        b.release(100);
        b.acquire(4);
        b.acquire(6);
        assert_eq!(*lock(&b.used), 10);
    }
}
