//! The fusion of a prompt's gate and up products with their SwiGLU: [`PRODUCT_PAIR_SWIGLU_FUSION`]
//! turns a `matmul_mma_h_<w>` (gate), the next reader of its x, another `matmul_mma_h_<w>` of the
//! same x, format, k and n (up), and the `swiglu_f32_to_f16` that is the one reader of both
//! outputs into one `matmul_swiglu_mma_h_<w>`, which writes the f16 SwiGLU and never the two f32
//! products.
//!
//! It acts after the narrowing (`graph::passes::narrow`): the f16 products and the f16 SwiGLU
//! are what the narrowing makes of a block's MLP input, so the rule runs in the optimizer's late
//! stage ([`FusionRule::after_narrowing`]).
//!
//! Why: on the Llama 3.1 8B shape a 512-token prompt's SwiGLU read 58.7 MB of f32 products and
//! wrote 14.7 MB a layer (44 us of 1.5 ms a layer on an H100), after the two products wrote those
//! 58.7 MB. The fused kernel's tiles hold 64 outputs of gate and the same 64 of up, so every
//! thread has both sums of its outputs in registers.
//!
//! Only where one of the fused kernel's forms applies (it has no other): Q4_0, Q4_1 or Q5_0
//! weights, k a multiple of 64, x 16-byte and the weights 4-byte aligned in their allocations
//! (whose bases the backends align to 256 bytes); and, where the backend declares every block
//! format's f16 products ([`F16Products::AllBlocks`]: CUDA on sm_90a), Q8_0, Q4_K and Q6_K
//! weights in the Hopper form's shapes ([`PRODUCT_PAIR_SWIGLU_ALL_BLOCKS`]). The fused kernel
//! computes each sum with the unfused kernel's code, in the same order, and the SwiGLU with the
//! elementwise kernel's arithmetic, so the fused dispatch gives the three dispatches' bits (the
//! backends declare it exact).

use super::matmul::{mma_grid_for_tiles, wgmma_alignment, wgmma_shape, MMA_TILE};
use super::matmul_triple::Product;
use crate::backend::{DType, F16Products};
use crate::graph::passes::{At, Found, FusionRule, Matcher};
use crate::graph::{ArgRef, DispatchSpec, KernelId, OpKind, Range, Scalar};
use crate::kernels::{elementwise as ew, matmul as mm, WEIGHT_FORMATS};

/// Outputs a fused tile holds (of gate, and the same of up).
const PAIR_TILE: usize = MMA_TILE / 2;

/// An f16-activation tensor-core product (`matmul_mma_h_<w>`) at `at`.
fn f16_product<'g>(m: &Matcher<'g>, at: At) -> Option<Product<'g>> {
    let format = m.dispatch(at).kernel().index_in(&mm::MATMUL_MMA_H)?;
    Product::read(m, at, format)
}

/// Whether one of the fused kernel's forms takes the pair: a format the `mma.sync` form stages in
/// 64-value steps, k whole steps, x and the weights aligned for its copies (`mmh_applies` in
/// `matmul_mma_h.cuh`); or, where `products` says the Hopper form runs, its shapes and alignment
/// (`mmw_applies` in `matmul_wgmma.cuh`).
fn fast_form(gate: &Product<'_>, up: &Product<'_>, products: F16Products) -> bool {
    let format = WEIGHT_FORMATS[gate.format];
    let (Scalar::U32(k), Scalar::U32(n)) = (gate.k, gate.n) else {
        return false;
    };
    let (k, n) = (k as usize, n as usize);
    let x_aligned = gate.x.offset().is_multiple_of(16);
    let w_aligned = |align: usize| {
        [gate.w, up.w]
            .iter()
            .all(|w| w.offset().is_multiple_of(align))
    };
    let mma = matches!(format, DType::Q4_0 | DType::Q4_1 | DType::Q5_0)
        && k.is_multiple_of(64)
        && x_aligned
        && w_aligned(4);
    let hopper = products == F16Products::AllBlocks
        && wgmma_shape(format, k, &[n], PAIR_TILE)
        && x_aligned
        && wgmma_alignment(format).is_some_and(w_aligned);
    mma || hopper
}

