//! Models: GGUF reading, tokenizers (byte-level BPE, `gpt2`; SentencePiece, `llama`, in
//! `tokenizer_spm`), chat templates, fetching the known models, the transformer skeleton and its
//! families (Llama, Gemma 3, Qwen 3), sampling, and the synthetic-model writer.

pub mod arch;
pub mod batch;
pub mod budget;
pub mod chat;
pub mod engine;
pub mod fetch;
pub mod gemma3;
pub mod gguf;
pub mod gguf_write;
pub mod llama;
pub mod qwen3;
pub use crate::sampler;
pub mod slots;
pub mod synth;
pub mod tokenizer;
pub mod tokenizer_spm;
pub mod transformer;
pub(crate) mod weights;
