//! Real model families as Hugging Face saves them (`config.json`, `model.safetensors` or a
//! sharded index, `tokenizer.json`), run with candle-transformers: [`hf`] finds and reads
//! those files, [`bert`] is the BERT family (BERT, MiniLM) for sequence classification with
//! [`text_data`], and [`clip`] the CLIP family for zero-shot image classification with
//! [`image_data`].

pub mod bert;
pub mod causal_lm;
pub mod clip;
pub mod hf;
pub mod image_data;
pub mod text_data;
