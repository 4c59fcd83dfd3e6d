//! The query and key norms of a block with their RoPE and the KV cache writes after them, in one
//! dispatch ([`rms_norm_rope_kv`]), and the fusion rule [`RMS_NORM_ROPE_KV_FUSION`] that makes it
//! out of what Qwen 3 and Gemma 3 record once [`RMS_NORM_ROPE_FUSION`] has fused each norm with
//! its rotation: `rms_norm_rope` of q, `rms_norm_rope` of k (the next reader of q's positions,
//! with the same parameters), the `kv_write` of k (its output's one reader) and the `kv_write` of
//! v (the next reader of that write's step, into a cache of the same shape and type).
//!
//! Why: a decode step ran the two norms side by side and then k's cache write, one level of the
//! step's chain and three kernels more a layer (Qwen 3 0.6B: 28 layers).
//!
//! The fused kernel normalizes and rotates each head as `rms_norm_rope` does and writes the
//! caches as `kv_write` does (an f16 cache takes each value rounded to nearest once), so it gives
//! the four dispatches' bits (the backends declare it exact). It takes NeoX heads turning whole,
//! of 64, 128, 192 or 256 values (on CUDA a warp holds a head in registers, two to eight values a
//! lane; Qwen 3's heads are 128 values, Gemma 3's 256); other heads keep the separate dispatches.
//!
//! [`RMS_NORM_ROPE_FUSION`]: super::norm_rope::RMS_NORM_ROPE_FUSION

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::passes::{At, Found, FusionRule, Matcher};
use crate::graph::{
    ArgRef, Dispatch, DispatchRef, DispatchSpec, Grid, KernelId, OpKind, Range, Scalar,
};
use crate::kernels::{misc as km, norm as kn};
use crate::ops::block_fusion::same_view;
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::fused_block::one_device;
use crate::ops::norm::ROW_THREADS;
use crate::ops::rope::RopeMode;
use crate::ops::Check;

const OP: &str = "rms_norm_rope_kv";

/// The arguments of [`rms_norm_rope_kv`].
#[derive(Debug, Clone, Copy)]
pub struct NormRopeKv<'a> {
    /// The queries before their norm, f32 `[rows, n_head * head_dim]`.
    pub q_in: &'a Buffer,
    /// The query norm's weight, f32 `[head_dim]`.
    pub q_weight: &'a Buffer,
    /// The keys before their norm, f32 `[rows, n_kv_head * head_dim]`.
    pub k_in: &'a Buffer,
    /// The key norm's weight, f32 `[head_dim]`.
    pub k_weight: &'a Buffer,
    /// The values, f32 `[rows, n_kv_head * head_dim]`.
    pub v: &'a Buffer,
    /// i32 `[rows]`: each row's position.
    pub positions: &'a Buffer,
    /// i32 step buffer: `step[0]` is the cache row of the first row.
    pub step: &'a Buffer,
    /// Output queries, f32 like `q_in`, sharing no byte with the inputs.
    pub q: &'a Buffer,
    /// Key cache, f32 or f16 `[n_kv_head, max_ctx, head_dim]`.
    pub k_cache: &'a Buffer,
    /// Value cache, as `k_cache`.
    pub v_cache: &'a Buffer,
    /// The norms' epsilon (one for both).
    pub eps: f32,
    /// Values per head, all of them rotating.
    pub head_dim: usize,
    /// RoPE frequency base.
    pub base: f32,
    /// RoPE pair layout: NeoX only.
    pub mode: RopeMode,
}

/// Whether the fused kernel takes heads of `head_dim` values in `mode`: NeoX, a whole number of
/// pairs a lane of a warp (`head_dim / 2` a multiple of 32), at most 256 values.
pub fn takes_heads(head_dim: usize, mode: RopeMode) -> bool {
    mode == RopeMode::NeoX && head_dim <= 256 && head_dim > 0 && (head_dim / 2).is_multiple_of(32)
}

/// `q = rope(rms_norm(q_in))`, `k_cache[step[0] + r] = rope(rms_norm(k_in))`, `v_cache[step[0] +
/// r] = v`, per head (see the module documentation).
pub fn rms_norm_rope_kv(p: &NormRopeKv<'_>) -> Result<Dispatch> {
    norm_rope_kv_spec(p)?.to_dispatch()
}

