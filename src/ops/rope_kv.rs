//! The fusion of a prompt's RoPE and KV cache writes: [`ROPE_KV_FUSION`] turns an in-place f32
//! `rope` of q, the next reader of its positions (the in-place `rope` of k, with the same
//! positions, parameters and frequency factors), the `kv_write` of k into an f32 or f16 cache (k's
//! one reader) and the next reader of that write's step (the `kv_write` of v into a cache of the
//! same shape and type) into one `rope_kv_f32` (or `rope_ff_kv_f32`): q rotated in place, k rotated
//! straight into its cache, v copied into its cache (an f16 cache takes each value rounded to
//! nearest once, as `kv_write` rounds it); k itself is not written.
//!
//! Why: on the Llama 3.1 8B shape a 512-token prompt spent four kernels a layer on this (two
//! ropes of about 9.6 us and two cache writes of about 9.1 us on an H100), each mostly the
//! latency of one chain: the row's angles (an f64 `pow` and `sincos` a pair), or a launch with
//! little work. One kernel computes the angles once for q and k.
//!
//! The fused kernel rotates with the rope kernel's arithmetic and copies as the cache write does,
//! so it gives the four dispatches' bits (the backends declare it exact). A decode step's RoPE
//! and cache writes go into the block fusion first where a backend makes it.

use crate::backend::{Buffer, DType};
use crate::graph::passes::{At, Found, FusionRule, Matcher};
use crate::graph::{ArgRef, DispatchRef, DispatchSpec, Grid, KernelId, OpKind, Range, Scalar};
use crate::kernels::misc as km;

/// An in-place f32 rope: its place, buffers and parameters.
struct Rope<'g> {
    at: At,
    x: &'g Buffer,
    positions: &'g Buffer,
    freq_factors: Option<&'g Buffer>,
    scalars: [Scalar; 4],
}

fn rope_in_place<'g>(m: &Matcher<'g>, at: At) -> Option<Rope<'g>> {
    let d: DispatchRef<'g> = m.dispatch(at);
    let ff = if d.kernel() == KernelId::of(&km::ROPE_INPLACE[0]) {
        false
    } else if d.kernel() == KernelId::of(&km::ROPE_FF_INPLACE[0]) {
        true
    } else {
        return None;
    };
    Some(Rope {
        at,
        x: d.buffer("x")?,
        positions: d.buffer("positions")?,
        freq_factors: if ff {
            Some(d.buffer("freq_factors")?)
        } else {
            None
        },
        scalars: [
            d.scalar("head_dim")?,
            d.scalar("rotary_dim")?,
            d.scalar("base")?,
            d.scalar("mode")?,
        ],
    })
}

/// A `kv_write` into an f32 or f16 cache: its place and buffers, and its `n_kv_head` and
/// `head_dim`.
struct CacheWrite<'g> {
    at: At,
    new: &'g Buffer,
    step: &'g Buffer,
    cache: &'g Buffer,
    sizes: [Scalar; 2],
}

fn cache_write<'g>(m: &Matcher<'g>, at: At) -> Option<CacheWrite<'g>> {
    let d: DispatchRef<'g> = m.dispatch(at);
    if !matches!(d.kernel().index_in(&km::KV_WRITE), Some(0 | 1)) {
        return None;
    }
    Some(CacheWrite {
        at,
        new: d.buffer("new")?,
        step: d.buffer("step")?,
        cache: d.buffer("cache")?,
        sizes: [d.scalar("n_kv_head")?, d.scalar("head_dim")?],
    })
}

fn same(a: &Buffer, b: &Buffer) -> bool {
    Range::of(a) == Range::of(b) && a.dims() == b.dims()
}

fn find_rope_kv<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    let rq = rope_in_place(m, at)?;
    let rk = rope_in_place(m, m.readers(at, Range::of(rq.positions)).next()?)?;
    let same_rope = same(rk.positions, rq.positions)
        && rk.scalars == rq.scalars
        && match (rq.freq_factors, rk.freq_factors) {
            (None, None) => true,
            (Some(a), Some(b)) => same(a, b),
            _ => false,
        };
    if !same_rope || rq.x.overlaps(rk.x) {
        return None;
    }
    let wk = cache_write(m, m.only_reader(rk.at, Range::of(rk.x))?)?;
    let wv = cache_write(m, m.readers(wk.at, Range::of(wk.step)).next()?)?;
    let (k, v) = (rk.x, wv.new);
    let fits = same(wk.new, k)
        && same(wv.step, wk.step)
        && wv.sizes == wk.sizes
        && wk.sizes[1] == rq.scalars[0]
        && v.dims() == k.dims()
        && wv.cache.dims() == wk.cache.dims()
        && wv.cache.dtype() == wk.cache.dtype()
        && [k, v].iter().all(|b| b.dtype() == DType::F32);
    if !fits {
        return None;
    }
    // What the fused kernel writes (q, both caches) apart from everything else it touches.
    let mut read = vec![k, v, rq.positions, wk.step];
    read.extend(rq.freq_factors);
    let written = [rq.x, wk.cache, wv.cache];
    let apart = written.iter().enumerate().all(|(i, w)| {
        read.iter().all(|r| !w.overlaps(r)) && written[i + 1..].iter().all(|o| !w.overlaps(o))
    });
    if !apart {
        return None;
    }
    let rows = rq.positions.elems();
    let mut args = vec![
        ArgRef::read_write(rq.x),
        ArgRef::read(k),
        ArgRef::read(v),
        ArgRef::read(rq.positions),
    ];
    args.extend(rq.freq_factors.map(ArgRef::read));
    args.extend([
        ArgRef::read(wk.step),
        ArgRef::write(wk.cache),
        ArgRef::write(wv.cache),
    ]);
    args.extend(rq.scalars.map(ArgRef::Scalar));
    args.push(ArgRef::Scalar(wk.sizes[0]));
    args.push(ArgRef::u32(u32::from(wk.cache.dtype() == DType::F16)));
    let kernel = &km::ROPE_KV[rq.freq_factors.is_some() as usize];
    // The rope's launch: one block of 128 threads a row.
    let grid = Grid::new(rows.min(u32::MAX as usize) as u32, 128);
    let spec = DispatchSpec::new(KernelId::of(kernel), &args, grid).ok()?;
    Found::new(&[rq.at, rk.at, wk.at, wv.at], spec, rows)
}

/// `rope q` in place, the next reader of its positions `rope k` in place (same parameters),
/// `kv_write k` into an f32 or f16 cache (k's one reader) and the next reader of its step `kv_write v`
/// become one `rope_kv_f32` / `rope_ff_kv_f32`.
pub const ROPE_KV_FUSION: FusionRule = FusionRule::graph(
    "rope_kv",
    OpKind::Rope,
    "rope q (in place) -> {rope k (in place), kv_write k, kv_write v} (f32, one step)",
    find_rope_kv,
);

#[cfg(test)]
#[path = "rope_kv_tests.rs"]
mod tests;
