//! `consensus`: Consensus task arithmetic with TALL masks (Wang et al., 2024, "Localizing Task
//! Information for Improved Model Merging and Compression").
//!
//! τ_MTL = Σ_t τ_t; m_t = 1{|τ_t| ≥ λ_t·|τ_MTL − τ_t|}; keep = 1{Σ_t m_t ≥ min_tasks};
//! θ = θ0 + λ·Σ_t keep ⊙ τ_t = θ0 + λ·keep ⊙ τ_MTL. Every step is elementwise.

use mergescope_plugin_api::abi::{BINARY_GE, CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_THREAD_SAFE};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "Consensus merging with TALL masks (Wang et al., 2024). With task vectors τ_t = θ_t − θ0 \
(a base model is required) and the multi-task vector τ_MTL = Σ_t τ_t:\n\
1. TALL mask of task t: m_t = 1{|τ_t| ≥ λ_t·|τ_MTL − τ_t|} (the coordinate matters more to task t \
than to the rest of the tasks together, as scaled by λ_t);\n\
2. consensus mask: keep = 1{Σ_t m_t ≥ min_tasks} (weights important to at least min_tasks tasks; \
weights that are important to only one task are \"selfish\" and weights important to none are \
\"catastrophic\" and are both removed);\n\
3. θ = θ0 + λ·Σ_t keep ⊙ τ_t (= θ0 + λ·keep ⊙ τ_MTL: Consensus TA).\n\
Parameters:\n\
- tall_lambda (per task, default 0.4, ≥ 0): λ_t of the TALL mask. The paper tunes it per task on \
validation data; 0.4 is a mid-range default. Larger values give sparser masks.\n\
- min_tasks (default 2, ≥ 0): the consensus threshold k; 2 is the paper's choice. 0 keeps every \
coordinate (plain task arithmetic); 1 removes only the catastrophic weights.\n\
- lambda (default 0.3): the task-arithmetic scaling coefficient applied after masking (the TA \
default; the paper tunes it on validation data).\n\
All tensors of every role are masked and merged. A coordinate where every τ_t is 0 has m_t = 1 for \
all t (0 ≥ 0), which is harmless because it adds 0.";

/// The consensus (TALL-mask) method.
pub struct Consensus {
    tall_lambda: Vec<f64>,
    min_tasks: f64,
    lambda: f64,
}

impl MergeMethod for Consensus {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "consensus",
            name: "Consensus (TALL masks)",
            version: "",
            description: "Task arithmetic restricted to the weights that TALL masks mark important for several tasks.",
            help: HELP,
            capabilities: CAP_ELEMENTWISE | CAP_THREAD_SAFE | CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::float(
                    "tall_lambda",
                    0.4,
                    "λ_t of task t's TALL mask |τ_t| ≥ λ_t·|τ_MTL − τ_t|.",
                )
                .min(0.0)
                .per_task(),
                ParamSpec::int(
                    "min_tasks",
                    2,
                    "Keep a weight when at least this many TALL masks select it.",
                )
                .min(0.0),
                ParamSpec::float(
                    "lambda",
                    0.3,
                    "Scaling coefficient λ of the masked sum of task vectors.",
                ),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        // The host validated every value against the schema (λ_t ≥ 0 per expert, min_tasks ≥ 0,
        // λ finite).
        let tall_lambda = params.per_task("tall_lambda")?;
        let min_tasks = params.int("min_tasks")?;
        let lambda = params.float("lambda")?;
        Ok(Consensus {
            tall_lambda,
            min_tasks: min_tasks as f64,
            lambda,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let experts = input.experts;
        let base = input.require_base("consensus")?;
        let taus = experts.iter().map(|e| host.sub(*e, base)).collect::<Result<Vec<_>>>()?;
        let mtl = host.weighted_sum(&taus, None)?;
        let mut masks = Vec::with_capacity(taus.len());
        for (tau, lambda_t) in taus.iter().zip(&self.tall_lambda) {
            let rest = host.abs(host.sub(mtl, *tau)?)?;
            let rhs = host.scale(rest, *lambda_t)?;
            masks.push(host.binary(BINARY_GE, host.abs(*tau)?, rhs)?);
        }
        let votes = host.weighted_sum(&masks, None)?;
        let keep = host.compare_scalar(BINARY_GE, votes, self.min_tasks)?;
        let kept = host.mul(keep, mtl)?;
        host.weighted_sum(&[base, kept], Some(&[1.0, self.lambda]))
    }
}

mergescope_plugin_api::export_plugin!(Consensus);
