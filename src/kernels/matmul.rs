//! The matrix families' kernels: products with a weight matrix in one of the
//! [`WEIGHT_FORMATS`](super::WEIGHT_FORMATS) (one kernel per format, in that order), expert
//! products, MLX affine products, and the fused block kernels of a decode step.
//!
//! Activations, outputs and accumulators are f32; `rows`, `k` (inputs) and `n` (outputs) are
//! sizes.

use super::OpKind;
use super::{one, per_format, DTypes, KernelSig, Param};
use crate::dtype::DType;

const F32: DTypes = one(DType::F32);
const I32: DTypes = one(DType::I32);
/// A KV cache's element types (f32, or f16 with the kernel's `cache_f16` argument 1).
pub(crate) const CACHE: DTypes = DTypes::of(&[DType::F32, DType::F16]);

/// The parameters of a product with weights of `$w`: x, w, `$out` (the output or accumulator),
/// rows, k, n.
macro_rules! product_params {
    ($w:ident, $out:expr) => {
        [
            Param::read("x", F32),
            Param::read("w", $w),
            $out,
            Param::u32("rows"),
            Param::u32("k"),
            Param::u32("n"),
        ]
    };
}
pub(crate) use product_params;

/// `out[r, o] = x[r] . w[o]`: x, w, out, rows, k, n. On CUDA a one-row product of a 32-value
/// block format or Q4_K launched with the int8 row's shared memory (`ops::matmul::matmul` gives it from
/// 2^21 weights) rounds x to int8 in blocks of 32 values: the same results up to that rounding.
pub static MATMUL: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "matmul"; |W| product_params!(W, Param::write("out", F32)));

/// `acc[r, o] += x[r] . w[o]`: x, w, acc, rows, k, n (a product and its residual add, fused).
pub static MATMUL_ADD: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul_add"; |W| product_params!(W, Param::read_write("acc", F32)));

/// [`MATMUL`] in the tensor-core form (CUDA, prompts of many rows): the same arguments and the
/// same results up to the f16 rounding of x and w; a backend without that form runs the plain one.
pub static MATMUL_MMA: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "matmul_mma"; |W| product_params!(W, Param::write("out", F32)));

/// [`MATMUL_ADD`] in the tensor-core form (the residual add fused into [`MATMUL_MMA`]).
pub static MATMUL_ADD_MMA: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul_add_mma"; |W| product_params!(W, Param::read_write("acc", F32)));

/// Three products of one x in the tensor-core form, `out_i[r, o] = x[r] . w_i[o]` for i = 0, 1, 2
/// (weights of one format and one k, e.g. a prompt's q, k and v products): x, w0, w1, w2, out0,
/// out1, out2, rows, k, n0, n1, n2. The three [`MATMUL_MMA`] results bit for bit, in one launch.
pub static MATMUL3_MMA: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul3_mma"; |W| [
    Param::read("x", F32),
    Param::read("w0", W),
    Param::read("w1", W),
    Param::read("w2", W),
    Param::write("out0", F32),
    Param::write("out1", F32),
    Param::write("out2", F32),
    Param::u32("rows"),
    Param::u32("k"),
    Param::u32("n0"),
    Param::u32("n1"),
    Param::u32("n2"),
]);

/// [`MATMUL_MMA`] on f16 activations (x already rounded to f16, as the tensor-core form rounds
/// it): x (f16), w, out, rows, k, n. What the optimizer's narrowing makes of a tensor-core product
/// whose x an f32 norm wrote (`graph::passes::narrow`); the same bits as the f32 form on the norm's
/// f32 output.
pub static MATMUL_MMA_H: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul_mma_h"; |W| [
    Param::read("x", one(DType::F16)),
    Param::read("w", W),
    Param::write("out", F32),
    Param::u32("rows"),
    Param::u32("k"),
    Param::u32("n"),
]);

