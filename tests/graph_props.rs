//! Property tests of the graph passes on random graphs (seeded, so every run checks the same
//! cases): 1-200 dispatches over a few allocations, random overlapping views, random op kinds
//! (some not reorderable).
//!
//! (a) reorder never swaps a conflicting pair; (b) never moves a non-reorderable dispatch past
//! any other; (c) after place_barriers no two dispatches of a group conflict and every barrier is
//! needed; (d) fusing with a test rule computes bitwise the same values as the unfused graph.

use onepass::backend::cpu::KernelArgs;
use onepass::executable::reduced_dependencies;
use onepass::graph::conflict::{conflict, ranges_conflict};
use onepass::graph::passes::{self, FusionRule};
use onepass::graph::synthetic::untyped_kernel;
use onepass::graph::{
    Access, Arg, ArgRef, ComputeGraph, Dispatch, DispatchRef, DispatchSpec, Grid, KernelSig, Node,
    OpKind, Range, RangeSet, Scalar,
};
use onepass::kernels::{DTypes, Param};
use onepass::ops::custom::CustomKernel;
use onepass::{Buffer, DType, Device, Executor, Mode};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

const ALLOCS: usize = 3;
const ALLOC_ELEMS: usize = 96;

const KINDS: [OpKind; 8] = [
    OpKind::MatMul,
    OpKind::Add,
    OpKind::Mul,
    OpKind::Rope,
    OpKind::KvWrite,
    OpKind::Attention,
    OpKind::Softmax,
    OpKind::Custom { reorderable: false },
];

/// A view: allocation index, first element, length in elements.
type ViewSpec = (usize, usize, usize);

/// One random dispatch: kind index, read views, write views.
type Spec = (usize, Vec<ViewSpec>, Vec<ViewSpec>);

fn view_spec() -> impl Strategy<Value = ViewSpec> {
    (0..ALLOCS, 0..ALLOC_ELEMS - 1)
        .prop_flat_map(|(a, start)| (Just(a), Just(start), 0..=(ALLOC_ELEMS - start).min(32)))
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0..KINDS.len() * 3,
        prop::collection::vec(view_spec(), 0..4),
        prop::collection::vec(view_spec(), 0..3),
    )
        .prop_map(|(k, r, w)| (k, r, w))
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec(spec(), 1..=200)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x5eed_0002),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

struct Mem {
    allocs: Vec<Buffer>,
}

impl Mem {
    fn new(dev: &Device) -> Mem {
        let allocs = (0..ALLOCS)
            .map(|_| dev.alloc(DType::F32, &[ALLOC_ELEMS]).expect("alloc"))
            .collect();
        Mem { allocs }
    }

    fn view(&self, (a, start, len): ViewSpec) -> Buffer {
        self.allocs[a]
            .view(start * 4, DType::F32, &[len])
            .expect("view")
    }
}

/// Builds the graph; a spec whose writes overlap its other arguments is dropped (the dispatch
/// IR rejects it). Each dispatch carries its index as a trailing scalar. Kinds: two in three
/// draws are reorderable elementwise work, the rest spread over `KINDS`.
fn build(mem: &Mem, specs: &[Spec]) -> ComputeGraph {
    let mut g = ComputeGraph::new();
    for (kind, reads, writes) in specs {
        let op = if kind % 3 == 0 {
            KINDS[kind / 3]
        } else {
            OpKind::Elementwise
        };
        let mut args: Vec<Arg> = reads.iter().map(|v| Arg::read(&mem.view(*v))).collect();
        args.extend(writes.iter().map(|v| Arg::write(&mem.view(*v))));
        args.push(Arg::u32(g.dispatch_count() as u32));
        if let Ok(d) = Dispatch::new(untyped_kernel(op), args, Grid::new(1, 1)) {
            g.push(d);
        }
    }
    g
}

fn tag(d: DispatchRef<'_>) -> usize {
    match d.args().last() {
        Some(Arg::Scalar(Scalar::U32(t))) => *t as usize,
        other => panic!("untagged dispatch {other:?}"),
    }
}

