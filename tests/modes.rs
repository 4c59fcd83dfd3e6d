//! Every execution path computes the same function, bit for bit.
//!
//! Random programs of real CPU kernels (registered through the custom-kernel entry point: add,
//! mul, scale, copy, accumulate-in-place, and a non-reorderable sum) over ALIASED views of a few
//! allocations of random f32 data (never zeros) run in every mode and plan: direct (split on and
//! off), recorded with the sequential and optimized plans, fuse only, reorder only (lookahead 1
//! and 64), split on and off, and a recorded graph fused with a test rule. Each result must equal,
//! bitwise, a plain sequential run: every dispatch alone in its own session, in program order.

use onepass::backend::cpu::KernelArgs;
use onepass::graph::passes::{self, FusionRule};
use onepass::graph::KernelSig;
use onepass::graph::{Arg, ArgRef, DispatchRef, DispatchSpec, Grid, OpKind, Range, Scalar};
use onepass::kernels::{DTypes, Param};
use onepass::ops::custom::{self, CustomKernel};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan, RuntimeConfig};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------- kernels

fn k_add(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, b, out) = (
        args.input::<f32>(0)?,
        args.input::<f32>(1)?,
        args.output::<f32>(2)?,
    );
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}

fn k_mul(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, b, out) = (
        args.input::<f32>(0)?,
        args.input::<f32>(1)?,
        args.output::<f32>(2)?,
    );
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
    Ok(())
}

fn k_scale(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, out, s) = (args.input::<f32>(0)?, args.output::<f32>(1)?, args.f32(2)?);
    for (o, x) in out.iter_mut().zip(a) {
        *o = x * s;
    }
    Ok(())
}

fn k_copy(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, out) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    out.copy_from_slice(a);
    Ok(())
}

/// `acc += a`, in place.
fn k_accumulate(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, acc) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    for (o, x) in acc.iter_mut().zip(a) {
        *o += x;
    }
    Ok(())
}

/// Every output element is the sum of all inputs, added in order.
fn k_sum(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, out) = (args.input::<f32>(0)?, args.output::<f32>(1)?);
    let total = a.iter().fold(0.0f32, |s, x| s + x);
    out.fill(total * 1e-2);
    Ok(())
}

/// `out = (a + b) * s`: the same two roundings as add then scale.
fn k_add_scale(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, b, out, s) = (
        args.input::<f32>(0)?,
        args.input::<f32>(1)?,
        args.output::<f32>(2)?,
        args.f32(3)?,
    );
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = (x + y) * s;
    }
    Ok(())
}

const F32: DTypes = DTypes::one(DType::F32);
const MOVABLE: OpKind = OpKind::Custom { reorderable: true };

/// Declares a test kernel and pairs it with its CPU function.
macro_rules! kernel {
    ($sig:ident, $kernel:ident, $name:literal, $op:expr, $cpu:ident, [$($param:expr),* $(,)?]) => {
        static $sig: KernelSig = KernelSig::new($name, $op, &[$($param),*]);
        const $kernel: CustomKernel = CustomKernel { sig: &$sig, cpu: $cpu };
    };
}

kernel!(
    ADD_SIG,
    ADD,
    "modes_add",
    MOVABLE,
    k_add,
    [
        Param::read("a", F32),
        Param::read("b", F32),
        Param::write("out", F32)
    ]
);
kernel!(
    MUL_SIG,
    MUL,
    "modes_mul",
    MOVABLE,
    k_mul,
    [
        Param::read("a", F32),
        Param::read("b", F32),
        Param::write("out", F32)
    ]
);
kernel!(
    SCALE_SIG,
    SCALE,
    "modes_scale",
    MOVABLE,
    k_scale,
    [
        Param::read("x", F32),
        Param::write("out", F32),
        Param::f32("s")
    ]
);
kernel!(
    COPY_SIG,
    COPY,
    "modes_copy",
    MOVABLE,
    k_copy,
    [Param::read("x", F32), Param::write("out", F32)]
);
kernel!(
    ACCUMULATE_SIG,
    ACCUMULATE,
    "modes_accumulate",
    MOVABLE,
    k_accumulate,
    [Param::read("x", F32), Param::read_write("acc", F32)]
);
kernel!(
    SUM_SIG,
    SUM,
    "modes_sum",
    OpKind::Custom { reorderable: false },
    k_sum,
    [Param::read("x", F32), Param::write("out", F32)]
);
kernel!(
    ADD_SCALE_SIG,
    ADD_SCALE,
    "modes_add_scale",
    MOVABLE,
    k_add_scale,
    [
        Param::read("a", F32),
        Param::read("b", F32),
        Param::write("out", F32),
        Param::f32("s")
    ]
);

