//! `nearswap`: mergekit's NearSwap (`merge_methods/nearswap.py`). Per element, the base θ_0
//! moves towards the one expert θ_1 by w = clamp(t / max(|θ_0 − θ_1|, 1e-6), 0, 1): elements
//! where the two are within t of each other take the expert's value, far ones keep the base's.

use mergescope_plugin_api::abi::{CAP_ELEMENTWISE, CAP_NEEDS_BASE, CAP_ONE_EXPERT, CAP_THREAD_SAFE};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

const HELP: &str = "NearSwap (mergekit's `nearswap`, after alchemonaut's QuartetAnemoi): per element, \
θ = w·θ_1 + (1 − w)·θ_0 with w = clamp(t / max(|θ_0 − θ_1|, 1e-6), 0, 1). Where the base θ_0 and the \
expert θ_1 differ by at most t, the expert's value is taken; the further apart, the more the base's \
is kept. Exactly one expert and the base.\n\
Parameters:\n\
- t (required, ≥ 0): the distance scale. The reference merge used t = 0.0001; t = 0 keeps the base, \
a large t takes the expert.\n\
Computed in f32 in mergekit's order of operations.";

/// The NearSwap method.
pub struct NearSwap {
    t: f32,
}

/// NearSwap of one element: the base `a` moved towards the expert `b`.
fn near_swap(a: f32, b: f32, t: f32) -> f32 {
    let w = (t / (a - b).abs().max(1e-6)).clamp(0.0, 1.0);
    w * b + (1.0 - w) * a
}

impl MergeMethod for NearSwap {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "nearswap",
            name: "NearSwap",
            version: "",
            description: "Takes the expert's value where it is near the base's (within t), else keeps the base.",
            help: HELP,
            capabilities: CAP_ELEMENTWISE | CAP_THREAD_SAFE | CAP_NEEDS_BASE | CAP_ONE_EXPERT,
            params: vec![
                ParamSpec::float("t", 0.0001, "Distance within which the expert's value is taken")
                    .min(0.0)
                    .required(),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(NearSwap {
            t: params.float("t")? as f32,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let base = input.require_base("nearswap")?;
        let shape = host.shape(base)?;
        let a = host.view_f32(base)?;
        let b = host.view_f32(input.experts[0])?;
        let out: Vec<f32> = a.iter().zip(b.iter()).map(|(a, b)| near_swap(*a, *b, self.t)).collect();
        host.from_f32(&out, &shape)
    }
}

mergescope_plugin_api::export_plugin!(NearSwap);

#[cfg(test)]
mod tests {
    use super::near_swap;

    #[test]
    fn near_elements_take_the_expert_and_far_ones_keep_the_base() {
        // |a − b| = 0.5 ≤ t = 1: w = 1, the expert's value.
        assert_eq!(near_swap(1.0, 1.5, 1.0), 1.5);
        // |a − b| = 4, t = 1: w = 0.25, 0.25·5 + 0.75·1 = 2.
        assert_eq!(near_swap(1.0, 5.0, 1.0), 2.0);
        // Equal values: the clamp at 1e-6 keeps w finite (w = 1).
        assert_eq!(near_swap(2.0, 2.0, 0.5), 2.0);
        // t = 0 keeps the base.
        assert_eq!(near_swap(-3.0, 7.0, 0.0), -3.0);
    }
}
