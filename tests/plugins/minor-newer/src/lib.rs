//! ABI test fixture: a plugin built for ABI 1.99, newer than the host's 1.0 (it could use table
//! fields the host does not have), otherwise valid. The host must refuse it.

use mergescope_plugin_api::abi::{ABI_MAJOR, MAGIC, PluginApiV1, PluginHeader};
use mergescope_plugin_api::sdk::{StaticTable, build_table};
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};
use std::sync::OnceLock;

/// The plugin's static header: ABI 1.99.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: ABI_MAJOR,
    abi_minor: 99,
};

/// A valid v1 entry.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    static TABLE: OnceLock<StaticTable> = OnceLock::new();
    &TABLE
        .get_or_init(|| build_table::<First>(env!("CARGO_PKG_VERSION")))
        .api
}

/// Returns the first expert.
pub struct First;

impl MergeMethod for First {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-minor-newer",
            name: "Fixture: newer minor",
            version: "",
            description: "ABI test fixture built for ABI 1.99.",
            help: "Never loads into a 1.0 host.",
            capabilities: 0,
            params: Vec::new(),
        }
    }

    fn create(_host: &Host<'_>, _params: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(First)
    }

    fn merge_tensor(&mut self, _h: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let ex = input.experts;
        ex.first().copied().ok_or_else(|| "no experts".into())
    }
}