// ---------------------------------------------------------------- random programs

const ALLOCS: usize = 3;
const ALLOC_ELEMS: usize = 512;

/// A view: allocation, first element, length.
#[derive(Debug, Clone, Copy)]
struct View {
    alloc: usize,
    start: usize,
    len: usize,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Add(View, View, View),
    Mul(View, View, View),
    Scale(View, View, f32),
    Copy(View, View),
    Accumulate(View, View),
    Sum(View, View),
}

/// Random views of one length; retried until the written views overlap nothing else in the op.
fn random_op(r: &mut ChaCha8Rng) -> Op {
    loop {
        let len = r.random_range(1..=64usize);
        let view = |r: &mut ChaCha8Rng| View {
            alloc: r.random_range(0..ALLOCS),
            // Starts on a coarse grid so views often coincide exactly (fusable), and often overlap.
            start: r.random_range(0..(ALLOC_ELEMS - len) / 8) * 8 + r.random_range(0..2) * 3,
            len,
        };
        let (a, b, c) = (view(r), view(r), view(r));
        let op = match r.random_range(0..12) {
            0..=2 => Op::Add(a, b, c),
            3..=4 => Op::Mul(a, b, c),
            5..=7 => Op::Scale(a, c, r.random_range(0.5f32..1.5)),
            8 => Op::Copy(a, c),
            9..=10 => Op::Accumulate(a, c),
            _ => Op::Sum(
                a,
                View {
                    len: r.random_range(1..=8),
                    ..c
                },
            ),
        };
        let (reads, write): (Vec<View>, View) = match op {
            Op::Add(a, b, c) | Op::Mul(a, b, c) => (vec![a, b], c),
            Op::Scale(a, c, _) | Op::Copy(a, c) | Op::Accumulate(a, c) | Op::Sum(a, c) => {
                (vec![a], c)
            }
        };
        let disjoint = reads.iter().all(|v| {
            v.alloc != write.alloc
                || v.start + v.len <= write.start
                || write.start + write.len <= v.start
        });
        if disjoint && write.start + write.len <= ALLOC_ELEMS {
            return op;
        }
    }
}

/// A program: random ops, with add-then-scale pairs planted so the test rule finds candidates.
fn random_program(seed: u64, len: usize) -> Vec<Op> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let mut ops = Vec::with_capacity(len);
    while ops.len() < len {
        let op = random_op(&mut r);
        ops.push(op);
        if let Op::Add(_, _, c) = op {
            if r.random_range(0..2) == 0 {
                let mut dst = c;
                dst.alloc = (c.alloc + 1) % ALLOCS;
                ops.push(Op::Scale(c, dst, r.random_range(0.5f32..1.5)));
            }
        }
    }
    ops
}

struct Memory {
    device: Device,
    allocs: Vec<Buffer>,
}

