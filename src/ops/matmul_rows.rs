//! The row-invariant product (the `matmul_rows` family): `out[r, o] = x[r] . W[o]` where each
//! row's sums run in the same order whatever the number of rows, so a row of a batched decode
//! step gets the same bits alone as beside 31 others.
//!
//! The plain [`matmul`](crate::ops::matmul::matmul) picks its form by the row count when it is
//! recorded: on CUDA a one-row vector form, a warp form that takes `MM_ROWS` (8) rows a group for 2
//! to 15 rows and a tiled form from 16 rows; on the CPU a vector form for one row and a packed
//! matrix form for more. Those forms reduce in different orders, so the same row would get other
//! bits in another bucket. This op always takes one form: on CUDA (sm_90) a tensor-core form
//! that reads each weight once for up to 32 rows, every row's sums one fixed chain of f32
//! additions of f16 products whatever the rows beside it (`matmul_rows.cu` says how; before sm_90
//! the warp form, each row summed in its lanes' order); on the CPU the one-row vector form for
//! each row (the bits of the single-sequence decode step). It is never fused: the fusion rules
//! match the plain family only.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid};
use crate::kernels::batch::MATMUL_ROWS;
use crate::ops::elementwise::u32_size;
use crate::ops::matmul::{check_rows, for_weight, WEIGHT_DTYPES};
use crate::ops::Check;

/// Threads of a block of the CUDA kernels (`MR_THREADS`: eight warps of 8 outputs each).
const ROWS_THREADS: usize = 256;
/// Outputs of a tile (`MR_TILE`).
const ROWS_TILE: usize = 64;
/// Blocks (ranges of k) per tile (`MR_PARTS`): the clusters that split k on sm_90.
const ROWS_PARTS: usize = 8;

/// `out[rows, n] = x[rows, k] · W[n, k]ᵀ`, each row computed as it would be alone; `w` of any of
/// [`WEIGHT_DTYPES`], `x` and `out` f32.
pub fn matmul_rows(x: &Buffer, w: &Buffer, out: &Buffer) -> Result<Dispatch> {
    let c = Check::op("matmul_rows");
    c.dtype("w", w, &WEIGHT_DTYPES)?;
    c.require("w", w.shape().rank() == 2, || {
        format!("must be [n, k], got shape {:?}", w.dims())
    })?;
    let (n, k) = (w.dims()[0], w.dims()[1]);
    c.require("w", n >= 1 && k >= 1, || {
        format!("has an empty dimension (shape {:?})", w.dims())
    })?;
    c.dtype("x", x, &[DType::F32])?;
    let rows = check_rows(&c, x, out, k, n)?;
    let args = vec![
        Arg::read(x),
        Arg::read(w),
        Arg::write(out),
        Arg::u32(u32_size(&c, "x", rows)?),
        Arg::u32(u32_size(&c, "w", k)?),
        Arg::u32(u32_size(&c, "w", n)?),
    ];
    // A cluster of ROWS_PARTS blocks per tile of ROWS_TILE outputs and group of 32 rows (the
    // warp form, before sm_90, loops over its warps with any grid); each block stages 32 rows of
    // its range of k in f16.
    let tiles = n
        .div_ceil(ROWS_TILE)
        .saturating_mul(rows.div_ceil(32))
        .clamp(1, 1 << 26);
    let per = k.div_ceil(32).div_ceil(ROWS_PARTS);
    let shared = u32_size(&c, "w", 32 * (32 * per + 8) * 2)?;
    let grid = Grid::new((tiles * ROWS_PARTS) as u32, ROWS_THREADS as u32).with_shared(shared);
    Dispatch::new(for_weight("matmul_rows", &MATMUL_ROWS, w)?, args, grid)
}

#[cfg(test)]
#[path = "matmul_rows_tests.rs"]
mod tests;
