//! mergescope's lab: the networks, data, training and evaluation that the core's merges are
//! studied with, on top of `mergescope-engine`.
//!
//! - [`nn`], [`data`], [`train`]: the demo backbones and heads (candle-nn), the image tasks,
//!   SGD/AdamW training.
//! - [`evaluator`]: the one evaluation door (the `Evaluator` trait, the demo benchmark's and an
//!   external command's, suites, and the differentiable calibration side), chosen by
//!   [`evaluate::open`]; [`demo`]: cached benchmark builds; [`text_bench`]: the text benchmark
//!   on a pretrained MiniLM (five registry-shipped text tasks, fine-tuned experts, a suite).
//! - [`session`]: the host side of model-level methods (ABI 1.1) over a benchmark's tasks;
//!   [`model_merge`]: such merges of checkpoint files, with their trajectories.
//! - [`run`]: the one merge door (per-tensor or model-level by the plugin's kind).
//!
//! Results tables, analyses, searches, sweeps and grids built on these live in
//! `mergescope-studies`.

pub mod data;
pub mod demo;
pub mod evaluate;
pub mod evaluator;
pub mod family;
pub mod model_merge;
pub mod nn;
pub mod run;
pub mod session;
pub mod text_bench;
pub mod train;

pub use mergescope_engine::{EngineError, Result};
