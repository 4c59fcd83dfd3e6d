//! The per-head RMS norm fused with the RoPE that follows it (`rms_norm_rope`), and the fusion
//! rule [`RMS_NORM_ROPE_FUSION`] that makes it out of the pair the query and key norms of Gemma 3
//! and Qwen 3 record: an `rms_norm` over rows of one head (`[rows * n_heads, head_dim]`) followed
//! by an in-place `rope` of its output (viewed as `[rows, n_heads * head_dim]`).
//!
//! The fused kernel normalizes every head of a row as `rms_norm` does (f64 sum of squares, f32
//! products in the same order) and rotates it as `rope` does (the same angle table), so it gives
//! the bits of the pair. f32 only, no frequency factors. On CUDA a warp takes a head (a block took
//! a row's heads one after another: a decode step's queries were 16 block reductions in a row for
//! Qwen 3), reducing it in the order of the norm kernel's block.

use crate::backend::{Buffer, DType};
use crate::error::{Error, Result};
use crate::graph::passes::FusionRule;
use crate::graph::{
    ArgRef, Dispatch, DispatchRef, DispatchSpec, Grid, KernelId, OpKind, Range, Scalar,
};
use crate::kernels::{misc as km, norm as kn};
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::fused_block::one_device;
use crate::ops::norm::{norm_operands, ROW_THREADS};
use crate::ops::rope::{check_rotation, RopeMode, RopeParams};
use crate::ops::Check;

/// `out = rope(rms_norm(x, weight))`: every head of `head_dim` values of `x` is normalized with
/// `weight` (`[head_dim]`), then rotated by its row's position (`positions`, i32 `[rows]`) as
/// [`rope`](crate::ops::rope::rope) does with `params`. `out` is `[rows, n_heads * head_dim]` (or
/// `[rows, n_heads, head_dim]`), f32, and shares no byte with `x`, `weight` or `positions`; `x`
/// holds as many f32 values as `out`, in any shape. `params` must have no frequency factors.
pub fn rms_norm_rope(
    x: &Buffer,
    weight: &Buffer,
    positions: &Buffer,
    out: &Buffer,
    eps: f32,
    params: &RopeParams<'_>,
) -> Result<Dispatch> {
    rms_norm_rope_spec(x, weight, positions, out, eps, params)?.to_dispatch()
}

/// [`rms_norm_rope`] as a spec borrowing its buffers (what the fusion rule builds).
fn rms_norm_rope_spec<'a>(
    x: &'a Buffer,
    weight: &'a Buffer,
    positions: &'a Buffer,
    out: &'a Buffer,
    eps: f32,
    params: &RopeParams<'_>,
) -> Result<DispatchSpec<'a>> {
    let check = Check::op("rms_norm_rope");
    let RopeParams {
        mode,
        head_dim,
        rotary_dim,
        base,
        freq_factors,
    } = *params;
    check.require("freq_factors", freq_factors.is_none(), || {
        "are not supported by the fused kernel".into()
    })?;
    check.dtype("out", out, &[DType::F32])?;
    check.require("out", out.shape().rank() >= 2 && out.elems() > 0, || {
        format!(
            "has shape {:?}, expected [rows, n_heads * head_dim]",
            out.dims()
        )
    })?;
    check.dtype("x", x, &[DType::F32])?;
    check.require("x", x.elems() == out.elems(), || {
        format!(
            "has {} values, out {}: they must match",
            x.elems(),
            out.elems()
        )
    })?;
    let rows = out.dims()[0];
    let row_len = out.elems() / rows;
    check_rotation(&check, row_len, head_dim, rotary_dim, base)?;
    check.require("eps", eps.is_finite() && eps >= 0.0, || {
        format!("{eps} is not a finite non-negative number")
    })?;
    check.dtype("weight", weight, &[DType::F32])?;
    check.elems("weight", weight, head_dim)?;
    check.dtype("positions", positions, &[DType::I32])?;
    check.elems("positions", positions, rows)?;
    check_disjoint(
        &check,
        "out",
        out,
        &[("x", x), ("weight", weight), ("positions", positions)],
    )?;
    let args = [
        ArgRef::read(x),
        ArgRef::read(weight),
        ArgRef::read(positions),
        ArgRef::write(out),
        ArgRef::f32(eps),
        ArgRef::u32(u32_size(&check, "head_dim", head_dim)?),
        ArgRef::u32(u32_size(&check, "rotary_dim", rotary_dim)?),
        ArgRef::f32(base),
        ArgRef::u32(match mode {
            RopeMode::Normal => 0,
            RopeMode::NeoX => 1,
        }),
    ];
    // A warp a head, blocks of the norm's size (each warp reduces its head as a block of that
    // size does in the plain norm, whatever the launch): a row's heads in ceil(heads / 8) blocks.
    let warps = (ROW_THREADS / 32) as usize;
    let blocks = rows.saturating_mul((row_len / head_dim).div_ceil(warps));
    let grid = Grid::new(blocks.min(u32::MAX as usize) as u32, ROW_THREADS);
    // The weight and each warp's head staged in shared memory for heads of up to 1,024 values
    // (`RNR_STAGE_MAX` in rope.cu; 36 KiB with the angle table); else read from global memory.
    // Heads of NeoX pairs turning whole, of up to 256 values and a whole number of pairs a lane
    // (Gemma 3's 256, Qwen 3's 128) stay in registers (`rnr_regs_ok`) and take no stage.
    let stage = 4 * head_dim * (1 + warps);
    let in_registers = mode == RopeMode::NeoX
        && rotary_dim == head_dim
        && head_dim <= 256
        && (head_dim / 2).is_multiple_of(32);
    let grid = if !in_registers && head_dim <= 1024 {
        grid.with_shared(stage as u32)
    } else {
        grid
    };
    DispatchSpec::new(KernelId::of(&kn::RMS_NORM_ROPE[0]), &args, grid)
}

