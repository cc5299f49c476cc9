//! ABI test fixture: a per-tensor plugin whose `merge_tensor` fails with a 10 MB message. The
//! host must show a bounded part of it, not flood the terminal or the GUI.

use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};

/// Fails on every tensor with a huge message.
pub struct LongError;

impl MergeMethod for LongError {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-long-error",
            name: "Fixture: long error",
            version: "",
            description: "ABI test fixture that fails with a 10 MB error message.",
            help: "Fails on the first tensor with 'fixture error: ' and 10 MB of 'x'.",
            capabilities: 0,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(LongError)
    }

    fn merge_tensor(&mut self, _h: &Host<'_>, _input: &TensorInput<'_>) -> Result<Tensor> {
        Err(format!("fixture error: {}", "x".repeat(10 << 20)).into())
    }
}

mergescope_plugin_api::export_plugin!(LongError);
