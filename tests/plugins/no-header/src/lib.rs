//! ABI test fixture: a library that exports a v1 entry function but no
//! `mergescope_plugin_header`. The host reads the header first, so it must refuse the library as
//! "not a mergescope plugin" without calling the entry.

use mergescope_plugin_api::abi::PluginApiV1;

/// An entry without a header; never called by a correct host.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    std::ptr::null()
}
