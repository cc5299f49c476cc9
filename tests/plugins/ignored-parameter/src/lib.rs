//! Test fixture: declares `lambda` (task arithmetic's) but merges by the experts' mean whatever
//! its value. `mergescope plugins test` must report the ignored parameter.

use mergescope_plugin_api::abi::CAP_THREAD_SAFE;
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

/// The mean, with an unused `lambda`.
pub struct IgnoredParameter;

impl MergeMethod for IgnoredParameter {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-ignored-parameter",
            name: "Fixture: ignored parameter",
            version: "",
            description: "Test fixture that ignores its lambda.",
            help: "The experts' mean; lambda is declared and never read.",
            capabilities: CAP_THREAD_SAFE,
            params: vec![ParamSpec::float("lambda", 0.3, "Declared, not used.")],
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(IgnoredParameter)
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let t = input.experts.len() as f64;
        host.weighted_sum(input.experts, Some(&vec![1.0 / t; input.experts.len()]))
    }
}

mergescope_plugin_api::export_plugin!(IgnoredParameter);
