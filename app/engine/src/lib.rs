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
//! - [`hf_folder`]: Hugging Face model folders as outputs (config, tokenizer, model card).
//! - [`recipe`]: the TOML recipe that the GUI saves and the CLI runs; [`layered`]: layer-wise
//!   and filtered parameter values resolved per tensor.
//! - [`lora`]: PEFT LoRA adapters applied to their base as merge inputs, and LoRA extraction.
//! - [`mergekit`]: mergekit YAML configurations read as recipes; [`slices`]: models built from
//!   layer ranges of several models (mergekit's `slices`).
//! - [`synthetic`]: synthetic LLM-shaped checkpoints for `mergescope bench`.

pub mod chat_templates;
pub mod checkpoint;
pub mod compat;
pub mod device;
mod direct_write;
pub mod dtype;
pub mod error;
pub mod executor;
pub mod finite;
pub mod hf_folder;
pub mod layered;
pub mod lora;
pub mod mapped_read;
pub mod merge;
pub mod mergekit;
pub mod plugin;
pub mod recipe;
pub mod rng;
pub mod role;
pub mod slices;
pub mod synthetic;
pub mod sys;
pub mod tokenizer_union;
pub mod writer;

pub use error::{EngineError, Result};
