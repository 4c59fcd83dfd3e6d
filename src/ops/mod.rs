//! The op catalog: one file per op family. Each family turns op parameters into a
//! [`Dispatch`](crate::graph::Dispatch) (kernel, arguments with their access, grid) after checking
//! every argument. The [`Session`](crate::Session) methods that record them live in `session`,
//! above this module; the fusion rules over these dispatches live beside their ops.

pub mod argmax;
pub mod attention;
mod check;
pub mod copy;
pub mod custom;
pub mod elementwise;
pub mod embedding;
pub mod fused_block;
pub mod kv_cache;
pub mod matmul;
pub mod matmul_fused;
pub mod norm;
pub mod rope;
pub mod softmax;

pub use check::Check;

use crate::graph::passes::FusionRule;

/// The fusion rules the optimizer applies, in order.
pub fn fusion_rules() -> &'static [FusionRule] {
    &[norm::RMS_NORM_MUL_FUSION, matmul_fused::MATMUL_ADD_FUSION]
}
