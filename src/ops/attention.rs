//! The `attention` op family: causal scaled dot-product attention of query rows against one
//! layer's KV cache, with grouped-query heads, an optional softcap and an optional sliding window.
//!
//! Layouts: `q` and `out` are f32 `[rows, n_head * head_dim]`; the K and V caches are
//! `[n_kv_head, max_ctx, head_dim]`, f32 or f16, and already hold the rows of this pass (written
//! by `kv_write`); `step` is an i32 buffer whose element 0 is `pos0`, the absolute position of the
//! first query row. Query row `r` sits at position `i = pos0 + r` and attends to cache positions
//! `0..=i`, or with a sliding window of `W` positions to `i + 1 - W..=i` (the last `W` positions,
//! itself included; fewer near the start); query head `h` uses KV head `h / (n_head / n_kv_head)`.
//! Scores are `scale * q.k`, then `cap * tanh(score / cap)` when a softcap is set, then a softmax.
//!
//! The KV length is read from `step` inside the kernels, never passed as a scalar, so a recorded
//! decode graph serves every step. A `pos0` that is negative or puts the last row past `max_ctx`
//! is a kernel error (reported by `Session::finish`), never an out-of-bounds read.
//!
//! Two forms:
//! - [`attention`]: prefill, any number of rows, one dispatch;
//! - [`attention_decode`]: one row, the KV length split into chunks processed in parallel and
//!   then combined (two dispatches and a caller-allocated scratch buffer, see
//!   [`attention_decode_scratch_len`]). With a window, the chunks that lie entirely before it are
//!   neither computed nor combined (decided in the kernels from `step`), so a step costs
//!   `O(window)`, not `O(position)`.
//!
//! The window travels to every kernel as a u32 scalar `window`, 0 meaning none.

use crate::backend::{capabilities_at, Buffer, DType};
use crate::error::{Error, Result};
use crate::graph::{Arg, Dispatch, Grid, KernelId};
use crate::kernels::attention as ka;
use crate::ops::Check;

/// A reasonable KV chunk length for [`attention_decode`].
pub const DEFAULT_DECODE_CHUNK_LEN: usize = 64;

/// Head geometry and score parameters of an attention op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_head: usize,
    /// KV heads; must divide `n_head`.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Factor applied to `q.k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// When set, scores become `cap * tanh(score / cap)` before the softmax; `cap > 0`.
    pub softcap: Option<f32>,
    /// Sliding window: when set to `W > 0`, the query at position `i` sees only keys `j` with
    /// `i - W < j <= i` (Gemma's sliding layers); `None` sees every key up to `i`.
    pub window: Option<usize>,
}

impl AttentionParams {
    /// Parameters with the default scale `1 / sqrt(head_dim)` and no softcap.
    pub fn new(n_head: usize, n_kv_head: usize, head_dim: usize) -> Self {
        AttentionParams {
            n_head,
            n_kv_head,
            head_dim,
            scale: 1.0 / (head_dim.max(1) as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }

    /// The same parameters with another scale.
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    /// The same parameters with a softcap.
    pub fn with_softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// The same parameters with a sliding window of `window` positions: the query at position
    /// `i` sees keys `i + 1 - window..=i`. A window of 0 is refused when the op is built; one at
    /// least the cache length changes nothing.
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = Some(window);
        self
    }

    /// The window as the kernels take it: 0 for none. Windows past `u32::MAX` (larger than any
    /// position an i32 `step` can address, so the same as none) travel as `u32::MAX`.
    pub(crate) fn window_arg(&self) -> u32 {
        self.window
            .map_or(0, |w| u32::try_from(w).unwrap_or(u32::MAX))
    }

    /// Values in one row of `q` and `out`: `n_head * head_dim`.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub(crate) fn check(&self, c: &Check) -> Result<()> {
        c.require(
            "params",
            self.n_head > 0 && self.n_kv_head > 0 && self.head_dim > 0,
            || {
                format!(
                    "n_head {}, n_kv_head {} and head_dim {} must be positive",
                    self.n_head, self.n_kv_head, self.head_dim
                )
            },
        )?;
        c.require("params", self.n_head.is_multiple_of(self.n_kv_head), || {
            format!(
                "n_kv_head {} does not divide n_head {}",
                self.n_kv_head, self.n_head
            )
        })?;
        let fits = |v: usize| u32::try_from(v).is_ok();
        c.require(
            "params",
            fits(self.n_head)
                && fits(self.head_dim)
                && self.head_dim.checked_add(2).is_some_and(fits),
            || "n_head and head_dim must fit in 32 bits".into(),
        )?;
        c.require("params", self.scale.is_finite(), || {
            format!("scale {} is not finite", self.scale)
        })?;
        if let Some(cap) = self.softcap {
            c.require("params", cap.is_finite() && cap > 0.0, || {
                format!("softcap {cap} must be finite and positive")
            })?;
        }
        c.require("params", self.window != Some(0), || {
            "window 0 sees no key; give a positive window, or none for full attention".into()
        })?;
        Ok(())
    }
}

