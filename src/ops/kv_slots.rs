//! The slotted KV-cache write (the `kv_write_slots` family): the K or V rows of a batched decode
//! step, row `r` written into slot `slots[r]` at position `positions[r]` of a cache that holds
//! several sequences, `[slots, n_kv_head, slot_ctx, head_dim]` (slot `s` is a contiguous
//! `[n_kv_head, slot_ctx, head_dim]` cache with the single-sequence layout of
//! [`kv_write`](crate::ops::kv_cache::kv_write)).
//!
//! Slots and positions are i32 device buffers read when the dispatch runs, so one recorded step
//! serves every step. A slot outside the cache or a position outside the slot is an error when the
//! dispatch runs, and nothing is written then. The cache is declared written as a whole.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::batch::KV_WRITE_SLOTS;
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::Check;

/// Writes `new` (f32 `[rows, n_kv_head * head_dim]` or `[rows, n_kv_head, head_dim]`) into
/// `cache` (`[slots, n_kv_head, slot_ctx, head_dim]`, f32 or f16): row `r`, head `h` goes to
/// `cache[slots[r], h, positions[r], :]`. `slots` and `positions` are i32 `[rows]`. Rows that
/// name the same slot and position (padding rows) are written in an unspecified order.
pub fn kv_write_slots(
    new: &Buffer,
    cache: &Buffer,
    slots: &Buffer,
    positions: &Buffer,
) -> Result<Dispatch> {
    let check = Check::op("kv_write_slots");
    check.dtype("new", new, &[DType::F32])?;
    check.dtype("cache", cache, &[DType::F32, DType::F16])?;
    check.dtype("slots", slots, &[DType::I32])?;
    check.dtype("positions", positions, &[DType::I32])?;
    check.require(
        "cache",
        cache.shape().rank() == 4 && cache.elems() > 0,
        || {
            format!(
                "has shape {:?}, expected [slots, n_kv_head, slot_ctx, head_dim]",
                cache.dims()
            )
        },
    )?;
    let (n_kv_head, head_dim) = (cache.dims()[1], cache.dims()[3]);
    let shape_ok = match new.dims() {
        [rows, n] => *rows > 0 && *n == n_kv_head * head_dim,
        [rows, h, d] => *rows > 0 && *h == n_kv_head && *d == head_dim,
        _ => false,
    };
    check.require("new", shape_ok, || {
        format!(
            "has shape {:?}, expected [rows, {n_kv_head} * {head_dim}]",
            new.dims()
        )
    })?;
    let rows = new.dims()[0];
    check.elems("slots", slots, rows)?;
    check.elems("positions", positions, rows)?;
    check_disjoint(
        &check,
        "cache",
        cache,
        &[("new", new), ("slots", slots), ("positions", positions)],
    )?;
    let kernel = match cache.dtype() {
        DType::F16 => KernelId::of(&KV_WRITE_SLOTS[1]),
        _ => KernelId::of(&KV_WRITE_SLOTS[0]),
    };
    let args = vec![
        Arg::read(new),
        Arg::read(slots),
        Arg::read(positions),
        Arg::write(cache),
        Arg::u32(u32_size(&check, "cache", n_kv_head)?),
        Arg::u32(u32_size(&check, "cache", head_dim)?),
        Arg::u32(u32_size(&check, "cache", cache.dims()[2])?),
    ];
    let elems = rows.saturating_mul(n_kv_head).saturating_mul(head_dim);
    Dispatch::new(kernel, args, Grid::cover(elems.min(1 << 28), 256))
}

#[cfg(test)]
#[path = "kv_slots_tests.rs"]
mod tests;
