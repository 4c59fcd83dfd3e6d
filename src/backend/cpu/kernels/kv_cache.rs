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

use super::copy::Float;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::{Error, Result};
use crate::kernels::misc::KV_WRITE;

fn kv_write<C: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let bad = |msg: String| Error::Kernel {
        kernel: args.kernel().name(),
        msg,
    };
    let new = args.input::<f32>(0)?;
    let step = args.input::<i32>(1)?;
    let cache = args.output::<C>(2)?;
    let (n_kv_head, head_dim) = (args.usize(3)?, args.usize(4)?);
    let row_len = n_kv_head * head_dim;
    if row_len == 0 || new.len() % row_len != 0 || cache.len() % row_len != 0 {
        return Err(bad(format!(
            "new ({}) and cache ({}) are not whole rows of {n_kv_head} x {head_dim}",
            new.len(),
            cache.len()
        )));
    }
    let rows = new.len() / row_len;
    let max_ctx = cache.len() / row_len;
    let pos0 = *step
        .first()
        .ok_or_else(|| bad("the step buffer is empty".into()))?;
    let start = usize::try_from(pos0)
        .ok()
        .filter(|&p| p.checked_add(rows).is_some_and(|end| end <= max_ctx));
    let Some(start) = start else {
        return Err(bad(format!(
            "rows {pos0}..{} do not fit in a cache of {max_ctx} positions",
            pos0 as i64 + rows as i64
        )));
    };
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
