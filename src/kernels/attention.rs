//! The `attention` family's kernels, one per KV-cache dtype (f32, f16, in that order). Queries,
//! outputs and partial results are f32; `step` holds the pass's first position (read at run
//! time, so one recorded pass serves every step). Every kernel takes the sliding window as the u32
//! scalar `window` (0 = none): the query at position `i` sees keys `i + 1 - window..=i`.

use super::OpKind;
use super::{one, DTypes, KernelSig, Param};
use crate::dtype::DType;

const F32: DTypes = one(DType::F32);
const I32: DTypes = one(DType::I32);

/// The parameters every attention kernel starts with (`$cache` the KV-cache dtype), then `$out`,
/// then the scoring scalars and `$tail`.
macro_rules! attention_params {
    ($cache:expr; $($out:expr),*; $($tail:expr),*) => {
        [
            Param::read("q", F32),
            Param::read("k_cache", $cache),
            Param::read("v_cache", $cache),
            Param::read("step", I32),
            $($out,)*
            Param::u32("n_head"),
            Param::u32("n_kv_head"),
            Param::u32("head_dim"),
            Param::f32("scale"),
            Param::f32("softcap"),
            Param::u32("window"),
            $($tail),*
        ]
    };
}

/// Prefill attention with a causal mask (and the window, if any): q, k_cache, v_cache, step, out,
/// n_head, n_kv_head, head_dim, scale, softcap, window.
pub static ATTENTION: [KernelSig; 2] = [
    KernelSig::new(
        "attention_f32",
        OpKind::Attention,
        &attention_params!(F32; Param::write("out", F32);),
    ),
    KernelSig::new(
        "attention_f16",
        OpKind::Attention,
        &attention_params!(one(DType::F16); Param::write("out", F32);),
    ),
];

/// [`ATTENTION`] with the GPU's tensor-core form for prompts of heads of 128 values (q, k, v and
/// the softmax weights rounded to f16; sums and the softmax in f32): the same arguments.
pub static ATTENTION_MMA: [KernelSig; 2] = [
    KernelSig::new(
        "attention_mma_f32",
        OpKind::Attention,
        &attention_params!(F32; Param::write("out", F32);),
    ),
    KernelSig::new(
        "attention_mma_f16",
        OpKind::Attention,
        &attention_params!(one(DType::F16); Param::write("out", F32);),
    ),
];

/// [`ATTENTION_MMA`]'s f32 values rounded to f16 (round to nearest even) in `out`: the same
/// arguments, out f16. What the optimizer's narrowing (`graph::passes::narrow`) makes of a prompt
/// attention whose every reader is a tensor-core product (a block's o product), which rounds its
/// activations to f16 anyway.
pub static ATTENTION_MMA_TO_F16: [KernelSig; 2] = [
    KernelSig::new(
        "attention_mma_f32_to_f16",
        OpKind::Attention,
        &attention_params!(F32; Param::write("out", one(DType::F16));),
    ),
    KernelSig::new(
        "attention_mma_f16_to_f16",
        OpKind::Attention,
        &attention_params!(one(DType::F16); Param::write("out", one(DType::F16));),
    ),
];

/// Decode attention in one launch (the CUDA backend's): the block that finishes a head's last
/// chunk merges the head. q, k_cache, v_cache, step, partials, out, the scoring scalars (window
/// included), chunk_len, chunks.
pub static DECODE: [KernelSig; 2] = [
    KernelSig::new(
        "attention_decode_f32",
        OpKind::Attention,
        &attention_params!(F32;
            Param::read_write("partials", F32), Param::write("out", F32);
            Param::u32("chunk_len"), Param::u32("chunks")),
    ),
    KernelSig::new(
        "attention_decode_f16",
        OpKind::Attention,
        &attention_params!(one(DType::F16);
            Param::read_write("partials", F32), Param::write("out", F32);
            Param::u32("chunk_len"), Param::u32("chunks")),
    ),
];

/// The first half of split decode attention: one partial result per head and KV chunk holding a
/// key of the window. q, k_cache, v_cache, step, records, the scoring scalars (window included),
/// chunk_len, chunks.
pub static DECODE_PARTIAL: [KernelSig; 2] = [
    KernelSig::new(
        "attention_decode_partial_f32",
        OpKind::Attention,
        &attention_params!(F32; Param::write("records", F32);
            Param::u32("chunk_len"), Param::u32("chunks")),
    ),
    KernelSig::new(
        "attention_decode_partial_f16",
        OpKind::Attention,
        &attention_params!(one(DType::F16); Param::write("records", F32);
            Param::u32("chunk_len"), Param::u32("chunks")),
    ),
];

/// The second half of split decode attention, merging the chunks of each head that hold a key of
/// the window: records, step, out, n_head, head_dim, chunk_len, chunks, window.
pub static DECODE_COMBINE: KernelSig = KernelSig::new(
    "attention_decode_combine",
    OpKind::Attention,
    &[
        Param::read("records", F32),
        Param::read("step", I32),
        Param::write("out", F32),
        Param::u32("n_head"),
        Param::u32("head_dim"),
        Param::u32("chunk_len"),
        Param::u32("chunks"),
        Param::u32("window"),
    ],
);
