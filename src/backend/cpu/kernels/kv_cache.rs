//! CPU kernels of the `kv_cache` op family: writing new K or V rows into a per-layer cache.
//!
//! Layout: `new` is f32 `[rows, n_kv_head * head_dim]`; the cache is
//! `[n_kv_head, max_ctx, head_dim]` (f32, f16 or bf16); element 0 of the i32 `step` buffer is
//! `pos0`, the absolute position of the first new row. Row `r`, head `h` goes to
//! `cache[h, pos0 + r, :]`. A `pos0` outside `0..=max_ctx - rows` is a kernel error and writes
//! nothing.
//!
//! Argument layout: `kv_write_f32_<cache>`: new, step, cache (written), n_kv_head: u32,
//! head_dim: u32.

use half::{bf16, f16};
use rayon::prelude::*;

use super::check::{kernel_err, product, read_pos0};
use super::copy::Float;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::KV_WRITE;

fn kv_write<C: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let new = args.input::<f32>(0)?;
    let cache = args.output::<C>(2)?;
    let (n_kv_head, head_dim) = (args.usize(3)?, args.usize(4)?);
    let heads = [("n_kv_head", n_kv_head), ("head_dim", head_dim)];
    let row_len = product(args, "a row of new", &heads)?;
    if row_len == 0 || new.len() % row_len != 0 || cache.len() % row_len != 0 {
        return Err(kernel_err(
            args,
            format!(
                "new ({} values) and cache ({} values) are not whole rows of n_kv_head = \
                 {n_kv_head} x head_dim = {head_dim}",
                new.len(),
                cache.len()
            ),
        ));
    }
    let rows = new.len() / row_len;
    let max_ctx = cache.len() / row_len;
    // `start + rows <= max_ctx`: every row written below lies inside its head's slab.
    let start = read_pos0(args, 1, rows, max_ctx)?;
    if rows == 0 {
        // Nothing to write (and `max_ctx` may be 0: no slab to cut the cache into).
        return Ok(());
    }
    cache
        .par_chunks_mut(max_ctx * head_dim)
        .enumerate()
        .for_each(|(h, head)| {
            let dst = &mut head[start * head_dim..(start + rows) * head_dim];
            for (r, d) in dst.chunks_exact_mut(head_dim).enumerate() {
                let src = &new[r * row_len + h * head_dim..r * row_len + (h + 1) * head_dim];
                for (o, &v) in d.iter_mut().zip(src) {
                    *o = C::from_f32(v);
                }
            }
        });
    Ok(())
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(
        &KV_WRITE,
        [kv_write::<f32>, kv_write::<f16>, kv_write::<bf16>],
    );
}
