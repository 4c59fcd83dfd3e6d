//! CPU kernels of the fused prompt RoPE and cache write (`ops::rope_kv`): `rope_kv_f32` (q, k, v,
//! positions, step, k_cache, v_cache, head_dim, rotary_dim, base, mode, n_kv_head, cache_f16) and
//! `rope_ff_kv_f32` (the same with freq_factors after positions). The caches are f32, or f16 where
//! `cache_f16` is 1 (each value rounded to nearest once, as `kv_write` rounds it).
//!
//! q is rotated in place as the in-place `rope` rotates it; row r of k, rotated the same way, and
//! row r of v go to row `step[0] + r` of each KV head's slab of the caches, as `kv_write` writes
//! them. The rotations are `rope`'s own code (`angle_table`, `rotate_head`), so the results are
//! the bits of the two ropes and the two cache writes.

use half::f16;
use rayon::prelude::*;

use super::check::{expect_len, kernel_err, product, read_pos0};
use super::copy::Float;
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
    let cache_f16 = args.u32(at + 8)? == 1;
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
    let rows_of = Rows {
        positions,
        freq,
        base,
        rotary_dim,
        neox,
        head_dim,
        row_kv,
        max_ctx,
        start,
    };
    for (index, rotate) in [(at + 1, true), (at + 2, false)] {
        let src = if rotate { k } else { v };
        if cache_f16 {
            rows_of.write(args.output::<f16>(index)?, src, rotate);
        } else {
            rows_of.write(args.output::<f32>(index)?, src, rotate);
        }
    }
    Ok(())
}

/// Where a pass's k and v rows go in a cache, and how k rotates.
struct Rows<'a> {
    positions: &'a [i32],
    freq: Option<&'a [f32]>,
    base: f32,
    rotary_dim: usize,
    neox: bool,
    head_dim: usize,
    row_kv: usize,
    max_ctx: usize,
    start: usize,
}

impl Rows<'_> {
    /// Writes `src`'s rows (rotated where `rotate`) into `cache`'s rows `start..start + rows` of
    /// every head's slab, each value converted once from f32.
    fn write<C: Float>(&self, cache: &mut [C], src: &[f32], rotate: bool) {
        let hd = self.head_dim;
        cache
            .par_chunks_mut(self.max_ctx * hd)
            .enumerate()
            .for_each(|(h, slab)| {
                let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
                let mut row = vec![0f32; hd];
                let rows = self.positions.len();
                let dst = &mut slab[self.start * hd..(self.start + rows) * hd];
                for (r, d) in dst.chunks_exact_mut(hd).enumerate() {
                    let at = r * self.row_kv + h * hd;
                    let vals = &mut row[..];
                    vals.copy_from_slice(&src[at..at + hd]);
                    if rotate {
                        let pos = self.positions[r];
                        let cos_sin =
                            angle_table(pos, self.base, self.rotary_dim, self.freq, &mut table);
                        rotate_head(vals, cos_sin, self.neox);
                    }
                    for (o, &x) in d.iter_mut().zip(vals.iter()) {
                        *o = C::from_f32(x);
                    }
                }
            });
    }
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&km::ROPE_KV, [rope_kv::<false>, rope_kv::<true>]);
}
