//! CPU kernels of the `matmul` op family: `y[r, o] = sum_i x[r, i] * W[o, i]` with f32 activations
//! and weights in any GGML block format, f32, f16, bf16 or the MLX affine format.
//!
//! Weights are dequantized on the fly and every sum is f32. One row of activations (decode) takes
//! the vector form: rayon over chunks of output rows, each a fused dequantize-and-dot. More rows
//! (prefill) take the matrix form: rayon over tiles of [`NR`] output columns; each task
//! dequantizes its tile of weight rows once into a packed f32 buffer (thread-local, so no heap
//! allocation per dispatch once warm) and runs the register-blocked micro-kernel over all
//! activation rows, up to [`MR`] at a time.
//!
//! Argument layouts (the ops in `ops::matmul` build them):
//! - `matmul_<w>`: x, w, out, rows: u32, k: u32, n: u32
//! - `matmul_affine_<f32|f16>`: x, packed w (u32), scales, biases (of the suffix's dtype), out,
//!   rows, k, n, bits, group
//! - `matmul_id_<w>`: x, w `[experts, n, k]`, ids i32 `[rows, slots]`, out, rows, k, n, slots, experts

use std::cell::RefCell;

use rayon::prelude::*;

use super::check::{expect_len, expect_matrix, kernel_err, product, Factor};
use super::elementwise::silu;
use super::matmul_simd::{dot_f32, dot_row, micro_kernel, Isa, MR, NR};
use super::matvec_vnni::{self, Layout, QuantRow};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::backend::DType;
use crate::error::Result;
use crate::kernels::matmul as mm;
use crate::quant::{AffineParams, QK_K};

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&mm::MATMUL, [matmul_kernel; 9]);
    // The tensor-core form is a GPU launch shape: on the CPU it is the same product.
    registry.family(&mm::MATMUL_MMA, [matmul_kernel; 9]);
    registry.family(&mm::MATMUL3_MMA, [matmul3_kernel; 9]);
    registry.family(&mm::MATMUL_MMA_H, [matmul_h_kernel; 9]);
    registry.family(&mm::MATMUL3_MMA_H, [matmul3_h_kernel; 9]);
    registry.family(&mm::MATMUL_SWIGLU_MMA_H, [matmul_swiglu_h_kernel; 9]);
    registry.family(&mm::MATMUL_ID, [matmul_id_kernel; 9]);
    registry.family(&mm::MATMUL_AFFINE, [matmul_affine_kernel; 2]);
}

/// Where the rows of a weight matrix come from.
#[derive(Clone, Copy)]
pub(crate) enum WeightRows<'a> {
    /// `n` rows of `row_bytes` bytes of a GGML or float dtype.
    Plain {
        /// The format.
        dtype: DType,
        /// All rows.
        bytes: &'a [u8],
        /// Bytes per row.
        row_bytes: usize,
    },
    /// MLX affine rows.
    Affine {
        /// Packed quants, `words` per row.
        packed: &'a [u32],
        /// Scales, `groups` per row, f32 or f16 bytes.
        scales: &'a [u8],
        /// Biases, as the scales.
        biases: &'a [u8],
        /// Whether scales and biases are f16 (else f32).
        half: bool,
        /// Bits and group size.
        params: AffineParams,
        /// Values per row.
        k: usize,
    },
}

impl WeightRows<'_> {
    /// Writes weight row `o` as f32 into `out` (`k` values). The kernels check up front that
    /// a plain row encodes exactly `k` values and an affine row is whole groups of `k` values
    /// (`check::expect_matrix`, `matmul_affine_kernel`); a row outside the bytes panics in the
    /// slicing, never reads past them.
    fn dequant_row(&self, o: usize, out: &mut [f32]) {
        match *self {
            WeightRows::Plain {
                dtype,
                bytes,
                row_bytes,
            } => crate::quant::dequantize_unchecked(
                dtype,
                &bytes[o * row_bytes..(o + 1) * row_bytes],
                out,
            ),
            WeightRows::Affine {
                packed,
                scales,
                biases,
                half,
                params,
                k,
            } => {
                let words = params.words_per_row(k);
                let groups = params.groups_per_row(k);
                let row = &packed[o * words..(o + 1) * words];
                let per_word = params.per_word();
                let mask = (1u32 << params.bits) - 1;
                for g in 0..groups {
                    let s = scalar_at(scales, o * groups + g, half);
                    let b = scalar_at(biases, o * groups + g, half);
                    let first = g * params.group_size;
                    for (i, v) in out[first..first + params.group_size].iter_mut().enumerate() {
                        let idx = first + i;
                        let q = (row[idx / per_word] >> (params.bits as usize * (idx % per_word)))
                            & mask;
                        *v = s * q as f32 + b;
                    }
                }
            }
        }
    }

    /// `dot(x, W[o])`; `scratch` holds at least `k` values.
    #[inline]
    pub(crate) fn dot(&self, isa: Isa, o: usize, x: &[f32], scratch: &mut [f32]) -> f32 {
        match *self {
            WeightRows::Plain {
                dtype,
                bytes,
                row_bytes,
            } => dot_row(
                isa,
                dtype,
                &bytes[o * row_bytes..(o + 1) * row_bytes],
                x,
                scratch,
            ),
            WeightRows::Affine { k, .. } => {
                let tmp = &mut scratch[..k];
                self.dequant_row(o, tmp);
                dot_f32(isa, tmp, x)
            }
        }
    }
}

