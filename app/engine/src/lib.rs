//! mergescope's core: merging checkpoint files, with no knowledge of neural networks or
//! training (those live in `mergescope-lab`).
//!
//! - [`checkpoint`]: safetensors files and sharded folders, read with positioned reads (bf16
//!   and f16 ranges decoded straight from a short-lived memory map, [`mapped_read`]).
//! - [`plugin`]: discovery, approval, loading and validation of method plugins, the host
//!   tensor table (over candle) they call back into, and their instances.
//! - [`merge`] / [`executor`]: validated merge requests streamed tensor by tensor on worker
//!   threads inside a memory budget, written atomically by [`writer`].
//! - [`compat`], [`dtype`], [`role`]: input compatibility, dtypes, tensor roles.
//! - [`layered`]: layer-wise and filtered parameter values resolved per tensor.
//! - [`synthetic`]: synthetic LLM-shaped checkpoints for `mergescope bench`.
//!
//! Other tools' formats (merge requests by path, recipes, mergekit YAML, slices, LoRA, Hugging
//! Face folders and tokenizers) live in `mergescope-interop`, on top of this crate.

pub mod checkpoint;
pub mod compat;
pub mod conformance;
pub mod device;
mod direct_write;
pub mod dtype;
pub mod error;
pub mod executor;
pub mod finite;
pub mod layered;
pub mod mapped_read;
pub mod merge;
pub mod plugin;
pub mod rng;
pub mod role;
pub mod synthetic;
pub mod sys;
pub mod writer;

pub use error::{EngineError, Result};