/// [`rms_norm_rope_kv`] as a spec borrowing its buffers (what the fusion rule builds).
fn norm_rope_kv_spec<'a>(p: &NormRopeKv<'a>) -> Result<DispatchSpec<'a>> {
    let check = Check::op(OP);
    let hd = p.head_dim;
    check.require("head_dim", takes_heads(hd, p.mode), || {
        format!(
            "{hd} values in {:?} pairs: the fused kernel takes NeoX heads of 64, 128, 192 or 256",
            p.mode
        )
    })?;
    for (name, b) in [
        ("q_in", p.q_in),
        ("q_weight", p.q_weight),
        ("k_in", p.k_in),
        ("k_weight", p.k_weight),
        ("v", p.v),
        ("q", p.q),
    ] {
        check.dtype(name, b, &[DType::F32])?;
    }
    for (name, b) in [
        ("q_in", p.q_in),
        ("q_weight", p.q_weight),
        ("k_in", p.k_in),
        ("k_weight", p.k_weight),
        ("v", p.v),
        ("positions", p.positions),
        ("step", p.step),
        ("k_cache", p.k_cache),
        ("v_cache", p.v_cache),
    ] {
        check.require(name, one_device(p.q, b), || {
            format!(
                "lives on {}, but q lives on {}",
                b.allocation().location(),
                p.q.allocation().location()
            )
        })?;
    }
    check.dtype("positions", p.positions, &[DType::I32])?;
    let rows = p.positions.elems();
    check.require("positions", rows > 0, || "is empty".into())?;
    check.dtype("step", p.step, &[DType::I32])?;
    check.require("step", p.step.elems() >= 1, || "is empty".into())?;
    check.elems("q_weight", p.q_weight, hd)?;
    check.elems("k_weight", p.k_weight, hd)?;
    let q_row = p.q.elems() / rows;
    check.require(
        "q",
        q_row > 0 && p.q.elems() == rows * q_row && q_row.is_multiple_of(hd),
        || {
            format!(
                "has {} values, not {rows} rows of whole heads of {hd}",
                p.q.elems()
            )
        },
    )?;
    check.elems("q_in", p.q_in, p.q.elems())?;
    check.dtype("k_cache", p.k_cache, &[DType::F32, DType::F16])?;
    check.require(
        "k_cache",
        p.k_cache.shape().rank() == 3 && p.k_cache.dims()[2] == hd && p.k_cache.elems() > 0,
        || {
            format!(
                "has shape {:?}, expected [n_kv_head, max_ctx, {hd}]",
                p.k_cache.dims()
            )
        },
    )?;
    let n_kv = p.k_cache.dims()[0];
    check.dtype("v_cache", p.v_cache, &[p.k_cache.dtype()])?;
    check.dims("v_cache", p.v_cache, p.k_cache.dims())?;
    check.elems("k_in", p.k_in, rows * n_kv * hd)?;
    check.elems("v", p.v, rows * n_kv * hd)?;
    check.require("eps", p.eps.is_finite() && p.eps >= 0.0, || {
        format!("{} is not a finite non-negative number", p.eps)
    })?;
    check.require("base", p.base.is_finite() && p.base > 0.0, || {
        format!("{} is not finite and positive", p.base)
    })?;
    check_disjoint(
        &check,
        "q",
        p.q,
        &[
            ("q_in", p.q_in),
            ("q_weight", p.q_weight),
            ("k_in", p.k_in),
            ("v", p.v),
            ("positions", p.positions),
            ("k_cache", p.k_cache),
            ("v_cache", p.v_cache),
        ],
    )?;
    for cache in [("k_cache", p.k_cache), ("v_cache", p.v_cache)] {
        check_disjoint(
            &check,
            cache.0,
            cache.1,
            &[
                ("q_in", p.q_in),
                ("k_in", p.k_in),
                ("v", p.v),
                ("step", p.step),
            ],
        )?;
    }
    check.require("v_cache", !p.k_cache.overlaps(p.v_cache), || {
        "overlaps k_cache".into()
    })?;
    let args = [
        ArgRef::read(p.q_in),
        ArgRef::read(p.q_weight),
        ArgRef::read(p.k_in),
        ArgRef::read(p.k_weight),
        ArgRef::read(p.v),
        ArgRef::read(p.positions),
        ArgRef::read(p.step),
        ArgRef::write(p.q),
        ArgRef::read_write(p.k_cache),
        ArgRef::read_write(p.v_cache),
        ArgRef::f32(p.eps),
        ArgRef::u32(u32_size(&check, "head_dim", hd)?),
        ArgRef::f32(p.base),
        ArgRef::u32(1),
        ArgRef::u32(u32_size(&check, "k_cache", n_kv)?),
        ArgRef::u32(u32::from(p.k_cache.dtype() == DType::F16)),
    ];
    // A warp a head (q's, then k's, then v's), blocks of the norm's size: a row's heads in
    // ceil(heads / 8) blocks.
    let heads = q_row / hd + 2 * n_kv;
    let warps = (ROW_THREADS / 32) as usize;
    let blocks = rows.saturating_mul(heads.div_ceil(warps));
    let grid = Grid::new(blocks.min(u32::MAX as usize) as u32, ROW_THREADS);
    DispatchSpec::new(KernelId::of(&kn::RMS_NORM_ROPE_KV[0]), &args, grid)
}

