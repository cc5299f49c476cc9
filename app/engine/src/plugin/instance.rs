//! One instance of a plugin for one merge, and the calls into it. Every call gets a fresh
//! [`CallCtx`]; statuses are turned into [`EngineError`]s that name the plugin and tensor.

use super::call::{CallCtx, LogSink};
use super::loader::Plugin;
use super::schema::{ParamValue, ResolvedParams};
use crate::error::{EngineError, Result};
use candle_core::{Device, Tensor};
use mergescope_plugin_api::abi::{self, HostApiV1, Status, Str, TensorHandle, TensorInfo};
use std::ffi::c_void;
use std::sync::atomic::AtomicBool;

/// What every call needs from the job: device, cancel flag, log sink.
#[derive(Clone, Copy)]
pub struct CallEnv<'a> {
    /// Device the tensors live on.
    pub device: &'a Device,
    /// Set when the user cancels.
    pub cancel: &'a AtomicBool,
    /// Receives the plugin's log lines.
    pub log: LogSink<'a>,
    /// Threads the host lends the plugin through the parallel extension (0: one per core).
    pub threads: usize,
}

/// Parameter values laid out for the C ABI; owns what the pointers point at.
struct ParamBlock {
    _names: Vec<String>,
    _texts: Vec<String>,
    _lists: Vec<Vec<f64>>,
    values: Vec<abi::ParamValue>,
}

impl ParamBlock {
    fn new(params: &ResolvedParams) -> ParamBlock {
        let names: Vec<String> = params.values.iter().map(|(n, _)| n.clone()).collect();
        let texts: Vec<String> = params
            .values
            .iter()
            .map(|(_, v)| {
                if let ParamValue::Choice(s) = v {
                    s.clone()
                } else {
                    String::new()
                }
            })
            .collect();
        let lists: Vec<Vec<f64>> = params
            .values
            .iter()
            .map(|(_, v)| {
                if let ParamValue::List(l) = v {
                    l.clone()
                } else {
                    Vec::new()
                }
            })
            .collect();
        let values = params
            .values
            .iter()
            .enumerate()
            .map(|(i, (_, v))| {
                let (kind, number, integer) = match v {
                    ParamValue::Float(f) => (abi::PARAM_FLOAT, *f, 0),
                    ParamValue::Int(x) => (abi::PARAM_INT, *x as f64, *x),
                    ParamValue::Bool(b) => (abi::PARAM_BOOL, 0.0, i64::from(*b)),
                    ParamValue::Choice(_) => (abi::PARAM_CHOICE, 0.0, 0),
                    ParamValue::List(_) => (abi::PARAM_FLOAT_LIST, 0.0, 0),
                };
                abi::ParamValue {
                    name: Str::new(&names[i]),
                    kind,
                    number,
                    integer,
                    text: Str::new(&texts[i]),
                    list: lists[i].as_ptr(),
                    list_len: lists[i].len(),
                }
            })
            .collect();
        ParamBlock {
            _names: names,
            _texts: texts,
            _lists: lists,
            values,
        }
    }
}

/// A tensor (or chunk) handed to the plugin.
pub struct TensorCall<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// `abi::ROLE_*`.
    pub role: abi::TensorRole,
    /// Index in the merge order.
    pub index: usize,
    /// Number of tensors.
    pub count: usize,
    /// Chunk offset in elements.
    pub offset: u64,
    /// Shape of the full tensor.
    pub full_shape: &'a [usize],
}

/// A live plugin instance. Destroyed on drop.
pub struct Instance<'p> {
    plugin: &'p Plugin,
    ptr: *mut c_void,
    /// Capabilities of this instance (may depend on its parameters).
    pub capabilities: u64,
    /// Statistics passes it needs before merging.
    pub passes: u32,
}

// SAFETY: the instance pointer is only used through `&self` methods; the executor serialises
// calls with a lock unless the plugin declares CAP_THREAD_SAFE, as the ABI requires.
unsafe impl Send for Instance<'_> {}
// SAFETY: as above.
unsafe impl Sync for Instance<'_> {}

fn call_error(plugin: &Plugin, what: &str, status: Status, msg: Option<String>) -> EngineError {
    if status == abi::STATUS_CANCELLED {
        return EngineError::Cancelled;
    }
    let message = msg.unwrap_or_else(|| match status {
        abi::STATUS_PANIC => "the plugin panicked".to_owned(),
        abi::STATUS_UNSUPPORTED => "the plugin used an operation this host does not support".to_owned(),
        abi::STATUS_INVALID_ARGUMENT => "the plugin passed an invalid argument to the host".to_owned(),
        s => format!("the plugin failed with status {s} and gave no message"),
    });
    EngineError::Plugin {
        plugin: plugin.id().to_owned(),
        tensor: what.to_owned(),
        message,
    }
}

