use crate::backend::{cpu, Capabilities, DType, Device};
use crate::kernels::{Fusion, FusionUse};
use crate::ops::rope::{RopeMode, RopeParams};
use crate::session::FinishReport;
use crate::testutil::random_f32;
use crate::{Buffer, Executor, Mode, Plan};

const ROWS: usize = 7;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const MAX_CTX: usize = 20;
/// Where the pass starts in the caches.
const POS0: i32 = 9;

/// The CPU's declarations, with or without the rope/cache fusion.
fn caps(fused: bool) -> Capabilities {
    let fusions: Vec<FusionUse> = cpu::CAPABILITIES
        .fusions
        .iter()
        .filter(|u| fused || u.fusion != Fusion::RopeKv)
        .copied()
        .collect();
    cpu::CAPABILITIES.with_fusions(Box::leak(fusions.into_boxed_slice()))
}

/// q and k roped in place and k and v written into the caches (of `cache_dtype`, f32 or f16;
/// with `k_read`, also an add of k into that buffer after the writes), optimized with `caps` and
/// run: q and the two caches as bits, and the report.
fn run(
    caps: &Capabilities,
    (head_dim, rotary_dim, mode, ff): (usize, usize, RopeMode, bool),
    k_read: bool,
    cache_dtype: DType,
) -> (Vec<Vec<u32>>, FinishReport) {
    let dev = Device::cpu(2).unwrap();
    let up =
        |n: usize, dims: &[usize], seed: u64| dev.upload(&random_f32(n, 1.5, seed), dims).unwrap();
    let q = up(ROWS * HEADS * head_dim, &[ROWS, HEADS * head_dim], 1);
    let k = up(ROWS * KV_HEADS * head_dim, &[ROWS, KV_HEADS * head_dim], 2);
    let v = up(ROWS * KV_HEADS * head_dim, &[ROWS, KV_HEADS * head_dim], 3);
    let cache = [KV_HEADS, MAX_CTX, head_dim];
    let cache_of = |seed: u64| {
        let values = random_f32(KV_HEADS * MAX_CTX * head_dim, 1.5, seed);
        if cache_dtype == DType::F16 {
            let halves: Vec<half::f16> = values.iter().map(|&v| half::f16::from_f32(v)).collect();
            dev.upload(&halves, &cache).unwrap()
        } else {
            dev.upload(&values, &cache).unwrap()
        }
    };
    let (kc, vc) = (cache_of(4), cache_of(5));
    let positions: Vec<i32> = (0..ROWS as i32).map(|r| POS0 + 3 * r).collect();
    let positions = dev.upload(&positions, &[ROWS]).unwrap();
    let step = dev.upload(&[POS0], &[1]).unwrap();
    let factors = dev
        .upload(
            &random_f32(rotary_dim / 2, 0.5, 6)
                .iter()
                .map(|f| 1.5 + f)
                .collect::<Vec<_>>(),
            &[rotary_dim / 2],
        )
        .unwrap();
    let other = up(ROWS * KV_HEADS * head_dim, &[ROWS, KV_HEADS * head_dim], 7);
    let params = RopeParams {
        mode,
        head_dim,
        rotary_dim,
        base: 10_000.0,
        freq_factors: ff.then_some(&factors),
    };
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.rope(&q, &positions, &q, &params).unwrap();
    s.rope(&k, &positions, &k, &params).unwrap();
    s.kv_write(&k, &kc, &step).unwrap();
    s.kv_write(&v, &vc, &step).unwrap();
    if k_read {
        s.add_inplace(&other, &k).unwrap();
    }
    s.mark_scratch(&k);
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    let bits = |b: &Buffer| -> Vec<u32> {
        if b.dtype() == DType::F16 {
            let values = dev.download::<half::f16>(b).unwrap();
            return values.iter().map(|v| u32::from(v.to_bits())).collect();
        }
        dev.download::<f32>(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    (vec![bits(&q), bits(&kc), bits(&vc)], report)
}

fn fused(report: &FinishReport) -> usize {
    report.fusions_by_rule.get("rope_kv").copied().unwrap_or(0)
}

/// The two ropes and the two cache writes fuse into one dispatch with their bits: both rope
/// layouts, a partial rotary dimension, with and without frequency factors, f32 and f16 caches
/// (each value rounded once, as `kv_write` rounds it).
#[test]
fn ropes_and_cache_writes_fuse_with_the_same_bits() {
    let shapes = [
        (64, 64, RopeMode::Normal, false),
        (64, 64, RopeMode::Normal, true),
        (32, 16, RopeMode::NeoX, false),
        (48, 32, RopeMode::NeoX, true),
    ];
    for (shape, cache) in shapes
        .into_iter()
        .flat_map(|s| [(s, DType::F32), (s, DType::F16)])
    {
        let (want, before) = run(&caps(false), shape, false, cache);
        let (got, after) = run(&caps(true), shape, false, cache);
        assert_eq!((fused(&before), fused(&after)), (0, 1), "{shape:?}");
        assert_eq!(after.dispatches + 3, before.dispatches, "{shape:?}");
        for (what, (g, w)) in ["q", "k cache", "v cache"]
            .iter()
            .zip(got.iter().zip(&want))
        {
            assert!(g == w, "{shape:?}, {cache:?} cache: {what} differs");
        }
    }
}

/// Where k is read again after the cache write, it must keep its rotated values: no fusion.
#[test]
fn a_k_read_after_the_cache_write_keeps_the_ropes() {
    let (_, report) = run(
        &caps(true),
        (64, 64, RopeMode::Normal, false),
        true,
        DType::F32,
    );
    assert_eq!(fused(&report), 0);
}

/// A fused dispatch whose step leaves no room for the rows is refused, and q stays as it was.
#[test]
fn the_fused_kernel_refuses_a_step_past_the_cache() {
    use crate::graph::{Arg, Dispatch, Grid, KernelId};
    let dev = Device::cpu(1).unwrap();
    let q0 = random_f32(ROWS * 64, 1.0, 11);
    let q = dev.upload(&q0, &[ROWS, 64]).unwrap();
    let k = dev
        .upload(&random_f32(ROWS * 64, 1.0, 12), &[ROWS, 64])
        .unwrap();
    let positions = dev.upload(&[3i32; ROWS], &[ROWS]).unwrap();
    let step = dev.upload(&[(MAX_CTX - ROWS + 1) as i32], &[1]).unwrap();
    let (kc, vc) = (
        dev.alloc(DType::F32, &[1, MAX_CTX, 64]).unwrap(),
        dev.alloc(DType::F32, &[1, MAX_CTX, 64]).unwrap(),
    );
    let d = Dispatch::new(
        KernelId::of(&crate::kernels::misc::ROPE_KV[0]),
        vec![
            Arg::read_write(&q),
            Arg::read(&k),
            Arg::read(&k),
            Arg::read(&positions),
            Arg::read(&step),
            Arg::write(&kc),
            Arg::write(&vc),
            Arg::u32(64),
            Arg::u32(64),
            Arg::f32(10_000.0),
            Arg::u32(0),
            Arg::u32(1),
            Arg::u32(0),
        ],
        Grid::new(ROWS as u32, 128),
    )
    .unwrap();
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    let err = match s.push(d) {
        Err(e) => e,
        Ok(()) => s.finish(&Plan::SEQUENTIAL).unwrap_err(),
    };
    assert!(err.to_string().contains("rope_kv_f32"), "{err}");
    assert!(dev.download::<f32>(&q).unwrap() == q0, "q changed");
}
