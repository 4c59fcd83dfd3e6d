//! Every op on the CUDA backend against the CPU backend, on seeded random inputs (never zeros),
//! with a tolerance stated per op and dtype. Write-only outputs start as NaN on both devices, so an
//! element the CUDA kernel forgets to write fails the comparison. Every test that runs an op needs a
//! GPU: ignored by default, it fails where there is none.

// The one-row argmax that keeps its token on the device (`argmax_advance`), in a file of its own.
mod cuda_argmax;
// The sampled draw that keeps its token on the device (`draw_advance`), in a file of its own.
mod cuda_draw;
// The attention op's sliding window (Gemma 3's shapes and small odd ones), in a file of its own.
mod cuda_attention_window;
mod cuda_harness;
// The output heads' one-row products on f32 activations, in a file of their own.
mod cuda_head;
mod cuda_open;
mod cuda_real_shapes;
mod seeded;

use cuda_harness::*;
use cuda_open::cuda_device;
use onepass::backend::cuda;
use onepass::{Buffer, DType, Device, Executor, Mode, Plan, Result, Session};
use rand::RngExt;

#[test]
#[ignore = "needs a CUDA GPU"]
fn norm_family() {
    let dev = cuda_device();
    for (k, &dt) in FLOATS.iter().enumerate() {
        let (atol, rtol) = tol(dt);
        for &(rows, dim) in &[(1usize, 576usize), (7, 64), (3, 1000)] {
            let seed = 100 + k as u64 * 10 + rows as u64;
            let x = random_tensor(dt, &[rows, dim], 2.0, seed);
            let w = random_tensor(dt, &[dim], 1.0, seed + 1);
            let m_row = random_tensor(dt, &[dim], 1.0, seed + 2);
            let m_full = random_tensor(dt, &[rows, dim], 1.0, seed + 3);
            let acc = random_tensor(dt, &[rows, dim], 1.0, seed + 4);
            let out = vec![(dt, vec![rows, dim])];
            let eps = 1e-5;
            // In place into `acc` (compared as an input). The norm values stay below 4 here, so
            // `tol` (f16 atol 2e-3, bf16 1.6e-2) also covers one ulp of a norm value, should a
            // rounding differ where `acc + value` cancels.
            compare(
                &format!("rms_norm_add {dt} {rows}x{dim}"),
                &dev,
                &[x.clone(), w.clone(), acc],
                &[],
                atol,
                rtol,
                &|s, i, _| s.rms_norm_add(&i[0], &i[1], &i[2], eps),
            );
            compare(
                &format!("rms_norm {dt} {rows}x{dim}"),
                &dev,
                &[x.clone(), w.clone()],
                &out,
                atol,
                rtol,
                &|s, i, o| s.rms_norm(&i[0], &i[1], &o[0], eps),
            );
            compare(
                &format!("rms_norm_no_scale {dt} {rows}x{dim}"),
                &dev,
                std::slice::from_ref(&x),
                &out,
                atol,
                rtol,
                &|s, i, o| s.rms_norm_no_scale(&i[0], &o[0], eps),
            );
            for (name, m) in [("row", &m_row), ("full", &m_full)] {
                compare(
                    &format!("rms_norm_mul ({name} m) {dt} {rows}x{dim}"),
                    &dev,
                    &[x.clone(), w.clone(), m.clone()],
                    &out,
                    atol,
                    rtol,
                    &|s, i, o| s.rms_norm_mul(&i[0], Some(&i[1]), &i[2], &o[0], eps),
                );
                compare(
                    &format!("rms_norm_no_scale_mul ({name} m) {dt} {rows}x{dim}"),
                    &dev,
                    &[x.clone(), m.clone()],
                    &out,
                    atol,
                    rtol,
                    &|s, i, o| s.rms_norm_mul(&i[0], None, &i[1], &o[0], eps),
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn elementwise_family() {
    let dev = cuda_device();
    for (k, &dt) in FLOATS.iter().enumerate() {
        let (atol, rtol) = tol(dt);
        let (rows, cols) = (5usize, 300usize);
        let seed = 200 + k as u64 * 10;
        let a = random_tensor(dt, &[rows, cols], 3.0, seed);
        let b = random_tensor(dt, &[rows, cols], 3.0, seed + 1);
        let row = random_tensor(dt, &[cols], 3.0, seed + 2);
        let out = vec![(dt, vec![rows, cols])];
        let none: Vec<(DType, Vec<usize>)> = Vec::new();
        type Bin = fn(&mut Session, &Buffer, &Buffer, &Buffer) -> Result<()>;
        let binaries: [(&str, Bin); 4] = [
            ("add", |s, a, b, o| s.add(a, b, o)),
            ("mul", |s, a, b, o| s.mul(a, b, o)),
            ("swiglu", |s, a, b, o| s.swiglu(a, b, o)),
            ("geglu", |s, a, b, o| s.geglu(a, b, o)),
        ];
        for (name, f) in binaries {
            compare(
                &format!("{name} {dt}"),
                &dev,
                &[a.clone(), b.clone()],
                &out,
                atol,
                rtol,
                &|s, i, o| f(s, &i[0], &i[1], &o[0]),
            );
            compare(
                &format!("{name} in place {dt}"),
                &dev,
                &[a.clone(), b.clone()],
                &none,
                atol,
                rtol,
                &|s, i, _| f(s, &i[0], &i[1], &i[0]),
            );
            // The gated activations do not broadcast.
            if !name.ends_with("glu") {
                compare(
                    &format!("{name} row {dt}"),
                    &dev,
                    &[a.clone(), row.clone()],
                    &out,
                    atol,
                    rtol,
                    &|s, i, o| f(s, &i[0], &i[1], &o[0]),
                );
                compare(
                    &format!("{name} row in place {dt}"),
                    &dev,
                    &[a.clone(), row.clone()],
                    &none,
                    atol,
                    rtol,
                    &|s, i, _| f(s, &i[0], &i[1], &i[0]),
                );
            }
        }
        type Un = fn(&mut Session, &Buffer, &Buffer) -> Result<()>;
        let unaries: [(&str, Un); 6] = [
            ("scale", |s, x, o| s.scale(x, 0.37, o)),
            ("gelu_tanh", |s, x, o| s.gelu_tanh(x, o)),
            ("gelu_erf", |s, x, o| s.gelu_erf(x, o)),
            ("silu", |s, x, o| s.silu(x, o)),
            ("softcap", |s, x, o| s.softcap(x, 2.5, o)),
            ("scale neg", |s, x, o| s.scale(x, -1.75, o)),
        ];
        for (name, f) in unaries {
            // Transcendentals on the GPU round differently from the host's: a few f32 ulps.
            let (at, rt) = if dt == DType::F32 {
                (2e-6, 2e-6)
            } else {
                (atol, rtol)
            };
            compare(
                &format!("{name} {dt}"),
                &dev,
                std::slice::from_ref(&a),
                &out,
                at,
                rt,
                &|s, i, o| f(s, &i[0], &o[0]),
            );
            compare(
                &format!("{name} in place {dt}"),
                &dev,
                std::slice::from_ref(&a),
                &none,
                at,
                rt,
                &|s, i, _| f(s, &i[0], &i[0]),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_family() {
    let dev = cuda_device();
    for (k, &src) in FLOATS.iter().enumerate() {
        for &dst in &FLOATS {
            let x = random_tensor(src, &[3, 257], 5.0, 300 + k as u64);
            // A conversion is exact or one rounding: identical bits are expected.
            compare(
                &format!("copy {src}->{dst}"),
                &dev,
                &[x],
                &[(dst, vec![3, 257])],
                0.0,
                0.0,
                &|s, i, o| s.copy(&i[0], &o[0]),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_family() {
    use onepass::ops::rope::{RopeMode, RopeParams};
    let dev = cuda_device();
    let (rows, heads, head_dim) = (6usize, 3usize, 64usize);
    let positions = i32_tensor(&[0, 1, 7, 100, 2047, 31], &[rows]);
    for (k, &dt) in FLOATS.iter().enumerate() {
        let (atol, rtol) = if dt == DType::F32 {
            (2e-5, 2e-5)
        } else {
            tol(dt)
        };
        let x = random_tensor(dt, &[rows, heads * head_dim], 2.0, 400 + k as u64);
        let ff = float_tensor(
            &random_f32(24, 1.0, 401)
                .iter()
                .map(|v| 1.0 + v.abs())
                .collect::<Vec<_>>(),
            DType::F32,
            &[24],
        );
        let out = vec![(dt, vec![rows, heads * head_dim])];
        let none: Vec<(DType, Vec<usize>)> = Vec::new();
        for mode in [RopeMode::Normal, RopeMode::NeoX] {
            for rotary in [64usize, 48] {
                let what = format!("rope {mode:?} rotary {rotary} {dt}");
                fn params(
                    mode: RopeMode,
                    head_dim: usize,
                    rotary: usize,
                    ff: Option<&Buffer>,
                ) -> RopeParams<'_> {
                    let mut p = RopeParams::new(mode, head_dim, 10000.0);
                    p.rotary_dim = rotary;
                    p.freq_factors = ff;
                    p
                }
                compare(
                    &what,
                    &dev,
                    &[x.clone(), positions.clone()],
                    &out,
                    atol,
                    rtol,
                    &|s, i, o| s.rope(&i[0], &i[1], &o[0], &params(mode, head_dim, rotary, None)),
                );
                compare(
                    &format!("{what} in place"),
                    &dev,
                    &[x.clone(), positions.clone()],
                    &none,
                    atol,
                    rtol,
                    &|s, i, _| s.rope(&i[0], &i[1], &i[0], &params(mode, head_dim, rotary, None)),
                );
                if rotary == 48 {
                    compare(
                        &format!("{what} freq factors"),
                        &dev,
                        &[x.clone(), positions.clone(), ff.clone()],
                        &out,
                        atol,
                        rtol,
                        &|s, i, o| {
                            s.rope(
                                &i[0],
                                &i[1],
                                &o[0],
                                &params(mode, head_dim, rotary, Some(&i[2])),
                            )
                        },
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_cache_family() {
    let dev = cuda_device();
    let (n_kv, head_dim, max_ctx) = (3usize, 64usize, 40usize);
    for (k, &dt) in FLOATS.iter().enumerate() {
        for (rows, pos0) in [(1usize, 0i32), (5, 17), (1, 39)] {
            let new = random_tensor(DType::F32, &[rows, n_kv * head_dim], 2.0, 500 + k as u64);
            let cache = random_tensor(dt, &[n_kv, max_ctx, head_dim], 1.0, 501);
            let step = i32_tensor(&[pos0, 0], &[2]);
            // A conversion to the cache's dtype is one rounding: identical bits.
            compare(
                &format!("kv_write {dt} rows {rows} pos0 {pos0}"),
                &dev,
                &[new, cache, step],
                &[],
                0.0,
                0.0,
                &|s, i, _| s.kv_write(&i[0], &i[1], &i[2]),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn argmax_family() {
    let dev = cuda_device();
    for (rows, n) in [(1usize, 49152usize), (4, 1000), (3, 7)] {
        let mut v = random_f32(rows * n, 10.0, 600 + n as u64);
        // A tie (the first index must win) and a NaN (skipped); in the last row of a
        // several-row case, an infinity (the row gives -1).
        v[n / 2] = 20.0;
        v[n - 1] = 20.0;
        // Ties a thread sees itself: the next value (one four-value load) and, in the long
        // row, a value 4096 on (a later load of the same thread of a 1024-thread block).
        v[n / 2 + 1] = 20.0;
        if n > 8192 {
            v[n / 2 + 4096] = 20.0;
        }
        if n > 3 {
            v[1] = f32::NAN;
        }
        if rows > 1 {
            v[(rows - 1) * n + 2] = f32::INFINITY;
        }
        let x = float_tensor(&v, DType::F32, &[rows, n]);
        compare(
            &format!("argmax {rows}x{n}"),
            &dev,
            &[x],
            &[(DType::I32, vec![rows])],
            0.0,
            0.0,
            &|s, i, o| s.argmax(&i[0], &o[0]),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn embedding_family() {
    let dev = cuda_device();
    let (vocab, dim) = (50usize, 512usize);
    let ids = i32_tensor(&[3, 0, 49, 3, 17], &[5]);
    for (k, &dt) in WEIGHT_DTYPES.iter().enumerate() {
        let table = weight_tensor(dt, vocab, dim, 700 + k as u64);
        // Dequantization is the same float operations in the same order; allow one f32 rounding.
        compare(
            &format!("embedding {dt}"),
            &dev,
            &[table, ids.clone()],
            &[(DType::F32, vec![5, dim])],
            1e-6,
            1e-6,
            &|s, i, o| s.embedding(&i[0], &i[1], &o[0]),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_family() {
    let dev = cuda_device();
    // k = 576 (18 blocks of 32) leaves the block-per-lane-quarter path a partial last round;
    // k = 1280 (5 super-blocks) gives the one-row Q4_K path's half-warps 3 and 2 super-blocks;
    // k = 2080 (65 blocks of 32) gives the f32 one-row path's first lanes nine blocks: two whole
    // batches of quarters loaded before their sums (`mm_dot_blocks`) and a partial one.
    for (n, k) in [(96usize, 512usize), (40, 576), (33, 1280), (24, 2080)] {
        for (j, &dt) in WEIGHT_DTYPES.iter().enumerate() {
            if k % dt.block_elems() != 0 {
                continue;
            }
            let w = weight_tensor(dt, n, k, 800 + j as u64);
            for rows in [1usize, 5, 17] {
                let x = random_tensor(DType::F32, &[rows, k], 1.0, 810 + rows as u64);
                // Sums of 512 products in another order: f32 rounding, a few 1e-6 relative to the
                // sum of magnitudes (about 100 here).
                compare_product(
                    &format!("matmul {dt} {n}x{k} rows {rows}"),
                    &dev,
                    &x,
                    &w,
                    &[],
                    &[(DType::F32, vec![rows, n])],
                    2e-4,
                    1e-4,
                    &|s, i, o| s.matmul(&i[0], &i[1], &o[0]),
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_id_family() {
    let dev = cuda_device();
    let (experts, n, k, rows, slots) = (4usize, 32usize, 256usize, 3usize, 2usize);
    let ids = i32_tensor(&[0, 3, 2, 2, 1, 0], &[rows, slots]);
    for (j, &dt) in WEIGHT_DTYPES.iter().enumerate() {
        let mut w = weight_tensor(dt, experts * n, k, 900 + j as u64);
        w.dims = vec![experts, n, k];
        let x = random_tensor(DType::F32, &[rows, k], 1.0, 910);
        compare(
            &format!("matmul_id {dt}"),
            &dev,
            &[x, w, ids.clone()],
            &[(DType::F32, vec![rows, slots, n])],
            2e-4,
            1e-4,
            &|s, i, o| s.matmul_id(&i[0], &i[1], &i[2], &o[0]),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_family() {
    use onepass::ops::attention::{attention_decode_scratch_len, AttentionParams};
    let dev = cuda_device();
    // A 64-wide head takes the four-value path of the CUDA kernels (and the split form of the
    // decode attention), a 40-wide one the scalar path (and the chunked form); 128-wide heads
    // with 6 query heads a KV head take the split form with two head groups of 4 and 2. At 258
    // keys a split of the split form takes one or two steps of its warps; at 4,101 keys (up to
    // 32 splits) three to five, so each warp's ring of steps in flight wraps around.
    for (hd, n_head, n_kv) in [(64usize, 9usize, 3usize), (128, 12, 2), (40, 9, 3)] {
        let max_ctx = 4200usize;
        for (j, &cache_dt) in [DType::F32, DType::F16].iter().enumerate() {
            let k = random_tensor(cache_dt, &[n_kv, max_ctx, hd], 1.0, 1000 + j as u64);
            let v = random_tensor(cache_dt, &[n_kv, max_ctx, hd], 1.0, 1001 + j as u64);
            for softcap in [0.0f32, 30.0] {
                let mut params = AttentionParams::new(n_head, n_kv, hd);
                if softcap != 0.0 {
                    params = params.with_softcap(softcap);
                }
                // Prefill: 7 rows from pos0 = 130 (keys 0..=136 and more per row).
                let rows = 7usize;
                let q = random_tensor(DType::F32, &[rows, n_head * hd], 1.0, 1010 + j as u64);
                let step = i32_tensor(&[130, 0], &[2]);
                compare(
                    &format!("attention prefill hd {hd} {cache_dt} softcap {softcap}"),
                    &dev,
                    &[q, k.clone(), v.clone(), step],
                    &[(DType::F32, vec![rows, n_head * hd])],
                    2e-5,
                    2e-4,
                    &|s, i, o| s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], params),
                );
                // Decode: one row at pos0 = 257 or 4,100 in chunks of 64.
                for pos0 in [257i32, 4100] {
                    let chunk = 64usize;
                    let q1 = random_tensor(DType::F32, &[1, n_head * hd], 1.0, 1020 + j as u64);
                    let step1 = i32_tensor(&[pos0, 0], &[2]);
                    // The scratch starts zeroed (its tail holds the CUDA kernel's counters, which
                    // must end at zero again: tests/cuda_attention_window checks them). Its records
                    // are not compared: CUDA's split form keeps one per split of the run-time
                    // length, the CPU's one per chunk.
                    let scratch = attention_decode_scratch_len(params, max_ctx, chunk).unwrap();
                    let zeros = float_tensor(&vec![0.0; scratch], DType::F32, &[scratch]);
                    compare_except(
                        &format!(
                            "attention decode hd {hd} {cache_dt} softcap {softcap} pos {pos0}"
                        ),
                        &dev,
                        &[q1, k.clone(), v.clone(), step1, zeros],
                        &[(DType::F32, vec![1, n_head * hd])],
                        2e-5,
                        2e-4,
                        &|s, i, o| {
                            s.attention_decode(
                                &i[0], &i[1], &i[2], &i[3], &i[4], &o[0], params, chunk,
                            )
                        },
                        &[4],
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn softmax_family() {
    let dev = cuda_device();
    // (rows, n, mask rows); |x| up to 40 checks the max subtraction; 49152 is a vocabulary row.
    for (case, &(rows, n, mask_rows)) in [(1usize, 577usize, 1usize), (12, 33, 4), (2, 49_152, 2)]
        .iter()
        .enumerate()
    {
        let seed = 1100 + case as u64;
        let x = random_tensor(DType::F32, &[rows, n], 40.0, seed);
        // About a third of the mask is -inf; mask row 0 entirely (a fully masked row gives zeros).
        let mut r = rng(seed + 1);
        let m: Vec<f32> = (0..mask_rows * n)
            .map(|i| {
                if i < n || r.random_range(0..3) == 0 {
                    f32::NEG_INFINITY
                } else {
                    r.random_range(-2.0..2.0)
                }
            })
            .collect();
        let mask = float_tensor(&m, DType::F32, &[mask_rows, n]);
        let out = [(DType::F32, vec![rows, n])];
        // exp in another implementation and an f64 sum in another order: a few f32 ulps.
        let (atol, rtol) = (1e-7, 1e-5);
        for scale in [1.0f32, 0.125] {
            let what = format!("softmax rows {rows} n {n} scale {scale}");
            compare(
                &what,
                &dev,
                std::slice::from_ref(&x),
                &out,
                atol,
                rtol,
                &|s, i, o| s.softmax(&i[0], &o[0], scale, None),
            );
            compare(
                &format!("{what} masked"),
                &dev,
                &[x.clone(), mask.clone()],
                &out,
                atol,
                rtol,
                &|s, i, o| s.softmax(&i[0], &o[0], scale, Some(&i[1])),
            );
            compare(
                &format!("{what} in place"),
                &dev,
                std::slice::from_ref(&x),
                &[],
                atol,
                rtol,
                &|s, i, _| s.softmax(&i[0], &i[0], scale, None),
            );
            compare(
                &format!("{what} masked in place"),
                &dev,
                &[x.clone(), mask.clone()],
                &[],
                atol,
                rtol,
                &|s, i, _| s.softmax(&i[0], &i[0], scale, Some(&i[1])),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_affine_family() {
    use onepass::quant::{quantize_affine, AffineParams};
    let dev = cuda_device();
    let (n, k) = (48usize, 512usize);
    for (j, (bits, group)) in [(4u32, 32usize), (4, 64), (8, 128)].into_iter().enumerate() {
        let params = AffineParams::new(bits, group).unwrap();
        let q = quantize_affine(&random_f32(n * k, 1.0, 1200 + j as u64), k, params).unwrap();
        let w = Host {
            bytes: bytemuck::cast_slice(&q.packed).to_vec(),
            dtype: DType::U32,
            dims: vec![n, params.words_per_row(k)],
        };
        let groups = [n, k / group];
        for sdt in [DType::F32, DType::F16] {
            let scales = float_tensor(&q.scales, sdt, &groups);
            let biases = float_tensor(&q.biases, sdt, &groups);
            for rows in [1usize, 3] {
                let x = random_tensor(DType::F32, &[rows, k], 1.0, 1210 + rows as u64);
                // Same dequantized weights (no fused multiply-add on either side); the sums of
                // 512 products differ in order only.
                compare(
                    &format!("matmul_affine bits {bits} group {group} scales {sdt} rows {rows}"),
                    &dev,
                    &[x, w.clone(), scales.clone(), biases.clone()],
                    &[(DType::F32, vec![rows, n])],
                    2e-4,
                    1e-4,
                    &|s, i, o| s.matmul_affine(&i[0], &i[1], &i[2], &i[3], bits, group, &o[0]),
                );
            }
        }
    }
}

/// Kernels of the CPU catalog that have no CUDA kernel on purpose. Empty: every op runs on both.
const CPU_ONLY_KERNELS: &[&str] = &[];

#[test]
fn every_cpu_kernel_has_a_cuda_kernel() {
    // Needs no GPU: compares the CPU registry with the names in the CUDA sources.
    let Device::Cpu(cpu) = Device::cpu(1).unwrap() else {
        panic!("Device::cpu gave another backend")
    };
    let cuda_names = cuda::all_kernel_names();
    let missing: Vec<&str> = cpu
        .kernel_names()
        .into_iter()
        .filter(|n| !cuda_names.contains(n) && !CPU_ONLY_KERNELS.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "CPU kernels without a CUDA kernel: {missing:?}"
    );
    assert!(cuda_names.len() >= cpu.kernel_names().len() - CPU_ONLY_KERNELS.len());
}

/// Runs `op` in a direct session (`recorded`: recorded and optimized) and returns its error.
fn run_err(
    dev: &Device,
    inputs: &[Host],
    outputs: &[(DType, Vec<usize>)],
    recorded: bool,
    op: &OpFn<'_>,
) -> String {
    let ins: Vec<Buffer> = inputs
        .iter()
        .map(|h| dev.upload_bytes(&h.bytes, h.dtype, &h.dims).unwrap())
        .collect();
    let outs: Vec<Buffer> = outputs
        .iter()
        .map(|(dt, dims)| dev.alloc(*dt, dims).unwrap())
        .collect();
    let mode = if recorded {
        Mode::Recorded
    } else {
        Mode::Direct
    };
    let mut s = Executor::new(dev.clone()).begin(mode);
    let plan = if recorded {
        Plan::OPTIMIZED
    } else {
        Plan::SEQUENTIAL
    };
    match op(&mut s, &ins, &outs).and_then(|()| s.finish(&plan)) {
        Ok(_) => panic!("{}: the bad argument was not reported", dev.name()),
        Err(e) => e.to_string(),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_detected_bad_arguments_are_errors() {
    use onepass::ops::attention::{attention_decode_scratch_len, AttentionParams};
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for recorded in [false, true] {
        // A token id outside the vocabulary.
        let (vocab, dim) = (50usize, 64usize);
        let table = weight_tensor(DType::Q8_0, vocab, dim, 1300);
        let ids = i32_tensor(&[3, 50, 7], &[3]);
        let out = [(DType::F32, vec![3, dim])];
        let emb = |s: &mut Session, i: &[Buffer], o: &[Buffer]| s.embedding(&i[0], &i[1], &o[0]);
        let e = run_err(&dev, &[table.clone(), ids.clone()], &out, recorded, &emb);
        eprintln!(
            "cuda: {e}\ncpu:  {}",
            run_err(&cpu, &[table.clone(), ids], &out, recorded, &emb)
        );
        assert!(
            e.contains("embedding_q8_0")
                && e.contains("token id 50 at ids[1]")
                && e.contains("0..50"),
            "{e}"
        );
        // The record is cleared: a good pass on the same device runs.
        compare(
            "embedding after an error",
            &dev,
            &[table, i32_tensor(&[3, 49], &[2])],
            &[(DType::F32, vec![2, dim])],
            0.0,
            0.0,
            &emb,
        );

        // pos0 outside the cache in kv_write.
        let (n_kv, hd, max_ctx) = (3usize, 64usize, 40usize);
        let new = random_tensor(DType::F32, &[2, n_kv * hd], 1.0, 1310);
        let cache = random_tensor(DType::F16, &[n_kv, max_ctx, hd], 1.0, 1311);
        let kv = |s: &mut Session, i: &[Buffer], _: &[Buffer]| s.kv_write(&i[0], &i[1], &i[2]);
        let e = run_err(
            &dev,
            &[new.clone(), cache.clone(), i32_tensor(&[39, 0], &[2])],
            &[],
            recorded,
            &kv,
        );
        eprintln!("cuda: {e}");
        assert!(
            e.contains("kv_write_f32_f16")
                && e.contains("pos0 39 with 2 rows")
                && e.contains("40 positions"),
            "{e}"
        );
        let e = run_err(
            &dev,
            &[new, cache, i32_tensor(&[-1, 0], &[2])],
            &[],
            recorded,
            &kv,
        );
        assert!(
            e.contains("kv_write_f32_f16") && e.contains("pos0 -1"),
            "{e}"
        );

        // pos0 outside the cache in attention (prefill and decode).
        let params = AttentionParams::new(9, n_kv, hd);
        let k = random_tensor(DType::F32, &[n_kv, max_ctx, hd], 1.0, 1320);
        let v = random_tensor(DType::F32, &[n_kv, max_ctx, hd], 1.0, 1321);
        let q = random_tensor(DType::F32, &[2, 9 * hd], 1.0, 1322);
        let e = run_err(
            &dev,
            &[q, k.clone(), v.clone(), i32_tensor(&[39, 0], &[2])],
            &[(DType::F32, vec![2, 9 * hd])],
            recorded,
            &|s, i, o| s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], params),
        );
        eprintln!("cuda: {e}");
        assert!(e.contains("attention_f32") && e.contains("pos0 39"), "{e}");
        let q1 = random_tensor(DType::F32, &[1, 9 * hd], 1.0, 1323);
        let scratch = attention_decode_scratch_len(params, max_ctx, 16).unwrap();
        let e = run_err(
            &dev,
            &[q1, k, v, i32_tensor(&[40, 0], &[2])],
            &[(DType::F32, vec![scratch]), (DType::F32, vec![1, 9 * hd])],
            recorded,
            &|s, i, o| s.attention_decode(&i[0], &i[1], &i[2], &i[3], &o[0], &o[1], params, 16),
        );
        eprintln!("cuda: {e}");
        assert!(
            e.contains("attention_decode_f32") && e.contains("pos0 40"),
            "{e}"
        );

        // An expert id outside 0..experts.
        let (experts, n, kk) = (4usize, 32usize, 256usize);
        let mut w = weight_tensor(DType::Q4_0, experts * n, kk, 1330);
        w.dims = vec![experts, n, kk];
        let x = random_tensor(DType::F32, &[2, kk], 1.0, 1331);
        let e = run_err(
            &dev,
            &[x, w, i32_tensor(&[0, 1, 2, -3], &[2, 2])],
            &[(DType::F32, vec![2, 2, n])],
            recorded,
            &|s, i, o| s.matmul_id(&i[0], &i[1], &i[2], &o[0]),
        );
        eprintln!("cuda: {e}");
        assert!(
            e.contains("matmul_id_q4_0") && e.contains("expert id -3 at ids[3]"),
            "{e}"
        );
    }
}
