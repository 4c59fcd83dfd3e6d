//! Tests of the flat graph: views kept alive by the graph, view indices shared across graphs,
//! the recorded ranges against a [`Dispatch`]'s, and errors that record nothing.

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
            let (reads, writes) = g.range_views_at(h);
            let (rr, wr) = g.ranges_at(h);
            for (v, r) in reads.iter().chain(writes).zip(rr.iter().chain(wr)) {
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
