//! The `embedding` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! `embedding(table, ids, out)` gathers rows of a `[vocab, dim]` table (f32, f16, bf16, Q8_0,
//! Q4_0, Q4_1, Q5_0, Q4_K or Q6_K, blocks along `dim`) by the i32 token ids in a device buffer and
//! writes them dequantized as f32 `[rows, dim]`. The ids are read when the dispatch runs, so a
//! recorded graph serves every step; an id outside `0..vocab` is a kernel error naming it.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, Grid};
use crate::kernels::misc::EMBEDDING;
use crate::ops::matmul::for_weight;
use crate::ops::Check;

/// Table dtypes [`embedding`] accepts.
pub const TABLE_DTYPES: [DType; 9] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q4K,
    DType::Q6K,
];

/// Gathers `table[ids[r], :]` into `out[r, :]` as f32. `ids` is i32 with `rows` elements (any
/// shape), `out` is f32 `[rows, dim]` (any shape with `rows * dim` elements and last dimension
/// `dim`).
pub fn embedding(table: &Buffer, ids: &Buffer, out: &Buffer) -> Result<Dispatch> {
    let c = Check::op("embedding");
    c.dtype("table", table, &TABLE_DTYPES)?;
    c.require("table", table.shape().rank() == 2, || {
        format!("must be [vocab, dim], got shape {:?}", table.dims())
    })?;
    let (vocab, dim) = (table.dims()[0], table.dims()[1]);
    c.require("table", vocab >= 1 && dim >= 1, || {
        format!("has an empty dimension {:?}", table.dims())
    })?;
    c.require(
        "table",
        u32::try_from(vocab).is_ok() && u32::try_from(dim).is_ok(),
        || format!("shape {:?} exceeds u32", table.dims()),
    )?;
    c.dtype("ids", ids, &[DType::I32])?;
    let rows = ids.elems();
    c.require("ids", rows >= 1, || "is empty".into())?;
    c.dtype("out", out, &[DType::F32])?;
    c.last_dim("out", out, dim)?;
    c.elems("out", out, rows * dim)?;
    let args = vec![
        Arg::read(table),
        Arg::read(ids),
        Arg::write(out),
        Arg::u32(vocab as u32),
        Arg::u32(dim as u32),
    ];
    // The kernel strides over the output elements along x (capped: it strides over the rest).
    let grid = Grid::cover(rows.saturating_mul(dim).min(1 << 28), 256);
    Dispatch::new(for_weight("embedding", &EMBEDDING, table)?, args, grid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;
    use crate::quant::{dequantize, quantize};
    use crate::session::{Executor, Mode, Plan};
    use crate::testutil::random_f32;

    /// Every table format: the gathered rows equal the dequantized table's rows exactly (the
    /// kernel runs the same dequantizer; tolerance 0).
    #[test]
    fn gathers_dequantized_rows_for_every_format() {
        let dev = Device::cpu(2).unwrap();
        let ids: Vec<i32> = vec![5, 0, 12, 5, 3, 12, 1];
        for dtype in TABLE_DTYPES {
            let (vocab, dim) = (13, if dtype.block_elems() == 256 { 512 } else { 576 });
            let tb = quantize(dtype, &random_f32(vocab * dim, 1.0, 40)).unwrap();
            let tf = dequantize(dtype, &tb).unwrap();
            let table = dev.upload_bytes(&tb, dtype, &[vocab, dim]).unwrap();
            let ib = dev.upload(&ids, &[ids.len()]).unwrap();
            let out = dev.alloc(DType::F32, &[ids.len(), dim]).unwrap();
            let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
            s.embedding(&table, &ib, &out).unwrap();
            s.finish(&Plan::OPTIMIZED).unwrap();
            let got: Vec<f32> = dev.download(&out).unwrap();
            for (r, &id) in ids.iter().enumerate() {
                let want = &tf[id as usize * dim..(id as usize + 1) * dim];
                assert_eq!(
                    &got[r * dim..(r + 1) * dim],
                    want,
                    "{dtype} row {r} id {id}"
                );
            }
        }
    }

    #[test]
    fn out_of_range_id_is_a_kernel_error_naming_it() {
        let dev = Device::cpu(1).unwrap();
        let table = dev.upload(&random_f32(4 * 32, 1.0, 1), &[4, 32]).unwrap();
        for bad in [4i32, -1] {
            let ib = dev.upload(&[1i32, bad], &[2]).unwrap();
            let out = dev.alloc(DType::F32, &[2, 32]).unwrap();
            let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
            s.embedding(&table, &ib, &out).unwrap();
            let e = s.finish(&Plan::SEQUENTIAL).unwrap_err().to_string();
            assert!(e.contains(&format!("token id {bad}")), "{e}");
        }
    }

    #[test]
    fn wrong_arguments_name_op_and_argument() {
        let dev = Device::cpu(1).unwrap();
        let table = dev.alloc(DType::Q8_0, &[4, 64]).unwrap();
        let ids = dev.alloc(DType::I32, &[3]).unwrap();
        let out = dev.alloc(DType::F32, &[3, 64]).unwrap();
        assert!(embedding(&table, &ids, &out).is_ok());
        let cases = [
            (
                embedding(&dev.alloc(DType::U8, &[4, 64]).unwrap(), &ids, &out),
                "`table`",
            ),
            (
                embedding(&table, &dev.alloc(DType::U32, &[3]).unwrap(), &out),
                "`ids`",
            ),
            (
                embedding(&table, &ids, &dev.alloc(DType::F32, &[3, 32]).unwrap()),
                "`out`",
            ),
            (
                embedding(&table, &ids, &dev.alloc(DType::F32, &[2, 64]).unwrap()),
                "`out`",
            ),
            (
                embedding(&table, &ids, &dev.alloc(DType::F16, &[3, 64]).unwrap()),
                "`out`",
            ),
        ];
        for (i, (r, arg)) in cases.into_iter().enumerate() {
            let e = r
                .err()
                .unwrap_or_else(|| panic!("case {i} should fail"))
                .to_string();
            assert!(
                e.starts_with("embedding") && e.contains(arg),
                "case {i}: {e}"
            );
        }
    }
}