/// Value `i` of a little-endian f32 or f16 array.
#[inline]
fn scalar_at(bytes: &[u8], i: usize, half: bool) -> f32 {
    if half {
        half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
    } else {
        f32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    }
}

thread_local! {
    /// Per-thread scratch: a packed weight tile and a dequantized row. Borrowed only inside code
    /// that makes no rayon call, so a task can never re-enter it.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

fn with_scratch<R>(tile: usize, row: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (t, r) = &mut *s;
        if t.len() < tile {
            t.resize(tile, 0.0);
        }
        if r.len() < row {
            r.resize(row, 0.0);
        }
        f(&mut t[..tile], &mut r[..row])
    })
}

/// Pointer to the output matrix, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks of one product write disjoint elements (see `matmul_rows`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out[r * n + o] = dot(x[r * k..], W[o])` for `rows` activation rows. `x` holds `rows * k`
/// values, `out` `rows * n`; `w` has `n` rows of `k` values (the kernels check all three up
/// front; a weight row outside `w` would panic in its slicing, never read out of bounds).
/// Panics, once, when `x` or `out` is shorter: the raw writes below rest on that assertion.
pub(crate) fn matmul_rows(
    isa: Isa,
    w: &WeightRows<'_>,
    x: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) {
    let holds = |len: usize, per_row: usize| rows.checked_mul(per_row).is_some_and(|v| v <= len);
    assert!(
        holds(x.len(), k) && holds(out.len(), n),
        "matmul_rows: {rows} rows of k = {k} and n = {n} do not fit x ({}) and out ({})",
        x.len(),
        out.len()
    );
    if rows == 0 || n == 0 {
        return;
    }
    if rows == 1 && isa == Isa::Avx512 && matvec_integer(w, x, k, n, out) {
        return;
    }
    if rows == 1 {
        let chunk = (n / (rayon::current_num_threads() * 8)).clamp(8, 512);
        let scratch_len = k.max(QK_K);
        out[..n]
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(c, oc)| {
                with_scratch(0, scratch_len, |_, row| {
                    for (j, o) in oc.iter_mut().enumerate() {
                        *o = w.dot(isa, c * chunk + j, &x[..k], row);
                    }
                })
            });
        return;
    }
    let tiles = n.div_ceil(NR);
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..tiles).into_par_iter().for_each(|t| {
        let o0 = t * NR;
        let width = NR.min(n - o0);
        with_scratch(k * NR, k, |packed, row| {
            for j in 0..NR {
                if j < width {
                    w.dequant_row(o0 + j, row);
                    for (p, &v) in row.iter().enumerate() {
                        packed[p * NR + j] = v;
                    }
                } else {
                    for p in 0..k {
                        packed[p * NR + j] = 0.0;
                    }
                }
            }
            let mut c = [[0f32; NR]; MR];
            let mut r0 = 0;
            while r0 < rows {
                let m = isa.rows_per_call().min(rows - r0);
                micro_kernel(isa, &x[r0 * k..], k, m, packed, k, &mut c);
                for (i, ci) in c.iter().enumerate().take(m) {
                    let base = (r0 + i) * n + o0;
                    // SAFETY: `r0 + i < rows` and `o0 + width <= n`, so `base + width <=
                    // rows * n <= out.len()` (asserted at the top); `ci` holds `NR >= width`
                    // values. Only the task of tile `t` writes columns `o0..o0 + width`, so no
                    // two tasks touch one element, and nothing else borrows `out` meanwhile.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ci.as_ptr(), out_ptr.get().add(base), width)
                    };
                }
                r0 += m;
            }
        })
    });
}

