//! The safe Rust SDK: implement [`MergeMethod`], call [`export_plugin!`](crate::export_plugin),
//! and build the crate as a `cdylib`. The SDK turns panics into `STATUS_PANIC` with the panic
//! message, forwards errors and logs to the host, and hands the method typed parameters.

pub mod combine;
pub mod disjoint;
mod gram;
mod host;
mod params;
pub mod ram;
mod simd;
mod stats;
pub mod subspace;
pub mod sums;
pub mod testing;

pub use gram::gram_sums;
pub use host::Host;
pub(crate) use host::check;
pub use params::{Choice, ParamSpec, ParamType, Params, schema_json};
pub use stats::{ChunkSums, PerTensor};

use crate::abi::{self, HostApiV1, ParamValue, Status, Str, TensorHandle, TensorInfo};
use std::cell::RefCell;
use std::ffi::c_void;
use std::fmt;

/// A tensor owned by the host. Cheap to copy; valid until the current host call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor(pub TensorHandle);

/// Why a method call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// A host function failed; the host already holds the message.
    Host(Status),
    /// The method's own failure, with a message for the user.
    Message(String),
    /// The user cancelled the job.
    Cancelled,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Host(s) => write!(f, "host call failed with status {s}"),
            Error::Message(m) => f.write_str(m),
            Error::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl From<String> for Error {
    fn from(m: String) -> Self {
        Error::Message(m)
    }
}

impl From<&str> for Error {
    fn from(m: &str) -> Self {
        Error::Message(m.to_owned())
    }
}

/// Result of SDK and method calls.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything `create` gets besides the parameters.
#[derive(Clone, Copy, Debug)]
pub struct CreateContext {
    /// Number of expert models in this merge.
    pub n_experts: usize,
    /// Seed of the merge (record of the user's `--seed`).
    pub seed: u64,
}

/// Safe view of a [`TensorInfo`].
#[derive(Clone, Copy, Debug)]
pub struct TensorMeta<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// `abi::ROLE_*`.
    pub role: abi::TensorRole,
    /// Index in the host's order.
    pub index: usize,
    /// Number of tensors.
    pub count: usize,
    /// Offset of the chunk in the full tensor.
    pub offset: u64,
    /// Elements of the full tensor.
    pub full_numel: u64,
    /// Shape of the full tensor.
    pub full_shape: &'a [usize],
}

impl<'a> TensorMeta<'a> {
    /// The base tensor, or an error naming the tensor and `method` that tells the user to pass
    /// `--base` (for methods that work on task vectors θ_t − θ0).
    pub fn require_base(&self, base: Option<Tensor>, method: &str) -> Result<Tensor> {
        base.ok_or_else(|| {
            Error::Message(format!(
                "tensor '{}': {method} needs a base model (task vectors are θ_t − θ0); give one with --base",
                self.name
            ))
        })
    }

    /// Reads the host's info.
    ///
    /// # Safety
    /// `info` must be the pointer the host passed to the current call.
    pub unsafe fn from_raw(info: *const TensorInfo) -> Result<TensorMeta<'a>> {
        // SAFETY: guaranteed by the caller.
        let info = unsafe { info.as_ref() }.ok_or(Error::Message("null tensor info".into()))?;
        // SAFETY: the host keeps the name alive for the call.
        let name = unsafe { info.name.as_str() }.map_err(|_| Error::Message("tensor name is not UTF-8".into()))?;
        let full_shape = if info.full_shape.is_null() || info.full_rank == 0 {
            &[][..]
        } else {
            // SAFETY: the host keeps the shape alive for the call.
            unsafe { std::slice::from_raw_parts(info.full_shape, info.full_rank) }
        };
        Ok(TensorMeta {
            name,
            role: info.role,
            index: info.index,
            count: info.count,
            offset: info.offset,
            full_numel: info.full_numel,
            full_shape,
        })
    }
}

/// What one `prepare_tensor` or `merge_tensor` call gets: the tensor (or chunk) and its inputs.
#[derive(Clone, Copy, Debug)]
pub struct TensorInput<'a> {
    /// Name, role, position and full shape of the tensor.
    pub meta: TensorMeta<'a>,
    /// The base model's tensor, when the merge has a base.
    pub base: Option<Tensor>,
    /// The experts' tensors, one per expert in the host's order.
    pub experts: &'a [Tensor],
}

