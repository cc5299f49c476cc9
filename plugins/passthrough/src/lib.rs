//! `passthrough`: one model copied unchanged, or scaled (mergekit's `passthrough`). With layer
//! slices (mergekit's `slices`) it builds a model from layer ranges of several models: the host
//! assembles the slices into the one input, and this method writes it out.

use mergescope_plugin_api::abi::{CAP_ELEMENTWISE, CAP_ONE_EXPERT, CAP_THREAD_SAFE};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Passthrough (mergekit's `passthrough`): the output is the one input model, \
θ = s·θ_1. Its use is the frankenmerge: with layer slices (a recipe's [[slices]] or mergekit's \
`slices`), the input is assembled from layer ranges of several models, renumbered in order, and \
passthrough writes that model out. No base model is used.\n\
Parameters:\n\
- scale (default 1.0): factor s applied to every tensor; 1 copies the values exactly. mergekit \
gives it per model and usually per tensor with filters, e.g. scale = [{filter = \"o_proj\", value = 0}, \
{value = 1}] (a layer-wise value, resolved by the host for each tensor).";

/// The passthrough method.
pub struct Passthrough {
    scale: f64,
}

impl MergeMethod for Passthrough {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "passthrough",
            name: "Passthrough",
            version: "",
            description: "Copies one model (optionally scaled): frankenmerges from layer slices.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_ELEMENTWISE | CAP_ONE_EXPERT,
            params: vec![ParamSpec::float(
                "scale",
                1.0,
                "Factor applied to every tensor (1 copies exactly).",
            )],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Passthrough {
            scale: params.float("scale")?,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        // The host enforces one expert (CAP_ONE_EXPERT); x·1 is exact in floating point.
        host.scale(input.experts[0], self.scale)
    }
}

mergescope_plugin_api::export_plugin!(Passthrough);
