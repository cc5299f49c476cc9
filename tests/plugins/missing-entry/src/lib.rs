//! ABI test fixture: a valid header but no `mergescope_plugin_entry_v1` symbol.

use mergescope_plugin_api::abi::{ABI_MAJOR, ABI_MINOR, MAGIC, PluginHeader};

/// The plugin's static header (valid).
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: ABI_MAJOR,
    abi_minor: ABI_MINOR,
};

/// A misspelt entry point: the host must not find it.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry() -> *const std::ffi::c_void {
    std::ptr::null()
}
