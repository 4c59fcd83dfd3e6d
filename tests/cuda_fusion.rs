//! The CUDA fusions against unfused work. The matmul + residual add fusion
//! (`ops::matmul_fused`): a recorded graph of matmul + residual add and SwiGLU + matmul + residual
//! add, optimized (two fusions), gives bitwise the residual that direct mode (no fusion) gives on
//! the same GPU, and the CPU's residual (fused the same way) within a stated tolerance. The
//! post-block norm + residual add fusion (`rms_norm+add`, `ops::norm`) likewise, for every float
//! dtype, and the per-head norm + RoPE fusion (`rms_norm+rope`, `ops::norm_rope`) for f32. The fused
//! block ops (`ops::fused_block`) give the separate ops' results on the CPU within a stated
//! tolerance, and so does GeGLU's MLP input at Gemma 3's widths, fused by the optimizer from the
//! plain ops (`rms_norm`, two `matmul`s, `geglu`) that Gemma's blocks record. Seeded random
//! inputs, never zeros. Every test needs a GPU: ignored by default, it fails where there is none
//! (`tests/cpu_fusion.rs`, `tests/cpu_gate_up.rs` and `ops::matmul_fused` test the CPU kernels
//! alone).

mod cuda_open;

mod seeded;

use cuda_open::cuda_device;
use half::{bf16, f16};
use onepass::ops::fused_block::{GateActivation, QkvRope};
use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

/// A `[n, k]` weight of `dtype` with random values.
fn weight(dev: &Device, dtype: DType, n: usize, k: usize, seed: u64) -> Buffer {
    let values = random_f32(n * k, 1.0, seed);
    let bytes = onepass::quant::quantize(dtype, &values).unwrap();
    dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
}

/// The shapes of one block: `rows` tokens, residual width `d`, attention width `a`, FFN width `f`.
struct Shapes {
    rows: usize,
    d: usize,
    a: usize,
    f: usize,
}

