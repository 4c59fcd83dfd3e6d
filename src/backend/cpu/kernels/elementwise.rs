//! CPU kernels of the `elementwise` op family: add, mul, SwiGLU and GeGLU (binary, with a row vector
//! broadcast over rows), and scale, GELU (tanh and erf forms), SiLU and softcap (unary).
//!
//! Values are loaded as f32, computed in f32 and stored in the buffer's dtype.
//!
//! Argument layouts (the ops in `ops::elementwise` build them):
//! - binary `<op>_<t>`: a, b, out, row_len: u32; in place `<op>_<t>_inplace`: a (read-write), b,
//!   row_len. `b` holds as many values as `a`, or `row_len` values broadcast over every row.
//! - unary `<op>_<t>`: x, out[, param: f32]; in place `<op>_<t>_inplace`: x (read-write)[, param].

use half::{bf16, f16};
use rayon::prelude::*;

use super::copy::{Float, FLAT_CHUNK};
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::{Error, Result};
use crate::kernels::elementwise as ew;

/// A binary operation on f32 values.
trait BinaryOp {
    fn apply(a: f32, b: f32) -> f32;
}

/// A unary operation on f32 values, with an optional scalar parameter.
trait UnaryOp {
    /// Whether the kernel takes a scalar f32 parameter after its buffers.
    const HAS_PARAM: bool;
    fn apply(x: f32, param: f32) -> f32;
}

struct Add;
struct Mul;
struct Swiglu;
struct Geglu;
struct Scale;
struct GeluTanh;
struct GeluErf;
struct Silu;
struct Softcap;

impl BinaryOp for Add {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        a + b
    }
}

impl BinaryOp for Mul {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        a * b
    }
}

impl BinaryOp for Swiglu {
    #[inline(always)]
    fn apply(gate: f32, up: f32) -> f32 {
        silu(gate) * up
    }
}

impl BinaryOp for Geglu {
    #[inline(always)]
    fn apply(gate: f32, up: f32) -> f32 {
        GeluTanh::apply(gate, 0.0) * up
    }
}

impl UnaryOp for Scale {
    const HAS_PARAM: bool = true;
    #[inline(always)]
    fn apply(x: f32, s: f32) -> f32 {
        x * s
    }
}

impl UnaryOp for GeluTanh {
    const HAS_PARAM: bool = false;
    #[inline(always)]
    fn apply(x: f32, _: f32) -> f32 {
        gelu_tanh(x)
    }
}

impl UnaryOp for GeluErf {
    const HAS_PARAM: bool = false;
    #[inline(always)]
    fn apply(x: f32, _: f32) -> f32 {
        gelu_erf(x)
    }
}

impl UnaryOp for Silu {
    const HAS_PARAM: bool = false;
    #[inline(always)]
    fn apply(x: f32, _: f32) -> f32 {
        silu(x)
    }
}

impl UnaryOp for Softcap {
    const HAS_PARAM: bool = true;
    #[inline(always)]
    fn apply(x: f32, cap: f32) -> f32 {
        cap * (x / cap).tanh()
    }
}

/// `x * sigmoid(x)`.
#[inline(always)]
pub(super) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU in its tanh form, `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`, in f32 (the
/// fused MLP-input kernel calls this too, so its GeGLU gives the `geglu` kernel's bits).
#[inline(always)]
pub(super) fn gelu_tanh(x: f32) -> f32 {
    // sqrt(2 / pi)
    const K: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (K * (x + 0.044_715 * x * x * x)).tanh())
}

/// `erfc(z)` for `z >= 0`, by the rational approximation of Abramowitz and Stegun (7.1.26),
/// absolute error below 1.5e-7; evaluated in f64 so the approximation is the only error.
#[inline(always)]
fn erfc_nonneg(z: f64) -> f64 {
    const P: f64 = 0.327_591_1;
    const A: [f64; 5] = [
        0.254_829_592,
        -0.284_496_736,
        1.421_413_741,
        -1.453_152_027,
        1.061_405_429,
    ];
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    poly * (-z * z).exp()
}

/// `0.5 * x * (1 + erf(x / sqrt 2))`. For negative `x` it is computed as `0.5 * x * erfc(|x| /
/// sqrt 2)`, which keeps its relative accuracy in the tail where `1 + erf` would cancel.
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    let xd = x as f64;
    let z = xd * std::f64::consts::FRAC_1_SQRT_2;
    let y = if z >= 0.0 {
        0.5 * xd * (2.0 - erfc_nonneg(z))
    } else {
        0.5 * xd * erfc_nonneg(-z)
    };
    y as f32
}

fn kernel_err(args: &KernelArgs<'_>, msg: String) -> Error {
    Error::Kernel {
        kernel: args.kernel().name(),
        msg,
    }
}

/// `o[i] = op(a[i], b[i])`, with `a` the output itself when `a` is `None` (in place).
#[inline(always)]
fn apply_binary<T: Float, O: BinaryOp>(a: Option<&[T]>, b: &[T], o: &mut [T]) {
    match a {
        Some(a) => {
            for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                *o = T::from_f32(O::apply(x.to_f32(), y.to_f32()));
            }
        }
        None => {
            for (o, &y) in o.iter_mut().zip(b) {
                *o = T::from_f32(O::apply(o.to_f32(), y.to_f32()));
            }
        }
    }
}

