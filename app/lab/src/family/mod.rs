//! Real model families as Hugging Face saves them (`config.json`, `model.safetensors` or a
//! sharded index, `tokenizer.json`), run with candle-transformers: [`hf`] finds and reads
//! those files, the bert family of encoders for sequence classification with [`text_data`]
//! ([`encoder`] dispatching on the model type to [`bert`] (BERT, MiniLM), [`distilbert`] and
//! [`roberta`] (RoBERTa, XLM-RoBERTa), each with its [`head`] layout), and [`clip`] the CLIP
//! family for zero-shot image classification with [`image_data`]; [`causal_lm`] runs causal
//! LMs (Llama, Mistral, Qwen2 and [`gpt2`]).

pub mod bert;
pub mod causal_lm;
pub mod clip;
pub mod distilbert;
pub mod encoder;
pub mod gpt2;
pub mod head;
pub mod hf;
pub mod image_data;
pub mod kind;
pub mod roberta;
pub mod text_data;
