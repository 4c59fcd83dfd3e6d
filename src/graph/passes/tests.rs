//! Unit tests of the passes on synthetic dispatches: buffers from a CPU device, any kernel name,
//! each dispatch tagged by a trailing `u32` scalar so the final order can be asserted.

use super::*;
use crate::backend::{Buffer, DType, Device};
use crate::error::Result;
use crate::graph::synthetic::untyped_kernel;
use crate::graph::{
    Arg, ArgRef, ComputeGraph, Dispatch, DispatchRef, DispatchSpec, Grid, Node, OpKind, Range,
    Scalar,
};

/// One allocation of 4096 f32 values; views by element range.
struct Mem {
    whole: Buffer,
}

impl Mem {
    fn new(dev: &Device) -> Mem {
        Mem {
            whole: dev.alloc(DType::F32, &[4096]).expect("alloc"),
        }
    }

    fn view(&self, start: usize, len: usize) -> Buffer {
        self.whole
            .view(start * 4, DType::F32, &[len])
            .expect("view")
    }
}

fn device() -> Device {
    Device::cpu(1).expect("cpu device")
}

fn d(tag: u32, op: OpKind, reads: &[&Buffer], writes: &[&Buffer]) -> Dispatch {
    let mut args: Vec<Arg> = reads.iter().map(|b| Arg::read(b)).collect();
    args.extend(writes.iter().map(|b| Arg::write(b)));
    args.push(Arg::u32(tag));
    Dispatch::new(untyped_kernel(op), args, Grid::new(1, 1)).expect("dispatch")
}

fn tag(d: DispatchRef<'_>) -> u32 {
    match d.args().last() {
        Some(Arg::Scalar(Scalar::U32(t))) => *t,
        other => panic!("untagged dispatch: {other:?}"),
    }
}

fn order(g: &ComputeGraph) -> Vec<u32> {
    g.dispatches().map(tag).collect()
}

/// The order with `|` for barriers, e.g. "0 2 | 1".
fn layout(g: &ComputeGraph) -> String {
    g.nodes()
        .map(|n| match n {
            Node::Dispatch(d) => tag(d).to_string(),
            Node::Barrier => "|".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn graph(ds: Vec<Dispatch>) -> ComputeGraph {
    let mut g = ComputeGraph::new();
    for x in ds {
        g.push(x);
    }
    g
}

const EW: OpKind = OpKind::Elementwise;
const ATT: OpKind = OpKind::Attention;

// ---------------------------------------------------------------- reorder

#[test]
fn given_an_independent_dispatch_after_a_dependency_when_reordered_should_join_the_first_group() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y, z) = (m.view(0, 16), m.view(16, 16), m.view(32, 16));
    // 0 writes x; 1 reads x (conflict); 2 writes z, independent of both.
    let mut g = graph(vec![
        d(0, EW, &[], &[&x]),
        d(1, EW, &[&x], &[&y]),
        d(2, EW, &[], &[&z]),
    ]);
    let moved = reorder(&mut g, DEFAULT_LOOKAHEAD);
    assert_eq!(order(&g), vec![0, 2, 1]);
    assert_eq!(moved, 2);
    assert_eq!(place_barriers(&mut g), 1);
    assert_eq!(layout(&g), "0 2 | 1");
    assert_eq!(g.group_sizes(), vec![2, 1]);
}

#[test]
fn given_a_candidate_that_conflicts_with_a_skipped_dispatch_when_reordered_should_stay_behind_it() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y, w) = (m.view(0, 16), m.view(16, 16), m.view(48, 16));
    // 2 reads y, which the skipped 1 writes: it may not pass 1.
    let mut g = graph(vec![
        d(0, EW, &[], &[&x]),
        d(1, EW, &[&x], &[&y]),
        d(2, EW, &[&y], &[&w]),
    ]);
    assert_eq!(reorder(&mut g, DEFAULT_LOOKAHEAD), 0);
    assert_eq!(order(&g), vec![0, 1, 2]);
}

#[test]
fn given_a_candidate_that_conflicts_with_the_group_when_reordered_should_not_move() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y, part_of_x) = (m.view(0, 16), m.view(16, 16), m.view(8, 4));
    // 2 overwrites part of x, which the group (0) writes: write-after-write.
    let mut g = graph(vec![
        d(0, EW, &[], &[&x]),
        d(1, EW, &[&x], &[&y]),
        d(2, EW, &[], &[&part_of_x]),
    ]);
    reorder(&mut g, DEFAULT_LOOKAHEAD);
    assert_eq!(order(&g), vec![0, 1, 2]);
}