/// [`MATMUL_ADD_MMA`] on f16 activations (see [`MATMUL_MMA_H`]): x (f16), w, acc, rows, k, n;
/// `acc[r, o] += x[r] . w[o]`. What the narrowing makes of a fused product and residual add whose
/// x an f32 SwiGLU wrote (a block's down product).
pub static MATMUL_ADD_MMA_H: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul_add_mma_h"; |W| [
    Param::read("x", one(DType::F16)),
    Param::read("w", W),
    Param::read_write("acc", F32),
    Param::u32("rows"),
    Param::u32("k"),
    Param::u32("n"),
]);

/// [`MATMUL3_MMA`] on f16 activations (see [`MATMUL_MMA_H`]): x (f16), w0, w1, w2, out0, out1,
/// out2, rows, k, n0, n1, n2.
pub static MATMUL3_MMA_H: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul3_mma_h"; |W| [
    Param::read("x", one(DType::F16)),
    Param::read("w0", W),
    Param::read("w1", W),
    Param::read("w2", W),
    Param::write("out0", F32),
    Param::write("out1", F32),
    Param::write("out2", F32),
    Param::u32("rows"),
    Param::u32("k"),
    Param::u32("n0"),
    Param::u32("n1"),
    Param::u32("n2"),
]);

/// The gate and up products of one f16 x and their SwiGLU, in f16: x (f16), wg, wu, out (f16),
/// rows, k, n; `out[r, o] = f16(silu(x[r] . wg[o]) * (x[r] . wu[o]))`. What the optimizer makes
/// of two [`MATMUL_MMA_H`] and a [`SWIGLU_TO_F16`](super::elementwise::SWIGLU_TO_F16) of their
/// outputs (`ops::matmul_swiglu`), with their bits.
pub static MATMUL_SWIGLU_MMA_H: [KernelSig; 9] = per_format!(OpKind::MatMul; "matmul_swiglu_mma_h"; |W| [
    Param::read("x", one(DType::F16)),
    Param::read("wg", W),
    Param::read("wu", W),
    Param::write("out", one(DType::F16)),
    Param::u32("rows"),
    Param::u32("k"),
    Param::u32("n"),
]);

/// Expert products, `out[r, s] = x[r] . w[ids[r, s]]`: x, w, ids, out, rows, k, n, slots,
/// experts.
pub static MATMUL_ID: [KernelSig; 9] = per_format!(OpKind::MatMulId; "matmul_id"; |W| [
    Param::read("x", F32),
    Param::read("w", W),
    Param::read("ids", I32),
    Param::write("out", F32),
    Param::u32("rows"),
    Param::u32("k"),
    Param::u32("n"),
    Param::u32("slots"),
    Param::u32("experts"),
]);

/// The declaration of one MLX affine product kernel with scales and biases of `$s`.
macro_rules! affine {
    ($name:literal, $s:expr) => {
        KernelSig::new(
            $name,
            OpKind::MatMul,
            &[
                Param::read("x", F32),
                Param::read("w", one(DType::U32)),
                Param::read("scales", $s),
                Param::read("biases", $s),
                Param::write("out", F32),
                Param::u32("rows"),
                Param::u32("k"),
                Param::u32("n"),
                Param::u32("bits"),
                Param::u32("group_size"),
            ],
        )
    };
}

/// MLX affine products (packed u32 weights, per-group scales and biases of f32 or f16, in that
/// order): x, w, scales, biases, out, rows, k, n, bits, group_size.
pub static MATMUL_AFFINE: [KernelSig; 2] = [
    affine!("matmul_affine_f32", one(DType::F32)),
    affine!("matmul_affine_f16", one(DType::F16)),
];

/// The parameters of the attention-input kernels; the `_ff` kernels' frequency factors
/// (`qkv_rope_params!(W, V, ff)`) come after positions.
macro_rules! qkv_rope_params {
    ($w:ident) => {
        qkv_rope_params!($w, $w)
    };
    ($w:ident, $v:expr $(, $after_positions:ident)?) => {
        [
            Param::read("x", F32),
            Param::read("norm", F32),
            Param::read("wq", $w),
            Param::read("wk", $w),
            Param::read("wv", $v),
            Param::read("positions", I32),
            $(qkv_rope_params!(@$after_positions),)?
            Param::read("step", I32),
            Param::write("q", F32),
            Param::read_write("k_cache", CACHE),
            Param::read_write("v_cache", CACHE),
            Param::f32("eps"),
            Param::u32("dim"),
            Param::u32("n_head"),
            Param::u32("n_kv_head"),
            Param::u32("head_dim"),
            Param::f32("base"),
            Param::u32("mode"),
            Param::u32("cache_f16"),
        ]
    };
    (@ff) => {
        Param::read("freq_factors", F32)
    };
}

