//! The products and the fused block ops at the real model shapes and widths on CUDA against the
//! CPU backend. Part of `cuda_ops.rs` (whose harness they use); every test needs a GPU.

use super::*;

/// The one-row (decode) form at the real model shapes, where the 32-value block formats take the
/// staged path (rows of whole 16-byte words; two outputs a warp), and at odd sizes: an odd number
/// of outputs (the last warp's second row is its first), and rows whose last step is partial
/// (k = 768 and 4352: 24 and 136 blocks, steps of 16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_vector_form_at_real_shapes() {
    let dev = cuda_device();
    let shapes = [
        (4096usize, 4096usize),
        (1023, 14336),
        (2048, 2048),
        (7, 768),
        (5, 4352),
        (576, 1536),
    ];
    for (s, &(n, k)) in shapes.iter().enumerate() {
        for (j, &dt) in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q8_0,
            DType::Q5_0,
            DType::Q4K,
            DType::Q6K,
        ]
        .iter()
        .enumerate()
        {
            // The K formats (one super-block a half-warp or a warp) at every shape here: each k
            // is a whole number of 256-value super-blocks (4352 = 17 of them, an odd count).
            if k % dt.block_elems() != 0 {
                continue;
            }
            let w = weight_tensor(dt, n, k, 900 + (10 * s + j) as u64);
            let x = random_tensor(DType::F32, &[1, k], 1.0, 950 + s as u64);
            // Sums of up to 14336 products (the sum of magnitudes up to about 3600) in another order
            // than the CPU's, whose one-row Q4_1/Q8_0 path rounds the activations to 22 bits: f32
            // rounding and that rounding stay under 3e-6 of the sum of magnitudes.
            compare(
                &format!("matmul {dt} {n}x{k} rows 1"),
                &dev,
                &[x, w],
                &[(DType::F32, vec![1, n])],
                1e-2,
                1e-4,
                &|s, i, o| s.matmul(&i[0], &i[1], &o[0]),
            );
        }
    }
}

/// The fused block ops on one row at real model widths (2048 and 4096), where the CUDA backend
/// takes the `_shared` kernels (the row normalized once per block in shared memory; for the
/// 32-value block formats the weight rows read through a shared-memory stage), against the CPU.
/// Odd sizes: 1000 and 520 gate/up rows (a partial block of warps), 136-block rows at 4352.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_block_ops_at_real_widths() {
    use onepass::ops::fused_block::{GateActivation, QkvRope};
    use onepass::ops::rope::RopeMode;
    let dev = cuda_device();
    // (dim, heads, kv heads, head size, ffn)
    for (c, &(dim, nh, nkv, hd, ffn)) in [
        (2048usize, 32usize, 8usize, 64usize, 1000usize),
        (4096, 8, 2, 128, 520),
        (4352, 4, 1, 64, 96),
    ]
    .iter()
    .enumerate()
    {
        for (j, &dt) in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q8_0,
            DType::F16,
            DType::Q5_0,
        ]
        .iter()
        .enumerate()
        {
            let seed = 1000 + (10 * c + j) as u64;
            let x = random_tensor(DType::F32, &[1, dim], 1.0, seed);
            let norm = random_tensor(DType::F32, &[dim], 1.0, seed + 1);
            let ctx = 16;
            let what = format!("fused {dt} dim {dim}");
            // Sums of up to 4352 products (the sum of magnitudes up to about 1100) in another
            // order than the CPU's, whose one-row Q4_1/Q8_0 path rounds the activations to 22
            // bits: both under 3e-6 of the sum of magnitudes.
            let (atol, rtol) = (5e-3, 1e-4);
            compare(
                &format!("{what}: norm_qkv_rope"),
                &dev,
                &[
                    x.clone(),
                    norm.clone(),
                    weight_tensor(dt, nh * hd, dim, seed + 2),
                    weight_tensor(dt, nkv * hd, dim, seed + 3),
                    weight_tensor(dt, nkv * hd, dim, seed + 4),
                    i32_tensor(&[3], &[1]),
                    i32_tensor(&[3], &[1]),
                ],
                &[
                    (DType::F32, vec![1, nh * hd]),
                    (DType::F32, vec![nkv, ctx, hd]),
                    (DType::F32, vec![nkv, ctx, hd]),
                ],
                atol,
                rtol,
                &|s, i, o| {
                    s.norm_qkv_rope(&QkvRope {
                        x: &i[0],
                        norm: &i[1],
                        eps: 1e-5,
                        wq: &i[2],
                        wk: &i[3],
                        wv: &i[4],
                        positions: &i[5],
                        step: &i[6],
                        q: &o[0],
                        k_cache: &o[1],
                        v_cache: &o[2],
                        n_head: nh,
                        n_kv_head: nkv,
                        head_dim: hd,
                        base: 10000.0,
                        mode: RopeMode::Normal,
                    })
                },
            );
            for act in [GateActivation::Silu, GateActivation::GeluTanh] {
                compare(
                    &format!("{what}: norm_gate_up {act:?}"),
                    &dev,
                    &[
                        x.clone(),
                        norm.clone(),
                        weight_tensor(dt, ffn, dim, seed + 5),
                        weight_tensor(dt, ffn, dim, seed + 6),
                    ],
                    &[(DType::F32, vec![1, ffn])],
                    atol,
                    rtol,
                    &|s, i, o| s.norm_gate_up(&i[0], &i[1], 1e-5, &i[2], &i[3], &o[0], act),
                );
            }
        }
    }
}
