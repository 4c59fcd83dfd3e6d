//! The CPU kernels, one file per op family. Each family registers its kernels by name.

mod argmax;
mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_avx512;
mod attention_slots;
mod check;
mod copy;
mod draw;
mod elementwise;
mod embedding;
mod fused_block;
#[cfg(test)]
mod hostile_tests;
mod kv_cache;
mod kv_slots;
mod matmul;
mod matmul_add;
mod matmul_rows;
mod matmul_simd;
mod matvec_vnni;
mod norm;
mod norm_qkv;
mod norm_rope_kv;
mod rope;
mod rope_kv;
mod softmax;

use super::CpuRegistry;

/// Registers every built-in CPU kernel.
pub fn register_all(registry: &mut CpuRegistry) {
    argmax::register(registry);
    attention::register(registry);
    attention_slots::register(registry);
    copy::register(registry);
    draw::register(registry);
    elementwise::register(registry);
    embedding::register(registry);
    fused_block::register(registry);
    kv_cache::register(registry);
    kv_slots::register(registry);
    matmul::register(registry);
    matmul_add::register(registry);
    matmul_rows::register(registry);
    norm::register(registry);
    norm_qkv::register(registry);
    norm_rope_kv::register(registry);
    rope::register(registry);
    rope_kv::register(registry);
    softmax::register(registry);
}
