//! The fused MLP input (`ops::fused_block::norm_gate_up`) on the CPU in every weight format it
//! takes, with both gated activations (SiLU: SwiGLU; GELU in its tanh form: GeGLU), at odd widths
//! and at Gemma 3 270M's (640 activations, 2048 gate/up rows; 768 activations for the K formats,
//! whose 256-value blocks 640 does not hold), for one row (the vector form, and the integer VNNI
//! products for Q4_1/Q8_0 where the CPU has them) and three (the tile form):
//!
//! - the fused op gives the bits of the plain ops it replaces (`rms_norm`, two `matmul`s, then
//!   `swiglu` or `geglu`) run op by op;
//! - recorded as plain ops and optimized, the block fuses (the rule fires once, one dispatch
//!   left) and gives the same bits;
//! - the gate and up products and the hidden values are within a stated tolerance of an f64
//!   reference computed from the same dequantized weights.
//!
//! Seeded random inputs, never zeros.

mod seeded;

use onepass::ops::fused_block::GateActivation;
use onepass::ops::matmul::WEIGHT_DTYPES;
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};
use seeded::random_f32;

const EPS: f32 = 1e-6;
const ACTS: [GateActivation; 2] = [GateActivation::Silu, GateActivation::GeluTanh];

/// The `(dim, ffn)` shapes for `dtype`: an odd one (37 gate/up rows: no whole 16-column tile or
/// task piece; the fewest activations the format's blocks allow past one block, 67 for the float
/// formats) and Gemma 3's.
fn shapes(dtype: DType) -> [(usize, usize); 2] {
    match dtype.block_elems() {
        1 => [(67, 37), (640, 2048)],
        32 => [(96, 37), (640, 2048)],
        _ => [(512, 37), (768, 2048)],
    }
}

/// One MLP input's host values (the weights as the quantized format holds them).
struct Values {
    dim: usize,
    ffn: usize,
    rows: usize,
    x: Vec<f32>,
    norm: Vec<f32>,
    /// w_gate, w_up in the weight format.
    bytes: [Vec<u8>; 2],
    /// w_gate, w_up dequantized.
    deq: [Vec<f32>; 2],
}

fn values(dtype: DType, dim: usize, ffn: usize, rows: usize, seed: u64) -> Values {
    let bytes: [Vec<u8>; 2] = std::array::from_fn(|i| {
        let w = random_f32(ffn * dim, 1.0, seed + 2 + i as u64);
        onepass::quant::quantize(dtype, &w).unwrap()
    });
    let deq = std::array::from_fn(|i| onepass::quant::dequantize(dtype, &bytes[i]).unwrap());
    Values {
        dim,
        ffn,
        rows,
        x: random_f32(rows * dim, 1.0, seed),
        norm: random_f32(dim, 1.0, seed + 1),
        bytes,
        deq,
    }
}

/// The buffers of one MLP input on a device.
struct Bufs {
    x: Buffer,
    norm: Buffer,
    w: [Buffer; 2],
    xn: Buffer,
    gate: Buffer,
    up: Buffer,
    hidden: Buffer,
}

fn bufs(dev: &Device, dtype: DType, v: &Values) -> Bufs {
    let (rows, dim, ffn) = (v.rows, v.dim, v.ffn);
    let f32s = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    Bufs {
        x: dev.upload::<f32>(&v.x, &[rows, dim]).unwrap(),
        norm: dev.upload::<f32>(&v.norm, &[dim]).unwrap(),
        w: std::array::from_fn(|i| dev.upload_bytes(&v.bytes[i], dtype, &[ffn, dim]).unwrap()),
        xn: f32s(&[rows, dim]),
        gate: f32s(&[rows, ffn]),
        up: f32s(&[rows, ffn]),
        hidden: dev
            .upload::<f32>(&random_f32(rows * ffn, 1.0, 99), &[rows, ffn])
            .unwrap(),
    }
}