impl TensorInput<'_> {
    /// The base tensor, or an error naming the tensor and `method` that tells the user to pass
    /// `--base` (see [`TensorMeta::require_base`]).
    pub fn require_base(&self, method: &str) -> Result<Tensor> {
        self.meta.require_base(self.base, method)
    }

    /// The base followed by every expert (the operand list of θ0 + Σ c_t·θ_t sums); needs a
    /// base like [`require_base`](Self::require_base).
    pub fn base_and_experts(&self, method: &str) -> Result<Vec<Tensor>> {
        let mut all = Vec::with_capacity(self.experts.len() + 1);
        all.push(self.require_base(method)?);
        all.extend_from_slice(self.experts);
        Ok(all)
    }
}

/// Static description of a method.
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// Stable id (`task-arithmetic`).
    pub id: &'static str,
    /// Display name.
    pub name: &'static str,
    /// Version; defaults to the crate version in [`export_plugin!`](crate::export_plugin).
    pub version: &'static str,
    /// One-line description.
    pub description: &'static str,
    /// Help text.
    pub help: &'static str,
    /// `abi::CAP_*` bits.
    pub capabilities: u64,
    /// Parameter schema.
    pub params: Vec<ParamSpec>,
}

/// A per-tensor merge method. One instance serves one merge.
pub trait MergeMethod: Sized + 'static {
    /// Describes the method (called once, when the host loads the library).
    fn descriptor() -> Descriptor;

    /// Makes an instance from validated parameters.
    fn create(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self>;

    /// Capabilities of this instance when they depend on the parameters (`None`: the
    /// descriptor's).
    fn capabilities(&self) -> Option<u64> {
        None
    }

    /// Number of statistics passes needed before merging (global statistics).
    fn prepare_passes(&self) -> u32 {
        0
    }

    /// Sees one tensor during statistics pass `pass`.
    fn prepare_tensor(&mut self, _host: &Host<'_>, _pass: u32, _input: &TensorInput<'_>) -> Result<()> {
        Ok(())
    }

    /// Called after statistics pass `pass` saw every tensor.
    fn finish_pass(&mut self, _host: &Host<'_>, _pass: u32) -> Result<()> {
        Ok(())
    }

    /// Called after statistics pass `pass` saw every chunk of `tensor` (ABI 1.5): with
    /// `CAP_TENSOR_STATISTICS` the host may merge that tensor right after, before
    /// [`MergeMethod::finish_pass`]. May be called from several threads at once (for different
    /// tensors) when the method is thread-safe. A host older than 1.5 never calls it, so
    /// `finish_pass` must still finish whatever this did not.
    fn finish_tensor(&mut self, _host: &Host<'_>, _pass: u32, _tensor: &TensorMeta<'_>) -> Result<()> {
        Ok(())
    }

    /// Merges one tensor (or chunk).
    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor>;
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The plugin has its own copy of std, so this hook only sees the plugin's panics. It
        // records the message instead of printing it; the guard hands it to the host.
        std::panic::set_hook(Box::new(|info| {
            let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                (*s).to_owned()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic payload".to_owned()
            };
            let loc = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{loc}")));
        }));
    });
}

/// Runs `f`, catching a panic: on failure, the status to return and the error (a panic's
/// message as `Error::Message`). Shared by [`guard`] and the parallel jobs of [`Host`].
pub(crate) fn catch_job(f: impl FnOnce() -> Result<()>) -> std::result::Result<(), (Status, Error)> {
    install_panic_hook();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            let status = match &e {
                Error::Host(s) => *s,
                Error::Cancelled => abi::STATUS_CANCELLED,
                Error::Message(_) => abi::STATUS_ERROR,
            };
            Err((status, e))
        }
        Err(_) => {
            let m = LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .unwrap_or_else(|| "unknown panic".into());
            Err((abi::STATUS_PANIC, Error::Message(format!("plugin panicked: {m}"))))
        }
    }
}

/// Runs `f` so that no panic and no error escapes: panics become `STATUS_PANIC`, errors become
/// their status, and the message goes to the host through `set_error`.
pub fn guard(host: Option<Host<'_>>, f: impl FnOnce() -> Result<()>) -> Status {
    match catch_job(f) {
        Ok(()) => abi::STATUS_OK,
        Err((status, e)) => {
            // A host error's message is already with the host; set_error never unwinds.
            if let (Some(h), Error::Message(m)) = (host, &e) {
                h.set_error(m);
            }
            status
        }
    }
}

/// A `'static` copy of the descriptor with C strings, built once per library.
#[doc(hidden)]
pub struct StaticTable {
    /// The table handed to the host.
    pub api: abi::PluginApiV1,
    _strings: Vec<String>,
}

