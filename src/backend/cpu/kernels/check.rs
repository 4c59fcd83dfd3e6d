//! The up-front argument checks of the CPU kernels.
//!
//! A dispatch that [`Dispatch::new`](crate::graph::Dispatch::new) accepts has the declared
//! argument count, access and dtypes, but its scalars (dims, head counts, positions) may say
//! anything. Every kernel therefore derives the sizes it will touch from its scalars here, once,
//! before any loop runs: products with checked arithmetic (an overflow is an error, never a
//! wrapped size that a short buffer happens to match), compared with the lengths of the slices it
//! was handed. The loops, and the `unsafe` SIMD code under them, rely on these checks; none of
//! them sits in a hot loop. Every error names the kernel (through [`Error::Kernel`]) and the
//! argument, with the values of the scalars involved (`name = value`).

use crate::backend::cpu::KernelArgs;
use crate::backend::DType;
use crate::error::{Error, Result};

/// A kernel error naming the running kernel.
pub(super) fn kernel_err(args: &KernelArgs<'_>, msg: String) -> Error {
    Error::Kernel {
        kernel: args.kernel().name(),
        msg,
    }
}

/// One named factor of a size: `("rows", 3)` reads `rows = 3`.
pub(super) type Factor<'a> = (&'a str, usize);

/// `a = 1 x b = 2` for the factors `[("a", 1), ("b", 2)]`.
fn describe(factors: &[Factor<'_>]) -> String {
    let parts: Vec<String> = factors.iter().map(|(n, v)| format!("{n} = {v}")).collect();
    parts.join(" x ")
}

/// The product of `factors`, which size `what`; an error naming them when it overflows `usize`.
pub(super) fn product(args: &KernelArgs<'_>, what: &str, factors: &[Factor<'_>]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &(_, v)| acc.checked_mul(v))
        .ok_or_else(|| {
            kernel_err(
                args,
                format!("the size of {what}, {}, overflows", describe(factors)),
            )
        })
}

/// An error unless argument `what` holds exactly the product of `factors` values (the product
/// overflowing is an error too).
pub(super) fn expect_len(
    args: &KernelArgs<'_>,
    what: &str,
    got: usize,
    factors: &[Factor<'_>],
) -> Result<()> {
    let want = product(args, what, factors)?;
    if got != want {
        return Err(kernel_err(
            args,
            format!(
                "{what} has {got} values, expected {} = {want}",
                describe(factors)
            ),
        ));
    }
    Ok(())
}

/// An error unless an argument holds `want` elements or bytes.
pub(super) fn check_len(args: &KernelArgs<'_>, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(kernel_err(
            args,
            format!("{what} has {got} elements or bytes, expected {want}"),
        ))
    }
}

/// The layout of a checked weight matrix.
#[derive(Debug, Clone, Copy)]
pub(super) struct MatrixSize {
    /// Rows (the product of the row factors).
    pub(super) n: usize,
    /// Bytes per row (`k` values of the dtype).
    pub(super) row_bytes: usize,
}

/// Checks that argument `what`, `got` bytes of `dtype`, holds exactly `rows` (a product of named
/// factors) rows of `k` values each: `k` a whole number of the dtype's blocks, no product
/// overflowing. On success every row `o < n` is the bytes `o * row_bytes..(o + 1) * row_bytes`
/// of the argument, and encodes exactly `k` values (what `dequantize_unchecked` and the fused
/// dot products require).
pub(super) fn expect_matrix(
    args: &KernelArgs<'_>,
    what: &str,
    dtype: DType,
    got: usize,
    rows: &[Factor<'_>],
    (k_name, k): Factor<'_>,
) -> Result<MatrixSize> {
    let row_bytes = dtype.bytes_for(k).ok_or_else(|| {
        kernel_err(
            args,
            format!(
                "{what}: {k_name} = {k} is not a whole number of {dtype} blocks of {} values",
                dtype.block_elems()
            ),
        )
    })?;
    let shape = || format!("{} rows of {k_name} = {k} {dtype} values", describe(rows));
    let n = product(args, what, rows)?;
    let want = n
        .checked_mul(row_bytes)
        .ok_or_else(|| kernel_err(args, format!("{what}: {} overflow", shape())))?;
    if got != want {
        return Err(kernel_err(
            args,
            format!(
                "{what} has {got} bytes, expected {} ({want} bytes)",
                shape()
            ),
        ));
    }
    Ok(MatrixSize { n, row_bytes })
}

/// Reads `pos0`, the first position of a pass, from element 0 of the i32 step buffer at
/// `index`; an error unless it is non-negative and `rows` rows from it fit in `positions`
/// (the cache's length): on success `pos0 + rows <= positions`, without overflow.
pub(super) fn read_pos0(
    args: &KernelArgs<'_>,
    index: usize,
    rows: usize,
    positions: usize,
) -> Result<usize> {
    let step = args.input::<i32>(index)?;
    let pos0 = *step
        .first()
        .ok_or_else(|| kernel_err(args, "the step buffer is empty".into()))?;
    usize::try_from(pos0)
        .ok()
        .filter(|&p| p.checked_add(rows).is_some_and(|end| end <= positions))
        .ok_or_else(|| {
            kernel_err(
                args,
                format!(
                    "pos0 = {pos0} (from step): {rows} rows from it do not fit in a cache of \
                     {positions} positions"
                ),
            )
        })
}
