//! CPU kernels of the row-invariant products (`matmul_rows_<w>`): `y[r, o] = x[r] . W[o]` with
//! every row computed by the one-row (vector) form of `matmul_<w>`, whatever the row count.
//!
//! The plain product takes its matrix form from two rows on, whose sums run in another order than
//! the vector form's; a batched decode step must give each row the bits it would get alone (and
//! the bits of the single-sequence decode step), so it records this kernel instead. Each row is
//! its own vector product, the integer VNNI path included where the one-row product takes it.
//!
//! Argument layout: `matmul_rows_<w>`: x, w, out, rows: u32, k: u32, n: u32.

use super::check::{expect_len, expect_matrix};
use super::matmul::{matmul_rows, WeightRows};
use super::matmul_simd::Isa;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::batch::MATMUL_ROWS;

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
    // One vector product per row: the same call, with the same arguments, as a one-row
    // `matmul_<w>` dispatch makes, so the row gets that dispatch's bits.
    for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
        matmul_rows(isa, &weights, xr, 1, k, n, or);
    }
    Ok(())
}
