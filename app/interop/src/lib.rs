//! The model ecosystem's formats, read and written around mergescope's engine, which knows
//! nothing of them beyond safetensors.
//!
//! - [`request`]: merge requests by path as the CLI, the window and recipes describe them,
//!   opened and handed to the engine's one merge.
//! - [`recipe`]: the TOML recipe that the window saves and the CLI runs.
//! - [`mergekit`]: mergekit YAML configurations read as recipes; [`slices`]: models built from
//!   layer ranges of several models (mergekit's `slices` and `modules`).
//! - [`lora`]: PEFT LoRA adapters applied to their base as merge inputs, and LoRA extraction.
//! - [`hf_folder`]: Hugging Face model folders as outputs (config, tokenizer, model card);
//!   [`tokenizer_union`]: inputs with different tokenizers merged into one vocabulary;
//!   [`chat_templates`]: the named chat templates.

pub mod chat_templates;
pub mod hf_folder;
pub mod lora;
pub mod mergekit;
pub mod recipe;
pub mod request;
pub mod slices;
pub mod tokenizer_union;
