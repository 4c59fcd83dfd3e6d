//! The CUDA half of `tests/qk_norm_fusion.rs` (ignored without a GPU; run with `--ignored` on a
//! machine with one, where they fail if there is none rather than pass without checking).

use super::cuda_open::cuda_device;
use super::*;

/// `rms_norm_rope_kv` on the GPU gives bitwise what the two `rms_norm_rope`s and the two
/// `kv_write`s give on the GPU, for every head size it takes, one row and three, f32 and f16
/// caches; and the CPU's values within f32 rounding (both reduce in f64 and round once; the
/// angles are f64 `sincos` on both, so in practice the bits agree).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_rms_norm_rope_kv_gives_the_separate_ops_bits() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for hd in [64, 128, 192, 256] {
        for rows in [1usize, 3] {
            for cache in [DType::F32, DType::F16] {
                let what = format!("hd {hd} rows {rows} {cache}");
                let ins = pre_norm(&gpu, rows, hd);
                let b = block(&gpu, (DType::F32, DType::F32), rows, hd, cache);
                let want = separate_norm_rope_kv(&gpu, &b, &ins);
                let b = block(&gpu, (DType::F32, DType::F32), rows, hd, cache);
                let mut s = Executor::new(gpu.clone()).begin(Mode::Direct);
                s.rms_norm_rope_kv(&norm_rope_kv(&b, &ins[0], &ins[1], &ins[2]))
                    .unwrap();
                s.finish(&Plan::SEQUENTIAL).unwrap();
                let got = outputs(&gpu, &b);
                for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                    assert!(
                        same_bits(g, w),
                        "{what}: {name} differs from the separate ops"
                    );
                }
                let cpu_ins = pre_norm(&cpu, rows, hd);
                let cb = block(&cpu, (DType::F32, DType::F32), rows, hd, cache);
                let on_cpu = separate_norm_rope_kv(&cpu, &cb, &cpu_ins);
                let tol = if cache == DType::F16 { 1e-3 } else { 1e-5 };
                for ((g, c), name) in got.iter().zip(&on_cpu).zip(NAMES) {
                    for (i, (a, e)) in g.iter().zip(c).enumerate() {
                        assert!(
                            (a - e).abs() <= tol * (1.0 + e.abs()),
                            "{what}: {name}[{i}]: cuda {a}, cpu {e}"
                        );
                    }
                }
            }
        }
    }
}

/// The normalized row of `x` (f64 sum of squares, as `rms_norm`).
fn normalized(x: &[f32], w: &[f32]) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let inv = 1.0 / (ss / x.len() as f64 + EPS as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &g)| v as f64 * inv * g as f64)
        .collect()
}

