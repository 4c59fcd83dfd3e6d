//! CPU kernels of the fused decoder-block ops (`ops::fused_block`), so a CPU decode block is a
//! handful of dispatches, each with one fork/join of the pool (the matmul + residual add fusion's
//! kernels, which share this file's product loops, are in `matmul_add.rs`).
//!
//! The products run the CPU matmul's own inner loops on the same data, so every value equals the
//! separate ops' value bit for bit: the RMS norm as `rms_norm` computes it (sum of squares in f64,
//! `(x * inv) * w` in f32), then for one row the integer VNNI products of the activation row
//! quantized once (Q4_1 and Q8_0 on AVX-512 VNNI) or the fused dequantize-and-dot of each weight
//! row, and for more rows the packed-tile micro-kernel; RoPE with the rope kernel's angles (f64
//! `powf` and `sin_cos`, the rotation in f32), SwiGLU and GeGLU as `swiglu` and `geglu` write
//! them (the elementwise kernels' own functions), and `acc + product`.
//! Only the split of the work differs: one parallel loop covers every output row of the fused
//! products (q, k and v together; gate and up together), and the cheap tails (rope, cache
//! writes, the gated activation, the residual add) run inside that loop, on the calling thread
//! (one row), or for the rope of many rows in a second loop over rows.
//!
//! Argument layouts (the builders in `ops::fused_block` make them):
//! - `norm_qkv_rope_<w>` (and `norm_qkv_rope_<w>_v_<v>`, wv of format `<v>`): x, norm, wq, wk,
//!   wv, positions (i32), step (i32), q (written), k_cache, v_cache (read-write, f32, or f16 where
//!   cache_f16 is 1), then eps: f32, dim, n_head, n_kv_head, head_dim: u32, base: f32, mode: u32
//!   (0 normal, 1 NeoX), cache_f16: u32
//! - `norm_gate_up_<w>`: x, norm, w_gate, w_up, hidden (written), then eps: f32, dim, ffn, act:
//!   u32 (0 SiLU, 1 GELU tanh)

use std::cell::RefCell;
use std::marker::PhantomData;

use half::f16;
use rayon::prelude::*;

use super::check::{check_len, expect_len, expect_matrix, kernel_err, read_pos0, Factor};
use super::copy::Float;
use super::elementwise::{gelu_tanh, silu};
use super::matmul_simd::{dot_row, micro_kernel, Isa, MR, NR};
use super::matvec_vnni::{self, Layout, QuantRow};
use super::norm::sum_squares;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::backend::DType;
use crate::error::Result;
use crate::kernels::matmul as mm;
use crate::quant::QK_K;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&mm::NORM_QKV_ROPE, [norm_qkv_rope_kernel::<false>; 9]);
    registry.family(&mm::NORM_QKV_ROPE_FF, [norm_qkv_rope_kernel::<true>; 9]);
    registry.family(
        &mm::NORM_QKV_ROPE_FF_SHARED,
        [norm_qkv_rope_kernel::<true>; 9],
    );
    registry.family(
        &mm::NORM_QKV_ROPE_FF_MIXED,
        [norm_qkv_rope_kernel::<true>; 4],
    );
    registry.family(&mm::NORM_GATE_UP, [norm_gate_up_kernel; 9]);
    // The one-row shared-memory forms are CUDA launch forms of the same function.
    registry.family(
        &mm::NORM_QKV_ROPE_SHARED,
        [norm_qkv_rope_kernel::<false>; 9],
    );
    registry.family(&mm::NORM_QKV_ROPE_MIXED, [norm_qkv_rope_kernel::<false>; 4]);
    registry.family(&mm::NORM_GATE_UP_SHARED, [norm_gate_up_kernel; 9]);
}

/// Weights per task of a one-row product below which it runs on the calling thread alone (the
/// separate matmul's threshold).
const TASK_WEIGHTS: usize = 64 * 1024;

/// Elements per task, at least, of the parallel tails of a many-row pass.
const MIN_TASK_ELEMS: usize = 1 << 13;

