//! The `norm` family's kernels: RMS normalization with or without a weight, alone, times a
//! second operand `m`, or added into an accumulator. One kernel per float dtype (f32, f16, bf16),
//! in that order. Also the per-head norm fused with the RoPE after it (f32 only).

use super::OpKind;
use super::{one, per_float, DTypes, KernelSig, Param};
use crate::dtype::DType;

const F32: DTypes = one(DType::F32);
const I32: DTypes = one(DType::I32);

/// `out = x / rms(x) * weight`: x, weight, out, eps, dim.
pub static RMS_NORM: [KernelSig; 3] = per_float!(OpKind::RmsNorm;
"rms_norm_f32", "rms_norm_f16", "rms_norm_bf16";
|T| [
    Param::read("x", T),
    Param::read("weight", T),
    Param::write("out", T),
    Param::f32("eps"),
    Param::u32("dim"),
]);

/// [`RMS_NORM`]'s f32 values rounded to f16 (round to nearest even): x, weight (f32), out (f16),
/// eps, dim. What the optimizer's narrowing (`graph::passes::narrow`) makes of an f32 norm whose
/// every reader is a tensor-core product, which rounds its activations to f16 anyway.
pub static RMS_NORM_TO_F16: KernelSig = KernelSig::new(
    "rms_norm_f32_to_f16",
    OpKind::RmsNorm,
    &[
        Param::read("x", F32),
        Param::read("weight", F32),
        Param::write("out", one(DType::F16)),
        Param::f32("eps"),
        Param::u32("dim"),
    ],
);

/// `out = x / rms(x)`: x, out, eps, dim.
pub static RMS_NORM_NO_SCALE: [KernelSig; 3] = per_float!(OpKind::RmsNorm;
"rms_norm_no_scale_f32", "rms_norm_no_scale_f16", "rms_norm_no_scale_bf16";
|T| [
    Param::read("x", T),
    Param::write("out", T),
    Param::f32("eps"),
    Param::u32("dim"),
]);

/// `out = x / rms(x) * weight * m`: x, weight, m, out, eps, dim.
pub static RMS_NORM_MUL: [KernelSig; 3] = per_float!(OpKind::RmsNormMul;
"rms_norm_mul_f32", "rms_norm_mul_f16", "rms_norm_mul_bf16";
|T| [
    Param::read("x", T),
    Param::read("weight", T),
    Param::read("m", T),
    Param::write("out", T),
    Param::f32("eps"),
    Param::u32("dim"),
]);

/// `out = x / rms(x) * m`: x, m, out, eps, dim.
pub static RMS_NORM_NO_SCALE_MUL: [KernelSig; 3] = per_float!(OpKind::RmsNormMul;
"rms_norm_no_scale_mul_f32", "rms_norm_no_scale_mul_f16", "rms_norm_no_scale_mul_bf16";
|T| [
    Param::read("x", T),
    Param::read("m", T),
    Param::write("out", T),
    Param::f32("eps"),
    Param::u32("dim"),
]);

/// `acc += x / rms(x) * weight` (the normalized value rounded to the dtype first, as the pair
/// `rms_norm`, in-place `add` stores it): x, weight, acc (read-write), eps, dim.
pub static RMS_NORM_ADD: [KernelSig; 3] = per_float!(OpKind::RmsNormAdd;
"rms_norm_add_f32", "rms_norm_add_f16", "rms_norm_add_bf16";
|T| [
    Param::read("x", T),
    Param::read("weight", T),
    Param::read_write("acc", T),
    Param::f32("eps"),
    Param::u32("dim"),
]);

/// `out = rope(x / rms(x) * weight)` per head of `head_dim` values (the norm's rows are the
/// heads), then rotated by the row's position as [`ROPE`](super::misc::ROPE) does: x, weight
/// (`[head_dim]`), positions (i32, one per row), out (not aliasing x), eps, head_dim, rotary_dim,
/// base, mode (0 normal, 1 NeoX). f32 only; no frequency factors.
pub static RMS_NORM_ROPE: [KernelSig; 1] = [KernelSig::new(
    "rms_norm_rope_f32",
    OpKind::RmsNormRope,
    &[
        Param::read("x", F32),
        Param::read("weight", F32),
        Param::read("positions", I32),
        Param::write("out", F32),
        Param::f32("eps"),
        Param::u32("head_dim"),
        Param::u32("rotary_dim"),
        Param::f32("base"),
        Param::u32("mode"),
    ],
)];

/// The query and key norms of a decode step with their RoPE and the cache writes after them, in
/// one kernel (the fusion of two [`RMS_NORM_ROPE`] and two `kv_write`s): every head of `q_in` is
/// normalized with `q_weight` and rotated into `q`, every head of `k_in` normalized with
/// `k_weight`, rotated and written into `k_cache`, and `v` copied into `v_cache`, the caches
/// `[n_kv_head, max_ctx, head_dim]` at rows `step[0] + r` (f32, or f16 where `cache_f16` is 1,
/// each value rounded to nearest once): q_in, q_weight, k_in, k_weight, v, positions, step, q,
/// k_cache, v_cache, eps, head_dim, base, mode, n_kv_head, cache_f16. The whole head rotates; no
/// frequency factors.
pub static RMS_NORM_ROPE_KV: [KernelSig; 1] = [KernelSig::new(
    "rms_norm_rope_kv_f32",
    OpKind::RmsNormRope,
    &[
        Param::read("q_in", F32),
        Param::read("q_weight", F32),
        Param::read("k_in", F32),
        Param::read("k_weight", F32),
        Param::read("v", F32),
        Param::read("positions", I32),
        Param::read("step", I32),
        Param::write("q", F32),
        Param::read_write("k_cache", super::matmul::CACHE),
        Param::read_write("v_cache", super::matmul::CACHE),
        Param::f32("eps"),
        Param::u32("head_dim"),
        Param::f32("base"),
        Param::u32("mode"),
        Param::u32("n_kv_head"),
        Param::u32("cache_f16"),
    ],
)];