#[test]
fn given_a_non_reorderable_dispatch_in_the_window_when_reordered_should_stop_the_lookahead() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y, q, z) = (
        m.view(0, 16),
        m.view(16, 16),
        m.view(32, 16),
        m.view(64, 16),
    );
    // 3 is independent but lies beyond the attention (2): it may not pass it.
    let mut g = graph(vec![
        d(0, EW, &[], &[&x]),
        d(1, EW, &[&x], &[&y]),
        d(2, ATT, &[], &[&q]),
        d(3, EW, &[], &[&z]),
    ]);
    assert_eq!(reorder(&mut g, DEFAULT_LOOKAHEAD), 0);
    assert_eq!(order(&g), vec![0, 1, 2, 3]);
}

#[test]
fn given_a_conflicting_non_reorderable_dispatch_when_reordered_should_not_pull_later_ones_before_it(
) {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, q, z) = (m.view(0, 16), m.view(32, 16), m.view(64, 16));
    // The attention (1) conflicts with 0; 2 is independent, but pulling it would move it before 1.
    let mut g = graph(vec![
        d(0, EW, &[], &[&x]),
        d(1, ATT, &[&x], &[&q]),
        d(2, EW, &[], &[&z]),
    ]);
    assert_eq!(reorder(&mut g, DEFAULT_LOOKAHEAD), 0);
    assert_eq!(order(&g), vec![0, 1, 2]);
    assert_eq!(place_barriers(&mut g), 1);
    assert_eq!(layout(&g), "0 | 1 2");
}

#[test]
fn given_a_non_conflicting_non_reorderable_dispatch_when_reordered_should_keep_its_place() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y, q, z) = (
        m.view(0, 16),
        m.view(16, 16),
        m.view(32, 16),
        m.view(64, 16),
    );
    let mut g = graph(vec![
        d(0, EW, &[], &[&x]),
        d(1, ATT, &[], &[&q]),
        d(2, EW, &[&x], &[&y]),
        d(3, EW, &[], &[&z]),
    ]);
    reorder(&mut g, DEFAULT_LOOKAHEAD);
    // 3 joins the group of 0 and 1 but stays after the attention.
    assert_eq!(order(&g), vec![0, 1, 3, 2]);
}

