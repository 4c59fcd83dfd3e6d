//! CPU kernels of the `embedding` op family: gather rows of a (possibly quantized) table by token
//! id and dequantize them to f32.
//!
//! Argument layout (`ops::embedding` builds it): `embedding_<t>`: table `[vocab, dim]`, ids i32
//! `[rows]`, out f32 `[rows, dim]`, vocab: u32, dim: u32. Every id is checked against `vocab`
//! before any row is read; an id out of range is a kernel error naming it.

use rayon::prelude::*;

use super::check::{expect_len, expect_matrix, kernel_err};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::misc::EMBEDDING;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    registry.family(&EMBEDDING, [embedding_kernel; 9]);
}

fn embedding_kernel(args: &KernelArgs<'_>) -> Result<()> {
    let (tbuf, _) = args.buffer(0)?;
    let table = args.input_bytes(0)?;
    let ids = args.input::<i32>(1)?;
    let out = args.output::<f32>(2)?;
    let (vocab, dim) = (args.usize(3)?, args.usize(4)?);
    let dtype = tbuf.dtype();
    // Row `id < vocab` of the table is `table[id * row_bytes..(id + 1) * row_bytes]` and encodes
    // exactly `dim` values, as `dequantize_unchecked` below requires.
    let row_bytes = expect_matrix(
        args,
        "table",
        dtype,
        table.len(),
        &[("vocab", vocab)],
        ("dim", dim),
    )?
    .row_bytes;
    expect_len(args, "out", out.len(), &[("ids", ids.len()), ("dim", dim)])?;
    if let Some((i, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id as usize >= vocab)
    {
        return Err(kernel_err(
            args,
            format!("token id {id} at ids[{i}] is outside the vocabulary 0..{vocab}"),
        ));
    }
    if dim == 0 {
        return Ok(());
    }
    out.par_chunks_mut(dim)
        .zip(ids.par_iter())
        .for_each(|(row, &id)| {
            // `0 <= id < vocab` (checked above) and `row` holds `dim` values.
            let id = id as usize;
            crate::quant::dequantize_unchecked(
                dtype,
                &table[id * row_bytes..(id + 1) * row_bytes],
                row,
            );
        });
    Ok(())
}
