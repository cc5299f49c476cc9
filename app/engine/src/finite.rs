//! Merges refuse non-finite weights: the check, and the error that names the input holding one.

use crate::error::EngineError;

/// The first non-finite value of `values` and its index. Every input value of a merge passes
/// here, so the common case is one branch-free pass the compiler vectorises; the position is
/// searched only when there is one.
pub fn first_non_finite(values: &[f32]) -> Option<(usize, f32)> {
    // |v| ≤ f32::MAX holds exactly for the finite values (NaN compares false): the same
    // block-wise pass the writer's range check uses.
    if crate::dtype::all_within(values, f32::MAX) {
        return None;
    }
    values.iter().position(|v| !v.is_finite()).map(|i| (i, values[i]))
}

/// The error for an input holding NaN or Inf: it names the file, the tensor and the element.
pub fn non_finite_input(input: &str, tensor: &str, index: usize, value: f32) -> EngineError {
    EngineError::Invalid(format!(
        "input '{input}' holds {value} in tensor '{tensor}' (element {index}); merging it would write non-finite \
             weights: repair that checkpoint, or leave it out of the merge"
    ))
}

/// The error for a method that wrote a non-finite value although every input is finite (the
/// inputs are checked first): it names the plugin, the tensor and the element.
pub fn non_finite_output(plugin: &str, tensor: &str, index: usize, value: f32) -> EngineError {
    EngineError::Plugin {
        plugin: plugin.to_owned(),
        tensor: tensor.to_owned(),
        message: format!(
            "it produced a non-finite value ({value}) at element {index} although every input is finite; check the \
                 parameters (a division by a zero norm, a step size too large, an overflow) or report the bug to the \
                 plugin's author"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::first_non_finite;

    #[test]
    fn finds_the_first_nan_or_inf_at_any_position() {
        let mut v = vec![1.5f32; 10_000];
        assert_eq!(first_non_finite(&v), None);
        v[9_999] = f32::INFINITY;
        assert_eq!(first_non_finite(&v), Some((9_999, f32::INFINITY)));
        v[4_097] = f32::NEG_INFINITY;
        assert_eq!(first_non_finite(&v), Some((4_097, f32::NEG_INFINITY)));
        v[3] = f32::NAN;
        assert!(matches!(first_non_finite(&v), Some((3, x)) if x.is_nan()));
        assert_eq!(first_non_finite(&[]), None);
        assert_eq!(first_non_finite(&[f32::MAX, f32::MIN, 0.0]), None);
    }
}
