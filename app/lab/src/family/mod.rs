//! Real model families as Hugging Face saves them (`config.json`, `model.safetensors` or a
//! sharded index, `tokenizer.json`), run with candle-transformers: [`hf`] finds and reads
//! those files, [`bert`] is the BERT family (BERT, MiniLM) for sequence classification, and
//! [`text_data`] reads the text-classification data its tasks are scored on.

pub mod bert;
pub mod hf;
pub mod text_data;
