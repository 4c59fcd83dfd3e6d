//! onepass records a transformer forward pass as a graph of kernel dispatches, optimizes it
//! (fusion, reordering for concurrency, barriers only where memory ranges conflict) and replays
//! it as one submission: a CUDA graph on NVIDIA GPUs, a scheduled batch on the CPU backend.
//!
//! Layers, from the top (each module imports only those below it; `tests/layers.rs` checks it):
//! `serve` (the OpenAI-compatible HTTP server and its batching scheduler), `sanitize`, `model`
//! (GGUF, tokenizer, Llama forward pass, engine), `trace`, `executable`, [`Session`] (modes,
//! automatic barriers, `finish(plan)`, the op methods), `config` (one [`RuntimeConfig`]), `ops`
//! (one file per op family), `backend` (one interface over the CPU and CUDA devices), `graph`
//! (IR and passes, no device and no `unsafe`), `kernels` (every kernel declared once: name, op
//! kind, parameters), `quant`, `memory` (buffers over any backend's memory), `cache_dir`,
//! `error`, `dtype`. A dispatch whose arguments do not fit its kernel's declaration is an error,
//! never a launch.
//!
//! # Example
//!
//! A library user's path: open a device, upload buffers, record a few ops in a session, finish it
//! with a plan, read the report and download the result.
//!
//! ```
//! use onepass::{DType, Device, Executor, Mode, Plan};
//!
//! # fn main() -> onepass::Result<()> {
//! // The CPU backend with two pool threads (`Device::auto` takes a CUDA GPU when there is one).
//! let device = Device::cpu(2)?;
//!
//! // Two rows of four values, a norm weight, a [3, 4] weight matrix and a bias row.
//! let x_host = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 2.0];
//! let w_host = [
//!     1.0f32, 0.0, 0.0, 0.0, //
//!     0.0, 1.0, 0.0, 0.0, //
//!     1.0, 1.0, 1.0, 1.0,
//! ];
//! let x = device.upload(&x_host, &[2, 4])?;
//! let norm = device.upload(&[1.0f32; 4], &[4])?;
//! let w = device.upload(&w_host, &[3, 4])?;
//! let bias = device.upload(&[0.5f32, 0.5, 0.5], &[3])?;
//! let xn = device.alloc(DType::F32, &[2, 4])?;
//! let y = device.alloc(DType::F32, &[2, 3])?;
//! let out = device.alloc(DType::F32, &[2, 3])?;
//!
//! // Record the pass; the session works out the barriers from what each op reads and writes.
//! let mut session = Executor::new(device.clone()).begin(Mode::Recorded);
//! session.rms_norm(&x, &norm, &xn, 1e-6)?;
//! session.matmul(&xn, &w, &y)?;
//! session.add(&y, &bias, &out)?;
//! let report = session.finish(&Plan::OPTIMIZED)?;
//! assert_eq!(report.dispatches + report.fusions, 3);
//! assert_eq!(report.submissions, 1);
//!
//! // out = rms_norm(x) · wᵀ + bias, row by row.
//! let got = device.download::<f32>(&out)?;
//! for (row, x) in x_host.chunks(4).enumerate() {
//!     let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0 + 1e-6).sqrt();
//!     let xn: Vec<f32> = x.iter().map(|v| v / rms).collect();
//!     for (o, w) in w_host.chunks(4).enumerate() {
//!         let want = xn.iter().zip(w).map(|(a, b)| a * b).sum::<f32>() + 0.5;
//!         assert!((got[row * 3 + o] - want).abs() < 1e-4, "out[{row}, {o}]");
//!     }
//! }
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(clippy::missing_safety_doc)]

pub mod backend;
pub mod block_timeline;
pub mod cache_dir;
pub mod config;
pub mod dtype;
pub mod error;
pub mod executable;
pub mod graph;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sampler;
pub mod sanitize;
pub mod serve;
pub mod session;
#[cfg(test)]
#[path = "../tests/seeded/mod.rs"]
pub(crate) mod testutil;
pub mod trace;

pub use backend::{Buffer, DType, Device};
pub use config::RuntimeConfig;
pub use error::{Error, Result};
pub use session::{Executor, FinishReport, Mode, Plan, Session};
