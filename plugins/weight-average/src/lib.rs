//! `weight-average`: θ = Σ_t w_t θ_t / Σ_t w_t (uniform weights by default), or Σ_t w_t θ_t
//! without normalisation (mergekit's `linear` with `normalize: false`).

use mergescope_plugin_api::abi::{CAP_ELEMENTWISE, CAP_THREAD_SAFE};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Weight averaging (model soup): θ = Σ_t w_t·θ_t / Σ_t w_t over the experts. \
The base model, if given, is not used. With the default weights (all 1) this is the plain \
average θ_avg of the CART paper (Eq. 1), which equals task arithmetic with λ = 1/T. \
Weights may be negative, but they must not sum to 0.\n\
Parameters (mergekit's `linear`: weight → weights, normalize → normalize):\n\
- weights (per task, default 1.0): w_t, one per expert in input order (a single value applies to all).\n\
- normalize (default true): divide by Σ_t w_t; false gives the plain weighted sum Σ_t w_t·θ_t.";

/// The weight-average method.
pub struct WeightAverage {
    coefficients: Vec<f64>,
}

impl MergeMethod for WeightAverage {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "weight-average",
            name: "Weight averaging",
            version: "",
            description: "Average of the expert models, optionally weighted per model.",
            help: HELP,
            capabilities: CAP_ELEMENTWISE | CAP_THREAD_SAFE,
            params: vec![
                ParamSpec::float("weights", 1.0, "Weight of each expert.").per_task(),
                ParamSpec::bool(
                    "normalize",
                    true,
                    "Divide by the sum of the weights (a weighted average).",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let w = params.per_task("weights")?;
        if !params.bool("normalize")? {
            return Ok(WeightAverage { coefficients: w });
        }
        let total: f64 = w.iter().sum();
        if total.abs() < 1e-12 {
            return Err(Error::Message(format!(
                "weights sum to {total}; the average is undefined. Give weights whose sum is not 0, or normalize=false \
                 for the plain weighted sum."
            )));
        }
        Ok(WeightAverage {
            coefficients: w.iter().map(|x| x / total).collect(),
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let experts = input.experts;
        host.weighted_sum(experts, Some(&self.coefficients))
    }
}

mergescope_plugin_api::export_plugin!(WeightAverage);
