//! Fused decoder-block products: the attention input and the MLP input of a Llama block (and the
//! MLP input of a Gemma 3 block), each one dispatch instead of four to eight, so a decode step
//! has fewer dependent dispatches (every one costs a GPU a launch of a few microseconds and the
//! CPU a fork/join of its pool, however small the work).
//!
//! - [`norm_qkv_rope`]: RMS norm of the residual, the q, k and v products, RoPE on q and k, and the
//!   k and v rows written into the KV cache at `pos0 = step[0]`. Replaces `rms_norm`, three
//!   `matmul`s, two `rope`s and two `kv_write`s.
//! - [`norm_gate_up`]: RMS norm of the residual, the gate and up products and the gated
//!   activation, SwiGLU or GeGLU ([`GateActivation`]). Replaces `rms_norm`, two `matmul`s and
//!   `swiglu` or `geglu`.
//!
//! The kernels do the unfused ops' float operations (the norm's sum of squares in f64,
//! `(x * inv) * w`, the rope angles in f64, the activation with the function of the elementwise
//! kernel of the same backend). On the CPU they run the separate ops' own product loops, so they
//! give the separate ops' bits; on CUDA the sums follow the CUDA matmul's order, so they agree
//! with the separate ops within f32 rounding. Every buffer must live on the device of
//! `x`. RoPE here turns the whole head (`rotary_dim == head_dim`) without frequency factors, and
//! the KV caches are f32 or f16 (each value rounded to nearest once, as `kv_write` rounds it). Models do not call these: they record the separate ops, and the
//! optimizer's rules ([`super::block_fusion`]) make these where the pattern and the backend's
//! declaration allow (other configurations keep the separate ops).
//!
//! A one-row pass of at least 1024 activations takes the `_shared` kernels: on CUDA each block
//! normalizes the row once into shared memory and reads the weight rows of its output pairs
//! through a shared-memory stage; for the 32-value block formats (Q4_0, Q4_1, Q5_0, Q8_0) and Q4_K it also
//! rounds the normalized row to int8 in blocks of 32 values (each block scaled by its largest
//! magnitude over 127) and sums with integer dot products, as the one-row `matmul` does on CUDA,
//! so a product `w_i x_i` moves by at most `|w_i| d / 2` (`d` the block's scale); the other formats
//! keep f32 and the plain kernels' sums. The CPU runs the f32 functions under both names.
//! `docs/kernels.md` has the figures.

use crate::backend::{Buffer, DType};
use crate::error::{Error, Result};
use crate::graph::{ArgRef, Dispatch, DispatchSpec, KernelId};
use crate::kernels::matmul as mm;
pub use crate::kernels::matmul::QKV_MIXED_FORMATS;
use crate::ops::matmul::for_weight;
use crate::ops::matmul::WEIGHT_DTYPES;
use crate::ops::rope::{RopeMode, MAX_ROTARY_DIM};
use crate::ops::Check;

const OP_QKV: &str = "norm_qkv_rope";
const OP_GATE_UP: &str = "norm_gate_up";

/// The arguments of [`norm_qkv_rope`].
#[derive(Debug, Clone, Copy)]
pub struct QkvRope<'a> {
    /// The residual stream, f32 `[rows, dim]`.
    pub x: &'a Buffer,
    /// The attention norm's weight, f32 `[dim]`.
    pub norm: &'a Buffer,
    /// The norm's epsilon.
    pub eps: f32,
    /// Query weight `[n_head * head_dim, dim]`.
    pub wq: &'a Buffer,
    /// Key weight `[n_kv_head * head_dim, dim]`, the same dtype as `wq`.
    pub wk: &'a Buffer,
    /// Value weight `[n_kv_head * head_dim, dim]`: `wq`'s dtype, or the v format beside it in
    /// [`QKV_MIXED_FORMATS`] (Q6_K beside Q4_K, as a llama.cpp Q4_K_M file has it).
    pub wv: &'a Buffer,
    /// i32 `[rows]`: each row's position (its rotation angle).
    pub positions: &'a Buffer,
    /// The RoPE's frequency factors, f32 `[head_dim / 2]` (Llama 3's `rope_freqs`: pair `i`
    /// turns by `pos * base^(-2i / head_dim) / freq_factors[i]`), or `None`.
    pub freq_factors: Option<&'a Buffer>,
    /// i32 step buffer: `step[0]` is the cache row of the first row.
    pub step: &'a Buffer,
    /// Output queries, f32 `[rows, n_head * head_dim]`, rotated.
    pub q: &'a Buffer,
    /// Key cache, f32 `[n_kv_head, max_ctx, head_dim]`.
    pub k_cache: &'a Buffer,
    /// Value cache, as `k_cache`.
    pub v_cache: &'a Buffer,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Values per head (all of them rotate).
    pub head_dim: usize,
    /// RoPE frequency base.
    pub base: f32,
    /// RoPE pair layout.
    pub mode: RopeMode,
}

