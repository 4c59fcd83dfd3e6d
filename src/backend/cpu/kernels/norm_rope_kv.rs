//! CPU kernel of the query and key norms with their RoPE and the KV cache writes
//! (`ops::norm_rope_kv`): `rms_norm_rope_kv_f32`: q_in, q_weight, k_in, k_weight, v, positions
//! (i32), step (i32), q (written), k_cache, v_cache (read-write, f32, or f16 where cache_f16 is
//! 1), then eps: f32, head_dim: u32, base: f32, mode, n_kv_head, cache_f16: u32.
//!
//! Each head is normalized by the norm kernel's row code (`inv_rms`, `x * inv * w` stored as
//! `rms_norm` stores it) and rotated by the rope kernel's (`angle_table`, `rotate_head`); k's
//! heads then go to rows `step[0] + r` of their caches as `kv_write` writes them, v's copied, so
//! the results are the bits of the two `rms_norm_rope`s and the two cache writes. A step that
//! leaves no room for the rows is refused before anything is written.

use half::f16;
use rayon::prelude::*;

use super::check::{check_len, kernel_err, read_pos0};
use super::copy::Float;
use super::norm::{inv_rms, put};
use super::rope::{angle_table, rotate_head, MAX_ROPE_PAIRS};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::backend::DType;
use crate::error::Result;
use crate::kernels::norm as kn;

/// Registers this family's kernel against its declaration.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&kn::RMS_NORM_ROPE_KV, [rms_norm_rope_kv]);
}

/// Normalizes the heads of `src` (one row of `src.len() / head_dim` heads) with `weight` into
/// `dst` and rotates each by `cos_sin`.
fn norm_rotate(src: &[f32], weight: &[f32], eps: f32, cos_sin: &[(f32, f32)], dst: &mut [f32]) {
    let hd = weight.len();
    for (oh, xh) in dst.chunks_exact_mut(hd).zip(src.chunks_exact(hd)) {
        let inv = inv_rms(xh, eps);
        for ((o, &xv), &wv) in oh.iter_mut().zip(xh).zip(weight) {
            put::<f32, false>(o, xv * inv * wv);
        }
        rotate_head(oh, cos_sin, true);
    }
}

fn rms_norm_rope_kv(args: &KernelArgs<'_>) -> Result<()> {
    let bad = |msg: String| kernel_err(args, msg);
    let (q_in, q_w, k_in, k_w, v) = (
        args.input::<f32>(0)?,
        args.input::<f32>(1)?,
        args.input::<f32>(2)?,
        args.input::<f32>(3)?,
        args.input::<f32>(4)?,
    );
    let positions = args.input::<i32>(5)?;
    let (eps, hd, base, mode) = (args.f32(10)?, args.usize(11)?, args.f32(12)?, args.u32(13)?);
    let (n_kv, cache_f16) = (args.usize(14)?, args.u32(15)? == 1);
    if hd == 0 || hd % 2 != 0 || hd / 2 > MAX_ROPE_PAIRS || mode != 1 || n_kv == 0 {
        return Err(bad(format!(
            "head_dim = {hd}, mode = {mode}, n_kv_head = {n_kv}: the kernel takes NeoX heads \
             (mode 1) of an even count of values, at most {}, and at least one KV head",
            2 * MAX_ROPE_PAIRS
        )));
    }
    check_len(args, "q_weight", q_w.len(), hd)?;
    check_len(args, "k_weight", k_w.len(), hd)?;
    let rows = positions.len();
    let q_len = args.buffer(7)?.0.elems();
    if rows == 0 || q_len % rows != 0 || (q_len / rows) % hd != 0 {
        return Err(bad(format!(
            "q has {q_len} values, not {rows} rows (one per entry of positions) of heads of \
             head_dim = {hd}"
        )));
    }
    check_len(args, "q_in", q_in.len(), q_len)?;
    let row_kv = n_kv * hd;
    check_len(args, "k_in", k_in.len(), rows * row_kv)?;
    check_len(args, "v", v.len(), rows * row_kv)?;
    let want = if cache_f16 { DType::F16 } else { DType::F32 };
    for (index, name) in [(8, "k_cache"), (9, "v_cache")] {
        let dtype = args.buffer(index)?.0.dtype();
        if dtype != want {
            return Err(bad(format!(
                "{name} is {dtype}, but cache_f16 = {} asks for {want}",
                u32::from(cache_f16)
            )));
        }
    }
    let (kc, vc) = (args.buffer(8)?.0.elems(), args.buffer(9)?.0.elems());
    if kc != vc || kc % row_kv != 0 {
        return Err(bad(format!(
            "k_cache ({kc} values) and v_cache ({vc}) must be the same whole rows of n_kv_head = \
             {n_kv} x head_dim = {hd}"
        )));
    }
    let max_ctx = kc / row_kv;
    let start = read_pos0(args, 6, rows, max_ctx)?;
    let q_row = q_len / rows;
    let q = args.output::<f32>(7)?;
    q.par_chunks_mut(q_row).enumerate().for_each(|(r, o)| {
        let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
        let cos_sin = angle_table(positions[r], base, hd, None, &mut table);
        norm_rotate(&q_in[r * q_row..(r + 1) * q_row], q_w, eps, cos_sin, o);
    });
    // k normalized and rotated a head at a time (no buffer of the pass's rows), straight into its
    // cache's row; v copied into its cache's.
    let rows_at = CacheRows {
        hd,
        n_kv,
        max_ctx,
        start,
    };
    let k_norm = KNorm {
        weight: k_w,
        eps,
        base,
        positions,
    };
    if cache_f16 {
        rows_at.write(args.output::<f16>(8)?, k_in, Some(&k_norm));
        rows_at.write(args.output::<f16>(9)?, v, None);
    } else {
        rows_at.write(args.output::<f32>(8)?, k_in, Some(&k_norm));
        rows_at.write(args.output::<f32>(9)?, v, None);
    }
    Ok(())
}

/// How k's heads are normalized and rotated on their way into the cache.
struct KNorm<'a> {
    weight: &'a [f32],
    eps: f32,
    base: f32,
    positions: &'a [i32],
}

/// Where a pass's rows go in a `[n_kv_head, max_ctx, head_dim]` cache.
struct CacheRows {
    hd: usize,
    n_kv: usize,
    max_ctx: usize,
    start: usize,
}

impl CacheRows {
    /// Writes `src`'s rows (`[rows, n_kv * hd]`) into rows `start..` of every head's slab, each
    /// head normalized and rotated first where `norm` says (the row's angles computed once), each
    /// value converted once from f32.
    fn write<C: Float>(&self, cache: &mut [C], src: &[f32], norm: Option<&KNorm<'_>>) {
        let (hd, row) = (self.hd, self.n_kv * self.hd);
        let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
        let mut head = [0f32; 2 * MAX_ROPE_PAIRS];
        for (r, src_row) in src.chunks_exact(row).enumerate() {
            let cos_sin = norm.map(|n| angle_table(n.positions[r], n.base, hd, None, &mut table));
            for (h, xh) in src_row.chunks_exact(hd).enumerate() {
                let vals = match (norm, cos_sin) {
                    (Some(n), Some(cs)) => {
                        norm_rotate(xh, n.weight, n.eps, cs, &mut head[..hd]);
                        &head[..hd]
                    }
                    _ => xh,
                };
                let at = (h * self.max_ctx + self.start + r) * hd;
                for (o, &x) in cache[at..at + hd].iter_mut().zip(vals) {
                    *o = C::from_f32(x);
                }
            }
        }
    }
}