impl<'p> Instance<'p> {
    /// Creates an instance with validated parameters.
    pub fn create(
        plugin: &'p Plugin,
        params: &ResolvedParams,
        n_experts: usize,
        seed: u64,
        env: CallEnv<'_>,
    ) -> Result<Instance<'p>> {
        let block = ParamBlock::new(params);
        let mut ctx = CallCtx::new(env.device, env.cancel, env.log).with_threads(env.threads);
        let table = ctx.table();
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: a validated v1 table; the parameter block and host table outlive the call.
        let status = unsafe {
            (plugin.api.create)(
                &table,
                block.values.as_ptr(),
                block.values.len(),
                n_experts,
                seed,
                &mut ptr,
            )
        };
        if status != abi::STATUS_OK || ptr.is_null() {
            let msg = ctx
                .error
                .take()
                .or_else(|| (status == abi::STATUS_OK).then(|| "create returned no instance".into()));
            return Err(call_error(plugin, "(create)", status.max(abi::STATUS_ERROR), msg));
        }
        let mut inst = Instance {
            plugin,
            ptr,
            capabilities: plugin.info.capabilities,
            passes: 0,
        };
        if let Some(f) = plugin.api.instance_capabilities {
            // SAFETY: a live instance of this plugin.
            inst.capabilities = unsafe { f(ptr) };
        }
        if let Some(f) = plugin.api.prepare_passes {
            // SAFETY: a live instance of this plugin.
            inst.passes = unsafe { f(ptr) };
        }
        Ok(inst)
    }

    fn info(call: &TensorCall<'_>, name: &str) -> TensorInfo {
        TensorInfo {
            struct_size: std::mem::size_of::<TensorInfo>(),
            name: Str::new(name),
            role: call.role,
            index: call.index,
            count: call.count,
            offset: call.offset,
            full_numel: call.full_shape.iter().product::<usize>() as u64,
            full_shape: call.full_shape.as_ptr(),
            full_rank: call.full_shape.len(),
        }
    }

    fn with_inputs<R>(
        &self,
        env: CallEnv<'_>,
        base: Option<Tensor>,
        experts: Vec<Tensor>,
        f: impl FnOnce(&HostApiV1, TensorHandle, &[TensorHandle]) -> Status,
        finish: impl FnOnce(&mut CallCtx<'_>) -> R,
    ) -> (Status, Option<String>, R) {
        let mut ctx = CallCtx::new(env.device, env.cancel, env.log).with_threads(env.threads);
        let base_h = base.map_or(0, |b| ctx.insert(b));
        let expert_h: Vec<TensorHandle> = experts.into_iter().map(|t| ctx.insert(t)).collect();
        let table = ctx.table();
        let status = f(&table, base_h, &expert_h);
        let r = finish(&mut ctx);
        (status, ctx.error.take(), r)
    }

    /// Statistics pass `pass` over one tensor.
    pub fn prepare_tensor(
        &self,
        env: CallEnv<'_>,
        pass: u32,
        call: &TensorCall<'_>,
        base: Option<Tensor>,
        experts: Vec<Tensor>,
    ) -> Result<()> {
        let Some(f) = self.plugin.api.prepare_tensor else {
            return Ok(());
        };
        let info = Self::info(call, call.name);
        let (status, msg, ()) = self.with_inputs(
            env,
            base,
            experts,
            // SAFETY: live instance, host table and handles valid for the call.
            |table, b, ex| unsafe { f(self.ptr, table, pass, &info, b, ex.as_ptr(), ex.len()) },
            |_| (),
        );
        if status == abi::STATUS_OK {
            Ok(())
        } else {
            Err(call_error(self.plugin, call.name, status, msg))
        }
    }

    /// The plugin's `finish_tensor`, where its table (ABI 1.5 or newer) is long enough to hold one.
    fn finish_tensor_fn(
        &self,
    ) -> Option<unsafe extern "C" fn(*mut std::ffi::c_void, *const HostApiV1, u32, *const TensorInfo) -> abi::Status>
    {
        if self.plugin.api.struct_size >= abi::PLUGIN_API_V1_5_MIN_SIZE {
            self.plugin.api.finish_tensor
        } else {
            None
        }
    }

    /// Whether the host may take the tensors one at a time, each through its statistics passes
    /// and then its merge (`CAP_TENSOR_STATISTICS` with chunked statistics, an elementwise merge,
    /// thread safety and a `finish_tensor`).
    pub fn tensor_statistics(&self) -> bool {
        let needed =
            abi::CAP_TENSOR_STATISTICS | abi::CAP_CHUNKED_STATISTICS | abi::CAP_ELEMENTWISE | abi::CAP_THREAD_SAFE;
        self.passes > 0 && self.capabilities & needed == needed && self.finish_tensor_fn().is_some()
    }

    /// Calls a plugin function that takes no tensors (`f` gets the call's host table), naming
    /// `what` in its error.
    fn call_plain(&self, env: CallEnv<'_>, what: &str, f: impl FnOnce(&HostApiV1) -> Status) -> Result<()> {
        let mut ctx = CallCtx::new(env.device, env.cancel, env.log).with_threads(env.threads);
        let table = ctx.table();
        let status = f(&table);
        if status == abi::STATUS_OK {
            Ok(())
        } else {
            Err(call_error(self.plugin, what, status, ctx.error.take()))
        }
    }

    /// End of statistics pass `pass` over one tensor (`call` describes the whole tensor).
    pub fn finish_tensor(&self, env: CallEnv<'_>, pass: u32, call: &TensorCall<'_>) -> Result<()> {
        let Some(f) = self.finish_tensor_fn() else {
            return Ok(());
        };
        let info = Self::info(call, call.name);
        // SAFETY: live instance, host table and info valid for the call.
        self.call_plain(env, call.name, |table| unsafe { f(self.ptr, table, pass, &info) })
    }

    /// End of statistics pass `pass`.
    pub fn finish_pass(&self, env: CallEnv<'_>, pass: u32) -> Result<()> {
        let Some(f) = self.plugin.api.finish_pass else {
            return Ok(());
        };
        // SAFETY: live instance and host table.
        self.call_plain(env, &format!("(end of statistics pass {pass})"), |table| unsafe {
            f(self.ptr, table, pass)
        })
    }

    /// Merges one tensor or chunk and returns the plugin's result.
    pub fn merge_tensor(
        &self,
        env: CallEnv<'_>,
        call: &TensorCall<'_>,
        base: Option<Tensor>,
        experts: Vec<Tensor>,
    ) -> Result<Tensor> {
        let info = Self::info(call, call.name);
        let out = std::cell::Cell::new(0 as TensorHandle);
        let (status, msg, result) = self.with_inputs(
            env,
            base,
            experts,
            |table, b, ex| {
                let mut h: TensorHandle = 0;
                // SAFETY: live instance, host table and handles valid for the call.
                let s =
                    unsafe { (self.plugin.api.merge_tensor)(self.ptr, table, &info, b, ex.as_ptr(), ex.len(), &mut h) };
                out.set(h);
                s
            },
            |ctx| ctx.get(out.get()).cloned(),
        );
        let out = out.get();
        if status != abi::STATUS_OK {
            return Err(call_error(self.plugin, call.name, status, msg));
        }
        result.ok_or_else(|| EngineError::Plugin {
            plugin: self.plugin.id().to_owned(),
            tensor: call.name.to_owned(),
            message: format!("it returned handle {out}, which is not a tensor of this call"),
        })
    }
}

