//! The products and the fused block ops at the real model shapes and widths on CUDA against the
//! CPU backend. Part of `cuda_ops.rs` (whose harness they use); every test needs a GPU.

use super::*;

/// The one-row (decode) form at the real model shapes, where the 32-value block formats take the
/// staged path (rows of whole 16-byte words; two outputs a warp), and at odd sizes: an odd number
/// of outputs (the last warp's second row is its first), and rows whose last step is partial
/// (k = 768 and 4352: 24 and 136 blocks, steps of 16). The int8 one-row form (2^21 weights and
/// more) at 4096 x 4096, 1023 x 14336, 2048 x 2048 (Q4_0 there a lane per pair of blocks, k a
/// multiple of 64) and 2049 x 2080 (65 blocks a row: Q4_0 a lane per quarter block, the last
/// round of the four-lane blocks partial; four-warp blocks).
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
        (2049, 2080),
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
            compare_product(
                &format!("matmul {dt} {n}x{k} rows 1"),
                &dev,
                &x,
                &w,
                &[],
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
/// 32-value block formats the weight rows read through a shared-memory stage and the normalized
/// row rounded to int8 for every product), against the CPU: for the int8 formats the CPU's
/// separate ops on the CPU's normalized row rounded as CUDA rounds it ([`int8_rounded`]), else the
/// CPU's fused op. Odd sizes: 2100 and 520 gate/up rows (a partial block of warps), 136-block rows
/// at 4352. At 4096 the Llama-3.1-8B's heads: 3,072 output pairs, more than the grid's warps, so
/// `norm_qkv_rope` splits each pair's sums between two warps there; the same heads at 1536, where
/// the second half of the Q4_0 int8 row starts at pair 12, so its swizzled slots (`XQ8` in
/// matmul_blocks.cuh) are taken with a phase other than the row's start. Also the attention input of
/// a llama.cpp Q4_K_M block, a Q6_K v beside Q4_K q and k (`norm_qkv_rope_shared_q4_k_v_q6_k`:
/// both read the one int8 row).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_block_ops_at_real_widths() {
    use onepass::ops::fused_block::{GateActivation, QkvRope};
    use onepass::ops::rope::{RopeMode, RopeParams};
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    // (dim, heads, kv heads, head size, ffn)
    for (c, &(dim, nh, nkv, hd, ffn)) in [
        (2048usize, 32usize, 8usize, 64usize, 2100usize),
        (4096, 32, 8, 128, 520),
        (4352, 4, 1, 64, 96),
        (1536, 32, 8, 128, 96),
    ]
    .iter()
    .enumerate()
    {
        // (q, k, gate and up; v): one format, or Q4_K_M's Q6_K v beside Q4_K.
        for (j, &(dt, dv)) in [
            (DType::Q4_0, DType::Q4_0),
            (DType::Q4_1, DType::Q4_1),
            (DType::Q8_0, DType::Q8_0),
            (DType::F16, DType::F16),
            (DType::Q5_0, DType::Q5_0),
            (DType::Q4K, DType::Q4K),
            (DType::Q6K, DType::Q6K),
            (DType::Q4K, DType::Q6K),
        ]
        .iter()
        .enumerate()
        {
            let seed = 1000 + (10 * c + j) as u64;
            let x = random_tensor(DType::F32, &[1, dim], 1.0, seed);
            let norm = random_tensor(DType::F32, &[dim], 1.0, seed + 1);
            let ctx = 16;
            let what = format!("fused {dt} (v {dv}) dim {dim}");
            // Sums of up to 4352 products (the sum of magnitudes up to about 1100) in another
            // order than the CPU's, whose one-row Q4_1/Q8_0 path rounds the activations to 22
            // bits: both under 3e-6 of the sum of magnitudes.
            let (atol, rtol) = (5e-3, 1e-4);
            // The CPU's normalized row as CUDA's int8 products read it, and as its f32 products
            // read it (a Q6_K v of an odd count of super-blocks a row, beside an int8 Q4_K).
            let rounded = fused_takes_int8(dt, dim).then(|| {
                let n = run_on(
                    &cpu,
                    &[x.clone(), norm.clone()],
                    &[(DType::F32, vec![1, dim])],
                    &|s, i, o| s.rms_norm(&i[0], &i[1], &o[0], 1e-5),
                );
                let v: Vec<f32> = to_f64(&n[2], DType::F32)
                    .iter()
                    .map(|&v| v as f32)
                    .collect();
                let plain = float_tensor(&v, DType::F32, &[1, dim]);
                (
                    float_tensor(&int8_rounded(&v), DType::F32, &[1, dim]),
                    plain,
                )
            });
            let qkv_in = vec![
                x.clone(),
                norm.clone(),
                weight_tensor(dt, nh * hd, dim, seed + 2),
                weight_tensor(dt, nkv * hd, dim, seed + 3),
                weight_tensor(dv, nkv * hd, dim, seed + 4),
                i32_tensor(&[3], &[1]),
                i32_tensor(&[3], &[1]),
            ];
            let qkv_out = [
                (DType::F32, vec![1, nh * hd]),
                (DType::F32, vec![nkv, ctx, hd]),
                (DType::F32, vec![nkv, ctx, hd]),
            ];
            let fused_qkv = |s: &mut Session, i: &[Buffer], o: &[Buffer]| {
                s.norm_qkv_rope(&QkvRope {
                    x: &i[0],
                    norm: &i[1],
                    eps: 1e-5,
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
                    mode: RopeMode::Normal,
                })
            };
            match &rounded {
                Some((h, plain)) => {
                    // The separate ops on that row (i[0]; v on the plain row, i[1], where its
                    // format takes f32 products); the products' k and v rows are two more outputs.
                    let mut sep_in = qkv_in.clone();
                    sep_in[0] = h.clone();
                    if !fused_takes_int8(dv, dim) {
                        sep_in[1] = plain.clone();
                    } else {
                        sep_in[1] = h.clone();
                    }
                    let mut sep_out = qkv_out.to_vec();
                    sep_out.push((DType::F32, vec![1, nkv * hd]));
                    sep_out.push((DType::F32, vec![1, nkv * hd]));
                    let rope = RopeParams::new(RopeMode::Normal, hd, 10000.0);
                    let want = run_on(&cpu, &sep_in, &sep_out, &|s, i, o| {
                        s.matmul(&i[0], &i[2], &o[0])?;
                        s.matmul(&i[0], &i[3], &o[3])?;
                        s.matmul(&i[1], &i[4], &o[4])?;
                        s.rope(&o[0], &i[5], &o[0], &rope)?;
                        s.rope(&o[3], &i[5], &o[3], &rope)?;
                        s.kv_write(&o[3], &o[1], &i[6])?;
                        s.kv_write(&o[4], &o[2], &i[6])
                    });
                    let got = run_on(&dev, &qkv_in, &qkv_out, &fused_qkv);
                    for (t, name) in ["q", "k_cache", "v_cache"].iter().enumerate() {
                        assert_close(
                            &format!("{what}: norm_qkv_rope {name}"),
                            &got[qkv_in.len() + t],
                            &want[sep_in.len() + t],
                            atol,
                            rtol,
                        );
                    }
                }
                None => compare(
                    &format!("{what}: norm_qkv_rope"),
                    &dev,
                    &qkv_in,
                    &qkv_out,
                    atol,
                    rtol,
                    &fused_qkv,
                ),
            }
            // The MLP input has no second format (its Q4_K run is above).
            let acts = if dv == dt {
                &[GateActivation::Silu, GateActivation::GeluTanh][..]
            } else {
                &[]
            };
            for &act in acts {
                let gu_in = vec![
                    x.clone(),
                    norm.clone(),
                    weight_tensor(dt, ffn, dim, seed + 5),
                    weight_tensor(dt, ffn, dim, seed + 6),
                ];
                let gu_out = [(DType::F32, vec![1, ffn])];
                let fused_gu = |s: &mut Session, i: &[Buffer], o: &[Buffer]| {
                    s.norm_gate_up(&i[0], &i[1], 1e-5, &i[2], &i[3], &o[0], act)
                };
                let what = format!("{what}: norm_gate_up {act:?}");
                match &rounded {
                    None => compare(&what, &dev, &gu_in, &gu_out, atol, rtol, &fused_gu),
                    Some((h, _)) => {
                        let mut sep_in = gu_in.clone();
                        sep_in[0] = h.clone();
                        let sep_out = [
                            (DType::F32, vec![1, ffn]),
                            (DType::F32, vec![1, ffn]),
                            (DType::F32, vec![1, ffn]),
                        ];
                        let want = run_on(&cpu, &sep_in, &sep_out, &|s, i, o| {
                            s.matmul(&i[0], &i[2], &o[1])?;
                            s.matmul(&i[0], &i[3], &o[2])?;
                            match act {
                                GateActivation::Silu => s.swiglu(&o[1], &o[2], &o[0]),
                                GateActivation::GeluTanh => s.geglu(&o[1], &o[2], &o[0]),
                            }
                        });
                        let got = run_on(&dev, &gu_in, &gu_out, &fused_gu);
                        assert_close(&what, &got[4], &want[4], atol, rtol);
                    }
                }
            }
        }
    }
}

/// Asserts two f32 tensors' bytes agree within `atol + rtol * |want|` (NaN where the other is
/// NaN: cache rows neither side wrote).
fn assert_close(what: &str, got: &[u8], want: &[u8], atol: f64, rtol: f64) {
    let (g, w) = (to_f64(got, DType::F32), to_f64(want, DType::F32));
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    let mut worst = 0.0f64;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= atol + rtol * b.abs();
        assert!(
            ok,
            "{what}: element {i}: cuda {a}, cpu {b} (atol {atol}, rtol {rtol})"
        );
        if !a.is_nan() {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("{what}: {} values, max abs error {worst:.3e}", g.len());
}
