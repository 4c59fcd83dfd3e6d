//! The small families' kernels: argmax, copy, embedding, KV-cache writes, RoPE, softmax, and
//! the CUDA backend's self-test kernels.

use super::OpKind;
use super::{one, per_float, per_format, DTypes, KernelSig, Param};
use crate::dtype::DType;

const F32: DTypes = one(DType::F32);
const I32: DTypes = one(DType::I32);

/// The index of each row's largest value: x, out, n (the row length).
pub static ARGMAX: KernelSig = KernelSig::new(
    "argmax_f32",
    OpKind::Argmax,
    &[
        Param::read("x", F32),
        Param::write("out", I32),
        Param::u32("n"),
    ],
);

/// The greedy token of one row kept on the device: x (one f32 row), ring (i32 `[R]`), inputs
/// (i32 `[1 + 2B]`: step, tokens, positions), n (the row length). The row's argmax (as
/// [`ARGMAX`]) is written to `ring[s % R]`, `s = inputs[0]`, and the inputs are advanced to the
/// next greedy step: `inputs[0] = s + 1`, `inputs[1]` the token (0 for -1), `inputs[1 + B] = s + 1`.
pub static ARGMAX_ADVANCE: KernelSig = KernelSig::new(
    "argmax_advance_f32",
    OpKind::Argmax,
    &[
        Param::read("x", F32),
        Param::read_write("ring", I32),
        Param::read_write("inputs", I32),
        Param::u32("n"),
    ],
);

/// A sampled token of one row drawn on the device, kept as [`ARGMAX_ADVANCE`] keeps the greedy
/// one: x (one f32 row), ring, inputs (as [`ARGMAX_ADVANCE`]), state (u32: the generator and the
/// settings, `ops::draw::DrawState`), window (i32: the repetition penalty's recent tokens),
/// scratch (u32 `[9n]`, rounded up to even: the kernel's candidates), n (the row length).
pub static DRAW_ADVANCE: KernelSig = KernelSig::new(
    "draw_advance_f32",
    OpKind::Argmax,
    &[
        Param::read("x", F32),
        Param::read_write("ring", I32),
        Param::read_write("inputs", I32),
        Param::read_write("state", one(DType::U32)),
        Param::read_write("window", I32),
        Param::write("scratch", one(DType::U32)),
        Param::u32("n"),
    ],
);

/// A sampled token drawn on the device for each row of x, as [`DRAW_ADVANCE`] draws one: x (f32
/// `[rows, n]`), state (u32 `[rows, 9]`), window (i32 `[rows, 1024]`), scratch (u32 `[rows, 9n]`,
/// each row's rounded up to even),
/// out (i32 `[rows]`: each row's token), n (the row length).
pub static DRAW_ROWS: KernelSig = KernelSig::new(
    "draw_rows_f32",
    OpKind::Argmax,
    &[
        Param::read("x", F32),
        Param::read_write("state", one(DType::U32)),
        Param::read_write("window", I32),
        Param::write("scratch", one(DType::U32)),
        Param::write("out", I32),
        Param::u32("n"),
    ],
);

/// The declaration of one copy kernel from `$from` to `$to`.
macro_rules! copy {
    ($name:literal, $from:ident, $to:ident) => {
        KernelSig::new(
            $name,
            OpKind::Copy,
            &[
                Param::read("src", one(DType::$from)),
                Param::write("dst", one(DType::$to)),
            ],
        )
    };
}

/// Copies with conversion between the floats: src, dst. Indexed `3 * from + to` in the order
/// f32, f16, bf16.
pub static COPY: [KernelSig; 9] = [
    copy!("copy_f32_f32", F32, F32),
    copy!("copy_f32_f16", F32, F16),
    copy!("copy_f32_bf16", F32, BF16),
    copy!("copy_f16_f32", F16, F32),
    copy!("copy_f16_f16", F16, F16),
    copy!("copy_f16_bf16", F16, BF16),
    copy!("copy_bf16_f32", BF16, F32),
    copy!("copy_bf16_f16", BF16, F16),
    copy!("copy_bf16_bf16", BF16, BF16),
];

/// Rows of a table (any weight format) gathered by id and dequantized to f32: table, ids, out,
/// vocab, dim. One kernel per format, in the order of [`WEIGHT_FORMATS`](super::WEIGHT_FORMATS).
pub static EMBEDDING: [KernelSig; 9] = per_format!(OpKind::Gather; "embedding"; |W| [
    Param::read("table", W),
    Param::read("ids", I32),
    Param::write("out", F32),
    Param::u32("vocab"),
    Param::u32("dim"),
]);

/// New K or V rows written into a cache at the step's position: new, step, cache, n_kv_head,
/// head_dim. One kernel per cache dtype (f32, f16, bf16).
pub static KV_WRITE: [KernelSig; 3] = per_float!(OpKind::KvWrite;
"kv_write_f32_f32", "kv_write_f32_f16", "kv_write_f32_bf16";
|T| [
    Param::read("new", F32),
    Param::read("step", I32),
    Param::write("cache", T),
    Param::u32("n_kv_head"),
    Param::u32("head_dim"),
]);

/// Rotary position embedding: x, positions, out, head_dim, rotary_dim, base, mode (0 normal,
/// 1 NeoX). One kernel per float dtype.
pub static ROPE: [KernelSig; 3] = per_float!(OpKind::Rope; "rope_f32", "rope_f16", "rope_bf16";
|T| [
    Param::read("x", T),
    Param::read("positions", I32),
    Param::write("out", T),
    Param::u32("head_dim"),
    Param::u32("rotary_dim"),
    Param::f32("base"),
    Param::u32("mode"),
]);

