//! mergescope's studies: what merges are compared and analysed with, on top of the lab's
//! evaluators and merge door.
//!
//! - [`compare`]: results tables (every method on a benchmark's or a suite's models, λ chosen on
//!   calibration accuracy, test evaluation).
//! - [`analysis`]: the analyses and their figures (PCA, cosine, spectra, radar, landscapes).
//! - [`search`]: CMA-ES and the coefficient search, candidates merged through the lab's merge
//!   door and scored by any evaluator.
//! - [`scaling`]: the fine-tuning sweeps and the scaling laws fitted over them.
//! - [`grid`]: grids of independent cells, run locally or as one Slurm array job.

pub mod analysis;
pub mod compare;
pub mod grid;
pub mod scaling;
pub mod search;

pub use mergescope_engine::{EngineError, Result};
