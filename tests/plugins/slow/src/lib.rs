//! Test fixture: the mean of the experts, computed slowly (`delay_ms` of sleep per tensor, in
//! 10 ms slices that check for cancellation), so tests can watch a run in progress and
//! cancel it.

use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};
use std::time::Duration;

/// Slow averaging.
pub struct Slow {
    delay_ms: u64,
}

impl MergeMethod for Slow {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-slow",
            name: "Fixture: slow average",
            version: "",
            description: "Test fixture: the experts' mean, with a sleep per tensor.",
            help: "Sleeps delay_ms per tensor (checking for cancellation), then averages the experts.",
            capabilities: 0,
            params: vec![ParamSpec::int("delay_ms", 300, "Sleep per tensor, in milliseconds.").min(0.0)],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Slow {
            delay_ms: u64::try_from(params.int("delay_ms")?).unwrap_or(0),
        })
    }

    fn merge_tensor(&mut self, h: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let ex = input.experts;
        for _ in 0..self.delay_ms.div_ceil(10) {
            h.check_cancelled()?;
            std::thread::sleep(Duration::from_millis(10));
        }
        let n = ex.len().max(1) as f64;
        let w = vec![1.0 / n; ex.len()];
        h.weighted_sum(ex, Some(&w))
    }
}

mergescope_plugin_api::export_plugin!(Slow);