// SAFETY: the table only points into `_strings`, which never changes after construction.
unsafe impl Sync for StaticTable {}
// SAFETY: as above.
unsafe impl Send for StaticTable {}

/// A kind of method (per-tensor, model-level): its ABI kind and how it makes an instance of `M`.
pub(crate) trait MethodKind<M> {
    /// The table's `kind`.
    const KIND: abi::PluginKind;
    /// Makes the instance for one merge (the method's `create`).
    fn make(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<M>;
}

/// The kind of [`MergeMethod`]s.
pub(crate) struct PerTensorKind;

impl<M: MergeMethod> MethodKind<M> for PerTensorKind {
    const KIND: abi::PluginKind = abi::KIND_PER_TENSOR;

    fn make(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<M> {
        M::create(host, params, ctx)
    }
}

/// A table for the method `M` of kind `K` described by `d`, with the functions every kind has
/// (`create`, `destroy`) and the optional ones null (`merge_tensor` answers that the method is
/// not per-tensor); the caller fills in its kind's functions with struct-update syntax.
pub(crate) fn described_table<M: 'static, K: MethodKind<M>>(
    d: &Descriptor,
    crate_version: &'static str,
) -> StaticTable {
    let version = if d.version.is_empty() { crate_version } else { d.version };
    let strings = vec![
        d.id.to_owned(),
        d.name.to_owned(),
        version.to_owned(),
        d.description.to_owned(),
        d.help.to_owned(),
        schema_json(&d.params),
    ];
    // The `Str`s point into the heap buffers of `strings`, which do not move with the Vec.
    let [id, name, version, description, help, schema]: [Str; 6] = std::array::from_fn(|i| Str::new(&strings[i]));
    let api = abi::PluginApiV1 {
        struct_size: std::mem::size_of::<abi::PluginApiV1>(),
        id,
        name,
        version,
        description,
        help,
        kind: K::KIND,
        capabilities: d.capabilities,
        params_schema_json: schema,
        create: create_impl::<M, K>,
        destroy: destroy_impl::<M>,
        prepare_passes: None,
        prepare_tensor: None,
        finish_pass: None,
        merge_tensor: no_merge_tensor,
        get_extension: None,
        instance_capabilities: None,
        run_model: None,
        finish_tensor: None,
    };
    StaticTable { api, _strings: strings }
}

/// `merge_tensor` of a method that is not per-tensor: an error, never a call into the method.
unsafe extern "C" fn no_merge_tensor(
    _instance: *mut c_void,
    host: *const HostApiV1,
    _info: *const TensorInfo,
    _base: TensorHandle,
    _experts: *const TensorHandle,
    _n_experts: usize,
    _out: *mut TensorHandle,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let h = unsafe { Host::from_raw(host) };
    guard(h, || {
        Err(Error::Message(
            "this is a model-level method: the host must call run_model, not merge_tensor".into(),
        ))
    })
}

#[doc(hidden)]
pub fn build_table<M: MergeMethod>(version: &'static str) -> StaticTable {
    let mut table = described_table::<M, PerTensorKind>(&M::descriptor(), version);
    table.api = abi::PluginApiV1 {
        prepare_passes: Some(prepare_passes_impl::<M>),
        prepare_tensor: Some(prepare_tensor_impl::<M>),
        finish_pass: Some(finish_pass_impl::<M>),
        finish_tensor: Some(finish_tensor_impl::<M>),
        merge_tensor: merge_tensor_impl::<M>,
        instance_capabilities: Some(instance_capabilities_impl::<M>),
        ..table.api
    };
    table
}

pub(crate) unsafe fn experts_slice(experts: *const TensorHandle, n: usize) -> Result<Vec<Tensor>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if experts.is_null() {
        return Err(Error::Message("null experts array".into()));
    }
    // SAFETY: the host passes `n` handles.
    Ok(unsafe { std::slice::from_raw_parts(experts, n) }
        .iter()
        .map(|h| Tensor(*h))
        .collect())
}

fn base_opt(base: TensorHandle) -> Option<Tensor> {
    (base != 0).then_some(Tensor(base))
}

/// A method instance with the number of experts it was created for, which the SDK checks every
/// tensor call against so that no method has to.
pub(crate) struct Slot<M> {
    method: M,
    n_experts: usize,
}

