//! Errors of the engine. Every message says what went wrong, where (file, tensor, parameter)
//! and how to fix it, so the CLI and the GUI can show it as is.

use std::path::PathBuf;

/// An engine failure, with a user-facing message.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A file could not be read or written.
    #[error("{action} '{path}': {source}")]
    Io {
        /// What was being done ("cannot open", "cannot write").
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint file is not valid safetensors, or is truncated or corrupt.
    #[error("'{path}' is not a valid safetensors checkpoint: {reason}")]
    BadCheckpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An input (a checkpoint, an adapter, a tokenizer or configuration beside a model, a
    /// slice of one) cannot be used as given; the message names it and what to give instead.
    #[error("{message}")]
    Input {
        /// The input file or folder.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The inputs do not fit together (missing tensors, shape or dtype mismatches).
    #[error("the input checkpoints are incompatible:\n{0}")]
    Incompatible(String),
    /// A parameter is unknown, of the wrong type, or out of range.
    #[error("{0}")]
    Param(String),
    /// The plugin failed or returned a bad result.
    #[error("merge method '{plugin}' failed {place}: {message}", place = place_of(.tensor))]
    Plugin {
        /// Plugin id.
        plugin: String,
        /// Tensor name, or a step in parentheses such as "(create)".
        tensor: String,
        /// What went wrong.
        message: String,
    },
    /// An evaluation failed: its suite, task data, external command or model family.
    #[error("{0}")]
    Evaluator(String),
    /// A tensor operation of the host failed.
    #[error("tensor operation failed: {0}")]
    Tensor(String),
    /// The user cancelled the job; nothing was written.
    #[error("cancelled by the user; no output was written")]
    Cancelled,
    /// Fine-tuning produced a non-finite loss.
    #[error("training diverged at step {step} (loss {loss}): lower the learning rate ({lr})")]
    Diverged {
        /// The step (1-based) whose loss was not finite.
        step: usize,
        /// That loss.
        loss: f32,
        /// The learning rate of the run.
        lr: f64,
    },
    /// Any other invalid request (output path, options).
    #[error("{0}")]
    Invalid(String),
    /// A broken promise inside mergescope (a plan and the data it describes disagree): a bug,
    /// not the user's input. Nothing was written.
    #[error(
        "mergescope bug: {0}. Nothing was written. Please report it with the command you ran and the output of \
         `mergescope inspect` on each input"
    )]
    Bug(String),
}

/// What kind of failure an [`EngineError`] is, for callers that branch on it (the window
/// names it beside the run, tests check it); the message is the same whatever the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// An input file: unreadable as a checkpoint, unusable as given, or not fitting the others.
    Input,
    /// A method's parameter or an option.
    Parameter,
    /// A merge method's plugin failed or returned a bad result.
    Plugin,
    /// An evaluation failed.
    Evaluator,
    /// The user cancelled.
    Cancelled,
    /// A file could not be read or written.
    FileSystem,
    /// Anything else: an invalid request, a tensor operation, diverged training, a bug.
    Other,
}

impl ErrorKind {
    /// A short label: "input", "parameter", "plugin", "evaluator", "cancelled", "file system",
    /// "other".
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Input => "input",
            ErrorKind::Parameter => "parameter",
            ErrorKind::Plugin => "plugin",
            ErrorKind::Evaluator => "evaluator",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::FileSystem => "file system",
            ErrorKind::Other => "other",
        }
    }
}

impl EngineError {
    /// The kind of this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::BadCheckpoint { .. } | EngineError::Input { .. } | EngineError::Incompatible(_) => {
                ErrorKind::Input
            }
            EngineError::Param(_) => ErrorKind::Parameter,
            EngineError::Plugin { .. } => ErrorKind::Plugin,
            EngineError::Evaluator(_) => ErrorKind::Evaluator,
            EngineError::Cancelled => ErrorKind::Cancelled,
            EngineError::Io { .. } => ErrorKind::FileSystem,
            EngineError::Tensor(_) | EngineError::Diverged { .. } | EngineError::Invalid(_) | EngineError::Bug(_) => {
                ErrorKind::Other
            }
        }
    }

    /// An evaluation error with this message (it names the suite, task or file and the fix).
    pub fn evaluator(message: impl Into<String>) -> Self {
        EngineError::Evaluator(message.into())
    }

    /// An error on the input `path` with this message (it names the input and the fix).
    pub fn input(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        EngineError::Input {
            path: path.into(),
            message: message.into(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EngineError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// An invalid-request error with this message (it says what to fix).
    pub fn invalid(message: impl Into<String>) -> Self {
        EngineError::Invalid(message.into())
    }

    /// A bad-checkpoint error on `path`.
    pub fn bad(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        EngineError::BadCheckpoint {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Tensor(e.to_string())
    }
}

/// Result type of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// Where in a merge a plugin failed, as a phrase: "on tensor 'x'", or for a step in parentheses
/// ("(create)", "(end of statistics pass 0)") what that step is.
fn place_of(tensor: &str) -> String {
    match tensor.strip_prefix('(').and_then(|s| s.strip_suffix(')')) {
        Some("create") => "before merging (when it checked the inputs and parameters)".to_owned(),
        Some(step) => format!("at {step}"),
        None => format!("on tensor '{tensor}'"),
    }
}