impl Memory {
    /// Fresh device memory holding the same random data (never zeros) for a given seed.
    fn new(seed: u64, threads: usize) -> Memory {
        let device = Device::cpu(threads).expect("cpu");
        // The fused kernel is never pushed through a session, so register it by hand.
        custom::register(&device, &ADD_SCALE).expect("register");
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0xda7a);
        let allocs = (0..ALLOCS)
            .map(|_| {
                let data: Vec<f32> = (0..ALLOC_ELEMS)
                    .map(|_| {
                        let v: f32 = r.random_range(0.5f32..1.5);
                        if r.random_range(0..2) == 0 {
                            -v
                        } else {
                            v
                        }
                    })
                    .collect();
                device.upload(&data, &[ALLOC_ELEMS]).expect("upload")
            })
            .collect();
        Memory { device, allocs }
    }

    fn view(&self, v: View) -> Buffer {
        self.allocs[v.alloc]
            .view(v.start * 4, DType::F32, &[v.len])
            .expect("view")
    }

    fn bits(&self) -> Vec<u32> {
        self.allocs
            .iter()
            .flat_map(|b| self.device.download::<f32>(b).expect("download"))
            .map(f32::to_bits)
            .collect()
    }

    fn push(&self, s: &mut onepass::Session, op: Op) {
        let g = |v: View| Grid::cover(v.len, 64);
        let result = match op {
            Op::Add(a, b, c) => s.custom(
                &ADD,
                vec![
                    Arg::read(&self.view(a)),
                    Arg::read(&self.view(b)),
                    Arg::write(&self.view(c)),
                ],
                g(c),
            ),
            Op::Mul(a, b, c) => s.custom(
                &MUL,
                vec![
                    Arg::read(&self.view(a)),
                    Arg::read(&self.view(b)),
                    Arg::write(&self.view(c)),
                ],
                g(c),
            ),
            Op::Scale(a, c, k) => s.custom(
                &SCALE,
                vec![
                    Arg::read(&self.view(a)),
                    Arg::write(&self.view(c)),
                    Arg::f32(k),
                ],
                g(c),
            ),
            Op::Copy(a, c) => s.custom(
                &COPY,
                vec![Arg::read(&self.view(a)), Arg::write(&self.view(c))],
                g(c),
            ),
            Op::Accumulate(a, c) => s.custom(
                &ACCUMULATE,
                vec![Arg::read(&self.view(a)), Arg::read_write(&self.view(c))],
                g(c),
            ),
            Op::Sum(a, c) => s.custom(
                &SUM,
                vec![Arg::read(&self.view(a)), Arg::write(&self.view(c))],
                g(c),
            ),
        };
        result.expect("push");
    }
}

// ---------------------------------------------------------------- the fusion test rule

fn add_scale_intermediate(a: DispatchRef<'_>, b: DispatchRef<'_>) -> Option<Range> {
    if a.kernel() != ADD.id() || b.kernel() != SCALE.id() {
        return None;
    }
    let (out, input) = (Range::of(a.buffer("out")?), Range::of(b.buffer("x")?));
    (out == input).then_some(out)
}

fn add_scale_build<'a>(
    a: DispatchRef<'a>,
    b: DispatchRef<'a>,
) -> onepass::Result<DispatchSpec<'a>> {
    let bad = || onepass::Error::InvalidArgument("add_scale: unexpected arguments".into());
    let Some(Scalar::F32(s)) = b.scalar("s") else {
        return Err(bad());
    };
    let x = a.buffer("a").ok_or_else(bad)?;
    let y = a.buffer("b").ok_or_else(bad)?;
    let out = b.buffer("out").ok_or_else(bad)?;
    custom::custom_spec(
        &ADD_SCALE,
        &[
            ArgRef::read(x),
            ArgRef::read(y),
            ArgRef::write(out),
            ArgRef::f32(s),
        ],
        b.grid(),
    )
}

const ADD_SCALE_RULE: FusionRule = FusionRule::pair(
    "modes_add_scale",
    OpKind::Custom { reorderable: true },
    OpKind::Custom { reorderable: true },
    add_scale_intermediate,
    add_scale_build,
);

// ---------------------------------------------------------------- runs

/// The oracle: each dispatch alone, in order, one session each.
fn run_plain(seed: u64, program: &[Op]) -> Vec<u32> {
    let mem = Memory::new(seed, 1);
    let exec = Executor::new(mem.device.clone());
    for &op in program {
        let mut s = exec.begin(Mode::Direct);
        mem.push(&mut s, op);
        s.finish(&Plan::SEQUENTIAL).expect("finish");
    }
    mem.bits()
}