/// The most rotated pairs per head (half of `ops::rope::MAX_ROTARY_DIM`, the rope kernel's limit).
const MAX_ROPE_PAIRS: usize = 512;

/// One weight matrix: `n` rows of `k` values stored as `row_bytes` bytes of `dtype` each.
#[derive(Clone, Copy)]
pub(super) struct Matrix<'a> {
    pub(super) dtype: DType,
    pub(super) bytes: &'a [u8],
    pub(super) row_bytes: usize,
    pub(super) n: usize,
    pub(super) k: usize,
}

impl<'a> Matrix<'a> {
    /// Row `o`'s bytes.
    #[inline]
    fn row(&self, o: usize) -> &'a [u8] {
        &self.bytes[o * self.row_bytes..(o + 1) * self.row_bytes]
    }

    /// Rows `lo..hi`'s bytes.
    #[inline]
    fn rows(&self, lo: usize, hi: usize) -> &'a [u8] {
        &self.bytes[lo * self.row_bytes..hi * self.row_bytes]
    }
}

/// Per-thread scratch of one task: a packed weight tile and a dequantized row (the tile form) or
/// the dot's block scratch (the vector form). Borrowed only by code that makes no rayon call, so
/// a task never finds it borrowed.
struct TaskScratch {
    tile: Vec<f32>,
    row: Vec<f32>,
}

/// Per-thread scratch of one fused kernel: the normalized rows, the products, the quantized
/// activation row. Taken out of its cell for the kernel's length (a kernel that this thread runs
/// meanwhile, stolen while this one waits in a parallel loop, finds it empty and makes its own).
#[derive(Default)]
pub(super) struct KernelScratch {
    pub(super) xn: Vec<f32>,
    pub(super) products: Vec<f32>,
    pub(super) quant: QuantRow,
    /// The row quantized for v weights of another format than q's and k's.
    pub(super) quant_v: QuantRow,
}

thread_local! {
    static TASK_SCRATCH: RefCell<TaskScratch> =
        const { RefCell::new(TaskScratch { tile: Vec::new(), row: Vec::new() }) };
    static KERNEL_SCRATCH: RefCell<KernelScratch> = RefCell::new(KernelScratch::default());
}

fn with_task_scratch<R>(tile: usize, row: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    TASK_SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let s = &mut *s;
        if s.tile.len() < tile {
            s.tile.resize(tile, 0.0);
        }
        if s.row.len() < row {
            s.row.resize(row, 0.0);
        }
        f(&mut s.tile[..tile], &mut s.row[..row])
    })
}

pub(super) fn with_kernel_scratch<R>(f: impl FnOnce(&mut KernelScratch) -> R) -> R {
    let mut scratch = KERNEL_SCRATCH.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let result = f(&mut scratch);
    KERNEL_SCRATCH.with(|c| *c.borrow_mut() = scratch);
    result
}

/// `v[..len]`, grown if shorter (old values are left; every caller overwrites what it reads).
pub(super) fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// The layout in which a one-row product of `dtype` weights quantizes its activation row for the
/// integer products, where the separate matmul takes that path (AVX-512 with VNNI, Q4_1 or Q8_0,
/// whole 32-value blocks).
fn integer_layout(isa: Isa, dtype: DType, k: usize) -> Option<Layout> {
    let layout = match dtype {
        DType::Q4_1 => Layout::Q4,
        DType::Q8_0 => Layout::Q8,
        _ => return None,
    };
    (isa == Isa::Avx512 && matvec_vnni::available() && k.is_multiple_of(matvec_vnni::QK))
        .then_some(layout)
}

/// Quantizes the activation row `x` into `quant` where the product takes the integer path;
/// returns the row to hand to [`dot_rows`].
pub(super) fn quantize_for<'q>(
    isa: Isa,
    w: &Matrix<'_>,
    x: &[f32],
    quant: &'q mut QuantRow,
) -> Option<&'q QuantRow> {
    let layout = integer_layout(isa, w.dtype, w.k)?;
    quant.quantize(&x[..w.k], layout);
    Some(quant)
}

