//! `tokenizer`.
