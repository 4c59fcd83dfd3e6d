//! The fused block ops (`ops::fused_block`) on the CPU against the separate CPU ops they replace:
//! RMS norm, the q/k/v (or gate/up) products, RoPE, the KV cache writes and SwiGLU or GeGLU. The
//! fused kernels run the separate ops' own loops, so the results must be bitwise equal, for one
//! row (decode: the integer VNNI products for Q4_1/Q8_0, the vector form for the others) and 3
//! and 13 rows (the tile form, 13 crossing a micro-kernel call of 12 rows), both RoPE layouts and
//! both gated activations (normal pairs with SiLU, NeoX with GELU tanh). Also checked: an f64
//! reference within a stated tolerance, and a cache position out of range is an error that
//! writes nothing. Seeded random inputs, never zeros. (`tests/cpu_gate_up.rs` checks the MLP
//! input alone in every weight format, at odd widths and Gemma 3's.)

mod seeded;

use onepass::ops::fused_block::{GateActivation, QkvRope};
use onepass::ops::rope::{RopeMode, RopeParams};
use onepass::{Buffer, DType, Device, Executor, FinishReport, Mode, Plan};
use seeded::random_f32;

const N_HEAD: usize = 4;
const N_KV: usize = 2;
const HD: usize = 64;
const DIM: usize = 256;
// Not a multiple of the 16-column tile, so the stacked gate/up tiles include partial ones.
const FFN: usize = 520;
const MAX_CTX: usize = 24;
const POS0: usize = 5;
const EPS: f32 = 1e-5;
const BASE: f32 = 10000.0;

/// The host values of one block's inputs (weights before quantization).
struct Values {
    x: Vec<f32>,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    weights: [Vec<f32>; 5],
    q: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    hidden: Vec<f32>,
}

fn values(rows: usize) -> Values {
    let shapes = [N_HEAD * HD, N_KV * HD, N_KV * HD, FFN, FFN];
    Values {
        x: random_f32(rows * DIM, 1.0, 21),
        attn_norm: random_f32(DIM, 1.0, 22),
        ffn_norm: random_f32(DIM, 1.0, 23),
        weights: std::array::from_fn(|i| random_f32(shapes[i] * DIM, 1.0, 24 + i as u64)),
        q: random_f32(rows * N_HEAD * HD, 1.0, 29),
        k_cache: random_f32(N_KV * MAX_CTX * HD, 1.0, 30),
        v_cache: random_f32(N_KV * MAX_CTX * HD, 1.0, 31),
        hidden: random_f32(rows * FFN, 1.0, 32),
    }
}

/// The formats of the five weights (wq, wk, wv, w_gate, w_up): one format, or v of another (a
/// llama.cpp Q4_K_M block: Q6_K v beside Q4_K).
#[derive(Clone, Copy)]
struct Formats {
    all: DType,
    v: DType,
}

impl From<DType> for Formats {
    fn from(d: DType) -> Formats {
        Formats { all: d, v: d }
    }
}

impl Formats {
    /// Weight `i`'s format.
    fn of(self, i: usize) -> DType {
        if i == 2 {
            self.v
        } else {
            self.all
        }
    }
}

impl std::fmt::Display for Formats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.v == self.all {
            write!(f, "{}", self.all)
        } else {
            write!(f, "{} with v {}", self.all, self.v)
        }
    }
}

/// One block's buffers on the CPU.
struct Block {
    x: Buffer,
    attn_norm: Buffer,
    ffn_norm: Buffer,
    /// wq, wk, wv, w_gate, w_up.
    w: [Buffer; 5],
    positions: Buffer,
    step: Buffer,
    q: Buffer,
    k_cache: Buffer,
    v_cache: Buffer,
    hidden: Buffer,
}

fn block(dev: &Device, formats: impl Into<Formats>, v: &Values, rows: usize) -> Block {
    let formats = formats.into();
    let up = |vals: &[f32], dims: &[usize]| dev.upload::<f32>(vals, dims).unwrap();
    let shapes = [N_HEAD * HD, N_KV * HD, N_KV * HD, FFN, FFN];
    let pos: Vec<i32> = (0..rows).map(|r| (POS0 + r) as i32).collect();
    Block {
        x: up(&v.x, &[rows, DIM]),
        attn_norm: up(&v.attn_norm, &[DIM]),
        ffn_norm: up(&v.ffn_norm, &[DIM]),
        w: std::array::from_fn(|i| {
            let dtype = formats.of(i);
            let bytes = onepass::quant::quantize(dtype, &v.weights[i]).unwrap();
            dev.upload_bytes(&bytes, dtype, &[shapes[i], DIM]).unwrap()
        }),
        positions: dev.upload::<i32>(&pos, &[rows]).unwrap(),
        step: dev.upload::<i32>(&[POS0 as i32], &[1]).unwrap(),
        q: up(&v.q, &[rows, N_HEAD * HD]),
        k_cache: up(&v.k_cache, &[N_KV, MAX_CTX, HD]),
        v_cache: up(&v.v_cache, &[N_KV, MAX_CTX, HD]),
        hidden: up(&v.hidden, &[rows, FFN]),
    }
}