/// An `rms_norm_rope` dispatch: `(x, weight, positions, out, eps, head_dim, base, mode)`, its
/// rotation turning whole heads.
type NormRope<'g> = (
    &'g Buffer,
    &'g Buffer,
    &'g Buffer,
    &'g Buffer,
    f32,
    u32,
    f32,
    u32,
);

fn norm_rope<'g>(d: DispatchRef<'g>) -> Option<NormRope<'g>> {
    if d.kernel() != KernelId::of(&kn::RMS_NORM_ROPE[0]) {
        return None;
    }
    let (Scalar::F32(eps), Scalar::U32(hd), Scalar::U32(rd), Scalar::F32(base), Scalar::U32(mode)) = (
        d.scalar("eps")?,
        d.scalar("head_dim")?,
        d.scalar("rotary_dim")?,
        d.scalar("base")?,
        d.scalar("mode")?,
    ) else {
        return None;
    };
    (hd == rd).then_some(())?;
    let (x, w, pos, out) = (
        d.buffer("x")?,
        d.buffer("weight")?,
        d.buffer("positions")?,
        d.buffer("out")?,
    );
    Some((x, w, pos, out, eps, hd, base, mode))
}

/// A `kv_write` into an f32 or f16 cache: `(new, step, cache, n_kv_head)`.
fn cache_write<'g>(d: DispatchRef<'g>) -> Option<(&'g Buffer, &'g Buffer, &'g Buffer, u32)> {
    if !matches!(d.kernel().index_in(&km::KV_WRITE), Some(0 | 1)) {
        return None;
    }
    let Scalar::U32(n_kv) = d.scalar("n_kv_head")? else {
        return None;
    };
    Some((
        d.buffer("new")?,
        d.buffer("step")?,
        d.buffer("cache")?,
        n_kv,
    ))
}

fn find_norm_rope_kv<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    let (q_in, q_weight, positions, q, eps, hd, base, mode) = norm_rope(m.dispatch(at))?;
    let k_at = m.readers(at, Range::of(positions)).next()?;
    let (k_in, k_weight, k_pos, k, k_eps, k_hd, k_base, k_mode) = norm_rope(m.dispatch(k_at))?;
    let same = same_view(k_pos, positions)
        && (k_eps, k_hd, k_base, k_mode) == (eps, hd, base, mode)
        && mode == 1;
    if !same {
        return None;
    }
    let kw_at = m.only_reader(k_at, Range::of(k))?;
    let (new_k, step, k_cache, n_kv) = cache_write(m.dispatch(kw_at))?;
    let vw_at = m.readers(kw_at, Range::of(step)).next()?;
    let (v, v_step, v_cache, v_kv) = cache_write(m.dispatch(vw_at))?;
    let fits = same_view(new_k, k)
        && same_view(v_step, step)
        && v_kv == n_kv
        && v_cache.dtype() == k_cache.dtype()
        && v.dtype() == DType::F32
        && k_cache.dims().first() == Some(&(n_kv as usize));
    if !fits {
        return None;
    }
    let p = NormRopeKv {
        q_in,
        q_weight,
        k_in,
        k_weight,
        v,
        positions,
        step,
        q,
        k_cache,
        v_cache,
        eps,
        head_dim: hd as usize,
        base,
        mode: RopeMode::NeoX,
    };
    let spec = norm_rope_kv_spec(&p).ok()?;
    Found::new(&[at, k_at, kw_at, vw_at], spec, positions.elems())
}

/// `rms_norm_rope q -> rms_norm_rope k -> kv_write k, kv_write v` becomes one
/// `rms_norm_rope_kv`.
pub const RMS_NORM_ROPE_KV_FUSION: FusionRule = FusionRule::graph(
    "rms_norm_rope+kv_write",
    OpKind::RmsNormRope,
    "rms_norm_rope q -> rms_norm_rope k -> {kv_write k, kv_write v} (NeoX heads of 64..256)",
    find_norm_rope_kv,
);
