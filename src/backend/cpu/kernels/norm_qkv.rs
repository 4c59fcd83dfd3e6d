//! CPU kernels of the attention input's norm and three products without the RoPE
//! (`ops::norm_qkv`): `norm_qkv_<w>` (and `_shared`, and `norm_qkv_<w>_v_<v>` with wv of format
//! `<v>`): x, norm, wq, wk, wv, q, k, v (written, f32 `[rows, n_q]`, `[rows, n_kv]`,
//! `[rows, n_kv]`), then eps: f32, dim, n_q, n_kv: u32.
//!
//! The norm and the products are `norm_qkv_rope`'s (`fused_block.rs`): the `rms_norm` kernel's
//! arithmetic, then the CPU matmul's own loops over the three matrices in one parallel loop, so
//! each output equals the separate ops' bit for bit.

use super::check::{check_len, kernel_err};
use super::fused_block::{matrix, qkv_products, with_kernel_scratch, x_and_norm};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::matmul as mm;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&mm::NORM_QKV, [norm_qkv_kernel; 9]);
    // The one-row shared-memory forms are CUDA launch forms of the same function.
    registry.family(&mm::NORM_QKV_SHARED, [norm_qkv_kernel; 9]);
    registry.family(&mm::NORM_QKV_MIXED, [norm_qkv_kernel; 4]);
}

fn norm_qkv_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let (eps, dim) = (args.f32(8)?, args.usize(9)?);
    let (n_q, n_kv) = (args.usize(10)?, args.usize(11)?);
    let (x, norm, rows) = x_and_norm(args, dim)?;
    if n_q == 0 || n_kv == 0 {
        return Err(kernel_err(
            args,
            format!("n_q = {n_q}, n_kv = {n_kv}: each product needs an output"),
        ));
    }
    // v may take another format than q and k (the kernel's declaration names which).
    let (dtype, dtype_v) = (args.buffer(2)?.0.dtype(), args.buffer(4)?.0.dtype());
    let stack = [
        matrix(args, 2, "wq", dtype, &[("n_q", n_q)], ("dim", dim))?,
        matrix(args, 3, "wk", dtype, &[("n_kv", n_kv)], ("dim", dim))?,
        matrix(args, 4, "wv", dtype_v, &[("n_kv", n_kv)], ("dim", dim))?,
    ];
    for (index, name, n) in [(5, "q", n_q), (6, "k", n_kv), (7, "v", n_kv)] {
        check_len(args, name, args.buffer(index)?.0.elems(), rows * n)?;
    }
    let n_total = n_q + 2 * n_kv;
    with_kernel_scratch(|s| {
        let all = qkv_products(s, (x, norm, eps), dim, rows, &stack);
        // Each row's q, k and v columns to their outputs.
        let mut col = 0;
        for (index, n) in [(5, n_q), (6, n_kv), (7, n_kv)] {
            let out = args.output::<f32>(index)?;
            for (r, o) in out.chunks_exact_mut(n).enumerate() {
                let at = r * n_total + col;
                o.copy_from_slice(&all[at..at + n]);
            }
            col += n;
        }
        Ok(())
    })
}
