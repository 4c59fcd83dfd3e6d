//! The fusion rules that make a decoder block's fused kernels ([`super::fused_block`]) out of the
//! plain ops a model records:
//!
//! - [`NORM_QKV_ROPE_FUSION`]: an f32 `rms_norm` whose output exactly three products read, one
//!   rotated in place and nothing else (q), one rotated in place and then written into a KV cache
//!   (k), one written into a KV cache (v), becomes one `norm_qkv_rope` (the `_ff` kernels where
//!   both rotations take the same frequency factors, as Llama 3's files give them).
//! - [`NORM_QKV_FUSION`]: an f32 `rms_norm` whose output exactly three products read, the
//!   second and third of one width (k and v, in the order the model records them), whatever
//!   reads their outputs, becomes one `norm_qkv` (the per-head norms of Qwen 3 and Gemma 3 sit
//!   between the products and the RoPE, so [`NORM_QKV_ROPE_FUSION`] does not match them).
//! - [`NORM_GATE_UP_FUSION`]: an f32 `rms_norm` whose output exactly two products read, both
//!   read only by one out-of-place f32 SwiGLU or GeGLU (as its `gate` and `up`), becomes one
//!   `norm_gate_up` with the matching activation ([`GateActivation`]).
//!
//! The matchers follow the data flow from the norm (who reads each output before it is
//! overwritten), check the kernels by their declarations (the f32 norm with a weight, products of
//! one weight format, or for the attention input v of a second format the fused kernels take, RoPE
//! in place turning whole heads (with or without frequency factors), f32 or f16 caches of one type)
//! and the sizes, and leave the proof that the intermediates (the norm's output, the k and v
//! products) are dead to the fuse pass. Which backends use them, for which passes, is each
//! backend's declaration ([`Capabilities::fusions`](crate::backend::Capabilities::fusions)).

use super::fused_block::{gate_up_spec, qkv_rope_spec, GateActivation, QkvRope};
use super::norm_qkv::{qkv_spec, Qkv};
use super::rope::RopeMode;
use crate::backend::Buffer;
use crate::graph::passes::{At, Found, FusionRule, Matcher};
use crate::graph::{DispatchRef, KernelId, OpKind, Range, Scalar};
use crate::kernels::{elementwise as ew, misc as km, norm as kn};

/// An f32 `rms_norm` with a weight.
struct Norm<'g> {
    x: &'g Buffer,
    weight: &'g Buffer,
    out: &'g Buffer,
    eps: f32,
}

fn plain_norm(d: DispatchRef<'_>) -> Option<Norm<'_>> {
    if d.kernel() != KernelId::of(&kn::RMS_NORM[0]) {
        return None;
    }
    let Scalar::F32(eps) = d.scalar("eps")? else {
        return None;
    };
    let x = d.buffer("x")?;
    (x.shape().rank() == 2).then_some(())?;
    Some(Norm {
        x,
        weight: d.buffer("weight")?,
        out: d.buffer("out")?,
        eps,
    })
}

/// A plain product reading the norm's output.
struct Product<'g> {
    at: At,
    w: &'g Buffer,
    out: &'g Buffer,
}

/// Whether `a` and `b` are the same view: same bytes, same shape.
pub(super) fn same_view(a: &Buffer, b: &Buffer) -> bool {
    Range::of(a) == Range::of(b) && a.dims() == b.dims()
}

/// The `count` products that read the norm's output (and nothing else reads it before it is
/// overwritten), each reading exactly it. Their weight formats are the fused op's to check: one
/// format for gate and up, q's and k's for v or a pair the fused kernels take
/// ([`QKV_MIXED_FORMATS`](super::fused_block::QKV_MIXED_FORMATS)).
fn products<'g>(m: &Matcher<'g>, at: At, xn: &Buffer, count: usize) -> Option<Vec<Product<'g>>> {
    let mut found = Vec::with_capacity(count);
    for r in m.readers(at, Range::of(xn)) {
        let d = m.dispatch(r);
        super::matmul::plain_product_format(d.kernel())?;
        if !same_view(d.buffer("x")?, xn) {
            return None;
        }
        found.push(Product {
            at: r,
            w: d.buffer("w")?,
            out: d.buffer("out")?,
        });
        if found.len() > count {
            return None;
        }
    }
    (found.len() == count).then_some(found)
}