fn run_session(seed: u64, program: &[Op], mode: Mode, plan: &Plan, split_direct: bool) -> Vec<u32> {
    let mem = Memory::new(seed, 2);
    let config = RuntimeConfig {
        split: split_direct,
        ..RuntimeConfig::default()
    };
    let exec = Executor::new(mem.device.clone()).with_config(config);
    let mut s = exec.begin(mode);
    for &op in program {
        mem.push(&mut s, op);
    }
    let report = s.finish(plan).expect("finish");
    assert_eq!(report.dispatches + report.fusions, program.len());
    mem.bits()
}

/// Recorded, fused with the test rule, reordered, barriers placed, run split or not.
fn run_fused(seed: u64, program: &[Op], lookahead: usize, split: bool) -> (Vec<u32>, usize) {
    let mem = Memory::new(seed, 2);
    let exec = Executor::new(mem.device.clone());
    let mut s = exec.begin(Mode::Recorded);
    for &op in program {
        mem.push(&mut s, op);
    }
    let mut g = s.into_graph().expect("graph");
    let fusions = passes::fuse(&mut g, &[ADD_SCALE_RULE]);
    passes::reorder(&mut g, lookahead);
    passes::place_barriers(&mut g);
    let times = exec.run(&g, split).expect("run");
    assert_eq!(
        times.submissions,
        if split && g.dispatch_count() > 64 {
            2
        } else {
            1
        }
    );
    (mem.bits(), fusions)
}

fn plans() -> Vec<(&'static str, Plan)> {
    let base = Plan::SEQUENTIAL;
    vec![
        ("sequential", base),
        (
            "sequential split",
            Plan {
                split: true,
                ..base
            },
        ),
        ("optimized", Plan::OPTIMIZED),
        (
            "optimized no split",
            Plan {
                split: false,
                ..Plan::OPTIMIZED
            },
        ),
        ("fuse only", Plan { fuse: true, ..base }),
        (
            "reorder 64 only",
            Plan {
                reorder: Some(64),
                ..base
            },
        ),
        (
            "reorder 1 only",
            Plan {
                reorder: Some(1),
                ..base
            },
        ),
        (
            "reorder 1 split",
            Plan {
                reorder: Some(1),
                split: true,
                ..base
            },
        ),
        (
            "reorder 64 split timed",
            Plan {
                reorder: Some(64),
                split: true,
                timing: true,
                ..base
            },
        ),
    ]
}

fn check_program(seed: u64, len: usize) -> usize {
    let program = random_program(seed, len);
    let want = run_plain(seed, &program);
    let fail = |what: &str| {
        format!(
            "seed {seed}, {} ops: {what} differs from the plain run",
            len
        )
    };
    for split in [false, true] {
        let got = run_session(seed, &program, Mode::Direct, &Plan::SEQUENTIAL, split);
        assert!(got == want, "{}", fail(&format!("direct (split {split})")));
    }
    for (name, plan) in plans() {
        let got = run_session(seed, &program, Mode::Recorded, &plan, false);
        assert!(got == want, "{}", fail(&format!("recorded, plan {name}")));
    }
    let mut fusions = 0;
    for (lookahead, split) in [(64, true), (1, false), (0, true)] {
        let (got, f) = run_fused(seed, &program, lookahead, split);
        fusions += f;
        assert!(
            got == want,
            "{}",
            fail(&format!("fused, lookahead {lookahead}, split {split}"))
        );
    }
    fusions
}

#[test]
fn short_programs_give_the_same_bits_in_every_mode_and_plan() {
    for seed in 0..24 {
        check_program(seed, 1 + (seed as usize * 7) % 40);
    }
}

#[test]
fn long_programs_that_split_give_the_same_bits_in_every_mode_and_plan() {
    let mut fusions = 0;
    for seed in 100..112 {
        fusions += check_program(seed, 65 + (seed as usize * 37) % 200);
    }
    // The fusion runs must really fuse somewhere, or they test nothing beyond the others.
    assert!(fusions > 0, "the test rule never fused");
}

#[test]
fn the_plain_run_is_not_the_initial_memory() {
    // Guards the comparisons above against a harness that runs nothing.
    let seed = 7;
    let program = random_program(seed, 30);
    let before = Memory::new(seed, 1).bits();
    assert_ne!(run_plain(seed, &program), before);
}