/// Runs `acc += attn . Wo; acc += (silu(gate) * up) . Wd` on `dev` in `mode`, then overwrites the
/// intermediates (so the optimizer can prove them dead), and returns the residual and the report's
/// fusion and dispatch counts.
fn run(dev: &Device, dtype: DType, sh: &Shapes, mode: Mode) -> (Vec<f32>, usize, usize) {
    let f32s = |n: usize, seed: u64, dims: &[usize]| {
        dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
    };
    let wo = weight(dev, dtype, sh.d, sh.a, 11);
    let wd = weight(dev, dtype, sh.d, sh.f, 12);
    let attn = f32s(sh.rows * sh.a, 13, &[sh.rows, sh.a]);
    let gate = f32s(sh.rows * sh.f, 14, &[sh.rows, sh.f]);
    let up = f32s(sh.rows * sh.f, 15, &[sh.rows, sh.f]);
    let acc = f32s(sh.rows * sh.d, 16, &[sh.rows, sh.d]);
    let fill_d = f32s(sh.rows * sh.d, 17, &[sh.rows, sh.d]);
    let fill_f = f32s(sh.rows * sh.f, 18, &[sh.rows, sh.f]);
    let proj = dev.alloc(DType::F32, &[sh.rows, sh.d]).unwrap();
    let hidden = dev.alloc(DType::F32, &[sh.rows, sh.f]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.matmul(&attn, &wo, &proj).unwrap();
    s.add_inplace(&acc, &proj).unwrap();
    s.swiglu(&gate, &up, &hidden).unwrap();
    s.matmul(&hidden, &wd, &proj).unwrap();
    s.add_inplace(&acc, &proj).unwrap();
    s.copy(&fill_d, &proj).unwrap();
    s.copy(&fill_f, &hidden).unwrap();
    let report = s.finish(&Plan::OPTIMIZED).unwrap();
    let out = dev.download::<f32>(&acc).unwrap();
    (out, report.fusions, report.dispatches)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_matmul_add_gives_the_unfused_bits() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for dtype in [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q4K,
        DType::F32,
        DType::F16,
    ] {
        // 100 rows: the tensor-core form (`matmul_add_mma_<w>`).
        for rows in [1usize, 3, 100] {
            // FFN width 768 = three Q4_K super-blocks; 576 = 18 blocks of 32 for the others.
            let f = if dtype == DType::Q4K { 768 } else { 576 };
            let sh = Shapes {
                rows,
                d: 96,
                a: 256,
                f,
            };
            let what = format!("{dtype} rows {rows}");
            let (fused, fusions, dispatches) = run(&gpu, dtype, &sh, Mode::Recorded);
            assert_eq!(fusions, 2, "{what}: two matmul+add");
            assert_eq!(
                dispatches, 5,
                "{what}: two fused products, swiglu, two copies"
            );
            let (direct, _, _) = run(&gpu, dtype, &sh, Mode::Direct);
            assert_eq!(
                fused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                direct.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{what}: fused graph and direct mode differ"
            );
            let (cpu_out, cpu_fusions, cpu_dispatches) = run(&cpu, dtype, &sh, Mode::Recorded);
            assert_eq!(
                (cpu_fusions, cpu_dispatches),
                (2, 5),
                "{what}: the CPU fuses both matmul+add pairs too"
            );
            // Sums of up to 576 products of values below 1 in another order: f32 rounding. From 64
            // rows the GPU rounds x and w to f16 (2^-11 each): at most 2^-10 of the sum of the
            // products' magnitudes, which is below a + f for the two products added.
            let f16_term = if rows >= 64 {
                (sh.a + sh.f) as f32 / 1024.0
            } else {
                0.0
            };
            for (i, (g, c)) in fused.iter().zip(&cpu_out).enumerate() {
                let tol = 1e-3 + 1e-4 * c.abs() + f16_term;
                assert!(
                    (g - c).abs() <= tol,
                    "{what}: element {i}: cuda {g}, cpu {c}"
                );
            }
        }
    }
}

/// `values` as a buffer of float dtype `dt` (rounded to it) on `dev`.
fn upload_float(dev: &Device, dt: DType, values: &[f32], dims: &[usize]) -> Buffer {
    match dt {
        DType::F16 => {
            let v: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            dev.upload(&v, dims).unwrap()
        }
        DType::BF16 => {
            let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
            dev.upload(&v, dims).unwrap()
        }
        _ => dev.upload(values, dims).unwrap(),
    }
}

/// The values of raw bytes of float dtype `dt`, as f64.
fn float_values(dt: DType, bytes: &[u8]) -> Vec<f64> {
    match dt {
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
    }
}

/// Gemma 3's post-block norm, `rms_norm(proj) -> tmp; x += tmp`, then `tmp` overwritten (so it is
/// dead), run on `dev` in `mode`; returns the bytes of `x` and the `rms_norm+add` fusions.
fn run_post_norm(dev: &Device, dt: DType, rows: usize, dim: usize, mode: Mode) -> (Vec<u8>, usize) {
    let up = |scale: f32, seed: u64, dims: &[usize]| {
        let n = dims.iter().product();
        upload_float(dev, dt, &random_f32(n, scale, seed), dims)
    };
    let proj = up(2.0, 61, &[rows, dim]);
    let norm = up(1.5, 62, &[dim]);
    let x = up(1.0, 63, &[rows, dim]);
    let fill = up(1.0, 64, &[rows, dim]);
    let tmp = dev.alloc(dt, &[rows, dim]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.rms_norm(&proj, &norm, &tmp, 1e-6).unwrap();
    s.add_inplace(&x, &tmp).unwrap();
    s.copy(&fill, &tmp).unwrap();
    let report = s.finish(&Plan::OPTIMIZED).unwrap();
    let fused = report.fusions_by_rule.get("rms_norm+add").copied();
    (dev.download_bytes(&x).unwrap(), fused.unwrap_or(0))
}

/// The `rms_norm+add` fusion on the GPU gives bitwise the residual of the pair (`rms_norm`, then
/// the add kernel) that direct mode runs on the same GPU, for f32, f16 and bf16, Gemma 3 widths
/// (640, 1152) and odd ones; and the CPU's residual (fused too) within one ulp of the dtype at
/// the values' size (|values| < 4; both backends round the same f64 sum of squares to f32 and
/// make the same f32 products, so in practice the bits agree): f32 1e-5 + 1e-5 |v|, f16 2e-3 +
/// 2e-3 |v|, bf16 1.6e-2 + 1.6e-2 |v|.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_rms_norm_add_gives_the_pair_bits() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for (dt, tol) in [
        (DType::F32, 1e-5),
        (DType::F16, 2e-3),
        (DType::BF16, 1.6e-2),
    ] {
        for (rows, dim) in [(1, 640), (4, 1152), (3, 577), (17, 64), (2, 5)] {
            let what = format!("{dt} [{rows}, {dim}]");
            let (fused, fusions) = run_post_norm(&gpu, dt, rows, dim, Mode::Recorded);
            assert_eq!(fusions, 1, "{what}: one rms_norm+add");
            let (direct, fusions) = run_post_norm(&gpu, dt, rows, dim, Mode::Direct);
            assert_eq!(fusions, 0, "{what}: direct mode does not fuse");
            assert!(
                fused == direct,
                "{what}: fused graph and direct mode differ"
            );
            let (cpu_out, fusions) = run_post_norm(&cpu, dt, rows, dim, Mode::Recorded);
            assert_eq!(fusions, 1, "{what}: the CPU fuses the pair too");
            let (g, c) = (float_values(dt, &fused), float_values(dt, &cpu_out));
            for (i, (g, c)) in g.iter().zip(&c).enumerate() {
                assert!(
                    (g - c).abs() <= tol + tol * c.abs(),
                    "{what}: element {i}: cuda {g}, cpu {c}"
                );
            }
        }
    }
}