/// An in-place f32 RoPE of exactly `t`, turning whole heads: `(positions, head_dim, base, mode)`
/// and its frequency factors, if any.
type HeadRope<'g> = ((&'g Buffer, u32, f32, u32), Option<&'g Buffer>);

fn whole_head_rope<'g>(d: DispatchRef<'g>, t: &Buffer) -> Option<HeadRope<'g>> {
    let ff = if d.kernel() == KernelId::of(&km::ROPE_INPLACE[0]) {
        None
    } else if d.kernel() == KernelId::of(&km::ROPE_FF_INPLACE[0]) {
        Some(d.buffer("freq_factors")?)
    } else {
        return None;
    };
    if !same_view(d.buffer("x")?, t) {
        return None;
    }
    let (Scalar::U32(hd), Scalar::U32(rd), Scalar::F32(base), Scalar::U32(mode)) = (
        d.scalar("head_dim")?,
        d.scalar("rotary_dim")?,
        d.scalar("base")?,
        d.scalar("mode")?,
    ) else {
        return None;
    };
    (hd == rd).then_some(((d.buffer("positions")?, hd, base, mode), ff))
}

/// A write of exactly `new` into an f32 or f16 cache: `(step, cache, n_kv_head)`.
fn cache_write<'g>(d: DispatchRef<'g>, new: &Buffer) -> Option<(&'g Buffer, &'g Buffer, u32)> {
    let cache_kernel = matches!(d.kernel().index_in(&km::KV_WRITE), Some(0 | 1));
    if !cache_kernel || !same_view(d.buffer("new")?, new) {
        return None;
    }
    let Scalar::U32(n_kv) = d.scalar("n_kv_head")? else {
        return None;
    };
    Some((d.buffer("step")?, d.buffer("cache")?, n_kv))
}

/// What the data flow after one of the three products says it is.
enum Role {
    /// Rotated, then read by others (attention).
    Q { rope: At },
    /// Rotated, then written into a cache.
    K { rope: At, write: At },
    /// Written into a cache.
    V { write: At },
}

fn role(m: &Matcher<'_>, p: &Product<'_>) -> Option<Role> {
    let first = m.only_reader(p.at, Range::of(p.out))?;
    let d = m.dispatch(first);
    match d.op() {
        OpKind::Rope => {
            whole_head_rope(d, p.out)?;
            let next = m.readers(first, Range::of(p.out)).next();
            match next {
                Some(w) if cache_write(m.dispatch(w), p.out).is_some() => Some(Role::K {
                    rope: first,
                    write: w,
                }),
                _ => Some(Role::Q { rope: first }),
            }
        }
        OpKind::KvWrite => {
            cache_write(d, p.out)?;
            Some(Role::V { write: first })
        }
        _ => None,
    }
}

fn find_norm_qkv_rope<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    let norm = plain_norm(m.dispatch(at))?;
    let prods = products(m, at, norm.out, 3)?;
    let (mut q, mut k, mut v) = (None, None, None);
    for p in &prods {
        match role(m, p)? {
            Role::Q { rope } => q = Some((p, rope)),
            Role::K { rope, write } => k = Some((p, rope, write)),
            Role::V { write } => v = Some((p, write)),
        }
    }
    let ((q, q_rope), (k, k_rope, k_write), (v, v_write)) = (q?, k?, v?);
    let ((positions, hd, base, mode), ff) = whole_head_rope(m.dispatch(q_rope), q.out)?;
    let (k_rot, k_ff) = whole_head_rope(m.dispatch(k_rope), k.out)?;
    let same_ff = match (ff, k_ff) {
        (None, None) => true,
        (Some(a), Some(b)) => same_view(a, b),
        _ => false,
    };
    if !same_view(k_rot.0, positions) || (k_rot.1, k_rot.2, k_rot.3) != (hd, base, mode) || !same_ff
    {
        return None;
    }
    let (step, k_cache, n_kv) = cache_write(m.dispatch(k_write), k.out)?;
    let (v_step, v_cache, v_kv) = cache_write(m.dispatch(v_write), v.out)?;
    if !same_view(step, v_step) || v_kv != n_kv || hd == 0 || v_cache.dtype() != k_cache.dtype() {
        return None;
    }
    let (rows, hd) = (norm.x.dims()[0], hd as usize);
    let q_width = q.out.elems() / rows.max(1);
    let p = QkvRope {
        x: norm.x,
        norm: norm.weight,
        eps: norm.eps,
        wq: q.w,
        wk: k.w,
        wv: v.w,
        positions,
        freq_factors: ff,
        step,
        q: q.out,
        k_cache,
        v_cache,
        n_head: q_width / hd,
        n_kv_head: n_kv as usize,
        head_dim: hd,
        base,
        mode: match mode {
            0 => RopeMode::Normal,
            1 => RopeMode::NeoX,
            _ => return None,
        },
    };
    // The products' widths must be what the fused kernel derives from the heads.
    let widths_fit = q_width % hd == 0
        && k.out.elems() == rows * p.n_kv_head * hd
        && v.out.elems() == k.out.elems();
    if !widths_fit {
        return None;
    }
    let spec = qkv_rope_spec(&p).ok()?;
    let nodes = [at, q.at, k.at, v.at, q_rope, k_rope, k_write, v_write];
    Found::new(&nodes, spec, rows)
}