fn binary<T: Float, O: BinaryOp, const INPLACE: bool>(args: &KernelArgs<'_>) -> Result<()> {
    let (a, b, out, row_len) = if INPLACE {
        (
            None,
            args.input::<T>(1)?,
            args.output::<T>(0)?,
            args.usize(2)?,
        )
    } else {
        (
            Some(args.input::<T>(0)?),
            args.input::<T>(1)?,
            args.output::<T>(2)?,
            args.usize(3)?,
        )
    };
    let n = out.len();
    if a.is_some_and(|a| a.len() != n) {
        return Err(kernel_err(
            args,
            format!("a and out differ in length ({n} values out)"),
        ));
    }
    if b.len() == n {
        out.par_chunks_mut(FLAT_CHUNK)
            .enumerate()
            .for_each(|(c, o)| {
                let range = c * FLAT_CHUNK..c * FLAT_CHUNK + o.len();
                apply_binary::<T, O>(a.map(|a| &a[range.clone()]), &b[range], o);
            });
        Ok(())
    } else if row_len > 0 && b.len() == row_len && n % row_len == 0 {
        let min_rows = (FLAT_CHUNK / row_len).max(1);
        out.par_chunks_mut(row_len)
            .with_min_len(min_rows)
            .enumerate()
            .for_each(|(r, o)| {
                apply_binary::<T, O>(a.map(|a| &a[r * row_len..(r + 1) * row_len]), b, o);
            });
        Ok(())
    } else {
        Err(kernel_err(
            args,
            format!(
                "b has {} values; expected {n} (as a) or one row of row_len = {row_len}",
                b.len()
            ),
        ))
    }
}

fn unary<T: Float, O: UnaryOp, const INPLACE: bool>(args: &KernelArgs<'_>) -> Result<()> {
    let (x, out, param_index) = if INPLACE {
        (None, args.output::<T>(0)?, 1)
    } else {
        (Some(args.input::<T>(0)?), args.output::<T>(1)?, 2)
    };
    let param = if O::HAS_PARAM {
        args.f32(param_index)?
    } else {
        0.0
    };
    if x.is_some_and(|x| x.len() != out.len()) {
        return Err(kernel_err(args, "x and out differ in length".into()));
    }
    out.par_chunks_mut(FLAT_CHUNK)
        .enumerate()
        .for_each(|(c, o)| match x {
            Some(x) => {
                let xs = &x[c * FLAT_CHUNK..c * FLAT_CHUNK + o.len()];
                for (o, &v) in o.iter_mut().zip(xs) {
                    *o = T::from_f32(O::apply(v.to_f32(), param));
                }
            }
            None => {
                for o in o.iter_mut() {
                    *o = T::from_f32(O::apply(o.to_f32(), param));
                }
            }
        });
    Ok(())
}

/// `swiglu_f32_to_f16`: the f32 SwiGLU's values, then each rounded to f16 (gate and up as long as
/// out: the narrowing takes only SwiGLUs without a broadcast row).
fn swiglu_to_f16(args: &KernelArgs<'_>) -> Result<()> {
    let (gate, up) = (args.input::<f32>(0)?, args.input::<f32>(1)?);
    let out = args.output::<f16>(2)?;
    let n = out.len();
    if gate.len() != n || up.len() != n {
        return Err(kernel_err(
            args,
            format!(
                "gate ({}) and up ({}) must hold as many values as out ({n})",
                gate.len(),
                up.len()
            ),
        ));
    }
    out.par_chunks_mut(FLAT_CHUNK)
        .enumerate()
        .for_each(|(c, o)| {
            let at = c * FLAT_CHUNK;
            for (i, o) in o.iter_mut().enumerate() {
                *o = f16::from_f32(Swiglu::apply(gate[at + i], up[at + i]));
            }
        });
    Ok(())
}

/// Registers one op for every float dtype, out of place and in place.
macro_rules! register_float_op {
    ($registry:expr, $out:ident, $inplace:ident, $kernel:ident, $op:ty) => {
        $registry.family(
            &$out,
            [
                $kernel::<f32, $op, false>,
                $kernel::<f16, $op, false>,
                $kernel::<bf16, $op, false>,
            ],
        );
        $registry.family(
            &$inplace,
            [
                $kernel::<f32, $op, true>,
                $kernel::<f16, $op, true>,
                $kernel::<bf16, $op, true>,
            ],
        );
    };
}

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    use ew::*;
    register_float_op!(registry, ADD, ADD_INPLACE, binary, Add);
    register_float_op!(registry, MUL, MUL_INPLACE, binary, Mul);
    register_float_op!(registry, SWIGLU, SWIGLU_INPLACE, binary, Swiglu);
    registry.add(&SWIGLU_TO_F16, swiglu_to_f16);
    register_float_op!(registry, GEGLU, GEGLU_INPLACE, binary, Geglu);
    register_float_op!(registry, SCALE, SCALE_INPLACE, unary, Scale);
    register_float_op!(registry, GELU_TANH, GELU_TANH_INPLACE, unary, GeluTanh);
    register_float_op!(registry, GELU_ERF, GELU_ERF_INPLACE, unary, GeluErf);
    register_float_op!(registry, SILU, SILU_INPLACE, unary, Silu);
    register_float_op!(registry, SOFTCAP, SOFTCAP_INPLACE, unary, Softcap);
}