/// The inputs of one block's fused ops, uploaded to one device.
struct Block {
    x: Buffer,
    attn_norm: Buffer,
    ffn_norm: Buffer,
    wq: Buffer,
    wk: Buffer,
    wv: Buffer,
    w_gate: Buffer,
    w_up: Buffer,
    positions: Buffer,
    step: Buffer,
    q: Buffer,
    k_cache: Buffer,
    v_cache: Buffer,
    hidden: Buffer,
}

const N_HEAD: usize = 4;
const N_KV: usize = 2;
const HD: usize = 64;
const DIM: usize = 256;
const FFN: usize = 512;
const MAX_CTX: usize = 16;
const POS0: usize = 5;
const EPS: f32 = 1e-5;

/// One block's buffers, every weight of `dtype` but v, of `dv`.
fn block(dev: &Device, (dtype, dv): (DType, DType), rows: usize) -> Block {
    let f32s = |seed: u64, dims: &[usize]| {
        let n = dims.iter().product();
        dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
    };
    let pos: Vec<i32> = (0..rows).map(|r| (POS0 + r) as i32).collect();
    Block {
        x: f32s(21, &[rows, DIM]),
        attn_norm: f32s(22, &[DIM]),
        ffn_norm: f32s(23, &[DIM]),
        wq: weight(dev, dtype, N_HEAD * HD, DIM, 24),
        wk: weight(dev, dtype, N_KV * HD, DIM, 25),
        wv: weight(dev, dv, N_KV * HD, DIM, 26),
        w_gate: weight(dev, dtype, FFN, DIM, 27),
        w_up: weight(dev, dtype, FFN, DIM, 28),
        positions: dev.upload::<i32>(&pos, &[rows]).unwrap(),
        step: dev.upload::<i32>(&[POS0 as i32], &[1]).unwrap(),
        q: f32s(29, &[rows, N_HEAD * HD]),
        k_cache: f32s(30, &[N_KV, MAX_CTX, HD]),
        v_cache: f32s(31, &[N_KV, MAX_CTX, HD]),
        hidden: f32s(32, &[rows, FFN]),
    }
}