fn find_norm_qkv<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    let norm = plain_norm(m.dispatch(at))?;
    let prods = products(m, at, norm.out, 3)?;
    let [q, k, v] = [&prods[0], &prods[1], &prods[2]];
    let p = Qkv {
        x: norm.x,
        norm: norm.weight,
        eps: norm.eps,
        wq: q.w,
        wk: k.w,
        wv: v.w,
        q: q.out,
        k: k.out,
        v: v.out,
    };
    let spec = qkv_spec(&p).ok()?;
    Found::new(&[at, q.at, k.at, v.at], spec, norm.x.dims()[0])
}

fn find_norm_gate_up<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    let norm = plain_norm(m.dispatch(at))?;
    let prods = products(m, at, norm.out, 2)?;
    let glu = m.only_reader(prods[0].at, Range::of(prods[0].out))?;
    if m.only_reader(prods[1].at, Range::of(prods[1].out))? != glu {
        return None;
    }
    let d = m.dispatch(glu);
    let act = if d.kernel() == KernelId::of(&ew::SWIGLU[0]) {
        GateActivation::Silu
    } else if d.kernel() == KernelId::of(&ew::GEGLU[0]) {
        GateActivation::GeluTanh
    } else {
        return None;
    };
    let (gate, up, hidden) = (d.buffer("gate")?, d.buffer("up")?, d.buffer("out")?);
    let (g, u) = if same_view(gate, prods[0].out) && same_view(up, prods[1].out) {
        (&prods[0], &prods[1])
    } else if same_view(gate, prods[1].out) && same_view(up, prods[0].out) {
        (&prods[1], &prods[0])
    } else {
        return None;
    };
    if hidden.elems() != g.out.elems() {
        return None;
    }
    let spec = gate_up_spec(norm.x, norm.weight, norm.eps, g.w, u.w, hidden, act).ok()?;
    Found::new(&[at, g.at, u.at, glu], spec, norm.x.dims()[0])
}

/// `rms_norm -> {matmul q, matmul k, matmul v} -> rope q, rope k -> kv_write k, kv_write v`
/// becomes one `norm_qkv_rope`.
pub const NORM_QKV_ROPE_FUSION: FusionRule = FusionRule::graph(
    "rms_norm+qkv+rope+kv_write",
    OpKind::RmsNorm,
    "rms_norm -> {matmul q, matmul k, matmul v} -> {rope q, rope k} -> {kv_write k, kv_write v}",
    find_norm_qkv_rope,
);

/// `rms_norm -> {matmul q, matmul k, matmul v}` becomes one `norm_qkv`.
pub const NORM_QKV_FUSION: FusionRule = FusionRule::graph(
    "rms_norm+qkv",
    OpKind::RmsNorm,
    "rms_norm -> {matmul q, matmul k, matmul v} (k and v of one width)",
    find_norm_qkv,
);

/// `rms_norm -> {matmul gate, matmul up} -> swiglu | geglu` becomes one `norm_gate_up` computing
/// SwiGLU or GeGLU.
pub const NORM_GATE_UP_FUSION: FusionRule = FusionRule::graph(
    "rms_norm+gate_up+glu",
    OpKind::RmsNorm,
    "rms_norm -> {matmul gate, matmul up} -> swiglu | geglu",
    find_norm_gate_up,
);