/// `create` of a method `M` of kind `K`, which makes the instance.
///
/// # Safety
/// The pointers are those the host passed to `create`.
unsafe extern "C" fn create_impl<M: 'static, K: MethodKind<M>>(
    host: *const HostApiV1,
    params: *const ParamValue,
    n_params: usize,
    n_experts: usize,
    seed: u64,
    out: *mut *mut c_void,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    if out.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    guard(Some(h), || {
        if n_experts == 0 {
            return Err(Error::Message(
                "the merge has no expert models; give at least one expert checkpoint".into(),
            ));
        }
        // SAFETY: the host passes `n_params` values.
        let p = unsafe { Params::from_raw(params, n_params) }.for_experts(n_experts);
        let method = K::make(&h, &p, CreateContext { n_experts, seed })?;
        let slot = Slot { method, n_experts };
        // SAFETY: `out` was checked for null.
        unsafe { *out = Box::into_raw(Box::new(slot)).cast::<c_void>() };
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn destroy_impl<M: 'static>(instance: *mut c_void) {
    if instance.is_null() {
        return;
    }
    guard(None, || {
        // SAFETY: `instance` was made by `create_impl::<M, _>` and is destroyed once.
        drop(unsafe { Box::from_raw(instance.cast::<Slot<M>>()) });
        Ok(())
    });
}

/// The slot `create_impl` made.
///
/// # Safety
/// `instance` is the pointer `create` returned, used by one thread at a time.
unsafe fn slot<'a, M>(instance: *mut c_void) -> Result<&'a mut Slot<M>> {
    // SAFETY: guaranteed by the caller.
    unsafe { instance.cast::<Slot<M>>().as_mut() }.ok_or(Error::Message("null instance".into()))
}

/// The method `create_impl` made.
///
/// # Safety
/// As [`slot`].
pub(crate) unsafe fn instance<'a, M>(instance: *mut c_void) -> Result<&'a mut M> {
    // SAFETY: guaranteed by the caller.
    Ok(&mut unsafe { slot::<M>(instance) }?.method)
}

/// The body of the per-tensor calls (`prepare_tensor`, `merge_tensor`): reads the host's
/// arguments, checks the experts against the instance's count and runs `f` under [`guard`].
///
/// # Safety
/// The pointers are those the host passed to the call.
unsafe fn tensor_call<M>(
    inst: *mut c_void,
    host: *const HostApiV1,
    info: *const TensorInfo,
    base: TensorHandle,
    experts: *const TensorHandle,
    n_experts: usize,
    f: impl FnOnce(&mut M, &Host<'_>, &TensorInput<'_>) -> Result<()>,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    guard(Some(h), || {
        // SAFETY: pointers from the host, valid for this call.
        let (slot, meta, ex) = unsafe {
            (
                slot::<M>(inst)?,
                TensorMeta::from_raw(info)?,
                experts_slice(experts, n_experts)?,
            )
        };
        if ex.len() != slot.n_experts {
            return Err(Error::Message(format!(
                "tensor '{}': the instance was created for {} experts but the host passed {}",
                meta.name,
                slot.n_experts,
                ex.len()
            )));
        }
        let input = TensorInput {
            meta,
            base: base_opt(base),
            experts: &ex,
        };
        f(&mut slot.method, &h, &input)
    })
}

unsafe extern "C" fn instance_capabilities_impl<M: MergeMethod>(inst: *mut c_void) -> u64 {
    let static_caps = M::descriptor().capabilities;
    let mut caps = static_caps;
    guard(None, || {
        // SAFETY: see `instance`.
        caps = unsafe { instance::<M>(inst) }?.capabilities().unwrap_or(static_caps);
        Ok(())
    });
    caps
}

unsafe extern "C" fn prepare_passes_impl<M: MergeMethod>(inst: *mut c_void) -> u32 {
    let mut n = 0;
    guard(None, || {
        // SAFETY: see `instance`.
        n = unsafe { instance::<M>(inst) }?.prepare_passes();
        Ok(())
    });
    n
}

unsafe extern "C" fn prepare_tensor_impl<M: MergeMethod>(
    inst: *mut c_void,
    host: *const HostApiV1,
    pass: u32,
    info: *const TensorInfo,
    base: TensorHandle,
    experts: *const TensorHandle,
    n_experts: usize,
) -> Status {
    // SAFETY: forwarded from the host.
    unsafe {
        tensor_call::<M>(inst, host, info, base, experts, n_experts, |m, h, input| {
            m.prepare_tensor(h, pass, input)
        })
    }
}

unsafe extern "C" fn finish_pass_impl<M: MergeMethod>(inst: *mut c_void, host: *const HostApiV1, pass: u32) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    guard(Some(h), || {
        // SAFETY: see `instance`.
        unsafe { instance::<M>(inst) }?.finish_pass(&h, pass)
    })
}

