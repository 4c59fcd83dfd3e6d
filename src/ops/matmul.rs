//! The `matmul` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! Every product computes `y[r, o] = sum_i x[r, i] * W[o, i]`: activations `x` are f32
//! `[rows, k]` (any rank, the last dimension is `k`), a weight matrix is `[n, k]` with each row's
//! `k` values contiguous (GGUF `ne = [k, n]`) and quantized blocks along `k`, and `out` is f32 with
//! `rows * n` values and last dimension `n`. Weights are dequantized on the fly and sums are f32.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid, KernelId, KernelSig};
use crate::kernels::{self, matmul as mm};
use crate::ops::Check;
use crate::quant::AffineParams;

/// Weight dtypes [`matmul`] and [`matmul_id`] accept.
pub const WEIGHT_DTYPES: [DType; 9] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
    DType::F32,
    DType::F16,
    DType::BF16,
];

/// The plain matmul kernel of a weight dtype.
/// The kernel of `family` (one per weight format) for `w`'s dtype.
pub(crate) fn for_weight(
    op: &'static str,
    family: &'static [KernelSig; 9],
    w: &Buffer,
) -> Result<KernelId> {
    kernels::pick(op, family, &kernels::WEIGHT_FORMATS, w.dtype())
}

fn to_u32(c: &Check, arg: &'static str, v: usize) -> Result<u32> {
    let mut out = 0;
    c.require(arg, u32::try_from(v).map(|x| out = x).is_ok(), || {
        format!("size {v} exceeds u32")
    })?;
    Ok(out)
}

/// Activation rows one warp of the CUDA matmul takes together in the matrix (prefill) form, reading
/// each weight value once for all of them (`MM_ROWS` in `backend/cuda/kernels/matmul.cu`).
pub(crate) const MM_ROWS: usize = 8;

/// The GPU launch shape of the matmul kernels (and the fused block products): one 32-lane warp per
/// output value, four warps per block, `n` outputs along x and along y the row groups: one row in
/// the vector form, [`MM_ROWS`] rows a group in the matrix form (capped at the CUDA limit of 65535;
/// the kernels stride over the rest).
pub(crate) fn warp_per_output(n: usize, rows: usize) -> Grid {
    let groups = if rows <= 1 { 1 } else { rows.div_ceil(MM_ROWS) };
    warp_per_output_and_row(n, groups)
}

/// Most threads of a block of the int8 one-row form (`MM_Q8_THREADS` in
/// `backend/cuda/kernels/matmul.cu`): sixteen warps, one block an SM, so each SM quantizes the row
/// once (docs/kernels.md item 22).
const Q8_THREADS: u32 = 512;
/// Blocks below which a narrow int8 one-row product takes fewer warps a block, so that it still
/// spreads over at least this many SMs.
const Q8_MIN_BLOCKS: usize = 64;
/// Warps the int8 one-row form's grid holds (sixteen on each of an H100's 132 SMs): each block
/// quantizes the row before its warps stride over the outputs, one or two at a time, so a wide
/// product pays one quantization an SM (two where its outputs take eight-warp blocks), not one per
/// few outputs.
const Q8_MAX_WARPS: usize = 2112;
/// Blocks an SM of the one-wave forms in blocks of eight warps or fewer (the int8 one-row product,
/// the fused block products; sixteen-warp blocks take one an SM): their grids are sized for two
/// blocks on each of an H100's 132 SMs, and with programmatic launch
/// (`backend/cuda/graph.rs`) the blocks of a kernel start on the SMs the kernel before it leaves
/// first, so without the cap the early SMs took more than two and the grid finished unevenly
/// (1B 1018 -> 1084 tok/s with the cap, on an H200; docs/kernels.md item 17).
pub(crate) const ONE_WAVE_BLOCKS_PER_SM: u32 = 2;
/// The most dynamic shared memory a one-row product asks for (the CUDA default limit).
const Q8_MAX_SHARED: usize = 48 * 1024;
/// Weights from which a one-row product takes the int8 form: a smaller product is a few
/// microseconds of latency, which the form's quantizing prologue lengthens (SmolLM2's 576 x 576
/// and 576 x 1536 products measured 6.7 -> 7.5 us on an H100; from 2^20 weights Gemma 3 270M's
/// 640 x 2048 down products made its step 0.8-1.3% slower on an H200), while from 2^21 Qwen 3
/// 0.6B's 1024 x 2048 and 1024 x 3072 products are faster so (docs/kernels.md item 40).
const Q8_MIN_WEIGHTS: usize = 1 << 21;

