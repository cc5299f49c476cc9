//! ABI test fixture: a plugin that is valid except for its header magic (`b"NOTMERGE"`).
//! The host must refuse it as "not a mergescope plugin" before calling anything.

use mergescope_plugin_api::abi::{ABI_MAJOR, ABI_MINOR, PluginApiV1, PluginHeader};
use mergescope_plugin_api::sdk::{StaticTable, build_table};
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};
use std::sync::OnceLock;

/// The plugin's static header, with the wrong magic.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: *b"NOTMERGE",
    abi_major: ABI_MAJOR,
    abi_minor: ABI_MINOR,
};

/// A valid v1 entry: only the magic is wrong.
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
            id: "mstest-wrong-magic",
            name: "Fixture: wrong magic",
            version: "",
            description: "ABI test fixture whose header magic is wrong.",
            help: "Never loads.",
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