#[test]
fn given_a_lookahead_window_when_reordered_should_look_no_further() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y) = (m.view(0, 16), m.view(16, 16));
    let fillers: Vec<Buffer> = (0..4).map(|i| m.view(100 + 16 * i, 16)).collect();
    let build = || {
        let mut ds = vec![d(0, EW, &[], &[&x]), d(1, EW, &[&x], &[&y])];
        for (i, f) in fillers.iter().enumerate() {
            ds.push(d(2 + i as u32, EW, &[], &[f]));
        }
        graph(ds)
    };
    let mut g = build();
    reorder(&mut g, 1);
    assert_eq!(order(&g), vec![0, 2, 1, 3, 4, 5]);
    let mut g = build();
    reorder(&mut g, 2);
    assert_eq!(order(&g), vec![0, 2, 3, 1, 4, 5]);
    let mut g = build();
    reorder(&mut g, DEFAULT_LOOKAHEAD);
    assert_eq!(order(&g), vec![0, 2, 3, 4, 5, 1]);
    let mut g = build();
    assert_eq!(reorder(&mut g, 0), 0);
    assert_eq!(order(&g), vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn given_barriers_when_reordered_should_drop_them() {
    let dev = device();
    let m = Mem::new(&dev);
    let (x, y) = (m.view(0, 16), m.view(16, 16));
    let mut g = graph(vec![d(0, EW, &[], &[&x])]);
    g.push_barrier();
    g.push(d(1, EW, &[], &[&y]));
    reorder(&mut g, DEFAULT_LOOKAHEAD);
    assert_eq!(g.barrier_count(), 0);
    assert_eq!(order(&g), vec![0, 1]);
}

// ---------------------------------------------------------------- barriers and split

#[test]
fn given_a_dependency_chain_when_placing_barriers_should_separate_every_step() {
    let dev = device();
    let m = Mem::new(&dev);
    let (a, b, c) = (m.view(0, 16), m.view(16, 16), m.view(32, 16));
    let mut g = graph(vec![
        d(0, EW, &[], &[&a]),
        d(1, EW, &[&a], &[&b]),
        d(2, EW, &[&b], &[&c]),
        d(3, EW, &[], &[&a.view(0, DType::F32, &[4]).expect("view")]),
    ]);
    // 3 overwrites part of a, which 1 read; 1 is already behind a barrier, so 3 joins 2's group.
    g.push_barrier();
    g.push_barrier();
    assert_eq!(place_barriers(&mut g), 2);
    assert_eq!(layout(&g), "0 | 1 | 2 3");
}

#[test]
fn given_reads_only_when_placing_barriers_should_place_none() {
    let dev = device();
    let m = Mem::new(&dev);
    let shared = m.view(0, 64);
    let outs: Vec<Buffer> = (0..5).map(|i| m.view(100 + 16 * i, 16)).collect();
    let ds = (0..5)
        .map(|i| d(i as u32, EW, &[&shared], &[&outs[i]]))
        .collect();
    let mut g = graph(ds);
    assert_eq!(place_barriers(&mut g), 0);
    assert_eq!(g.group_sizes(), vec![5]);
}

#[test]
fn given_touching_views_when_placing_barriers_should_place_none() {
    let dev = device();
    let m = Mem::new(&dev);
    let (lo, hi) = (m.view(0, 16), m.view(16, 16));
    let mut g = graph(vec![d(0, EW, &[], &[&lo]), d(1, EW, &[], &[&hi])]);
    assert_eq!(place_barriers(&mut g), 0);
}

#[test]
fn given_graph_sizes_when_splitting_should_cut_after_max_64_or_a_tenth() {
    let dev = device();
    let m = Mem::new(&dev);
    let x = m.view(0, 16);
    let build = |n: u32, barrier_every: u32| {
        let mut g = ComputeGraph::new();
        for i in 0..n {
            g.push(d(i, EW, &[&x], &[&m.view(32 + (i as usize % 64) * 8, 8)]));
            if barrier_every > 0 && i % barrier_every == 0 {
                g.push_barrier();
            }
        }
        g
    };
    let dispatches_before = |g: &ComputeGraph, cut: usize| {
        g.nodes_in(0..cut)
            .filter(|n| n.as_dispatch().is_some())
            .count()
    };
    let g = build(100, 0);
    assert_eq!(split_index(&g), 64);
    let g = build(1000, 0);
    assert_eq!(split_index(&g), 100);
    let g = build(1000, 7);
    let cut = split_index(&g);
    assert_eq!(dispatches_before(&g, cut), 100);
    assert!(g
        .nodes()
        .nth(cut - 1)
        .and_then(|n| n.as_dispatch())
        .is_some());
    let g = build(30, 0);
    assert_eq!(split_index(&g), g.nodes().len());
    assert_eq!(split_index(&ComputeGraph::new()), 0);
}

// ---------------------------------------------------------------- fuse

/// A test rule: a norm followed by a multiply that reads the norm's output becomes one dispatch
/// reading the norm's inputs and the multiply's other inputs, writing the multiply's output.
fn norm_mul_intermediate(a: DispatchRef<'_>, b: DispatchRef<'_>) -> Option<Range> {
    let out = a.writes().first()?;
    b.reads().contains(&out).then_some(out)
}

fn norm_mul_build<'a>(a: DispatchRef<'a>, b: DispatchRef<'a>) -> Result<DispatchSpec<'a>> {
    let out = a
        .writes()
        .first()
        .ok_or(crate::Error::InvalidArgument("no write".into()))?;
    let mut args: Vec<ArgRef<'a>> = Vec::new();
    for arg in a.args().iter().chain(b.args()) {
        if let Arg::Buffer(buf, _) = arg {
            if Range::of(buf) != out {
                args.push(ArgRef::from(arg));
            }
        }
    }
    args.push(ArgRef::u32(tag(a) * 100 + tag(b)));
    DispatchSpec::new(untyped_kernel(OpKind::RmsNormMul), &args, Grid::new(1, 1))
}

fn rules() -> Vec<FusionRule> {
    vec![FusionRule::pair(
        "test_norm_mul",
        OpKind::RmsNorm,
        OpKind::Mul,
        norm_mul_intermediate,
        norm_mul_build,
    )]
}

struct FuseBufs {
    x: Buffer,
    t: Buffer,
    w: Buffer,
    y: Buffer,
    z: Buffer,
}

fn fuse_bufs(m: &Mem) -> FuseBufs {
    FuseBufs {
        x: m.view(0, 16),
        t: m.view(16, 16),
        w: m.view(32, 16),
        y: m.view(48, 16),
        z: m.view(64, 16),
    }
}

#[test]
fn given_norm_mul_when_the_intermediate_is_overwritten_later_should_fuse() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
        d(3, EW, &[&b.y], &[&b.t]),
        d(4, EW, &[&b.t], &[&b.z]),
    ]);
    g.push_barrier();
    assert_eq!(fuse(&mut g, &rules()), 1);
    assert_eq!(order(&g), vec![102, 3, 4]);
    assert_eq!(g.barrier_count(), 0);
    let first = g.dispatches().next().expect("a dispatch");
    assert_eq!(first.op(), OpKind::RmsNormMul);
    assert!(!first.reads().contains(&Range::of(&b.t)));
}

