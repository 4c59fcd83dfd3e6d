//! The matmul ops through a CPU session against a float64 reference of the dequantized weights.
//!
//! Tolerance: f32 accumulation, `|got - want| <= 1e-4 * sum_i |x_i| * (|w_i| + 1)` per output
//! (the `+ 1` covers the Q4_1 / affine split `d * sum(x q) + m * sum(x)`, whose terms can be
//! larger than `|w|`; in practice errors are below 1e-6 of that scale).

use super::*;
use crate::backend::Device;
use crate::quant::{dequantize, quantize, quantize_affine};
use crate::session::{Executor, Mode, Plan};
use crate::testutil::random_f32;

fn device() -> Device {
    Device::cpu(2).unwrap()
}

/// Reference `y[r, o]` and its error scale, in f64 from dequantized weights `wf` `[n, k]`.
fn reference(x: &[f32], wf: &[f32], rows: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; rows * n];
    let mut s = vec![0f64; rows * n];
    for r in 0..rows {
        for o in 0..n {
            for i in 0..k {
                let (a, b) = (x[r * k + i] as f64, wf[o * k + i] as f64);
                y[r * n + o] += a * b;
                s[r * n + o] += a.abs() * (b.abs() + 1.0);
            }
        }
    }
    (y, s)
}

fn assert_matches(got: &[f32], want: &[f64], scale: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let tol = 1e-4 * s + 1e-30;
        assert!(
            ((*g as f64) - w).abs() <= tol,
            "{what}: index {i}: got {g}, want {w} (tol {tol:e})"
        );
    }
}

