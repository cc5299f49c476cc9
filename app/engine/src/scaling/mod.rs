//! The generalisation framework of seed 002, as numbers: shape fits of the scaling laws
//! ([`fit`]), effective task weights and the excess-risk bound calculator ([`bound`]), and the
//! checkpoint-only heterogeneity proxy with its reduction under TIES/DARE masks
//! ([`heterogeneity`]), and the fine-tuning sweeps that measure the laws ([`sweep`]).

pub mod bound;
pub mod fit;
pub mod heterogeneity;
pub mod sweep;