/// The block's attention and MLP inputs through the separate ops (the CPU's way).
fn separate(dev: &Device, b: &Block, rows: usize, mode: RopeMode) -> Vec<Vec<f32>> {
    let scratch = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    let (xn, k, v) = (
        scratch(&[rows, DIM]),
        scratch(&[rows, N_KV * HD]),
        scratch(&[rows, N_KV * HD]),
    );
    let (gate, up) = (scratch(&[rows, FFN]), scratch(&[rows, FFN]));
    let rope = RopeParams::new(mode, HD, 10000.0);
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.rms_norm(&b.x, &b.attn_norm, &xn, EPS).unwrap();
    s.matmul(&xn, &b.wq, &b.q).unwrap();
    s.matmul(&xn, &b.wk, &k).unwrap();
    s.matmul(&xn, &b.wv, &v).unwrap();
    s.rope(&b.q, &b.positions, &b.q, &rope).unwrap();
    s.rope(&k, &b.positions, &k, &rope).unwrap();
    s.kv_write(&k, &b.k_cache, &b.step).unwrap();
    s.kv_write(&v, &b.v_cache, &b.step).unwrap();
    s.rms_norm(&b.x, &b.ffn_norm, &xn, EPS).unwrap();
    s.matmul(&xn, &b.w_gate, &gate).unwrap();
    s.matmul(&xn, &b.w_up, &up).unwrap();
    s.swiglu(&gate, &up, &b.hidden).unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
    outputs(dev, b)
}

fn outputs(dev: &Device, b: &Block) -> Vec<Vec<f32>> {
    [&b.q, &b.k_cache, &b.v_cache, &b.hidden]
        .iter()
        .map(|t| dev.download::<f32>(t).unwrap())
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_block_ops_match_the_separate_ops_on_the_cpu() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    // One format, or Q4_K_M's Q6_K v beside Q4_K (`norm_qkv_rope_q4_k_v_q6_k`).
    for formats in [
        (DType::Q4_1, DType::Q4_1),
        (DType::Q5_0, DType::Q5_0),
        (DType::Q8_0, DType::Q8_0),
        (DType::Q4K, DType::Q4K),
        (DType::Q4K, DType::Q6K),
        (DType::F16, DType::F16),
    ] {
        for rows in [1usize, 3] {
            for mode in [RopeMode::Normal, RopeMode::NeoX] {
                let what = format!("{formats:?} rows {rows} {mode:?}");
                let want = separate(&cpu, &block(&cpu, formats, rows), rows, mode);
                let b = block(&gpu, formats, rows);
                let mut s = Executor::new(gpu.clone()).begin(Mode::Direct);
                s.norm_qkv_rope(&QkvRope {
                    x: &b.x,
                    norm: &b.attn_norm,
                    eps: EPS,
                    wq: &b.wq,
                    wk: &b.wk,
                    wv: &b.wv,
                    positions: &b.positions,
                    freq_factors: None,
                    step: &b.step,
                    q: &b.q,
                    k_cache: &b.k_cache,
                    v_cache: &b.v_cache,
                    n_head: N_HEAD,
                    n_kv_head: N_KV,
                    head_dim: HD,
                    base: 10000.0,
                    mode,
                })
                .unwrap();
                s.norm_gate_up(
                    &b.x,
                    &b.ffn_norm,
                    EPS,
                    &b.w_gate,
                    &b.w_up,
                    &b.hidden,
                    GateActivation::Silu,
                )
                .unwrap();
                s.finish(&Plan::SEQUENTIAL).unwrap();
                let got = outputs(&gpu, &b);
                // Sums of 256 products of normalized values (|x| about 1.7) and weights below 1,
                // in another order: f32 rounding, far below 1e-3 of the magnitudes here. Cache
                // rows outside pos0..pos0+rows keep their random values on both devices.
                let names = ["q", "k_cache", "v_cache", "hidden"];
                for ((g, w), name) in got.iter().zip(&want).zip(names) {
                    for (i, (a, e)) in g.iter().zip(w).enumerate() {
                        assert!(
                            (a - e).abs() <= 1e-3 + 1e-4 * e.abs(),
                            "{what}: {name}[{i}]: cuda {a}, cpu {e}"
                        );
                    }
                }
            }
        }
    }
}

