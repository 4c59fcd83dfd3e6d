//! `rms_norm_add` and the `rms_norm+add` fusion rule on the CPU: the op against a float64
//! reference, the fused kernel against the pair it replaces (bitwise, every float dtype), its
//! argument checks, and where the rule fires and where it must not. Seeded random inputs, never
//! zeros.

use crate::backend::{Buffer, DType, Device};
use crate::error::Error;
use crate::ops::copy::float_io::*;
use crate::testutil::random_f32;
use crate::{Executor, Mode, Plan, Session};

/// Odd shapes `[rows, dim]`: a Gemma-3-like row, a dim that is no multiple of 4 (the sum of
/// squares' lanes), many short rows, a row shorter than one lane group.
const SHAPES: [(usize, usize); 4] = [(1, 640), (3, 577), (17, 64), (2, 5)];
const EPS: f32 = 1e-6;

/// `values` (rounded to `dt`) uploaded as `[rows, dim]`, with the rounded values.
fn inputs(dev: &Device, dt: DType, dims: &[usize], scale: f32, seed: u64) -> (Buffer, Vec<f32>) {
    let n = dims.iter().product();
    let values = rounded(dt, &random_f32(n, scale, seed));
    (upload(dev, dt, &values, dims), values)
}

/// f64 reference of one element: `(acc + x / sqrt(mean(x^2) + eps) * w, |acc| + |norm value|)`.
fn reference(x: &[f32], w: &[f32], acc: &[f32], dim: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(x.len());
    for (r, row) in x.chunks(dim).enumerate() {
        let mean = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (mean + EPS as f64).sqrt();
        for (i, &v) in row.iter().enumerate() {
            let y = v as f64 * inv * w[i] as f64;
            let a = acc[r * dim + i] as f64;
            out.push((a + y, a.abs() + y.abs()));
        }
    }
    out
}

/// The result is rounded to the dtype twice (the norm value, then the sum), so the error is
/// bounded relative to `|acc| + |norm value|`, not to the sum (which may cancel): per dtype
/// `(atol, rtol)` from [`tolerance`] (rtol: f32 1e-5; f16 1e-3 >= two half-ulps 9.8e-4; bf16
/// 8e-3 >= 7.8e-3).
#[test]
fn rms_norm_add_matches_the_f64_reference() {
    let dev = Device::cpu(2).unwrap();
    for dt in FLOATS {
        let (atol, rtol) = tolerance(dt);
        for (case, &(rows, dim)) in SHAPES.iter().enumerate() {
            let seed = 500 + 10 * case as u64;
            let (x, xv) = inputs(&dev, dt, &[rows, dim], 2.0, seed);
            let (w, wv) = inputs(&dev, dt, &[dim], 1.5, seed + 1);
            let (acc, accv) = inputs(&dev, dt, &[rows, dim], 1.0, seed + 2);
            run_direct(&dev, |s| s.rms_norm_add(&x, &w, &acc, EPS));
            let got = download(&dev, &acc);
            for (i, (&g, &(want, size))) in
                got.iter().zip(&reference(&xv, &wv, &accv, dim)).enumerate()
            {
                let tol = atol as f64 + rtol as f64 * size;
                assert!(
                    (g as f64 - want).abs() <= tol,
                    "rms_norm_add {dt} [{rows}, {dim}] seed {seed}: element {i}: got {g}, \
                     expected {want} (tolerance {tol})"
                );
            }
            assert_eq!(download(&dev, &x), xv, "x changed ({dt} [{rows}, {dim}])");
        }
    }
}

/// The fused kernel gives bitwise what `rms_norm` into a temporary and the in-place `add` of the
/// temporary give, for every float dtype (in f16 and bf16 only when the norm value is rounded to
/// the dtype before the add, as the pair stores it).
#[test]
fn rms_norm_add_gives_the_bits_of_the_pair() {
    let dev = Device::cpu(2).unwrap();
    for dt in FLOATS {
        for (case, &(rows, dim)) in SHAPES.iter().enumerate() {
            let seed = 700 + 10 * case as u64;
            let (x, _) = inputs(&dev, dt, &[rows, dim], 2.0, seed);
            let (w, _) = inputs(&dev, dt, &[dim], 1.5, seed + 1);
            let (pair_acc, accv) = inputs(&dev, dt, &[rows, dim], 1.0, seed + 2);
            let fused_acc = upload(&dev, dt, &accv, &[rows, dim]);
            let tmp = dev.alloc(dt, &[rows, dim]).unwrap();
            run_direct(&dev, |s| {
                s.rms_norm(&x, &w, &tmp, EPS)?;
                s.add_inplace(&pair_acc, &tmp)?;
                s.rms_norm_add(&x, &w, &fused_acc, EPS)
            });
            assert_eq!(
                dev.download_bytes(&fused_acc).unwrap(),
                dev.download_bytes(&pair_acc).unwrap(),
                "{dt} [{rows}, {dim}] seed {seed}: fused and pair differ"
            );
        }
    }
}