/// [`qkv_rope_params`] with the RoPE's frequency factors.
macro_rules! qkv_rope_ff_params {
    ($w:ident) => {
        qkv_rope_params!($w, $w, ff)
    };
    ($w:ident, $v:expr) => {
        qkv_rope_params!($w, $v, ff)
    };
}

/// The parameters of the MLP-input kernels.
macro_rules! gate_up_params {
    ($w:ident) => {
        [
            Param::read("x", F32),
            Param::read("norm", F32),
            Param::read("w_gate", $w),
            Param::read("w_up", $w),
            Param::write("hidden", F32),
            Param::f32("eps"),
            Param::u32("dim"),
            Param::u32("ffn"),
            Param::u32("act"),
        ]
    };
}

/// The attention input of a block: norm, q/k/v products, RoPE, and the K and V rows written
/// into the caches: x, norm, wq, wk, wv, positions, step, q, k_cache, v_cache, eps, dim,
/// n_head, n_kv_head, head_dim, base, mode.
pub static NORM_QKV_ROPE: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_qkv_rope"; |W| qkv_rope_params!(W));

/// [`NORM_QKV_ROPE`] for one row with the row normalized once per block in shared memory (the
/// CUDA form for long rows; the same values, and for the 32-value block formats and Q4_K rounded to int8
/// in blocks of 32 values where the launch gives that memory too).
pub static NORM_QKV_ROPE_SHARED: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_qkv_rope_shared"; |W| qkv_rope_params!(W));

/// [`NORM_QKV_ROPE`] with the RoPE's frequency factors (Llama 3's `rope_freqs`, f32, one a
/// pair) after positions: x, norm, wq, wk, wv, positions, freq_factors, step, q, k_cache,
/// v_cache, then the same scalars.
pub static NORM_QKV_ROPE_FF: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_qkv_rope_ff"; |W| qkv_rope_ff_params!(W));

/// [`NORM_QKV_ROPE_FF`] in the shared-memory form of [`NORM_QKV_ROPE_SHARED`].
pub static NORM_QKV_ROPE_FF_SHARED: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_qkv_rope_ff_shared"; |W| qkv_rope_ff_params!(W));

/// The (q and k, v) weight formats of [`NORM_QKV_ROPE_MIXED`] and [`NORM_QKV_MIXED`], in their
/// order: the blocks of a llama.cpp Q4_K_M file whose v takes more bits, Q4_K q and k with Q6_K
/// v, and where rows are not whole 256-value super-blocks (Gemma 3's 640) their fallbacks, Q5_0
/// q and k with Q8_0 v.
pub const QKV_MIXED_FORMATS: [(DType, DType); 2] =
    [(DType::Q4K, DType::Q6K), (DType::Q5_0, DType::Q8_0)];

/// The plain and `_shared` kernels of one (q and k, v) pair of [`QKV_MIXED_FORMATS`].
macro_rules! mixed_pair {
    ($plain:literal, $shared:literal, $params:ident, $qk:ident, $v:ident) => {{
        const QK: DTypes = one(DType::$qk);
        const V: DTypes = one(DType::$v);
        [
            KernelSig::new($plain, OpKind::MatMul, &$params!(QK, V)),
            KernelSig::new($shared, OpKind::MatMul, &$params!(QK, V)),
        ]
    }};
}

/// [`NORM_QKV_ROPE`] (even entries) and [`NORM_QKV_ROPE_SHARED`] (odd entries) with v weights of
/// another format than q's and k's, one pair of kernels per entry of [`QKV_MIXED_FORMATS`].
pub static NORM_QKV_ROPE_MIXED: [KernelSig; 4] = {
    let [a, b] = mixed_pair!(
        "norm_qkv_rope_q4_k_v_q6_k",
        "norm_qkv_rope_shared_q4_k_v_q6_k",
        qkv_rope_params,
        Q4K,
        Q6K
    );
    let [c, d] = mixed_pair!(
        "norm_qkv_rope_q5_0_v_q8_0",
        "norm_qkv_rope_shared_q5_0_v_q8_0",
        qkv_rope_params,
        Q5_0,
        Q8_0
    );
    [a, b, c, d]
};

