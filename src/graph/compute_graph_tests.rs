//! Tests of the flat graph: views kept alive by the graph, view indices shared across graphs,
//! the recorded ranges against a [`Dispatch`]'s, errors that record nothing, and a fusion rule that
//! names a buffer the graph lacks.

use super::*;
use crate::backend::{DType, Device};
use crate::error::Error;
use crate::graph::dispatch::Arg;
use crate::graph::passes;
use crate::graph::synthetic::untyped_kernel;
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
        g.record(d.kernel(), &args, d.grid()).expect("record");
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
            assert_eq!(d.reads().first(), Some(z), "dispatch {i}");
        }
    }
    // Every dispatch's ranges are its buffer arguments' (reads in argument order, then writes).
    for g in [&g1, &g2] {
        for d in g.dispatches() {
            let bufs = || {
                d.args().iter().filter_map(|a| match a {
                    Arg::Buffer(b, access) => Some((Range::of(b), *access)),
                    Arg::Scalar(_) => None,
                })
            };
            let reads: Vec<Range> = bufs().filter(|(_, a)| a.reads()).map(|(r, _)| r).collect();
            let writes: Vec<Range> = bufs().filter(|(_, a)| a.writes()).map(|(r, _)| r).collect();
            assert_eq!(d.reads(), reads[..]);
            assert_eq!(d.writes(), writes[..]);
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
            untyped_kernel(OpKind::Copy),
            &[ArgRef::read(&a), ArgRef::write(&half)],
            Grid::new(1, 1),
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
fn given_kept_overlaps_when_a_recorded_again_write_meets_a_view_should_still_fail() {
    // Recorded again over kept views, the write check takes the kept overlaps: a lone view
    // written and read by one dispatch, and a written view overlapped by another, both fail.
    let dev = Device::cpu(1).expect("cpu");
    let (a, b) = (upload(&dev, 22), upload(&dev, 23));
    let t = dev.alloc(DType::F32, &[N]).expect("alloc");
    let half = t.view(0, DType::F32, &[N / 2]).expect("view");
    let mut g = ComputeGraph::new();
    let record_step = |g: &mut ComputeGraph| {
        record_add_mul(g, &a, &b, &b, &t);
        g.record(
            untyped_kernel(OpKind::Copy),
            &[ArgRef::read(&a), ArgRef::write(&half)],
            Grid::new(1, 1),
        )
        .expect("copy");
    };
    record_step(&mut g);
    passes::optimize(&mut g, &[], &[], 64);
    g.clear();
    record_step(&mut g);
    assert!(g.kept_overlaps().is_some(), "the overlaps should be kept");
    for (args, what) in [
        (
            [ArgRef::read(&a), ArgRef::write(&a)],
            "written argument 1 overlaps argument 0",
        ),
        (
            [ArgRef::write(&b), ArgRef::read(&b)],
            "written argument 0 overlaps argument 1",
        ),
        (
            [ArgRef::read(&half), ArgRef::write(&t)],
            "written argument 1 overlaps argument 0",
        ),
    ] {
        let before = g.len();
        let err = g
            .record(untyped_kernel(OpKind::Copy), &args, Grid::new(1, 1))
            .expect_err("overlap");
        assert!(err.to_string().contains(what), "{err}");
        assert_eq!(g.len(), before);
    }
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
    passes::FusionRule::pair(
        "test_side",
        OpKind::Copy,
        OpKind::Mul,
        |a, b| {
            let w = a.writes().first()?;
            b.reads().contains(&w).then_some(w)
        },
        |a, b| {
            let missing = || Error::InvalidArgument("test_side: unexpected arguments".into());
            let (src, _) = a.buffer_arg(0).ok_or_else(missing)?;
            let (out, _) = b.buffer_arg(2).ok_or_else(missing)?;
            let side = SIDE.get().ok_or_else(missing)?;
            DispatchSpec::new(
                KernelId::of(&COPY_MUL_SIDE),
                &[ArgRef::read(src), ArgRef::write(out), ArgRef::write(side)],
                Grid::new(1, 1),
            )
        },
    )
}

/// The side rule's fused kernel.
static COPY_MUL_SIDE: KernelSig = KernelSig::untyped("copy_mul_side", OpKind::Elementwise);

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
    g.record(untyped_kernel(OpKind::Copy), &copy, Grid::new(1, 1))
        .expect("copy");
    let mul = [ArgRef::read(&t), ArgRef::read(&w), ArgRef::write(&out)];
    g.record(untyped_kernel(OpKind::Mul), &mul, Grid::new(1, 1))
        .expect("mul");
    // `t` is overwritten in full afterwards, so it is dead once fused.
    let refill = [ArgRef::read(&x), ArgRef::write(&t)];
    g.record(untyped_kernel(OpKind::Copy), &refill, Grid::new(1, 1))
        .expect("copy");
    assert_eq!(g.view_count(), 4);
    assert_eq!(passes::fuse(&mut g, &[side_rule()]), 1);
    assert_eq!(g.view_count(), 5, "the side buffer is taken in");
    let fused = g.dispatches().next().expect("fused");
    assert_eq!(fused.kernel(), KernelId::of(&COPY_MUL_SIDE));
    assert_eq!(fused.reads(), &[Range::of(&x)]);
    assert_eq!(fused.writes(), &[Range::of(&out), Range::of(side)]);
    let (b, access) = fused.buffer_arg(2).expect("side arg");
    assert!(b.same_view(side) && access == Access::Write);
}

#[test]
fn given_a_cleared_graph_when_the_step_is_recorded_again_should_match_a_fresh_one_and_keep_views() {
    let dev = Device::cpu(1).expect("cpu");
    let shape = crate::graph::synthetic::DecodeShape::SMOLLM2_135M.with_layers(3);
    let dg =
        crate::graph::synthetic::DecodeGraph::new(|t, d| dev.alloc(t, d), shape).expect("buffers");
    let rules = [crate::graph::synthetic::norm_mul_rule()];
    let fresh = dg.record().expect("record");
    let mut kept = dg.record().expect("record");
    let views = kept.view_count();
    for round in 0..3 {
        passes::optimize(&mut kept, &rules, &[], 64);
        kept.clear();
        assert!(kept.is_empty() && kept.dispatch_count() == 0);
        dg.record_into(&mut kept).expect("record");
        // The same views come back under the same indices: the table does not grow.
        assert_eq!(kept.view_count(), views, "round {round}");
        assert_eq!(kept.len(), fresh.len());
        for (a, b) in kept.dispatches().zip(fresh.dispatches()) {
            assert_eq!(a.kernel(), b.kernel());
            assert_eq!(a.reads(), b.reads());
            assert_eq!(a.writes(), b.writes());
        }
    }
    // Optimized, the graph recorded again is the fresh one, node for node.
    let mut fresh = fresh;
    assert_eq!(
        passes::optimize(&mut kept, &rules, &[], 64),
        passes::optimize(&mut fresh, &rules, &[], 64)
    );
    let (a, b) = (format!("{kept:?}"), format!("{fresh:?}"));
    assert_eq!(a, b);
}

#[test]
fn given_new_views_at_every_step_when_cleared_should_let_go_of_the_old_ones() {
    let dev = Device::cpu(1).expect("cpu");
    let whole = dev.alloc(DType::F32, &[4096]).expect("alloc");
    let mut g = ComputeGraph::new();
    let mut most = 0;
    for step in 0..200 {
        g.clear();
        // One dispatch over two views made afresh (as a caller slicing a cache at each step).
        let a = whole.view(step * 4 % 8192, DType::F32, &[4]).expect("view");
        let b = whole
            .view(8192 + step * 4 % 8192, DType::F32, &[4])
            .expect("view");
        g.record(
            untyped_kernel(OpKind::Copy),
            &[ArgRef::read(&a), ArgRef::write(&b)],
            Grid::new(1, 1),
        )
        .expect("record");
        most = most.max(g.view_count());
        // Only this step's views are named; the graph's table stays bounded.
        let d = g.dispatches().next().expect("one dispatch");
        assert_eq!(d.reads().first(), Some(Range::of(&a)));
        assert_eq!(d.writes().first(), Some(Range::of(&b)));
    }
    assert!(most <= 2 * 2 + 64 + 2, "the view table grew to {most}");
}

/// A cleared graph keeps the arguments of its last recording to record the step again without
/// reference counts; they must not outlive the views: once the graph lets go of its views, the
/// buffers only its old arguments named are freed, however short the recordings since.
#[test]
fn given_kept_arguments_when_the_graph_lets_go_of_its_views_should_release_their_buffers() {
    let dev = Device::cpu(1).expect("cpu");
    let mut g = ComputeGraph::new();
    let mut held = Vec::new();
    for _ in 0..40 {
        let (a, b) = (
            upload(&dev, 50),
            dev.alloc(DType::F32, &[N]).expect("alloc"),
        );
        g.record(
            untyped_kernel(OpKind::Copy),
            &[ArgRef::read(&a), ArgRef::write(&b), ArgRef::u32(7)],
            Grid::new(1, 1),
        )
        .expect("record");
        held.push(std::sync::Arc::downgrade(a.allocation()));
        held.push(std::sync::Arc::downgrade(b.allocation()));
    }
    let (x, y) = (
        upload(&dev, 51),
        dev.alloc(DType::F32, &[N]).expect("alloc"),
    );
    let step = [ArgRef::read(&x), ArgRef::write(&y)];
    // Two short recordings: the first still holds the 80 old views, the second lets them go.
    for _ in 0..2 {
        g.clear();
        g.record(untyped_kernel(OpKind::Copy), &step, Grid::new(1, 1))
            .expect("record");
    }
    assert_eq!(g.view_count(), 2);
    assert!(
        held.iter().all(|w| w.upgrade().is_none()),
        "an old argument still holds its allocation"
    );
    let d = g.dispatches().next().expect("one dispatch");
    assert_eq!(d.args().len(), 2);
    assert!(d.buffer_arg(0).is_some_and(|(b, _)| b.same_view(&x)));
    assert!(d.buffer_arg(1).is_some_and(|(b, _)| b.same_view(&y)));
}

#[test]
fn given_more_ranges_than_a_dispatch_may_have_when_recorded_should_fail() {
    let dev = Device::cpu(1).expect("cpu");
    let bufs: Vec<Buffer> = (0..MAX_RANGES + 1)
        .map(|_| dev.alloc(DType::F32, &[1]).expect("alloc"))
        .collect();
    let args: Vec<ArgRef<'_>> = bufs.iter().map(ArgRef::read).collect();
    let mut g = ComputeGraph::new();
    let err = g
        .record(untyped_kernel(OpKind::Copy), &args, Grid::new(1, 1))
        .expect_err("too many ranges");
    assert!(err.to_string().contains("at most 256"), "{err}");
    assert!(g.is_empty());
    let owned: Vec<Arg> = bufs.iter().map(Arg::read).collect();
    assert!(Dispatch::new(untyped_kernel(OpKind::Copy), owned, Grid::new(1, 1)).is_err());
}

/// Random argument lists over aliased views of a few allocations (views repeated, read-write
/// arguments, scalars; up to 12 arguments, so both the small path and the general one), recorded
/// into a new graph and then again over its kept views and overlaps: each list is accepted
/// exactly when [`Dispatch::new`] accepts it, with the same read and write ranges, and a rejected
/// one records nothing.
#[test]
fn given_random_aliased_arguments_when_recorded_should_pass_the_checks_of_a_dispatch() {
    use rand::RngExt;
    let dev = Device::cpu(1).expect("cpu");
    let allocs: Vec<Buffer> = (0..3)
        .map(|_| dev.alloc(DType::U8, &[256]).expect("alloc"))
        .collect();
    let mut rng = crate::testutil::rng(41);
    let pool: Vec<Buffer> = (0..10)
        .map(|_| {
            let a = rng.random_range(0..3usize);
            let start = rng.random_range(0..256usize);
            let len = rng.random_range(0..=(256 - start).min(64));
            allocs[a].view(start, DType::U8, &[len]).expect("view")
        })
        .collect();
    // Per argument: a pool view and its access (0 read, 1 write, 2 read-write), or a scalar.
    let lists: Vec<Vec<Option<(usize, u8)>>> = (0..300)
        .map(|_| {
            let n = rng.random_range(1..=12usize);
            (0..n)
                .map(|_| {
                    (rng.random_range(0..6) != 0)
                        .then(|| (rng.random_range(0..pool.len()), rng.random_range(0..3u8)))
                })
                .collect()
        })
        .collect();
    let access = [Access::Read, Access::Write, Access::ReadWrite];
    let mut g = ComputeGraph::new();
    let (mut accepted, mut rejected) = (0, 0);
    for round in 0..2 {
        g.clear();
        if round == 1 {
            assert!(g.kept_overlaps().is_some(), "the overlaps should be kept");
        }
        for (i, list) in lists.iter().enumerate() {
            let args: Vec<ArgRef<'_>> = list
                .iter()
                .map(|a| match *a {
                    Some((v, acc)) => ArgRef::Buffer(&pool[v], access[acc as usize]),
                    None => ArgRef::u32(i as u32),
                })
                .collect();
            let owned: Vec<Arg> = args
                .iter()
                .map(|a| match *a {
                    ArgRef::Buffer(b, acc) => Arg::Buffer(b.clone(), acc),
                    ArgRef::Scalar(s) => Arg::Scalar(s),
                })
                .collect();
            let want = Dispatch::new(untyped_kernel(OpKind::Copy), owned, Grid::new(1, 1));
            let before = g.len();
            let got = g.record(untyped_kernel(OpKind::Copy), &args, Grid::new(1, 1));
            let what = format!("round {round}, list {i}: {list:?}");
            assert_eq!(got.is_ok(), want.is_ok(), "{what}: {got:?}");
            match want {
                Ok(d) => {
                    accepted += 1;
                    assert_eq!(g.len(), before + 1, "{what}");
                    let r = g.dispatches().next_back().expect("recorded");
                    assert_eq!(r.reads().to_vec(), d.reads(), "{what}");
                    assert_eq!(r.writes().to_vec(), d.writes(), "{what}");
                    assert_eq!(r.args().len(), args.len(), "{what}");
                    // The arguments themselves, written over those of the other round (which
                    // sit at other positions once a list is refused).
                    for (k, (x, y)) in r.args().iter().zip(d.args()).enumerate() {
                        let same = match (x, y) {
                            (Arg::Buffer(x, a), Arg::Buffer(y, b)) => x.same_view(y) && a == b,
                            (Arg::Scalar(x), Arg::Scalar(y)) => x == y,
                            _ => false,
                        };
                        assert!(same, "{what}: argument {k} is {x:?}, not {y:?}");
                    }
                }
                Err(_) => {
                    rejected += 1;
                    assert_eq!(g.len(), before, "{what}");
                }
            }
        }
        // Computes the overlaps the second round records over.
        passes::optimize(&mut g, &[], &[], 64);
    }
    assert!(accepted > 100 && rejected > 100, "{accepted} / {rejected}");
}

/// A graph holds as many distinct views as the index bits of a view's stamp word can name; the
/// next one is a clear error that records nothing.
#[test]
fn given_more_views_than_a_graph_holds_when_recorded_should_fail() {
    let dev = Device::cpu(1).expect("cpu");
    let a = dev.alloc(DType::U8, &[16]).expect("alloc");
    let mut g = ComputeGraph::new();
    let record = |g: &mut ComputeGraph, i: usize| {
        let v = a.view(i % 16, DType::U8, &[1]).expect("view");
        g.record(
            untyped_kernel(OpKind::Copy),
            &[ArgRef::read(&v)],
            Grid::new(1, 1),
        )
    };
    for i in 0..recording::MAX_VIEWS {
        record(&mut g, i).expect("record");
    }
    assert_eq!(g.view_count(), recording::MAX_VIEWS);
    let err = record(&mut g, 0).expect_err("one view too many");
    assert!(err.to_string().contains("distinct buffer views"), "{err}");
    assert_eq!(g.dispatch_count(), recording::MAX_VIEWS);
}

/// A recorded dispatch whose arguments do not fit its kernel's declaration is refused with the
/// declaration's error, and nothing is recorded; a fitting one records on the small path.
#[test]
fn given_arguments_that_do_not_fit_the_declaration_when_recorded_should_fail_and_record_nothing() {
    let dev = Device::cpu(1).expect("cpu");
    let (x, out) = (
        upload(&dev, 60),
        dev.alloc(DType::F32, &[N]).expect("alloc"),
    );
    let ints = dev.alloc(DType::I32, &[N]).expect("alloc");
    let copy = KernelId::of(&crate::kernels::misc::COPY[0]);
    let mut g = ComputeGraph::new();
    let cases: [&[ArgRef<'_>]; 4] = [
        &[ArgRef::read(&x)],
        &[ArgRef::read(&ints), ArgRef::write(&out)],
        &[ArgRef::read(&x), ArgRef::read_write(&out)],
        &[ArgRef::read(&x), ArgRef::u32(3)],
    ];
    for args in cases {
        let err = g.record(copy, args, Grid::new(1, 1)).expect_err("misfit");
        let want = Dispatch::new(
            copy,
            args.iter()
                .map(|&a| match a {
                    ArgRef::Buffer(b, access) => Arg::Buffer(b.clone(), access),
                    ArgRef::Scalar(s) => Arg::Scalar(s),
                })
                .collect::<Vec<_>>(),
            Grid::new(1, 1),
        )
        .expect_err("misfit");
        assert_eq!(err.to_string(), want.to_string());
        assert!(err.to_string().contains("copy_f32_f32"), "{err}");
        assert_eq!(g.dispatch_count(), 0);
    }
    g.record(
        copy,
        &[ArgRef::read(&x), ArgRef::write(&out)],
        Grid::new(1, 1),
    )
    .expect("fits");
    assert_eq!(g.dispatch_count(), 1);
}
