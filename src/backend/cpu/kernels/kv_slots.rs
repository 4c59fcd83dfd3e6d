//! CPU kernels of the slotted KV-cache writes (`kv_write_slots_<cache>`): row `r` of `new` goes
//! to slot `slots[r]` at position `positions[r]` of a cache `[slots, n_kv_head, slot_ctx,
//! head_dim]` (f32 or f16), head `h` to `cache[slots[r], h, positions[r], :]`.
//!
//! Every row's slot and position are checked before anything is written: a slot outside the
//! cache or a position outside `0..slot_ctx` is a kernel error and the cache is left as it was.
//! Rows that name the same slot and position (the padding rows of a batch) are written in row
//! order.
//!
//! Argument layout: new, slots (i32 `[rows]`), positions (i32 `[rows]`), cache (written),
//! n_kv_head: u32, head_dim: u32, slot_ctx: u32.

use half::f16;

use super::check::{expect_len, kernel_err};
use super::copy::Float;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::batch::KV_WRITE_SLOTS;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(
        &KV_WRITE_SLOTS,
        [kv_write_slots::<f32>, kv_write_slots::<f16>],
    );
}

/// The shape of a slotted cache, read from the buffer argument at `index` and checked against
/// the kernel's `n_kv_head` and `head_dim`.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlotCache {
    /// Slots the cache holds.
    pub(super) slots: usize,
    /// Positions per slot.
    pub(super) slot_ctx: usize,
}

impl SlotCache {
    /// Reads the cache's dimensions (`[slots, n_kv_head, slot_ctx, head_dim]`) and checks them
    /// against the kernel's scalars.
    pub(super) fn read(
        args: &KernelArgs<'_>,
        index: usize,
        what: &str,
        [n_kv_head, slot_ctx, head_dim]: [usize; 3],
    ) -> Result<SlotCache> {
        let (cache, _) = args.buffer(index)?;
        match *cache.dims() {
            [slots, h, ctx, d]
                if h == n_kv_head
                    && ctx == slot_ctx
                    && d == head_dim
                    && slots * h * ctx * d > 0 =>
            {
                Ok(SlotCache {
                    slots,
                    slot_ctx: ctx,
                })
            }
            ref dims => Err(kernel_err(
                args,
                format!(
                    "{what} has shape {dims:?}, expected [slots, n_kv_head = {n_kv_head}, \
                     slot_ctx = {slot_ctx}, head_dim = {head_dim}]"
                ),
            )),
        }
    }

    /// Elements of one slot.
    pub(super) fn slot_len(&self, n_kv_head: usize, head_dim: usize) -> usize {
        n_kv_head * self.slot_ctx * head_dim
    }
}

/// The `(slot, position)` of each of `rows` rows, from the i32 buffers at `slots_at` and
/// `positions_at`; an error naming the first row whose slot is outside the cache or whose
/// position is outside the slot.
pub(super) fn read_rows(
    args: &KernelArgs<'_>,
    slots_at: usize,
    positions_at: usize,
    rows: usize,
    cache: SlotCache,
) -> Result<Vec<(usize, usize)>> {
    let slots = args.input::<i32>(slots_at)?;
    let positions = args.input::<i32>(positions_at)?;
    expect_len(args, "slots", slots.len(), &[("rows", rows)])?;
    expect_len(args, "positions", positions.len(), &[("rows", rows)])?;
    let mut out = Vec::with_capacity(rows);
    for (r, (&s, &p)) in slots.iter().zip(positions).enumerate() {
        let slot = usize::try_from(s).ok().filter(|&s| s < cache.slots);
        let pos = usize::try_from(p).ok().filter(|&p| p < cache.slot_ctx);
        match (slot, pos) {
            (Some(slot), Some(pos)) => out.push((slot, pos)),
            (None, _) => {
                return Err(kernel_err(
                    args,
                    format!(
                        "row {r}: slot {s} is outside the cache's {} slots",
                        cache.slots
                    ),
                ))
            }
            (_, None) => {
                return Err(kernel_err(
                    args,
                    format!(
                        "row {r}: position {p} is outside the slot's {} positions",
                        cache.slot_ctx
                    ),
                ))
            }
        }
    }
    Ok(out)
}

fn kv_write_slots<C: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let new = args.input::<f32>(0)?;
    let (n_kv_head, head_dim) = (args.usize(4)?, args.usize(5)?);
    let shape = SlotCache::read(args, 3, "cache", [n_kv_head, args.usize(6)?, head_dim])?;
    let cache = args.output::<C>(3)?;
    let row_len = n_kv_head * head_dim;
    let slot_len = shape.slot_len(n_kv_head, head_dim);
    expect_len(
        args,
        "cache",
        cache.len(),
        &[
            ("slots", shape.slots),
            ("n_kv_head", n_kv_head),
            ("slot_ctx", shape.slot_ctx),
            ("head_dim", head_dim),
        ],
    )?;
    let slots_len = args.input::<i32>(1)?.len();
    expect_len(
        args,
        "new",
        new.len(),
        &[
            ("rows", slots_len),
            ("n_kv_head", n_kv_head),
            ("head_dim", head_dim),
        ],
    )?;
    // Every `(slot, pos)` lies inside the cache, so each destination below is in bounds.
    let places = read_rows(args, 1, 2, slots_len, shape)?;
    for (row, &(slot, pos)) in new.chunks_exact(row_len).zip(&places) {
        for (h, src) in row.chunks_exact(head_dim).enumerate() {
            let at = slot * slot_len + (h * shape.slot_ctx + pos) * head_dim;
            for (o, &v) in cache[at..at + head_dim].iter_mut().zip(src) {
                *o = C::from_f32(v);
            }
        }
    }
    Ok(())
}