/// Gemma 3 270M's MLP input (640 activations, 2048 gate/up rows; 768 activations for the K
/// formats, whose 256-value blocks 640 does not hold) with GeGLU: `(gate, up, hidden)` of the plain
/// ops recorded in `mode` and run with `plan` (the intermediates marked scratch), or of the fused
/// op run alone where `fused_op` (gate and up then keep their random values), and the fusions made.
fn geglu_block(
    dev: &Device,
    dtype: DType,
    rows: usize,
    mode: Mode,
    plan: &Plan,
    fused_op: bool,
) -> ([Vec<f32>; 3], usize) {
    let dim = if dtype.block_elems() == 256 { 768 } else { 640 };
    let ffn = 2048;
    let f32s = |seed: u64, dims: &[usize]| {
        let n = dims.iter().product();
        dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
    };
    let (x, norm) = (f32s(61, &[rows, dim]), f32s(62, &[dim]));
    let (wg, wu) = (
        weight(dev, dtype, ffn, dim, 63),
        weight(dev, dtype, ffn, dim, 64),
    );
    let xn = f32s(65, &[rows, dim]);
    let (gate, up, hidden) = (
        f32s(66, &[rows, ffn]),
        f32s(67, &[rows, ffn]),
        f32s(68, &[rows, ffn]),
    );
    let mut s = Executor::new(dev.clone()).begin(mode);
    if fused_op {
        s.norm_gate_up(&x, &norm, 1e-6, &wg, &wu, &hidden, GateActivation::GeluTanh)
            .unwrap();
    } else {
        s.rms_norm(&x, &norm, &xn, 1e-6).unwrap();
        s.matmul(&xn, &wg, &gate).unwrap();
        s.matmul(&xn, &wu, &up).unwrap();
        s.geglu(&gate, &up, &hidden).unwrap();
        for t in [&xn, &gate, &up] {
            s.mark_scratch(t);
        }
    }
    let report = s.finish(plan).unwrap();
    let out = [&gate, &up, &hidden].map(|t| dev.download::<f32>(t).unwrap());
    (out, report.fusions)
}

/// GeGLU on the GPU, fused (by the optimizer from Gemma's plain ops on a one-row pass, and the
/// fused op alone for one and three rows), against the plain ops on the CPU, in every weight
/// format; the optimizer's fused graph gives the fused op's bits (the same kernel). Seeded random
/// inputs, never zeros.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_geglu_matches_the_cpu_at_gemma_3_widths() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for dtype in onepass::ops::matmul::WEIGHT_DTYPES {
        for rows in [1usize, 3] {
            let what = format!("{dtype} rows {rows}");
            let (want, _) = geglu_block(&cpu, dtype, rows, Mode::Direct, &Plan::SEQUENTIAL, false);
            let (op, _) = geglu_block(&gpu, dtype, rows, Mode::Direct, &Plan::SEQUENTIAL, true);
            let (graph, fusions) =
                geglu_block(&gpu, dtype, rows, Mode::Recorded, &Plan::OPTIMIZED, false);
            // CUDA fuses the MLP input of one-row passes only.
            assert_eq!(fusions, usize::from(rows == 1), "{what}: fusions");
            let [g, u, h] = &want;
            if rows == 1 {
                assert!(
                    graph[2]
                        .iter()
                        .zip(&op[2])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: the optimized graph and the fused op differ"
                );
            }
            // Gate and up are sums of 640 (768) products of normalized activations (|x| about
            // 1.7) and weights below 1, their magnitudes summing to about 150: another order
            // moves them by a few 1e-5 (under 1e-4). Through GELU (slope below 1.2) that reaches
            // hidden as 1.2 |u| dg + |g| du, within 2e-4 (|g| + |u|), plus f32 roundings of
            // |g u|. A SwiGLU in place of GeGLU is off by a tenth of |g u| at moderate gates.
            for (name, got) in [("fused op", &op[2]), ("optimized graph", &graph[2])] {
                for (i, (a, e)) in got.iter().zip(h).enumerate() {
                    let tol = 1e-4 + 2e-4 * (g[i].abs() + u[i].abs()) + 1e-5 * (g[i] * u[i]).abs();
                    assert!(
                        (a - e).abs() <= tol,
                        "{what}: {name}: hidden[{i}]: cuda {a}, cpu {e} (gate {}, up {})",
                        g[i],
                        u[i]
                    );
                }
            }
        }
    }
}