pub(super) fn to_u32(op: &'static str, arg: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, arg, format!("{v} exceeds 32 bits")))
}

/// Whether two buffers live on one device: both in host memory (the CPU), or both on one CUDA
/// device.
pub(crate) fn one_device(a: &Buffer, b: &Buffer) -> bool {
    a.allocation().home() == b.allocation().home()
}

/// Refuses buffers that do not live on the device of `x`.
pub(super) fn require_one_device(
    check: &Check,
    x: &Buffer,
    bufs: &[(&'static str, &Buffer)],
) -> Result<()> {
    for (name, b) in bufs {
        check.require(name, one_device(x, b), || {
            format!(
                "lives on {}, but x lives on {}",
                b.allocation().location(),
                x.allocation().location()
            )
        })?;
    }
    Ok(())
}

/// Checks a `[n, dim]` weight of a supported dtype.
pub(super) fn check_weight(
    check: &Check,
    name: &'static str,
    w: &Buffer,
    n: usize,
    dim: usize,
) -> Result<()> {
    check.dtype(name, w, &WEIGHT_DTYPES)?;
    check.dims(name, w, &[n, dim])
}

/// Checks the residual `x` and the norm weight, returning `(rows, dim)`.
pub(super) fn check_x_norm(
    check: &Check,
    x: &Buffer,
    norm: &Buffer,
    eps: f32,
) -> Result<(usize, usize)> {
    check.dtype("x", x, &[DType::F32])?;
    check.require("x", x.shape().rank() == 2 && x.elems() > 0, || {
        format!("has shape {:?}, expected [rows, dim]", x.dims())
    })?;
    let (rows, dim) = (x.dims()[0], x.dims()[1]);
    check.dtype("norm", norm, &[DType::F32])?;
    check.elems("norm", norm, dim)?;
    check.require("eps", eps.is_finite() && eps >= 0.0, || {
        format!("{eps} is not a finite non-negative number")
    })?;
    Ok((rows, dim))
}

/// Most bytes of dynamic shared memory a fused kernel asks for (the CUDA default limit).
const MAX_SHARED_ROW: usize = 48 * 1024;
/// Shorter rows are normalized per warp (a SmolLM2-sized step measured no gain from sharing).
const MIN_SHARED_ROW: usize = 4 * 1024;
/// Shared memory after the row: the weight stage (`MM_STAGE_WARPS * MM_STAGE_MAX_WORDS * 16` in
/// `backend/cuda/kernels/matmul_dots.cuh`) and 32 doubles of scratch for the block's sum of
/// squares (`FB_SHARED_TAIL` in `fused_row.cuh`).
const WEIGHT_STAGE: usize = 8 * 136 * 16 + 32 * 8;
/// Threads of a block of the shared-memory form: eight warps, the rms_norm kernel's block size
/// ([`super::norm::ROW_THREADS`]; the kernels sum the squares with that many threads whatever the
/// block, so the block's sum of squares is that kernel's).
const SHARED_THREADS: u32 = super::norm::ROW_THREADS;
/// Most blocks of the shared-memory form: each normalizes the row once, then its warps stride over
/// the outputs, so a wide product pays a few hundred normalizations, not one per four outputs.
/// Two blocks an SM of an H100 (132 SMs; the kernels take at most 128 registers a thread so that
/// two fit): every block starts at once and none repeats the prologue in a second wave.
const SHARED_MAX_BLOCKS: usize = 264;
/// Warps the shared form's grid holds: [`SHARED_MAX_BLOCKS`] blocks of [`SHARED_THREADS`].
const SHARED_MAX_WARPS: usize = SHARED_MAX_BLOCKS * (SHARED_THREADS / 32) as usize;
/// Threads of a block of the shared form where it quantizes its row to int8: the same warps an SM
/// as two blocks of [`SHARED_THREADS`], in one block, so each SM normalizes and quantizes the row
/// once rather than twice (the prologue is most of a decode product's instructions,
/// docs/kernels.md item 22).
const WIDE_THREADS: u32 = 2 * SHARED_THREADS;

/// Whether a pass of `rows` rows of width `dim` takes the shared-memory form of the fused kernels
/// (`*_shared`: the CUDA kernels normalize the row once per block into shared memory and read the
/// weights through a shared-memory stage; the same values, rounded to int8 for the 32-value block
/// formats where the int8 row fits too), and its launch shape: one
/// warp per output (pair); for the shared form eight-warp blocks, at most [`SHARED_MAX_BLOCKS`]
/// (sixteen-warp blocks, one an SM, where a Q4_0, Q4_K or Q6_K product's row is quantized:
/// [`WIDE_THREADS`]), with that memory and `extra` bytes after it where they fit too
/// (`norm_qkv_rope`'s rope table; the kernel uses them only when given; a one-row per-warp pass
/// takes them alone).
pub(super) fn fused_launch(
    outputs: usize,
    rows: usize,
    dim: usize,
    w: DType,
    extra: usize,
) -> (bool, crate::graph::Grid) {
    let f32_bytes = dim * 4 + WEIGHT_STAGE;
    // The int8 row after the tail where it fits (see `fb_norm_quantize_row` in fused_row.cuh).
    let (mut bytes, int8) = match super::matmul::int8_row_bytes(w, dim) {
        Some(q8) if f32_bytes + q8 <= MAX_SHARED_ROW => (f32_bytes + q8, true),
        _ => (f32_bytes, false),
    };
    if rows == 1 && dim * 4 >= MIN_SHARED_ROW && bytes <= MAX_SHARED_ROW {
        if bytes + extra <= MAX_SHARED_ROW {
            bytes += extra;
        }
        // Q4_1, Q5_0 and Q8_0 rows go through the weight stage, sized for eight warps.
        let (threads, per_sm) = if int8 && matches!(w, DType::Q4_0 | DType::Q4K | DType::Q6K) {
            (WIDE_THREADS, 1)
        } else {
            (SHARED_THREADS, super::matmul::ONE_WAVE_BLOCKS_PER_SM)
        };
        let warps_per_block = (threads / 32) as usize;
        let blocks = outputs
            .div_ceil(warps_per_block)
            .clamp(1, SHARED_MAX_WARPS / warps_per_block);
        let grid = crate::graph::Grid::new(blocks as u32, threads)
            .with_shared(bytes as u32)
            .with_max_blocks_per_sm(per_sm);
        (true, grid)
    } else {
        let grid = super::matmul::warp_per_output(outputs, rows);
        // One row: the `extra` bytes too (the per-warp form's rope table).
        let grid = if rows == 1 && extra > 0 {
            grid.with_shared(extra as u32)
        } else {
            grid
        };
        (false, grid)
    }
}

/// Warps of the shared form's `norm_qkv_rope` for `pairs` output pairs of width `dim`: two a pair
/// where there are more pairs than the grid's most warps and `dim` is a multiple of 512, each
/// summing half of it (`fb_qkv_split` in `fused_block.cu`, which also asks for 16-byte aligned
/// half rows; a pass it does not split just has spare warps).
pub(super) fn qkv_warps(pairs: usize, dim: usize) -> usize {
    if pairs > SHARED_MAX_WARPS && dim.is_multiple_of(512) {
        2 * pairs
    } else {
        pairs
    }
}

/// Checks that `wv` takes `wq`'s format (`None`) or the v format of an entry of
/// [`QKV_MIXED_FORMATS`] beside it (`Some(entry)`).
pub(super) fn v_format(check: &Check, wq: &Buffer, wv: &Buffer) -> Result<Option<usize>> {
    let (wq_dtype, wv_dtype) = (wq.dtype(), wv.dtype());
    let mixed = QKV_MIXED_FORMATS
        .iter()
        .position(|&pair| pair == (wq_dtype, wv_dtype));
    check.require("wv", wv_dtype == wq_dtype || mixed.is_some(), || {
        let pairs: Vec<String> = QKV_MIXED_FORMATS
            .iter()
            .map(|(qk, v)| format!("{v} beside {qk}"))
            .collect();
        format!(
            "is {wv_dtype} beside wq's {wq_dtype}: v takes wq's format, or {}",
            pairs.join(", ")
        )
    })?;
    Ok(mixed)
}

/// The attention input of a block in one dispatch (see the module documentation).
pub fn norm_qkv_rope(p: &QkvRope<'_>) -> Result<Dispatch> {
    qkv_rope_spec(p)?.to_dispatch()
}

/// [`norm_qkv_rope`] as a spec borrowing its buffers (what the fusion rule builds).
pub(crate) fn qkv_rope_spec<'a>(p: &QkvRope<'a>) -> Result<DispatchSpec<'a>> {
    let check = Check::op(OP_QKV);
    require_one_device(
        &check,
        p.x,
        &[
            ("norm", p.norm),
            ("wq", p.wq),
            ("wk", p.wk),
            ("wv", p.wv),
            ("positions", p.positions),
            ("step", p.step),
            ("q", p.q),
            ("k_cache", p.k_cache),
            ("v_cache", p.v_cache),
        ],
    )?;
    let (rows, dim) = check_x_norm(&check, p.x, p.norm, p.eps)?;
    let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_kv_head);
    check.require(
        "head_dim",
        hd >= 2 && hd % 2 == 0 && hd <= MAX_ROTARY_DIM,
        || format!("{hd} is not even and within 2..={MAX_ROTARY_DIM}"),
    )?;
    check.require("n_head", n_kv >= 1 && n_head >= 1, || {
        format!("{n_head} query and {n_kv} key/value heads")
    })?;
    check_weight(&check, "wq", p.wq, n_head * hd, dim)?;
    check.dtype("wk", p.wk, &[p.wq.dtype()])?;
    check.dims("wk", p.wk, &[n_kv * hd, dim])?;
    let mixed = v_format(&check, p.wq, p.wv)?;
    check.dims("wv", p.wv, &[n_kv * hd, dim])?;
    check.require("base", p.base.is_finite() && p.base > 0.0, || {
        format!("{} is not finite and positive", p.base)
    })?;
    check.dtype("positions", p.positions, &[DType::I32])?;
    check.elems("positions", p.positions, rows)?;
    if let Some(ff) = p.freq_factors {
        require_one_device(&check, p.x, &[("freq_factors", ff)])?;
        check.dtype("freq_factors", ff, &[DType::F32])?;
        check.elems("freq_factors", ff, hd / 2)?;
    }
    check.dtype("step", p.step, &[DType::I32])?;
    check.require("step", p.step.elems() >= 1, || "is empty".into())?;
    check.dtype("q", p.q, &[DType::F32])?;
    check.dims("q", p.q, &[rows, n_head * hd])?;
    check.dtype("k_cache", p.k_cache, &[DType::F32, DType::F16])?;
    check.require(
        "k_cache",
        p.k_cache.shape().rank() == 3 && p.k_cache.dims()[0] == n_kv && p.k_cache.dims()[2] == hd,
        || {
            format!(
                "has shape {:?}, expected [{n_kv}, max_ctx, {hd}]",
                p.k_cache.dims()
            )
        },
    )?;
    check.dtype("v_cache", p.v_cache, &[p.k_cache.dtype()])?;
    check.dims("v_cache", p.v_cache, p.k_cache.dims())?;
    let pairs = (n_head + 2 * n_kv) * hd / 2;
    let mut args = vec![
        ArgRef::read(p.x),
        ArgRef::read(p.norm),
        ArgRef::read(p.wq),
        ArgRef::read(p.wk),
        ArgRef::read(p.wv),
        ArgRef::read(p.positions),
    ];
    if let Some(ff) = p.freq_factors {
        args.push(ArgRef::read(ff));
    }
    args.extend([
        ArgRef::read(p.step),
        ArgRef::write(p.q),
        ArgRef::read_write(p.k_cache),
        ArgRef::read_write(p.v_cache),
        ArgRef::f32(p.eps),
        ArgRef::u32(to_u32(OP_QKV, "x", dim)?),
        ArgRef::u32(to_u32(OP_QKV, "n_head", n_head)?),
        ArgRef::u32(to_u32(OP_QKV, "n_kv_head", n_kv)?),
        ArgRef::u32(to_u32(OP_QKV, "head_dim", hd)?),
        ArgRef::f32(p.base),
        ArgRef::u32(match p.mode {
            RopeMode::Normal => 0,
            RopeMode::NeoX => 1,
        }),
        ArgRef::u32(u32::from(p.k_cache.dtype() == DType::F16)),
    ]);
    // The rope table: a (cos, sin) pair of f32 per rotation pair.
    let (shared, grid) = if rows == 1 {
        fused_launch(qkv_warps(pairs, dim), rows, dim, p.wq.dtype(), 4 * hd)
    } else {
        fused_launch(pairs, rows, dim, p.wq.dtype(), 0)
    };
    let (plain, shared_family, mixed_family) = if p.freq_factors.is_some() {
        (
            &mm::NORM_QKV_ROPE_FF,
            &mm::NORM_QKV_ROPE_FF_SHARED,
            &mm::NORM_QKV_ROPE_FF_MIXED,
        )
    } else {
        (
            &mm::NORM_QKV_ROPE,
            &mm::NORM_QKV_ROPE_SHARED,
            &mm::NORM_QKV_ROPE_MIXED,
        )
    };
    let kernel = match mixed {
        Some(i) => KernelId::of(&mixed_family[2 * i + usize::from(shared)]),
        None if shared => for_weight(OP_QKV, shared_family, p.wq)?,
        None => for_weight(OP_QKV, plain, p.wq)?,
    };
    DispatchSpec::new(kernel, &args, grid)
}