#[test]
fn rms_norm_add_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let f32s = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    let (x, w, acc) = (f32s(&[3, 64]), f32s(&[64]), f32s(&[3, 64]));
    let big = f32s(&[4, 64]);
    let (lo, hi) = (big.rows(0, 3).unwrap(), big.rows(1, 3).unwrap());
    let wx = big.view(0, DType::F32, &[64]).unwrap();
    type Call<'a> = Box<dyn Fn() -> crate::Result<crate::graph::Dispatch> + 'a>;
    let i32x = dev.alloc(DType::I32, &[3, 64]).unwrap();
    let w16 = dev.alloc(DType::F16, &[64]).unwrap();
    let acc16 = dev.alloc(DType::BF16, &[3, 64]).unwrap();
    let (w63, acc_row) = (f32s(&[63]), f32s(&[64]));
    let cases: [(&str, &str, Call<'_>); 9] = [
        (
            "x",
            "dtype",
            Box::new(|| super::rms_norm_add(&i32x, &w, &acc, EPS)),
        ),
        (
            "weight",
            "dtype",
            Box::new(|| super::rms_norm_add(&x, &w16, &acc, EPS)),
        ),
        (
            "weight",
            "shape",
            Box::new(|| super::rms_norm_add(&x, &w63, &acc, EPS)),
        ),
        (
            "acc",
            "dtype",
            Box::new(|| super::rms_norm_add(&x, &w, &acc16, EPS)),
        ),
        (
            "acc",
            "shape",
            Box::new(|| super::rms_norm_add(&x, &w, &acc_row, EPS)),
        ),
        // `acc` overlapping `x`, then `weight`.
        (
            "acc",
            "shape",
            Box::new(|| super::rms_norm_add(&lo, &w, &hi, EPS)),
        ),
        (
            "acc",
            "shape",
            Box::new(|| super::rms_norm_add(&x, &wx, &lo, EPS)),
        ),
        (
            "eps",
            "shape",
            Box::new(|| super::rms_norm_add(&x, &w, &acc, f32::NAN)),
        ),
        (
            "eps",
            "shape",
            Box::new(|| super::rms_norm_add(&x, &w, &acc, -1.0)),
        ),
    ];
    for (i, (arg, kind, call)) in cases.iter().enumerate() {
        match (call(), *kind) {
            (
                Err(Error::DType {
                    op: "rms_norm_add",
                    arg: a,
                    ..
                }),
                "dtype",
            ) if a == *arg => {}
            (
                Err(Error::Shape {
                    op: "rms_norm_add",
                    arg: a,
                    ..
                }),
                "shape",
            ) if a == *arg => {}
            (other, _) => panic!("case {i}: expected a {kind} error on {arg}, got {other:?}"),
        }
    }
    // The valid baseline builds, so each error above comes from its one bad argument.
    super::rms_norm_add(&x, &w, &acc, EPS).unwrap();
}

/// What a recorded program does after the norm and before or after the add.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Around {
    /// Nothing: the intermediate is overwritten after the add (dead), so the pair fuses.
    Plain,
    /// The accumulator gets another add between the norm and the add (sound: still fuses).
    AccWrittenBetween,
    /// The norm's input is overwritten between the norm and the add: must not fuse.
    InputWrittenBetween,
    /// The intermediate is read again after the add (live): must not fuse.
    ReadLater,
}