fn run_matmul(dtype: DType, rows: usize, k: usize, n: usize, seed: u64) {
    let dev = device();
    let x = random_f32(rows * k, 1.0, seed);
    let wv = random_f32(n * k, 0.5, seed + 1000);
    let wb = quantize(dtype, &wv).unwrap();
    let wf = dequantize(dtype, &wb).unwrap();
    let xb = dev.upload(&x, &[rows, k]).unwrap();
    let wbuf = dev.upload_bytes(&wb, dtype, &[n, k]).unwrap();
    let out = dev.alloc(DType::F32, &[rows, n]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.matmul(&xb, &wbuf, &out).unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
    let got: Vec<f32> = dev.download(&out).unwrap();
    let (want, scale) = reference(&x, &wf, rows, k, n);
    assert_matches(
        &got,
        &want,
        &scale,
        &format!("matmul {dtype} rows {rows} k {k} n {n} seed {seed}"),
    );
}

#[test]
fn matmul_q4_1_q8_0_f32_odd_shapes() {
    for dtype in [DType::Q4_1, DType::Q8_0, DType::F32] {
        for (k, n) in [(64, 1), (64, 7), (576, 192), (1536, 7)] {
            for rows in [1, 2, 17] {
                run_matmul(dtype, rows, k, n, (k * 31 + n * 7 + rows) as u64);
            }
        }
    }
}

#[test]
fn matmul_other_formats_odd_shapes() {
    for dtype in [DType::Q4_0, DType::F16, DType::BF16] {
        for (k, n) in [(64, 7), (576, 192), (1536, 1)] {
            for rows in [1, 2, 17] {
                run_matmul(dtype, rows, k, n, (k + n + rows) as u64);
            }
        }
    }
    for dtype in [DType::Q4K, DType::Q6K] {
        for (k, n) in [(256, 7), (1536, 19), (512, 1)] {
            for rows in [1, 2, 17] {
                run_matmul(dtype, rows, k, n, (k + n + rows) as u64 + 5);
            }
        }
    }
}

/// Q5_0 at odd sizes (one block, an odd number of blocks, one output, output counts that are not
/// a multiple of the CPU's 16-column tile) and at the Gemma 3 270M shapes (q 1024x640, k and v
/// 256x640, gate and up 2048x640): one row (the vector form's fused dequantize-and-dot) and 3 and
/// 17 rows (the packed-tile form).
#[test]
fn matmul_q5_0_odd_and_real_shapes() {
    for (k, n) in [
        (32, 5),
        (96, 1),
        (608, 33),
        (640, 1024),
        (640, 256),
        (640, 2048),
    ] {
        for rows in [1, 3, 17] {
            run_matmul(DType::Q5_0, rows, k, n, (k * 13 + n + rows) as u64);
        }
    }
}

#[test]
fn matmul_recorded_and_3d_activations() {
    let dev = device();
    let (k, n) = (64, 9);
    let x = random_f32(2 * 3 * k, 1.0, 77);
    let wv = random_f32(n * k, 1.0, 78);
    let xb = dev.upload(&x, &[2, 3, k]).unwrap();
    let wbuf = dev.upload(&wv, &[n, k]).unwrap();
    let out = dev.alloc(DType::F32, &[2, 3, n]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
    s.matmul(&xb, &wbuf, &out).unwrap();
    s.finish(&Plan::OPTIMIZED).unwrap();
    let got: Vec<f32> = dev.download(&out).unwrap();
    let (want, scale) = reference(&x, &wv, 6, k, n);
    assert_matches(&got, &want, &scale, "recorded 3-d matmul");
}

#[test]
fn matmul_affine_matches_reference() {
    let dev = device();
    for (bits, group, half_scales) in [
        (4, 32, false),
        (4, 64, true),
        (8, 128, false),
        (8, 32, true),
    ] {
        for rows in [1, 3, 17] {
            let (k, n) = (256, 7);
            let seed = (bits * 100 + group as u32 + rows as u32) as u64;
            let x = random_f32(rows * k, 1.0, seed);
            let p = AffineParams::new(bits, group).unwrap();
            let mut m = quantize_affine(&random_f32(n * k, 1.0, seed + 1), k, p).unwrap();
            if half_scales {
                for v in m.scales.iter_mut().chain(m.biases.iter_mut()) {
                    *v = half::f16::from_f32(*v).to_f32();
                }
            }
            let wf = m.dequantize();
            let g = k / group;
            let (sb, bb) = if half_scales {
                let h = |v: &[f32]| {
                    v.iter()
                        .map(|&f| half::f16::from_f32(f))
                        .collect::<Vec<_>>()
                };
                (
                    dev.upload(&h(&m.scales), &[n, g]).unwrap(),
                    dev.upload(&h(&m.biases), &[n, g]).unwrap(),
                )
            } else {
                (
                    dev.upload(&m.scales, &[n, g]).unwrap(),
                    dev.upload(&m.biases, &[n, g]).unwrap(),
                )
            };
            let xb = dev.upload(&x, &[rows, k]).unwrap();
            let wb = dev.upload(&m.packed, &[n, k * bits as usize / 32]).unwrap();
            let out = dev.alloc(DType::F32, &[rows, n]).unwrap();
            let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
            s.matmul_affine(&xb, &wb, &sb, &bb, bits, group, &out)
                .unwrap();
            s.finish(&Plan::SEQUENTIAL).unwrap();
            let got: Vec<f32> = dev.download(&out).unwrap();
            let (want, scale) = reference(&x, &wf, rows, k, n);
            assert_matches(
                &got,
                &want,
                &scale,
                &format!("affine bits {bits} group {group} rows {rows}"),
            );
        }
    }
}

#[test]
fn matmul_id_routes_rows_to_experts() {
    let dev = device();
    for dtype in [
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::F32,
        DType::Q4K,
    ] {
        let (experts, k, n, rows, slots) = (4, 256, 7, 3, 2);
        let wv = random_f32(experts * n * k, 0.5, 90);
        let wb = quantize(dtype, &wv).unwrap();
        let wf = dequantize(dtype, &wb).unwrap();
        let x = random_f32(rows * k, 1.0, 91);
        let ids: Vec<i32> = vec![3, 0, 1, 1, 2, 3];
        let xb = dev.upload(&x, &[rows, k]).unwrap();
        let wbuf = dev.upload_bytes(&wb, dtype, &[experts, n, k]).unwrap();
        let ib = dev.upload(&ids, &[rows, slots]).unwrap();
        let out = dev.alloc(DType::F32, &[rows, slots, n]).unwrap();
        let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
        s.matmul_id(&xb, &wbuf, &ib, &out).unwrap();
        s.finish(&Plan::SEQUENTIAL).unwrap();
        let got: Vec<f32> = dev.download(&out).unwrap();
        for r in 0..rows {
            for sl in 0..slots {
                let e = ids[r * slots + sl] as usize;
                let (want, scale) = reference(
                    &x[r * k..(r + 1) * k],
                    &wf[e * n * k..(e + 1) * n * k],
                    1,
                    k,
                    n,
                );
                let g = &got[(r * slots + sl) * n..(r * slots + sl + 1) * n];
                assert_matches(
                    g,
                    &want,
                    &scale,
                    &format!("matmul_id {dtype} row {r} slot {sl}"),
                );
            }
        }
    }
}

#[test]
fn matmul_id_bad_expert_is_a_kernel_error() {
    let dev = device();
    let (experts, k, n) = (2, 64, 3);
    let wbuf = dev
        .upload(&random_f32(experts * n * k, 1.0, 1), &[experts, n, k])
        .unwrap();
    let xb = dev.upload(&random_f32(k, 1.0, 2), &[1, k]).unwrap();
    let ib = dev.upload(&[5i32], &[1, 1]).unwrap();
    let out = dev.alloc(DType::F32, &[1, 1, n]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.matmul_id(&xb, &wbuf, &ib, &out).unwrap();
    let err = s.finish(&Plan::SEQUENTIAL).unwrap_err().to_string();
    assert!(err.contains("expert id 5"), "{err}");
}

#[test]
fn wrong_dtypes_and_shapes_name_op_and_argument() {
    let dev = device();
    let x = dev.alloc(DType::F32, &[2, 64]).unwrap();
    let w = dev.alloc(DType::Q4_1, &[8, 64]).unwrap();
    let out = dev.alloc(DType::F32, &[2, 8]).unwrap();
    assert!(matmul(&x, &w, &out).is_ok());
    let cases = [
        (
            matmul(&dev.alloc(DType::F16, &[2, 64]).unwrap(), &w, &out),
            "`x`",
        ),
        (
            matmul(&x, &dev.alloc(DType::I32, &[8, 64]).unwrap(), &out),
            "`w`",
        ),
        (
            matmul(&x, &dev.alloc(DType::Q4_1, &[8, 96]).unwrap(), &out),
            "`x`",
        ),
        (
            matmul(&x, &w, &dev.alloc(DType::F32, &[2, 7]).unwrap()),
            "`out`",
        ),
        (
            matmul(&x, &w, &dev.alloc(DType::F32, &[3, 8]).unwrap()),
            "`out`",
        ),
        (
            matmul(&x, &dev.alloc(DType::Q8_0, &[2, 8, 64]).unwrap(), &out),
            "`w`",
        ),
    ];
    for (i, (r, arg)) in cases.into_iter().enumerate() {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("case {i} should fail"))
            .to_string();
        assert!(e.starts_with("matmul") && e.contains(arg), "case {i}: {e}");
    }
    let wu = dev.alloc(DType::U32, &[8, 8]).unwrap();
    let sc = dev.alloc(DType::F32, &[8, 2]).unwrap();
    let e = matmul_affine(&x, &wu, &sc, &sc, 3, 32, &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("matmul_affine") && e.contains("`bits`"), "{e}");
    let e = matmul_affine(
        &x,
        &wu,
        &sc,
        &dev.alloc(DType::F16, &[8, 2]).unwrap(),
        4,
        32,
        &out,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("matmul_affine") && e.contains("`biases`"), "{e}");
    let ids = dev.alloc(DType::F32, &[2, 1]).unwrap();
    let w3 = dev.alloc(DType::Q8_0, &[2, 8, 64]).unwrap();
    let e = matmul_id(&x, &w3, &ids, &dev.alloc(DType::F32, &[2, 1, 8]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("matmul_id") && e.contains("`ids`"), "{e}");
}

/// Where a one-row product may read int8 activations on a GPU (its launch carries the int8 row's
/// shared memory, `k + k / 4` bytes): the 32-value block formats, Q4_K and Q6_K (rows of an even
/// count of super-blocks) from 2^21 weights, in blocks of fewer warps for narrow products; never a
/// small product, Q6_K rows of an odd count, a float format, two rows, or a product recorded
/// through `matmul_f32_activations`. The CPU runs the f32 kernel whatever the launch.
#[test]
fn the_int8_one_row_form_is_chosen_by_format_and_size() {
    let dev = device();
    let launch = |dt: DType, rows: usize, n: usize, k: usize, int8: bool| {
        let x = dev.alloc(DType::F32, &[rows, k]).unwrap();
        let w = dev.alloc(dt, &[n, k]).unwrap();
        let out = dev.alloc(DType::F32, &[rows, n]).unwrap();
        let d = if int8 {
            matmul(&x, &w, &out)
        } else {
            matmul_f32_activations(&x, &w, &out)
        };
        let g = d.unwrap().grid();
        (g.shared_bytes, g.threads[0], g.blocks[0])
    };
    assert_eq!(launch(DType::Q4_0, 1, 4096, 4096, true), (5120, 512, 128));
    assert_eq!(launch(DType::Q8_0, 1, 4096, 14336, true), (17920, 512, 128));
    assert_eq!(launch(DType::Q4_1, 1, 128256, 4096, true), (5120, 512, 132));
    // Sixteen-warp blocks, one an SM, two outputs a warp; 2048 outputs: one a warp, so that 128
    // blocks spread over the SMs; 576 outputs: eight-warp blocks.
    assert_eq!(launch(DType::Q5_0, 1, 2048, 2048, true), (2560, 512, 128));
    assert_eq!(launch(DType::Q4_0, 1, 576, 8192, true), (10240, 256, 72));
    // Q4_K too (its super-blocks' 32-value sub-blocks against the int8 row's blocks).
    assert_eq!(launch(DType::Q4K, 1, 4096, 4096, true), (5120, 512, 128));
    // Q6_K in rows of an even count of super-blocks (word-aligned rows).
    assert_eq!(launch(DType::Q6K, 1, 4096, 4096, true), (5120, 512, 128));
    // Qwen 3 0.6B's o and down products (2^21 and 3 x 2^20 weights): a warp an output.
    assert_eq!(launch(DType::Q4K, 1, 1024, 2048, true), (2560, 512, 64));
    assert_eq!(launch(DType::Q6K, 1, 1024, 3072, true), (3840, 512, 64));
    for (dt, rows, n, k, int8) in [
        (DType::Q4_0, 1, 576, 1536, true),
        // Gemma 3 270M's down product: 1.3 x 2^20 weights.
        (DType::Q6K, 1, 640, 2048, true),
        (DType::Q6K, 1, 4096, 4352, true),
        (DType::F16, 1, 4096, 4096, true),
        (DType::Q4_0, 2, 4096, 4096, true),
        (DType::Q4_0, 1, 4096, 4096, false),
    ] {
        let (shared, threads, _) = launch(dt, rows, n, k, int8);
        assert_eq!(
            (shared, threads),
            (0, 128),
            "{dt} rows {rows} {n}x{k} int8 {int8}"
        );
    }
}

/// The launch shape of a prompt product (64 rows and more, the tensor-core kernels): a grid of
/// `[output tiles, row tiles]` with the pipelined form's shared memory (the Hopper form's where
/// it can apply); the kernel reads a tile
/// height of 64 rows from a grid one block row per 64 rows high, which the host asks for only for
/// the block formats (the pipelined form) and only where 128-row tiles would number at most
/// 132 (an H100's SMs). The CPU runs its kernel whatever the launch.
#[test]
fn prompt_products_take_64_row_tiles_where_128_row_tiles_leave_sms_idle() {
    let dev = device();
    let launch = |dt: DType, rows: usize, n: usize, k: usize| {
        let x = dev.alloc(DType::F32, &[rows, k]).unwrap();
        let w = dev.alloc(dt, &[n, k]).unwrap();
        let out = dev.alloc(DType::F32, &[rows, n]).unwrap();
        let g = matmul(&x, &w, &out).unwrap().grid();
        (g.blocks[0], g.blocks[1], g.threads[0], g.shared_bytes)
    };
    // The f16-activation form's (`MMH_SMEM`), larger than the f32 pipelined form's (`MMP_SMEM`).
    let smem = 3 * (128 * 72 * 2 + 128 * 44) + 2 * 128 * 72 * 2;
    // The f32 forms never ask for the Hopper form's (the narrowing does, for the f16 forms it
    // makes: `ops::narrow`). The 8B's q product at 512 rows: 32 x 4 = 128 tiles of 128 rows, so
    // 64-row tiles.
    assert_eq!(launch(DType::Q4_0, 512, 4096, 4096), (32, 8, 256, smem));
    // Its gate product: 112 x 4 = 448 tiles, 128 rows each.
    assert_eq!(launch(DType::Q4_0, 512, 14336, 4096), (112, 4, 256, smem));
    // 133 tiles (one more than the SMs): 128 rows.
    assert_eq!(launch(DType::Q8_0, 128, 133 * 128, 64), (133, 1, 256, smem));
    // 100 rows: two 64-row tiles, against one of 128.
    assert_eq!(launch(DType::Q4_1, 100, 576, 576), (5, 2, 256, smem));
    // The K-quants are pipelined too; float weights keep 128-row tiles (their two-buffer form
    // has no other).
    assert_eq!(launch(DType::Q4K, 512, 4096, 4096), (32, 8, 256, smem));
    assert_eq!(launch(DType::Q6K, 512, 4096, 4096), (32, 8, 256, smem));
    assert_eq!(launch(DType::F16, 100, 576, 576), (5, 1, 256, smem));
    // Below 64 rows the products keep their CUDA-core forms (blocks of 128 threads).
    assert_eq!(launch(DType::Q4_0, 63, 4096, 4096).2, 128);
}

/// An output head of a 32-value block format takes a warp every four outputs (Q8_0 only for
/// rows of up to 1,024 values); every other f32 one-row product a warp an output.
#[test]
fn given_head_shapes_when_sizing_the_f32_one_row_grid_then_four_rows_a_warp_where_the_kernel_takes_them(
) {
    assert_eq!(head_warps(DType::Q4_0, 128_256, 4096), 32_064);
    assert_eq!(head_warps(DType::Q4_1, 16_387, 2080), 4097);
    assert_eq!(head_warps(DType::Q5_0, 16_384, 64), 4096);
    assert_eq!(head_warps(DType::Q8_0, 49_152, 576), 12_288);
    assert_eq!(head_warps(DType::Q8_0, 128_256, 2048), 128_256);
    assert_eq!(head_warps(DType::Q4_0, 16_383, 4096), 16_383);
    assert_eq!(head_warps(DType::F16, 128_256, 4096), 128_256);
    assert_eq!(head_warps(DType::Q6K, 128_256, 4096), 128_256);
}

/// Q4_0, Q8_0, Q4_K and Q6_K output heads of rows of a multiple of 256 values take the tensor-core
/// form: eight-warp blocks, a warp every 16 outputs, the shared memory that selects the form (a
/// stage of 9, 17, 9 or 15 words a row; Q4_K's with 4 bytes more a 32-value block for the sums of
/// x); other formats, narrow products, other widths and Q6_K heads whose last row ends inside a
/// 16-byte word keep the warp grid.
#[test]
fn given_q4_0_q8_0_q4_k_and_q6_k_heads_when_sizing_the_grid_then_the_tensor_core_form_takes_them() {
    let launch = |w, n, k| {
        let g = head_grid(w, n, k);
        (g.blocks[0], g.threads[0], g.shared_bytes)
    };
    assert_eq!(launch(DType::Q4_0, 128_256, 4096), (1002, 256, 34_832));
    assert_eq!(launch(DType::Q8_0, 128_256, 2048), (1002, 256, 43_024));
    assert_eq!(launch(DType::Q4K, 128_256, 4096), (1002, 256, 35_344));
    assert_eq!(launch(DType::Q6K, 128_256, 4096), (1002, 256, 47_120));
    // The 8B shape's Q8_0 head (50 KiB of shared memory), SmolLM2's (576 values a row).
    assert_eq!(launch(DType::Q8_0, 128_256, 4096), (1002, 256, 51_216));
    assert_eq!(launch(DType::Q8_0, 49_152, 576), (3072, 128, 0));
    // Q6_K rows of 256 values (210 bytes): 16,387 of them end inside a word, 16,392 do not.
    assert_eq!(launch(DType::Q6K, 16_387, 256), (16_387 / 4 + 1, 128, 0));
    assert_eq!(launch(DType::Q6K, 16_392, 256), (129, 256, 31_760));
    assert_eq!(launch(DType::Q4_1, 128_256, 4096), (32_064 / 4, 128, 0));
    assert_eq!(launch(DType::Q4_0, 16_383, 4096), (16_383 / 4 + 1, 128, 0));
    assert_eq!(launch(DType::Q8_0, 16_387, 2080), (16_387 / 4 + 1, 128, 0));
}