/// Records (or runs) the plain ops of the MLP input.
fn plain_ops(s: &mut onepass::Session, b: &Bufs, act: GateActivation) {
    s.rms_norm(&b.x, &b.norm, &b.xn, EPS).unwrap();
    s.matmul(&b.xn, &b.w[0], &b.gate).unwrap();
    s.matmul(&b.xn, &b.w[1], &b.up).unwrap();
    match act {
        GateActivation::Silu => s.swiglu(&b.gate, &b.up, &b.hidden).unwrap(),
        GateActivation::GeluTanh => s.geglu(&b.gate, &b.up, &b.hidden).unwrap(),
    }
}

/// The plain ops run one by one: `(gate, up, hidden)`.
fn plain(dev: &Device, dtype: DType, v: &Values, act: GateActivation) -> [Vec<f32>; 3] {
    let b = bufs(dev, dtype, v);
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    plain_ops(&mut s, &b, act);
    s.finish(&Plan::SEQUENTIAL).unwrap();
    [&b.gate, &b.up, &b.hidden].map(|t| dev.download::<f32>(t).unwrap())
}

/// The fused op run alone: `hidden`.
fn fused(dev: &Device, dtype: DType, v: &Values, act: GateActivation) -> Vec<f32> {
    let b = bufs(dev, dtype, v);
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    s.norm_gate_up(&b.x, &b.norm, EPS, &b.w[0], &b.w[1], &b.hidden, act)
        .unwrap();
    s.finish(&Plan::SEQUENTIAL).unwrap();
    dev.download::<f32>(&b.hidden).unwrap()
}

/// The plain ops recorded and optimized (the intermediates marked scratch): `hidden`, the
/// dispatches left and the rule's count.
fn optimized(
    dev: &Device,
    dtype: DType,
    v: &Values,
    act: GateActivation,
) -> (Vec<f32>, usize, usize) {
    let b = bufs(dev, dtype, v);
    let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
    plain_ops(&mut s, &b, act);
    for t in [&b.xn, &b.gate, &b.up] {
        s.mark_scratch(t);
    }
    let report = s.finish(&Plan::OPTIMIZED).unwrap();
    let by_rule = report
        .fusions_by_rule
        .get("rms_norm+gate_up+glu")
        .copied()
        .unwrap_or(0);
    (
        dev.download::<f32>(&b.hidden).unwrap(),
        report.dispatches,
        by_rule,
    )
}

/// The activation in f64, in the form the kernels compute (GELU's tanh form, not erf's).
fn activation(act: GateActivation, g: f64) -> f64 {
    match act {
        GateActivation::Silu => g / (1.0 + (-g).exp()),
        GateActivation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g * g * g)).tanh())
        }
    }
}

/// The f64 reference: per output, `(g, u, h, S_g, S_u)` with `S` the sum of the magnitudes of the
/// product's terms (the scale of its rounding error).
fn reference(v: &Values, act: GateActivation) -> Vec<[f64; 5]> {
    let (dim, ffn) = (v.dim, v.ffn);
    let mut out = Vec::with_capacity(v.rows * ffn);
    for r in 0..v.rows {
        let xr = &v.x[r * dim..(r + 1) * dim];
        let ms = xr.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        let xn: Vec<f64> = xr
            .iter()
            .zip(&v.norm)
            .map(|(&a, &w)| a as f64 * inv * w as f64)
            .collect();
        let dot = |w: &[f32], o: usize| {
            let row = &w[o * dim..(o + 1) * dim];
            let terms = xn.iter().zip(row).map(|(&a, &b)| a * b as f64);
            terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()))
        };
        for o in 0..ffn {
            let ((g, sg), (u, su)) = (dot(&v.deq[0], o), dot(&v.deq[1], o));
            out.push([g, u, activation(act, g) * u, sg, su]);
        }
    }
    out
}

