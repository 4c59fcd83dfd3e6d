//! The prompt attention on CUDA against the CPU backend at prompt sizes: rows 1, 3, 17, 100, 511 and
//! 513 (the one-row-per-block form; from 64 rows, for heads of 64 and 128, the tensor-core form with
//! partial row and key tiles), the head layouts of SmolLM2 (9 heads on 3 KV heads of 64), Llama 3
//! (32 on 8 of 128; 1B: 32 on 8 of 64), Qwen 3 (16 on 8 of 128), groups of 3 on 128-wide heads and
//! on 64-wide ones, a group of 6 on 40-wide heads, Gemma 3 (4 on 1 of 256) and a 64-head group;
//! f32 and f16 caches, passes from position 0 and from position 700 (a chunked prompt), with a
//! sliding window and a softcap. Seeded random inputs, never zeros; the outputs start as NaN.
//!
//! Tolerance: both backends sum in f32 with an online softmax in another order (tiles of keys
//! here, the CPU's own tiles there); the softmax weights are at most 1 and |v| below 1, so the
//! rounding stays within a few 1e-6 of 1: `2e-5` absolute plus `2e-4` relative, while one key
//! masked wrongly moves an output by its weight, about 1 / keys, above 1e-3 at every size tested.
//!
//! From 64 rows, heads of 64 and 128 take the tensor-core form, which rounds q, k, v and the
//! softmax weights to f16: each product q_d k_d moves by at most 2^-10 of its magnitude, so a
//! score by at most `2^-10 scale sum |q_d k_d| <= 2^-10 x 128 / sqrt(128) = 0.011` (|q|, |k| <= 1;
//! 0.0078 for heads of 64); a weight `exp(s_i - m) / sum` by at most twice that relatively, and
//! the output, a weighted mean of |v| <= 1, by at most 0.022, plus 2^-10 for rounding the weights
//! and v: `2.5e-2` absolute for both.
//!
//! With an f32 cache the tensor-core form copies the next K and V tile into shared memory while it
//! multiplies the current one (16-byte copies, or 4-byte ones where the cache is not 16-byte
//! aligned) and rounds them to f16 there; with an f16 cache it copies the tiles straight into the
//! f16 tiles, two pairs of them, or loads them directly where the cache is not 16-byte aligned. On
//! cache values an f16 holds exactly, the four see the same f16 tiles: their outputs are compared
//! bit for bit.
//! Every test needs a GPU: ignored by default, it fails where there is none.

// The harness serves `cuda_ops.rs`; this file uses part of it.
#[allow(dead_code, unused_imports)]
mod cuda_harness;
mod cuda_open;
mod seeded;

use cuda_harness::{compare, float_tensor, i32_tensor, random_tensor, run_on, Host};
use cuda_open::cuda_device;
use onepass::ops::attention::AttentionParams;
use onepass::DType;
use seeded::random_f32;

/// The attention's parameters, with a sliding window and a softcap where they are not 0.
fn params_of(
    n_head: usize,
    n_kv: usize,
    hd: usize,
    window: usize,
    softcap: f32,
) -> AttentionParams {
    let mut params = AttentionParams::new(n_head, n_kv, hd);
    if window != 0 {
        params = params.with_window(window);
    }
    if softcap != 0.0 {
        params = params.with_softcap(softcap);
    }
    params
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn prompt_attention_row_and_tensor_core_forms_match_the_cpu() {
    let dev = cuda_device();
    // (heads, KV heads, head size)
    let layouts = [
        (9usize, 3usize, 64usize),
        (32, 8, 128),
        (32, 8, 64),
        (16, 8, 128),
        (6, 1, 40),
        (12, 4, 64),
        (24, 8, 128),
        (4, 1, 256),
        (64, 1, 16),
    ];
    for (c, &(n_head, n_kv, hd)) in layouts.iter().enumerate() {
        for rows in [1usize, 3, 17, 100, 511, 513] {
            // Big layouts only at a few sizes, to keep the CPU reference quick.
            if n_head * hd >= 2048 && !matches!(rows, 17 | 513) {
                continue;
            }
            for (v, &(pos0, window, softcap, cache)) in [
                (0usize, 0usize, 0.0f32, DType::F32),
                (700, 0, 0.0, DType::F16),
                (700, 300, 30.0, DType::F32),
            ]
            .iter()
            .enumerate()
            {
                let max_ctx = pos0 + rows + 5;
                let seed = (1000 * c + 10 * v) as u64 + rows as u64;
                let k = random_tensor(cache, &[n_kv, max_ctx, hd], 1.0, 5000 + seed);
                let vv = random_tensor(cache, &[n_kv, max_ctx, hd], 1.0, 6000 + seed);
                let q = random_tensor(DType::F32, &[rows, n_head * hd], 1.0, 7000 + seed);
                let step = i32_tensor(&[pos0 as i32, 0], &[2]);
                let params = params_of(n_head, n_kv, hd, window, softcap);
                // The tensor-core form's bound (see the module documentation), else the f32 one.
                let (atol, rtol) = if (hd == 64 || hd == 128) && rows >= 64 {
                    (2.5e-2, 0.0)
                } else {
                    (2e-5, 2e-4)
                };
                compare(
                    &format!(
                        "attention {n_head}/{n_kv}x{hd} rows {rows} pos0 {pos0} window {window} \
                         softcap {softcap} {cache}"
                    ),
                    &dev,
                    &[q, k, vv, step],
                    &[(DType::F32, vec![rows, n_head * hd])],
                    atol,
                    rtol,
                    &|s, i, o| s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], params),
                );
            }
        }
    }
}

