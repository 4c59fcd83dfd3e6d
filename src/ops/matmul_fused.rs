//! The fusion of a matmul with the residual add after it, for the CUDA backend:
//! [`MATMUL_ADD_FUSION`] turns a matmul whose output the next dispatch, an in-place f32 `add`,
//! adds into an accumulator (the residual stream) into one `matmul_add_<w>` that adds each
//! product into the accumulator: `acc[r, o] += x[r] . W[o]`. In a decode step this removes two of
//! the thirteen dependent launches of every layer.
//!
//! The fused kernel does the pair's float operations in the pair's order (the product, then
//! `acc + product`), so a fused graph gives the unfused graph's bits. The fuse pass applies the
//! rule only where it proves the matmul's output dead afterwards.
//!
//! The rule matches only dispatches whose buffers live on a CUDA device: the CPU backend runs the
//! pair as it is (its matmul is bound by weight reads, and a dispatch costs it little).
//! (A SwiGLU + matmul fusion was measured and dropped: every warp recomputing `silu(gate) * up`
//! over the whole row made the fused kernel slower than the pair on an H200.)

use crate::backend::{Buffer, Memory};
use crate::error::{Error, Result};
use crate::graph::passes::FusionRule;
use crate::graph::{Access, Arg, Dispatch, KernelId, OpKind, Range};

// Kernel names by weight format: f32, f16, bf16, q4_0, q4_1, q8_0, q4_k, q6_k.
const PLAIN: [&str; 8] = [
    "matmul_f32",
    "matmul_f16",
    "matmul_bf16",
    "matmul_q4_0",
    "matmul_q4_1",
    "matmul_q8_0",
    "matmul_q4_k",
    "matmul_q6_k",
];
const ADD: [&str; 8] = [
    "matmul_add_f32",
    "matmul_add_f16",
    "matmul_add_bf16",
    "matmul_add_q4_0",
    "matmul_add_q4_1",
    "matmul_add_q8_0",
    "matmul_add_q4_k",
    "matmul_add_q6_k",
];

/// The format index of a kernel name in a table.
fn table_index(table: &[&str; 8], name: &str) -> Option<usize> {
    table.iter().position(|&k| k == name)
}

fn on_cuda(buf: &Buffer) -> bool {
    matches!(buf.allocation().memory, Memory::Cuda(_))
}

/// The read operand of an in-place f32 add, and its accumulator.
fn residual_add(add: &Dispatch) -> Option<(&Buffer, &Buffer)> {
    if add.kernel().0 != "add_f32_inplace" {
        return None;
    }
    let (acc, access) = add.buffer_arg(0)?;
    let (b, _) = add.buffer_arg(1)?;
    (access == Access::ReadWrite && on_cuda(acc)).then_some((acc, b))
}

/// A plain matmul: its activations, weight, output, scalar args and format index.
struct Product<'a> {
    x: &'a Buffer,
    w: &'a Buffer,
    out: &'a Buffer,
    scalars: &'a [Arg],
    format: usize,
}

fn product(d: &Dispatch) -> Option<Product<'_>> {
    let format = table_index(&PLAIN, d.kernel().0)?;
    let (x, _) = d.buffer_arg(0)?;
    let (w, _) = d.buffer_arg(1)?;
    let (out, _) = d.buffer_arg(2)?;
    let scalars = d.args().get(3..)?;
    on_cuda(out).then_some(Product {
        x,
        w,
        out,
        scalars,
        format,
    })
}

/// The matmul's output is exactly what the add reads, with the same element count (no
/// broadcast), and the accumulator is not one of the matmul's operands.
fn matmul_add_match<'a>(mm: &'a Dispatch, add: &'a Dispatch) -> Option<(Product<'a>, &'a Buffer)> {
    let p = product(mm)?;
    let (acc, b) = residual_add(add)?;
    let same = Range::of(b) == Range::of(p.out) && b.elems() == p.out.elems();
    let apart = !p.x.overlaps(acc) && !p.w.overlaps(acc);
    (same && apart && acc.elems() == p.out.elems()).then_some((p, acc))
}

fn matmul_add_intermediate(mm: &Dispatch, add: &Dispatch) -> Option<Range> {
    matmul_add_match(mm, add).map(|(p, _)| Range::of(p.out))
}

fn unmatched(rule: &str) -> Error {
    Error::InvalidArgument(format!("{rule}: the pair does not match"))
}

fn build_matmul_add(mm: &Dispatch, add: &Dispatch) -> Result<Dispatch> {
    let (p, acc) = matmul_add_match(mm, add).ok_or_else(|| unmatched("matmul + add"))?;
    let mut args = vec![Arg::read(p.x), Arg::read(p.w), Arg::read_write(acc)];
    args.extend(p.scalars.iter().cloned());
    Dispatch::new(KernelId(ADD[p.format]), args, mm.grid(), OpKind::MatMul)
}

/// A matmul followed by an in-place add of its output into another buffer becomes
/// `matmul_add`; CUDA only.
pub const MATMUL_ADD_FUSION: FusionRule = FusionRule {
    name: "matmul+add",
    first: OpKind::MatMul,
    second: OpKind::Add,
    intermediate: matmul_add_intermediate,
    build: build_matmul_add,
};

#[cfg(test)]
mod tests {
    use crate::backend::{DType, Device};
    use crate::{Executor, Mode, Plan};

    /// The CPU runs the pair unfused: the rule does not match CPU buffers, even where the
    /// matmul's output is provably dead (overwritten by the copy).
    #[test]
    fn given_cpu_buffers_when_optimized_should_not_fuse_matmul_add() {
        let dev = Device::cpu(1).unwrap();
        let (k, n) = (64usize, 32usize);
        let w = dev.upload::<f32>(&vec![0.5; n * k], &[n, k]).unwrap();
        let x = dev.upload::<f32>(&vec![1.5; k], &[1, k]).unwrap();
        let fill = dev.upload::<f32>(&vec![3.0; n], &[1, n]).unwrap();
        let proj = dev.alloc(DType::F32, &[1, n]).unwrap();
        let acc = dev.upload::<f32>(&vec![1.0; n], &[1, n]).unwrap();
        let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
        s.matmul(&x, &w, &proj).unwrap();
        s.add_inplace(&acc, &proj).unwrap();
        s.copy(&fill, &proj).unwrap();
        let report = s.finish(&Plan::OPTIMIZED).unwrap();
        assert_eq!(report.fusions, 0);
        assert_eq!(report.dispatches, 3);
        let want = 1.0 + 0.5 * 1.5 * k as f32;
        assert_eq!(dev.download::<f32>(&acc).unwrap(), vec![want; n]);
    }
}
