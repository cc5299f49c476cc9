//! The role of a tensor in a network (matrix, embedding, norm, vector, convolution), read from
//! its name and shape: what the executor and the model-level session tell plugins about each
//! tensor.

use mergescope_plugin_api::abi;

/// Role of a tensor from its name and shape.
pub fn role_of(name: &str, shape: &[usize]) -> abi::TensorRole {
    let lower = name.to_ascii_lowercase();
    let is_norm = lower
        .split('.')
        .any(|seg| seg.contains("norm") || seg == "ln" || seg.starts_with("ln_") || seg.starts_with("bn"));
    match shape.len() {
        0 => abi::ROLE_OTHER,
        1 if is_norm => abi::ROLE_NORM,
        1 => abi::ROLE_VECTOR,
        2 if lower.contains("embed") || lower.contains("wte") || lower.contains("wpe") => abi::ROLE_EMBEDDING,
        2 => abi::ROLE_MATRIX,
        _ => abi::ROLE_CONV,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_from_names() {
        assert_eq!(role_of("model.layers.0.mlp.up_proj.weight", &[8, 4]), abi::ROLE_MATRIX);
        assert_eq!(role_of("model.embed_tokens.weight", &[100, 4]), abi::ROLE_EMBEDDING);
        assert_eq!(role_of("model.layers.0.input_layernorm.weight", &[4]), abi::ROLE_NORM);
        assert_eq!(role_of("fc.bias", &[4]), abi::ROLE_VECTOR);
        assert_eq!(role_of("blocks.0.ln.weight", &[4]), abi::ROLE_NORM);
        assert_eq!(role_of("transformer.ln_f.bias", &[4]), abi::ROLE_NORM);
        assert_eq!(role_of("conv1.weight", &[8, 3, 3, 3]), abi::ROLE_CONV);
        assert_eq!(role_of("scale", &[]), abi::ROLE_OTHER);
    }
}