/// The products' error bound per unit of their terms' magnitudes: f32 sums of up to 768 terms
/// (each a normalized activation rounded a few times, or for Q4_1/Q8_0 on one row quantized to
/// 22 bits, times an exact weight) stay well inside it (measured: at most 3.5e-7, on AVX-512 with
/// VNNI; the hidden values within 6% of their bound). One wrong quant or a dropped block moves a
/// product by far more.
const PRODUCT_TOL: f64 = 2e-6;

/// The bound on a hidden value from the bounds `dg`, `du` on its gate and up products: both
/// activations' slopes stay below 1.2 and `|act(g)| <= |g|`, so the products' errors reach it as
/// `1.2 |u| dg + |g| du + 1.2 dg du`; the activation and the product in f32 add a few roundings of
/// `|g u|` (GELU's `1 + tanh` cancels for negative `g`: an absolute rounding of 1 times `|g u|`).
fn hidden_tol(g: f64, u: f64, dg: f64, du: f64) -> f64 {
    1.2 * (u.abs() * dg + g.abs() * du + dg * du) + 1e-6 * (g * u).abs() + 1e-6
}

#[test]
fn fused_gate_up_gives_the_plain_ops_bits_and_the_f64_values() {
    let dev = Device::cpu(2).unwrap();
    for (f, dtype) in WEIGHT_DTYPES.into_iter().enumerate() {
        for (dim, ffn) in shapes(dtype) {
            for rows in [1usize, 3] {
                let seed = 7000 + 100 * f as u64 + rows as u64;
                let v = values(dtype, dim, ffn, rows, seed);
                for act in ACTS {
                    let what = format!("{dtype} dim {dim} ffn {ffn} rows {rows} {act:?}");
                    let [gate, up, want] = plain(&dev, dtype, &v, act);
                    let got = fused(&dev, dtype, &v, act);
                    let (opt, dispatches, fusions) = optimized(&dev, dtype, &v, act);
                    assert_eq!((dispatches, fusions), (1, 1), "{what}: the rule fires");
                    for (i, ((a, b), e)) in got.iter().zip(&opt).zip(&want).enumerate() {
                        assert!(
                            a.to_bits() == e.to_bits() && b.to_bits() == e.to_bits(),
                            "{what}: hidden[{i}]: fused {a}, optimized {b}, plain {e}"
                        );
                    }
                    let reference = reference(&v, act);
                    for (i, [g, u, h, sg, su]) in reference.into_iter().enumerate() {
                        let (dg, du) = (PRODUCT_TOL * sg, PRODUCT_TOL * su);
                        let (eg, eu) = ((gate[i] as f64 - g).abs(), (up[i] as f64 - u).abs());
                        assert!(eg <= dg, "{what}: gate[{i}]: {} against {g}", gate[i]);
                        assert!(eu <= du, "{what}: up[{i}]: {} against {u}", up[i]);
                        let tol = hidden_tol(g, u, dg, du);
                        assert!(
                            (got[i] as f64 - h).abs() <= tol,
                            "{what}: hidden[{i}]: fused {}, f64 {h} (tolerance {tol:e})",
                            got[i]
                        );
                    }
                }
            }
        }
    }
}

/// The tolerance is tight enough to tell the activations apart: SwiGLU's values are outside
/// GeGLU's bound (at all but a few gates near 0 or far below it, where both activations vanish).
#[test]
fn the_reference_tells_the_activations_apart() {
    let v = values(DType::Q8_0, 96, 37, 1, 17);
    let (silu, gelu) = (
        reference(&v, GateActivation::Silu),
        reference(&v, GateActivation::GeluTanh),
    );
    let outside = silu
        .iter()
        .zip(&gelu)
        .filter(|(s, g)| {
            let tol = hidden_tol(g[0], g[1], PRODUCT_TOL * g[3], PRODUCT_TOL * g[4]);
            (s[2] - g[2]).abs() > tol
        })
        .count();
    assert!(outside > 30, "only {outside} of 37 values differ");
}