fn outputs(dev: &Device, b: &Block) -> [Vec<f32>; 4] {
    [&b.q, &b.k_cache, &b.v_cache, &b.hidden].map(|t| {
        if t.dtype() == DType::F16 {
            let halves = dev.download::<half::f16>(t).unwrap();
            halves.iter().map(|h| h.to_f32()).collect()
        } else {
            dev.download::<f32>(t).unwrap()
        }
    })
}

/// `b` with f16 KV caches holding `v`'s start values rounded.
fn with_f16_caches(dev: &Device, mut b: Block, v: &Values) -> Block {
    let dims = [N_KV, MAX_CTX, HD];
    let half =
        |x: &[f32]| -> Vec<half::f16> { x.iter().map(|&a| half::f16::from_f32(a)).collect() };
    b.k_cache = dev.upload(&half(&v.k_cache), &dims).unwrap();
    b.v_cache = dev.upload(&half(&v.v_cache), &dims).unwrap();
    b
}

/// The block's attention and MLP inputs through the separate ops.
fn separate(
    dev: &Device,
    b: &Block,
    rows: usize,
    mode: RopeMode,
    act: GateActivation,
) -> [Vec<f32>; 4] {
    separate_in(dev, b, rows, (mode, act), Mode::Direct, &Plan::SEQUENTIAL).0
}

/// The separate ops run in `exec` and finished with `plan` (recorded: the intermediates marked
/// scratch, so the optimizer may fuse them away), and the report.
fn separate_in(
    dev: &Device,
    b: &Block,
    rows: usize,
    (mode, act): (RopeMode, GateActivation),
    exec: Mode,
    plan: &Plan,
) -> ([Vec<f32>; 4], FinishReport) {
    let scratch = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    let (xn, k, v) = (
        scratch(&[rows, DIM]),
        scratch(&[rows, N_KV * HD]),
        scratch(&[rows, N_KV * HD]),
    );
    let (gate, up) = (scratch(&[rows, FFN]), scratch(&[rows, FFN]));
    let rope = RopeParams::new(mode, HD, BASE);
    let mut s = Executor::new(dev.clone()).begin(exec);
    s.rms_norm(&b.x, &b.attn_norm, &xn, EPS).unwrap();
    s.matmul(&xn, &b.w[0], &b.q).unwrap();
    s.matmul(&xn, &b.w[1], &k).unwrap();
    s.matmul(&xn, &b.w[2], &v).unwrap();
    s.rope(&b.q, &b.positions, &b.q, &rope).unwrap();
    s.rope(&k, &b.positions, &k, &rope).unwrap();
    s.kv_write(&k, &b.k_cache, &b.step).unwrap();
    s.kv_write(&v, &b.v_cache, &b.step).unwrap();
    s.rms_norm(&b.x, &b.ffn_norm, &xn, EPS).unwrap();
    s.matmul(&xn, &b.w[3], &gate).unwrap();
    s.matmul(&xn, &b.w[4], &up).unwrap();
    match act {
        GateActivation::Silu => s.swiglu(&gate, &up, &b.hidden).unwrap(),
        GateActivation::GeluTanh => s.geglu(&gate, &up, &b.hidden).unwrap(),
    }
    if exec == Mode::Recorded {
        for t in [&xn, &k, &v, &gate, &up] {
            s.mark_scratch(t);
        }
    }
    let report = s.finish(plan).unwrap();
    (outputs(dev, b), report)
}

fn qkv_rope<'a>(b: &'a Block, mode: RopeMode) -> QkvRope<'a> {
    QkvRope {
        x: &b.x,
        norm: &b.attn_norm,
        eps: EPS,
        wq: &b.w[0],
        wk: &b.w[1],
        wv: &b.w[2],
        positions: &b.positions,
        freq_factors: None,
        step: &b.step,
        q: &b.q,
        k_cache: &b.k_cache,
        v_cache: &b.v_cache,
        n_head: N_HEAD,
        n_kv_head: N_KV,
        head_dim: HD,
        base: BASE,
        mode,
    }
}

