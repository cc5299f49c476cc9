//! `task-arithmetic`: θ = θ0 + λ·Σ_t w_t·τ_t with τ_t = θ_t − θ0 (Ilharco et al., 2023).
//!
//! The whole merge of one tensor is a single fused host call,
//! `weighted_sum([θ0, θ_1..θ_T], [1 − λ·Σw', λ·w'_1, …, λ·w'_T])`, which never materialises
//! the task vectors.

use mergescope_plugin_api::abi::{CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Task arithmetic (Ilharco et al., 2023): θ = θ0 + λ·Σ_t w_t·τ_t with task vectors \
τ_t = θ_t − θ0 taken against the base model θ0 (required).\n\
Parameters:\n\
- lambda (default 0.3): the scaling coefficient λ. 0.3 is the value used by AdaMerging's and \
FusionBench's task-arithmetic baselines; the original task_vectors README uses 0.8 and the TA paper \
selects λ on validation data over {0, 0.05, …, 1.0}. λ = 1/T with unit weights gives the plain \
weight average.\n\
- task_weights (per task, default 1.0): w_t, one weight per expert in input order (a single value \
applies to every expert). The original method has no per-task weights (all 1); mergekit requires them.\n\
- normalize (default false): divide the weights by Σ_t w_t (mergekit's `normalize`, whose default \
for task arithmetic is also false). With normalize the weights must not sum to 0.\n\
Implementation: every tensor of every role is merged (the parameter-set policy is the host's); the \
result is computed in one fused pass as (1 − λ·Σ_t w'_t)·θ0 + Σ_t λ·w'_t·θ_t, which equals \
θ0 + λ·Σ_t w'_t·(θ_t − θ0) exactly in real arithmetic.";

/// The task-arithmetic method.
pub struct TaskArithmetic {
    /// Coefficients of the fused weighted sum: base first, then one per expert.
    coefficients: Vec<f64>,
}

impl MergeMethod for TaskArithmetic {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "task-arithmetic",
            name: "Task arithmetic",
            version: "",
            description: "Adds the scaled sum of task vectors (expert − base) to the base model.",
            help: HELP,
            capabilities: CAP_ELEMENTWISE | CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "lambda",
                    0.3,
                    "Scaling coefficient λ applied to the sum of task vectors.",
                ),
                ParamSpec::float("task_weights", 1.0, "Weight w_t of each expert's task vector.").per_task(),
                ParamSpec::bool("normalize", false, "Divide the task weights by their sum."),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (finite numbers, one weight per expert).
        let lambda = params.float("lambda")?;
        let mut weights = params.per_task("task_weights")?;
        if params.bool("normalize")? {
            let total: f64 = weights.iter().sum();
            if total.abs() < 1e-12 {
                return Err(Error::Message(format!(
                    "parameter 'task_weights' sums to {total}, so normalize=true would divide by 0; \
                     give weights whose sum is not 0 or set normalize=false"
                )));
            }
            for w in &mut weights {
                *w /= total;
            }
        }
        let mut coefficients = Vec::with_capacity(ctx.n_experts + 1);
        coefficients.push(1.0 - lambda * weights.iter().sum::<f64>());
        coefficients.extend(weights.iter().map(|w| lambda * w));
        Ok(TaskArithmetic { coefficients })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let all = input.base_and_experts("task-arithmetic")?;
        host.weighted_sum(&all, Some(&self.coefficients))
    }
}

mergescope_plugin_api::export_plugin!(TaskArithmetic);
