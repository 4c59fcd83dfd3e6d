//! The op catalog: one file per op family. Each family turns op parameters into a
//! [`Dispatch`](crate::graph::Dispatch) (kernel, arguments with their access, grid) after checking
//! every argument. The [`Session`](crate::Session) methods that record them live in `session`,
//! above this module; the fusion rules over these dispatches live beside their ops.

pub mod argmax;
pub mod attention;
pub mod attention_slots;
pub mod block_fusion;
mod check;
pub mod copy;
pub mod custom;
pub mod draw;
pub mod elementwise;
pub mod embedding;
pub mod fused_block;
pub mod kv_cache;
pub mod kv_slots;
pub mod matmul;
pub mod matmul_fused;
pub mod matmul_rows;
pub mod matmul_swiglu;
pub mod matmul_triple;
pub mod narrow;
pub mod norm;
pub mod norm_qkv;
pub mod norm_rope;
pub mod norm_rope_kv;
pub mod rope;
pub mod rope_kv;
pub mod softmax;

pub use check::Check;

use crate::backend::{Capabilities, F16Products};
use crate::graph::passes::FusionRule;
use crate::kernels::Fusion;

/// The rule that makes `fusion` out of plain ops for a backend that declares `caps`.
pub fn fusion_rule(fusion: Fusion, caps: &Capabilities) -> FusionRule {
    match fusion {
        Fusion::NormQkvRope => block_fusion::NORM_QKV_ROPE_FUSION,
        Fusion::NormGateUp => block_fusion::NORM_GATE_UP_FUSION,
        Fusion::NormQkv => block_fusion::NORM_QKV_FUSION,
        Fusion::MatMulAdd => matmul_fused::MATMUL_ADD_FUSION,
        Fusion::RmsNormMul => norm::RMS_NORM_MUL_FUSION,
        Fusion::RmsNormAdd => norm::RMS_NORM_ADD_FUSION,
        Fusion::RmsNormRope => norm_rope::RMS_NORM_ROPE_FUSION,
        Fusion::RmsNormRopeKv => norm_rope_kv::RMS_NORM_ROPE_KV_FUSION,
        Fusion::ProductTriple => matmul_triple::PRODUCT_TRIPLE_FUSION,
        Fusion::ProductPairSwiglu if caps.f16_products == F16Products::AllBlocks => {
            matmul_swiglu::PRODUCT_PAIR_SWIGLU_ALL_BLOCKS
        }
        Fusion::ProductPairSwiglu => matmul_swiglu::PRODUCT_PAIR_SWIGLU_FUSION,
        Fusion::RopeKv => rope_kv::ROPE_KV_FUSION,
    }
}

/// The rules a backend declares ([`Capabilities::fusions`]), each limited to the rows the
/// backend says it pays for, in the backend's order.
pub fn fusion_rules_for(caps: &Capabilities) -> Vec<FusionRule> {
    caps.fusions
        .iter()
        .map(|u| fusion_rule(u.fusion, caps).up_to_rows(u.max_rows))
        .collect()
}
