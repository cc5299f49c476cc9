//! ABI test fixture: an SDK plugin whose `merge_tensor` panics with "fixture panic: boom". The
//! SDK's guard must turn the panic into `STATUS_PANIC` with the message; the host must report
//! it and keep running.

use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};

/// Panics on every tensor.
pub struct Panics;

impl MergeMethod for Panics {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-panics",
            name: "Fixture: panics",
            version: "",
            description: "ABI test fixture whose merge_tensor panics.",
            help: "Panics with \"fixture panic: boom\" on the first tensor.",
            capabilities: 0,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Panics)
    }

    #[allow(clippy::panic)]
    fn merge_tensor(&mut self, _h: &Host<'_>, _input: &TensorInput<'_>) -> Result<Tensor> {
        panic!("fixture panic: boom");
    }
}

mergescope_plugin_api::export_plugin!(Panics);
