//! The rope/cache-write fusion on the GPU (`ops::rope_kv`, `rope_kv_f32`, `rope_ff_kv_f32`): a
//! prompt's in-place RoPE of q and k and the cache writes of k and v give bitwise the same q and
//! caches fused and unfused on the GPU, and the CPU backend's within the rounding of the angles'
//! f64 sines (both sides round the same f64 angle to f32; the two libraries' f64 `sincos` may
//! differ in the last f64 bit, which moves an f32 rounding by at most one ulp: 2^-23 relative of
//! a value of the size of the inputs). At the Llama 3.1 8B shape (32 heads and 8 KV heads of
//! 128, frequency factors, 512 rows) and odd ones (rows 1, 3, 17, 100 and 513, NeoX halves, a
//! partial rotary dimension), into f32 and f16 caches. Seeded random inputs, never zeros. Needs a GPU: ignored by default, it
//! fails where there is none (`ops::rope_kv`'s tests run the CPU kernels).

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use half::f16;
use onepass::backend::{cpu, cuda, Capabilities};
use onepass::kernels::{Fusion, FusionUse};
use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// A case: rows, heads, KV heads, head size, rotary dimension, layout, frequency factors.
type Case = (usize, usize, usize, usize, usize, RopeMode, bool);

/// Positions of the KV caches.
const MAX_CTX: usize = 1100;

/// The ropes and cache writes (caches of `cache`, f32 or f16), optimized with `caps` on `dev` and
/// run: q and the two caches (as f32).
fn run(dev: &Device, caps: &Capabilities, case: Case, cache: DType) -> (Vec<Vec<f32>>, usize) {
    let (rows, heads, kv_heads, hd, rot, mode, ff) = case;
    let up =
        |n: usize, dims: &[usize], seed: u64| dev.upload(&random_f32(n, 1.5, seed), dims).unwrap();
    let q = up(rows * heads * hd, &[rows, heads * hd], 101);
    let k = up(rows * kv_heads * hd, &[rows, kv_heads * hd], 102);
    let v = up(rows * kv_heads * hd, &[rows, kv_heads * hd], 103);
    let dims = [kv_heads, MAX_CTX, hd];
    let cache_of = |seed: u64| {
        let values = random_f32(kv_heads * MAX_CTX * hd, 1.5, seed);
        if cache == DType::F16 {
            let halves: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            dev.upload(&halves, &dims).unwrap()
        } else {
            dev.upload(&values, &dims).unwrap()
        }
    };
    let (kc, vc) = (cache_of(104), cache_of(105));
    let pos0 = 37i32;
    let positions: Vec<i32> = (0..rows as i32).map(|r| pos0 + r).collect();
    let positions = dev.upload(&positions, &[rows]).unwrap();
    let step = dev.upload(&[pos0], &[1]).unwrap();
    let factors: Vec<f32> = random_f32(rot / 2, 0.5, 106)
        .iter()
        .map(|f| 1.5 + f)
        .collect();
    let factors = dev.upload(&factors, &[rot / 2]).unwrap();
    let params = RopeParams {
        mode,
        head_dim: hd,
        rotary_dim: rot,
        base: 500_000.0,
        freq_factors: ff.then_some(&factors),
    };
    let exec = Executor::new(dev.clone());
    let mut s = exec.begin(Mode::Recorded);
    s.rope(&q, &positions, &q, &params).unwrap();
    s.rope(&k, &positions, &k, &params).unwrap();
    s.kv_write(&k, &kc, &step).unwrap();
    s.kv_write(&v, &vc, &step).unwrap();
    s.mark_scratch(&k);
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, caps);
    exec.run(&graph, false).unwrap();
    let out = [&q, &kc, &vc]
        .iter()
        .map(|b: &&Buffer| {
            if b.dtype() == DType::F16 {
                let halves = dev.download::<f16>(b).unwrap();
                halves.iter().map(|h| h.to_f32()).collect()
            } else {
                dev.download::<f32>(b).unwrap()
            }
        })
        .collect();
    let fused = report.fusions_by_rule.get("rope_kv").copied().unwrap_or(0);
    (out, fused)
}

fn without_rope_kv(caps: &Capabilities) -> Capabilities {
    let fusions: Vec<FusionUse> = caps
        .fusions
        .iter()
        .filter(|u| u.fusion != Fusion::RopeKv)
        .copied()
        .collect();
    caps.with_fusions(Box::leak(fusions.into_boxed_slice()))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_ropes_and_cache_writes_give_the_unfused_bits_and_the_cpus_values() {
    let gpu = cuda_device();
    let host = Device::cpu(4).unwrap();
    let cases: [Case; 6] = [
        (512, 32, 8, 128, 128, RopeMode::Normal, true),
        (100, 14, 2, 64, 64, RopeMode::NeoX, false),
        (513, 8, 4, 96, 64, RopeMode::Normal, false),
        (1, 32, 8, 128, 128, RopeMode::Normal, true),
        (3, 9, 3, 64, 32, RopeMode::NeoX, true),
        (17, 14, 2, 64, 64, RopeMode::Normal, false),
    ];
    for (case, cache) in cases
        .into_iter()
        .flat_map(|c| [(c, DType::F32), (c, DType::F16)])
    {
        let (want, none) = run(&gpu, &without_rope_kv(&cuda::CAPABILITIES), case, cache);
        let (got, once) = run(&gpu, &cuda::CAPABILITIES, case, cache);
        let (cpu, _) = run(&host, &cpu::CAPABILITIES, case, cache);
        assert_eq!(
            (none, once),
            (0, 1),
            "{case:?}: fused once, only where declared"
        );
        for (i, what) in ["q", "k cache", "v cache"].iter().enumerate() {
            let differ = got[i]
                .iter()
                .zip(&want[i])
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                differ, None,
                "{case:?} {cache:?}: {what}: fused and unfused differ"
            );
            let worst = got[i]
                .iter()
                .zip(&cpu[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            // Inputs below 1.5 in size, rotated: values below 2.2; one f32 ulp of that, which
            // an f16 cache can turn into one f16 ulp (a value at a rounding boundary; q is f32).
            let ulp = if cache == DType::F16 && i > 0 {
                f16::EPSILON.to_f32()
            } else {
                f32::EPSILON
            };
            assert!(
                worst <= 2.2 * ulp,
                "{case:?} {cache:?}: {what}: {worst} from the CPU's"
            );
        }
    }
}
