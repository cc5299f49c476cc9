//! mergescope's plugin interface.
//!
//! - [`abi`]: the stable C ABI v1 (`#[repr(C)]` tables, constants, symbol names), mirrored in
//!   `include/mergescope_plugin.h`. No dependencies, so any language with a C FFI can implement
//!   or host it.
//! - [`sdk`]: a safe Rust layer for plugin authors: implement [`sdk::MergeMethod`] and call
//!   [`export_plugin!`]. Panics never cross the boundary.
//! - [`model`]: the same for model-level methods (ABI 1.1): implement [`model::ModelMethod`]
//!   against a [`model::Session`] and call [`export_model_plugin!`].
//!
//! See `plugin-api/README.md` for a step-by-step guide in Rust and in C.

pub mod abi;
pub mod model;
pub mod sdk;

pub use sdk::{
    Choice, CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput,
    TensorMeta,
};
