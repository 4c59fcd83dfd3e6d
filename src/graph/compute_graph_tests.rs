//! Tests of the flat graph: views kept alive by the graph, view indices shared across graphs,
//! the recorded ranges against a [`Dispatch`]'s, errors that record nothing, and a fusion rule that
//! names a buffer the graph lacks.

use super::*;
use crate::backend::{DType, Device};
use crate::graph::passes;
use crate::ops::elementwise;
use crate::testutil::random_f32;
use crate::Executor;

const N: usize = 64;

fn upload(dev: &Device, seed: u64) -> Buffer {
    dev.upload(&random_f32(N, 2.0, seed), &[N]).expect("upload")
}

/// `out = (a + b) * c`, recorded from borrowed arguments into `g`.
fn record_add_mul(g: &mut ComputeGraph, a: &Buffer, b: &Buffer, c: &Buffer, t: &Buffer) {
    let out = t;
    for d in [
        elementwise::add(a, b, out).expect("add"),
        elementwise::mul(out, c, out).expect("mul"),
    ] {
        let args: Vec<ArgRef<'_>> = d.args().iter().map(ArgRef::from).collect();
        g.record(d.kernel(), &args, d.grid(), d.op())
            .expect("record");
    }
}

#[test]
fn given_dropped_buffers_when_the_graph_runs_should_still_read_them() {
    let dev = Device::cpu(1).expect("cpu");
    let out = dev.alloc(DType::F32, &[N]).expect("alloc");
    let (av, bv, cv) = (
        random_f32(N, 2.0, 1),
        random_f32(N, 2.0, 2),
        random_f32(N, 2.0, 3),
    );
    let mut g = ComputeGraph::new();
    {
        // The inputs live only in this block (views of fresh allocations): after it, the graph
        // holds the only references.
        let a = dev.upload(&av, &[N]).expect("upload");
        let b = dev.upload(&bv, &[N]).expect("upload");
        let c = dev.upload(&cv, &[N]).expect("upload");
        record_add_mul(&mut g, &a, &b, &c, &out);
    }
    let clone = g.clone();
    drop(g);
    let mut clone = clone;
    passes::place_barriers(&mut clone);
    Executor::new(dev.clone()).run(&clone, false).expect("run");
    let got = dev.download::<f32>(&out).expect("download");
    for i in 0..N {
        let want = (av[i] + bv[i]) * cv[i];
        assert_eq!(got[i], want, "element {i}");
    }
}

#[test]
fn given_views_used_again_when_recorded_should_be_taken_in_once() {
    let dev = Device::cpu(1).expect("cpu");
    let (a, b, c) = (upload(&dev, 4), upload(&dev, 5), upload(&dev, 6));
    let t = dev.alloc(DType::F32, &[N]).expect("alloc");
    let mut g = ComputeGraph::new();
    record_add_mul(&mut g, &a, &b, &c, &t);
    record_add_mul(&mut g, &a, &b, &c, &t);
    assert_eq!(g.view_count(), 4, "a, b, c and t, each once");
    // A clone of `t` is the same view; a new view of the same bytes is another one.
    let t_again = t.view(0, DType::F32, &[N]).expect("view");
    record_add_mul(&mut g, &a, &b, &c, &t.clone());
    assert_eq!(g.view_count(), 4);
    record_add_mul(&mut g, &a, &b, &c, &t_again);
    assert_eq!(g.view_count(), 5);
}

#[test]
fn given_two_graphs_recording_the_same_views_in_turn_should_each_keep_their_own_indices() {
    let dev = Device::cpu(1).expect("cpu");
    let bufs: Vec<Buffer> = (0..6).map(|i| upload(&dev, 10 + i)).collect();
    let t = dev.alloc(DType::F32, &[N]).expect("alloc");
    let (mut g1, mut g2) = (ComputeGraph::new(), ComputeGraph::new());
    let mut owned = Vec::new();
    // Interleaved, in different orders, so each view's stamp flips between the two graphs.
    for round in 0..3 {
        let (x, y, z) = (&bufs[round], &bufs[round + 1], &bufs[round + 2]);
        record_add_mul(&mut g1, x, y, z, &t);
        record_add_mul(&mut g2, z, x, y, &t);
        owned.push(elementwise::add(x, y, &t).expect("add"));
        owned.push(elementwise::mul(&t, z, &t).expect("mul"));
    }
    let reference: Vec<_> = owned.iter().map(|d| d.as_view()).collect();
    let mut ok = 0;
    for (got, want) in g1.dispatches().zip(&reference) {
        assert_eq!(got.kernel(), want.kernel());
        assert_eq!(got.reads(), want.reads());
        assert_eq!(got.writes(), want.writes());
        ok += 1;
    }
    assert_eq!(ok, 6);
    // g2 recorded (z, x, y): its reads are the reference's with the operands rotated.
    for (i, d) in g2.dispatches().enumerate() {
        let round = i / 2;
        let z = Range::of(&bufs[round + 2]);
        if i % 2 == 0 {
            assert_eq!(d.reads()[0], z, "dispatch {i}");
        }
    }
    // The index table agrees with the ranges for every recorded range.
    for g in [&g1, &g2] {
        for &h in g.order() {
            let (_, [a, _, c]) = g.span_at(h);
            let views = &g.all_range_views()[a as usize..c as usize];
            let (rr, wr) = g.ranges_at(h);
            for (v, r) in views.iter().zip(rr.iter().chain(wr)) {
                assert_eq!(g.view_ranges()[*v as usize], *r);
            }
        }
    }
}

