//! `rms_norm_rope` and the `rms_norm+rope` fusion rule on the CPU: the fused kernel against the
//! pair it replaces (bitwise), against a float64 reference, its argument checks, and where the
//! rule fires and where it must not. Seeded random inputs, never zeros.

use crate::backend::{Buffer, DType, Device};
use crate::error::Error;
use crate::ops::copy::float_io::run_direct;
use crate::ops::rope::{RopeMode, RopeParams};
use crate::testutil::{assert_close, random_f32, rng};
use crate::{Executor, Mode, Plan, Session};
use rand::RngExt;

const EPS: f32 = 1e-6;
const BASE: f32 = 10_000.0;

/// One case: (rows, heads, head_dim, rotary_dim, mode).
type Case = (usize, usize, usize, usize, RopeMode);

/// Rows 1 and 3; heads 4 and 1; head_dim 256, 64 and 32; the whole head or half of it rotating;
/// both pair layouts.
fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for rows in [1, 3] {
        for (heads, head_dim) in [(4, 256), (1, 64), (4, 32), (1, 256)] {
            for rotary_dim in [head_dim, head_dim / 2] {
                for mode in [RopeMode::Normal, RopeMode::NeoX] {
                    v.push((rows, heads, head_dim, rotary_dim, mode));
                }
            }
        }
    }
    v
}

/// The inputs of a case: x `[rows * heads, head_dim]` (values), weight, positions.
struct Inputs {
    x: Vec<f32>,
    w: Vec<f32>,
    positions: Vec<i32>,
}

fn inputs(case: &Case, seed: u64) -> Inputs {
    let &(rows, heads, head_dim, _, _) = case;
    let mut r = rng(seed + 2);
    Inputs {
        x: random_f32(rows * heads * head_dim, 2.0, seed),
        w: random_f32(head_dim, 1.5, seed + 1),
        positions: (0..rows).map(|_| r.random_range(1..40_000)).collect(),
    }
}

fn params(case: &Case) -> RopeParams<'static> {
    let &(_, _, head_dim, rotary_dim, mode) = case;
    RopeParams {
        mode,
        head_dim,
        rotary_dim,
        base: BASE,
        freq_factors: None,
    }
}

/// The buffers of a case on `dev`: (x as the norm's rows, weight, positions, q as the rope's
/// rows `[rows, heads * head_dim]`).
fn upload(dev: &Device, case: &Case, inp: &Inputs) -> (Buffer, Buffer, Buffer, Buffer) {
    let &(rows, heads, head_dim, _, _) = case;
    let x = dev.upload(&inp.x, &[rows * heads, head_dim]).unwrap();
    let w = dev.upload(&inp.w, &[head_dim]).unwrap();
    let pos = dev.upload(&inp.positions, &[rows]).unwrap();
    let q = dev.alloc(DType::F32, &[rows, heads * head_dim]).unwrap();
    (x, w, pos, q)
}

/// What the models record: the norm into the per-head view of `q`, then the rope of `q` in place.
fn record_pair(s: &mut Session, case: &Case, bufs: &(Buffer, Buffer, Buffer, Buffer)) {
    let &(rows, heads, head_dim, _, _) = case;
    let (x, w, pos, q) = bufs;
    let q_heads = q.reshape(&[rows * heads, head_dim]).unwrap();
    s.rms_norm(x, w, &q_heads, EPS).unwrap();
    s.rope(q, pos, q, &params(case)).unwrap();
}

