//! ABI test fixture: an SDK plugin whose `merge_tensor` returns a tensor of the right shape
//! full of NaN. The host must refuse the output, naming the tensor.

use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};

/// Returns NaN everywhere.
pub struct NanOutput;

impl MergeMethod for NanOutput {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-nan-output",
            name: "Fixture: NaN output",
            version: "",
            description: "ABI test fixture whose merge_tensor returns NaN.",
            help: "Returns a tensor of the right shape full of NaN.",
            capabilities: 0,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(NanOutput)
    }

    fn merge_tensor(&mut self, h: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (base, ex) = (input.base, input.experts);
        let like = base.or_else(|| ex.first().copied()).ok_or("no input tensors")?;
        h.full_like(like, f64::NAN)
    }
}

mergescope_plugin_api::export_plugin!(NanOutput);
