//! Numerical core of the analysis views: Gram matrices of checkpoints and trajectory iterates
//! ([`gram`]), read from files tensor by tensor ([`points`]).

pub mod gram;
pub mod points;

pub use gram::{Gram, Projection};
pub use points::{PointSet, gram_of_files};
