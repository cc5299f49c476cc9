//! ABI test fixture: a valid header and a v1 entry that returns null (a plugin that failed to
//! initialise).

use mergescope_plugin_api::abi::{ABI_MAJOR, ABI_MINOR, MAGIC, PluginApiV1, PluginHeader};

/// The plugin's static header (valid).
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: ABI_MAJOR,
    abi_minor: ABI_MINOR,
};

/// The v1 entry, returning null.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    std::ptr::null()
}