/// The chunk length (KV positions) of the split decode attention on `device`: what its backend
/// declares ([`Capabilities::decode_attention_chunk`](crate::backend::Capabilities)).
pub fn decode_chunk_len(device: &crate::backend::Device) -> usize {
    device.capabilities().decode_attention_chunk
}

/// Elements (f32) of the scratch buffer [`attention_decode`] needs for a cache of `max_ctx`
/// positions cut into chunks of `chunk_len`: the records, `ceil(max_ctx / chunk_len) * n_head *
/// (head_dim + 2)` laid out `[max_chunks, n_head, head_dim + 2]`, then `n_head` words the CUDA
/// kernel uses as counters. Allocate it with [`Device::alloc`](crate::Device::alloc) (zeroed) and
/// use it for this op only: the counters must be zero between launches (the kernel keeps them so).
pub fn attention_decode_scratch_len(
    params: AttentionParams,
    max_ctx: usize,
    chunk_len: usize,
) -> Result<usize> {
    records_len(params, max_ctx, chunk_len)?
        .checked_add(params.n_head)
        .ok_or_else(|| Error::shape("attention_decode", "partials", "scratch size overflows"))
}

/// The part of a decode scratch (see [`attention_decode_scratch_len`]) whose contents mean
/// nothing between passes: the records, without the counters after them.
pub fn attention_decode_records(partials: &Buffer, params: AttentionParams) -> Result<Buffer> {
    let len = partials.elems().checked_sub(params.n_head).ok_or_else(|| {
        Error::shape(
            "attention_decode",
            "partials",
            format!(
                "{} elements cannot hold {} counters",
                partials.elems(),
                params.n_head
            ),
        )
    })?;
    partials.view(0, partials.dtype(), &[len])
}

fn records_len(params: AttentionParams, max_ctx: usize, chunk_len: usize) -> Result<usize> {
    let c = Check::op("attention_decode");
    c.require("chunk_len", chunk_len > 0, || {
        "chunk_len must be positive".into()
    })?;
    c.require("k_cache", max_ctx > 0, || "max_ctx must be positive".into())?;
    max_chunks(max_ctx, chunk_len)
        .checked_mul(params.n_head)
        .and_then(|n| n.checked_mul(params.head_dim.checked_add(2)?))
        .ok_or_else(|| Error::shape("attention_decode", "partials", "scratch size overflows"))
}

fn max_chunks(max_ctx: usize, chunk_len: usize) -> usize {
    max_ctx.div_ceil(chunk_len)
}

/// What the shared checks learned about the arguments.
struct Checked {
    rows: usize,
    max_ctx: usize,
    cache: DType,
}

fn check_common(
    c: &Check,
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    out: &Buffer,
    params: &AttentionParams,
) -> Result<Checked> {
    params.check(c)?;
    c.dtype("q", q, &[DType::F32])?;
    c.last_dim("q", q, params.q_width())?;
    let rows = q.shape().rows();
    c.require("q", rows > 0, || {
        format!("has shape {:?}: no rows", q.dims())
    })?;
    c.dtype("k_cache", k_cache, &[DType::F32, DType::F16])?;
    let kd = k_cache.dims();
    c.require(
        "k_cache",
        kd.len() == 3 && kd[0] == params.n_kv_head && kd[1] > 0 && kd[2] == params.head_dim,
        || {
            format!(
                "has shape {kd:?}, expected [n_kv_head {}, max_ctx > 0, head_dim {}]",
                params.n_kv_head, params.head_dim
            )
        },
    )?;
    let max_ctx = kd[1];
    c.dtype("v_cache", v_cache, &[k_cache.dtype()])?;
    c.dims("v_cache", v_cache, kd)?;
    c.dtype("step", step, &[DType::I32])?;
    c.require("step", step.elems() >= 1, || {
        "is empty; element 0 must hold pos0".into()
    })?;
    c.dtype("out", out, &[DType::F32])?;
    c.require("q", rows <= max_ctx, || {
        format!("has {rows} rows, more than the cache's {max_ctx} positions")
    })?;
    Ok(Checked {
        rows,
        max_ctx,
        cache: k_cache.dtype(),
    })
}

