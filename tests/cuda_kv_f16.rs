//! The f16 KV cache on the GPU (CUDA's default, `Capabilities::kv_cache`): the fused decode-block
//! kernel `norm_qkv_rope` writes into an f16 cache exactly the f16 rounding of what it writes into
//! an f32 one (q unchanged, cache rows outside the step untouched), at the Llama 3.1 8B shape (4096
//! activations, 32 heads on 8 KV heads of 128: the shared form with a pair's sums split between
//! two warps), the 1B's (2048, heads of 64), SmolLM2's (576, 9 on 3) and a small block of three
//! rows (the per-warp form), Q4_0, Q4_1, Q8_0 and Q4_K weights. Then the synthetic SmolLM2 model
//! loaded with an f16 cache against the same model with an f32 cache on the GPU: prompt logits
//! and 16 greedy steps' logits within a stated tolerance. Seeded random inputs, never zeros.
//! Needs a GPU: ignored by default, it fails where there is none (`cpu_fusion.rs` and
//! `ops::rope_kv`'s tests check the CPU kernels' f16 caches).

mod cuda_open;

mod seeded;

use std::sync::Arc;

use cuda_open::cuda_device;
use half::f16;
use onepass::model::engine::Engine;
use onepass::model::engine::RunMode;
use onepass::model::gguf::GgufFile;
use onepass::model::synth::{write_synthetic, SynthShape, SynthSpec};
use onepass::model::transformer::{KvCache, LoadOptions, Logits, Transformer};
use onepass::ops::fused_block::QkvRope;
use onepass::ops::rope::RopeMode;
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// A block's attention input: rows, activations, heads, KV heads, head size.
type Shape = (usize, usize, usize, usize, usize);

const MAX_CTX: usize = 40;
const POS0: usize = 21;

/// `norm_qkv_rope` into caches of `cache` (their random start values f16-exact, so both types
/// start equal) on `dev`: q and the two caches, as f32.
fn qkv(dev: &Device, dtype: DType, shape: Shape, mode: RopeMode, cache: DType) -> [Vec<f32>; 3] {
    let (rows, dim, n_head, n_kv, hd) = shape;
    let f32s = |n: usize, seed: u64, dims: &[usize]| {
        dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
    };
    let weight = |n: usize, seed: u64| {
        let bytes = onepass::quant::quantize(dtype, &random_f32(n * dim, 1.0, seed)).unwrap();
        dev.upload_bytes(&bytes, dtype, &[n, dim]).unwrap()
    };
    let dims = [n_kv, MAX_CTX, hd];
    let cache_of = |seed: u64| {
        let values: Vec<f16> = random_f32(n_kv * MAX_CTX * hd, 1.0, seed)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        if cache == DType::F16 {
            dev.upload(&values, &dims).unwrap()
        } else {
            let wide: Vec<f32> = values.iter().map(|h| h.to_f32()).collect();
            dev.upload(&wide, &dims).unwrap()
        }
    };
    let positions: Vec<i32> = (0..rows).map(|r| (POS0 + 3 * r) as i32).collect();
    let (x, norm) = (f32s(rows * dim, 1, &[rows, dim]), f32s(dim, 2, &[dim]));
    let (wq, wk, wv) = (
        weight(n_head * hd, 3),
        weight(n_kv * hd, 4),
        weight(n_kv * hd, 5),
    );
    let positions = dev.upload::<i32>(&positions, &[rows]).unwrap();
    let step = dev.upload::<i32>(&[POS0 as i32], &[1]).unwrap();
    let q = f32s(rows * n_head * hd, 6, &[rows, n_head * hd]);
    let (k_cache, v_cache) = (cache_of(7), cache_of(8));
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.norm_qkv_rope(&QkvRope {
        x: &x,
        norm: &norm,
        eps: 1e-5,
        wq: &wq,
        wk: &wk,
        wv: &wv,
        positions: &positions,
        freq_factors: None,
        step: &step,
        q: &q,
        k_cache: &k_cache,
        v_cache: &v_cache,
        n_head,
        n_kv_head: n_kv,
        head_dim: hd,
        base: 500_000.0,
        mode,
    })
    .unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
    let read = |b: &Buffer| -> Vec<f32> {
        if b.dtype() == DType::F16 {
            let h = dev.download::<f16>(b).unwrap();
            h.iter().map(|v| v.to_f32()).collect()
        } else {
            dev.download::<f32>(b).unwrap()
        }
    };
    [read(&q), read(&k_cache), read(&v_cache)]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_fused_block_writes_the_f16_rounding_of_its_f32_cache_values() {
    let gpu = cuda_device();
    let shapes: [Shape; 4] = [
        (1, 4096, 32, 8, 128),
        (1, 2048, 32, 8, 64),
        (1, 576, 9, 3, 64),
        (3, 256, 4, 2, 64),
    ];
    for shape in shapes {
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4K] {
            if dtype == DType::Q4K && shape.1 % 256 != 0 {
                continue;
            }
            for mode in [RopeMode::Normal, RopeMode::NeoX] {
                let what = format!("{shape:?} {dtype} {mode:?}");
                let wide = qkv(&gpu, dtype, shape, mode, DType::F32);
                let half = qkv(&gpu, dtype, shape, mode, DType::F16);
                assert!(wide[0] == half[0], "{what}: q differs with the cache type");
                for (i, name) in [(1, "k_cache"), (2, "v_cache")] {
                    let differ = wide[i]
                        .iter()
                        .zip(&half[i])
                        .position(|(w, h)| f16::from_f32(*w).to_f32().to_bits() != h.to_bits());
                    assert_eq!(
                        differ, None,
                        "{what}: {name} is not the f16 of the f32 cache"
                    );
                }
            }
        }
    }
}