/// `out[i] = W[lo + i] . x` for one activation row: the integer products where `quant` holds
/// `x` quantized for `w`, else the fused dequantize-and-dot of each row. Makes no rayon call.
pub(super) fn dot_rows(
    isa: Isa,
    w: &Matrix<'_>,
    x: &[f32],
    quant: Option<&QuantRow>,
    lo: usize,
    out: &mut [f32],
) {
    let hi = lo + out.len();
    if let Some(q) = quant {
        let rows_fn = match w.dtype {
            DType::Q4_1 => matvec_vnni::rows_q4_1,
            _ => matvec_vnni::rows_q8_0,
        };
        if rows_fn(w.rows(lo, hi), q, out) {
            return;
        }
    }
    with_task_scratch(0, w.k.max(QK_K), |_, scratch| {
        for (i, o) in out.iter_mut().enumerate() {
            *o = dot_row(isa, w.dtype, w.row(lo + i), &x[..w.k], scratch);
        }
    });
}

/// Tasks of a one-row product over `weights` weights: a few large ones, at most two per pool
/// thread, one where the product is small.
pub(super) fn one_row_tasks(weights: usize) -> usize {
    weights
        .div_ceil(TASK_WEIGHTS)
        .min(2 * rayon::current_num_threads())
        .max(1)
}

/// An output slice that the tasks of one parallel loop share, each writing only its own elements
/// (the columns of its tile, or the cache rows of its row).
pub(super) struct SharedOut<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _slice: PhantomData<&'a mut [T]>,
}
// SAFETY: the tasks sharing it write disjoint elements (see `SharedOut::part`); `T` is sent.
unsafe impl<T: Send> Send for SharedOut<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<'_, T> {}

impl<'a, T> SharedOut<'a, T> {
    pub(super) fn new(out: &'a mut [T]) -> Self {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _slice: PhantomData,
        }
    }

    /// `out[at..at + len]` (bounds checked).
    ///
    /// # Safety
    /// No other reference to these elements is used while the returned slice lives.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn part(&self, at: usize, len: usize) -> &'a mut [T] {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.len),
            "shared output part out of bounds"
        );
        // SAFETY: in bounds (asserted above) of a slice borrowed mutably for `'a`; exclusive
        // per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