/// Checks (c) on a graph with barriers placed.
fn check_barriers(g: &ComputeGraph) -> Result<(), TestCaseError> {
    let mut group: Vec<DispatchRef<'_>> = Vec::new();
    for node in g.nodes() {
        match node {
            Node::Barrier => group.clear(),
            Node::Dispatch(d) => {
                for other in &group {
                    prop_assert!(
                        !conflict(*other, d),
                        "dispatches {} and {} conflict inside one group",
                        tag(*other),
                        tag(d)
                    );
                }
                group.push(d);
            }
        }
    }
    // Every barrier is needed: the dispatch right after it conflicts with the group before it.
    let nodes: Vec<Node<'_>> = g.nodes().collect();
    let mut start = 0;
    for (i, node) in nodes.iter().enumerate() {
        if matches!(node, Node::Barrier) {
            let next = nodes.get(i + 1).and_then(|n| n.as_dispatch());
            let Some(next) = next else {
                return Err(TestCaseError::fail(format!(
                    "barrier {i} is not followed by a dispatch"
                )));
            };
            prop_assert!(start < i, "barrier {} has an empty group before it", i);
            let before: Vec<DispatchRef<'_>> = nodes[start..i]
                .iter()
                .filter_map(Node::as_dispatch)
                .collect();
            prop_assert!(
                before.iter().any(|d| conflict(*d, next)),
                "barrier before dispatch {} is not needed",
                tag(next)
            );
            start = i + 1;
        }
    }
    Ok(())
}

/// The graph as tags and `|` for barriers.
fn layout(g: &ComputeGraph) -> Vec<Option<usize>> {
    g.nodes().map(|n| n.as_dispatch().map(tag)).collect()
}