thread_local! {
    /// The quantized activation row of the integer matrix-vector product. Taken out of the cell
    /// for the length of one product (a nested product on this thread finds it empty and uses a
    /// fresh one), so no borrow is held across the product's rayon calls.
    static QUANT_ROW: RefCell<QuantRow> = RefCell::new(QuantRow::default());
}

/// Weights per task below which a matrix-vector product runs on the calling thread alone, and the
/// smallest share of a parallel one.
const MATVEC_TASK_WEIGHTS: usize = 64 * 1024;

/// The one-row product through the integer path ([`super::matvec_vnni`]) for Q4_1 and Q8_0
/// weights: `x` is quantized once, the rows are cut into a few large tasks (at most two per pool
/// thread). Returns `false` when the path does not apply (other formats, no VNNI), having written
/// nothing.
fn matvec_integer(w: &WeightRows<'_>, x: &[f32], k: usize, n: usize, out: &mut [f32]) -> bool {
    let WeightRows::Plain {
        dtype,
        bytes,
        row_bytes,
    } = *w
    else {
        return false;
    };
    let layout = match dtype {
        DType::Q4_1 => Layout::Q4,
        DType::Q8_0 => Layout::Q8,
        _ => return false,
    };
    if !matvec_vnni::available() || !k.is_multiple_of(matvec_vnni::QK) || n == 0 || k == 0 {
        return false;
    }
    let mut q = QUANT_ROW.with(|c| std::mem::take(&mut *c.borrow_mut()));
    q.quantize(&x[..k], layout);
    let rows_fn = match layout {
        Layout::Q4 => matvec_vnni::rows_q4_1,
        Layout::Q8 => matvec_vnni::rows_q8_0,
    };
    let Some(bytes) = n.checked_mul(row_bytes).and_then(|len| bytes.get(..len)) else {
        return false;
    };
    let tasks = (n * k)
        .div_ceil(MATVEC_TASK_WEIGHTS)
        .min(2 * rayon::current_num_threads())
        .max(1);
    let done = if tasks == 1 {
        rows_fn(bytes, &q, &mut out[..n])
    } else {
        let chunk = n.div_ceil(tasks);
        out[..n]
            .par_chunks_mut(chunk)
            .zip(bytes.par_chunks(chunk * row_bytes))
            .map(|(o, wb)| rows_fn(wb, &q, o))
            .reduce(|| true, |a, b| a && b)
    };
    QUANT_ROW.with(|c| *c.borrow_mut() = q);
    done
}

/// Checks `x` (`rows x k` values) and `out` (`rows x n`) against the scalars.
fn check_rows(
    args: &KernelArgs<'_>,
    x: usize,
    out: usize,
    rows: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    expect_len(args, "x", x, &[("rows", rows), ("k", k)])?;
    expect_len(args, "out", out, &[("rows", rows), ("n", n)])
}

/// One product's parameter names (weights, output, outputs count) and argument indices.
struct ProductArgs {
    names: [&'static str; 3],
    at: [usize; 3],
}

fn matmul_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let (rows, k, n) = (args.usize(3)?, args.usize(4)?, args.usize(5)?);
    let p = ProductArgs {
        names: ["w", "out", "n"],
        at: [0, 1, 2],
    };
    product_of(args, &p, rows, k, n)
}

/// `matmul3_mma_<w>`: the three products one after the other (x, w0..w2, out0..out2, rows, k,
/// n0..n2).
fn matmul3_kernel(args: &KernelArgs<'_>) -> Result<()> {
    const NAMES: [[&str; 3]; 3] = [
        ["w0", "out0", "n0"],
        ["w1", "out1", "n1"],
        ["w2", "out2", "n2"],
    ];
    let (rows, k) = (args.usize(7)?, args.usize(8)?);
    for (i, names) in NAMES.into_iter().enumerate() {
        let p = ProductArgs {
            names,
            at: [0, 1 + i, 4 + i],
        };
        product_of(args, &p, rows, k, args.usize(9 + i)?)?;
    }
    Ok(())
}

