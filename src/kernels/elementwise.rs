//! The `elementwise` family's kernels, one per float dtype (f32, f16, bf16) in that order, each
//! out of place (`out` written) or in place (the first operand read and written).
//!
//! Binary kernels take `a`, `b` (one row broadcast over `a`'s rows, or `a`'s shape) and the row
//! length of `b`; unary kernels take `x` and, for `scale` and `softcap`, one float.

use super::OpKind;
use super::{one, per_float, KernelSig, Param};
use crate::dtype::DType;

macro_rules! binary {
    ($doc:literal, $out:ident, $inplace:ident, $op:expr, $a:literal, $b:literal,
     $f32:literal, $f16:literal, $bf16:literal, $f32i:literal, $f16i:literal, $bf16i:literal) => {
        #[doc = concat!("`out = ", $doc, "`: ", $a, ", ", $b, ", out, row_len.")]
        pub static $out: [KernelSig; 3] = per_float!($op; $f32, $f16, $bf16; |T| [
            Param::read($a, T),
            Param::read($b, T),
            Param::write("out", T),
            Param::u32("row_len"),
        ]);
        #[doc = concat!("`", $a, " = ", $doc, "` in place: ", $a, ", ", $b, ", row_len.")]
        pub static $inplace: [KernelSig; 3] = per_float!($op; $f32i, $f16i, $bf16i; |T| [
            Param::read_write($a, T),
            Param::read($b, T),
            Param::u32("row_len"),
        ]);
    };
}

binary!(
    "a + b",
    ADD,
    ADD_INPLACE,
    OpKind::Add,
    "a",
    "b",
    "add_f32",
    "add_f16",
    "add_bf16",
    "add_f32_inplace",
    "add_f16_inplace",
    "add_bf16_inplace"
);
binary!(
    "a * b",
    MUL,
    MUL_INPLACE,
    OpKind::Mul,
    "a",
    "b",
    "mul_f32",
    "mul_f16",
    "mul_bf16",
    "mul_f32_inplace",
    "mul_f16_inplace",
    "mul_bf16_inplace"
);
binary!(
    "silu(gate) * up",
    SWIGLU,
    SWIGLU_INPLACE,
    OpKind::Elementwise,
    "gate",
    "up",
    "swiglu_f32",
    "swiglu_f16",
    "swiglu_bf16",
    "swiglu_f32_inplace",
    "swiglu_f16_inplace",
    "swiglu_bf16_inplace"
);
/// [`SWIGLU`]'s f32 values rounded to f16 (round to nearest even): gate, up (f32, as many values
/// as gate), out (f16). What the optimizer's narrowing (`graph::passes::narrow`) makes of an f32
/// SwiGLU whose every reader is a tensor-core product, which rounds its activations to f16 anyway.
pub static SWIGLU_TO_F16: KernelSig = KernelSig::new(
    "swiglu_f32_to_f16",
    OpKind::Elementwise,
    &[
        Param::read("gate", one(DType::F32)),
        Param::read("up", one(DType::F32)),
        Param::write("out", one(DType::F16)),
    ],
);

binary!(
    "gelu_tanh(gate) * up",
    GEGLU,
    GEGLU_INPLACE,
    OpKind::Elementwise,
    "gate",
    "up",
    "geglu_f32",
    "geglu_f16",
    "geglu_bf16",
    "geglu_f32_inplace",
    "geglu_f16_inplace",
    "geglu_bf16_inplace"
);

macro_rules! unary {
    ($doc:literal, $out:ident, $inplace:ident,
     $f32:literal, $f16:literal, $bf16:literal, $f32i:literal, $f16i:literal, $bf16i:literal) => {
        #[doc = concat!("`out = ", $doc, "`: x, out.")]
pub static $out: [KernelSig; 3] = per_float!(OpKind::Elementwise; $f32, $f16, $bf16;
            |T| [Param::read("x", T), Param::write("out", T)]);
        #[doc = concat!("`x = ", $doc, "` in place: x.")]
pub static $inplace: [KernelSig; 3] = per_float!(OpKind::Elementwise;
            $f32i, $f16i, $bf16i; |T| [Param::read_write("x", T)]);
    };
    ($doc:literal, $out:ident, $inplace:ident, $param:literal,
     $f32:literal, $f16:literal, $bf16:literal, $f32i:literal, $f16i:literal, $bf16i:literal) => {
        #[doc = concat!("`out = ", $doc, "`: x, out, ", $param, ".")]
pub static $out: [KernelSig; 3] = per_float!(OpKind::Elementwise; $f32, $f16, $bf16;
            |T| [Param::read("x", T), Param::write("out", T), Param::f32($param)]);
        #[doc = concat!("`x = ", $doc, "` in place: x, ", $param, ".")]
pub static $inplace: [KernelSig; 3] = per_float!(OpKind::Elementwise;
            $f32i, $f16i, $bf16i; |T| [Param::read_write("x", T), Param::f32($param)]);
    };
}

unary!(
    "s * x",
    SCALE,
    SCALE_INPLACE,
    "s",
    "scale_f32",
    "scale_f16",
    "scale_bf16",
    "scale_f32_inplace",
    "scale_f16_inplace",
    "scale_bf16_inplace"
);
unary!(
    "cap * tanh(x / cap)",
    SOFTCAP,
    SOFTCAP_INPLACE,
    "cap",
    "softcap_f32",
    "softcap_f16",
    "softcap_bf16",
    "softcap_f32_inplace",
    "softcap_f16_inplace",
    "softcap_bf16_inplace"
);
unary!(
    "gelu(x), tanh form",
    GELU_TANH,
    GELU_TANH_INPLACE,
    "gelu_tanh_f32",
    "gelu_tanh_f16",
    "gelu_tanh_bf16",
    "gelu_tanh_f32_inplace",
    "gelu_tanh_f16_inplace",
    "gelu_tanh_bf16_inplace"
);
unary!(
    "gelu(x), erf form",
    GELU_ERF,
    GELU_ERF_INPLACE,
    "gelu_erf_f32",
    "gelu_erf_f16",
    "gelu_erf_bf16",
    "gelu_erf_f32_inplace",
    "gelu_erf_f16_inplace",
    "gelu_erf_bf16_inplace"
);
unary!(
    "x * sigmoid(x)",
    SILU,
    SILU_INPLACE,
    "silu_f32",
    "silu_f16",
    "silu_bf16",
    "silu_f32_inplace",
    "silu_f16_inplace",
    "silu_bf16_inplace"
);
