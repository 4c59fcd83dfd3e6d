//! The attention input of a block whose q and k take a per-head norm (Qwen 3, Gemma 3): the
//! fusions `rms_norm+qkv` (`ops::norm_qkv`) and `rms_norm_rope+kv_write` (`ops::norm_rope_kv`).
//!
//! On the CPU (every test here without a GPU runs there): the block recorded as the model
//! records it (`rms_norm`, three `matmul`s, the per-head `rms_norm`s, two in-place `rope`s, two
//! `kv_write`s) and optimized becomes two dispatches whose results are the separate ops' bits,
//! for the llama.cpp Q4_K_M pairs (Q4_K with a Q6_K v; Q5_0 with a Q8_0 v), one format, one row
//! and three, f32 and f16 caches; heads the fused norm kernel does not take keep their own
//! dispatches with the same bits; a step past the cache is an error that writes nothing.
//!
//! On CUDA (ignored without a GPU): `rms_norm_rope_kv` gives the bits of the two `rms_norm_rope`s
//! and the two cache writes; `norm_qkv` matches the CPU within the int8 rounding of its row at the
//! real widths (Qwen 3 0.6B, Gemma 3 270M, the 8B's split pairs) and odd ones; the optimized block
//! matches the CPU's separate ops. Seeded random inputs, never zeros.

mod cuda_open;
mod seeded;

use onepass::ops::norm_qkv::Qkv;
use onepass::ops::norm_rope_kv::NormRopeKv;
use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::{Buffer, DType, Device, Executor, FinishReport, Mode, Plan};
use seeded::random_f32;

const N_HEAD: usize = 4;
const N_KV: usize = 2;
const DIM: usize = 256;
const MAX_CTX: usize = 12;
const POS0: usize = 4;
const EPS: f32 = 1e-6;
const BASE: f32 = 1_000_000.0;

/// One block's inputs on a device: `hd` values a head, weights of `formats` (q and k, v).
struct Block {
    hd: usize,
    x: Buffer,
    attn_norm: Buffer,
    w: [Buffer; 3],
    q_norm: Buffer,
    k_norm: Buffer,
    positions: Buffer,
    step: Buffer,
    q: Buffer,
    k_cache: Buffer,
    v_cache: Buffer,
}

fn weight(dev: &Device, dtype: DType, n: usize, k: usize, seed: u64) -> Buffer {
    let bytes = onepass::quant::quantize(dtype, &random_f32(n * k, 1.0, seed)).unwrap();
    dev.upload_bytes(&bytes, dtype, &[n, k]).unwrap()
}

fn block(dev: &Device, (qk, v): (DType, DType), rows: usize, hd: usize, cache: DType) -> Block {
    let f32s = |n: usize, seed: u64, dims: &[usize]| {
        dev.upload::<f32>(&random_f32(n, 1.0, seed), dims).unwrap()
    };
    let cache_dims = [N_KV, MAX_CTX, hd];
    let cache_buf = |seed: u64| {
        let vals = random_f32(N_KV * MAX_CTX * hd, 1.0, seed);
        if cache == DType::F16 {
            let h: Vec<half::f16> = vals.iter().map(|&a| half::f16::from_f32(a)).collect();
            dev.upload(&h, &cache_dims).unwrap()
        } else {
            dev.upload(&vals, &cache_dims).unwrap()
        }
    };
    let pos: Vec<i32> = (0..rows).map(|r| (POS0 + 3 * r) as i32).collect();
    Block {
        hd,
        x: f32s(rows * DIM, 41, &[rows, DIM]),
        attn_norm: f32s(DIM, 42, &[DIM]),
        w: [
            weight(dev, qk, N_HEAD * hd, DIM, 43),
            weight(dev, qk, N_KV * hd, DIM, 44),
            weight(dev, v, N_KV * hd, DIM, 45),
        ],
        q_norm: f32s(hd, 46, &[hd]),
        k_norm: f32s(hd, 47, &[hd]),
        positions: dev.upload::<i32>(&pos, &[rows]).unwrap(),
        step: dev.upload::<i32>(&[POS0 as i32], &[1]).unwrap(),
        q: f32s(rows * N_HEAD * hd, 48, &[rows, N_HEAD * hd]),
        k_cache: cache_buf(49),
        v_cache: cache_buf(50),
    }
}

fn download(dev: &Device, t: &Buffer) -> Vec<f32> {
    if t.dtype() == DType::F16 {
        let h = dev.download::<half::f16>(t).unwrap();
        h.iter().map(|v| v.to_f32()).collect()
    } else {
        dev.download::<f32>(t).unwrap()
    }
}

/// q and the two caches.
fn outputs(dev: &Device, b: &Block) -> [Vec<f32>; 3] {
    [&b.q, &b.k_cache, &b.v_cache].map(|t| download(dev, t))
}