/// The same through the two fused ops, recorded and optimized.
fn fused(dev: &Device, b: &Block, mode: RopeMode, act: GateActivation) -> [Vec<f32>; 4] {
    let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
    s.norm_qkv_rope(&qkv_rope(b, mode)).unwrap();
    s.norm_gate_up(&b.x, &b.ffn_norm, EPS, &b.w[3], &b.w[4], &b.hidden, act)
        .unwrap();
    let report = s.finish(&Plan::OPTIMIZED).unwrap();
    assert_eq!(report.dispatches, 2);
    outputs(dev, b)
}

/// The block's outputs in f64 from the dequantized weights: q, the two caches and hidden; and
/// per hidden value `|g| + |u| + |g u|` of its gate and up products (the scale of its error).
fn reference(
    formats: Formats,
    v: &Values,
    rows: usize,
    mode: RopeMode,
    act: GateActivation,
) -> ([Vec<f64>; 4], Vec<f64>) {
    let w: Vec<Vec<f64>> = v
        .weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let dtype = formats.of(i);
            let bytes = onepass::quant::quantize(dtype, w).unwrap();
            let deq = onepass::quant::dequantize(dtype, &bytes).unwrap();
            deq.iter().map(|&x| x as f64).collect()
        })
        .collect();
    let norm = |r: usize, g: &[f32]| -> Vec<f64> {
        let xr = &v.x[r * DIM..(r + 1) * DIM];
        let ms = xr.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / DIM as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        xr.iter()
            .zip(g)
            .map(|(&a, &b)| a as f64 * inv * b as f64)
            .collect()
    };
    let product = |x: &[f64], w: &[f64], n: usize| -> Vec<f64> {
        (0..n)
            .map(|o| (0..DIM).map(|i| x[i] * w[o * DIM + i]).sum())
            .collect()
    };
    let rotate = |head: &mut [f64], pos: usize| {
        let half = HD / 2;
        for i in 0..half {
            let theta = pos as f64 * (BASE as f64).powf(-2.0 * i as f64 / HD as f64);
            let (j0, j1) = match mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::NeoX => (i, i + half),
            };
            let (a, b) = (head[j0], head[j1]);
            head[j0] = a * theta.cos() - b * theta.sin();
            head[j1] = a * theta.sin() + b * theta.cos();
        }
    };
    let widen = |s: &[f32]| s.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let (mut q, mut kc, mut vc, mut hidden) = (
        widen(&v.q),
        widen(&v.k_cache),
        widen(&v.v_cache),
        widen(&v.hidden),
    );
    let mut hidden_scale = vec![0.0; rows * FFN];
    for r in 0..rows {
        let pos = POS0 + r;
        let xa = norm(r, &v.attn_norm);
        let mut qr = product(&xa, &w[0], N_HEAD * HD);
        let mut kr = product(&xa, &w[1], N_KV * HD);
        let vr = product(&xa, &w[2], N_KV * HD);
        qr.chunks_exact_mut(HD).for_each(|h| rotate(h, pos));
        kr.chunks_exact_mut(HD).for_each(|h| rotate(h, pos));
        q[r * N_HEAD * HD..(r + 1) * N_HEAD * HD].copy_from_slice(&qr);
        for h in 0..N_KV {
            let at = (h * MAX_CTX + pos) * HD;
            kc[at..at + HD].copy_from_slice(&kr[h * HD..(h + 1) * HD]);
            vc[at..at + HD].copy_from_slice(&vr[h * HD..(h + 1) * HD]);
        }
        let xf = norm(r, &v.ffn_norm);
        let (g, u) = (product(&xf, &w[3], FFN), product(&xf, &w[4], FFN));
        for o in 0..FFN {
            hidden[r * FFN + o] = activation(act, g[o]) * u[o];
            hidden_scale[r * FFN + o] = g[o].abs() + u[o].abs() + (g[o] * u[o]).abs();
        }
    }
    ([q, kc, vc, hidden], hidden_scale)
}

/// The gated activation in f64: `silu(g)`, or GELU in its tanh form (the form the kernels
/// compute, not the erf form).
fn activation(act: GateActivation, g: f64) -> f64 {
    match act {
        GateActivation::Silu => g / (1.0 + (-g).exp()),
        GateActivation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g * g * g)).tanh())
        }
    }
}

const NAMES: [&str; 4] = ["q", "k_cache", "v_cache", "hidden"];

