//! The generalisation framework of seed 002, as numbers: shape fits of the scaling laws
//! ([`fit`]), effective task weights and the excess-risk bound calculator ([`bound`]), and the
//! checkpoint-only heterogeneity proxy with its reduction under TIES/DARE masks
//! ([`heterogeneity`]), σ²/ζ² from calibration gradients ([`estimate`]), their figures
//! ([`views`]), and the fine-tuning sweeps that measure the laws ([`sweep`]).

pub mod bound;
pub mod estimate;
pub mod fit;
pub mod heterogeneity;
pub mod sweep;
pub mod views;
