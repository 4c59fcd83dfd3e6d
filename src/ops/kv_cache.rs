//! The `kv_cache` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! [`kv_write`] copies new K (or V) rows into a layer's cache at the position held in a device
//! buffer, so a recorded decode graph serves every step. The cache is declared written as a whole:
//! the kernel writes only rows `pos0..pos0 + rows` of each head, which the declared range covers
//! (conservative and correct for barriers and reordering).

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid};
use crate::kernels::misc::KV_WRITE;
use crate::ops::elementwise::float_kernel;
use crate::ops::elementwise::{check_disjoint, u32_size};
use crate::ops::Check;

/// Writes `new` (f32 `[rows, n_kv_head * head_dim]` or `[rows, n_kv_head, head_dim]`) into
/// `cache` (`[n_kv_head, max_ctx, head_dim]`, f32, f16 or bf16): row `r`, head `h` goes to
/// `cache[h, pos0 + r, :]`, where `pos0` is element 0 of the i32 buffer `step`. A `pos0` that
/// leaves no room for the rows is an error when the dispatch runs; nothing is written then.
pub fn kv_write(new: &Buffer, cache: &Buffer, step: &Buffer) -> Result<Dispatch> {
    let check = Check::op("kv_write");
    check.dtype("new", new, &[DType::F32])?;
    check.dtype("cache", cache, &[DType::F32, DType::F16, DType::BF16])?;
    check.dtype("step", step, &[DType::I32])?;
    check.require("step", step.elems() >= 1, || {
        "is empty; element 0 must hold pos0".into()
    })?;
    check.require(
        "cache",
        cache.shape().rank() == 3 && cache.elems() > 0,
        || {
            format!(
                "has shape {:?}, expected [n_kv_head, max_ctx, head_dim]",
                cache.dims()
            )
        },
    )?;
    let (n_kv_head, max_ctx, head_dim) = (cache.dims()[0], cache.dims()[1], cache.dims()[2]);
    let row_len = n_kv_head * head_dim;
    let shape_ok = match new.dims() {
        [rows, n] => *rows > 0 && *n == row_len,
        [rows, h, d] => *rows > 0 && *h == n_kv_head && *d == head_dim,
        _ => false,
    };
    check.require("new", shape_ok, || {
        format!(
            "has shape {:?}, expected [rows, {n_kv_head} * {head_dim}]",
            new.dims()
        )
    })?;
    let rows = new.dims()[0];
    check.require("new", rows <= max_ctx, || {
        format!("has {rows} rows, the cache holds {max_ctx}")
    })?;
    check_disjoint(&check, "cache", cache, &[("new", new), ("step", step)])?;
    let kernel = float_kernel("kv_write", cache.dtype(), &KV_WRITE)?;
    let args = vec![
        Arg::read(new),
        Arg::read(step),
        Arg::write(cache),
        Arg::u32(u32_size(&check, "cache", n_kv_head)?),
        Arg::u32(u32_size(&check, "cache", head_dim)?),
    ];
    // The kernel strides over the new elements along x (capped: it strides over the rest).
    let elems = rows.saturating_mul(n_kv_head).saturating_mul(head_dim);
    let grid = Grid::cover(elems.min(1 << 28), 256);
    Dispatch::new(kernel, args, grid)
}

#[cfg(test)]
mod tests {
    use crate::backend::{DType, Device};
    use crate::error::Error;
    use crate::ops::copy::float_io::*;
    use crate::testutil::{assert_close, random_f32};
    use crate::{Executor, Mode, Plan};

    /// The cache after writing `new` at `pos0` over `before`, computed directly.
    fn reference(
        before: &[f32],
        new: &[f32],
        pos0: usize,
        heads: usize,
        max_ctx: usize,
        hd: usize,
    ) -> Vec<f32> {
        let mut cache = before.to_vec();
        for (r, row) in new.chunks(heads * hd).enumerate() {
            for h in 0..heads {
                let dst = (h * max_ctx + pos0 + r) * hd;
                cache[dst..dst + hd].copy_from_slice(&row[h * hd..(h + 1) * hd]);
            }
        }
        cache
    }