/// A norm + in-place RoPE pair that matches [`RMS_NORM_ROPE_FUSION`].
struct NormRope<'a> {
    x: &'a Buffer,
    weight: &'a Buffer,
    eps: f32,
    /// The norm's output (the intermediate, and the fused kernel's output range).
    norm_out: &'a Buffer,
    /// The norm's output as the rope reads and writes it.
    rope_x: &'a Buffer,
    positions: &'a Buffer,
    mode: RopeMode,
    head_dim: usize,
    rotary_dim: usize,
    base: f32,
}

/// The u32 scalar `name` of `d`, as a usize.
fn u32_scalar(d: DispatchRef<'_>, name: &str) -> Option<usize> {
    match d.scalar(name)? {
        Scalar::U32(v) => Some(v as usize),
        _ => None,
    }
}

/// Matches an f32 `rms_norm` with a weight and an in-place `rope` without frequency factors
/// whose `x` is exactly the norm's output bytes (rope x == rope out == norm out), with the
/// norm's row length equal to the rope's `head_dim` (so the norm's rows are the rope's heads),
/// the norm's input sharing no byte with its output, and everything on one device. An
/// out-of-place rope (into another buffer) does not fuse.
fn norm_rope_match<'a>(norm: DispatchRef<'a>, rope: DispatchRef<'a>) -> Option<NormRope<'a>> {
    let (x, weight, norm_out, eps) = norm_operands(norm)?;
    let weight = weight?;
    if !norm.kernel().is_in(&kn::RMS_NORM) || !rope.kernel().is_in(&km::ROPE_INPLACE) {
        return None;
    }
    let rope_x = rope.buffer("x")?;
    let positions = rope.buffer("positions")?;
    let head_dim = u32_scalar(rope, "head_dim")?;
    let rotary_dim = u32_scalar(rope, "rotary_dim")?;
    let mode = match u32_scalar(rope, "mode")? {
        0 => RopeMode::Normal,
        1 => RopeMode::NeoX,
        _ => return None,
    };
    let Some(Scalar::F32(base)) = rope.scalar("base") else {
        return None;
    };
    let f32s = [x, weight, norm_out, rope_x]
        .iter()
        .all(|b| b.dtype() == DType::F32);
    let same_bytes = Range::of(rope_x) == Range::of(norm_out) && rope_x.elems() == norm_out.elems();
    let heads = head_dim > 0 && norm_out.shape().last() == head_dim;
    let apart = !x.overlaps(norm_out)
        && !weight.overlaps(norm_out)
        && !positions.overlaps(norm_out)
        && one_device(positions, norm_out)
        && one_device(x, norm_out);
    (f32s && same_bytes && heads && apart).then_some(NormRope {
        x,
        weight,
        eps,
        norm_out,
        rope_x,
        positions,
        mode,
        head_dim,
        rotary_dim,
        base,
    })
}

fn norm_rope_intermediate(norm: DispatchRef<'_>, rope: DispatchRef<'_>) -> Option<Range> {
    norm_rope_match(norm, rope).map(|p| Range::of(p.norm_out))
}

fn build_norm_rope<'a>(norm: DispatchRef<'a>, rope: DispatchRef<'a>) -> Result<DispatchSpec<'a>> {
    let p = norm_rope_match(norm, rope)
        .ok_or_else(|| Error::InvalidArgument("rms_norm + rope: the pair does not match".into()))?;
    let params = RopeParams {
        mode: p.mode,
        head_dim: p.head_dim,
        rotary_dim: p.rotary_dim,
        base: p.base,
        freq_factors: None,
    };
    rms_norm_rope_spec(p.x, p.weight, p.positions, p.rope_x, p.eps, &params)
}

/// A per-head `rms_norm` (with a weight, f32) followed by the in-place `rope` of its whole output
/// (no frequency factors) becomes one `rms_norm_rope` that reads the norm's input and writes the
/// rotated heads over the norm's output range.
pub const RMS_NORM_ROPE_FUSION: FusionRule = FusionRule::pair(
    "rms_norm+rope",
    OpKind::RmsNorm,
    OpKind::Rope,
    norm_rope_intermediate,
    build_norm_rope,
);

#[cfg(test)]
#[path = "norm_rope_tests.rs"]
mod tests;