unsafe extern "C" fn finish_tensor_impl<M: MergeMethod>(
    inst: *mut c_void,
    host: *const HostApiV1,
    pass: u32,
    info: *const TensorInfo,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    guard(Some(h), || {
        // SAFETY: the host passes a valid info for this call.
        let meta = unsafe { TensorMeta::from_raw(info) }?;
        // SAFETY: see `instance`.
        unsafe { instance::<M>(inst) }?.finish_tensor(&h, pass, &meta)
    })
}

unsafe extern "C" fn merge_tensor_impl<M: MergeMethod>(
    inst: *mut c_void,
    host: *const HostApiV1,
    info: *const TensorInfo,
    base: TensorHandle,
    experts: *const TensorHandle,
    n_experts: usize,
    out: *mut TensorHandle,
) -> Status {
    if out.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    // SAFETY: forwarded from the host.
    unsafe {
        tensor_call::<M>(inst, host, info, base, experts, n_experts, |m, h, input| {
            let t = m.merge_tensor(h, input)?;
            // SAFETY: `out` was checked for null.
            *out = t.0;
            Ok(())
        })
    }
}

/// Exports a [`MergeMethod`] as a mergescope plugin: the static header and the v1 entry.
/// Use once per `cdylib` crate: `mergescope_plugin_api::export_plugin!(MyMethod);`
#[macro_export]
macro_rules! export_plugin {
    ($method:ty) => {
        $crate::__export_table!($crate::sdk::build_table::<$method>);
    };
}

/// The static header and the v1 entry returning the table `$build` makes (shared by
/// [`export_plugin!`] and [`export_model_plugin!`](crate::export_model_plugin)).
#[doc(hidden)]
#[macro_export]
macro_rules! __export_table {
    ($build:path) => {
        #[unsafe(no_mangle)]
        #[used]
        pub static mergescope_plugin_header: $crate::abi::PluginHeader = $crate::abi::PluginHeader {
            magic: $crate::abi::MAGIC,
            abi_major: $crate::abi::ABI_MAJOR,
            abi_minor: $crate::abi::ABI_MINOR,
        };

        /// The v1 entry point read by the mergescope host.
        #[unsafe(no_mangle)]
        pub extern "C" fn mergescope_plugin_entry_v1() -> *const $crate::abi::PluginApiV1 {
            static TABLE: ::std::sync::OnceLock<$crate::sdk::StaticTable> = ::std::sync::OnceLock::new();
            let status = $crate::sdk::guard(None, || {
                TABLE.get_or_init(|| $build(env!("CARGO_PKG_VERSION")));
                Ok(())
            });
            match TABLE.get() {
                Some(t) if status == $crate::abi::STATUS_OK => &t.api,
                _ => ::std::ptr::null(),
            }
        }
    };
}

/// The rank CART keeps of a matrix of full rank `r` (min(m, n)) under a rank `ratio`:
/// ⌈r·ratio − 1e-9⌉ clamped to [0, r], so that round-off such as 25·0.08 = 2.0000000000000004
/// does not add a rank. One rule for the cart and adamerging plugins and the host's landscapes.
pub fn rank_from_ratio(r: usize, ratio: f64) -> usize {
    let k = (r as f64 * ratio - 1e-9).ceil();
    if k <= 0.0 {
        0
    } else if k >= r as f64 {
        r
    } else {
        k as usize
    }
}

/// FNV-1a, 64-bit, of `bytes` (for deriving per-tensor seeds from tensor names).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The splitmix64 finaliser (Steele et al.), a bijective 64-bit mixer.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seed of the random mask of expert `expert` (0-based) on tensor `tensor_name` in a merge with
/// seed `merge_seed`: splitmix64(splitmix64(merge_seed XOR fnv1a64(name)) XOR expert). One rule
/// for the plugins that draw per-expert masks (dare, della), so the same seed gives the same
/// draws on any device, thread count or chunking.
pub fn expert_seed(merge_seed: u64, tensor_name: &str, expert: usize) -> u64 {
    splitmix64(splitmix64(merge_seed ^ fnv1a64(tensor_name.as_bytes())) ^ expert as u64)
}

#[cfg(test)]
mod seed_tests {
    use super::*;

    #[test]
    fn expert_seed_is_pinned() {
        // The values the dare plugin has always produced (tests/tests/golden_dare.rs).
        assert_eq!(expert_seed(0, "layer.weight", 0), 0xff67_794a_79d3_e838);
        assert_eq!(expert_seed(42, "layer.weight", 2), 0x0858_0d4c_cc3a_1263);
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    }
}