/// A shape-only rule for the random graphs: two elementwise dispatches fuse when the second's
/// first read is exactly the first's first write; the fused dispatch reads what both read (but
/// the intermediate), writes what the second writes, and keeps the first's tag.
fn chain_rule() -> FusionRule {
    fn buffers(d: DispatchRef<'_>, access: fn(Access) -> bool) -> Vec<&Buffer> {
        d.args()
            .iter()
            .filter_map(|a| match a {
                Arg::Buffer(b, acc) if access(*acc) => Some(b),
                _ => None,
            })
            .collect()
    }
    fn intermediate(a: DispatchRef<'_>, b: DispatchRef<'_>) -> Option<Range> {
        let w = a.writes().first()?;
        (b.reads().first()? == w).then_some(w)
    }
    fn build<'a>(a: DispatchRef<'a>, b: DispatchRef<'a>) -> onepass::Result<DispatchSpec<'a>> {
        let mid = intermediate(a, b);
        let mut args: Vec<ArgRef<'a>> = buffers(a, Access::reads)
            .into_iter()
            .chain(buffers(b, Access::reads))
            .filter(|r| Some(Range::of(r)) != mid)
            .map(ArgRef::read)
            .collect();
        args.extend(buffers(b, Access::writes).into_iter().map(ArgRef::write));
        args.push(ArgRef::u32(tag(a) as u32));
        DispatchSpec::new(untyped_kernel(OpKind::Elementwise), &args, Grid::new(1, 1))
    }
    FusionRule::pair(
        "props_chain",
        OpKind::Elementwise,
        OpKind::Elementwise,
        intermediate,
        build,
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn reorder_keeps_conflicting_pairs_and_pinned_dispatches_in_order(
        specs in specs(),
        lookahead in prop_oneof![Just(1usize), Just(4), Just(64)],
    ) {
        let dev = Device::cpu(1).expect("cpu");
        let mem = Mem::new(&dev);
        let original = build(&mem, &specs);
        let orig: Vec<DispatchRef<'_>> = original.dispatches().collect();
        let mut g = original.clone();
        passes::reorder(&mut g, lookahead);
        let mut pos = vec![usize::MAX; orig.len()];
        for (p, d) in g.dispatches().enumerate() {
            prop_assert_eq!(pos[tag(d)], usize::MAX, "dispatch {} appears twice", tag(d));
            pos[tag(d)] = p;
        }
        prop_assert!(pos.iter().all(|&p| p != usize::MAX), "a dispatch was lost");
        for i in 0..orig.len() {
            for j in i + 1..orig.len() {
                // (a)
                if conflict(orig[i], orig[j]) {
                    prop_assert!(pos[i] < pos[j], "conflicting {} and {} were swapped", i, j);
                }
                // (b)
                if !orig[i].op().is_reorderable() || !orig[j].op().is_reorderable() {
                    prop_assert!(pos[i] < pos[j], "pinned pair {} and {} changed order", i, j);
                }
            }
        }
        passes::place_barriers(&mut g);
        check_barriers(&g)?;
    }

    #[test]
    fn optimize_matches_the_passes_run_one_by_one(
        specs in specs(),
        lookahead in prop_oneof![Just(0usize), Just(1), Just(4), Just(64)],
        fuse in any::<bool>(),
    ) {
        let dev = Device::cpu(1).expect("cpu");
        let mem = Mem::new(&dev);
        let mut one_by_one = build(&mem, &specs);
        let mut together = one_by_one.clone();
        let rules = if fuse { vec![chain_rule()] } else { Vec::new() };
        let fusions = passes::fuse(&mut one_by_one, &rules);
        let reordered = passes::reorder(&mut one_by_one, lookahead);
        let barriers = passes::place_barriers(&mut one_by_one);
        let done = passes::optimize(&mut together, &rules, &[], lookahead);
        prop_assert_eq!(done.fusions, fusions);
        prop_assert_eq!(done.reordered, reordered);
        prop_assert_eq!(done.barriers, barriers);
        prop_assert_eq!(layout(&together), layout(&one_by_one));
    }

    /// The range set (what the reorder walk and the sanitizer use) and the instantiated graphs'
    /// dependencies follow the one conflict rule: a set conflicts with a dispatch exactly when
    /// one of its members does; every dependency edge joins a conflicting pair, every conflicting
    /// pair is joined by a path, and no edge is implied by a longer path.
    #[test]
    fn range_sets_and_dependencies_follow_the_conflict_rule(specs in specs()) {
        let dev = Device::cpu(1).expect("cpu");
        let mem = Mem::new(&dev);
        let g = build(&mem, &specs);
        let ds: Vec<Dispatch> = g.dispatches().map(|d| d.to_dispatch()).collect();
        let mut set = RangeSet::new();
        for (j, d) in ds.iter().enumerate() {
            let any = ds[..j].iter().any(|e| conflict(e.as_view(), d.as_view()));
            prop_assert_eq!(set.conflicts(d.reads(), d.writes()), any, "dispatch {}", j);
            for e in &ds[..j] {
                prop_assert_eq!(
                    conflict(e.as_view(), d.as_view()),
                    ranges_conflict(e.reads(), e.writes(), d.reads(), d.writes())
                );
            }
            set.add(d.reads(), d.writes());
        }
        let preds = reduced_dependencies(&ds);
        let n = ds.len();
        // reach[i][j]: a path leads from j to i.
        let mut reach = vec![vec![false; n]; n];
        for i in 0..n {
            for &j in &preds[i] {
                prop_assert!(j < i && conflict(ds[j].as_view(), ds[i].as_view()), "edge {}->{}", j, i);
                let implied = preds[i].iter().any(|&k| k != j && reach[k][j]);
                prop_assert!(!implied, "edge {}->{} is implied by a longer path", j, i);
                reach[i][j] = true;
                let via = reach[j].clone();
                for (mine, through) in reach[i].iter_mut().zip(via) {
                    *mine |= through;
                }
            }
            for j in 0..i {
                if conflict(ds[j].as_view(), ds[i].as_view()) {
                    prop_assert!(reach[i][j], "conflicting {} and {} are not ordered", j, i);
                }
            }
        }
    }

    #[test]
    fn barriers_separate_every_conflicting_pair_and_only_those(specs in specs()) {
        let dev = Device::cpu(1).expect("cpu");
        let mem = Mem::new(&dev);
        let mut g = build(&mem, &specs);
        let n = g.dispatch_count();
        let placed = passes::place_barriers(&mut g);
        prop_assert_eq!(placed, g.barrier_count());
        prop_assert_eq!(g.dispatch_count(), n);
        check_barriers(&g)?;
        let order: Vec<usize> = g.dispatches().map(tag).collect();
        prop_assert_eq!(order, (0..n).collect::<Vec<_>>());
    }
}

// ---------------------------------------------------------------- (d) fusion preserves results

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

fn k_scale(args: &KernelArgs<'_>) -> onepass::Result<()> {
    let (a, out, s) = (args.input::<f32>(0)?, args.output::<f32>(1)?, args.f32(2)?);
    for (o, x) in out.iter_mut().zip(a) {
        *o = x * s;
    }
    Ok(())
}

/// `out = (a + b) * s`: the same two roundings as add then scale, so the bits match.
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

static ADD_SIG: KernelSig = KernelSig::new(
    "props_add",
    MOVABLE,
    &[
        Param::read("a", F32),
        Param::read("b", F32),
        Param::write("out", F32),
    ],
);
static SCALE_SIG: KernelSig = KernelSig::new(
    "props_scale",
    MOVABLE,
    &[
        Param::read("x", F32),
        Param::write("out", F32),
        Param::f32("s"),
    ],
);
static ADD_SCALE_SIG: KernelSig = KernelSig::new(
    "props_add_scale",
    MOVABLE,
    &[
        Param::read("a", F32),
        Param::read("b", F32),
        Param::write("out", F32),
        Param::f32("s"),
    ],
);

const ADD: CustomKernel = CustomKernel {
    sig: &ADD_SIG,
    cpu: k_add,
};
const SCALE: CustomKernel = CustomKernel {
    sig: &SCALE_SIG,
    cpu: k_scale,
};
const ADD_SCALE: CustomKernel = CustomKernel {
    sig: &ADD_SCALE_SIG,
    cpu: k_add_scale,
};

/// An add whose output the next scale reads in full.
fn add_scale_intermediate(a: DispatchRef<'_>, b: DispatchRef<'_>) -> Option<Range> {
    if a.kernel() != ADD.id() || b.kernel() != SCALE.id() {
        return None;
    }
    let out = a.buffer("out")?;
    let input = b.buffer("x")?;
    (Range::of(out) == Range::of(input)).then(|| Range::of(out))
}

fn add_scale_build<'a>(
    a: DispatchRef<'a>,
    b: DispatchRef<'a>,
) -> onepass::Result<DispatchSpec<'a>> {
    let missing = || onepass::Error::InvalidArgument("add_scale: unexpected arguments".into());
    let Some(Scalar::F32(s)) = b.scalar("s") else {
        return Err(missing());
    };
    let (x, y, out) = (
        a.buffer("a").ok_or_else(missing)?,
        a.buffer("b").ok_or_else(missing)?,
        b.buffer("out").ok_or_else(missing)?,
    );
    onepass::ops::custom::custom_spec(
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

fn add_scale_rule() -> FusionRule {
    FusionRule::pair(
        "props_add_scale",
        OpKind::Custom { reorderable: true },
        OpKind::Custom { reorderable: true },
        add_scale_intermediate,
        add_scale_build,
    )
}

/// One step of a random program over 4 slots of one allocation (each `LEN` floats): an add of
/// two slots into a third, optionally followed by a scale of that result into a fourth.
type Step = (usize, usize, usize, Option<(usize, f32)>);

const SLOTS: usize = 6;
const LEN: usize = 40;

fn step() -> impl Strategy<Value = Step> {
    (
        0..SLOTS,
        0..SLOTS,
        0..SLOTS,
        prop::option::of((0..SLOTS, 0.5f32..1.5)),
    )
}

/// Runs the program; `fuse` applies the test rule before placing barriers. Returns the bits.
fn run_program(init: &[f32], steps: &[Step], fuse: bool) -> (Vec<u32>, usize) {
    let dev = Device::cpu(2).expect("cpu");
    // The fused kernel is never pushed through a session, so register it by hand.
    onepass::ops::custom::register(&dev, &ADD_SCALE).expect("register");
    let whole = dev.upload(init, &[SLOTS * LEN]).expect("upload");
    let slot = |i: usize| whole.view(i * LEN * 4, DType::F32, &[LEN]).expect("view");
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    for &(a, b, out, scale) in steps {
        if out == a || out == b {
            continue;
        }
        let (sa, sb, so) = (slot(a), slot(b), slot(out));
        s.custom(
            &ADD,
            vec![Arg::read(&sa), Arg::read(&sb), Arg::write(&so)],
            Grid::new(1, 1),
        )
        .expect("add");
        if let Some((dst, k)) = scale {
            if dst != out {
                let sd = slot(dst);
                s.custom(
                    &SCALE,
                    vec![Arg::read(&so), Arg::write(&sd), Arg::f32(k)],
                    Grid::new(1, 1),
                )
                .expect("scale");
            }
        }
    }
    let mut g = s.into_graph().expect("graph");
    let fusions = if fuse {
        passes::fuse(&mut g, &[add_scale_rule()])
    } else {
        0
    };
    passes::reorder(&mut g, passes::DEFAULT_LOOKAHEAD);
    passes::place_barriers(&mut g);
    exec.run(&g, true).expect("run");
    let out = dev.download::<f32>(&whole).expect("download");
    (out.iter().map(|v| v.to_bits()).collect(), fusions)
}

#[test]
fn fusion_with_a_test_rule_preserves_results_bitwise() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        ..config()
    });
    let strategy = (prop::collection::vec(step(), 1..120), any::<u64>());
    let total_fusions = std::cell::Cell::new(0);
    runner
        .run(&strategy, |(steps, seed)| {
            let init: Vec<f32> = (0..SLOTS * LEN)
                .map(|i| {
                    let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
                    0.25 + (h >> 40) as f32 / (1u64 << 24) as f32
                })
                .collect();
            let (plain, _) = run_program(&init, &steps, false);
            let (fused, fusions) = run_program(&init, &steps, true);
            total_fusions.set(total_fusions.get() + fusions);
            prop_assert_eq!(plain, fused);
            Ok(())
        })
        .expect("fusion changed a result");
    // The cases must exercise the rule, not only the refusals.
    assert!(total_fusions.get() > 0, "no case fused anything");
}