/// Bytes of shared memory the int8 form of a row of `k` activations takes (`MM_Q8_BYTES` in
/// `backend/cuda/kernels/matmul_blocks.cuh`: k int8 values and a pair of f32 per 32), for the
/// weight formats whose one-row CUDA products read int8 activations (the 32-value block formats,
/// Q4_K, and Q6_K in rows of an even count of super-blocks, whose rows stay word-aligned for
/// `mm_q8_q6k_rows`); `None` for the others and for `k` not a multiple of 32.
pub(crate) fn int8_row_bytes(w: DType, k: usize) -> Option<usize> {
    let q8 = match w {
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4K => true,
        DType::Q6K => k.is_multiple_of(512),
        _ => false,
    };
    (q8 && k.is_multiple_of(32)).then(|| k + k / 4)
}

/// The launch shape of a one-row product: for the formats of [`int8_row_bytes`] and at least
/// [`Q8_MIN_WEIGHTS`] weights, blocks of up to
/// [`Q8_THREADS`] with that shared memory (at most [`Q8_MAX_WARPS`]; a warp an output where one
/// wave of sixteen-warp blocks holds them, else two; fewer warps a block for products too narrow
/// for [`Q8_MIN_BLOCKS`] blocks), else
/// [`warp_per_output`].
fn vector_grid(w: DType, n: usize, k: usize) -> Grid {
    match int8_row_bytes(w, k) {
        Some(bytes) if bytes <= Q8_MAX_SHARED && n.saturating_mul(k) >= Q8_MIN_WEIGHTS => {
            let most = (Q8_THREADS / 32) as usize;
            let mut warps = most;
            while warps > 1 && n < warps * Q8_MIN_BLOCKS {
                warps /= 2;
            }
            // A warp an output where that fits one wave (the kernel takes one row a warp when the
            // grid has a warp for every output), else two.
            let one = n.div_ceil(warps);
            let blocks = if one <= Q8_MAX_WARPS / most {
                one
            } else {
                n.div_ceil(2 * warps).clamp(1, Q8_MAX_WARPS / warps)
            };
            let per_sm = if warps == most {
                1
            } else {
                ONE_WAVE_BLOCKS_PER_SM
            };
            Grid::new(blocks as u32, 32 * warps as u32)
                .with_shared(bytes as u32)
                .with_max_blocks_per_sm(per_sm)
        }
        _ => warp_per_output(n, 1),
    }
}

/// Rows from which the CUDA matmul takes its tiled form (`MM_TILE_MIN_ROWS` in
/// `backend/cuda/kernels/matmul.cu`): blocks of 128 threads, each a tile of [`MM_TILE_M`] rows by
/// [`MM_TILE_N`] outputs.
pub(crate) const MM_TILE_MIN_ROWS: usize = 16;
/// Rows of one tile of the tiled form.
pub(crate) const MM_TILE_M: usize = 32;
/// Outputs of one tile of the tiled form.
pub(crate) const MM_TILE_N: usize = 64;
/// Dynamic shared memory of the tiled form: the activation and weight tiles of one k step of 32
/// values (`MM_TILE_SMEM`); the kernel takes the tiled form only when given this much.
const MM_TILE_SMEM: u32 = (4 * 32 * (MM_TILE_M + MM_TILE_N)) as u32;