/// The gated activation of the MLP input: `hidden = act(gate) * up`, computed as the plain
/// elementwise op of the same name computes it on each backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateActivation {
    /// `silu(gate) * up`: SwiGLU (Llama, Qwen 3), as the `swiglu` op.
    Silu,
    /// `gelu_tanh(gate) * up`: GeGLU with the tanh form of GELU (Gemma 3), as the `geglu` op.
    GeluTanh,
}

impl GateActivation {
    /// The kernels' `act` argument: 0 for SiLU, 1 for GELU (tanh form).
    pub fn code(self) -> u32 {
        match self {
            GateActivation::Silu => 0,
            GateActivation::GeluTanh => 1,
        }
    }
}

/// The MLP input of a block in one dispatch: `hidden = act(norm(x) Wg) * (norm(x) Wu)` with `act`
/// SiLU or GELU (see the module documentation). `w_gate` and `w_up` are `[ffn, dim]` of one dtype,
/// `hidden` f32 `[rows, ffn]`.
pub fn norm_gate_up(
    x: &Buffer,
    norm: &Buffer,
    eps: f32,
    w_gate: &Buffer,
    w_up: &Buffer,
    hidden: &Buffer,
    act: GateActivation,
) -> Result<Dispatch> {
    gate_up_spec(x, norm, eps, w_gate, w_up, hidden, act)?.to_dispatch()
}

