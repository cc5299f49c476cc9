//! Test fixture: the mean of the experts plus a tiny offset that depends on the worker thread
//! (each new thread takes the next number), so runs with other threads give other bits.
//! `mergescope plugins test` must report it.

use mergescope_plugin_api::abi::CAP_THREAD_SAFE;
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
}

/// Mean plus a per-thread offset.
pub struct ThreadDependent;

impl MergeMethod for ThreadDependent {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-thread-dependent",
            name: "Fixture: thread-dependent output",
            version: "",
            description: "Test fixture whose output depends on the worker thread.",
            help: "The experts' mean plus 1e-3 times the worker thread's number.",
            capabilities: CAP_THREAD_SAFE,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(ThreadDependent)
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let t = input.experts.len() as f64;
        let mean = host.weighted_sum(input.experts, Some(&vec![1.0 / t; input.experts.len()]))?;
        let offset = THREAD.with(|n| *n as f64 * 1e-3);
        host.affine(mean, 1.0, offset)
    }
}

mergescope_plugin_api::export_plugin!(ThreadDependent);
