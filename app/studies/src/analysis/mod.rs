//! Numerical core of the analysis views: Gram matrices of checkpoints and trajectory iterates
//! ([`gram`]), read from files tensor by tensor ([`points`]); spectra and CART's rank curves
//! of task matrices ([`spectrum`]); loss landscapes over lines and planes of parameters
//! ([`landscape`]).

pub mod gram;
pub mod landscape;
pub mod landscape_run;
pub mod points;
pub mod spectrum;
pub mod views;

pub use gram::{Gram, Projection};
pub use points::{PointSet, checkpoint_label, gram_of_files, read_iterates};
