//! Models: GGUF reading, tokenizer, chat templates, fetching the default model, the Llama-family
//! forward pass, sampling, and the synthetic-model writer. Tokenizers: byte-level BPE (`gpt2`) and
//! SentencePiece (`llama`, in `tokenizer_spm`).

pub mod budget;
pub mod chat;
pub mod engine;
pub mod fetch;
pub mod gguf;
pub mod gguf_write;
pub mod llama;
pub mod sampler;
pub mod synth;
pub mod tokenizer;
pub mod tokenizer_spm;
