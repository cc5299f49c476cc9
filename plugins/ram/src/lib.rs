//! `ram`: Reinforced Agent Merging (arXiv 2601.13572) as mergekit's `ram` computes it
//! ([`mergescope_plugin_api::sdk::ram`]): per element, the experts whose task vector exceeds ε
//! in magnitude contribute; one contributor's value is kept whole, several are averaged.

use mergescope_plugin_api::abi::{CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::sdk::ram::{self, UniqueScale};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "RAM, Reinforced Agent Merging (arXiv 2601.13572; mergekit's `ram`): with task \
vectors τ_i = θ_i − θ_0 and, per element, the experts whose |τ_i| > ε, θ = θ_0 + τ_i where one \
expert alone changes the element and θ = θ_0 + mean of the contributors' τ_i where several do. So \
an expert's own changes are not diluted by experts that left the element alone (as averaging \
would), and changes shared by several are averaged.\n\
Parameters:\n\
- epsilon (default 1e-5): the magnitude a task-vector element must exceed to count as a change.\n\
Computed in f32 in mergekit's order of operations.";

/// The RAM method.
pub struct Ram {
    epsilon: f32,
}

impl MergeMethod for Ram {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "ram",
            name: "RAM",
            version: "",
            description: "Keeps each expert's unique changes whole and averages the changes experts share.",
            help: HELP,
            capabilities: CAP_ELEMENTWISE | CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float("epsilon", 1e-5, "Magnitude a task-vector element must exceed to count").min(0.0),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Ram {
            epsilon: params.float("epsilon")? as f32,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        ram::merge_tensor(host, input, "ram", self.epsilon, UniqueScale::One)
    }
}

mergescope_plugin_api::export_plugin!(Ram);