#[test]
fn given_a_written_argument_overlapping_another_when_recorded_should_fail_and_record_nothing() {
    let dev = Device::cpu(1).expect("cpu");
    let a = upload(&dev, 20);
    let half = a.view(0, DType::F32, &[N / 2]).expect("view");
    let mut g = ComputeGraph::new();
    let err = g
        .record(
            KernelId("copy_f32"),
            &[ArgRef::read(&a), ArgRef::write(&half)],
            Grid::new(1, 1),
            OpKind::Copy,
        )
        .expect_err("overlap");
    assert!(
        err.to_string()
            .contains("written argument 1 overlaps argument 0"),
        "{err}"
    );
    assert!(g.is_empty());
    assert_eq!(g.dispatches().count(), 0);
    let b = upload(&dev, 21);
    let t = dev.alloc(DType::F32, &[N]).expect("alloc");
    record_add_mul(&mut g, &a, &b, &b, &t);
    assert_eq!(g.dispatch_count(), 2);
    let d = g.dispatches().next().expect("dispatch");
    assert_eq!(d.args().len(), 4, "a, b, out and the length");
}

#[test]
fn given_a_graph_moved_to_another_thread_when_dropped_there_should_release_its_views() {
    let dev = Device::cpu(1).expect("cpu");
    let (a, b) = (upload(&dev, 30), upload(&dev, 31));
    let t = dev.alloc(DType::F32, &[N]).expect("alloc");
    let mut g = ComputeGraph::new();
    record_add_mul(&mut g, &a, &b, &b, &t);
    let held = std::sync::Arc::downgrade(a.allocation());
    drop(a);
    std::thread::spawn(move || drop(g)).join().expect("thread");
    assert!(
        held.upgrade().is_none(),
        "the graph was the last holder of a's allocation"
    );
}

/// The side buffer of [`side_rule`] (a rule is plain functions, so it names it through a static).
static SIDE: std::sync::OnceLock<Buffer> = std::sync::OnceLock::new();

/// A rule that fuses `copy_f32` then a `mul_f32` reading the copy into a kernel that also writes
/// a side buffer no recorded dispatch names (the rule's own scratch).
fn side_rule() -> passes::FusionRule {
    passes::FusionRule {
        name: "test_side",
        first: OpKind::Copy,
        second: OpKind::Mul,
        intermediate: |a, b| {
            let w = *a.writes().first()?;
            b.reads().contains(&w).then_some(w)
        },
        build: |a, b| {
            let missing = || Error::InvalidArgument("test_side: unexpected arguments".into());
            let (src, _) = a.buffer_arg(0).ok_or_else(missing)?;
            let (out, _) = b.buffer_arg(2).ok_or_else(missing)?;
            let side = SIDE.get().ok_or_else(missing)?;
            DispatchSpec::new(
                KernelId("copy_mul_side"),
                &[ArgRef::read(src), ArgRef::write(out), ArgRef::write(side)],
                Grid::new(1, 1),
                OpKind::Elementwise,
            )
        },
    }
}

#[test]
fn given_a_rule_naming_a_buffer_the_graph_lacks_when_fused_should_take_it_in() {
    let dev = Device::cpu(1).expect("cpu");
    let (x, w) = (upload(&dev, 40), upload(&dev, 41));
    let (t, out) = (
        dev.alloc(DType::F32, &[N]).expect("alloc"),
        dev.alloc(DType::F32, &[N]).expect("alloc"),
    );
    let side = SIDE.get_or_init(|| dev.alloc(DType::F32, &[N]).expect("alloc"));
    let mut g = ComputeGraph::new();
    let copy = [ArgRef::read(&x), ArgRef::write(&t)];
    g.record(KernelId("copy_f32"), &copy, Grid::new(1, 1), OpKind::Copy)
        .expect("copy");
    let mul = [ArgRef::read(&t), ArgRef::read(&w), ArgRef::write(&out)];
    g.record(KernelId("mul_f32"), &mul, Grid::new(1, 1), OpKind::Mul)
        .expect("mul");
    // `t` is overwritten in full afterwards, so it is dead once fused.
    let refill = [ArgRef::read(&x), ArgRef::write(&t)];
    g.record(KernelId("copy_f32"), &refill, Grid::new(1, 1), OpKind::Copy)
        .expect("copy");
    assert_eq!(g.view_count(), 4);
    assert_eq!(passes::fuse(&mut g, &[side_rule()]), 1);
    assert_eq!(g.view_count(), 5, "the side buffer is taken in");
    let fused = g.dispatches().next().expect("fused");
    assert_eq!(fused.kernel(), KernelId("copy_mul_side"));
    assert_eq!(fused.reads(), &[Range::of(&x)]);
    assert_eq!(fused.writes(), &[Range::of(&out), Range::of(side)]);
    let (b, access) = fused.buffer_arg(2).expect("side arg");
    assert!(b.same_view(side) && access == Access::Write);
}