/// The many-row products of groups of `P` matrices (all of one `k`; the matrices of a group of
/// one `n`): one parallel loop over the `NR`-column tiles of every group. Each task packs its
/// tile of each of the group's matrices as the separate matmul's matrix form does and runs the
/// same micro-kernel over all activation rows, then hands `emit(group, row, o0, values)` the
/// products of columns `o0..o0 + width` of row `row`, one slice per matrix of the group. No two
/// tasks emit the same `(group, o0)`.
pub(super) fn tile_products<const P: usize>(
    isa: Isa,
    groups: &[[Matrix<'_>; P]],
    x: &[f32],
    rows: usize,
    emit: impl Fn(usize, usize, usize, [&[f32]; P]) + Sync,
) {
    let k = groups[0][0].k;
    assert!(rows.checked_mul(k).is_some_and(|need| x.len() >= need));
    let tiles: usize = groups.iter().map(|g| g[0].n.div_ceil(NR)).sum();
    (0..tiles).into_par_iter().for_each(|t| {
        let (mut tile, mut gi) = (t, 0);
        while tile >= groups[gi][0].n.div_ceil(NR) {
            tile -= groups[gi][0].n.div_ceil(NR);
            gi += 1;
        }
        let group = &groups[gi];
        let o0 = tile * NR;
        let width = NR.min(group[0].n - o0);
        with_task_scratch(P * k * NR, k, |packed, row| {
            for (w, packed) in group.iter().zip(packed.chunks_exact_mut(k * NR)) {
                for j in 0..NR {
                    if j < width {
                        // Row `o0 + j < n` encodes exactly `k` values (`matrix`'s check), the
                        // length of `row`.
                        crate::quant::dequantize_unchecked(w.dtype, w.row(o0 + j), row);
                        for (p, &v) in row.iter().enumerate() {
                            packed[p * NR + j] = v;
                        }
                    } else {
                        for p in 0..k {
                            packed[p * NR + j] = 0.0;
                        }
                    }
                }
            }
            let mut c = [[[0f32; NR]; MR]; P];
            let mut r0 = 0;
            while r0 < rows {
                let m = isa.rows_per_call().min(rows - r0);
                for (cp, packed) in c.iter_mut().zip(packed.chunks_exact(k * NR)) {
                    micro_kernel(isa, &x[r0 * k..], k, m, packed, k, cp);
                }
                for (i, r) in (r0..r0 + m).enumerate() {
                    emit(gi, r, o0, std::array::from_fn(|p| &c[p][i][..width]));
                }
                r0 += m;
            }
        })
    });
}

/// The many-row products of a stack of matrices (one `k`): `out[r, c_m + o] = x[r] . W_m[o]`
/// with `c_m` the rows of the matrices before `m`, `out` `[rows, sum n_m]`, in one parallel loop.
pub(super) fn stacked_products(
    isa: Isa,
    stack: &[Matrix<'_>; 3],
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) {
    let n_total: usize = stack.iter().map(|w| w.n).sum();
    let col0 = [0, stack[0].n, stack[0].n + stack[1].n];
    let shared = SharedOut::new(&mut out[..rows * n_total]);
    let groups = stack.map(|w| [w]);
    tile_products(isa, &groups, x, rows, |g, r, o0, [v]| {
        // SAFETY: `part` asserts the bounds (row `r < rows` of `rows * n_total` values, columns
        // `col0[g] + o0..` of matrix `g`'s `n` below `n_total`); exclusive because only the task
        // of tile `o0` of matrix `g` writes these columns.
        let dst = unsafe { shared.part(r * n_total + col0[g] + o0, v.len()) };
        dst.copy_from_slice(v);
    });
}

/// RMS-normalizes `rows` rows of `x` with `weight` into `out`, as the `rms_norm` kernel does.
pub(super) fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    let one = |xr: &[f32], o: &mut [f32]| {
        let mean = sum_squares(xr) / dim as f64;
        let inv = (1.0 / (mean + eps as f64).sqrt()) as f32;
        for ((o, &xv), &wv) in o.iter_mut().zip(xr).zip(weight) {
            *o = xv * inv * wv;
        }
    };
    if out.len() == dim {
        one(x, out);
    } else {
        out.par_chunks_mut(dim)
            .with_min_len((MIN_TASK_ELEMS / dim).max(1))
            .zip(x.par_chunks(dim))
            .for_each(|(o, xr)| one(xr, o));
    }
}

/// The weight argument at `index` as `rows` (a product of named scalars) rows of `k` values of
/// `dtype`, checked up front (`check::expect_matrix`): every row `o < n` lies inside the bytes
/// and encodes exactly `k` values, what the dot products and `dequantize_unchecked` rely on.
pub(super) fn matrix<'a>(
    args: &KernelArgs<'a>,
    index: usize,
    what: &str,
    dtype: DType,
    rows: &[Factor<'_>],
    k: Factor<'_>,
) -> Result<Matrix<'a>> {
    let (buf, _) = args.buffer(index)?;
    if buf.dtype() != dtype {
        return Err(kernel_err(
            args,
            format!("{what} is {}, expected {dtype}", buf.dtype()),
        ));
    }
    let bytes = args.input_bytes(index)?;
    let size = expect_matrix(args, what, dtype, bytes.len(), rows, k)?;
    Ok(Matrix {
        dtype,
        bytes,
        row_bytes: size.row_bytes,
        n: size.n,
        k: k.1,
    })
}

/// The residual `x` (argument 0, `[rows, dim]`) and the norm weight (argument 1, `[dim]`).
pub(super) fn x_and_norm<'a>(
    args: &KernelArgs<'a>,
    dim: usize,
) -> Result<(&'a [f32], &'a [f32], usize)> {
    let x = args.input::<f32>(0)?;
    let norm = args.input::<f32>(1)?;
    if dim == 0 || x.is_empty() || x.len() % dim != 0 {
        return Err(kernel_err(
            args,
            format!("x has {} values, not whole rows of dim = {dim}", x.len()),
        ));
    }
    check_len(args, "norm", norm.len(), dim)?;
    Ok((x, norm, x.len() / dim))
}