fn find_pair_swiglu<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    find_pair(m, at, F16Products::SmallBlocks)
}

fn find_pair_swiglu_all<'g>(m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    find_pair(m, at, F16Products::AllBlocks)
}

fn find_pair<'g>(m: &Matcher<'g>, at: At, products: F16Products) -> Option<Found<'g>> {
    let gate = f16_product(m, at)?;
    let x = Range::of(gate.x);
    let up = f16_product(m, m.readers(at, x).next()?)?;
    let same = Range::of(up.x) == x
        && up.x.dims() == gate.x.dims()
        && (up.format, up.rows, up.k, up.n) == (gate.format, gate.rows, gate.k, gate.n);
    if !same || !fast_form(&gate, &up, products) {
        return None;
    }
    // The SwiGLU is the one reader of each product's output, and reads all of both.
    let (g, u) = (Range::of(gate.out), Range::of(up.out));
    let s_at = m.only_reader(gate.at, g)?;
    if m.only_reader(up.at, u)? != s_at {
        return None;
    }
    let s = m.dispatch(s_at);
    if s.kernel() != KernelId::of(&ew::SWIGLU_TO_F16) {
        return None;
    }
    let (sg, su, out) = (s.buffer("gate")?, s.buffer("up")?, s.buffer("out")?);
    let n = match gate.n {
        Scalar::U32(n) => n as usize,
        _ => return None,
    };
    let values = gate.out.elems();
    if Range::of(sg) != g || Range::of(su) != u || [sg, su, out].iter().any(|b| b.elems() != values)
    {
        return None;
    }
    // The output apart from what the fused kernel reads.
    if [gate.x, gate.w, up.w].iter().any(|b| out.overlaps(b)) {
        return None;
    }
    let rows = values / n.max(1);
    let k = match gate.k {
        Scalar::U32(k) => k as usize,
        _ => return None,
    };
    let hopper =
        products == F16Products::AllBlocks && wgmma_shape(gate.w.dtype(), k, &[n], PAIR_TILE);
    let grid = mma_grid_for_tiles(n.div_ceil(PAIR_TILE), rows, gate.w.dtype(), hopper);
    let spec = DispatchSpec::new(
        KernelId::of(&mm::MATMUL_SWIGLU_MMA_H[gate.format]),
        &[
            ArgRef::read(gate.x),
            ArgRef::read(gate.w),
            ArgRef::read(up.w),
            ArgRef::write(out),
            ArgRef::Scalar(gate.rows),
            ArgRef::Scalar(gate.k),
            ArgRef::Scalar(gate.n),
        ],
        grid,
    )
    .ok()?;
    Found::new(&[gate.at, up.at, s_at], spec, rows)
}

/// `matmul_mma_h x -> gate`, the next reader of x `matmul_mma_h x -> up` (one format, k and n),
/// and `swiglu_f32_to_f16 (gate, up) -> out`, their outputs' one reader, become one
/// `matmul_swiglu_mma_h`. A late rule: it matches what the narrowing made.
pub const PRODUCT_PAIR_SWIGLU_FUSION: FusionRule = FusionRule::graph(
    "matmul_swiglu",
    OpKind::MatMul,
    "matmul_mma_h x -> {matmul_mma_h x, swiglu_f32_to_f16 of both} (one format, k, n)",
    find_pair_swiglu,
)
.after_narrowing();

/// [`PRODUCT_PAIR_SWIGLU_FUSION`] where the backend declares every block format's f16 products
/// ([`F16Products::AllBlocks`]): Q8_0, Q4_K and Q6_K pairs too, in the Hopper form's shapes.
pub const PRODUCT_PAIR_SWIGLU_ALL_BLOCKS: FusionRule = FusionRule::graph(
    "matmul_swiglu",
    OpKind::MatMul,
    "matmul_mma_h x -> {matmul_mma_h x, swiglu_f32_to_f16 of both} (one format, k, n)",
    find_pair_swiglu_all,
)
.after_narrowing();

#[cfg(test)]
#[path = "matmul_swiglu_tests.rs"]
mod tests;