/// [`NORM_QKV_ROPE_FF`] (even entries) and [`NORM_QKV_ROPE_FF_SHARED`] (odd entries) with v
/// weights of another format, one pair per entry of [`QKV_MIXED_FORMATS`].
pub static NORM_QKV_ROPE_FF_MIXED: [KernelSig; 4] = {
    let [a, b] = mixed_pair!(
        "norm_qkv_rope_ff_q4_k_v_q6_k",
        "norm_qkv_rope_ff_shared_q4_k_v_q6_k",
        qkv_rope_ff_params,
        Q4K,
        Q6K
    );
    let [c, d] = mixed_pair!(
        "norm_qkv_rope_ff_q5_0_v_q8_0",
        "norm_qkv_rope_ff_shared_q5_0_v_q8_0",
        qkv_rope_ff_params,
        Q5_0,
        Q8_0
    );
    [a, b, c, d]
};

/// The parameters of the norm + three products kernels.
macro_rules! qkv_params {
    ($w:ident) => {
        qkv_params!($w, $w)
    };
    ($w:ident, $v:expr) => {
        [
            Param::read("x", F32),
            Param::read("norm", F32),
            Param::read("wq", $w),
            Param::read("wk", $w),
            Param::read("wv", $v),
            Param::write("q", F32),
            Param::write("k", F32),
            Param::write("v", F32),
            Param::f32("eps"),
            Param::u32("dim"),
            Param::u32("n_q"),
            Param::u32("n_kv"),
        ]
    };
}

/// The attention input of a block whose q and k take a per-head norm before RoPE (Qwen 3,
/// Gemma 3), or whose RoPE the block kernel does not take: the norm and the q, k and v products
/// of [`NORM_QKV_ROPE`] without the rotation, each written to its own output: x, norm, wq, wk,
/// wv, q (`[rows, n_q]`), k and v (`[rows, n_kv]`), eps, dim, n_q, n_kv (both even).
pub static NORM_QKV: [KernelSig; 9] = per_format!(OpKind::MatMul; "norm_qkv"; |W| qkv_params!(W));

/// [`NORM_QKV`] for one row with the row normalized once per block in shared memory (as
/// [`NORM_QKV_ROPE_SHARED`]).
pub static NORM_QKV_SHARED: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_qkv_shared"; |W| qkv_params!(W));

/// [`NORM_QKV`] (even entries) and [`NORM_QKV_SHARED`] (odd entries) with v weights of another
/// format, one pair per entry of [`QKV_MIXED_FORMATS`].
pub static NORM_QKV_MIXED: [KernelSig; 4] = {
    let [a, b] = mixed_pair!(
        "norm_qkv_q4_k_v_q6_k",
        "norm_qkv_shared_q4_k_v_q6_k",
        qkv_params,
        Q4K,
        Q6K
    );
    let [c, d] = mixed_pair!(
        "norm_qkv_q5_0_v_q8_0",
        "norm_qkv_shared_q5_0_v_q8_0",
        qkv_params,
        Q5_0,
        Q8_0
    );
    [a, b, c, d]
};

/// The MLP input of a block, `hidden = act(norm(x) w_gate) * (norm(x) w_up)` with `act` SiLU
/// (0, SwiGLU) or GELU in its tanh form (1, GeGLU): x, norm, w_gate, w_up, hidden, eps, dim, ffn,
/// act.
pub static NORM_GATE_UP: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_gate_up"; |W| gate_up_params!(W));

/// [`NORM_GATE_UP`] for one row with the row normalized once per block in shared memory (and
/// rounded to int8 as in [`NORM_QKV_ROPE_SHARED`]).
pub static NORM_GATE_UP_SHARED: [KernelSig; 9] =
    per_format!(OpKind::MatMul; "norm_gate_up_shared"; |W| gate_up_params!(W));