fn to_u32(op: &'static str, arg: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, arg, format!("{v} does not fit in 32 bits")))
}

/// The scalar arguments shared by the prefill and partial kernels.
fn score_args(params: &AttentionParams) -> [Arg; 6] {
    [
        Arg::u32(params.n_head as u32),
        Arg::u32(params.n_kv_head as u32),
        Arg::u32(params.head_dim as u32),
        Arg::f32(params.scale),
        Arg::f32(params.softcap.unwrap_or(0.0)),
        Arg::u32(params.window_arg()),
    ]
}

/// Prefill attention: `out[r, h] = softmax(scale * q[r, h] . K[lo..=pos0 + r]) V` for every query
/// row `r` and head `h`, reading `pos0` from `step` at run time; `lo` is 0, or with a window `W`
/// `max(0, pos0 + r + 1 - W)` (per row, so a pass may start at any position: chunked prompts).
/// `q` and `out` are f32 `[rows, n_head * head_dim]` (same shape); the caches are
/// `[n_kv_head, max_ctx, head_dim]`, both f32 or both f16. One dispatch, [`OpKind::Attention`].
pub fn attention(
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    out: &Buffer,
    params: AttentionParams,
) -> Result<Dispatch> {
    let c = Check::op("attention");
    let checked = check_common(&c, q, k_cache, v_cache, step, out, &params)?;
    c.dims("out", out, q.dims())?;
    let mma = MMA_HEAD_DIMS.contains(&params.head_dim) && checked.rows >= MMA_MIN_ROWS;
    let family = if mma {
        &ka::ATTENTION_MMA
    } else {
        &ka::ATTENTION
    };
    let kernel = match checked.cache {
        DType::F16 => KernelId::of(&family[1]),
        _ => KernelId::of(&family[0]),
    };
    let items = to_u32("attention", "q", checked.rows.saturating_mul(params.n_head))?;
    let mut args = vec![
        Arg::read(q),
        Arg::read(k_cache),
        Arg::read(v_cache),
        Arg::read(step),
        Arg::write(out),
    ];
    args.extend(score_args(&params));
    let grid = if mma {
        mma_grid(checked.rows, params.n_head, params.head_dim, checked.cache)
    } else {
        Grid::new(items, 128)
    };
    Dispatch::new(kernel, args, grid)
}

/// The tensor-core form of the prompt attention (`attention_mma_<t>`, `attention_mma.cuh`):
/// heads of 64 or 128 values, from [`MMA_MIN_ROWS`] rows. Measured on an H100 against the
/// one-row-per-block form: the 8B shape's 512-token prompt spends 1.9 ms in attention instead of
/// 12.3 ms (a tiled f32 form, tried first, reached 8 TFLOP/s and was dropped for it).
const MMA_HEAD_DIMS: [usize; 2] = [64, 128];
/// Rows from which the tensor-core form is taken.
const MMA_MIN_ROWS: usize = 64;
/// Threads of a block of the tensor-core form (`ATTN_M_THREADS`).
const MMA_THREADS: u32 = 128;
/// Query rows of a block of the tensor-core form (`ATTN_M_ROWS`, also its keys a tile).
const MMA_ROWS: usize = 64;