/// The one-launch decode attention keeps counters in its scratch: a scratch that was not zeroed
/// is a clear kernel error, not a wrong result, once the length takes several splits (a step of
/// one split reads no counter, and its result does not depend on the scratch).
#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_attention_with_a_dirty_scratch_is_an_error() {
    use onepass::ops::attention::{attention_decode_scratch_len, AttentionParams};
    let gpu = cuda_device();
    let (n_head, n_kv, hd, max_ctx, chunk) = (4usize, 2usize, 64usize, 256usize, 16usize);
    let params = AttentionParams::new(n_head, n_kv, hd);
    let f32s = |n: usize, seed: u64, dims: &[usize]| {
        gpu.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
    };
    let q = f32s(n_head * hd, 41, &[1, n_head * hd]);
    let k = f32s(n_kv * max_ctx * hd, 42, &[n_kv, max_ctx, hd]);
    let v = f32s(n_kv * max_ctx * hd, 43, &[n_kv, max_ctx, hd]);
    let step = gpu.upload::<i32>(&[200], &[1]).unwrap();
    let len = attention_decode_scratch_len(params, max_ctx, chunk).unwrap();
    let dirty = gpu.upload::<f32>(&vec![f32::NAN; len], &[len]).unwrap();
    let out = gpu.alloc(DType::F32, &[1, n_head * hd]).unwrap();
    let mut s = Executor::new(gpu.clone()).begin(Mode::Direct);
    let run = s
        .attention_decode(&q, &k, &v, &step, &dirty, &out, params, chunk)
        .and_then(|()| s.finish(&Plan::SEQUENTIAL));
    let err = run
        .expect_err("a dirty scratch must be refused")
        .to_string();
    assert!(
        err.contains("attention_decode_f32") && err.contains("zeroed"),
        "{err}"
    );
}

/// The query norm of Gemma 3 and Qwen 3: `rms_norm` of each head of `[rows, heads * head_dim]`
/// into `q`, then `rope(q)` in place, run on `dev` in `mode`; returns the bits of `q` and the
/// `rms_norm+rope` fusions.
fn run_head_norm_rope(
    dev: &Device,
    (rows, heads, head_dim, rotary_dim): (usize, usize, usize, usize),
    rope_mode: RopeMode,
    mode: Mode,
) -> (Vec<u32>, usize) {
    let x = dev
        .upload(
            &random_f32(rows * heads * head_dim, 2.0, 71),
            &[rows * heads, head_dim],
        )
        .unwrap();
    let w = dev
        .upload(&random_f32(head_dim, 1.5, 72), &[head_dim])
        .unwrap();
    let positions: Vec<i32> = (0..rows as i32).map(|r| 37 + 1013 * r).collect();
    let pos = dev.upload(&positions, &[rows]).unwrap();
    let q = dev.alloc(DType::F32, &[rows, heads * head_dim]).unwrap();
    let params = RopeParams {
        mode: rope_mode,
        head_dim,
        rotary_dim,
        base: 1_000_000.0,
        freq_factors: None,
    };
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.rms_norm(&x, &w, &q.reshape(&[rows * heads, head_dim]).unwrap(), 1e-6)
        .unwrap();
    s.rope(&q, &pos, &q, &params).unwrap();
    let report = s.finish(&Plan::OPTIMIZED).unwrap();
    let fused = report.fusions_by_rule.get("rms_norm+rope").copied();
    let out: Vec<f32> = dev.download(&q).unwrap();
    (
        out.iter().map(|v| v.to_bits()).collect(),
        fused.unwrap_or(0),
    )
}

