//! mergescope's end-to-end tests, in one binary: one link of the engine and candle instead of
//! one per file, which keeps a clean build's time and disk use down. `golden_cart` and
//! `golden_dare` are binaries of their own: they link their plugin's rlib for its helpers, and
//! two plugin rlibs in one binary would export the plugin entry symbol twice.

mod abi_compat;
mod abi_failures;
mod abi_header_sync;
mod abi_host_ops;
mod demo_regime;
mod engine_merge;
mod families;
mod families_encoders;
mod fuzz_replay;
mod golden_consensus;
mod golden_della;
mod golden_fusionbench;
mod golden_mergekit_frontier;
mod golden_mergekit_methods;
mod golden_slerp_model_stock;
mod golden_task_arithmetic;
mod golden_ties;
mod golden_weight_average;
mod lora;
mod mergekit_lora_slices;
mod mergekit_parity;
mod mergekit_slices;
mod mergekit_tokenizer;
mod mergekit_yaml;
mod model_level;
mod model_level_lm;
mod oracle_task_vectors;
mod plugin_conformance;