/// [`norm_gate_up`] as a spec borrowing its buffers (what the fusion rule builds).
pub(crate) fn gate_up_spec<'a>(
    x: &'a Buffer,
    norm: &'a Buffer,
    eps: f32,
    w_gate: &'a Buffer,
    w_up: &'a Buffer,
    hidden: &'a Buffer,
    act: GateActivation,
) -> Result<DispatchSpec<'a>> {
    let check = Check::op(OP_GATE_UP);
    require_one_device(
        &check,
        x,
        &[
            ("norm", norm),
            ("w_gate", w_gate),
            ("w_up", w_up),
            ("hidden", hidden),
        ],
    )?;
    let (rows, dim) = check_x_norm(&check, x, norm, eps)?;
    check.require("w_gate", w_gate.shape().rank() == 2, || {
        format!("has shape {:?}, expected [ffn, dim]", w_gate.dims())
    })?;
    let ffn = w_gate.dims()[0];
    check_weight(&check, "w_gate", w_gate, ffn, dim)?;
    check.dtype("w_up", w_up, &[w_gate.dtype()])?;
    check.dims("w_up", w_up, w_gate.dims())?;
    check.dtype("hidden", hidden, &[DType::F32])?;
    check.dims("hidden", hidden, &[rows, ffn])?;
    let args = [
        ArgRef::read(x),
        ArgRef::read(norm),
        ArgRef::read(w_gate),
        ArgRef::read(w_up),
        ArgRef::write(hidden),
        ArgRef::f32(eps),
        ArgRef::u32(to_u32(OP_GATE_UP, "x", dim)?),
        ArgRef::u32(to_u32(OP_GATE_UP, "w_gate", ffn)?),
        ArgRef::u32(act.code()),
    ];
    let (shared, grid) = fused_launch(ffn, rows, dim, w_gate.dtype(), 0);
    let family = if shared {
        &mm::NORM_GATE_UP_SHARED
    } else {
        &mm::NORM_GATE_UP
    };
    DispatchSpec::new(for_weight(OP_GATE_UP, family, w_gate)?, &args, grid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;

    #[test]
    fn given_cpu_buffers_when_building_should_pick_the_weight_format_kernel() {
        let dev = Device::cpu(1).unwrap();
        let x = dev.alloc(DType::F32, &[1, 64]).unwrap();
        let norm = dev.alloc(DType::F32, &[64]).unwrap();
        let w = dev.alloc(DType::F16, &[128, 64]).unwrap();
        let hidden = dev.alloc(DType::F32, &[1, 128]).unwrap();
        let d = norm_gate_up(&x, &norm, 1e-5, &w, &w, &hidden, GateActivation::Silu).unwrap();
        assert_eq!(d.kernel().name(), "norm_gate_up_f16");
    }

    #[test]
    fn given_an_activation_when_building_should_pass_its_code_as_act() {
        use crate::graph::{Arg, Scalar};
        let dev = Device::cpu(1).unwrap();
        let x = dev.alloc(DType::F32, &[3, 64]).unwrap();
        let norm = dev.alloc(DType::F32, &[64]).unwrap();
        let w = dev.alloc(DType::Q8_0, &[96, 64]).unwrap();
        let hidden = dev.alloc(DType::F32, &[3, 96]).unwrap();
        for (act, code) in [(GateActivation::Silu, 0), (GateActivation::GeluTanh, 1)] {
            let d = norm_gate_up(&x, &norm, 1e-5, &w, &w, &hidden, act).unwrap();
            assert_eq!(d.kernel().name(), "norm_gate_up_q8_0");
            let at = d.kernel().sig().index_of("act").unwrap();
            assert!(
                matches!(d.args()[at], Arg::Scalar(Scalar::U32(c)) if c == code),
                "{act:?}: {:?}",
                d.args()[at]
            );
        }
    }

    #[test]
    fn given_a_wrong_hidden_shape_when_building_should_name_the_argument() {
        let dev = Device::cpu(1).unwrap();
        let x = dev.alloc(DType::F32, &[2, 64]).unwrap();
        let norm = dev.alloc(DType::F32, &[64]).unwrap();
        let w = dev.alloc(DType::F32, &[128, 64]).unwrap();
        let hidden = dev.alloc(DType::F32, &[1, 128]).unwrap();
        let err = norm_gate_up(&x, &norm, 1e-5, &w, &w, &hidden, GateActivation::Silu)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("norm_gate_up") && err.contains("hidden"),
            "{err}"
        );
    }

    #[test]
    fn given_an_odd_head_dim_when_building_should_name_it() {
        let dev = Device::cpu(1).unwrap();
        let f32s = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
        let (x, norm, wq, wk) = (f32s(&[1, 64]), f32s(&[64]), f32s(&[6, 64]), f32s(&[3, 64]));
        let (positions, step) = (
            dev.alloc(DType::I32, &[1]).unwrap(),
            dev.alloc(DType::I32, &[1]).unwrap(),
        );
        let (q, cache) = (f32s(&[1, 6]), f32s(&[1, 8, 3]));
        let p = QkvRope {
            x: &x,
            norm: &norm,
            eps: 1e-5,
            wq: &wq,
            wk: &wk,
            wv: &wk,
            positions: &positions,
            freq_factors: None,
            step: &step,
            q: &q,
            k_cache: &cache,
            v_cache: &cache,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 3,
            base: 10000.0,
            mode: RopeMode::Normal,
        };
        let err = norm_qkv_rope(&p).unwrap_err().to_string();
        assert!(
            err.contains("norm_qkv_rope") && err.contains("head_dim"),
            "{err}"
        );
    }
}