/// Random values in (-1, 1) that an f16 holds exactly, as f32.
fn f16_exact(len: usize, seed: u64) -> Vec<f32> {
    random_f32(len, 1.0, seed)
        .into_iter()
        .map(|x| half::f16::from_f32(x).to_f32())
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pipelined_cache_forms_equal_each_other_bitwise() {
    let dev = cuda_device();
    for (n_head, n_kv, hd) in [(32usize, 8usize, 128usize), (32, 8, 64), (24, 8, 128)] {
        for (rows, pos0, window, softcap) in [
            (64usize, 0usize, 0usize, 0.0f32),
            (100, 0, 0, 0.0),
            (513, 0, 0, 0.0),
            (130, 700, 300, 30.0),
        ] {
            let max_ctx = pos0 + rows + 5;
            let cache = n_kv * max_ctx * hd;
            let seed = (rows + pos0 + hd + n_head) as u64;
            let (k, v) = (f16_exact(cache, 100 + seed), f16_exact(cache, 200 + seed));
            let q = random_tensor(DType::F32, &[rows, n_head * hd], 1.0, 300 + seed);
            let step = i32_tensor(&[pos0 as i32, 0], &[2]);
            let params = params_of(n_head, n_kv, hd, window, softcap);
            let dims = [n_kv, max_ctx, hd];
            let out = [(DType::F32, vec![rows, n_head * hd])];
            let run = |k: Host, v: Host, offset: usize| {
                let got = run_on(&dev, &[q.clone(), k, v, step.clone()], &out, &|s, i, o| {
                    let view = |b: &onepass::Buffer| b.view(offset, b.dtype(), &dims);
                    s.attention(&i[0], &view(&i[1])?, &view(&i[2])?, &i[3], &o[0], params)
                });
                got.last().unwrap().clone()
            };
            let what = format!("{n_head}/{n_kv}x{hd} rows {rows} pos0 {pos0} window {window}");
            let half = run(
                float_tensor(&k, DType::F16, &dims),
                float_tensor(&v, DType::F16, &dims),
                0,
            );
            let wide = run(
                float_tensor(&k, DType::F32, &dims),
                float_tensor(&v, DType::F32, &dims),
                0,
            );
            assert!(
                half == wide,
                "{what}: f32 cache (16-byte copies) differs from f16 cache"
            );
            // The same caches one value into a larger buffer of `dt`: for f32 4-byte copies, for
            // f16 (not 16-byte aligned) the direct loads instead of the f16 form's copies.
            let shifted = |x: &[f32], dt: DType| {
                let mut y = vec![0.5f32];
                y.extend_from_slice(x);
                float_tensor(&y, dt, &[cache + 1])
            };
            let narrow = run(shifted(&k, DType::F32), shifted(&v, DType::F32), 4);
            assert!(
                half == narrow,
                "{what}: f32 cache (4-byte copies) differs from f16 cache"
            );
            let direct = run(shifted(&k, DType::F16), shifted(&v, DType::F16), 2);
            assert!(
                half == direct,
                "{what}: f16 cache (direct loads) differs from f16 cache (copies)"
            );
            let vals: Vec<f32> = bytemuck::cast_slice(&half).to_vec();
            assert!(
                vals.iter().all(|x| x.is_finite()),
                "{what}: not every output written"
            );
        }
    }
}
