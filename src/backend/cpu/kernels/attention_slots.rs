//! CPU kernels of the slotted decode attention (`attention_slots_<cache>`): row `r` of a batched
//! decode step attends over the first `positions[r] + 1` keys of slot `slots[r]` of a cache
//! `[slots, n_kv_head, slot_ctx, head_dim]` (or the window's part of them).
//!
//! Each row runs the one-row decode attention's two passes over its own slot and its own region
//! of the scratch: the same work items (`attention::decode_partial_item`, one per chunk and KV
//! head) and the same merge (`attention::combine_head`), so a row's output has the bits a one-row
//! `attention_decode` over that slot gives, whatever the other rows are. Chunks before a row's
//! window are neither computed nor merged, so a row costs `O(window)`.
//!
//! Argument layout: q, k_cache, v_cache, slots (i32 `[rows]`), positions (i32 `[rows]`),
//! partials (`[rows, chunks * n_head * (head_dim + 2) + n_head]`: per row, the one-row scratch),
//! out, n_head, n_kv_head, head_dim, slot_ctx, scale, softcap, window, chunk_len, chunks.

use half::f16;
use rayon::prelude::*;

use super::attention::{
    check_partials, combine_head, decode_partial_item, first_key, used_chunks, CacheElem, Geometry,
};
use super::check::{expect_len, kernel_err};
use super::kv_slots::{read_rows, SlotCache};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::batch::ATTENTION_SLOTS;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(
        &ATTENTION_SLOTS,
        [attention_slots::<f32>, attention_slots::<f16>],
    );
}

/// Reads the head and scoring scalars (from argument 7 on) and the caches' shape.
fn geometry(args: &KernelArgs<'_>) -> Result<(Geometry, SlotCache)> {
    let n_head = args.usize(7)?;
    let n_kv_head = args.usize(8)?;
    let head_dim = args.usize(9)?;
    let slot_ctx = args.usize(10)?;
    let (scale, cap, window) = (args.f32(11)?, args.f32(12)?, args.usize(13)?);
    if n_head == 0 || n_kv_head == 0 || head_dim == 0 || n_head % n_kv_head != 0 {
        return Err(kernel_err(
            args,
            format!(
                "n_head = {n_head}, n_kv_head = {n_kv_head}, head_dim = {head_dim}: each must be \
                 at least 1, and n_kv_head must divide n_head"
            ),
        ));
    }
    let cache = SlotCache::read(args, 1, "k_cache", [n_kv_head, slot_ctx, head_dim])?;
    let (k, _) = args.buffer(1)?;
    let (v, _) = args.buffer(2)?;
    if v.dims() != k.dims() {
        return Err(kernel_err(
            args,
            format!("v_cache has shape {:?}, k_cache {:?}", v.dims(), k.dims()),
        ));
    }
    let geo = Geometry {
        n_head,
        n_kv_head,
        head_dim,
        group: n_head / n_kv_head,
        max_ctx: cache.slot_ctx,
        scale,
        softcap: (cap != 0.0).then_some(cap),
        window: (window != 0).then_some(window),
    };
    Ok((geo, cache))
}

fn attention_slots<T: CacheElem>(args: &KernelArgs<'_>) -> Result<()> {
    let (geo, cache) = geometry(args)?;
    let (chunk_len, max_chunks) = (args.usize(14)?, args.usize(15)?);
    let q = args.input::<f32>(0)?;
    let k = args.input::<T>(1)?;
    let v = args.input::<T>(2)?;
    let partials = args.output::<f32>(5)?;
    let out = args.output::<f32>(6)?;
    let hd = geo.head_dim;
    let slot_len = cache.slot_len(geo.n_kv_head, hd);
    let cache_dims = [
        ("slots", cache.slots),
        ("n_kv_head", geo.n_kv_head),
        ("slot_ctx", cache.slot_ctx),
        ("head_dim", hd),
    ];
    expect_len(args, "k_cache", k.len(), &cache_dims)?;
    expect_len(args, "v_cache", v.len(), &cache_dims)?;
    let rows = args.input::<i32>(3)?.len();
    let width = [("rows", rows), ("n_head", geo.n_head), ("head_dim", hd)];
    expect_len(args, "q", q.len(), &width)?;
    expect_len(args, "out", out.len(), &width)?;
    let rec = hd + 2;
    let records = max_chunks.saturating_mul(geo.n_head).saturating_mul(rec);
    let per_row = records.saturating_add(geo.n_head);
    expect_len(
        args,
        "partials",
        partials.len(),
        &[("rows", rows), ("a row's scratch", per_row)],
    )?;
    check_partials(args, records, geo.n_head, hd, chunk_len, max_chunks)?;
    // Every row's slot and position lie inside the cache; its live chunks `first..chunks`
    // (`chunks <= max_chunks`) lie inside its region of the scratch.
    let places = read_rows(args, 3, 4, rows, cache)?;
    let mut live = Vec::with_capacity(rows);
    for &(_, pos) in &places {
        let chunks = used_chunks(args, pos + 1, chunk_len, max_chunks)?;
        live.push(first_key(pos, geo.window) / chunk_len..chunks);
    }
    if rows == 0 {
        return Ok(());
    }
    let unit = geo.group * rec;
    let stride = geo.kv_stride();
    let q_width = geo.n_head * hd;
    partials
        .par_chunks_mut(per_row)
        .zip(&places)
        .zip(&live)
        .enumerate()
        .for_each(|(r, ((region, &(slot, pos)), chunks))| {
            let (ks, vs) = (
                &k[slot * slot_len..(slot + 1) * slot_len],
                &v[slot * slot_len..(slot + 1) * slot_len],
            );
            let lo = first_key(pos, geo.window);
            let q_row = &q[r * q_width..(r + 1) * q_width];
            let span = chunks.start * geo.n_head * rec..chunks.end * geo.n_head * rec;
            region[span]
                .par_chunks_mut(unit)
                .enumerate()
                .for_each(|(item, recs)| {
                    let (chunk, kv) = (chunks.start + item / geo.n_kv_head, item % geo.n_kv_head);
                    let keys = (chunk * chunk_len).max(lo)..((chunk + 1) * chunk_len).min(pos + 1);
                    let qh = &q_row[kv * geo.group * hd..(kv + 1) * geo.group * hd];
                    let slab = kv * stride..(kv + 1) * stride;
                    decode_partial_item(&geo, qh, &ks[slab.clone()], &vs[slab], keys, recs);
                });
        });
    let partials: &[f32] = partials;
    out.par_chunks_mut(q_width)
        .zip(partials.par_chunks(per_row))
        .zip(&live)
        .for_each(|((o, region), chunks)| {
            o.par_chunks_mut(hd).enumerate().for_each(|(h, oh)| {
                combine_head(&region[..records], geo.n_head, h, chunks.clone(), oh);
            });
        });
    Ok(())
}