#[test]
fn fused_block_ops_give_the_separate_ops_bits_on_the_cpu() {
    let dev = Device::cpu(2).unwrap();
    let q4_k_m = Formats {
        all: DType::Q4K,
        v: DType::Q6K,
    };
    for dtype in [
        DType::Q4_1.into(),
        DType::Q5_0.into(),
        DType::Q8_0.into(),
        DType::Q4K.into(),
        q4_k_m,
        DType::F16.into(),
    ] {
        for rows in [1usize, 3, 13] {
            let v = values(rows);
            let acts = [GateActivation::Silu, GateActivation::GeluTanh];
            for (mode, act) in [RopeMode::Normal, RopeMode::NeoX].into_iter().zip(acts) {
                let what = format!("{dtype} rows {rows} {mode:?} {act:?}");
                let want = separate(&dev, &block(&dev, dtype, &v, rows), rows, mode, act);
                let got = fused(&dev, &block(&dev, dtype, &v, rows), mode, act);
                for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                    for (i, (a, e)) in g.iter().zip(w).enumerate() {
                        assert!(
                            a.to_bits() == e.to_bits(),
                            "{what}: {name}[{i}]: fused {a}, separate {e}"
                        );
                    }
                }
                // q, k and v are sums of 256 products of normalized values (|x| about 1.7) and
                // weights below 1 in f32 (for Q4_1/Q8_0 on one row with the activations
                // quantized to 22 bits): errors far below 1e-4 + 1e-5 |value|. A hidden value
                // act(g) u (act SiLU or GELU, slopes at most 1.13) carries the errors of g and u
                // times the other factor, so its bound scales with |g| + |u| + |g u|. Cache rows
                // outside pos0..pos0 + rows keep their random values.
                let (reference, hidden_scale) = reference(dtype, &v, rows, mode, act);
                for (j, ((g, w), name)) in got.iter().zip(&reference).zip(NAMES).enumerate() {
                    for (i, (&a, &e)) in g.iter().zip(w).enumerate() {
                        let scale = if j == 3 { hidden_scale[i] } else { e.abs() };
                        assert!(
                            (a as f64 - e).abs() <= 1e-4 + 1e-5 * scale,
                            "{what}: {name}[{i}]: fused {a}, f64 {e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_cache_position_out_of_range_is_an_error_that_writes_nothing() {
    let dev = Device::cpu(2).unwrap();
    let rows = 3;
    let v = values(rows);
    let b = block(&dev, DType::Q8_0, &v, rows);
    // Positions 22..25 do not fit in 24.
    dev.write::<i32>(&b.step, &[(MAX_CTX - 2) as i32]).unwrap();
    let before = outputs(&dev, &b);
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    let err = s
        .norm_qkv_rope(&qkv_rope(&b, RopeMode::Normal))
        .and_then(|()| s.finish(&Plan::SEQUENTIAL).map(|_| ()))
        .expect_err("pos0 + rows beyond the cache must be refused")
        .to_string();
    assert!(
        err.contains("norm_qkv_rope_q8_0") && err.contains("do not fit"),
        "{err}"
    );
    let after = outputs(&dev, &b);
    for ((a, e), name) in after.iter().zip(&before).zip(NAMES) {
        assert!(a == e, "{name} changed on a refused dispatch");
    }
}

/// With f16 caches the fused attention input writes what the separate ops' `kv_write` writes
/// (each value rounded once): the same bits, one row and several, both RoPE layouts.
#[test]
fn fused_block_ops_write_f16_caches_as_the_separate_ops_do() {
    let dev = Device::cpu(2).unwrap();
    for dtype in [DType::Q4_1, DType::Q8_0, DType::Q4K] {
        for rows in [1usize, 3] {
            let v = values(rows);
            for mode in [RopeMode::Normal, RopeMode::NeoX] {
                let what = format!("{dtype} rows {rows} {mode:?}");
                let act = GateActivation::Silu;
                let half = |b| with_f16_caches(&dev, b, &v);
                let want = separate(&dev, &half(block(&dev, dtype, &v, rows)), rows, mode, act);
                let got = fused(&dev, &half(block(&dev, dtype, &v, rows)), mode, act);
                for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                    assert!(g == w, "{what}: {name} differs");
                }
            }
        }
    }
}

/// A llama.cpp Q4_K_M block records its attention input as plain ops with a Q6_K v product beside
/// Q4_K q and k: the optimizer fuses it into the mixed kernel, whose results are the plain ops'
/// bits, for one row and several. A v format the fused kernels do not take beside q's (Q8_0
/// beside Q4_K) is refused by the fused op, naming wv, and left unfused by the optimizer, with
/// the same bits.
#[test]
fn a_q6_k_v_beside_q4_k_fuses_and_keeps_the_separate_ops_bits() {
    let dev = Device::cpu(2).unwrap();
    let act = (RopeMode::Normal, GateActivation::Silu);
    for (v_format, fuses) in [(DType::Q6K, true), (DType::Q8_0, false)] {
        let formats = Formats {
            all: DType::Q4K,
            v: v_format,
        };
        for rows in [1usize, 3] {
            let what = format!("{formats} rows {rows}");
            let v = values(rows);
            let want = separate(&dev, &block(&dev, formats, &v, rows), rows, act.0, act.1);
            let b = block(&dev, formats, &v, rows);
            let (got, report) = separate_in(&dev, &b, rows, act, Mode::Recorded, &Plan::OPTIMIZED);
            let by_rule = |r: &str| report.fusions_by_rule.get(r).copied().unwrap_or(0);
            assert_eq!(
                by_rule("rms_norm+qkv+rope+kv_write"),
                usize::from(fuses),
                "{what}: {report:?}"
            );
            assert_eq!(by_rule("rms_norm+gate_up+glu"), 1, "{what}: {report:?}");
            for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                assert!(
                    g.iter().zip(w).all(|(a, e)| a.to_bits() == e.to_bits()),
                    "{what}: {name}: the optimized graph and the separate ops differ"
                );
            }
            if !fuses {
                let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
                let err = s
                    .norm_qkv_rope(&qkv_rope(&b, act.0))
                    .expect_err("a Q8_0 v beside Q4_K must be refused")
                    .to_string();
                assert!(
                    err.contains("norm_qkv_rope") && err.contains("wv") && err.contains("q6_k"),
                    "{what}: {err}"
                );
            }
        }
    }
}

/// Llama 3's files give the RoPE frequency factors (`rope_freqs`): the attention input recorded
/// with `rope`s that take them fuses into `norm_qkv_rope_ff_<w>`, with the separate ops' bits,
/// for one row and several.
#[test]
fn frequency_factors_fuse_into_the_ff_kernel_with_the_separate_ops_bits() {
    let dev = Device::cpu(2).unwrap();
    // Factors from 1 to 8, as Llama 3's scaling gives its low frequencies.
    let factors: Vec<f32> = random_f32(HD / 2, 1.0, 77)
        .iter()
        .map(|v| 1.0 + 7.0 * v.abs())
        .collect();
    let ff = dev.upload::<f32>(&factors, &[HD / 2]).unwrap();
    for dtype in [DType::Q4_0, DType::Q4K] {
        for rows in [1usize, 3] {
            let what = format!("{dtype} rows {rows}");
            let v = values(rows);
            let run = |exec: Mode, plan: &Plan| {
                let b = block(&dev, dtype, &v, rows);
                let scratch = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
                let (xn, k, vv) = (
                    scratch(&[rows, DIM]),
                    scratch(&[rows, N_KV * HD]),
                    scratch(&[rows, N_KV * HD]),
                );
                let rope = RopeParams {
                    freq_factors: Some(&ff),
                    ..RopeParams::new(RopeMode::NeoX, HD, BASE)
                };
                let mut s = Executor::new(dev.clone()).begin(exec);
                s.rms_norm(&b.x, &b.attn_norm, &xn, EPS).unwrap();
                s.matmul(&xn, &b.w[0], &b.q).unwrap();
                s.matmul(&xn, &b.w[1], &k).unwrap();
                s.matmul(&xn, &b.w[2], &vv).unwrap();
                s.rope(&b.q, &b.positions, &b.q, &rope).unwrap();
                s.rope(&k, &b.positions, &k, &rope).unwrap();
                s.kv_write(&k, &b.k_cache, &b.step).unwrap();
                s.kv_write(&vv, &b.v_cache, &b.step).unwrap();
                if exec == Mode::Recorded {
                    for t in [&xn, &k, &vv] {
                        s.mark_scratch(t);
                    }
                }
                let report = s.finish(plan).unwrap();
                (outputs(&dev, &b), report)
            };
            let (want, _) = run(Mode::Direct, &Plan::SEQUENTIAL);
            let (got, report) = run(Mode::Recorded, &Plan::OPTIMIZED);
            let fused = report.fusions_by_rule.get("rms_norm+qkv+rope+kv_write");
            assert_eq!(fused, Some(&1), "{what}: {report:?}");
            assert_eq!(report.dispatches, 1, "{what}: {report:?}");
            for ((g, w), name) in got.iter().zip(&want).zip(NAMES) {
                assert!(
                    g.iter().zip(w).all(|(a, e)| a.to_bits() == e.to_bits()),
                    "{what}: {name}: the fused kernel and the separate ops differ"
                );
            }
        }
    }
}
