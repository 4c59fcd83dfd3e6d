//! The slotted decode attention (the `attention_slots` family): one decode step of several
//! sequences, row `r` of `q` attending over the first `positions[r] + 1` keys of slot `slots[r]`
//! of caches `[slots, n_kv_head, slot_ctx, head_dim]` (with a sliding window, over the last `W`
//! of them).
//!
//! Each row computes exactly what [`attention_decode`](crate::ops::attention::attention_decode)
//! computes for one row over that slot: the KV length split into chunks of `chunk_len`, one
//! partial record per (chunk, head), merged per head; the chunks before a window are skipped, so a
//! row costs `O(chunk)` per work item and `O(window)` in all. Each row has its own region of the
//! scratch, laid out as the one-row scratch, so a row's result never depends on the other rows.
//! One dispatch on every backend; slots and positions are read when it runs.

use crate::backend::{Buffer, DType};
use crate::error::{Error, Result};
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::batch::ATTENTION_SLOTS;
use crate::ops::attention::{attention_decode_scratch_len, AttentionParams};
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::Check;

/// Elements (f32) of the scratch [`attention_slots`] needs for `rows` rows over slots of
/// `slot_ctx` positions in chunks of `chunk_len`: per row, the one-row decode scratch
/// ([`attention_decode_scratch_len`]: the records, then `n_head` counters), rows after each
/// other. Allocate it zeroed ([`Device::alloc`](crate::Device::alloc)) and use it for this op
/// only: the counters must be zero between launches (the kernels keep them so).
pub fn attention_slots_scratch_len(
    params: AttentionParams,
    slot_ctx: usize,
    chunk_len: usize,
    rows: usize,
) -> Result<usize> {
    attention_decode_scratch_len(params, slot_ctx, chunk_len)?
        .checked_mul(rows)
        .ok_or_else(|| Error::shape("attention_slots", "partials", "scratch size overflows"))
}

/// Decode attention of every row of `q` (f32 `[rows, n_head * head_dim]`) over its own slot:
/// `out[r, h] = softmax(scale * q[r, h] . K[s][lo..=p]) V[s]` with `s = slots[r]`,
/// `p = positions[r]` (i32 `[rows]` each) and `lo` 0, or `p + 1 - W` with a window. The caches
/// are `[slots, n_kv_head, slot_ctx, head_dim]`, both f32 or both f16; `partials` is f32 with
/// exactly [`attention_slots_scratch_len`] elements; `out` has `q`'s shape.
#[allow(clippy::too_many_arguments)] // the op's natural argument list; each is a distinct buffer
pub fn attention_slots(
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    slots: &Buffer,
    positions: &Buffer,
    partials: &Buffer,
    out: &Buffer,
    params: AttentionParams,
    chunk_len: usize,
) -> Result<Dispatch> {
    let c = Check::op("attention_slots");
    params.check(&c)?;
    c.dtype("q", q, &[DType::F32])?;
    c.require("q", q.shape().rank() == 2 && q.dims()[0] > 0, || {
        format!(
            "has shape {:?}, expected [rows > 0, n_head * head_dim]",
            q.dims()
        )
    })?;
    c.last_dim("q", q, params.q_width())?;
    let rows = q.dims()[0];
    c.dtype("k_cache", k_cache, &[DType::F32, DType::F16])?;
    let kd = k_cache.dims();
    c.require(
        "k_cache",
        kd.len() == 4
            && kd[0] > 0
            && kd[1] == params.n_kv_head
            && kd[2] > 0
            && kd[3] == params.head_dim,
        || {
            format!(
                "has shape {kd:?}, expected [slots > 0, n_kv_head {}, slot_ctx > 0, head_dim {}]",
                params.n_kv_head, params.head_dim
            )
        },
    )?;
    let slot_ctx = kd[2];
    c.dtype("v_cache", v_cache, &[k_cache.dtype()])?;
    c.dims("v_cache", v_cache, kd)?;
    c.dtype("slots", slots, &[DType::I32])?;
    c.elems("slots", slots, rows)?;
    c.dtype("positions", positions, &[DType::I32])?;
    c.elems("positions", positions, rows)?;
    c.dtype("out", out, &[DType::F32])?;
    c.dims("out", out, q.dims())?;
    c.require("chunk_len", chunk_len > 0, || {
        "chunk_len must be positive".into()
    })?;
    c.dtype("partials", partials, &[DType::F32])?;
    let need = attention_slots_scratch_len(params, slot_ctx, chunk_len, rows)?;
    c.elems("partials", partials, need)?;
    let inputs: [(&'static str, &Buffer); 5] = [
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("slots", slots),
        ("positions", positions),
    ];
    check_disjoint(&c, "out", out, &inputs)?;
    check_disjoint(&c, "partials", partials, &inputs)?;
    check_disjoint(&c, "out", out, &[("partials", partials)])?;
    let chunks = slot_ctx.div_ceil(chunk_len);
    // A row's work items are its live (chunk, head) pairs; with a window of W keys at most
    // ceil(W / chunk_len) + 1 chunks hold a key of it. The kernels loop over their items (a
    // block along x takes items x, x + blocks, ...; one row per block along y, looping past
    // 65535), so any number of blocks covers a step: about SLOT_BLOCKS in all, whole multiples of
    // the head count (each block keeps one head), at least one per head and row and at most one
    // per item. Which block folds a chunk never changes a row's bits: the head's merge takes the
    // chunks' records in chunk order.
    let live = params.window.map_or(chunks, |w| {
        chunks.min(w.div_ceil(chunk_len).saturating_add(1))
    });
    let per_head = (SLOT_BLOCKS / rows.max(1).saturating_mul(params.n_head)).clamp(1, live.max(1));
    let blocks = u32_size(&c, "chunk_len", per_head.saturating_mul(params.n_head))?;
    let kernel = match k_cache.dtype() {
        DType::F16 => KernelId::of(&ATTENTION_SLOTS[1]),
        _ => KernelId::of(&ATTENTION_SLOTS[0]),
    };
    let args = vec![
        Arg::read(q),
        Arg::read(k_cache),
        Arg::read(v_cache),
        Arg::read(slots),
        Arg::read(positions),
        Arg::read_write(partials),
        Arg::write(out),
        Arg::u32(u32_size(&c, "params", params.n_head)?),
        Arg::u32(u32_size(&c, "params", params.n_kv_head)?),
        Arg::u32(u32_size(&c, "params", params.head_dim)?),
        Arg::u32(u32_size(&c, "k_cache", slot_ctx)?),
        Arg::f32(params.scale),
        Arg::f32(params.softcap.unwrap_or(0.0)),
        Arg::u32(params.window_arg()),
        Arg::u32(u32_size(&c, "chunk_len", chunk_len)?),
        Arg::u32(u32_size(&c, "chunk_len", chunks)?),
    ];
    let grid = Grid::new(blocks, 256).with_y(rows.clamp(1, 65535) as u32);
    Dispatch::new(kernel, args, grid)
}

/// About how many blocks one slotted attention launch takes (a few per SM of a large GPU).
const SLOT_BLOCKS: usize = 1024;

#[cfg(test)]
#[path = "attention_slots_tests.rs"]
mod tests;
