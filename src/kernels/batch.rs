//! The batched decode step's kernels: KV-cache writes and decode attention where each row lives
//! in its own slot of a multi-sequence cache, and the products whose per-row arithmetic does not
//! depend on how many rows share the dispatch.
//!
//! A slotted cache is `[slots, n_kv_head, slot_ctx, head_dim]`: slot `s` is a contiguous
//! `[n_kv_head, slot_ctx, head_dim]` cache with the single-sequence layout. The per-row slot and
//! position are i32 device buffers written once per step, so one recorded step serves every step.

use super::matmul::product_params;
use super::OpKind;
use super::{one, per_format, DTypes, KernelSig, Param};
use crate::dtype::DType;

const F32: DTypes = one(DType::F32);
const I32: DTypes = one(DType::I32);

/// `out[r, o] = x[r] . w[o]`, each row computed exactly as a one-row product would compute it,
/// whatever the number of rows: x, w, out, rows, k, n. One kernel per weight format.
pub static MATMUL_ROWS: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "matmul_rows"; |W| product_params!(W, Param::write("out", F32)));

/// The declaration of one slotted KV write into a cache of `$cache`.
macro_rules! kv_write_slots {
    ($name:literal, $cache:expr) => {
        KernelSig::new(
            $name,
            OpKind::KvWrite,
            &[
                Param::read("new", F32),
                Param::read("slots", I32),
                Param::read("positions", I32),
                Param::write("cache", $cache),
                Param::u32("n_kv_head"),
                Param::u32("head_dim"),
                Param::u32("slot_ctx"),
            ],
        )
    };
}

/// Row `r` of `new` written into slot `slots[r]` at position `positions[r]`: new, slots,
/// positions, cache, n_kv_head, head_dim, slot_ctx. One kernel per cache dtype (f32, f16).
pub static KV_WRITE_SLOTS: [KernelSig; 2] = [
    kv_write_slots!("kv_write_slots_f32", F32),
    kv_write_slots!("kv_write_slots_f16", one(DType::F16)),
];

/// The declaration of one slotted decode attention over a cache of `$cache`.
macro_rules! attention_slots {
    ($name:literal, $cache:expr) => {
        KernelSig::new(
            $name,
            OpKind::Attention,
            &[
                Param::read("q", F32),
                Param::read("k_cache", $cache),
                Param::read("v_cache", $cache),
                Param::read("slots", I32),
                Param::read("positions", I32),
                Param::read_write("partials", F32),
                Param::write("out", F32),
                Param::u32("n_head"),
                Param::u32("n_kv_head"),
                Param::u32("head_dim"),
                Param::u32("slot_ctx"),
                Param::f32("scale"),
                Param::f32("softcap"),
                Param::u32("window"),
                Param::u32("chunk_len"),
                Param::u32("chunks"),
            ],
        )
    };
}

/// Decode attention of row `r` over the first `positions[r] + 1` keys of slot `slots[r]` (or the
/// window's part of them), split into chunks and merged as the one-row decode attention does:
/// q, k_cache, v_cache, slots, positions, partials (one single-row decode scratch per row), out,
/// n_head, n_kv_head, head_dim, slot_ctx, scale, softcap, window, chunk_len, chunks. One kernel per cache dtype.
pub static ATTENTION_SLOTS: [KernelSig; 2] = [
    attention_slots!("attention_slots_f32", F32),
    attention_slots!("attention_slots_f16", one(DType::F16)),
];
