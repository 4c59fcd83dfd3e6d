//! Q5_0 weights on the CUDA backend against the CPU backend at the shapes of Gemma 3 270M (hidden
//! 640; q 1024x640, k and v 256x640, gate and up 2048x640; 4 query heads and 1 KV head of 256) and
//! at odd sizes: output counts that are not a multiple of the tile (the tiled form's 64 outputs,
//! a warp's 8 blocks a round), 1, 3, 17 and 40 input rows (the vector form, the row-group form,
//! the tiled form with a partial row tile). Seeded random inputs, never zeros; write-only outputs
//! start as NaN. `cuda_ops.rs` covers Q5_0 with the other formats at their shapes (every family,
//! the staged one-row form at 2048 to 14336 values a row, the `_shared` fused kernels).
//!
//! Tolerances: both backends sum the same products of the same dequantized weights in another
//! order in f32. With |x| and |w| below 1 the sum of magnitudes is about `k / 4` and the rounding
//! of either order stays under 3e-6 of it (a few 1e-5 here); the bound is `1e-6 k` absolute plus
//! `1e-4` relative, while one wrong quant moves a product by `d * 16 * |x|`, about 0.5. Every test
//! needs a GPU: ignored by default, it fails where there is none.

// The harness serves `cuda_ops.rs`; this file uses part of it.
#[allow(dead_code, unused_imports)]
mod cuda_harness;
mod cuda_open;
mod seeded;

use cuda_harness::{
    compare, compare_product, cpu_activations, i32_tensor, random_tensor, weight_tensor, Host,
};
use cuda_open::cuda_device;
use onepass::{DType, Device, Executor, Mode, Plan};

/// Gemma 3 270M: hidden size, query heads, KV heads, head size, FFN size.
const GEMMA: (usize, usize, usize, usize, usize) = (640, 4, 1, 256, 2048);

