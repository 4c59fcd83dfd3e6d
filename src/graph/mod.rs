//! The device-independent graph IR and its optimization passes.
//!
//! Nothing here knows about a device: every pass is tested on the CPU with synthetic nodes.
//! Nothing here is `unsafe` either.

#![forbid(unsafe_code)]

mod borrowed;
mod compute_graph;
pub mod conflict;
mod dispatch;
pub mod export;
mod footprint;
pub mod passes;
mod ranges;
pub mod synthetic;

pub use crate::kernels::{Access, KernelId, KernelSig, OpKind, Scalar};
pub use borrowed::{ArgRef, DispatchRef, DispatchSpec, Ranges, RangesIter, SPEC_ARGS};
pub use compute_graph::{ComputeGraph, Node, Nodes};
pub use dispatch::{Arg, ArgList, Dispatch, Grid, Range, MAX_RANGES};
pub use ranges::RangeSet;
