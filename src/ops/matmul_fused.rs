//! The fusion of a matmul with the residual add after it: [`MATMUL_ADD_FUSION`] turns a matmul
//! whose output the next dispatch, an in-place f32 `add`, adds into an accumulator (the residual
//! stream) into one `matmul_add_<w>` that adds each product into the accumulator:
//! `acc[r, o] += x[r] . W[o]`. In a decode step this removes two dependent dispatches of every
//! layer (two launches on a GPU, two fork/joins of the pool on the CPU).
//!
//! The fused kernels do the pair's float operations in the pair's order (the product, then
//! `acc + product`), so a fused graph gives the unfused graph's bits on every backend. The fuse
//! pass applies the rule only where it proves the matmul's output dead afterwards, and only where
//! the accumulator lives on the matmul's device.
//! (A SwiGLU + matmul fusion was measured and dropped: every warp recomputing `silu(gate) * up`
//! over the whole row made the fused kernel slower than the pair on an H200.)

use super::fused_block::one_device;
use crate::backend::Buffer;
use crate::error::{Error, Result};
use crate::graph::passes::FusionRule;
use crate::graph::{ArgRef, DispatchRef, DispatchSpec, KernelId, OpKind, Range, Scalar};
use crate::kernels::{elementwise as ew, matmul as mm};

/// The read operand of an in-place f32 add, and its accumulator.
fn residual_add(add: DispatchRef<'_>) -> Option<(&Buffer, &Buffer)> {
    if add.kernel() != KernelId::of(&ew::ADD_INPLACE[0]) {
        return None;
    }
    Some((add.buffer("a")?, add.buffer("b")?))
}

/// A plain matmul: its activations, weight, output, sizes and format index.
struct Product<'a> {
    x: &'a Buffer,
    w: &'a Buffer,
    out: &'a Buffer,
    sizes: [Scalar; 3],
    format: usize,
    /// The tensor-core form (`matmul_mma_<w>`), whose fused kernel is `matmul_add_mma_<w>`.
    mma: bool,
}

fn product(d: DispatchRef<'_>) -> Option<Product<'_>> {
    let (format, mma) = super::matmul::plain_product_format(d.kernel())?;
    Some(Product {
        x: d.buffer("x")?,
        w: d.buffer("w")?,
        out: d.buffer("out")?,
        sizes: [d.scalar("rows")?, d.scalar("k")?, d.scalar("n")?],
        format,
        mma,
    })
}

/// The matmul's output is exactly what the add reads, with the same element count (no
/// broadcast), the accumulator is not one of the matmul's operands and lives on its device.
fn matmul_add_match<'a>(
    mm: DispatchRef<'a>,
    add: DispatchRef<'a>,
) -> Option<(Product<'a>, &'a Buffer)> {
    let p = product(mm)?;
    let (acc, b) = residual_add(add)?;
    let same = Range::of(b) == Range::of(p.out) && b.elems() == p.out.elems();
    let apart = !p.x.overlaps(acc) && !p.w.overlaps(acc) && one_device(acc, p.out);
    (same && apart && acc.elems() == p.out.elems()).then_some((p, acc))
}

fn matmul_add_intermediate(mm: DispatchRef<'_>, add: DispatchRef<'_>) -> Option<Range> {
    matmul_add_match(mm, add).map(|(p, _)| Range::of(p.out))
}

fn unmatched(rule: &str) -> Error {
    Error::InvalidArgument(format!("{rule}: the pair does not match"))
}

fn build_matmul_add<'a>(mm: DispatchRef<'a>, add: DispatchRef<'a>) -> Result<DispatchSpec<'a>> {
    let (p, acc) = matmul_add_match(mm, add).ok_or_else(|| unmatched("matmul + add"))?;
    let [rows, k, n] = p.sizes.map(ArgRef::Scalar);
    DispatchSpec::new(
        KernelId::of(if p.mma {
            &mm::MATMUL_ADD_MMA[p.format]
        } else {
            &mm::MATMUL_ADD[p.format]
        }),
        &[
            ArgRef::read(p.x),
            ArgRef::read(p.w),
            ArgRef::read_write(acc),
            rows,
            k,
            n,
        ],
        mm.grid(),
    )
}