/// The attention input as Qwen 3's blocks record it, run in `exec` with `plan` (recorded: the
/// intermediates marked scratch, so the optimizer may fuse them away).
fn record(
    dev: &Device,
    b: &Block,
    mode: RopeMode,
    exec: Mode,
    plan: &Plan,
) -> ([Vec<f32>; 3], FinishReport) {
    let rows = b.x.dims()[0];
    let (hd, nq, nkv) = (b.hd, N_HEAD * b.hd, N_KV * b.hd);
    let scratch = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    let xn = scratch(&[rows, DIM]);
    let (q_raw, k_raw) = (scratch(&[rows, nq]), scratch(&[rows, nkv]));
    let (k, v) = (scratch(&[rows, nkv]), scratch(&[rows, nkv]));
    let heads = |t: &Buffer, n: usize| t.reshape(&[rows * n, hd]).unwrap();
    let rope = RopeParams::new(mode, hd, BASE);
    let mut s = Executor::new(dev.clone()).begin(exec);
    s.rms_norm(&b.x, &b.attn_norm, &xn, EPS).unwrap();
    s.matmul(&xn, &b.w[0], &q_raw).unwrap();
    s.matmul(&xn, &b.w[1], &k_raw).unwrap();
    s.matmul(&xn, &b.w[2], &v).unwrap();
    s.rms_norm(&heads(&q_raw, N_HEAD), &b.q_norm, &heads(&b.q, N_HEAD), EPS)
        .unwrap();
    s.rms_norm(&heads(&k_raw, N_KV), &b.k_norm, &heads(&k, N_KV), EPS)
        .unwrap();
    s.rope(&b.q, &b.positions, &b.q, &rope).unwrap();
    s.rope(&k, &b.positions, &k, &rope).unwrap();
    s.kv_write(&k, &b.k_cache, &b.step).unwrap();
    s.kv_write(&v, &b.v_cache, &b.step).unwrap();
    if exec == Mode::Recorded {
        for t in [&xn, &q_raw, &k_raw, &k, &v] {
            s.mark_scratch(t);
        }
    }
    let report = s.finish(plan).unwrap();
    (outputs(dev, b), report)
}

fn by_rule(report: &FinishReport, rule: &str) -> usize {
    report.fusions_by_rule.get(rule).copied().unwrap_or(0)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

const NAMES: [&str; 3] = ["q", "k_cache", "v_cache"];
const PAIRS: [(DType, DType); 4] = [
    (DType::Q4K, DType::Q6K),
    (DType::Q5_0, DType::Q8_0),
    (DType::Q8_0, DType::Q8_0),
    (DType::F32, DType::F32),
];

/// Heads of 128 and 256 NeoX values (Qwen 3, Gemma 3) fuse into `norm_qkv` and
/// `rms_norm_rope_kv`, two dispatches with the separate ops' bits; heads of 64 in normal pairs
/// fuse the norm and products, and keep the per-head norms and cache writes, with the same bits.
#[test]
fn a_qk_norm_block_fuses_into_two_dispatches_with_the_separate_ops_bits_on_the_cpu() {
    let dev = Device::cpu(2).unwrap();
    let cases = [
        (128, RopeMode::NeoX, true),
        (256, RopeMode::NeoX, true),
        (64, RopeMode::Normal, false),
    ];
    for formats in PAIRS {
        for (hd, mode, kv_fuses) in cases {
            for rows in [1usize, 3] {
                for cache in [DType::F32, DType::F16] {
                    let what = format!("{formats:?} hd {hd} {mode:?} rows {rows} {cache}");
                    let fresh = || block(&dev, formats, rows, hd, cache);
                    let (want, _) = record(&dev, &fresh(), mode, Mode::Direct, &Plan::SEQUENTIAL);
                    let (got, report) =
                        record(&dev, &fresh(), mode, Mode::Recorded, &Plan::OPTIMIZED);
                    assert_eq!(by_rule(&report, "rms_norm+qkv"), 1, "{what}: {report:?}");
                    let fused_kv = by_rule(&report, "rms_norm_rope+kv_write");
                    assert_eq!(fused_kv, usize::from(kv_fuses), "{what}: {report:?}");
                    let dispatches = if kv_fuses { 2 } else { 5 };
                    assert_eq!(report.dispatches, dispatches, "{what}: {report:?}");
                    for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                        assert!(same_bits(g, w), "{what}: {name} differs");
                    }
                }
            }
        }
    }
}

