//! What the bert family's modules share without importing one another: the encoder
//! architectures (which also name the head layouts) and the model types it reads.

use mergescope_engine::error::EngineError;
use std::path::Path;

/// The `model_type`s of `config.json` the bert family reads.
pub const MODEL_TYPES: &[&str] = &["bert", "distilbert", "roberta", "xlm-roberta"];

/// The error for a `config.json` of a model type the bert family does not read.
pub(crate) fn unknown_model_type(path: &Path, model_type: &str) -> EngineError {
    EngineError::evaluator(format!(
        "'{}' is a '{model_type}' model; the bert family reads model_type \"bert\" (BERT, MiniLM and their fine-tunes), \"distilbert\", \"roberta\" and \"xlm-roberta\"; evaluate it with the suite of its own family",
        path.display()
    ))
}

/// An encoder architecture of the bert family (which also says which head layout it takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderKind {
    /// BERT and MiniLM.
    Bert,
    /// DistilBERT.
    DistilBert,
    /// RoBERTa and XLM-RoBERTa.
    Roberta,
}

impl std::fmt::Display for EncoderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EncoderKind::Bert => "BERT",
            EncoderKind::DistilBert => "DistilBERT",
            EncoderKind::Roberta => "RoBERTa",
        })
    }
}
