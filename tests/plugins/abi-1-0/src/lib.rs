//! ABI test fixture: a per-tensor plugin as built against ABI 1.0, whose header says 1.0 and
//! whose table ends at `instance_capabilities` (no `run_model`). A 1.1 host must load and run it
//! without reading past its table.

use mergescope_plugin_api::abi::{ABI_MAJOR, MAGIC, PLUGIN_API_V1_MIN_SIZE, PluginApiV1, PluginHeader};
use mergescope_plugin_api::sdk::{StaticTable, build_table};
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};
use std::sync::OnceLock;

/// The plugin's static header: ABI 1.0.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: ABI_MAJOR,
    abi_minor: 0,
};

struct Tables {
    _full: StaticTable,
    v1_0: PluginApiV1,
}

/// The v1 entry: the table as a 1.0 plugin knows it (its `run_model` slot is garbage-free
/// null here, but its struct_size says the field does not exist).
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    let t = TABLES.get_or_init(|| {
        let full = build_table::<First>(env!("CARGO_PKG_VERSION"));
        // The copy's strings point into `full`'s buffers, which live in the same static.
        let v1_0 = PluginApiV1 {
            struct_size: PLUGIN_API_V1_MIN_SIZE,
            ..full.api
        };
        Tables { _full: full, v1_0 }
    });
    &t.v1_0
}

/// Returns the first expert.
pub struct First;

impl MergeMethod for First {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-abi-1-0",
            name: "Fixture: ABI 1.0 plugin",
            version: "",
            description: "ABI test fixture built for ABI 1.0.",
            help: "Returns the first expert.",
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
