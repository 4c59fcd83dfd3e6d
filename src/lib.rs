//! onepass records a transformer forward pass as a graph of kernel dispatches, optimizes it
//! (fusion, reordering for concurrency, barriers only where memory ranges conflict) and replays
//! it as one submission: a CUDA graph on NVIDIA GPUs, a scheduled batch on the CPU backend.
//!
//! Layers, from the top: `model` (GGUF, tokenizer, Llama forward pass), [`Session`] (modes,
//! automatic barriers, `finish(plan)`), `ops` (one file per op family), `graph` (IR and passes),
//! `backend` (devices, buffers, kernels), `quant` (block formats).
#![warn(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod cache_dir;
pub mod config;
pub mod error;
pub mod executable;
pub mod graph;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sanitize;
pub mod session;
#[cfg(test)]
#[path = "../tests/seeded/mod.rs"]
pub(crate) mod testutil;
pub mod trace;

pub use backend::{Buffer, DType, Device};
pub use config::RuntimeConfig;
pub use error::{Error, Result};
pub use session::{Executor, FinishReport, Mode, Plan, Session};