/// The launch shape of the plain (and residual-fused) matmul: a block per tile from
/// [`MM_TILE_MIN_ROWS`] rows on, else [`warp_per_output`].
pub(crate) fn matmul_grid(n: usize, rows: usize) -> Grid {
    if rows < MM_TILE_MIN_ROWS {
        return warp_per_output(n, rows);
    }
    let tiles = rows
        .div_ceil(MM_TILE_M)
        .saturating_mul(n.div_ceil(MM_TILE_N));
    Grid::new(tiles.clamp(1, 1 << 30) as u32, 128).with_shared(MM_TILE_SMEM)
}

/// Rows from which a matmul takes the tensor-core kernels (`matmul_mma_<w>`, `MMA_MIN_ROWS` in
/// `backend/cuda/kernels/matmul_mma.cuh`): prompts. Below it the products keep the CUDA-core forms,
/// whose per-row sums do not depend on the row count up to [`MM_TILE_MIN_ROWS`].
pub(crate) const MMA_MIN_ROWS: usize = 64;
/// Rows and outputs of one tile of the tensor-core form (`MMA_BM`, `MMA_BN`).
pub(crate) const MMA_TILE: usize = 128;
/// Threads of a block of the tensor-core form (`MMA_THREADS`: eight warps).
const MMA_THREADS: u32 = 256;
/// Dynamic shared memory of the tensor-core forms (`MMP_SMEM`, which covers `MMA_SMEM`): three
/// copy slots (128 activation rows of 32 f32 values and 128 weight rows of up to 48 bytes), then
/// two buffers of 128 activation rows and 128 weight rows of 32 f16 values, each row padded to 40
/// values. Two blocks fit an SM of an H100 (one of an A100); a GPU with less shared memory a
/// block gets what it allows and the kernels take their two-buffer form.
const MMP_SMEM: usize = 3 * (MMA_TILE * 32 * 4 + MMA_TILE * 48) + 2 * 2 * MMA_TILE * 40 * 2;
/// The f16-activation form's (`MMH_SMEM`, `matmul_mma_h.cuh`): three slots of 128 activation rows
/// of 64 f16 values padded to 72 and 128 weight rows of up to 44 bytes, then two f16 weight
/// buffers of 128 rows padded to 72 values.
const MMH_SMEM: usize = 3 * (MMA_TILE * 72 * 2 + MMA_TILE * 44) + 2 * MMA_TILE * 72 * 2;
/// What a tensor-core launch asks for: the larger of the two.
const MMA_SMEM: u32 = (if MMP_SMEM > MMH_SMEM {
    MMP_SMEM
} else {
    MMH_SMEM
}) as u32;

/// The Hopper form's (`MMW_SMEM`, `matmul_wgmma.cuh`): four slots of a 128 x 64 f16 activation
/// tile and a 128 x 64 f16 weight tile, and 1 KiB to align them. One block an SM of an H100.
const MMW_SMEM: usize = 4 * (MMA_TILE + MMA_TILE) * 128 + 1024;

/// Whether the Hopper form (`mmw_applies` in `matmul_wgmma.cuh`, sm_90a) can take a launch of
/// weights `w` with `k` inputs and products of `outputs` outputs in tiles of `tile`: a GGML block
/// format (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), whole 64-value steps, rows a whole number of the
/// format's load alignment ([`wgmma_alignment`]; Q6_K: an even count of 210-byte super-blocks)
/// and whole tiles. Such a launch asks for that form's shared memory (a GPU that grants less, or
/// whose kernels are not compiled for sm_90a, runs the other forms).
pub(crate) fn wgmma_shape(w: DType, k: usize, outputs: &[usize], tile: usize) -> bool {
    let Some(align) = wgmma_alignment(w) else {
        return false;
    };
    k.is_multiple_of(64)
        && w.bytes_for(k).is_some_and(|b| b.is_multiple_of(align))
        && outputs.iter().all(|n| n.is_multiple_of(tile))
}