/// [`ROPE`] with per-pair frequency factors: x, positions, freq_factors, out, and its scalars.
pub static ROPE_FF: [KernelSig; 3] = per_float!(OpKind::Rope;
"rope_ff_f32", "rope_ff_f16", "rope_ff_bf16";
|T| [
    Param::read("x", T),
    Param::read("positions", I32),
    Param::read("freq_factors", F32),
    Param::write("out", T),
    Param::u32("head_dim"),
    Param::u32("rotary_dim"),
    Param::f32("base"),
    Param::u32("mode"),
]);

/// [`ROPE`] in place: x, positions, and its scalars.
pub static ROPE_INPLACE: [KernelSig; 3] = per_float!(OpKind::Rope;
"rope_f32_inplace", "rope_f16_inplace", "rope_bf16_inplace";
|T| [
    Param::read_write("x", T),
    Param::read("positions", I32),
    Param::u32("head_dim"),
    Param::u32("rotary_dim"),
    Param::f32("base"),
    Param::u32("mode"),
]);

/// [`ROPE_FF`] in place: x, positions, freq_factors, and its scalars.
pub static ROPE_FF_INPLACE: [KernelSig; 3] = per_float!(OpKind::Rope;
"rope_ff_f32_inplace", "rope_ff_f16_inplace", "rope_ff_bf16_inplace";
|T| [
    Param::read_write("x", T),
    Param::read("positions", I32),
    Param::read("freq_factors", F32),
    Param::u32("head_dim"),
    Param::u32("rotary_dim"),
    Param::f32("base"),
    Param::u32("mode"),
]);

/// [`ROPE_KV`]'s parameters, with the frequency factors (if given) after the positions.
macro_rules! rope_kv_params {
    ($($ff:expr)?) => {
        &[
            Param::read_write("q", F32),
            Param::read("k", F32),
            Param::read("v", F32),
            Param::read("positions", I32),
            $($ff,)?
            Param::read("step", I32),
            Param::write("k_cache", super::matmul::CACHE),
            Param::write("v_cache", super::matmul::CACHE),
            Param::u32("head_dim"),
            Param::u32("rotary_dim"),
            Param::f32("base"),
            Param::u32("mode"),
            Param::u32("n_kv_head"),
            Param::u32("cache_f16"),
        ]
    };
}

/// A prompt's RoPE on q and k and its k and v rows written into the KV caches, in one kernel
/// (`ops::rope_kv`, the fusion of two in-place f32 `rope`s and two f32 `kv_write`s): q (rotated in
/// place), k, v, positions, [freq_factors], step, k_cache, v_cache, head_dim, rotary_dim, base,
/// mode, n_kv_head, cache_f16 (the caches f32, or f16 where it is 1). Row r's k, rotated as `rope` rotates it, and its v go to the caches' rows
/// `step[0] + r`, as `kv_write` writes them; k itself is not written. Indexed by whether it
/// takes frequency factors: `rope_kv_f32`, `rope_ff_kv_f32`.
pub static ROPE_KV: [KernelSig; 2] = [
    KernelSig::new("rope_kv_f32", OpKind::Rope, rope_kv_params!()),
    KernelSig::new(
        "rope_ff_kv_f32",
        OpKind::Rope,
        rope_kv_params!(Param::read("freq_factors", F32)),
    ),
];

/// Softmax over f32 rows of `n` values after scaling by `scale`, with an optional additive mask,
/// out of place or in place. Indexed `2 * masked + in_place`:
/// `softmax_f32` (x, out, scale, n), `softmax_f32_inplace` (x, scale, n),
/// `softmax_mask_f32` (x, mask, out, scale, n), `softmax_mask_f32_inplace` (x, mask, scale, n).
pub static SOFTMAX: [KernelSig; 4] = [
    KernelSig::new(
        "softmax_f32",
        OpKind::Softmax,
        &[
            Param::read("x", F32),
            Param::write("out", F32),
            Param::f32("scale"),
            Param::u32("n"),
        ],
    ),
    KernelSig::new(
        "softmax_f32_inplace",
        OpKind::Softmax,
        &[
            Param::read_write("x", F32),
            Param::f32("scale"),
            Param::u32("n"),
        ],
    ),
    KernelSig::new(
        "softmax_mask_f32",
        OpKind::Softmax,
        &[
            Param::read("x", F32),
            Param::read("mask", F32),
            Param::write("out", F32),
            Param::f32("scale"),
            Param::u32("n"),
        ],
    ),
    KernelSig::new(
        "softmax_mask_f32_inplace",
        OpKind::Softmax,
        &[
            Param::read_write("x", F32),
            Param::read("mask", F32),
            Param::f32("scale"),
            Param::u32("n"),
        ],
    ),
];

/// The CUDA backend's self-test kernels (its `test` source; no CPU implementation).
/// `selftest_axpy_f32`: `y += a * x` over `n` values (x, y, n, a). `selftest_fault_f32`: one
/// store through an address whose upper 32 bits are `high`, to fault the context on purpose
/// (y, high).
pub static CUDA_SELFTEST: [KernelSig; 2] = [
    KernelSig::new(
        "selftest_axpy_f32",
        OpKind::Elementwise,
        &[
            Param::read("x", F32),
            Param::read_write("y", F32),
            Param::u32("n"),
            Param::f32("a"),
        ],
    ),
    KernelSig::new(
        "selftest_fault_f32",
        OpKind::Elementwise,
        &[Param::write("y", F32), Param::u32("high")],
    ),
];
