//! Test fixture: a method whose `merge_tensor` writes through a null pointer, so the process
//! dies with SIGSEGV (no panic to catch), as a buggy native plugin would.

use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};

/// Crashes on the first tensor.
pub struct Segfault;

impl MergeMethod for Segfault {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-segfault",
            name: "Fixture: segfault",
            version: "",
            description: "Test fixture: kills the process on the first tensor.",
            help: "Writes through a null pointer in merge_tensor.",
            capabilities: 0,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Segfault)
    }

    fn merge_tensor(&mut self, _host: &Host<'_>, _input: &TensorInput<'_>) -> Result<Tensor> {
        // SAFETY: not safe at all, on purpose: this fixture exists to crash its host.
        unsafe { std::ptr::null_mut::<u8>().write_volatile(1) };
        Err("unreachable: the write above kills the process".into())
    }
}

mergescope_plugin_api::export_plugin!(Segfault);
