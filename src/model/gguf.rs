//! `gguf`.