    #[test]
    fn kv_write_places_rows_at_pos0_for_every_cache_dtype() {
        let dev = Device::cpu(2).unwrap();
        // (heads, max_ctx, head_dim, rows, pos0)
        let cases = [
            (3, 40, 64, 1, 0),
            (3, 40, 64, 1, 39),
            (3, 40, 64, 17, 5),
            (2, 9, 5, 9, 0),
            (1, 33, 7, 3, 30),
        ];
        for dt in FLOATS {
            for (case, &(heads, max_ctx, hd, rows, pos0)) in cases.iter().enumerate() {
                let seed = 60 + case as u64;
                let before = rounded(dt, &random_f32(heads * max_ctx * hd, 1.0, seed));
                let cache = upload(&dev, dt, &before, &[heads, max_ctx, hd]);
                let newv = random_f32(rows * heads * hd, 3.0, seed + 1);
                let new = dev.upload(&newv, &[rows, heads * hd]).unwrap();
                let step = dev.upload(&[pos0 as i32, 12345], &[2]).unwrap();
                run_direct(&dev, |s| s.kv_write(&new, &cache, &step));
                // Exact: the cache holds each new value rounded once to its dtype.
                let want = rounded(dt, &reference(&before, &newv, pos0, heads, max_ctx, hd));
                let what = format!("kv_write {dt} case {case}");
                assert_close(&download(&dev, &cache), &want, 0.0, 0.0, &what);
            }
        }
    }

    #[test]
    fn recorded_kv_write_follows_the_step_buffer_and_rejects_overflow() {
        let dev = Device::cpu(2).unwrap();
        let (heads, max_ctx, hd) = (2, 4, 8);
        let cache = dev.alloc(DType::F32, &[heads, max_ctx, hd]).unwrap();
        let step = dev.upload(&[0i32], &[1]).unwrap();
        let new = dev.alloc(DType::F32, &[1, heads * hd]).unwrap();
        let executor = Executor::new(dev.clone());
        let mut s = executor.begin(Mode::Recorded);
        s.kv_write(&new, &cache, &step).unwrap();
        let mut graph = s.into_graph().unwrap();
        Executor::optimize(&mut graph, &Plan::SEQUENTIAL, dev.capabilities());
        let mut want = vec![0f32; heads * max_ctx * hd];
        for pos in 0..max_ctx {
            let row = random_f32(heads * hd, 1.0, 90 + pos as u64);
            dev.write(&new, &row).unwrap();
            dev.write(&step, &[pos as i32]).unwrap();
            executor.run(&graph, false).unwrap();
            want = reference(&want, &row, pos, heads, max_ctx, hd);
            assert_close(
                &dev.download::<f32>(&cache).unwrap(),
                &want,
                0.0,
                0.0,
                &format!("step {pos}"),
            );
        }
        for bad in [max_ctx as i32, -1, i32::MAX] {
            dev.write(&step, &[bad]).unwrap();
            match executor.run(&graph, false) {
                Err(Error::Kernel {
                    kernel: "kv_write_f32_f32",
                    ..
                }) => {}
                other => panic!("pos0 {bad}: expected a kernel error, got {other:?}"),
            }
            assert_close(
                &dev.download::<f32>(&cache).unwrap(),
                &want,
                0.0,
                0.0,
                "cache after a refused write",
            );
        }
    }

    #[test]
    fn kv_write_rejects_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let cache = dev.alloc(DType::F16, &[3, 16, 64]).unwrap();
        let new = dev.alloc(DType::F32, &[2, 192]).unwrap();
        let step = dev.alloc(DType::I32, &[1]).unwrap();
        let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
            Err(Error::DType {
                op: "kv_write",
                arg: a,
                ..
            })
            | Err(Error::Shape {
                op: "kv_write",
                arg: a,
                ..
            }) if a == arg => {}
            other => panic!("expected an error naming kv_write and `{arg}`, got {other:?}"),
        };
        expect(
            super::kv_write(&dev.alloc(DType::F16, &[2, 192]).unwrap(), &cache, &step),
            "new",
        );
        expect(
            super::kv_write(&dev.alloc(DType::F32, &[2, 191]).unwrap(), &cache, &step),
            "new",
        );
        expect(
            super::kv_write(&dev.alloc(DType::F32, &[17, 192]).unwrap(), &cache, &step),
            "new",
        );
        expect(
            super::kv_write(&new, &dev.alloc(DType::F16, &[3 * 16, 64]).unwrap(), &step),
            "cache",
        );
        expect(
            super::kv_write(&new, &dev.alloc(DType::I32, &[3, 16, 64]).unwrap(), &step),
            "cache",
        );
        expect(
            super::kv_write(&new, &cache, &dev.alloc(DType::U32, &[1]).unwrap()),
            "step",
        );
    }
}