/// Records `rms_norm(x, w) -> tmp; acc += tmp` (with `around`) and runs it with `plan` (direct for
/// [`Plan::SEQUENTIAL`], recorded otherwise); returns the fusions by `rms_norm+add` and the bytes
/// of `acc` and `probe`.
fn run_pair(dt: DType, around: Around, plan: &Plan) -> (usize, Vec<u8>, Vec<u8>) {
    let dev = Device::cpu(2).unwrap();
    let (rows, dim) = (3, 577);
    let (x, _) = inputs(&dev, dt, &[rows, dim], 2.0, 31);
    let (w, _) = inputs(&dev, dt, &[dim], 1.5, 32);
    let (acc, _) = inputs(&dev, dt, &[rows, dim], 1.0, 33);
    let (bias, _) = inputs(&dev, dt, &[rows, dim], 1.0, 34);
    let tmp = dev.alloc(dt, &[rows, dim]).unwrap();
    let probe = upload(&dev, dt, &vec![0.5; rows * dim], &[rows, dim]);
    let mode = if *plan == Plan::SEQUENTIAL {
        Mode::Direct
    } else {
        Mode::Recorded
    };
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.rms_norm(&x, &w, &tmp, EPS).unwrap();
    match around {
        Around::AccWrittenBetween => s.add_inplace(&acc, &bias).unwrap(),
        Around::InputWrittenBetween => s.copy(&bias, &x).unwrap(),
        Around::Plain | Around::ReadLater => {}
    }
    s.add_inplace(&acc, &tmp).unwrap();
    if around == Around::ReadLater {
        s.add(&tmp, &bias, &probe).unwrap();
    }
    // Overwrites the whole intermediate: dead after the add unless read in between.
    s.copy(&bias, &tmp).unwrap();
    let report = s.finish(plan).unwrap();
    let fused = report
        .fusions_by_rule
        .get("rms_norm+add")
        .copied()
        .unwrap_or(0);
    assert_eq!(report.fusions, fused, "{report:?}");
    let bytes = |b: &Buffer| dev.download_bytes(b).unwrap();
    (fused, bytes(&acc), bytes(&probe))
}

/// A recorded `rms_norm; add_inplace` fuses where the intermediate is dead and nothing between
/// conflicts, and the optimized run gives the bits of the op-by-op run in every case.
#[test]
fn norm_then_add_fuses_only_where_sound_with_the_unfused_bits() {
    for dt in FLOATS {
        for (around, fuses) in [
            (Around::Plain, true),
            (Around::AccWrittenBetween, true),
            (Around::InputWrittenBetween, false),
            (Around::ReadLater, false),
        ] {
            let (f0, acc0, probe0) = run_pair(dt, around, &Plan::SEQUENTIAL);
            let (f1, acc1, probe1) = run_pair(dt, around, &Plan::OPTIMIZED);
            assert_eq!((f0, f1), (0, fuses as usize), "{dt} {around:?}");
            assert!(acc0 == acc1, "{dt} {around:?}: accumulator differs");
            assert!(probe0 == probe1, "{dt} {around:?}: probe differs");
        }
    }
}

/// Records `rms_norm(x, w) -> tmp` (without a weight unless `weighted`), then `add` over
/// `[tmp, acc, out, first row of tmp]`, then overwrites `tmp` (so it is dead), and runs it with
/// `plan`. Returns the fusions and the bytes of `acc` and `out`.
fn run_add_form(
    plan: &Plan,
    weighted: bool,
    add: impl Fn(&mut Session, &[Buffer; 4]) -> crate::Result<()>,
) -> (usize, Vec<Vec<u8>>) {
    let dev = Device::cpu(2).unwrap();
    let (rows, dim) = (3, 64);
    let up = |dims: &[usize], seed| inputs(&dev, DType::F32, dims, 1.0, seed).0;
    let (x, w) = (up(&[rows, dim], 41), up(&[dim], 42));
    let (acc, out, fill) = (
        up(&[rows, dim], 43),
        up(&[rows, dim], 44),
        up(&[rows, dim], 45),
    );
    let tmp = dev.alloc(DType::F32, &[rows, dim]).unwrap();
    let row_tmp = tmp.rows(0, 1).unwrap();
    let mode = if *plan == Plan::SEQUENTIAL {
        Mode::Direct
    } else {
        Mode::Recorded
    };
    let mut s = Executor::new(dev.clone()).begin(mode);
    if weighted {
        s.rms_norm(&x, &w, &tmp, EPS).unwrap();
    } else {
        s.rms_norm_no_scale(&x, &tmp, EPS).unwrap();
    }
    add(&mut s, &[tmp.clone(), acc.clone(), out.clone(), row_tmp]).unwrap();
    s.copy(&fill, &tmp).unwrap();
    let report = s.finish(plan).unwrap();
    let bytes = [&acc, &out].map(|b| dev.download_bytes(b).unwrap());
    (report.fusions, bytes.to_vec())
}

