//! CPU kernels of the row-invariant products (`matmul_rows_<w>`): `y[r, o] = x[r] . W[o]` with
//! every row computed by the one-row (vector) form of `matmul_<w>`, whatever the row count.
//!
//! The plain product takes its matrix form from two rows on, whose sums run in another order than
//! the vector form's; a batched decode step must give each row the bits it would get alone (and
//! the bits of the single-sequence decode step), so it records this kernel instead. Each output
//! of each row is the vector form's dot product (the integer VNNI path where the one-row product
//! takes it, with the row quantized as it quantizes it), and each such dot depends only on its
//! row and its weight row. The weights are read once for all rows: tasks take chunks of output
//! rows and compute every activation row against a chunk while it is in cache.
//!
//! Argument layout: `matmul_rows_<w>`: x, w, out, rows: u32, k: u32, n: u32.

use rayon::prelude::*;

use super::check::{expect_len, expect_matrix};
use super::matmul::{matmul_rows, WeightRows};
use super::matmul_simd::Isa;
use super::matvec_vnni::{self, Layout, QuantRow};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::backend::DType;
use crate::error::Result;
use crate::kernels::batch::MATMUL_ROWS;
use crate::quant::QK_K;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&MATMUL_ROWS, [matmul_rows_kernel; 9]);
}

fn matmul_rows_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let x = args.input::<f32>(0)?;
    let (wbuf, _) = args.buffer(1)?;
    let w = args.input_bytes(1)?;
    let out = args.output::<f32>(2)?;
    let (rows, k, n) = (args.usize(3)?, args.usize(4)?, args.usize(5)?);
    let dtype = wbuf.dtype();
    let row_bytes = expect_matrix(args, "w", dtype, w.len(), &[("n", n)], ("k", k))?.row_bytes;
    expect_len(args, "x", x.len(), &[("rows", rows), ("k", k)])?;
    expect_len(args, "out", out.len(), &[("rows", rows), ("n", n)])?;
    if k == 0 || n == 0 {
        // Empty sums (or no outputs): what the one-row product writes.
        out.fill(0.0);
        return Ok(());
    }
    let weights = WeightRows::Plain {
        dtype,
        bytes: w,
        row_bytes,
    };
    let isa = Isa::detect();
    if rows <= 1 {
        // The one-row product itself.
        matmul_rows(isa, &weights, x, rows, k, n, out);
        return Ok(());
    }
    if !grouped(isa, &weights, x, rows, k, n, out) {
        // The integer path declined (it never does once its conditions hold): the vector form
        // row by row, exactly as the one-row product falls back.
        for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
            matmul_rows(isa, &weights, xr, 1, k, n, or);
        }
    }
    Ok(())
}

/// Outputs per task of the grouped product: enough that a task's weights outweigh its overhead,
/// few enough that every thread gets work.
fn chunk_len(n: usize, k: usize) -> usize {
    let per_thread = n.div_ceil(2 * rayon::current_num_threads()).max(1);
    per_thread.min((64 * 1024 / k.max(1)).max(8))
}

/// A row function of the integer path: `out[o] = dot(W[o], x)` for the rows of `w`.
type IntegerRows = fn(&[u8], &QuantRow, &mut [f32]) -> bool;

/// The integer path's row function and layout where the one-row product takes that path (the
/// conditions of `matmul::matvec_integer`: AVX-512 with VNNI, Q4_1 or Q8_0 weights, `k` whole
/// blocks of 32).
fn integer_path(isa: Isa, w: &WeightRows<'_>, k: usize) -> Option<(Layout, IntegerRows)> {
    let WeightRows::Plain { dtype, .. } = *w else {
        return None;
    };
    if isa != Isa::Avx512 || !matvec_vnni::available() || !k.is_multiple_of(matvec_vnni::QK) {
        return None;
    }
    match dtype {
        DType::Q4_1 => Some((Layout::Q4, matvec_vnni::rows_q4_1)),
        DType::Q8_0 => Some((Layout::Q8, matvec_vnni::rows_q8_0)),
        _ => None,
    }
}

/// `out[r, o] = dot(x[r], W[o])` with every dot the one-row product's, tasks over chunks of
/// output rows, each computing all `rows` activation rows against its chunk. Returns `false`
/// (having written nothing reliable) when the integer path declines a chunk.
fn grouped(
    isa: Isa,
    w: &WeightRows<'_>,
    x: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) -> bool {
    let chunk = chunk_len(n, k);
    let integer = integer_path(isa, w, k);
    let quantized: Vec<QuantRow> = match integer {
        Some((layout, _)) => x
            .chunks_exact(k)
            .map(|xr| {
                let mut q = QuantRow::default();
                q.quantize(xr, layout);
                q
            })
            .collect(),
        None => Vec::new(),
    };
    let parts: Vec<Option<Vec<f32>>> = (0..n.div_ceil(chunk))
        .into_par_iter()
        .map(|c| {
            let (o0, o1) = (c * chunk, ((c + 1) * chunk).min(n));
            let width = o1 - o0;
            let mut part = vec![0f32; rows * width];
            match (integer, w) {
                (
                    Some((_, rows_fn)),
                    WeightRows::Plain {
                        bytes, row_bytes, ..
                    },
                ) => {
                    let wb = bytes.get(o0 * row_bytes..o1 * row_bytes)?;
                    for (q, dst) in quantized.iter().zip(part.chunks_exact_mut(width)) {
                        if !rows_fn(wb, q, dst) {
                            return None;
                        }
                    }
                }
                _ => {
                    let mut scratch = vec![0f32; k.max(QK_K)];
                    for (xr, dst) in x.chunks_exact(k).zip(part.chunks_exact_mut(width)) {
                        for (j, o) in dst.iter_mut().enumerate() {
                            *o = w.dot(isa, o0 + j, xr, &mut scratch);
                        }
                    }
                }
            }
            Some(part)
        })
        .collect();
    for (c, part) in parts.into_iter().enumerate() {
        let Some(part) = part else {
            return false;
        };
        let (o0, width) = (c * chunk, (n - c * chunk).min(chunk));
        for (r, src) in part.chunks_exact(width).enumerate() {
            out[r * n + o0..r * n + o0 + width].copy_from_slice(src);
        }
    }
    true
}
