//! Host extensions (ABI 1.2; `random.v2` since 1.3, `views.v1` since 1.4): optional tables a plugin looks up by id with
//! `HostApiV1::get_extension`. The method-specific fused operations live here rather than in the
//! core table (which keeps its copies of them only for 1.0/1.1 plugins), and so do the worker
//! threads the host lends to plugins.

pub mod linalg;
pub mod parallel;
pub mod random;
pub mod sign_consensus;
pub mod views;

use mergescope_plugin_api::abi;
use std::ffi::c_void;

/// The static table of the extension `id`, or null when the host has none by that id.
pub(crate) fn lookup(id: &str) -> *const c_void {
    match id {
        abi::HOST_EXT_SIGN_CONSENSUS_V1 => std::ptr::from_ref(&sign_consensus::TABLE).cast(),
        abi::HOST_EXT_RANDOM_V1 => std::ptr::from_ref(&random::TABLE).cast(),
        abi::HOST_EXT_RANDOM_V2 => std::ptr::from_ref(&random::TABLE_V2).cast(),
        abi::HOST_EXT_LINALG_V1 => std::ptr::from_ref(&linalg::TABLE).cast(),
        abi::HOST_EXT_PARALLEL_V1 => std::ptr::from_ref(&parallel::TABLE).cast(),
        abi::HOST_EXT_VIEWS_V1 => std::ptr::from_ref(&views::TABLE).cast(),
        _ => std::ptr::null(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_extension_id_gives_its_table_and_others_give_null() {
        for id in [
            abi::HOST_EXT_SIGN_CONSENSUS_V1,
            abi::HOST_EXT_RANDOM_V1,
            abi::HOST_EXT_RANDOM_V2,
            abi::HOST_EXT_LINALG_V1,
            abi::HOST_EXT_PARALLEL_V1,
            abi::HOST_EXT_VIEWS_V1,
        ] {
            assert!(!lookup(id).is_null(), "{id}");
        }
        assert!(lookup("mergescope.host.sign-consensus.v2").is_null());
        assert!(lookup("mergescope.host.random.v3").is_null());
        assert!(lookup("").is_null());
    }
}
