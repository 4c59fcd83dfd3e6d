//! CPU kernels of the matmul + residual add fusion (`ops::matmul_fused`): `acc[r, o] += x[r] .
//! w[o]` with the CPU matmul's own product loops (the fused block kernels' helpers in
//! `fused_block.rs`) and the in-place add's `acc + product`, so each value equals the separate
//! ops' bit for bit.
//!
//! Argument layouts (the builders in `ops::matmul_fused` make them):
//! - `matmul_add_<w>`, `matmul_add_mma_<w>`: x, w, acc (read-write), then rows, k, n: u32
//! - `matmul_add_mma_h_<w>`: the same with x in f16

use rayon::prelude::*;

use super::check::{expect_len, kernel_err};
use super::fused_block::{
    dot_rows, matrix, one_row_tasks, quantize_for, sized, tile_products, with_kernel_scratch,
    Matrix, SharedOut,
};
use super::matmul_simd::Isa;
use super::matvec_vnni::QuantRow;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::matmul as mm;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&mm::MATMUL_ADD, [matmul_add_kernel; 9]);
    registry.family(&mm::MATMUL_ADD_MMA, [matmul_add_kernel; 9]);
    registry.family(&mm::MATMUL_ADD_MMA_H, [matmul_add_h_kernel; 9]);
}

/// `acc[r, o] += x[r] . W[o]`: the matmul's product, then the in-place add's `acc + product`.
fn matmul_add_kernel(args: &KernelArgs<'_>) -> Result<()> {
    matmul_add_on(args, args.input::<f32>(0)?)
}

/// `matmul_add_mma_h_<w>`: x in f16, widened to f32 (exactly), then `matmul_add_kernel`'s
/// product and add.
fn matmul_add_h_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let x: Vec<f32> = args
        .input::<half::f16>(0)?
        .iter()
        .map(|v| v.to_f32())
        .collect();
    matmul_add_on(args, &x)
}

/// The product of `x` (argument 0's values) with argument 1's rows, added into argument 2.
fn matmul_add_on(args: &KernelArgs<'_>, x: &[f32]) -> Result<()> {
    let (rows, k, n) = (args.usize(3)?, args.usize(4)?, args.usize(5)?);
    let dtype = args.buffer(1)?.0.dtype();
    let w = matrix(args, 1, "w", dtype, &[("n", n)], ("k", k))?;
    let acc = args.output::<f32>(2)?;
    expect_len(args, "x", x.len(), &[("rows", rows), ("k", k)])?;
    expect_len(args, "acc", acc.len(), &[("rows", rows), ("n", n)])?;
    if k == 0 || n == 0 {
        return Err(kernel_err(
            args,
            format!("k = {k} and n = {n} must be at least 1"),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let isa = Isa::detect();
    if rows == 1 {
        with_kernel_scratch(|s| {
            let products = sized(&mut s.products, n);
            let quant = quantize_for(isa, &w, x, &mut s.quant);
            add_one_row(isa, &w, x, quant, products, acc);
        });
        return Ok(());
    }
    let shared = SharedOut::new(acc);
    tile_products(isa, &[[w]], x, rows, |_, r, o0, [v]| {
        // SAFETY: `part` asserts the bounds (`acc` holds `rows * n`, checked up front);
        // exclusive because only the task of tile `o0` reads and writes these columns of `acc`.
        add_into(unsafe { shared.part(r * n + o0, v.len()) }, v);
    });
    Ok(())
}

/// `acc[i] = acc[i] + p[i]`, as the in-place add kernel computes it.
#[inline]
fn add_into(acc: &mut [f32], p: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(p) {
        *a += v;
    }
}

/// The one-row product and the residual add in one parallel loop over pieces of `acc`.
fn add_one_row(
    isa: Isa,
    w: &Matrix<'_>,
    x: &[f32],
    quant: Option<&QuantRow>,
    products: &mut [f32],
    acc: &mut [f32],
) {
    let run = |first: usize, a: &mut [f32], p: &mut [f32]| {
        dot_rows(isa, w, x, quant, first, p);
        add_into(a, p);
    };
    let tasks = one_row_tasks(w.n * w.k);
    if tasks == 1 {
        run(0, acc, products);
        return;
    }
    let chunk = w.n.div_ceil(tasks);
    acc.par_chunks_mut(chunk)
        .zip(products.par_chunks_mut(chunk))
        .enumerate()
        .for_each(|(c, (a, p))| run(c * chunk, a, p));
}
