//! ABI test fixture: a plugin built for ABI 2.0. Its header says 2.0 and, as the versioning
//! rules require after a major bump, it exports only `mergescope_plugin_entry_v2`, so a v1 host
//! must refuse it from the header alone, naming both versions.

use mergescope_plugin_api::abi::{MAGIC, PluginHeader};
use std::ffi::c_void;

/// The plugin's static header: ABI 2.0.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: 2,
    abi_minor: 0,
};

/// The entry of the (imaginary) ABI 2: a layout no v1 host knows. Returns null.
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v2() -> *const c_void {
    std::ptr::null()
}
