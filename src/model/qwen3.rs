//! The Qwen 3 dense family (`general.architecture = qwen3`): Llama's block with an RMSNorm of
//! every query and key head before RoPE, RoPE on the two halves of a head (NeoX layout), a head
//! size of its own (`attention.key_length`), no biases, an output head that may be tied.

use crate::error::Result;
use crate::model::arch::{Activation, Family, Meta, ModelConfig};
use crate::model::gguf::GgufFile;
use crate::ops::rope::RopeMode;

/// Reads a Qwen 3 configuration from a GGUF file's metadata.
pub(crate) fn config(file: &GgufFile) -> Result<ModelConfig> {
    let m = Meta {
        file,
        arch: "qwen3",
    };
    let n_layer = m.blocks()?;
    let dim = m.req("embedding_length")?;
    let (n_head, n_kv_head, head_dim) = m.heads(dim)?;
    Ok(ModelConfig {
        family: Family::Qwen3,
        n_layer,
        dim,
        n_head,
        n_kv_head,
        head_dim,
        ffn_dim: m.req("feed_forward_length")?,
        vocab: m.vocab()?,
        rope_base: m.optf("rope.freq_base")?.unwrap_or(1_000_000.0),
        rope_dim: m.opt("rope.dimension_count")?.unwrap_or(head_dim),
        rope_mode: RopeMode::NeoX,
        norm_eps: m.optf("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
        train_ctx: m.opt("context_length")?.unwrap_or(40960),
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        activation: Activation::Silu,
        qk_norm: true,
        post_norms: false,
        embed_scale: None,
        sliding: None,
    })
}