impl Instance<'_> {
    /// The plugin this instance belongs to.
    pub fn plugin(&self) -> &Plugin {
        self.plugin
    }

    /// The error for a failed call `what` of this instance (`Cancelled` for a cancelled one).
    pub fn failure(&self, what: &str, status: Status, message: Option<String>) -> EngineError {
        call_error(self.plugin, what, status, message)
    }

    /// Calls a model-level plugin's `run_model` with the tables of a call and of its session,
    /// for `n_outputs` tensors, and returns the handles it filled (or its status).
    ///
    /// # Safety
    ///
    /// `host` and `session` must point at contexts that stay alive and unmoved during the call.
    pub unsafe fn call_run_model(
        &self,
        host: &HostApiV1,
        session: &abi::SessionApiV1,
        n_outputs: usize,
    ) -> std::result::Result<Vec<TensorHandle>, Status> {
        // A per-tensor plugin's table may end before `run_model` (ABI 1.0): read the field only
        // for model-level plugins, whose table length the loader checked.
        let run = if self.plugin.is_model_level() {
            self.plugin.api.run_model
        } else {
            None
        };
        let Some(run) = run else {
            return Err(abi::STATUS_UNSUPPORTED);
        };
        let mut out = vec![0 as TensorHandle; n_outputs];
        // SAFETY: live instance; the caller keeps both contexts alive during the call.
        let status = unsafe { run(self.ptr, host, session, out.as_mut_ptr(), n_outputs) };
        if status == abi::STATUS_OK { Ok(out) } else { Err(status) }
    }
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from this plugin's `create` and is destroyed once.
        unsafe { (self.plugin.api.destroy)(self.ptr) };
    }
}
