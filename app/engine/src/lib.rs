//! mergescope's engine: everything but the UI.
//!
//! - [`checkpoint`]: safetensors files and sharded folders, read through memory maps.
//! - [`plugin`]: discovery, approval, loading and validation of method plugins, and the host
//!   tensor table (over candle) they call back into.
//! - [`merge`] / [`executor`]: validated merge requests streamed tensor by tensor on worker
//!   threads inside a memory budget, written atomically by [`writer`].
//! - [`model_merge`]: model-level methods (ABI 1.1) run once over whole models in a session on a
//!   benchmark's tasks, with their trajectories.
//! - [`data`]: image-classification tasks (the demo benchmark's data) read from safetensors.
//! - [`recipe`]: the TOML recipe that the GUI saves and the CLI runs.
//! - [`bench`]: synthetic LLM-shaped checkpoints for the throughput benchmark.

pub mod analysis;
pub mod bench;
pub mod checkpoint;
pub mod compare;
pub mod compat;
pub mod data;
pub mod demo;
pub mod device;
pub mod dtype;
pub mod error;
pub mod eval;
pub mod executor;
mod finite;
pub mod merge;
pub mod model_merge;
pub mod nn;
pub mod plugin;
pub mod recipe;
pub mod rng;
pub mod role;
pub mod run;
pub mod scaling;
pub mod sys;
pub mod train;
pub mod writer;

pub use error::{EngineError, Result};