#[test]
fn given_norm_mul_when_the_intermediate_is_read_later_should_not_fuse() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
        d(
            3,
            EW,
            &[&b.t.view(4, DType::F32, &[1]).expect("view")],
            &[&b.z],
        ),
        d(4, EW, &[], &[&b.t]),
    ]);
    assert_eq!(fuse(&mut g, &rules()), 0);
    assert_eq!(order(&g), vec![1, 2, 3, 4]);
}

#[test]
fn given_norm_mul_when_the_intermediate_is_never_overwritten_should_not_fuse() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
        d(3, EW, &[&b.y], &[&b.z]),
    ]);
    assert_eq!(fuse(&mut g, &rules()), 0);
    assert_eq!(g.dispatch_count(), 3);
}

#[test]
fn given_norm_mul_when_only_part_is_overwritten_before_a_read_should_not_fuse() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let half = b.t.view(0, DType::F32, &[8]).expect("view");
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
        d(3, EW, &[], &[&half]),
        d(4, EW, &[&b.t], &[&b.z]),
        d(5, EW, &[], &[&b.t]),
    ]);
    assert_eq!(fuse(&mut g, &rules()), 0);
}

#[test]
fn given_an_independent_dispatch_between_norm_and_mul_when_fusing_should_fuse_past_it() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(9, EW, &[], &[&b.z]),
        d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
        d(3, EW, &[], &[&b.t]),
    ]);
    assert_eq!(fuse(&mut g, &rules()), 1);
    // The fused dispatch takes the place of the mul, the pattern's last dispatch.
    assert_eq!(order(&g), vec![9, 102, 3]);
}

#[test]
fn given_a_write_of_the_norms_input_between_norm_and_mul_when_fusing_should_not_fuse() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    for between in [
        d(9, EW, &[], &[&b.x]),
        d(9, EW, &[&b.t], &[&b.z]),
        d(9, EW, &[], &[&b.t.view(0, DType::F32, &[1]).expect("view")]),
    ] {
        let mut g = graph(vec![
            d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
            between,
            d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
            d(3, EW, &[], &[&b.t]),
        ]);
        assert_eq!(fuse(&mut g, &rules()), 0);
        assert_eq!(order(&g), vec![1, 9, 2, 3]);
    }
}

#[test]
fn given_mul_that_does_not_read_the_norm_output_when_fusing_should_not_fuse() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(2, OpKind::Mul, &[&b.x, &b.w], &[&b.y]),
        d(3, EW, &[], &[&b.t]),
    ]);
    assert_eq!(fuse(&mut g, &rules()), 0);
}

#[test]
fn given_two_fusable_pairs_when_fusing_should_fuse_both_and_keep_the_rest() {
    let dev = device();
    let m = Mem::new(&dev);
    let b = fuse_bufs(&m);
    let mut g = graph(vec![
        d(1, OpKind::RmsNorm, &[&b.x], &[&b.t]),
        d(2, OpKind::Mul, &[&b.t, &b.w], &[&b.y]),
        d(3, OpKind::RmsNorm, &[&b.y], &[&b.t]),
        d(4, OpKind::Mul, &[&b.t, &b.w], &[&b.z]),
        d(5, EW, &[&b.z], &[&b.t]),
    ]);
    assert_eq!(fuse(&mut g, &rules()), 2);
    assert_eq!(order(&g), vec![102, 304, 5]);
    assert_eq!(fuse(&mut g, &[]), 0);
    assert_eq!(order(&g), vec![102, 304, 5]);
}

