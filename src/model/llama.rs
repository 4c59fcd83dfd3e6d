//! `llama`.