/// The launch shape of the tensor-core form: a block per 64 query rows of one head, with its
/// shared memory. An f32 cache gets the pipelined form's (`ATTN_M_SMEM_PIPE`: K and V tiles of
/// 64 rows of `head_dim` f16 values, rows padded by 8, then two f32 slots of 64 rows into which
/// the next tile is copied while the block multiplies the current one); an f16 cache that of its
/// own pipelined form (`ATTN_M_SMEM_PIPE16`: two pairs of K and V tiles, the next pair copied
/// while the block multiplies the other). A GPU that grants less gets the plain form (the kernel
/// checks what it was given; `ATTN_M_SMEM`: Q, K and V tiles).
fn mma_grid(rows: usize, n_head: usize, head_dim: usize, cache: DType) -> Grid {
    let blocks = rows
        .div_ceil(MMA_ROWS)
        .saturating_mul(n_head)
        .clamp(1, 1 << 30);
    let tiles = MMA_ROWS * (head_dim + 8) * 2;
    let smem = if cache == DType::F32 {
        2 * tiles + 2 * MMA_ROWS * head_dim * 4
    } else {
        4 * tiles
    };
    Grid::new(blocks as u32, MMA_THREADS).with_shared(smem as u32)
}

/// Query heads one block of the one-dispatch CUDA decode attention takes (`AD_HEADS` in
/// `backend/cuda/kernels/attention_decode.cu`), all of one KV head.
const SPLIT_HEADS: usize = 4;
/// KV heads from which a block of the split form always takes [`SPLIT_HEADS`] query heads
/// (`AD_MIN_KV_SHARED` in the kernel); with fewer, a block takes one query head while the grid's
/// splits for one head a block leave at most 64 keys each (`ad_heads_per_block`), so a short
/// context fills enough blocks.
const SPLIT_MIN_KV_SHARED: usize = 8;

/// Query heads one block of the split form takes at a short context (`ad_heads_per_block` in the
/// kernel): the grid is sized for it, the most (KV head, head group) owners a step can have.
fn split_heads_per_block(n_kv_head: usize) -> usize {
    if n_kv_head >= SPLIT_MIN_KV_SHARED {
        SPLIT_HEADS
    } else {
        1
    }
}

/// Blocks the one-dispatch decode attention aims at for a long context: the grid holds about this
/// many (KV head, head group, split) blocks; the kernel uses as many splits as the run-time length
/// asks for (one per 64 keys, at most 24) and no more than the grid holds. One an SM of an H100:
/// the kernel's registers leave room for one block an SM, and 256 blocks ran as two waves
/// (`docs/kernels.md` item 15: 1B at 4096 tokens 708 -> 728 tok/s).
const SPLIT_TARGET_BLOCKS: usize = 132;

/// The launch shape of the one-dispatch decode attention: for heads of 64, 128 or 256 values the
/// split form (a block per KV head, group of [`SPLIT_HEADS`] query heads and split, at most
/// `chunks` splits, the records the scratch holds), else `chunked`, the chunk-per-block form.
fn single_decode_grid(params: AttentionParams, chunks: usize, chunked: Grid) -> Grid {
    if !matches!(params.head_dim, 64 | 128 | 256) {
        return chunked;
    }
    let group = params.n_head / params.n_kv_head;
    let owners = params.n_kv_head * group.div_ceil(split_heads_per_block(params.n_kv_head));
    // Whole splits within the target: a block past one wave waits for a whole block before it
    // starts (8 owners took 17 splits, 136 blocks on 132 SMs, docs/kernels.md item 22).
    let splits = (SPLIT_TARGET_BLOCKS / owners).clamp(1, chunks.max(1));
    Grid::new((owners * splits).min(u32::MAX as usize) as u32, 256)
}

/// Decode attention for one query row, split along the KV length: a partial pass computes, for
/// each chunk of `chunk_len` positions and each head, the running maximum, the sum of
/// exponentials and the weighted V sum into `partials`; a combine pass merges them into `out`.
/// Both passes read `pos0` from `step`, so the number of chunks used follows the KV length at run
/// time; with a window, the chunks entirely before the window's first key are skipped by both
/// (their records are neither written nor read) and the chunk holding that key is masked. `q` and
/// `out` are f32 `[1, n_head * head_dim]`; `partials` is f32 with exactly
/// [`attention_decode_scratch_len`] elements (any shape). On the CPU two dispatches, the partial
/// and the combine; on CUDA one (`attention_decode_<t>`: for heads of 64, 128 or 256 values a
/// block per KV head, group of its query heads and split of the keys, the split count chosen from
/// the run-time length, so `partials` holds per-split records there; the block that finishes the
/// last split merges), which is one launch less in the dependency chain of every layer. All
/// are [`OpKind::Attention`]; the same function as [`attention`] with one row.
#[allow(clippy::too_many_arguments)] // the op's natural argument list; each is a distinct buffer
pub fn attention_decode(
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    partials: &Buffer,
    out: &Buffer,
    params: AttentionParams,
    chunk_len: usize,
) -> Result<Vec<Dispatch>> {
    // The backend that owns the buffers declares whether it has the one-dispatch form.
    let single = capabilities_at(q.allocation().home()).single_dispatch_decode_attention;
    attention_decode_as(
        q, k_cache, v_cache, step, partials, out, params, chunk_len, single,
    )
}