/// f64 reference: each head normalized with the weight, then rotated.
fn reference(case: &Case, inp: &Inputs) -> Vec<f32> {
    let &(_, heads, head_dim, rotary_dim, mode) = case;
    let pairs = rotary_dim / 2;
    let mut out = Vec::with_capacity(inp.x.len());
    for (r, row) in inp.x.chunks(heads * head_dim).enumerate() {
        let pos = inp.positions[r] as f64;
        for head in row.chunks(head_dim) {
            let mean = head.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / head_dim as f64;
            let inv = 1.0 / (mean + EPS as f64).sqrt();
            let mut y: Vec<f64> = head
                .iter()
                .zip(&inp.w)
                .map(|(&v, &w)| v as f64 * inv * w as f64)
                .collect();
            for i in 0..pairs {
                let theta = pos * (BASE as f64).powf(-2.0 * i as f64 / rotary_dim as f64);
                let (j0, j1) = match mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::NeoX => (i, i + pairs),
                };
                let (a, b) = (y[j0], y[j1]);
                y[j0] = a * theta.cos() - b * theta.sin();
                y[j1] = a * theta.sin() + b * theta.cos();
            }
            out.extend(y.into_iter().map(|v| v as f32));
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The fused op, called directly and made by the rule from the recorded pair, gives the pair's
/// bits in every case.
#[test]
fn rms_norm_rope_gives_the_bits_of_the_pair() {
    let dev = Device::cpu(2).unwrap();
    for (k, case) in cases().iter().enumerate() {
        let inp = inputs(case, 100 + 10 * k as u64);
        let pair = upload(&dev, case, &inp);
        run_direct(&dev, |s| {
            record_pair(s, case, &pair);
            Ok(())
        });
        let want = bits(&dev.download(&pair.3).unwrap());
        let direct = upload(&dev, case, &inp);
        let (x, w, pos, q) = &direct;
        run_direct(&dev, |s| s.rms_norm_rope(x, w, pos, q, EPS, &params(case)));
        assert_eq!(
            bits(&dev.download(q).unwrap()),
            want,
            "direct, case {case:?}"
        );
        let fused = upload(&dev, case, &inp);
        let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
        record_pair(&mut s, case, &fused);
        let report = s.finish(&Plan::OPTIMIZED).unwrap();
        assert_eq!(
            report.fusions_by_rule.get("rms_norm+rope"),
            Some(&1),
            "case {case:?}"
        );
        assert_eq!(report.dispatches, 1, "case {case:?}");
        assert_eq!(
            bits(&dev.download(&fused.3).unwrap()),
            want,
            "rule, case {case:?}"
        );
    }
}

/// Against the f64 reference: normalized values are at most about 3.5 times the weight's 1.5 in
/// size; f32 rounding of `inv`, the two products and the rotation stays well within 1e-5
/// absolute plus 1e-5 relative.
#[test]
fn rms_norm_rope_matches_the_f64_reference() {
    let dev = Device::cpu(2).unwrap();
    for (k, case) in cases().iter().enumerate() {
        let inp = inputs(case, 900 + 10 * k as u64);
        let (x, w, pos, q) = upload(&dev, case, &inp);
        run_direct(&dev, |s| {
            s.rms_norm_rope(&x, &w, &pos, &q, EPS, &params(case))
        });
        let what = format!("rms_norm_rope vs f64, case {case:?}");
        assert_close(
            &dev.download(&q).unwrap(),
            &reference(case, &inp),
            1e-5,
            1e-5,
            &what,
        );
    }
}

#[test]
fn rms_norm_rope_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let case = (3, 4, 32, 32, RopeMode::NeoX);
    let (x, w, pos, q) = upload(&dev, &case, &inputs(&case, 7));
    let p = params(&case);
    let ff = dev.upload(&random_f32(16, 1.0, 8), &[16]).unwrap();
    let with_ff = RopeParams {
        freq_factors: Some(&ff),
        ..p
    };
    let w_short = dev.alloc(DType::F32, &[31]).unwrap();
    let x16 = dev.alloc(DType::F16, &[12, 32]).unwrap();
    let q_flat = q.reshape(&[12, 32]).unwrap();
    let expect = |r: crate::Result<crate::graph::Dispatch>, want: &str| match r {
        Err(Error::Shape { op, arg, .. }) | Err(Error::DType { op, arg, .. }) => {
            assert_eq!((op, arg), ("rms_norm_rope", want));
        }
        other => panic!("expected an error on {want}, got {other:?}"),
    };
    use super::rms_norm_rope as op;
    expect(op(&x, &w, &pos, &q, EPS, &with_ff), "freq_factors");
    expect(op(&x, &w_short, &pos, &q, EPS, &p), "weight");
    expect(op(&x16, &w, &pos, &q, EPS, &p), "x");
    expect(op(&q_flat, &w, &pos, &q, EPS, &p), "out");
    expect(op(&x, &w, &x, &q, EPS, &p), "positions");
    expect(op(&x, &w, &pos, &q, f32::NAN, &p), "eps");
    assert!(op(&x, &w, &pos, &q, EPS, &p).is_ok());
}

/// How a negative case differs from the recorded pattern.
#[derive(Debug, Clone, Copy)]
enum Variant {
    /// The rope writes another buffer.
    OutOfPlace,
    /// The rope has frequency factors.
    FreqFactors,
    /// A copy reads the norm's output before the rope.
    ReadBetween,
    /// The norm's rows are half a head.
    HalfHeadNorm,
}

/// Records a variant of the pattern with `plan`; returns (rms_norm+rope fusions, the final q,
/// the copy's snapshot or the out-of-place output).
fn run_variant(dev: &Device, plan: &Plan, v: Variant) -> (usize, Vec<f32>, Vec<f32>) {
    let case = (3, 4, 64, 64, RopeMode::Normal);
    let (rows, heads, head_dim) = (3, 4, 64);
    let (x, w, pos, q) = upload(dev, &case, &inputs(&case, 31));
    let other = dev.alloc(DType::F32, &[rows, heads * head_dim]).unwrap();
    let ff = dev.upload(&random_f32(32, 1.0, 32), &[32]).unwrap();
    let half_w = dev.upload(&random_f32(32, 1.5, 33), &[32]).unwrap();
    let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
    match v {
        Variant::HalfHeadNorm => {
            let x_half = x.reshape(&[rows * heads * 2, head_dim / 2]).unwrap();
            let q_half = q.reshape(&[rows * heads * 2, head_dim / 2]).unwrap();
            s.rms_norm(&x_half, &half_w, &q_half, EPS).unwrap();
        }
        _ => {
            let q_heads = q.reshape(&[rows * heads, head_dim]).unwrap();
            s.rms_norm(&x, &w, &q_heads, EPS).unwrap();
        }
    }
    if let Variant::ReadBetween = v {
        s.copy(&q, &other).unwrap();
    }
    let p = params(&case);
    match v {
        Variant::OutOfPlace => s.rope(&q, &pos, &other, &p).unwrap(),
        Variant::FreqFactors => {
            let p = RopeParams {
                freq_factors: Some(&ff),
                ..p
            };
            s.rope(&q, &pos, &q, &p).unwrap()
        }
        _ => s.rope(&q, &pos, &q, &p).unwrap(),
    }
    let report = s.finish(plan).unwrap();
    let fused = report.fusions_by_rule.get("rms_norm+rope").copied();
    (
        fused.unwrap_or(0),
        dev.download(&q).unwrap(),
        dev.download(&other).unwrap(),
    )
}

#[test]
fn the_rule_declines_what_it_must_not_fuse() {
    let dev = Device::cpu(2).unwrap();
    for v in [
        Variant::OutOfPlace,
        Variant::FreqFactors,
        Variant::ReadBetween,
        Variant::HalfHeadNorm,
    ] {
        let (f0, q0, o0) = run_variant(&dev, &Plan::SEQUENTIAL, v);
        let (f1, q1, o1) = run_variant(&dev, &Plan::OPTIMIZED, v);
        assert_eq!((f0, f1), (0, 0), "{v:?}");
        assert_eq!(bits(&q1), bits(&q0), "{v:?}: q");
        assert_eq!(bits(&o1), bits(&o0), "{v:?}: the other output");
    }
}