/// The alignment, in bytes, that the Hopper form's loads need of a weight row's start (16 for
/// Q4_K's 16-byte loads, 4 for the word loads of the other block formats); `None` for a format
/// it does not take.
pub(crate) fn wgmma_alignment(w: DType) -> Option<usize> {
    match w {
        DType::Q4K => Some(16),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q6K => Some(4),
        _ => None,
    }
}

/// SMs of the GPU the tile choice below is tuned for (an H100); on another GPU the choice is
/// only less tuned, never wrong.
const MMA_TUNED_SMS: usize = 132;

/// The launch shape of the tensor-core form: a block per tile of 128 rows x 128 outputs, the
/// grid `[output tiles, row tiles]`. For the block formats (the pipelined form), where
/// 128-row tiles would not give every SM of an H100 a block, tiles of 64 rows instead (twice the
/// blocks, each half the work): the kernel reads the tile height from the grid's height.
pub(crate) fn mma_grid(n: usize, rows: usize, w: DType) -> Grid {
    mma_grid_for_tiles(n.div_ceil(MMA_TILE), rows, w, false)
}

/// `grid` asking for the Hopper form's shared memory too: the launch of an f16-activation product
/// in that form's shapes ([`wgmma_shape`]) on a backend that runs it (the narrowing makes them).
pub(crate) fn with_hopper_memory(grid: Grid) -> Grid {
    grid.with_shared(MMA_SMEM.max(MMW_SMEM as u32))
}

/// [`mma_grid`] for `cols` tiles of outputs side by side (one product's, or several products'
/// of one launch, `ops::matmul_triple`); `hopper`: the shared memory of the Hopper form too
/// ([`wgmma_shape`]).
pub(crate) fn mma_grid_for_tiles(cols: usize, rows: usize, w: DType, hopper: bool) -> Grid {
    let pipelined = matches!(
        w,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4K | DType::Q6K
    );
    let tall = rows.div_ceil(MMA_TILE);
    let row_tiles = if pipelined && cols.saturating_mul(tall) <= MMA_TUNED_SMS {
        rows.div_ceil(MMA_TILE / 2)
    } else {
        tall
    };
    let shared = if hopper {
        MMA_SMEM.max(MMW_SMEM as u32)
    } else {
        MMA_SMEM
    };
    Grid::new(cols.clamp(1, 1 << 30) as u32, MMA_THREADS)
        .with_y(row_tiles.clamp(1, 65535) as u32)
        .with_shared(shared)
}

/// One warp per output value and row (the kernels without a matrix form: the expert-routed and
/// the MLX affine products).
fn warp_per_output_and_row(n: usize, rows: usize) -> Grid {
    Grid::cover(n.saturating_mul(32), 128).with_y(rows.clamp(1, 65535) as u32)
}

/// The weight format (index in [`kernels::WEIGHT_FORMATS`]) of a plain product kernel, and
/// whether it is the tensor-core form; `None` for every other kernel.
pub(crate) fn plain_product_format(kernel: KernelId) -> Option<(usize, bool)> {
    kernel
        .index_in(&mm::MATMUL)
        .map(|f| (f, false))
        .or_else(|| kernel.index_in(&mm::MATMUL_MMA).map(|f| (f, true)))
}

/// Checks `x` and `out` against `k` and `n` and returns the number of activation rows.
pub(crate) fn check_rows(c: &Check, x: &Buffer, out: &Buffer, k: usize, n: usize) -> Result<usize> {
    c.dtype("x", x, &[DType::F32])?;
    c.dtype("out", out, &[DType::F32])?;
    c.require("x", x.shape().rank() >= 1, || "must have rank >= 1".into())?;
    c.last_dim("x", x, k)?;
    let rows = x.shape().rows();
    c.require("x", rows >= 1, || {
        format!("has no rows (shape {:?})", x.dims())
    })?;
    c.last_dim("out", out, n)?;
    c.elems("out", out, rows * n)?;
    Ok(rows)
}

