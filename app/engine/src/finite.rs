//! Merges refuse non-finite weights: the check, and the error that names the input holding one.

use crate::error::EngineError;

/// The first non-finite value of `values` and its index.
pub fn first_non_finite(values: &[f32]) -> Option<(usize, f32)> {
    values.iter().position(|v| !v.is_finite()).map(|i| (i, values[i]))
}

/// The error for an input holding NaN or Inf: it names the file, the tensor and the element.
pub fn non_finite_input(input: &str, tensor: &str, index: usize, value: f32) -> EngineError {
    EngineError::Invalid(format!(
        "input '{input}' holds {value} in tensor '{tensor}' (element {index}); merging it would write non-finite \
         weights: repair that checkpoint, or leave it out of the merge"
    ))
}