/// `rms_norm_rope_kv` for the block's q, k and v heads (random pre-norm values).
fn norm_rope_kv<'a>(
    b: &'a Block,
    q_in: &'a Buffer,
    k_in: &'a Buffer,
    v: &'a Buffer,
) -> NormRopeKv<'a> {
    NormRopeKv {
        q_in,
        q_weight: &b.q_norm,
        k_in,
        k_weight: &b.k_norm,
        v,
        positions: &b.positions,
        step: &b.step,
        q: &b.q,
        k_cache: &b.k_cache,
        v_cache: &b.v_cache,
        eps: EPS,
        head_dim: b.hd,
        base: BASE,
        mode: RopeMode::NeoX,
    }
}

/// The pre-norm q, k and v of `rows` rows of heads of `hd` values.
fn pre_norm(dev: &Device, rows: usize, hd: usize) -> [Buffer; 3] {
    let up = |n: usize, seed: u64| {
        dev.upload::<f32>(&random_f32(rows * n * hd, 4.0, seed), &[rows, n * hd])
            .unwrap()
    };
    [up(N_HEAD, 61), up(N_KV, 62), up(N_KV, 63)]
}

/// The separate ops `rms_norm_rope_kv` replaces, on the same inputs, in direct mode.
fn separate_norm_rope_kv(dev: &Device, b: &Block, ins: &[Buffer; 3]) -> [Vec<f32>; 3] {
    let rows = b.positions.elems();
    let k = dev.alloc(DType::F32, &[rows, N_KV * b.hd]).unwrap();
    let rope = RopeParams::new(RopeMode::NeoX, b.hd, BASE);
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.rms_norm_rope(&ins[0], &b.q_norm, &b.positions, &b.q, EPS, &rope)
        .unwrap();
    s.rms_norm_rope(&ins[1], &b.k_norm, &b.positions, &k, EPS, &rope)
        .unwrap();
    s.kv_write(&k, &b.k_cache, &b.step).unwrap();
    s.kv_write(&ins[2], &b.v_cache, &b.step).unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
    outputs(dev, b)
}

/// A step that leaves no room for the rows is refused, naming the position, and the outputs keep
/// their values; heads the kernel does not take are refused by the op, naming head_dim.
#[test]
fn rms_norm_rope_kv_refuses_a_step_past_the_cache_and_writes_nothing() {
    let dev = Device::cpu(2).unwrap();
    let b = block(&dev, (DType::F32, DType::F32), 3, 128, DType::F32);
    let ins = pre_norm(&dev, 3, 128);
    let before = outputs(&dev, &b);
    dev.write(&b.step, &[(MAX_CTX - 2) as i32]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    let err = s
        .rms_norm_rope_kv(&norm_rope_kv(&b, &ins[0], &ins[1], &ins[2]))
        .and_then(|_| s.finish(&Plan::SEQUENTIAL).map(|_| ()))
        .expect_err("three rows from position 10 do not fit 12")
        .to_string();
    assert!(
        err.contains("rms_norm_rope_kv") && err.contains("pos0"),
        "{err}"
    );
    for ((a, e), name) in outputs(&dev, &b).iter().zip(&before).zip(NAMES) {
        assert!(same_bits(a, e), "{name} changed on a refused dispatch");
    }
    let b96 = block(&dev, (DType::F32, DType::F32), 1, 96, DType::F32);
    let ins = pre_norm(&dev, 1, 96);
    let err = onepass::ops::norm_rope_kv::rms_norm_rope_kv(&norm_rope_kv(
        &b96, &ins[0], &ins[1], &ins[2],
    ))
    .expect_err("heads of 96 values are not a whole number of pairs a lane")
    .to_string();
    assert!(err.contains("head_dim"), "{err}");
}

/// On the CPU the fused op gives the separate ops' bits for every head size it takes.
#[test]
fn rms_norm_rope_kv_gives_the_separate_ops_bits_on_the_cpu() {
    let dev = Device::cpu(2).unwrap();
    for hd in [64, 128, 192, 256] {
        for rows in [1usize, 3] {
            for cache in [DType::F32, DType::F16] {
                let what = format!("hd {hd} rows {rows} {cache}");
                let ins = pre_norm(&dev, rows, hd);
                let b = block(&dev, (DType::F32, DType::F32), rows, hd, cache);
                let want = separate_norm_rope_kv(&dev, &b, &ins);
                let b = block(&dev, (DType::F32, DType::F32), rows, hd, cache);
                let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
                s.rms_norm_rope_kv(&norm_rope_kv(&b, &ins[0], &ins[1], &ins[2]))
                    .unwrap();
                s.finish(&Plan::SEQUENTIAL).unwrap();
                for ((g, w), name) in outputs(&dev, &b).iter().zip(&want).zip(NAMES) {
                    assert!(same_bits(g, w), "{what}: {name} differs");
                }
            }
        }
    }
}

#[path = "qk_norm_fusion/cuda.rs"]
mod cuda;
