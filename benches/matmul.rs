//! Matrix-product throughput on the CPU backend, through the public API (a recorded graph of one
//! dispatch, replayed): the SmolLM2-135M shapes. Q4_1 576x1536 (an FFN down matrix) and Q8_0
//! 49152x576 (the LM head) as matrix-vector products (decode), and a 64-row Q4_1 1536x576 product
//! (prefill). Each benchmark prints GFLOP/s (2 flops per weight per row) and what that rate
//! implies for tokens per second over the model's ~135M weights.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use onepass::graph::ComputeGraph;
use onepass::quant::quantize;
use onepass::{DType, Device, Executor, Mode, Plan};

/// Weights that one decoded token of SmolLM2-135M multiplies (30 layers + the LM head).
const MODEL_WEIGHTS: f64 =
    30.0 * (2.0 * 576.0 * 576.0 + 2.0 * 192.0 * 576.0 + 3.0 * 1536.0 * 576.0) + 49152.0 * 576.0;

fn values(n: usize, seed: u32) -> Vec<f32> {
    // A small deterministic generator: the bench needs no statistical quality.
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

fn product(exec: &Executor, dtype: DType, rows: usize, k: usize, n: usize) -> ComputeGraph {
    let dev = exec.device();
    let w = quantize(dtype, &values(n * k, 1)).expect("quantize");
    let wb = dev.upload_bytes(&w, dtype, &[n, k]).expect("upload w");
    let xb = dev
        .upload(&values(rows * k, 2), &[rows, k])
        .expect("upload x");
    let out = dev.alloc(DType::F32, &[rows, n]).expect("alloc out");
    let mut s = exec.begin(Mode::Recorded);
    s.matmul(&xb, &wb, &out).expect("matmul");
    let mut g = s.into_graph().expect("graph");
    Executor::optimize(&mut g, &Plan::SEQUENTIAL, dev.capabilities());
    g
}

fn bench(c: &mut Criterion) {
    let threads = std::env::var("ONEPASS_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let exec = Executor::new(Device::cpu(threads).expect("cpu device"));
    let mut group = c.benchmark_group("matmul");
    for (name, dtype, rows, k, n) in [
        ("q4_1_576x1536_matvec", DType::Q4_1, 1, 1536, 576),
        ("q8_0_49152x576_matvec", DType::Q8_0, 1, 576, 49152),
        ("q4_1_1536x576_64rows", DType::Q4_1, 64, 576, 1536),
    ] {
        let g = product(&exec, dtype, rows, k, n);
        group.throughput(Throughput::Elements((2 * rows * k * n) as u64));
        group.bench_function(name, |b| b.iter(|| exec.run(&g, false).expect("run")));
        // One more timed pass outside criterion for the printed summary.
        let reps = 200;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            exec.run(&g, false).expect("run");
        }
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        let gflops = 2.0 * (rows * k * n) as f64 / secs / 1e9;
        let tokens = gflops * 1e9 / (2.0 * MODEL_WEIGHTS);
        println!(
            "{name}: {:.1} us per product, {gflops:.1} GFLOP/s on {threads} threads -> ~{tokens:.0} tokens/s \
             if every matrix ran at this rate",
            secs * 1e6
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
