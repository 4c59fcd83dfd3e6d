//! The Llama family (SmolLM2, Llama 2 and 3.x): `general.architecture = llama`. Plain pre-norm
//! blocks, SwiGLU, RoPE on adjacent pairs (the GGUF converter permutes q and k for that), an
//! optional untied output head and Llama 3.1's per-frequency RoPE factors (`rope_freqs.weight`).

use crate::error::Result;
use crate::model::arch::{Activation, Family, Meta, ModelConfig};
use crate::model::gguf::GgufFile;
use crate::ops::rope::RopeMode;

/// Reads a Llama-family configuration from a GGUF file's metadata.
pub(crate) fn config(file: &GgufFile) -> Result<ModelConfig> {
    let m = Meta {
        file,
        arch: "llama",
    };
    let n_layer = m.blocks()?;
    let dim = m.req("embedding_length")?;
    let (n_head, n_kv_head, head_dim) = m.heads(dim)?;
    Ok(ModelConfig {
        family: Family::Llama,
        n_layer,
        dim,
        n_head,
        n_kv_head,
        head_dim,
        ffn_dim: m.req("feed_forward_length")?,
        vocab: m.vocab()?,
        rope_base: m.optf("rope.freq_base")?.unwrap_or(10000.0),
        rope_dim: m.opt("rope.dimension_count")?.unwrap_or(head_dim),
        rope_mode: RopeMode::Normal,
        norm_eps: m.optf("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        train_ctx: m.opt("context_length")?.unwrap_or(2048),
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        activation: Activation::Silu,
        qk_norm: false,
        post_norms: false,
        embed_scale: None,
        sliding: None,
    })
}