/// The attention input of a block: see the module documentation and `ops::fused_block`.
/// `FF`: the `_ff` kernels, the RoPE's frequency factors after positions (argument 6; the
/// arguments after it one later).
fn norm_qkv_rope_kernel<const FF: bool>(args: &KernelArgs<'_>) -> Result<()> {
    let o = usize::from(FF);
    let (eps, dim) = (args.f32(10 + o)?, args.usize(11 + o)?);
    let (n_head, n_kv, hd) = (
        args.usize(12 + o)?,
        args.usize(13 + o)?,
        args.usize(14 + o)?,
    );
    let (base, mode) = (args.f32(15 + o)?, args.u32(16 + o)?);
    let (x, norm, rows) = x_and_norm(args, dim)?;
    if hd == 0 || hd % 2 != 0 || hd / 2 > MAX_ROPE_PAIRS || n_head == 0 || n_kv == 0 || mode > 1 {
        return Err(kernel_err(
            args,
            format!(
                "head_dim = {hd}, n_head = {n_head}, n_kv_head = {n_kv}, mode = {mode}: head_dim \
                 must be even and at most {}, the head counts at least 1, mode 0 or 1",
                2 * MAX_ROPE_PAIRS
            ),
        ));
    }
    // v may take another format than q and k (the kernel's declaration names which).
    let (dtype, dtype_v) = (args.buffer(2)?.0.dtype(), args.buffer(4)?.0.dtype());
    let (q_heads, kv_heads) = (
        [("n_head", n_head), ("head_dim", hd)],
        [("n_kv_head", n_kv), ("head_dim", hd)],
    );
    let stack = [
        matrix(args, 2, "wq", dtype, &q_heads, ("dim", dim))?,
        matrix(args, 3, "wk", dtype, &kv_heads, ("dim", dim))?,
        matrix(args, 4, "wv", dtype_v, &kv_heads, ("dim", dim))?,
    ];
    let positions = args.input::<i32>(5)?;
    let ff = if FF {
        let f = args.input::<f32>(6)?;
        check_len(args, "freq_factors", f.len(), hd / 2)?;
        Some(f)
    } else {
        None
    };
    let q = args.output::<f32>(7 + o)?;
    let cache_f16 = args.u32(17 + o)? == 1;
    let cache_len = args.buffer(8 + o)?.0.elems();
    check_len(args, "positions", positions.len(), rows)?;
    expect_len(
        args,
        "q",
        q.len(),
        &[("rows", rows), ("n_head", n_head), ("head_dim", hd)],
    )?;
    check_len(args, "v_cache", args.buffer(9 + o)?.0.elems(), cache_len)?;
    // `kv_row` is wk's row count, checked above without overflow.
    let kv_row = stack[1].n;
    if cache_len == 0 || cache_len % kv_row != 0 {
        return Err(kernel_err(
            args,
            format!(
                "k_cache has {} values, not whole positions of n_kv_head = {n_kv} x head_dim = \
                 {hd}",
                cache_len
            ),
        ));
    }
    // The caches are `[n_kv_head, max_ctx, head_dim]`; rows `pos0..pos0 + rows` fit in them.
    let max_ctx = cache_len / kv_row;
    let pos0 = read_pos0(args, 6 + o, rows, max_ctx)?;
    let rope = Rope {
        ff,
        hd,
        base,
        neox: mode == 1,
    };
    with_kernel_scratch(|s| {
        let all = qkv_products(s, (x, norm, eps), dim, rows, &stack);
        let heads = (n_head, n_kv);
        if cache_f16 {
            let (k, v) = (args.output::<f16>(8 + o)?, args.output::<f16>(9 + o)?);
            let caches = Caches {
                k,
                v,
                max_ctx,
                pos0,
            };
            rope_and_store(&rope, positions, all, heads, q, caches);
        } else {
            let (k, v) = (args.output::<f32>(8 + o)?, args.output::<f32>(9 + o)?);
            let caches = Caches {
                k,
                v,
                max_ctx,
                pos0,
            };
            rope_and_store(&rope, positions, all, heads, q, caches);
        }
        Ok::<(), crate::error::Error>(())
    })?;
    Ok(())
}