/// The `rms_norm+rope` fusion on the GPU gives bitwise the `q` of the pair (`rms_norm`, then the
/// in-place rope kernel) that direct mode runs on the same GPU (the fused kernel reduces each head
/// in a warp in the order of the norm's block and runs the rope's angle and rotation code), for
/// Gemma 3 and Qwen 3 head sizes (Qwen 3's 16 query heads of a decode step: two blocks of eight
/// warps), nine heads (a row's second block partly idle), heads of 512 values (two values a
/// thread of the norm's block), both pair layouts and a partial rotary dimension; and the CPU's `q` (fused
/// too) within 1e-5 + 1e-5 |v| (the f64 `pow`, `sincos` and `sqrt` of the two backends may differ
/// in their last f64 bit; |v| < 8).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_rms_norm_rope_gives_the_pair_bits() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    for shape in [
        (1, 4, 256, 256),
        (3, 1, 64, 32),
        (3, 8, 128, 128),
        (2, 4, 32, 16),
        (1, 16, 128, 128),
        (2, 9, 64, 64),
        (1, 2, 512, 384),
    ] {
        for rope_mode in [RopeMode::Normal, RopeMode::NeoX] {
            let what = format!("{shape:?} {rope_mode:?}");
            let (fused, fusions) = run_head_norm_rope(&gpu, shape, rope_mode, Mode::Recorded);
            assert_eq!(fusions, 1, "{what}: one rms_norm+rope");
            let (direct, fusions) = run_head_norm_rope(&gpu, shape, rope_mode, Mode::Direct);
            assert_eq!(fusions, 0, "{what}: direct mode does not fuse");
            assert!(
                fused == direct,
                "{what}: fused graph and direct mode differ"
            );
            let (cpu_q, fusions) = run_head_norm_rope(&cpu, shape, rope_mode, Mode::Recorded);
            assert_eq!(fusions, 1, "{what}: the CPU fuses the pair too");
            for (i, (g, c)) in fused.iter().zip(&cpu_q).enumerate() {
                let (g, c) = (f32::from_bits(*g), f32::from_bits(*c));
                assert!(
                    (g - c).abs() <= 1e-5 + 1e-5 * c.abs(),
                    "{what}: element {i}: cuda {g}, cpu {c}"
                );
            }
        }
    }
}