/// The forms of the add. `add(acc, tmp, acc)` and `add(tmp, acc, acc)` are recorded as the
/// in-place add into `acc`, so they fuse. Where the add's result does not land in an accumulator
/// of the norm's shape (out of place, in place over the norm's output), the add reads only part of
/// the norm's output (one row, broadcast), or the norm has no weight, nothing fuses. Either way
/// the results are the op-by-op ones.
#[test]
fn only_adds_that_accumulate_the_whole_norm_fuse() {
    type Add = fn(&mut Session, &[Buffer; 4]) -> crate::Result<()>;
    // b: [tmp, acc, out, first row of tmp]
    let cases: [(&str, bool, Add, usize); 6] = [
        ("out is a", true, |s, b| s.add(&b[1], &b[0], &b[1]), 1),
        (
            "norm output as a, out is b",
            true,
            |s, b| s.add(&b[0], &b[1], &b[1]),
            1,
        ),
        ("out of place", true, |s, b| s.add(&b[1], &b[0], &b[2]), 0),
        (
            "in place over the norm output",
            true,
            |s, b| s.add_inplace(&b[0], &b[1]),
            0,
        ),
        ("no weight", false, |s, b| s.add_inplace(&b[1], &b[0]), 0),
        (
            "one row of the norm output",
            true,
            |s, b| s.add_inplace(&b[1], &b[3]),
            0,
        ),
    ];
    for (what, weighted, add, fuses) in cases {
        let (f0, plain) = run_add_form(&Plan::SEQUENTIAL, weighted, add);
        let (f1, optimized) = run_add_form(&Plan::OPTIMIZED, weighted, add);
        assert_eq!((f0, f1), (0, fuses), "{what}");
        assert!(plain == optimized, "{what}: results differ");
    }
}

/// `rms_norm+mul` and `rms_norm+add` share their anchor kind: in one program each fires on its
/// own pattern, and the result is the op-by-op one.
#[test]
fn norm_mul_and_norm_add_both_fire_in_one_program() {
    let dev = Device::cpu(2).unwrap();
    let (rows, dim) = (2, 96);
    let up = |dims: &[usize], seed| inputs(&dev, DType::F32, dims, 1.0, seed).0;
    let (x, proj, w1, w2, m) = (
        up(&[rows, dim], 51),
        up(&[rows, dim], 52),
        up(&[dim], 53),
        up(&[dim], 54),
        up(&[dim], 55),
    );
    let mut results = Vec::new();
    for plan in [Plan::SEQUENTIAL, Plan::OPTIMIZED] {
        let acc = up(&[rows, dim], 56);
        let (t1, t2) = (up(&[rows, dim], 57), up(&[rows, dim], 58));
        let mode = if plan == Plan::SEQUENTIAL {
            Mode::Direct
        } else {
            Mode::Recorded
        };
        let mut s = Executor::new(dev.clone()).begin(mode);
        s.rms_norm(&proj, &w2, &t2, EPS).unwrap();
        s.add_inplace(&acc, &t2).unwrap();
        s.rms_norm(&x, &w1, &t1, EPS).unwrap();
        s.mul_inplace(&t1, &m).unwrap();
        s.add_inplace(&acc, &t1).unwrap();
        s.mark_scratch(&t1);
        s.mark_scratch(&t2);
        let report = s.finish(&plan).unwrap();
        let rule = |r: &str| report.fusions_by_rule.get(r).copied().unwrap_or(0);
        results.push((
            (rule("rms_norm+add"), rule("rms_norm+mul"), report.fusions),
            dev.download_bytes(&acc).unwrap(),
        ));
    }
    assert_eq!(results[0].0, (0, 0, 0));
    assert_eq!(results[1].0, (1, 1, 2));
    assert!(results[0].1 == results[1].1, "fused and unfused differ");
}