/// `matmul_mma_h_<w>`: x in f16, widened to f32 (exactly), then `matmul_kernel`'s product.
fn matmul_h_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let (rows, k, n) = (args.usize(3)?, args.usize(4)?, args.usize(5)?);
    let p = ProductArgs {
        names: ["w", "out", "n"],
        at: [0, 1, 2],
    };
    product_on(args, &p, &widened(args)?, rows, k, n)
}

/// `matmul3_mma_h_<w>`: x in f16, widened once, then `matmul3_kernel`'s three products.
fn matmul3_h_kernel(args: &KernelArgs<'_>) -> Result<()> {
    const NAMES: [[&str; 3]; 3] = [
        ["w0", "out0", "n0"],
        ["w1", "out1", "n1"],
        ["w2", "out2", "n2"],
    ];
    let (rows, k) = (args.usize(7)?, args.usize(8)?);
    let x = widened(args)?;
    for (i, names) in NAMES.into_iter().enumerate() {
        let p = ProductArgs {
            names,
            at: [0, 1 + i, 4 + i],
        };
        product_on(args, &p, &x, rows, k, args.usize(9 + i)?)?;
    }
    Ok(())
}

/// The f16 activations (argument 0) as f32.
/// `matmul_swiglu_mma_h_<w>` (x, wg, wu, out, rows, k, n): x in f16, widened once; the gate and
/// up products as `matmul_h_kernel` computes them, then `swiglu_f32_to_f16`'s values.
fn matmul_swiglu_h_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let (rows, k, n) = (args.usize(4)?, args.usize(5)?, args.usize(6)?);
    let x = widened(args)?;
    let out = args.output::<half::f16>(3)?;
    expect_len(args, "x", x.len(), &[("rows", rows), ("k", k)])?;
    expect_len(args, "out", out.len(), &[("rows", rows), ("n", n)])?;
    let mut sums = [vec![0.0f32; out.len()], vec![0.0f32; out.len()]];
    for (i, (name, sum)) in ["wg", "wu"].into_iter().zip(sums.iter_mut()).enumerate() {
        let (wbuf, _) = args.buffer(1 + i)?;
        let w = args.input_bytes(1 + i)?;
        let dtype = wbuf.dtype();
        let row_bytes = expect_matrix(args, name, dtype, w.len(), &[("n", n)], ("k", k))?.row_bytes;
        let rows_of = WeightRows::Plain {
            dtype,
            bytes: w,
            row_bytes,
        };
        matmul_rows(Isa::detect(), &rows_of, &x, rows, k, n, sum);
    }
    let [gate, up] = &sums;
    out.par_iter_mut()
        .zip(gate.par_iter().zip(up.par_iter()))
        .for_each(|(o, (&g, &u))| *o = half::f16::from_f32(silu(g) * u));
    Ok(())
}

fn widened(args: &KernelArgs<'_>) -> Result<Vec<f32>> {
    Ok(args
        .input::<half::f16>(0)?
        .iter()
        .map(|v| v.to_f32())
        .collect())
}

/// The product of the arguments at `p.at` (x, w, out).
fn product_of(
    args: &KernelArgs<'_>,
    p: &ProductArgs,
    rows: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    product_on(args, p, args.input::<f32>(p.at[0])?, rows, k, n)
}

/// [`product_of`] with the activations `x` given (widened from f16 by the `_h` kernels).
fn product_on(
    args: &KernelArgs<'_>,
    p: &ProductArgs,
    x: &[f32],
    rows: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let [w_name, out_name, n_name] = p.names;
    let (wbuf, _) = args.buffer(p.at[1])?;
    let w = args.input_bytes(p.at[1])?;
    let out = args.output::<f32>(p.at[2])?;
    let dtype = wbuf.dtype();
    // The weights first: their size is the product that can overflow.
    let row_bytes =
        expect_matrix(args, w_name, dtype, w.len(), &[(n_name, n)], ("k", k))?.row_bytes;
    expect_len(args, "x", x.len(), &[("rows", rows), ("k", k)])?;
    expect_len(args, out_name, out.len(), &[("rows", rows), (n_name, n)])?;
    matmul_rows(
        Isa::detect(),
        &WeightRows::Plain {
            dtype,
            bytes: w,
            row_bytes,
        },
        x,
        rows,
        k,
        n,
        out,
    );
    Ok(())
}

