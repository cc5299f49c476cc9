//! The text benchmark (issue #23): a task suite on a real pretrained transformer,
//! all-MiniLM-L6-v2, with five text-classification tasks from registry-shipped data
//! ([`data`]), linear-probe heads, and one fine-tuned expert per task ([`build`]: full
//! fine-tuning, or LoRA ([`lora`])),
//! written as a `bert` suite that `eval`, `merge --eval` and `compare` read; [`oracle`] checks
//! seed 004's task-vectors-as-gradients identity on it.

pub mod build;
pub mod data;
pub mod lora;
pub mod options;
pub mod tiny;

pub use build::{TextBenchmark, TextManifest, TextRecipe, build_text, text_demo_dir};
pub use data::{TextSplit, TextTask, builtin_tasks};
pub use lora::{FineTuning, LoraRecipe};
pub use options::{TextBuild, TextBuildPlan, TextBuildRequest};

/// Seed 004's oracle on this benchmark: task arithmetic of full-batch gradient-descent task
/// vectors against multi-task gradient descent.
pub mod oracle;
pub use oracle::{OracleReport, OracleSettings, run_oracle};
