//! `draw_advance` and `draw_rows` (sampled tokens drawn on the device, as the host's sampler
//! draws them) on CUDA against the CPU backend, whose kernel is the host's sampler: the same tokens, generator state
//! and window, exactly, over several steps. Part of `cuda_ops.rs` (whose harness it uses); every
//! test needs a GPU.

use super::*;
use onepass::model::sampler::SamplerConfig;
use onepass::ops::draw::{draw_scratch_len, DrawState, DRAW_WINDOW};

/// Settings: temperature, top-k, top-p, min-p, repetition penalty (window 48).
fn settings(t: f32, top_k: usize, top_p: f32, min_p: f32, penalty: f32) -> SamplerConfig {
    SamplerConfig {
        temperature: t,
        top_k,
        top_p,
        min_p,
        repetition_penalty: penalty,
        penalty_window: 48,
        seed: 0,
    }
}

fn u32_tensor(values: &[u32]) -> Host {
    Host {
        bytes: bytemuck::cast_slice(values).to_vec(),
        dtype: DType::U32,
        dims: vec![values.len()],
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn draw_advance_family() {
    let dev = cuda_device();
    // (n, logits' spread, settings): Llama 3's vocabulary with logits spread so that most of it
    // weighs something (over a hundred thousand candidates, narrowed by digits before the sort)
    // and so that few do (all of them sorted at once); SmolLM2's with top-k, top-p and min-p; a
    // flat row (every candidate tied: the ids decide the order); a penalty over an odd row; a
    // penalized greedy draw; top-k past the candidates; a tiny row.
    let cases = [
        (128_256usize, 10.0f32, settings(0.8, 0, 1.0, 0.0, 1.0)),
        (128_256, 10.0, settings(1.0, 0, 0.95, 0.0, 1.0)),
        (128_256, 10.0, settings(1.0, 5_000, 0.9, 0.0, 1.1)),
        (128_256, 80.0, settings(0.8, 40, 0.95, 0.0, 1.0)),
        (49_152, 12.0, settings(0.7, 40, 0.9, 0.05, 1.0)),
        (4_096, 0.0, settings(1.0, 0, 0.5, 0.0, 1.0)),
        (128_256, 0.0, settings(1.0, 0, 0.7, 0.0, 1.0)),
        (1_003, 6.0, settings(1.3, 0, 1.0, 0.0, 1.5)),
        (1_003, 6.0, settings(0.0, 0, 1.0, 0.0, 1.3)),
        (2_000, 3.0, settings(0.9, 100_000, 1.0, 0.0, 1.0)),
        (7, 2.0, settings(2.0, 0, 1.0, 0.0, 1.2)),
    ];
    const STEPS: usize = 4;
    for (case, (n, spread, cfg)) in cases.iter().enumerate() {
        let seed = 1_700 + 10 * case as u64;
        let mut v = if *spread == 0.0 {
            vec![0.5f32; *n]
        } else {
            random_f32(*n, *spread, seed)
        };
        if *n > 100 {
            v[3] = f32::NAN;
            v[5] = f32::NEG_INFINITY;
            // Ties at a high value, one of them in the penalty's window.
            v[n / 2] = spread * 1.5;
            v[n / 3] = spread * 1.5;
        }
        let mut g = rng(seed + 1);
        let history: Vec<u32> = (0..60)
            .map(|i| {
                if i == 7 {
                    (n / 3) as u32
                } else {
                    g.random_range(0..*n as u32)
                }
            })
            .collect();
        let state = DrawState::new(cfg, 0xDEAD_BEEF_0000_0001 ^ seed, history.len()).unwrap();
        let what = format!("draw_advance n {n}, spread {spread}, {cfg:?}");
        compare_except(
            &what,
            &dev,
            &[
                float_tensor(&v, DType::F32, &[*n]),
                i32_tensor(&[-9; STEPS], &[STEPS]),
                i32_tensor(&[0, 1, 0], &[3]),
                u32_tensor(&state.words()),
                i32_tensor(&state.window_of(&history), &[DRAW_WINDOW]),
                u32_tensor(&vec![7u32; draw_scratch_len(*n)]),
            ],
            &[],
            0.0,
            0.0,
            &|s, i, _| {
                (0..STEPS)
                    .try_for_each(|_| s.draw_advance(&i[0], &i[1], &i[2], &i[3], &i[4], &i[5]))
            },
            // The scratch: the CUDA kernel's candidates, which the CPU's does not write.
            &[5],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn draw_rows_family() {
    let dev = cuda_device();
    // Rows of one launch, each with its own settings, generator and window: Llama 3's vocabulary
    // (wide and narrow spreads, a greedy row, a penalized one) and a short odd row.
    let configs = [
        settings(0.8, 0, 1.0, 0.0, 1.0),
        settings(1.0, 40, 0.95, 0.0, 1.0),
        settings(0.0, 0, 1.0, 0.0, 1.0),
        settings(1.2, 0, 0.9, 0.02, 1.3),
        settings(0.7, 5_000, 1.0, 0.0, 1.0),
    ];
    const STEPS: usize = 3;
    for (n, spread) in [(128_256usize, 10.0f32), (128_256, 60.0), (1_003, 4.0)] {
        let rows = configs.len();
        let seed = 9_100 + n as u64 + spread as u64;
        let x = random_f32(rows * n, spread, seed);
        let mut g = rng(seed + 1);
        let mut words = Vec::new();
        let mut windows = Vec::new();
        for (r, cfg) in configs.iter().enumerate() {
            let history: Vec<u32> = (0..30 + r).map(|_| g.random_range(0..n as u32)).collect();
            let state =
                DrawState::new(cfg, 0x5EED_0000_0000_0001 * (r as u64 + 1), history.len()).unwrap();
            words.extend(state.words());
            windows.extend(state.window_of(&history));
        }
        let what = format!("draw_rows n {n}, spread {spread}");
        compare_except(
            &what,
            &dev,
            &[
                float_tensor(&x, DType::F32, &[rows, n]),
                u32_tensor(&words),
                i32_tensor(&windows, &[rows * DRAW_WINDOW]),
                u32_tensor(&vec![7u32; rows * draw_scratch_len(n)]),
                i32_tensor(&vec![-9; rows], &[rows]),
            ],
            &[],
            0.0,
            0.0,
            &|s, i, _| (0..STEPS).try_for_each(|_| s.draw_rows(&i[0], &i[1], &i[2], &i[3], &i[4])),
            // The scratch: the CUDA kernel's candidates, which the CPU's does not write.
            &[3],
        );
    }
}