/// [`attention_decode`] in the one-dispatch form (`single`) or the partial + combine form, as
/// the recording session's device declares.
#[allow(clippy::too_many_arguments)] // mirrors `attention_decode`
pub(crate) fn attention_decode_as(
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    partials: &Buffer,
    out: &Buffer,
    params: AttentionParams,
    chunk_len: usize,
    single: bool,
) -> Result<Vec<Dispatch>> {
    let c = Check::op("attention_decode");
    let checked = check_common(&c, q, k_cache, v_cache, step, out, &params)?;
    c.require("q", checked.rows == 1, || {
        format!(
            "has {} rows (shape {:?}); the decode form takes one",
            checked.rows,
            q.dims()
        )
    })?;
    c.dims("out", out, q.dims())?;
    c.require("chunk_len", chunk_len > 0, || {
        "chunk_len must be positive".into()
    })?;
    let chunk = to_u32("attention_decode", "chunk_len", chunk_len)?;
    let chunks = max_chunks(checked.max_ctx, chunk_len);
    let chunks_u32 = to_u32("attention_decode", "chunk_len", chunks)?;
    c.dtype("partials", partials, &[DType::F32])?;
    let need = attention_decode_scratch_len(params, checked.max_ctx, chunk_len)?;
    c.elems("partials", partials, need)?;
    // With a window of W keys, at most ceil(W / chunk_len) + 1 chunks hold a key of it; the
    // kernels loop over their work items, so a grid that large covers every step.
    let live = params.window.map_or(chunks, |w| {
        chunks.min(w.div_ceil(chunk_len).saturating_add(1))
    });
    let blocks = to_u32(
        "attention_decode",
        "chunk_len",
        live.saturating_mul(params.n_head),
    )?;
    let f16 = checked.cache == DType::F16;
    let inputs = [
        Arg::read(q),
        Arg::read(k_cache),
        Arg::read(v_cache),
        Arg::read(step),
    ];
    let scalars = score_args(&params)
        .into_iter()
        .chain([Arg::u32(chunk), Arg::u32(chunks_u32)]);
    // 256 threads: eight warps score 32 keys at a time, and a 64-wide head gets sixteen key
    // groups of four dimensions for the V sum (see the CUDA kernel).
    let grid = Grid::new(blocks, 256);
    if single {
        let kernel = KernelId::of(&ka::DECODE[usize::from(f16)]);
        let grid = single_decode_grid(params, chunks, grid);
        let mut args = inputs.to_vec();
        args.extend([Arg::read_write(partials), Arg::write(out)]);
        args.extend(scalars);
        return Ok(vec![Dispatch::new(kernel, args, grid)?]);
    }
    let records = attention_decode_records(partials, params)?;
    let partial_kernel = KernelId::of(&ka::DECODE_PARTIAL[usize::from(f16)]);
    let mut args = inputs.to_vec();
    args.push(Arg::write(&records));
    args.extend(scalars);
    let partial = Dispatch::new(partial_kernel, args, grid)?;
    let combine = Dispatch::new(
        KernelId::of(&ka::DECODE_COMBINE),
        vec![
            Arg::read(&records),
            Arg::read(step),
            Arg::write(out),
            Arg::u32(params.n_head as u32),
            Arg::u32(params.head_dim as u32),
            Arg::u32(chunk),
            Arg::u32(chunks_u32),
            Arg::u32(params.window_arg()),
        ],
        Grid::new(params.n_head as u32, 128),
    )?;
    Ok(vec![partial, combine])
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "attention_window_tests.rs"]
mod window_tests;
