//! The narrowing rule (`graph::passes::narrow`) for prompt products: an f32 `rms_norm` whose
//! every reader is a tensor-core product (`matmul_mma_<w>`, `matmul3_mma_<w>`) of exactly its
//! output becomes `rms_norm_f32_to_f16` writing f16 into the first half of the output's bytes,
//! and the products their `_h` forms reading it. The tensor-core products round x to f16 (round
//! to nearest even) before they multiply, and the norm's f32 values are the same in both forms,
//! so the products see the same f16 operands: the same bits, half the activation bytes read.

use crate::backend::{Buffer, DType};
use crate::graph::passes::NarrowRule;
use crate::graph::{Arg, ArgRef, DispatchRef, DispatchSpec, KernelId, Range};
use crate::kernels::{matmul as mm, norm as kn};

fn norm_output(d: DispatchRef<'_>) -> Option<(Buffer, Buffer)> {
    if d.kernel() != KernelId::of(&kn::RMS_NORM[0]) {
        return None;
    }
    let out = d.buffer("out")?;
    let narrow = out.view(0, DType::F16, out.dims()).ok()?;
    Some((out.clone(), narrow))
}

fn narrow_norm<'a>(d: DispatchRef<'a>, narrow: &'a Buffer) -> Option<DispatchSpec<'a>> {
    DispatchSpec::new(
        KernelId::of(&kn::RMS_NORM_TO_F16),
        &[
            ArgRef::read(d.buffer("x")?),
            ArgRef::read(d.buffer("weight")?),
            ArgRef::write(narrow),
            ArgRef::Scalar(d.scalar("eps")?),
            ArgRef::Scalar(d.scalar("dim")?),
        ],
        d.grid(),
    )
    .ok()
}

/// A tensor-core product of exactly `wide` (one of the three kernels' families), reading
/// `narrow` instead.
fn narrow_product<'a>(
    d: DispatchRef<'a>,
    wide: &'a Buffer,
    narrow: &'a Buffer,
) -> Option<DispatchSpec<'a>> {
    let x = d.buffer("x")?;
    if Range::of(x) != Range::of(wide) || x.dims() != wide.dims() {
        return None;
    }
    let kernel = d.kernel();
    let (family, index) = if let Some(f) = kernel.index_in(&mm::MATMUL_MMA) {
        (&mm::MATMUL_MMA_H, f)
    } else {
        (&mm::MATMUL3_MMA_H, kernel.index_in(&mm::MATMUL3_MMA)?)
    };
    // Every argument as it was, x (the first) replaced by the narrow view.
    let args: Vec<ArgRef<'a>> = d
        .args()
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::Buffer(_, access) if i == 0 => ArgRef::Buffer(narrow, *access),
            Arg::Buffer(b, access) => ArgRef::Buffer(b, *access),
            Arg::Scalar(s) => ArgRef::Scalar(*s),
        })
        .collect();
    DispatchSpec::new(KernelId::of(&family[index]), &args, d.grid()).ok()
}

/// An f32 norm read only by tensor-core products: f16 written, f16 read.
pub const NORM_TO_F16_PRODUCTS: NarrowRule = NarrowRule {
    name: "rms_norm->f16 products",
    output: norm_output,
    producer: narrow_norm,
    reader: narrow_product,
};