fn matmul_affine_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let packed = args.input::<u32>(1)?;
    let (sbuf, _) = args.buffer(2)?;
    let scales = args.input_bytes(2)?;
    let biases = args.input_bytes(3)?;
    let out = args.output::<f32>(4)?;
    let (rows, k, n) = (args.usize(5)?, args.usize(6)?, args.usize(7)?);
    let params = AffineParams::new(args.u32(8)?, args.usize(9)?)
        .map_err(|e| kernel_err(args, e.to_string()))?;
    let group = params.group_size;
    // Whole groups, so a row's groups write all of its `k` dequantized values (the group size
    // is a multiple of the values per word, so whole words too).
    if !k.is_multiple_of(group) {
        return Err(kernel_err(
            args,
            format!("k = {k} is not a whole number of groups of group_size = {group}"),
        ));
    }
    let half = sbuf.dtype() == DType::F16;
    let row: [Factor<'_>; 2] = [("n", n), ("k", k)];
    let values = product(args, "w", &row)?;
    let words = values / params.per_word();
    let groups = values / group;
    if packed.len() != words {
        return Err(kernel_err(
            args,
            format!(
                "w has {} words, expected n = {n} rows of k = {k} values at bits = {} ({words})",
                packed.len(),
                params.bits
            ),
        ));
    }
    let scale_bytes = if half { 2 } else { 4 };
    for (what, got) in [("scales", scales.len()), ("biases", biases.len())] {
        if got != groups * scale_bytes {
            return Err(kernel_err(
                args,
                format!(
                    "{what} has {got} bytes, expected n = {n} x k = {k} / group_size = {group} \
                     values of {scale_bytes} bytes ({})",
                    groups * scale_bytes
                ),
            ));
        }
    }
    check_rows(args, x.len(), out.len(), rows, k, n)?;
    let w = WeightRows::Affine {
        packed,
        scales,
        biases,
        half,
        params,
        k,
    };
    matmul_rows(Isa::detect(), &w, x, rows, k, n, out);
    Ok(())
}

/// The expert-routed product on the host: `out[r, s, :] = W[ids[r, s]] x[r, :]`, with `w`
/// holding `experts` matrices of `n` rows of `row_bytes` (checked by the kernel, as are `x`,
/// `ids` and `out`). An expert id outside `0..experts` is an error naming it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_id_rows(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    ids: &[i32],
    x: &[f32],
    (rows, k, n, slots, experts): (usize, usize, usize, usize, usize),
    out: &mut [f32],
) -> std::result::Result<(), String> {
    if let Some((i, &e)) = ids
        .iter()
        .enumerate()
        .find(|(_, &e)| e < 0 || e as usize >= experts)
    {
        return Err(format!(
            "expert id {e} at ids[{}, {}] is outside 0..{experts}",
            i / slots.max(1),
            i % slots.max(1)
        ));
    }
    let expert_bytes = n * row_bytes;
    out[..rows * slots * n]
        .par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(pair, o)| {
            let (r, e) = (pair / slots, ids[pair] as usize);
            let wr = WeightRows::Plain {
                dtype,
                bytes: &w[e * expert_bytes..(e + 1) * expert_bytes],
                row_bytes,
            };
            matmul_rows(isa, &wr, &x[r * k..(r + 1) * k], 1, k, n, o);
        });
    Ok(())
}

fn matmul_id_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let (wbuf, _) = args.buffer(1)?;
    let w = args.input_bytes(1)?;
    let ids = args.input::<i32>(2)?;
    let out = args.output::<f32>(3)?;
    let dims = (
        args.usize(4)?,
        args.usize(5)?,
        args.usize(6)?,
        args.usize(7)?,
        args.usize(8)?,
    );
    let (rows, k, n, slots, experts) = dims;
    let dtype = wbuf.dtype();
    let row_bytes = expect_matrix(
        args,
        "w",
        dtype,
        w.len(),
        &[("experts", experts), ("n", n)],
        ("k", k),
    )?
    .row_bytes;
    expect_len(args, "x", x.len(), &[("rows", rows), ("k", k)])?;
    expect_len(args, "ids", ids.len(), &[("rows", rows), ("slots", slots)])?;
    expect_len(
        args,
        "out",
        out.len(),
        &[("rows", rows), ("slots", slots), ("n", n)],
    )?;
    matmul_id_rows(Isa::detect(), dtype, w, row_bytes, ids, x, dims, out)
        .map_err(|m| kernel_err(args, m))
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
mod tests;
