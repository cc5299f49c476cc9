//! ABI test fixture: a per-tensor plugin whose table has a NULL `merge_tensor`, which C allows
//! and the Rust table type cannot express. The table is kept as raw words so that no Rust value
//! ever holds the null function pointer; the host must refuse the library when loading it.

use mergescope_plugin_api::abi::{ABI_MAJOR, ABI_MINOR, MAGIC, PluginApiV1, PluginHeader};
use mergescope_plugin_api::sdk::{StaticTable, build_table};
use mergescope_plugin_api::{CreateContext, Descriptor, Host, MergeMethod, Params, Result, Tensor, TensorInput};
use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

/// The plugin's static header.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: ABI_MAJOR,
    abi_minor: ABI_MINOR,
};

const WORDS: usize = size_of::<PluginApiV1>().div_ceil(size_of::<usize>());

struct Tables {
    _full: StaticTable,
    raw: [usize; WORDS],
}

/// The v1 entry: the SDK's table with its `merge_tensor` slot zeroed.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    let t = TABLES.get_or_init(|| {
        let full = build_table::<First>(env!("CARGO_PKG_VERSION"));
        let mut raw = [0usize; WORDS];
        // SAFETY: copies the table's bytes into a buffer at least as large and as aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const full.api).cast::<u8>(),
                raw.as_mut_ptr().cast::<u8>(),
                size_of::<PluginApiV1>(),
            );
        }
        raw[offset_of!(PluginApiV1, merge_tensor) / size_of::<usize>()] = 0;
        Tables { _full: full, raw }
    });
    t.raw.as_ptr().cast()
}

/// Would return the first expert, if the host could call it.
pub struct First;

impl MergeMethod for First {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-null-merge",
            name: "Fixture: NULL merge_tensor",
            version: "",
            description: "ABI test fixture whose table lacks merge_tensor.",
            help: "Never runs.",
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