/// `out[rows, n] = x[rows, k] · W[n, k]ᵀ` for a weight of any of [`WEIGHT_DTYPES`]. One row takes
/// the vector (decode) form (on the GPU, for the 32-value block formats, Q4_K and Q6_K, x rounded
/// to int8 in blocks of 32 values, see [`int8_row_bytes`]), more rows the matrix (prefill) form,
/// and from [`MMA_MIN_ROWS`] rows the tensor-core kernels (on the GPU: x and w rounded to f16,
/// sums in f32).
pub fn matmul(x: &Buffer, w: &Buffer, out: &Buffer) -> Result<Dispatch> {
    product(x, w, out, true)
}

/// [`matmul`] whose one-row form reads x as f32 on every backend (no int8 rounding on the GPU):
/// for a product whose outputs decide tokens, such as a model's output head, where a rounding of
/// the activations would move every logit (on an H100 the 8B shape's head gains 60 us of a 3.6 ms
/// step from int8).
pub fn matmul_f32_activations(x: &Buffer, w: &Buffer, out: &Buffer) -> Result<Dispatch> {
    product(x, w, out, false)
}

/// Outputs from which the f32 one-row product of a 32-value block format takes
/// [`HEAD_ROWS_PER_WARP`] rows a warp (`MM_BATCH_MAX_OUTPUTS` in `backend/cuda/kernels/matmul.cu`).
const HEAD_MIN_OUTPUTS: usize = 16384;
/// Rows a warp of such a product (an output head) takes at once, each lane's quarter of x loaded
/// once for all of them (`MM_HEAD_ROWS` in the CUDA kernel).
const HEAD_ROWS_PER_WARP: usize = 4;
/// Q8_0 rows longer than this keep a warp an output (`MM_HEAD_Q8_MAX_K`).
const HEAD_Q8_MAX_K: usize = 1024;

/// Warps the f32 one-row product of `n` outputs of `k` values takes: one an output, or one every
/// [`HEAD_ROWS_PER_WARP`] outputs for an output head of a 32-value block format (Q8_0 rows of at
/// most [`HEAD_Q8_MAX_K`] values).
fn head_warps(w: DType, n: usize, k: usize) -> usize {
    let blocks32 = matches!(w, DType::Q4_0 | DType::Q4_1 | DType::Q5_0)
        || (w == DType::Q8_0 && k <= HEAD_Q8_MAX_K);
    if blocks32 && n >= HEAD_MIN_OUTPUTS {
        n.div_ceil(HEAD_ROWS_PER_WARP)
    } else {
        n
    }
}

/// Threads a block of the tensor-core head form takes (`matmul_head.cuh`): eight warps, each
/// 16 rows at a time.
const HEAD_SPLIT_THREADS: u32 = 256;
/// Rows a warp of that form takes at once (`MM_HEAD_GROUP`).
const HEAD_SPLIT_ROWS: usize = 16;
/// Values of a row each step of that form stages (`MM_HEAD_STEP` blocks of 32).
const HEAD_SPLIT_STEP: usize = 256;
/// The 16-byte words of a row's step a warp's stage of that form keeps (`MM_HEAD_WORDS`): Q4_0's
/// and Q4_K's 144 bytes and Q8_0's 272 are whole words; Q6_K's 210-byte steps start at any even
/// byte of a word, so they take 14 words, made odd (15) so the rows' same words fall in different
/// banks.
fn head_stage_words(w: DType) -> usize {
    if w == DType::Q6K {
        15
    } else {
        256 / w.block_elems() * w.block_bytes() / 16
    }
}

/// The dynamic shared memory that selects the tensor-core head form (`MM_HEAD_SMEM`): x split into
/// two f16 halves (4 bytes a value), 16 bytes more, Q4_K's sums of x (4 bytes a 32-value block),
/// and each warp's stage of 16 rows' step.
fn head_split_bytes(w: DType, k: usize) -> usize {
    let xsums = if w == DType::Q4K { k / 8 } else { 0 };
    4 * k
        + 16
        + xsums
        + (HEAD_SPLIT_THREADS as usize / 32) * HEAD_SPLIT_ROWS * 16 * head_stage_words(w)
}

