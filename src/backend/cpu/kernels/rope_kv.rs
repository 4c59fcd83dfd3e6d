//! CPU kernels of the fused prompt RoPE and cache write (`ops::rope_kv`): `rope_kv_f32` (q, k, v,
//! positions, step, k_cache, v_cache, head_dim, rotary_dim, base, mode, n_kv_head) and
//! `rope_ff_kv_f32` (the same with freq_factors after positions).
//!
//! q is rotated in place as the in-place `rope` rotates it; row r of k, rotated the same way, and
//! row r of v go to row `step[0] + r` of each KV head's slab of the caches, as `kv_write` writes
//! them. The rotations are `rope`'s own code (`angle_table`, `rotate_head`), so the results are
//! the bits of the two ropes and the two cache writes.

use rayon::prelude::*;

use super::check::{expect_len, kernel_err, product, read_pos0};
use super::rope::{angle_table, check_rotation, rotate_head, MAX_ROPE_PAIRS};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc as km;

fn rope_kv<const FF: bool>(args: &KernelArgs<'_>) -> Result<()> {
    let bad = |msg: String| kernel_err(args, msg);
    let (k, v) = (args.input::<f32>(1)?, args.input::<f32>(2)?);
    let positions = args.input::<i32>(3)?;
    let freq = if FF {
        Some(args.input::<f32>(4)?)
    } else {
        None
    };
    // Indices after the optional frequency factors: step, the caches, the scalars.
    let at = 4 + FF as usize;
    let (head_dim, rotary_dim, base, mode, n_kv_head) = (
        args.usize(at + 3)?,
        args.usize(at + 4)?,
        args.f32(at + 5)?,
        args.u32(at + 6)?,
        args.usize(at + 7)?,
    );
    if head_dim == 0 {
        return Err(bad("head_dim = 0: heads must hold values".into()));
    }
    check_rotation(args, head_dim, rotary_dim, freq, mode)?;
    let rows = positions.len();
    let heads = [("n_kv_head", n_kv_head), ("head_dim", head_dim)];
    let row_kv = product(args, "a row of k", &heads)?;
    expect_len(
        args,
        "k",
        k.len(),
        &[("rows", rows), ("n_kv_head x head_dim", row_kv)],
    )?;
    expect_len(
        args,
        "v",
        v.len(),
        &[("rows", rows), ("n_kv_head x head_dim", row_kv)],
    )?;
    // The caches: one shape, whole rows; a step that leaves no room is refused before anything
    // is written, so q and the caches stay as they were.
    let (kc, vc) = (
        args.buffer(at + 1)?.0.elems(),
        args.buffer(at + 2)?.0.elems(),
    );
    if row_kv == 0 || kc != vc || kc % row_kv != 0 {
        return Err(bad(format!(
            "k_cache ({kc} values) and v_cache ({vc}) must be the same whole rows of n_kv_head = \
             {n_kv_head} x head_dim = {head_dim}"
        )));
    }
    let max_ctx = kc / row_kv;
    let start = read_pos0(args, at, rows, max_ctx)?;
    let neox = mode == 1;
    // q: whole rows of whole heads, rotated in place.
    {
        let q = args.output::<f32>(0)?;
        if rows == 0 || q.len() % rows != 0 || (q.len() / rows) % head_dim != 0 {
            return Err(bad(format!(
                "q has {} values, not {rows} rows (one per entry of positions) of heads of \
                 head_dim = {head_dim}",
                q.len()
            )));
        }
        let row_len = q.len() / rows;
        q.par_chunks_mut(row_len).enumerate().for_each(|(r, o)| {
            let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
            let cos_sin = angle_table(positions[r], base, rotary_dim, freq, &mut table);
            for oh in o.chunks_exact_mut(head_dim) {
                rotate_head(oh, cos_sin, neox);
            }
        });
    }
    // k rotated and v copied into their caches' rows.
    for (index, rotate) in [(at + 1, true), (at + 2, false)] {
        let src = if rotate { k } else { v };
        let cache = args.output::<f32>(index)?;
        cache
            .par_chunks_mut(max_ctx * head_dim)
            .enumerate()
            .for_each(|(h, slab)| {
                let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
                let dst = &mut slab[start * head_dim..(start + rows) * head_dim];
                for (r, d) in dst.chunks_exact_mut(head_dim).enumerate() {
                    let at = r * row_kv + h * head_dim;
                    d.copy_from_slice(&src[at..at + head_dim]);
                    if rotate {
                        let cos_sin = angle_table(positions[r], base, rotary_dim, freq, &mut table);
                        rotate_head(d, cos_sin, neox);
                    }
                }
            });
    }
    Ok(())
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&km::ROPE_KV, [rope_kv::<false>, rope_kv::<true>]);
}