// ---------------------------------------------------------------- the walk against the seeds'

/// Random dispatches over aliased views of three allocations (the third never written), a
/// quarter of them not reorderable.
fn random_dispatches(seed: u64, n: usize) -> Vec<Dispatch> {
    use rand::RngExt;
    let dev = device();
    let allocs: Vec<_> = (0..3)
        .map(|_| dev.alloc(DType::U8, &[256]).expect("alloc"))
        .collect();
    let mut rng = crate::testutil::rng(seed);
    let mut out = Vec::new();
    while out.len() < n {
        let mut args = Vec::new();
        for _ in 0..rng.random_range(1..5) {
            let a = rng.random_range(0..3usize);
            let start = rng.random_range(0..256usize);
            let len = rng.random_range(0..=(256 - start).min(48));
            let view = allocs[a].view(start, DType::U8, &[len]).expect("view");
            let access = if a == 2 { 0 } else { rng.random_range(0..3) };
            args.push(match access {
                0 => Arg::read(&view),
                1 => Arg::write(&view),
                _ => Arg::read_write(&view),
            });
        }
        let op = if rng.random_range(0..4) == 0 { ATT } else { EW };
        args.push(Arg::u32(out.len() as u32));
        if let Ok(d) = Dispatch::new(untyped_kernel(op), args, Grid::new(1, 1)) {
            out.push(d);
        }
    }
    out
}

#[test]
fn given_random_graphs_when_walked_should_match_the_seeds_walk_exactly() {
    use crate::graph::footprint::Footprint;
    for seed in 0..60 {
        let ds = random_dispatches(seed, 10 + 4 * seed as usize);
        let g = graph(ds);
        let fp = Footprint::new(&g);
        for lookahead in [1, 2, 3, 8, 64, usize::MAX] {
            let fast = reorder::greedy(&fp, lookahead);
            let seeds = reorder::greedy_reference(&fp, lookahead);
            assert_eq!(
                fast.order, seeds.order,
                "seed {seed}, lookahead {lookahead}"
            );
            assert_eq!(fast.cuts, seeds.cuts, "seed {seed}, lookahead {lookahead}");
        }
    }
}

#[test]
fn given_random_graphs_when_reordered_should_place_the_same_barriers_as_a_fresh_pass() {
    for seed in 0..30 {
        let ds = random_dispatches(seed + 1000, 80);
        let mut walked = graph(ds.clone());
        let rules: [FusionRule; 0] = [];
        let done = optimize(&mut walked, &rules, &[], DEFAULT_LOOKAHEAD);
        let mut fresh = walked.clone();
        assert_eq!(place_barriers(&mut fresh), done.barriers, "seed {seed}");
        assert_eq!(layout(&fresh), layout(&walked), "seed {seed}");
    }
}

#[test]
fn given_random_graphs_when_counting_barriers_in_order_should_match_a_range_set() {
    use crate::graph::RangeSet;
    for seed in 0..40 {
        let ds = random_dispatches(seed + 2000, 60);
        let mut set = RangeSet::new();
        let mut expected = 0;
        for d in &ds {
            if set.conflicts(d.reads(), d.writes()) {
                expected += 1;
                set.clear();
            }
            set.add(d.reads(), d.writes());
        }
        let mut g = graph(ds);
        let before = layout(&g);
        assert_eq!(program_order_barriers(&mut g), expected, "seed {seed}");
        assert_eq!(
            layout(&g),
            before,
            "seed {seed}: the graph should be left as it was"
        );
    }
}

