//! ABI test fixture: an SDK plugin whose `merge_tensor` returns a flat tensor with one element
//! more than its input. The host must refuse the output, naming the tensor and the shapes.

use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};

/// Returns a tensor of the wrong shape.
pub struct WrongShape;

impl MergeMethod for WrongShape {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-wrong-shape",
            name: "Fixture: wrong shape",
            version: "",
            description: "ABI test fixture whose merge_tensor returns the wrong shape.",
            help: "Returns a 1-D tensor with one element more than the input.",
            capabilities: 0,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(WrongShape)
    }

    fn merge_tensor(&mut self, h: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (base, ex) = (input.base, input.experts);
        let like = base.or_else(|| ex.first().copied()).ok_or("no input tensors")?;
        let n = h.numel(like)? + 1;
        h.from_f32(&vec![0.5; n], &[n])
    }
}

mergescope_plugin_api::export_plugin!(WrongShape);