/// `norm_qkv` on the GPU against the CPU, direct: each output within the bound of the GPU's int8
/// row (a one-row pass of the int8 formats rounds the normalized row to int8 in blocks of 32, each
/// value moving by at most half the block's step, max |x| / 254, so a product moves by at most
/// the sum of |w_i| times that) plus f32 rounding (1e-4 of the sum of |w_i x_i|, and 1e-5).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_norm_qkv_matches_the_cpu_within_the_int8_rounding() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    // (dim, n_q, n_kv, q and k format, v format): Qwen 3 0.6B (the shared int8 form, Q4_K_M's
    // pair and one format), Gemma 3 270M (640: the per-warp form, its fallback pair), the 8B's
    // widths (4,096: the pairs split between two warps) and a small odd shape.
    let shapes = [
        (1024, 2048, 1024, DType::Q4K, DType::Q6K),
        (1024, 2048, 1024, DType::Q4K, DType::Q4K),
        (640, 1024, 256, DType::Q5_0, DType::Q8_0),
        (4096, 4096, 1024, DType::Q4_0, DType::Q4_0),
        (96, 6, 2, DType::F32, DType::F32),
    ];
    for (dim, nq, nkv, fq, fv) in shapes {
        for rows in [1usize, 3] {
            let what = format!("dim {dim} q {nq} kv {nkv} {fq}/{fv} rows {rows}");
            let x = random_f32(rows * dim, 1.0, 71);
            let norm = random_f32(dim, 1.0, 72);
            let ws: Vec<(Vec<u8>, DType, usize)> = [(nq, fq, 73), (nkv, fq, 74), (nkv, fv, 75)]
                .iter()
                .map(|&(n, f, seed)| {
                    let bytes = onepass::quant::quantize(f, &random_f32(n * dim, 1.0, seed));
                    (bytes.unwrap(), f, n)
                })
                .collect();
            let run = |dev: &Device| -> Vec<Vec<f32>> {
                let up = |v: &[f32], dims: &[usize]| dev.upload::<f32>(v, dims).unwrap();
                let w: Vec<Buffer> = ws
                    .iter()
                    .map(|(b, f, n)| dev.upload_bytes(b, *f, &[*n, dim]).unwrap())
                    .collect();
                let outs = [nq, nkv, nkv].map(|n| dev.alloc(DType::F32, &[rows, n]).unwrap());
                let (xb, nb) = (up(&x, &[rows, dim]), up(&norm, &[dim]));
                let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
                s.norm_qkv(&Qkv {
                    x: &xb,
                    norm: &nb,
                    eps: EPS,
                    wq: &w[0],
                    wk: &w[1],
                    wv: &w[2],
                    q: &outs[0],
                    k: &outs[1],
                    v: &outs[2],
                })
                .unwrap();
                s.finish(&Plan::SEQUENTIAL).unwrap();
                outs.iter()
                    .map(|o| dev.download::<f32>(o).unwrap())
                    .collect()
            };
            let (got, want) = (run(&gpu), run(&cpu));
            for (m, (bytes, f, n)) in ws.iter().enumerate() {
                let w = onepass::quant::dequantize(*f, bytes).unwrap();
                for r in 0..rows {
                    let xn = normalized(&x[r * dim..(r + 1) * dim], &norm);
                    let step: Vec<f64> = xn
                        .chunks(32)
                        .map(|b| b.iter().fold(0f64, |m, v| m.max(v.abs())) / 254.0)
                        .collect();
                    for o in 0..*n {
                        let wr = &w[o * dim..(o + 1) * dim];
                        let (mut int8, mut mag) = (0f64, 0f64);
                        for (i, &wi) in wr.iter().enumerate() {
                            int8 += (wi as f64).abs() * step[i / 32];
                            mag += (wi as f64 * xn[i]).abs();
                        }
                        let (g, e) = (got[m][r * n + o], want[m][r * n + o]);
                        let tol = int8 + 1e-4 * mag + 1e-5;
                        assert!(
                            ((g - e) as f64).abs() <= tol,
                            "{what}: product {m} row {r} output {o}: cuda {g}, cpu {e}, tol {tol}"
                        );
                    }
                }
            }
        }
    }
}

/// Qwen 3's and Gemma 3's attention input recorded as the models record it and optimized on the
/// GPU: the two fused dispatches, with the CPU's separate ops' values within f32 rounding of the
/// products (sums of 256 products in another order; the per-head norm then divides by the head's
/// root mean square, so the values stay within 1e-3 + 1e-3 |v|).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_qk_norm_block_fuses_into_two_dispatches_and_matches_the_cpu() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for formats in PAIRS {
        for hd in [128, 256] {
            for rows in [1usize, 3] {
                for cache in [DType::F32, DType::F16] {
                    let what = format!("{formats:?} hd {hd} rows {rows} {cache}");
                    let cb = block(&cpu, formats, rows, hd, cache);
                    let (want, _) =
                        record(&cpu, &cb, RopeMode::NeoX, Mode::Direct, &Plan::SEQUENTIAL);
                    let gb = block(&gpu, formats, rows, hd, cache);
                    let (got, report) =
                        record(&gpu, &gb, RopeMode::NeoX, Mode::Recorded, &Plan::OPTIMIZED);
                    let fused = (
                        by_rule(&report, "rms_norm+qkv"),
                        by_rule(&report, "rms_norm_rope+kv_write"),
                    );
                    // The block fusion is a decode (one-row) fusion on CUDA.
                    let want_fused = if rows == 1 { (1, 1) } else { (0, 1) };
                    assert_eq!(fused, want_fused, "{what}: {report:?}");
                    for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                        for (i, (a, e)) in g.iter().zip(w).enumerate() {
                            assert!(
                                (a - e).abs() <= 1e-3 + 1e-3 * e.abs(),
                                "{what}: {name}[{i}]: cuda {a}, cpu {e}"
                            );
                        }
                    }
                }
            }
        }
    }
}
