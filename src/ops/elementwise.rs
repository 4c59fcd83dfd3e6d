//! The `elementwise` op family: argument checks and dispatch building (the `Session`
//! methods that record it are in `session/ops.rs`).
//!
//! Binary ops (`add`, `mul`, `swiglu`, `geglu`) take `a`, `b` and `out`; for `add` and `mul`, `b` is either
//! the same shape as `a` or one row (`[n]` or `[1, n]`, `n` the last dimension of `a`) broadcast
//! over every row of `a`. Unary ops (`scale`, `gelu_tanh`, `gelu_erf`, `silu`, `softcap`) take `x`
//! and `out`. Every op accepts f32, f16 and bf16 (all its buffers of one dtype) and computes in f32.
//!
//! In place: passing the first input's very view as `out` (same bytes, dtype and shape) emits the
//! kernel's in-place variant, whose first argument is read-write, so a residual add can write into
//! its accumulator. For the commutative `add` and `mul`, `out` may also be `b` when `b` is full.
//! Any other overlap between `out` and an input is an error.

use crate::backend::{Buffer, DType};
use crate::error::Result;
use crate::graph::{Arg, Dispatch, DispatchRef, Grid, KernelId, KernelSig};
use crate::kernels::{self, elementwise as ew};
use crate::ops::Check;

/// The float dtypes the float kernels are built for.
pub(crate) use crate::kernels::FLOATS as FLOAT_DTYPES;

/// Picks the kernel for a float dtype from `[f32, f16, bf16]` names.
pub(crate) fn float_kernel(
    op: &'static str,
    dtype: DType,
    family: &'static [KernelSig; 3],
) -> Result<KernelId> {
    kernels::pick(op, family, &kernels::FLOATS, dtype)
}

/// Whether two buffers are the very same view (bytes, dtype and shape).
pub(crate) fn same_view(a: &Buffer, b: &Buffer) -> bool {
    a.alloc_id() == b.alloc_id()
        && a.byte_range() == b.byte_range()
        && a.dtype() == b.dtype()
        && a.dims() == b.dims()
}

