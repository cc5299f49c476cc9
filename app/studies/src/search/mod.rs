//! Gradient-free searches over merge coefficients: [`cmaes`] is the optimiser, [`coefficients`]
//! searches a method's numeric parameters (per task, or as layer gradients) scored by any
//! evaluator on calibration data.

pub mod cmaes;
pub mod coefficients;
