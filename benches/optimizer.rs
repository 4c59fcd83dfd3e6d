//! The optimizer's cost on a decode-shaped graph: record (building every dispatch, ranges
//! derived from its arguments, into a `ComputeGraph`) + fuse + reorder + barrier placement, for
//! a 30-layer Llama decode step (574 dispatches) and a 300-layer one (5704 dispatches).
//!
//! Run: `taskset -c 0 cargo bench --bench optimizer`. Goal: under 50 us for the 574-node step
//! (`record+optimize+drop`: recording, the three passes and dropping the graph, all timed).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use onepass::graph::passes;
use onepass::graph::synthetic::{norm_mul_rule, DecodeGraph, DecodeShape};
use onepass::graph::ComputeGraph;
use onepass::Device;

fn one_by_one(g: &mut ComputeGraph, rules: &[passes::FusionRule]) -> usize {
    passes::fuse(g, rules);
    passes::reorder(g, passes::DEFAULT_LOOKAHEAD);
    passes::place_barriers(g)
}

fn bench_shape(c: &mut Criterion, label: &str, layers: usize) {
    let device = Device::cpu(1).expect("cpu device");
    let shape = DecodeShape::SMOLLM2_135M.with_layers(layers);
    let dg = DecodeGraph::new(&device, shape).expect("buffers");
    let rules = [norm_mul_rule()];
    let recorded = dg.record().expect("record");
    let mut sample = recorded.clone();
    let done = passes::optimize(&mut sample, &rules, passes::DEFAULT_LOOKAHEAD);
    eprintln!(
        "{label}: {} dispatches recorded, {} after fusion, {} barriers, {} groups",
        recorded.dispatch_count(),
        sample.dispatch_count(),
        done.barriers,
        sample.group_sizes().len()
    );

    let mut group = c.benchmark_group(label);
    // The headline: what recording and optimizing one step costs, the graph dropped in the
    // timed region (so the allocator reuses its memory, as when recording every step).
    group.bench_function("record+optimize+drop", |b| {
        b.iter(|| {
            let mut g = dg.record().expect("record");
            black_box(passes::optimize(&mut g, &rules, passes::DEFAULT_LOOKAHEAD))
        })
    });
    group.bench_function("record+drop", |b| {
        b.iter(|| black_box(dg.record().expect("record").nodes().len()))
    });
    group.bench_function("optimize", |b| {
        b.iter_batched_ref(
            || recorded.clone(),
            |g| black_box(passes::optimize(g, &rules, passes::DEFAULT_LOOKAHEAD)),
            BatchSize::SmallInput,
        )
    });
    let fused = {
        let mut g = recorded.clone();
        passes::fuse(&mut g, &rules);
        g
    };
    group.bench_function("fuse", |b| {
        b.iter_batched_ref(
            || recorded.clone(),
            |g| black_box(passes::fuse(g, &rules)),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("reorder", |b| {
        b.iter_batched_ref(
            || fused.clone(),
            |g| black_box(passes::reorder(g, passes::DEFAULT_LOOKAHEAD)),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("place_barriers", |b| {
        b.iter_batched_ref(
            || fused.clone(),
            |g| black_box(passes::place_barriers(g)),
            BatchSize::SmallInput,
        )
    });
    // The passes one by one (each builds its own footprint), for comparison with `optimize`.
    group.bench_function("record+fuse+reorder+barriers+drop", |b| {
        b.iter(|| {
            let mut g = dg.record().expect("record");
            black_box(one_by_one(&mut g, &rules))
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    bench_shape(c, "decode_30_layers", 30);
    bench_shape(c, "decode_300_layers", 300);
}

criterion_group!(optimizer, benches);
criterion_main!(optimizer);