/// The attention input's products in `s.products` (`[rows, n_q + 2 n_kv]`, q's columns, then
/// k's, then v's): `x` (`rows` rows of `dim`) RMS-normalized with `norm` and `eps` as `rms_norm`
/// does, times the q, k and v matrices of `stack` with the separate matmul's loops (one row: the
/// row quantized once for the integer products, again for a v of another integer layout).
pub(super) fn qkv_products<'s>(
    s: &'s mut KernelScratch,
    (x, norm, eps): (&[f32], &[f32], f32),
    dim: usize,
    rows: usize,
    stack: &[Matrix<'_>; 3],
) -> &'s [f32] {
    let isa = Isa::detect();
    let n_total: usize = stack.iter().map(|w| w.n).sum();
    let xn = sized(&mut s.xn, rows * dim);
    rms_norm_rows(x, norm, eps, dim, xn);
    let all = sized(&mut s.products, rows * n_total);
    if rows == 1 {
        let quant = quantize_for(isa, &stack[0], xn, &mut s.quant);
        let quant_v = if stack[2].dtype == stack[0].dtype {
            quant
        } else {
            quantize_for(isa, &stack[2], xn, &mut s.quant_v)
        };
        stacked_one_row(isa, stack, xn, &[quant, quant, quant_v], all);
    } else {
        stacked_products(isa, stack, xn, rows, all);
    }
    all
}

/// One activation row times a stack of matrices into `out` (`sum n_m` values, matrix `m`'s rows
/// after those of the matrices before it): one parallel loop over pieces of the stacked rows.
/// `quants[m]`: the row quantized for matrix `m`'s integer products, if it takes them.
pub(super) fn stacked_one_row(
    isa: Isa,
    stack: &[Matrix<'_>],
    x: &[f32],
    quants: &[Option<&QuantRow>],
    out: &mut [f32],
) {
    let n_total: usize = stack.iter().map(|w| w.n).sum();
    let run = |first: usize, piece: &mut [f32]| {
        let last = first + piece.len();
        let mut start = 0;
        for (w, &quant) in stack.iter().zip(quants) {
            let (lo, hi) = (first.max(start), last.min(start + w.n));
            if lo < hi {
                let o = &mut piece[lo - first..hi - first];
                dot_rows(isa, w, x, quant, lo - start, o);
            }
            start += w.n;
        }
    };
    let tasks = one_row_tasks(n_total * stack[0].k);
    if tasks == 1 {
        run(0, &mut out[..n_total]);
    } else {
        let chunk = n_total.div_ceil(tasks);
        out[..n_total]
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(c, piece)| run(c * chunk, piece));
    }
}

/// RoPE of whole heads, as the rope kernel computes it.
struct Rope<'a> {
    /// The frequency factors, one a pair (Llama 3's `rope_freqs`), if any.
    ff: Option<&'a [f32]>,
    hd: usize,
    base: f32,
    neox: bool,
}

