//! ABI test fixture: a valid header and entry, but the returned table's `struct_size` is 16,
//! far below the v1.0 minimum. The host must refuse it without reading past those 16 bytes.

use mergescope_plugin_api::abi::{ABI_MAJOR, ABI_MINOR, MAGIC, PluginApiV1, PluginHeader};
use mergescope_plugin_api::sdk::{StaticTable, build_table};
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};
use std::sync::OnceLock;

/// The plugin's static header (valid).
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: ABI_MAJOR,
    abi_minor: ABI_MINOR,
};

struct Tables {
    _full: StaticTable,
    short: PluginApiV1,
}

/// The v1 entry: a complete table that claims to be 16 bytes long.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    let t = TABLES.get_or_init(|| {
        let full = build_table::<First>(env!("CARGO_PKG_VERSION"));
        // The copy's strings point into `full`'s buffers, which live in the same static.
        let short = PluginApiV1 {
            struct_size: 16,
            ..full.api
        };
        Tables { _full: full, short }
    });
    &t.short
}

/// Returns the first expert.
pub struct First;

impl MergeMethod for First {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-short-table",
            name: "Fixture: short table",
            version: "",
            description: "ABI test fixture whose table is too short.",
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
