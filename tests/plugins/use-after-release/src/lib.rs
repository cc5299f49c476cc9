//! ABI test fixture: an SDK plugin that frees tensors early with `Host::release`.
//!
//! The `mode` parameter picks what it does with a released handle in `merge_tensor`:
//!
//! - `use`: makes `t = 2·expert₁`, releases `t`, then passes `t` to `affine`. The host must
//!   refuse the handle (naming it) and the merge must fail.
//! - `double`: releases `t` twice; the second release must fail, naming the handle.
//! - `return`: releases `t` and returns it as the result; the host must refuse the output.
//! - `ok`: the correct use: releases every input and every intermediate as soon as it is no
//!   longer needed and returns the mean of the experts, which must come out right.

use mergescope_plugin_api::{
    CreateContext, Descriptor, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
};

/// What to do with a released handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Use,
    Double,
    Return,
    Ok,
}

/// Releases tensors, then misuses them (or not) according to `mode`.
pub struct UseAfterRelease {
    mode: Mode,
}

impl MergeMethod for UseAfterRelease {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-use-after-release",
            name: "Fixture: use after release",
            version: "",
            description: "ABI test fixture that uses, re-releases or returns a released tensor handle.",
            help: "mode = use | double | return | ok; see the crate documentation.",
            capabilities: 0,
            params: vec![ParamSpec::choice(
                "mode",
                &["use", "double", "return", "ok"],
                "use",
                "What to do with a released handle.",
            )],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        let mode = match params.choice("mode")? {
            "use" => Mode::Use,
            "double" => Mode::Double,
            "return" => Mode::Return,
            "ok" => Mode::Ok,
            other => return Err(format!("unknown mode '{other}'").into()),
        };
        Ok(UseAfterRelease { mode })
    }

    fn merge_tensor(&mut self, h: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (base, ex) = (input.base, input.experts);
        let first = *ex.first().ok_or("no experts")?;
        match self.mode {
            Mode::Use => {
                let t = h.scale(first, 2.0)?;
                h.release(t)?;
                // Must fail: the host has freed `t`. A failing host call keeps the host's message.
                h.affine(t, 1.0, 0.0)
            }
            Mode::Double => {
                let t = h.scale(first, 2.0)?;
                h.release(t)?;
                h.release(t)?;
                Ok(t)
            }
            Mode::Return => {
                let t = h.scale(first, 2.0)?;
                h.release(t)?;
                Ok(t)
            }
            Mode::Ok => {
                // Input handles may be released too, once nothing needs them any more.
                if let Some(b) = base {
                    h.release(b)?;
                }
                let sum = h.weighted_sum(ex, None)?;
                for e in ex {
                    h.release(*e)?;
                }
                let mean = h.scale(sum, 1.0 / ex.len() as f64)?;
                h.release(sum)?;
                Ok(mean)
            }
        }
    }
}

mergescope_plugin_api::export_plugin!(UseAfterRelease);