/// The most dynamic shared memory a block of the tensor-core head form takes (the launch asks
/// the driver for it past 48 KiB): rows of up to 8,192 values.
const HEAD_MAX_SHARED: usize = 96 * 1024;

/// The grid of the f32 one-row product of `n` outputs of `k` values: an output head of Q4_0, Q8_0,
/// Q4_K or Q6_K rows of a multiple of 256 values (Q6_K: n rows of whole 16-byte words) takes the
/// tensor-core form (a warp every 16 outputs, x's halves and the weight stages in shared memory),
/// every other one [`head_warps`] warps.
fn head_grid(w: DType, n: usize, k: usize) -> Grid {
    let split = matches!(w, DType::Q4_0 | DType::Q8_0 | DType::Q4K | DType::Q6K)
        && n >= HEAD_MIN_OUTPUTS
        && k.is_multiple_of(HEAD_SPLIT_STEP)
        && (n * (k / w.block_elems() * w.block_bytes())).is_multiple_of(16)
        && head_split_bytes(w, k) <= HEAD_MAX_SHARED;
    if !split {
        return warp_per_output(head_warps(w, n, k), 1);
    }
    let warps = (HEAD_SPLIT_THREADS / 32) as usize;
    let blocks = n.div_ceil(HEAD_SPLIT_ROWS).div_ceil(warps);
    Grid::new(blocks as u32, HEAD_SPLIT_THREADS).with_shared(head_split_bytes(w, k) as u32)
}

/// The plain product; `int8`: the one-row form may read int8 activations.
fn product(x: &Buffer, w: &Buffer, out: &Buffer, int8: bool) -> Result<Dispatch> {
    let c = Check::op("matmul");
    c.dtype("w", w, &WEIGHT_DTYPES)?;
    c.require("w", w.shape().rank() == 2, || {
        format!("must be [n, k], got shape {:?}", w.dims())
    })?;
    let (n, k) = (w.dims()[0], w.dims()[1]);
    c.require("w", n >= 1 && k >= 1, || {
        format!("has an empty dimension (shape {:?})", w.dims())
    })?;
    let rows = check_rows(&c, x, out, k, n)?;
    let args = vec![
        Arg::read(x),
        Arg::read(w),
        Arg::write(out),
        Arg::u32(to_u32(&c, "x", rows)?),
        Arg::u32(to_u32(&c, "w", k)?),
        Arg::u32(to_u32(&c, "w", n)?),
    ];
    if rows >= MMA_MIN_ROWS {
        let kernel = for_weight("matmul", &mm::MATMUL_MMA, w)?;
        return Dispatch::new(kernel, args, mma_grid(n, rows, w.dtype()));
    }
    let grid = if rows == 1 && int8 {
        vector_grid(w.dtype(), n, k)
    } else if rows == 1 {
        head_grid(w.dtype(), n, k)
    } else {
        matmul_grid(n, rows)
    };
    Dispatch::new(for_weight("matmul", &mm::MATMUL, w)?, args, grid)
}