/// `out` must share no byte with any of `inputs`.
pub(crate) fn check_disjoint(
    check: &Check,
    out_name: &'static str,
    out: &Buffer,
    inputs: &[(&'static str, &Buffer)],
) -> Result<()> {
    for (name, input) in inputs {
        check.require(out_name, !out.overlaps(input), || {
            format!(
                "overlaps argument `{name}` ({out:?} and {input:?}); outputs must not alias inputs"
            )
        })?;
    }
    Ok(())
}

/// A size passed to a kernel as a u32 scalar.
pub(crate) fn u32_size(check: &Check, arg: &'static str, value: usize) -> Result<u32> {
    check.require(arg, value <= u32::MAX as usize, || {
        format!("size {value} does not fit in 32 bits")
    })?;
    Ok(value as u32)
}

/// The pieces of an add or mul dispatch: `(a, b, out)`, where `out` is `None` for the in-place
/// form (whose `a` is also its output).
pub(crate) fn binary_operands(d: DispatchRef<'_>) -> Option<(&Buffer, &Buffer, Option<&Buffer>)> {
    let k = d.kernel();
    let in_place = k.is_in(&ew::ADD_INPLACE) || k.is_in(&ew::MUL_INPLACE);
    if !in_place && !k.is_in(&ew::ADD) && !k.is_in(&ew::MUL) {
        return None;
    }
    let (a, b) = (d.buffer("a")?, d.buffer("b")?);
    Some((
        a,
        b,
        if in_place {
            None
        } else {
            Some(d.buffer("out")?)
        },
    ))
}

/// The kernels of one elementwise op: out of place and in place, each `[f32, f16, bf16]`.
struct Kernels {
    out_of_place: &'static [KernelSig; 3],
    in_place: &'static [KernelSig; 3],
}

/// How a binary op treats `b`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BinaryKind {
    /// `b` is full or a broadcast row; `a` and `b` may be swapped.
    Commutative,
    /// `b` has `a`'s shape and the operands keep their order.
    Ordered,
}

/// Everything that tells one binary op from another.
struct BinarySpec {
    op: &'static str,
    kernels: Kernels,
    binary_kind: BinaryKind,
    a_name: &'static str,
    b_name: &'static str,
}

fn binary(spec: &BinarySpec, a: &Buffer, b: &Buffer, out: &Buffer) -> Result<Dispatch> {
    let BinarySpec {
        op,
        ref kernels,
        binary_kind,
        a_name,
        b_name,
    } = *spec;
    let check = Check::op(op);
    check.dtype(a_name, a, &FLOAT_DTYPES)?;
    check.dtype(b_name, b, &[a.dtype()])?;
    check.dtype("out", out, &[a.dtype()])?;
    check.require(a_name, a.elems() > 0, || "is empty".into())?;
    let row_len = a.shape().last();
    let b_full = b.dims() == a.dims();
    let b_row = binary_kind == BinaryKind::Commutative
        && b.elems() == row_len
        && b.shape().last() == row_len
        && b.shape().rank() <= 2;
    check.require(b_name, b_full || b_row, || {
        let row = if binary_kind == BinaryKind::Commutative {
            format!(" or one row [{row_len}]")
        } else {
            String::new()
        };
        format!("has shape {:?}, expected {:?}{row}", b.dims(), a.dims())
    })?;
    check.dims("out", out, a.dims())?;
    let row_len_arg = u32_size(&check, a_name, row_len)?;
    let grid = Grid::cover(a.elems(), 256);
    let commutes = binary_kind == BinaryKind::Commutative && b_full;
    let (first, second) = if !same_view(out, a) && commutes && same_view(out, b) {
        (b, a)
    } else {
        (a, b)
    };
    if same_view(out, first) {
        check.require(b_name, !second.overlaps(out), || {
            "overlaps the output written in place".into()
        })?;
        let kernel = float_kernel(op, a.dtype(), kernels.in_place)?;
        let args = vec![
            Arg::read_write(first),
            Arg::read(second),
            Arg::u32(row_len_arg),
        ];
        return Dispatch::new(kernel, args, grid);
    }
    check_disjoint(&check, "out", out, &[(a_name, a), (b_name, b)])?;
    let kernel = float_kernel(op, a.dtype(), kernels.out_of_place)?;
    let args = vec![
        Arg::read(a),
        Arg::read(b),
        Arg::write(out),
        Arg::u32(row_len_arg),
    ];
    Dispatch::new(kernel, args, grid)
}

fn unary(
    op: &'static str,
    kernels: &Kernels,
    x: &Buffer,
    out: &Buffer,
    param: Option<f32>,
) -> Result<Dispatch> {
    let check = Check::op(op);
    check.dtype("x", x, &FLOAT_DTYPES)?;
    check.dtype("out", out, &[x.dtype()])?;
    check.require("x", x.elems() > 0, || "is empty".into())?;
    check.dims("out", out, x.dims())?;
    let grid = Grid::cover(x.elems(), 256);
    let (kernel, mut args) = if same_view(out, x) {
        (
            float_kernel(op, x.dtype(), kernels.in_place)?,
            vec![Arg::read_write(x)],
        )
    } else {
        check_disjoint(&check, "out", out, &[("x", x)])?;
        (
            float_kernel(op, x.dtype(), kernels.out_of_place)?,
            vec![Arg::read(x), Arg::write(out)],
        )
    };
    if let Some(p) = param {
        args.push(Arg::f32(p));
    }
    Dispatch::new(kernel, args, grid)
}

/// The out-of-place and in-place kernels of one op.
const fn both(out_of_place: &'static [KernelSig; 3], in_place: &'static [KernelSig; 3]) -> Kernels {
    Kernels {
        out_of_place,
        in_place,
    }
}

const ADD: BinarySpec = BinarySpec {
    op: "add",
    kernels: both(&ew::ADD, &ew::ADD_INPLACE),
    binary_kind: BinaryKind::Commutative,
    a_name: "a",
    b_name: "b",
};
const MUL: BinarySpec = BinarySpec {
    op: "mul",
    kernels: both(&ew::MUL, &ew::MUL_INPLACE),
    binary_kind: BinaryKind::Commutative,
    a_name: "a",
    b_name: "b",
};
const SWIGLU: BinarySpec = BinarySpec {
    op: "swiglu",
    kernels: both(&ew::SWIGLU, &ew::SWIGLU_INPLACE),
    binary_kind: BinaryKind::Ordered,
    a_name: "gate",
    b_name: "up",
};
const GEGLU: BinarySpec = BinarySpec {
    op: "geglu",
    kernels: both(&ew::GEGLU, &ew::GEGLU_INPLACE),
    binary_kind: BinaryKind::Ordered,
    a_name: "gate",
    b_name: "up",
};
const SCALE: Kernels = both(&ew::SCALE, &ew::SCALE_INPLACE);
const GELU_TANH: Kernels = both(&ew::GELU_TANH, &ew::GELU_TANH_INPLACE);
const GELU_ERF: Kernels = both(&ew::GELU_ERF, &ew::GELU_ERF_INPLACE);
const SILU: Kernels = both(&ew::SILU, &ew::SILU_INPLACE);
const SOFTCAP: Kernels = both(&ew::SOFTCAP, &ew::SOFTCAP_INPLACE);

/// `out = a + b`; `b` has `a`'s shape or is one row broadcast over the rows of `a`.
/// `out` may be `a` itself (in place).
pub fn add(a: &Buffer, b: &Buffer, out: &Buffer) -> Result<Dispatch> {
    binary(&ADD, a, b, out)
}

/// `out = a * b`; `b` has `a`'s shape or is one row broadcast over the rows of `a`.
/// `out` may be `a` itself (in place).
pub fn mul(a: &Buffer, b: &Buffer, out: &Buffer) -> Result<Dispatch> {
    binary(&MUL, a, b, out)
}

/// `out = silu(gate) * up`, all three of one shape. `out` may be `gate` itself (in place).
pub fn swiglu(gate: &Buffer, up: &Buffer, out: &Buffer) -> Result<Dispatch> {
    binary(&SWIGLU, gate, up, out)
}

/// `out = gelu_tanh(gate) * up` (the gated feed-forward of Gemma), all three of one shape.
/// `out` may be `gate` itself (in place).
pub fn geglu(gate: &Buffer, up: &Buffer, out: &Buffer) -> Result<Dispatch> {
    binary(&GEGLU, gate, up, out)
}

/// `out = x * s`. `out` may be `x` itself (in place).
pub fn scale(x: &Buffer, s: f32, out: &Buffer) -> Result<Dispatch> {
    Check::op("scale").require("s", s.is_finite(), || format!("{s} is not finite"))?;
    unary("scale", &SCALE, x, out, Some(s))
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
/// `out` may be `x` itself (in place).
pub fn gelu_tanh(x: &Buffer, out: &Buffer) -> Result<Dispatch> {
    unary("gelu_tanh", &GELU_TANH, x, out, None)
}

/// GELU, exact form: `0.5 x (1 + erf(x / sqrt 2))` (erf within 1.5e-7 absolute).
/// `out` may be `x` itself (in place).
pub fn gelu_erf(x: &Buffer, out: &Buffer) -> Result<Dispatch> {
    unary("gelu_erf", &GELU_ERF, x, out, None)
}

/// SiLU: `x * sigmoid(x)`. `out` may be `x` itself (in place).
pub fn silu(x: &Buffer, out: &Buffer) -> Result<Dispatch> {
    unary("silu", &SILU, x, out, None)
}

/// Softcap: `cap * tanh(x / cap)`, `cap` finite and positive. `out` may be `x` itself (in place).
pub fn softcap(x: &Buffer, cap: f32, out: &Buffer) -> Result<Dispatch> {
    Check::op("softcap").require("cap", cap.is_finite() && cap > 0.0, || {
        format!("{cap} is not a finite positive number")
    })?;
    unary("softcap", &SOFTCAP, x, out, Some(cap))
}

#[cfg(test)]
mod tests {
    use crate::backend::{Buffer, DType, Device};
    use crate::error::{Error, Result};
    use crate::ops::copy::float_io::*;
    use crate::testutil::{assert_close, random_f32};
    use crate::Session;

    /// `[rows, n]` shapes: a decode row, odd sizes, and one big enough to span parallel chunks.
    const SHAPES: [(usize, usize); 5] = [(1, 576), (3, 577), (17, 64), (1, 1), (5, 9000)];

    fn erf_ref(x: f64) -> f64 {
        if x.abs() < 3.0 {
            // Maclaurin series; at |x| < 3 the terms stay below 1e4, so f64 keeps 12 digits.
            let (x2, mut term, mut sum) = (x * x, x, x);
            for n in 1..200 {
                term *= -x2 / n as f64;
                let t = term / (2 * n + 1) as f64;
                sum += t;
                if t.abs() < 1e-18 {
                    break;
                }
            }
            sum * std::f64::consts::FRAC_2_SQRT_PI
        } else {
            // erfc by its continued fraction, evaluated from the inside out.
            let a = x.abs();
            let mut f = a;
            for k in (1..=80).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            let erfc = (-a * a).exp() / (std::f64::consts::PI.sqrt() * f);
            x.signum() * (1.0 - erfc)
        }
    }

    fn silu_ref(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    fn gelu_tanh_ref(x: f64) -> f64 {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    }

    fn gelu_erf_ref(x: f64) -> f64 {
        0.5 * x * (1.0 + erf_ref(x / std::f64::consts::SQRT_2))
    }

    #[test]
    fn erf_reference_is_accurate() {
        // Published values of erf.
        for (x, want) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.9, 0.999_958_902_121_900_7),
            (3.5, 0.999_999_256_901_627_7),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!(
                (erf_ref(x) - want).abs() < 1e-13,
                "erf({x}) = {}, expected {want}",
                erf_ref(x)
            );
        }
    }

    type UnaryCall = fn(&mut Session, &Buffer, &Buffer) -> Result<()>;

    fn check_unary(name: &str, call: UnaryCall, reference: impl Fn(f64) -> f64, in_place: bool) {
        let dev = Device::cpu(2).unwrap();
        for dt in FLOATS {
            let (atol, rtol) = tolerance(dt);
            for (case, &(rows, n)) in SHAPES.iter().enumerate() {
                let seed = 300 + case as u64;
                let xv = rounded(dt, &random_f32(rows * n, 5.0, seed));
                let x = upload(&dev, dt, &xv, &[rows, n]);
                let out = if in_place {
                    x.clone()
                } else {
                    dev.alloc(dt, &[rows, n]).unwrap()
                };
                run_direct(&dev, |s| call(s, &x, &out));
                let want: Vec<f32> = xv.iter().map(|&v| reference(v as f64) as f32).collect();
                let what = format!("{name} {dt} [{rows}, {n}] in place {in_place} seed {seed}");
                assert_close(&download(&dev, &out), &want, atol, rtol, &what);
            }
        }
    }

    #[test]
    fn unary_ops_match_reference() {
        for in_place in [false, true] {
            check_unary(
                "scale",
                |s, x, o| s.scale(x, -0.37, o),
                |v| v * -0.37f32 as f64,
                in_place,
            );
            check_unary(
                "gelu_tanh",
                |s, x, o| s.gelu_tanh(x, o),
                gelu_tanh_ref,
                in_place,
            );
            check_unary(
                "gelu_erf",
                |s, x, o| s.gelu_erf(x, o),
                gelu_erf_ref,
                in_place,
            );
            check_unary("silu", |s, x, o| s.silu(x, o), silu_ref, in_place);
            let cap = 3.5f64;
            check_unary(
                "softcap",
                |s, x, o| s.softcap(x, 3.5, o),
                move |v| cap * (v / cap).tanh(),
                in_place,
            );
        }
    }

    /// How a binary test passes its output.
    #[derive(Clone, Copy, Debug)]
    enum OutAt {
        Fresh,
        A,
        B,
    }

    type BinaryCall = fn(&mut Session, &Buffer, &Buffer, &Buffer) -> Result<()>;

    fn check_binary(
        name: &str,
        call: BinaryCall,
        reference: fn(f64, f64) -> f64,
        broadcast: bool,
        out_at: OutAt,
    ) {
        let dev = Device::cpu(2).unwrap();
        for dt in FLOATS {
            let (atol, rtol) = tolerance(dt);
            for (case, &(rows, n)) in SHAPES.iter().enumerate() {
                let seed = 500 + 7 * case as u64;
                let b_dims = if broadcast { vec![n] } else { vec![rows, n] };
                let av = rounded(dt, &random_f32(rows * n, 4.0, seed));
                let bv = rounded(dt, &random_f32(b_dims.iter().product(), 4.0, seed + 1));
                let a = upload(&dev, dt, &av, &[rows, n]);
                let b = upload(&dev, dt, &bv, &b_dims);
                let out = match out_at {
                    OutAt::Fresh => dev.alloc(dt, &[rows, n]).unwrap(),
                    OutAt::A => a.clone(),
                    OutAt::B => b.clone(),
                };
                run_direct(&dev, |s| call(s, &a, &b, &out));
                let want: Vec<f32> = (0..rows * n)
                    .map(|i| {
                        let bi = if broadcast { i % n } else { i };
                        reference(av[i] as f64, bv[bi] as f64) as f32
                    })
                    .collect();
                let what = format!(
                    "{name} {dt} [{rows}, {n}] broadcast {broadcast} out {out_at:?} seed {seed}"
                );
                assert_close(&download(&dev, &out), &want, atol, rtol, &what);
            }
        }
    }

    #[test]
    fn add_and_mul_match_reference_full_and_broadcast() {
        for broadcast in [false, true] {
            for out_at in [OutAt::Fresh, OutAt::A] {
                check_binary(
                    "add",
                    |s, a, b, o| s.add(a, b, o),
                    |x, y| x + y,
                    broadcast,
                    out_at,
                );
                check_binary(
                    "mul",
                    |s, a, b, o| s.mul(a, b, o),
                    |x, y| x * y,
                    broadcast,
                    out_at,
                );
            }
        }
        // Full-shape `b` as the output: the operands are swapped into the in-place kernel.
        check_binary(
            "add",
            |s, a, b, o| s.add(a, b, o),
            |x, y| x + y,
            false,
            OutAt::B,
        );
        check_binary(
            "mul",
            |s, a, b, o| s.mul(a, b, o),
            |x, y| x * y,
            false,
            OutAt::B,
        );
    }

    #[test]
    fn inplace_session_methods_match_reference() {
        check_binary(
            "add_inplace",
            |s, a, b, _| s.add_inplace(a, b),
            |x, y| x + y,
            true,
            OutAt::A,
        );
        check_binary(
            "mul_inplace",
            |s, a, b, _| s.mul_inplace(a, b),
            |x, y| x * y,
            false,
            OutAt::A,
        );
    }

    #[test]
    fn swiglu_matches_reference() {
        for out_at in [OutAt::Fresh, OutAt::A] {
            check_binary(
                "swiglu",
                |s, g, u, o| s.swiglu(g, u, o),
                |g, u| silu_ref(g) * u,
                false,
                out_at,
            );
        }
    }

    #[test]
    fn geglu_matches_reference() {
        for out_at in [OutAt::Fresh, OutAt::A] {
            check_binary(
                "geglu",
                |s, g, u, o| s.geglu(g, u, o),
                |g, u| gelu_tanh_ref(g) * u,
                false,
                out_at,
            );
        }
    }

    #[test]
    fn elementwise_ops_reject_bad_arguments() {
        let dev = Device::cpu(2).unwrap();
        let a = dev.alloc(DType::F32, &[3, 8]).unwrap();
        let out = dev.alloc(DType::F32, &[3, 8]).unwrap();
        let b16 = dev.alloc(DType::F16, &[3, 8]).unwrap();
        let b_bad = dev.alloc(DType::F32, &[2, 8]).unwrap();
        let row = dev.alloc(DType::F32, &[8]).unwrap();
        let ints = dev.alloc(DType::I32, &[3, 8]).unwrap();
        let expect = |r: Result<crate::graph::Dispatch>, op: &str, arg: &str| match r {
            Err(Error::DType { op: o, arg: a, .. }) | Err(Error::Shape { op: o, arg: a, .. })
                if o == op && a == arg => {}
            other => panic!("expected an error naming {op} and `{arg}`, got {other:?}"),
        };
        expect(super::add(&a, &b16, &out), "add", "b");
        expect(super::add(&a, &b_bad, &out), "add", "b");
        expect(super::mul(&ints, &ints, &out), "mul", "a");
        expect(super::mul(&a, &row, &b_bad), "mul", "out");
        // A row `b` cannot be the output, and `swiglu` does not broadcast.
        expect(super::add(&a, &row, &row), "add", "out");
        expect(super::swiglu(&a, &row, &out), "swiglu", "up");
        // Partial overlap of the output with an input.
        let both = dev.alloc(DType::F32, &[4, 8]).unwrap();
        expect(
            super::silu(&both.rows(0, 3).unwrap(), &both.rows(1, 3).unwrap()),
            "silu",
            "out",
        );
        expect(super::gelu_erf(&a, &b16), "gelu_erf", "out");
        expect(super::softcap(&a, 0.0, &out), "softcap", "cap");
        expect(super::scale(&a, f32::INFINITY, &out), "scale", "s");
    }
}