/// The absolute tolerance of sums of `k` products (see the module documentation).
fn atol(k: usize) -> f64 {
    1e-6 * k as f64
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn q5_0_matmul_at_gemma_3_shapes_and_odd_sizes() {
    let dev = cuda_device();
    let (dim, nh, nkv, hd, ffn) = GEMMA;
    let shapes = [
        (nh * hd, dim),
        (nkv * hd, dim),
        (ffn, dim),
        (dim, ffn),
        (1000, dim),
        (7, 96),
        (65, 32),
    ];
    for (s, &(n, k)) in shapes.iter().enumerate() {
        let w = weight_tensor(DType::Q5_0, n, k, 2000 + s as u64);
        for rows in [1usize, 3, 17, 40] {
            let x = random_tensor(DType::F32, &[rows, k], 1.0, 2100 + (10 * s + rows) as u64);
            compare_product(
                &format!("matmul q5_0 {n}x{k} rows {rows}"),
                &dev,
                &x,
                &w,
                &[],
                &[(DType::F32, vec![rows, n])],
                atol(k),
                1e-4,
                &|s, i, o| s.matmul(&i[0], &i[1], &o[0]),
            );
        }
    }
}

/// `acc += x . W` on `dev`, recorded and optimized (`fused`: the matmul + add rule makes one
/// `matmul_add_q5_0` dispatch) or op by op in direct mode; the final `acc` and the fusion count.
fn matmul_add(dev: &Device, w: &Host, x: &Host, acc: &Host, fused: bool) -> (Vec<f32>, usize) {
    let up = |h: &Host| dev.upload_bytes(&h.bytes, h.dtype, &h.dims).unwrap();
    let (wb, xb, ab) = (up(w), up(x), up(acc));
    let (rows, n) = (x.dims[0], w.dims[0]);
    let proj = dev.alloc(DType::F32, &[rows, n]).unwrap();
    // Overwritten after the add, so the optimizer can prove the product dead.
    let fill = up(&random_tensor(DType::F32, &[rows, n], 1.0, 2299));
    let mode = if fused { Mode::Recorded } else { Mode::Direct };
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.matmul(&xb, &wb, &proj).unwrap();
    s.add_inplace(&ab, &proj).unwrap();
    s.copy(&fill, &proj).unwrap();
    let report = s.finish(&Plan::OPTIMIZED).unwrap();
    (dev.download::<f32>(&ab).unwrap(), report.fusions)
}

/// The fused product and residual add at the attention output and down projection shapes: on the
/// GPU the fused kernel gives the pair's bits (its `out + product` is the add kernel's), and it
/// agrees with the CPU's (fused the same way) within the tolerance.
#[test]
#[ignore = "needs a CUDA GPU"]
fn q5_0_matmul_add_at_gemma_3_shapes() {
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    let (dim, nh, _, hd, ffn) = GEMMA;
    for (s, &(n, k)) in [(dim, nh * hd), (dim, ffn), (37, 640)].iter().enumerate() {
        let w = weight_tensor(DType::Q5_0, n, k, 2200 + s as u64);
        for rows in [1usize, 3, 17, 40] {
            let seed = 2210 + (10 * s + rows) as u64;
            let x = random_tensor(DType::F32, &[rows, k], 1.0, seed);
            let acc = random_tensor(DType::F32, &[rows, n], 1.0, seed + 5);
            let what = format!("matmul_add q5_0 {n}x{k} rows {rows}");
            let (fused, fusions) = matmul_add(&dev, &w, &x, &acc, true);
            assert_eq!(fusions, 1, "{what}: the GPU fuses the pair");
            let (direct, _) = matmul_add(&dev, &w, &x, &acc, false);
            assert!(
                fused
                    .iter()
                    .zip(&direct)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: fused and op-by-op results differ on the GPU"
            );
            // The CPU multiplies what CUDA's one-row product stands for (int8-rounded x).
            let cpu_x = cpu_activations(&x, &w);
            let (want, cpu_fusions) = matmul_add(&cpu, &w, &cpu_x, &acc, true);
            assert_eq!(cpu_fusions, 1, "{what}: the CPU fuses the pair");
            for (i, (g, c)) in fused.iter().zip(&want).enumerate() {
                let tol = atol(k) + 1e-4 * f64::from(c.abs());
                assert!(
                    f64::from((g - c).abs()) <= tol,
                    "{what}: element {i}: cuda {g}, cpu {c} (tol {tol:e})"
                );
            }
        }
    }
}

/// The fused block ops at the Gemma 3 270M widths (640 activations: the per-warp normalized row,
/// rows of 20 blocks), one row and three, and at an odd size (3 heads of 32, 17 FFN rows).
#[test]
#[ignore = "needs a CUDA GPU"]
fn q5_0_fused_block_ops_at_gemma_3_widths() {
    use onepass::ops::fused_block::{GateActivation, QkvRope};
    use onepass::ops::rope::RopeMode;
    let dev = cuda_device();
    for (c, &(dim, nh, nkv, hd, ffn)) in [GEMMA, (96, 3, 1, 32, 17)].iter().enumerate() {
        for rows in [1usize, 3] {
            let seed = 2300 + (10 * c + rows) as u64;
            let x = random_tensor(DType::F32, &[rows, dim], 1.0, seed);
            let norm = random_tensor(DType::F32, &[dim], 1.0, seed + 1);
            let positions: Vec<i32> = (0..rows as i32).map(|r| 5 + r).collect();
            let ctx = 16;
            let what = format!("fused q5_0 dim {dim} rows {rows}");
            // Normalized activations reach about 1.7: twice the plain product's bound.
            let (atol, rtol) = (2.0 * atol(dim), 1e-4);
            compare(
                &format!("{what}: norm_qkv_rope"),
                &dev,
                &[
                    x.clone(),
                    norm.clone(),
                    weight_tensor(DType::Q5_0, nh * hd, dim, seed + 2),
                    weight_tensor(DType::Q5_0, nkv * hd, dim, seed + 3),
                    weight_tensor(DType::Q5_0, nkv * hd, dim, seed + 4),
                    i32_tensor(&positions, &[rows]),
                    i32_tensor(&[5], &[1]),
                ],
                &[
                    (DType::F32, vec![rows, nh * hd]),
                    (DType::F32, vec![nkv, ctx, hd]),
                    (DType::F32, vec![nkv, ctx, hd]),
                ],
                atol,
                rtol,
                &|s, i, o| {
                    s.norm_qkv_rope(&QkvRope {
                        x: &i[0],
                        norm: &i[1],
                        eps: 1e-6,
                        wq: &i[2],
                        wk: &i[3],
                        wv: &i[4],
                        positions: &i[5],
                        freq_factors: None,
                        step: &i[6],
                        q: &o[0],
                        k_cache: &o[1],
                        v_cache: &o[2],
                        n_head: nh,
                        n_kv_head: nkv,
                        head_dim: hd,
                        base: 10000.0,
                        mode: RopeMode::NeoX,
                    })
                },
            );
            // Gemma 3's own activation (GeGLU) and SwiGLU.
            for act in [GateActivation::GeluTanh, GateActivation::Silu] {
                compare(
                    &format!("{what}: norm_gate_up {act:?}"),
                    &dev,
                    &[
                        x.clone(),
                        norm.clone(),
                        weight_tensor(DType::Q5_0, ffn, dim, seed + 5),
                        weight_tensor(DType::Q5_0, ffn, dim, seed + 6),
                    ],
                    &[(DType::F32, vec![rows, ffn])],
                    atol,
                    rtol,
                    &|s, i, o| s.norm_gate_up(&i[0], &i[1], 1e-6, &i[2], &i[3], &o[0], act),
                );
            }
        }
    }
}

/// Rows of a Q5_0 table of Gemma's width gathered by id: the same dequantization on both
/// backends (the same float operations), so at most one f32 rounding apart.
#[test]
#[ignore = "needs a CUDA GPU"]
fn q5_0_embedding_at_gemma_3_width() {
    let dev = cuda_device();
    let (vocab, dim) = (300usize, GEMMA.0);
    let table = weight_tensor(DType::Q5_0, vocab, dim, 2400);
    let ids = i32_tensor(&[299, 0, 17, 299, 150], &[5]);
    compare(
        "embedding q5_0",
        &dev,
        &[table, ids],
        &[(DType::F32, vec![5, dim])],
        1e-6,
        1e-6,
        &|s, i, o| s.embedding(&i[0], &i[1], &o[0]),
    );
}