/// One random step over a pool of views (reused across steps, as a model's buffers are), with
/// a few fresh views when `fresh` is set; norms followed by multiplies so that fusion has pairs
/// to try. Allocation 2 is written only when `write_all` is set.
fn random_step(
    seed: u64,
    pool: &[(usize, Buffer)],
    allocs: &[Buffer],
    fresh: bool,
    write_all: bool,
) -> Vec<Dispatch> {
    use rand::RngExt;
    let mut rng = crate::testutil::rng(seed);
    let mut out = Vec::new();
    while out.len() < 60 {
        if rng.random_range(0..5) == 0 {
            // A norm and a multiply reading its output (views of allocation 0, 1 apart).
            let v = |k: usize| &pool[(3 * k) % pool.len().min(12)].1;
            let k = rng.random_range(0..4usize);
            let (x, t, w, y) = (v(k), v(k + 1), v(k + 2), v(k + 3));
            let tag = out.len() as u32;
            out.push(d(tag, OpKind::RmsNorm, &[x], &[t]));
            out.push(d(tag + 1, OpKind::Mul, &[t, w], &[y]));
            continue;
        }
        let mut args = Vec::new();
        for _ in 0..rng.random_range(1..4) {
            let (a, view) = if fresh && rng.random_range(0..8) == 0 {
                let a = rng.random_range(0..3usize);
                let start = rng.random_range(0..224usize);
                (a, allocs[a].view(start, DType::U8, &[32]).expect("view"))
            } else {
                pool[rng.random_range(0..pool.len())].clone()
            };
            let access = if a == 2 && !write_all {
                0
            } else {
                rng.random_range(0..3)
            };
            args.push(match access {
                0 => Arg::read(&view),
                1 => Arg::write(&view),
                _ => Arg::read_write(&view),
            });
        }
        let op = [EW, EW, ATT, OpKind::RmsNorm, OpKind::Mul][rng.random_range(0..5usize)];
        args.push(Arg::u32(out.len() as u32));
        if let Ok(d) = Dispatch::new(untyped_kernel(op), args, Grid::new(1, 1)) {
            out.push(d);
        }
    }
    out
}

/// `d` over new views of the same bytes of `allocs`.
fn twin(d: &Dispatch, allocs: &[Buffer]) -> Dispatch {
    let args: Vec<Arg> = d
        .args()
        .iter()
        .map(|a| match a {
            Arg::Buffer(b, access) => {
                let whole = allocs
                    .iter()
                    .find(|w| w.alloc_id() == b.alloc_id())
                    .expect("one of the allocations");
                let r = b.byte_range();
                let view = whole.view(r.start, DType::U8, &[r.len()]).expect("view");
                Arg::Buffer(view, *access)
            }
            Arg::Scalar(s) => Arg::Scalar(*s),
        })
        .collect();
    Dispatch::new(d.kernel(), args, d.grid()).expect("the same checks pass")
}

#[test]
fn given_a_graph_recorded_again_over_kept_views_when_optimized_should_match_a_fresh_graph() {
    use rand::RngExt;
    let dev = device();
    let allocs: Vec<_> = (0..3)
        .map(|_| dev.alloc(DType::U8, &[256]).expect("alloc"))
        .collect();
    let mut rng = crate::testutil::rng(77);
    // Disjoint views at first, with fresh views in the first steps; aliased views of allocation
    // 2 join the pool at step 20, and allocation 2 is written from step 30 (so the overlaps the
    // graph kept must be computed again then).
    let mut pool: Vec<(usize, Buffer)> = (0..12)
        .map(|k| {
            (
                k % 3,
                allocs[k % 3]
                    .view(k / 3 * 32, DType::U8, &[32])
                    .expect("view"),
            )
        })
        .collect();
    let mut kept = ComputeGraph::new();
    let (mut fusions, mut kept_views) = (0, 0);
    for step in 0..40u64 {
        if step == 20 {
            for _ in 0..4 {
                let start = rng.random_range(0..200usize);
                pool.push((2, allocs[2].view(start, DType::U8, &[40]).expect("view")));
            }
        }
        let seed = step % 7 + 100 * (step / 10);
        let ds = random_step(seed, &pool, &allocs, step < 15, step >= 30);
        // The reference runs over twins of the views (new view objects of the same bytes), so
        // that only `kept` ever takes the pool's views in.
        let twins: Vec<Dispatch> = ds.iter().map(|x| twin(x, &allocs)).collect();
        kept.clear();
        for x in &ds {
            kept.push_ref(x.as_view());
        }
        let mut fresh = graph(twins);
        let a = optimize(&mut kept, &rules(), &[], DEFAULT_LOOKAHEAD);
        let b = optimize(&mut fresh, &rules(), &[], DEFAULT_LOOKAHEAD);
        assert_eq!(a, b, "step {step}");
        assert_eq!(layout(&kept), layout(&fresh), "step {step}");
        fusions += a.fusions;
        kept_views = kept_views.max(kept.view_count());
    }
    assert!(fusions > 0, "the steps should give fusion something to do");
    // The pool's views were taken in once and kept (fresh ones come and go).
    assert!(kept_views < 12 + 4 + 2 * 60 * 4 + 64, "{kept_views}");
}