/// Llama 3's RoPE frequency factors: the attention input recorded with `rope`s that take them
/// and optimized on the GPU becomes one `norm_qkv_rope_ff_<w>` dispatch, whose q and cache rows
/// match the CPU's separate ops within a share of the largest value of each: at 256 values a row
/// 1e-4 (f32 activations: f32 rounding of sums in another order), at 2,048 2e-2 (the shared
/// form's int8 row moves a product by at most the sum of |w| times half a block's step, a few
/// tenths of a percent of the largest values here); a wrong angle or row moves a value by its own
/// size. One row (the rope table) and three (each angle where it is used).
#[test]
#[ignore = "needs a CUDA GPU"]
fn frequency_factors_fuse_on_the_gpu_and_match_the_cpu() {
    let gpu = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    let (n_head, n_kv, hd, ctx, pos0) = (4usize, 2usize, 64usize, 16usize, 5usize);
    let factors: Vec<f32> = random_f32(hd / 2, 1.0, 77)
        .iter()
        .map(|v| 1.0 + 7.0 * v.abs())
        .collect();
    for (dim, formats, tol) in [
        (256, (DType::Q4_0, DType::Q4_0), 1e-4f32),
        (2048, (DType::Q4_0, DType::Q4_0), 2e-2),
        (2048, (DType::Q4K, DType::Q6K), 2e-2),
    ] {
        for rows in [1usize, 3] {
            let what = format!("dim {dim} {formats:?} rows {rows}");
            let run = |dev: &Device, exec: Mode, plan: &Plan| {
                let f32s = |seed: u64, dims: &[usize]| {
                    let n = dims.iter().product();
                    dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
                };
                let pos: Vec<i32> = (0..rows).map(|r| (pos0 + r) as i32).collect();
                let positions = dev.upload::<i32>(&pos, &[rows]).unwrap();
                let step = dev.upload::<i32>(&[pos0 as i32], &[1]).unwrap();
                let ff = dev.upload::<f32>(&factors, &[hd / 2]).unwrap();
                let (x, norm) = (f32s(81, &[rows, dim]), f32s(82, &[dim]));
                let wq = weight(dev, formats.0, n_head * hd, dim, 83);
                let wk = weight(dev, formats.0, n_kv * hd, dim, 84);
                let wv = weight(dev, formats.1, n_kv * hd, dim, 85);
                let q = f32s(86, &[rows, n_head * hd]);
                let (kc, vc) = (f32s(87, &[n_kv, ctx, hd]), f32s(88, &[n_kv, ctx, hd]));
                let scratch = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
                let (xn, k, v) = (
                    scratch(&[rows, dim]),
                    scratch(&[rows, n_kv * hd]),
                    scratch(&[rows, n_kv * hd]),
                );
                let rope = RopeParams {
                    freq_factors: Some(&ff),
                    ..RopeParams::new(RopeMode::NeoX, hd, 500_000.0)
                };
                let mut s = Executor::new(dev.clone()).begin(exec);
                s.rms_norm(&x, &norm, &xn, EPS).unwrap();
                s.matmul(&xn, &wq, &q).unwrap();
                s.matmul(&xn, &wk, &k).unwrap();
                s.matmul(&xn, &wv, &v).unwrap();
                s.rope(&q, &positions, &q, &rope).unwrap();
                s.rope(&k, &positions, &k, &rope).unwrap();
                s.kv_write(&k, &kc, &step).unwrap();
                s.kv_write(&v, &vc, &step).unwrap();
                if exec == Mode::Recorded {
                    for t in [&xn, &k, &v] {
                        s.mark_scratch(t);
                    }
                }
                let report = s.finish(plan).unwrap();
                let outs: Vec<Vec<f32>> = [&q, &kc, &vc]
                    .iter()
                    .map(|t| dev.download::<f32>(t).unwrap())
                    .collect();
                (outs, report)
            };
            let (want, _) = run(&cpu, Mode::Direct, &Plan::SEQUENTIAL);
            let (got, report) = run(&gpu, Mode::Recorded, &Plan::OPTIMIZED);
            let fused = report.fusions_by_rule.get("rms_norm+qkv+rope+kv_write");
            // The block fusion is a decode (one-row) fusion on CUDA.
            assert_eq!(
                fused.copied().unwrap_or(0),
                usize::from(rows == 1),
                "{what}"
            );
            for ((g, w), name) in got.iter().zip(&want).zip(["q", "k_cache", "v_cache"]) {
                let scale = w.iter().fold(0f32, |m, e| m.max(e.abs()));
                for (i, (a, e)) in g.iter().zip(w).enumerate() {
                    assert!(
                        (a - e).abs() <= tol * scale,
                        "{what}: {name}[{i}]: cuda {a}, cpu {e}"
                    );
                }
            }
        }
    }
}
