//! The fusion of three tensor-core products of one x: [`PRODUCT_TRIPLE_FUSION`] turns a
//! `matmul_mma_<w>` and the next two dispatches that read its x, when they are `matmul_mma_<w>`
//! of the same x, weight format and k (a prompt's q, k and v products), into one
//! `matmul3_mma_<w>` whose grid lays the three's output tiles side by side.
//!
//! Why: the k and v products of a grouped-query model are narrow (1,024 outputs for the Llama 3.1
//! 8B shape, 512 for Llama 3.2 1B): alone, a 512-token prompt gives each 64 tiles, half of an
//! H100's 132 SMs, for a whole pass over k. Side by side with q they fill the GPU.
//!
//! The fused kernel computes every output tile with the unfused kernel's code, and a tile's
//! values do not depend on the tile's height or position in the grid, so the fused dispatch gives
//! the three products' bits (the backends declare it exact).

use super::matmul::{mma_grid_for_tiles, plain_product_format, MMA_TILE};
use crate::backend::Buffer;
use crate::graph::passes::{At, Found, FusionRule, Matcher};
use crate::graph::{ArgRef, DispatchRef, DispatchSpec, KernelId, OpKind, Range, Scalar};
use crate::kernels::matmul as mm;

/// A tensor-core product: its place, buffers, sizes and weight format (the index of its kernel in
/// its kernel table). Shared with the gate/up/SwiGLU rule (`ops::matmul_swiglu`).
pub(super) struct Product<'g> {
    pub(super) at: At,
    pub(super) x: &'g Buffer,
    pub(super) w: &'g Buffer,
    pub(super) out: &'g Buffer,
    pub(super) rows: Scalar,
    pub(super) k: Scalar,
    pub(super) n: Scalar,
    pub(super) format: usize,
}

impl<'g> Product<'g> {
    /// The product dispatched at `at`, its weight format being `format`; `None` when an argument
    /// is missing.
    pub(super) fn read(m: &Matcher<'g>, at: At, format: usize) -> Option<Product<'g>> {
        let d: DispatchRef<'g> = m.dispatch(at);
        Some(Product {
            at,
            x: d.buffer("x")?,
            w: d.buffer("w")?,
            out: d.buffer("out")?,
            rows: d.scalar("rows")?,
            k: d.scalar("k")?,
            n: d.scalar("n")?,
            format,
        })
    }
}

fn tensor_core_product<'g>(m: &Matcher<'g>, at: At) -> Option<Product<'g>> {
    let (format, true) = plain_product_format(m.dispatch(at).kernel())? else {
        return None;
    };
    Product::read(m, at, format)
}

/// The product's outputs, as a count.
fn outputs(p: &Product<'_>) -> Option<usize> {
    match p.n {
        Scalar::U32(n) => Some(n as usize),
        _ => None,
    }
}

fn find_product_triple<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    let first = tensor_core_product(m, at)?;
    let x = Range::of(first.x);
    let mut readers = m.readers(at, x);
    let (a, b) = (readers.next()?, readers.next()?);
    let ps = [
        first,
        tensor_core_product(m, a)?,
        tensor_core_product(m, b)?,
    ];
    let p0 = &ps[0];
    let same_input = ps[1..].iter().all(|p| {
        Range::of(p.x) == x
            && p.x.dims() == p0.x.dims()
            && p.format == p0.format
            && p.rows == p0.rows
            && p.k == p0.k
    });
    // Each output apart from x, from every weight and from the other outputs.
    let apart = ps.iter().enumerate().all(|(i, p)| {
        !p.out.overlaps(p0.x)
            && ps.iter().all(|q| !p.out.overlaps(q.w))
            && ps[i + 1..].iter().all(|q| !p.out.overlaps(q.out))
    });
    if !same_input || !apart {
        return None;
    }
    let n = [outputs(&ps[0])?, outputs(&ps[1])?, outputs(&ps[2])?];
    let rows = p0.x.elems() / p0.x.shape().last().max(1);
    let cols: usize = n.iter().map(|n| n.div_ceil(MMA_TILE)).sum();
    // The f32 forms; the narrowing asks for the Hopper form's memory where it runs.
    let grid = mma_grid_for_tiles(cols, rows, p0.w.dtype(), false);
    let spec = DispatchSpec::new(
        KernelId::of(&mm::MATMUL3_MMA[p0.format]),
        &[
            ArgRef::read(p0.x),
            ArgRef::read(ps[0].w),
            ArgRef::read(ps[1].w),
            ArgRef::read(ps[2].w),
            ArgRef::write(ps[0].out),
            ArgRef::write(ps[1].out),
            ArgRef::write(ps[2].out),
            ArgRef::Scalar(p0.rows),
            ArgRef::Scalar(p0.k),
            ArgRef::Scalar(ps[0].n),
            ArgRef::Scalar(ps[1].n),
            ArgRef::Scalar(ps[2].n),
        ],
        grid,
    )
    .ok()?;
    Found::new(&[ps[0].at, ps[1].at, ps[2].at], spec, rows)
}

/// `matmul_mma x -> w0`, then the next two readers of x, `matmul_mma x -> w1` and
/// `matmul_mma x -> w2` (one weight format, one k), become one `matmul3_mma`.
pub const PRODUCT_TRIPLE_FUSION: FusionRule = FusionRule::graph(
    "matmul3",
    OpKind::MatMul,
    "matmul_mma x -> {matmul_mma x, matmul_mma x} (one format, one k)",
    find_product_triple,
);

#[cfg(test)]
#[path = "matmul_triple_tests.rs"]
mod tests;
