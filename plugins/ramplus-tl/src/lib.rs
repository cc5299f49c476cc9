//! `ramplus-tl`: RAM+ tensor-local (arXiv 2601.13572) as mergekit's `ramplus_tl` computes it
//! ([`mergescope_plugin_api::sdk::ram`]): RAM, with each expert's unique elements scaled by
//! λ_i = 1 + r·clamp(ρ_i, 0, α), ρ_i its shared ÷ unique elements counted over the tensor.

use mergescope_plugin_api::abi::{CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::ram::{self, UniqueScale};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "RAM+ tensor-local (arXiv 2601.13572; mergekit's `ramplus_tl`): RAM (unique \
task-vector elements kept, shared ones averaged; see `ram`), with the unique elements of expert i \
scaled by λ_i = 1 + r·clamp(ρ_i, 0, α), where ρ_i = (elements expert i changes together with another \
expert) ÷ max(elements it changes alone, ε), counted over each whole tensor. An expert that shares \
most of its changes has its few own changes boosted, up to 1 + r·α.\n\
Parameters:\n\
- r (default 0.1): the boost per unit of ρ.\n\
- alpha (default 0.2): the cap of ρ.\n\
- epsilon (default 1e-5): the magnitude a task-vector element must exceed to count as a change.\n\
Computed in f32 in mergekit's order of operations; each tensor is merged whole.";

/// The RAM+ (tensor-local) method.
pub struct RamPlus {
    r: f32,
    alpha: f32,
    epsilon: f32,
}

impl MergeMethod for RamPlus {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "ramplus-tl",
            name: "RAM+ (tensor-local)",
            version: "",
            description: "RAM with each expert's unique changes scaled by how much of the tensor it shares.",
            help: HELP,
            capabilities: CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float("r", 0.1, "Boost of unique changes per unit of the share ratio ρ"),
                ParamSpec::float("alpha", 0.2, "Cap of the share ratio ρ").min(0.0),
                ParamSpec::float("epsilon", 1e-5, "Magnitude a task-vector element must exceed to count").min(0.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(RamPlus {
            r: params.float("r")? as f32,
            alpha: params.float("alpha")? as f32,
            epsilon: params.float("epsilon")? as f32,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let scale = UniqueScale::Plus {
            r: self.r,
            alpha: self.alpha,
        };
        ram::merge_tensor(host, input, "ramplus-tl", self.epsilon, scale)
    }
}

mergescope_plugin_api::export_plugin!(RamPlus);