/// The MLX affine product: `w` is u32 `[n, k * bits / 32]` of packed quants, `scales` and
/// `biases` are f32 or f16 `[n, k / group_size]` (the same dtype), and
/// `W[o, i] = scale * q + bias`. `bits` is 4 or 8, `group_size` 32, 64 or 128.
pub fn matmul_affine(
    x: &Buffer,
    w: &Buffer,
    scales: &Buffer,
    biases: &Buffer,
    bits: u32,
    group_size: usize,
    out: &Buffer,
) -> Result<Dispatch> {
    let c = Check::op("matmul_affine");
    c.require("bits", bits == 4 || bits == 8, || {
        format!("must be 4 or 8, got {bits}")
    })?;
    let params = AffineParams::new(bits, group_size).map_err(|_| {
        crate::Error::shape(
            "matmul_affine",
            "group_size",
            format!("must be 32, 64 or 128, got {group_size}"),
        )
    })?;
    c.dtype("w", w, &[DType::U32])?;
    c.require("w", w.shape().rank() == 2, || {
        format!("must be [n, k * bits / 32], got {:?}", w.dims())
    })?;
    let n = w.dims()[0];
    let k = x.shape().last();
    c.require("x", k >= 1 && k.is_multiple_of(group_size), || {
        format!("last dimension {k} is not a whole number of groups of {group_size}")
    })?;
    c.dims("w", w, &[n, params.words_per_row(k)])?;
    c.dtype("scales", scales, &[DType::F32, DType::F16])?;
    c.dims("scales", scales, &[n, params.groups_per_row(k)])?;
    c.dtype("biases", biases, &[scales.dtype()])?;
    c.dims("biases", biases, &[n, params.groups_per_row(k)])?;
    c.require("w", n >= 1, || "has no rows".into())?;
    let rows = check_rows(&c, x, out, k, n)?;
    let args = vec![
        Arg::read(x),
        Arg::read(w),
        Arg::read(scales),
        Arg::read(biases),
        Arg::write(out),
        Arg::u32(to_u32(&c, "x", rows)?),
        Arg::u32(to_u32(&c, "x", k)?),
        Arg::u32(to_u32(&c, "w", n)?),
        Arg::u32(bits),
        Arg::u32(group_size as u32),
    ];
    let grid = warp_per_output_and_row(n, rows);
    // The scale dtype is in the name: a CUDA kernel sees element counts, not dtypes.
    let kernel = KernelId::of(&mm::MATMUL_AFFINE[usize::from(scales.dtype() == DType::F16)]);
    Dispatch::new(kernel, args, grid)
}

/// The expert-routed product: `out[r, s, :] = W[ids[r, s]] · x[r, :]` with `x` f32 `[rows, k]`,
/// `w` `[experts, n, k]` of any of [`WEIGHT_DTYPES`], `ids` i32 `[rows, slots]` (read on the device
/// when the dispatch runs; an id outside `0..experts` is a kernel error naming it) and `out` f32
/// `[rows, slots, n]`.
pub fn matmul_id(x: &Buffer, w: &Buffer, ids: &Buffer, out: &Buffer) -> Result<Dispatch> {
    let c = Check::op("matmul_id");
    c.dtype("w", w, &WEIGHT_DTYPES)?;
    c.require("w", w.shape().rank() == 3, || {
        format!("must be [experts, n, k], got {:?}", w.dims())
    })?;
    let (experts, n, k) = (w.dims()[0], w.dims()[1], w.dims()[2]);
    c.require("w", experts >= 1 && n >= 1 && k >= 1, || {
        format!("has an empty dimension {:?}", w.dims())
    })?;
    c.dtype("x", x, &[DType::F32])?;
    c.require("x", x.shape().rank() == 2, || {
        format!("must be [rows, k], got {:?}", x.dims())
    })?;
    c.last_dim("x", x, k)?;
    let rows = x.dims()[0];
    c.dtype("ids", ids, &[DType::I32])?;
    c.require(
        "ids",
        ids.shape().rank() == 2 && ids.dims()[0] == rows,
        || format!("must be [rows = {rows}, slots], got {:?}", ids.dims()),
    )?;
    let slots = ids.dims()[1];
    c.dtype("out", out, &[DType::F32])?;
    c.dims("out", out, &[rows, slots, n])?;
    let args = vec![
        Arg::read(x),
        Arg::read(w),
        Arg::read(ids),
        Arg::write(out),
        Arg::u32(to_u32(&c, "x", rows)?),
        Arg::u32(to_u32(&c, "w", k)?),
        Arg::u32(to_u32(&c, "w", n)?),
        Arg::u32(to_u32(&c, "ids", slots)?),
        Arg::u32(to_u32(&c, "w", experts)?),
    ];
    let grid = warp_per_output_and_row(n, rows * slots);
    Dispatch::new(for_weight("matmul_id", &mm::MATMUL_ID, w)?, args, grid)
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
mod tests;