impl Rope<'_> {
    /// Cosine and sine of every pair's angle at `pos` (f64, rounded to f32).
    fn table(&self, pos: i32, out: &mut [(f32, f32); MAX_ROPE_PAIRS]) {
        let pairs = self.hd / 2;
        for (i, cs) in out[..pairs].iter_mut().enumerate() {
            let inv_freq = (self.base as f64).powf(-2.0 * i as f64 / self.hd as f64);
            let angle = pos as f64 * inv_freq;
            let (s, c) = match self.ff {
                Some(f) => (angle / f[i] as f64).sin_cos(),
                None => angle.sin_cos(),
            };
            *cs = (c as f32, s as f32);
        }
    }

    /// Writes `src`, one head, rotated by `table` into `dst`.
    #[inline]
    fn rotate(&self, table: &[(f32, f32)], src: &[f32], dst: &mut [f32]) {
        let pairs = self.hd / 2;
        for (i, &(c, s)) in table[..pairs].iter().enumerate() {
            let (j0, j1) = if self.neox {
                (i, i + pairs)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (a, b) = (src[j0], src[j1]);
            dst[j0] = a * c - b * s;
            dst[j1] = a * s + b * c;
        }
    }
}

/// The KV cache of a layer (f32 or f16) and where the pass's rows go.
struct Caches<'a, C> {
    k: &'a mut [C],
    v: &'a mut [C],
    max_ctx: usize,
    pos0: usize,
}

/// The tail of `norm_qkv_rope`: `all` holds each row's q, k and v products; q and k are rotated
/// into `q` and the key cache, v copied into the value cache (row `r` at `pos0 + r`). One row on
/// the calling thread, more in parallel over rows (each row's angles computed once, as the rope
/// kernel does); an f16 cache takes each value rounded once.
fn rope_and_store<C: Float>(
    rope: &Rope<'_>,
    positions: &[i32],
    all: &[f32],
    (n_head, n_kv): (usize, usize),
    q: &mut [f32],
    c: Caches<'_, C>,
) {
    let hd = rope.hd;
    let (nq, nkv) = (n_head * hd, n_kv * hd);
    let n_total = nq + 2 * nkv;
    let (k_cache, v_cache) = (SharedOut::new(c.k), SharedOut::new(c.v));
    let row = |r: usize, qr: &mut [f32]| {
        let mut table = [(0f32, 0f32); MAX_ROPE_PAIRS];
        rope.table(positions[r], &mut table);
        let (qs, kv) = all[r * n_total..(r + 1) * n_total].split_at(nq);
        let (ks, vs) = kv.split_at(nkv);
        for (dst, src) in qr.chunks_exact_mut(hd).zip(qs.chunks_exact(hd)) {
            rope.rotate(&table, src, dst);
        }
        for (h, (kh, vh)) in ks.chunks_exact(hd).zip(vs.chunks_exact(hd)).enumerate() {
            let at = (h * c.max_ctx + c.pos0 + r) * hd;
            // SAFETY: `part` asserts the bounds (`h < n_kv_head` and `pos0 + r < max_ctx` by the
            // kernel's `read_pos0` check, so `at + hd` is within the caches); exclusive because
            // cache row `pos0 + r` of every head is written by row `r`'s task alone.
            let (kd, vd) = unsafe { (k_cache.part(at, hd), v_cache.part(at, hd)) };
            let mut rotated = [0f32; 2 * MAX_ROPE_PAIRS];
            rope.rotate(&table, kh, &mut rotated[..hd]);
            for (o, &x) in kd.iter_mut().zip(&rotated[..hd]) {
                *o = C::from_f32(x);
            }
            for (o, &x) in vd.iter_mut().zip(vh) {
                *o = C::from_f32(x);
            }
        }
    };
    if positions.len() == 1 {
        row(0, q);
        return;
    }
    q.par_chunks_mut(nq)
        .with_min_len((MIN_TASK_ELEMS / n_total).max(1))
        .enumerate()
        .for_each(|(r, qr)| row(r, qr));
}