/// A matmul followed by an in-place add of its output into another buffer becomes
/// `matmul_add`.
pub const MATMUL_ADD_FUSION: FusionRule = FusionRule::pair(
    "matmul+add",
    OpKind::MatMul,
    OpKind::Add,
    matmul_add_intermediate,
    build_matmul_add,
);

#[cfg(test)]
mod tests {
    use crate::backend::{DType, Device};
    use crate::testutil::{assert_close, random_f32};
    use crate::{Executor, Mode, Plan};

    /// `acc += x . W` then the matmul's output overwritten by a copy (so it is provably dead),
    /// run in `mode` with `plan`; returns the accumulator and the report's fusion and dispatch
    /// counts.
    fn run(dtype: DType, rows: usize, mode: Mode, plan: &Plan) -> (Vec<f32>, usize, usize) {
        let dev = Device::cpu(2).unwrap();
        let (k, n) = (256usize, 100usize);
        let values = random_f32(n * k, 1.0, 1);
        let bytes = crate::quant::quantize(dtype, &values).unwrap();
        let w = dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap();
        let x = dev
            .upload::<f32>(&random_f32(rows * k, 1.0, 2), &[rows, k])
            .unwrap();
        let fill = dev
            .upload::<f32>(&random_f32(rows * n, 1.0, 3), &[rows, n])
            .unwrap();
        let acc = dev
            .upload::<f32>(&random_f32(rows * n, 1.0, 4), &[rows, n])
            .unwrap();
        let proj = dev.alloc(DType::F32, &[rows, n]).unwrap();
        let mut s = Executor::new(dev.clone()).begin(mode);
        s.matmul(&x, &w, &proj).unwrap();
        s.add_inplace(&acc, &proj).unwrap();
        s.copy(&fill, &proj).unwrap();
        let report = s.finish(plan).unwrap();
        (
            dev.download::<f32>(&acc).unwrap(),
            report.fusions,
            report.dispatches,
        )
    }

    /// The CPU fuses the pair where the matmul's output is dead, and the fused kernel gives the
    /// bits of the pair run one by one (one row: the vector and integer paths; 3 and 13 rows:
    /// the tile path), which are within f32 rounding of an f64 reference.
    #[test]
    fn given_cpu_buffers_when_optimized_should_fuse_matmul_add_with_the_same_bits() {
        for dtype in [
            DType::Q4_1,
            DType::Q5_0,
            DType::Q8_0,
            DType::Q4K,
            DType::F16,
            DType::F32,
        ] {
            for rows in [1usize, 3, 13] {
                let what = format!("{dtype} rows {rows}");
                let (fused, fusions, dispatches) =
                    run(dtype, rows, Mode::Recorded, &Plan::OPTIMIZED);
                assert_eq!((fusions, dispatches), (1, 2), "{what}");
                let (direct, fusions, _) = run(dtype, rows, Mode::Direct, &Plan::SEQUENTIAL);
                assert_eq!(fusions, 0, "{what}");
                assert_eq!(
                    fused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    direct.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{what}: fused and unfused differ"
                );
                let (k, n) = (256usize, 100usize);
                let bytes = crate::quant::quantize(dtype, &random_f32(n * k, 1.0, 1)).unwrap();
                let w = crate::quant::dequantize(dtype, &bytes).unwrap();
                let x = random_f32(rows * k, 1.0, 2);
                let acc = random_f32(rows * n, 1.0, 4);
                let want: Vec<f32> = (0..rows * n)
                    .map(|i| {
                        let (r, o) = (i / n, i % n);
                        let dot: f64 = (0..k)
                            .map(|p| x[r * k + p] as f64 * w[o * k + p] as f64)
                            .sum();
                        (acc[i] as f64 + dot) as f32
                    })
                    .collect();
                // Sums of 256 products of values below 1 (|sum| up to about 10) in f32, and
                // for Q4_1/Q8_0 on one row the activations quantized to 22 bits.
                assert_close(&fused, &want, 1e-4, 1e-5, &what);
            }
        }
    }
}