/// Tolerance of the f16 cache against the f32 one, as a fraction of the largest |logit|: every
/// cached K and V value moves by at most 2^-11 of itself (one rounding), so a score by at most
/// 2^-11 of `scale sum |q_d k_d|` and an attention output by about 2^-11 of |v|; 30 layers of
/// norms and residual adds carry that into the logits as a relative change of the same order.
/// Measured on an H100 (600-token prompt, 16 steps): at most 7.8e-3 of a largest |logit| of 76
/// (1.0e-4 of the scale; the prompt's own logits equal, since the prompt attention rounds K and V
/// to f16 either way). The bound, 1e-3, is ten times that, while a wrong row, head or position
/// moves logits by a sizable fraction of their scale.
const F16_CACHE_RTOL: f32 = 1e-3;

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_f16_cache_moves_the_logits_by_its_rounding_only() {
    const STEPS: usize = 16;
    let gpu = cuda_device();
    let path = std::env::temp_dir().join(format!("onepass-kv-f16-{}.gguf", std::process::id()));
    let spec = SynthSpec {
        shape: SynthShape::SmolLm2,
        quant: DType::Q4_1.into(),
        seed: 3,
        rope_freqs: false,
        layers: None,
    };
    write_synthetic(&spec, None, &path, &mut |_, _| {}).expect("synth");
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let vocab = SynthShape::SmolLm2.params().vocab as u64;
    let prompt: Vec<u32> = (0..600u64)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    // Prefill, then STEPS steps fed the f32 run's tokens: the logits of each.
    let run = |kv: KvCache, feed: Option<&[u32]>| -> (Vec<Vec<f32>>, Vec<u32>) {
        let options = LoadOptions::new(prompt.len() + STEPS + 1, 512).with_kv_cache(kv);
        let model = Transformer::load_with(file.clone(), &gpu, &options).expect("load");
        let mut engine = Engine::new(model, Executor::new(gpu.clone()), RunMode::Graph);
        engine.prefill(&prompt, Logits::Last).expect("prefill");
        let mut logits = vec![engine.logits(1).expect("logits")];
        let mut tokens = Vec::new();
        for i in 0..STEPS {
            let last = logits.last().unwrap();
            let mine = (0..last.len())
                .max_by(|&a, &b| last[a].total_cmp(&last[b]))
                .unwrap() as u32;
            let token = feed.map_or(mine, |f| f[i]);
            tokens.push(token);
            engine
                .decode(token, prompt.len() + i, false)
                .expect("decode");
            logits.push(engine.logits(1).expect("logits"));
        }
        (logits, tokens)
    };
    let (wide, tokens) = run(KvCache::F32, None);
    let (half, _) = run(KvCache::F16, Some(&tokens));
    for (step, (h, w)) in half.iter().zip(&wide).enumerate() {
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = h
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("step {step}: max |f16 - f32| {worst:.3e}, max |logit| {scale:.3}");
        assert!(
            worst <= F16_CACHE_RTOL * scale,
            "step {step}: logits differ by {worst:.3e} (> {F16_CACHE_RTOL} x {scale})"
        );
    }
    let _ = std::fs::remove_file(&path);
}