/// The MLP input of a block: see the module documentation and `ops::fused_block`.
fn norm_gate_up_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let (eps, dim, ffn) = (args.f32(5)?, args.usize(6)?, args.usize(7)?);
    let act = match args.u32(8)? {
        0 => Glu::Swiglu,
        1 => Glu::Geglu,
        other => {
            return Err(kernel_err(
                args,
                format!("act = {other}: expected 0 (SiLU) or 1 (GELU tanh)"),
            ))
        }
    };
    let (x, norm, rows) = x_and_norm(args, dim)?;
    let dtype = args.buffer(2)?.0.dtype();
    let stack = [
        matrix(args, 2, "w_gate", dtype, &[("ffn", ffn)], ("dim", dim))?,
        matrix(args, 3, "w_up", dtype, &[("ffn", ffn)], ("dim", dim))?,
    ];
    let hidden = args.output::<f32>(4)?;
    expect_len(
        args,
        "hidden",
        hidden.len(),
        &[("rows", rows), ("ffn", ffn)],
    )?;
    if ffn == 0 {
        return Ok(());
    }
    with_kernel_scratch(|s| {
        let isa = Isa::detect();
        let xn = sized(&mut s.xn, rows * dim);
        rms_norm_rows(x, norm, eps, dim, xn);
        if rows == 1 {
            let all = sized(&mut s.products, 2 * ffn);
            let quant = quantize_for(isa, &stack[0], xn, &mut s.quant);
            gate_up_one_row(isa, &stack, xn, quant, act, all, hidden);
            return;
        }
        let shared = SharedOut::new(hidden);
        tile_products(isa, &[stack], xn, rows, |_, r, o0, [g, u]| {
            // SAFETY: `part` asserts the bounds (`hidden` holds `rows * ffn`, checked up front);
            // exclusive because only the task of tile `o0` writes these columns of `hidden`.
            act.apply(g, u, unsafe { shared.part(r * ffn + o0, g.len()) });
        });
    });
    Ok(())
}

/// The gated activation of the MLP input (the kernel's `act`).
#[derive(Clone, Copy)]
enum Glu {
    /// `silu(gate) * up`, as the `swiglu` kernel writes it.
    Swiglu,
    /// `gelu_tanh(gate) * up`, as the `geglu` kernel writes it.
    Geglu,
}

impl Glu {
    /// `h = act(gate) * up`.
    #[inline]
    fn apply(self, gate: &[f32], up: &[f32], h: &mut [f32]) {
        match self {
            Glu::Swiglu => gated(gate, up, h, silu),
            Glu::Geglu => gated(gate, up, h, gelu_tanh),
        }
    }
}

/// `h = act(gate) * up`, one activation for the whole slice.
#[inline(always)]
fn gated(gate: &[f32], up: &[f32], h: &mut [f32], act: impl Fn(f32) -> f32) {
    for ((h, &g), &u) in h.iter_mut().zip(gate).zip(up) {
        *h = act(g) * u;
    }
}

/// The one-row gate and up products and the gated activation in one parallel loop over pieces of
/// the hidden row: each task takes its outputs' gate and up rows and writes its piece of `hidden`.
fn gate_up_one_row(
    isa: Isa,
    stack: &[Matrix<'_>; 2],
    x: &[f32],
    quant: Option<&QuantRow>,
    act: Glu,
    all: &mut [f32],
    hidden: &mut [f32],
) {
    let ffn = hidden.len();
    let (gate, up) = all.split_at_mut(ffn);
    let run = |first: usize, h: &mut [f32], g: &mut [f32], u: &mut [f32]| {
        dot_rows(isa, &stack[0], x, quant, first, g);
        dot_rows(isa, &stack[1], x, quant, first, u);
        act.apply(g, u, h);
    };
    let tasks = one_row_tasks(2 * ffn * stack[0].k);
    if tasks == 1 {
        run(0, hidden, gate, &mut up[..ffn]);
        return;
    }
    let chunk = ffn.div_ceil(tasks);
    hidden
        .par_chunks_mut(chunk)
        .zip(gate.par_chunks_mut(chunk))
        .zip(up[..ffn].par_chunks_mut(chunk))
        .enumerate()
        .for_each(|(c, ((h, g), u))| run(c * chunk, h, g, u));
}
