//! The Gemma 3 family (`general.architecture = gemma3`): embeddings scaled by `sqrt(dim)`, norms
//! before and after attention and the feed-forward block, RMSNorm of every query and key head,
//! GeGLU, RoPE on the two halves of a head (NeoX layout), sliding-window attention on five of every
//! six layers with their own RoPE base, a tied output head.
//!
//! The GGUF stores each RMSNorm's multiplier itself (the converter folds Gemma's `1 + w`), so the
//! norms are plain `rms_norm` ops. What the file may not store comes from Gemma 3's own defaults,
//! named once below.

use crate::error::Result;
use crate::model::arch::{Activation, Family, Meta, ModelConfig, SlidingWindow};
use crate::model::gguf::GgufFile;
use crate::ops::rope::RopeMode;

/// Every `LAYER_PERIOD`-th layer is global (full attention); the others use the sliding window.
pub const LAYER_PERIOD: usize = 6;
/// The RoPE base of the local (sliding-window) layers.
pub const LOCAL_ROPE_BASE: f32 = 10_000.0;
/// The RoPE base of the global layers when the file does not give `gemma3.rope.freq_base`.
pub const GLOBAL_ROPE_BASE: f32 = 1_000_000.0;
/// The sliding window when the file does not give `gemma3.attention.sliding_window`.
pub const SLIDING_WINDOW: usize = 512;

/// Reads a Gemma 3 configuration from a GGUF file's metadata.
pub(crate) fn config(file: &GgufFile) -> Result<ModelConfig> {
    let m = Meta {
        file,
        arch: "gemma3",
    };
    let n_layer = m.blocks()?;
    let dim = m.req("embedding_length")?;
    let (n_head, n_kv_head, head_dim) = m.heads(dim)?;
    // Queries are scaled by `query_pre_attn_scalar ** -0.5`; Gemma 3 sets the scalar to the head
    // size, and a file that stores it names it after the attention keys.
    let query_scalar = m.optf("attention.query_pre_attn_scalar")?;
    let attn_scale = 1.0 / query_scalar.unwrap_or(head_dim as f32).sqrt();
    let period = m.opt("attention.sliding_window_pattern")?;
    Ok(ModelConfig {
        family: Family::Gemma3,
        n_layer,
        dim,
        n_head,
        n_kv_head,
        head_dim,
        ffn_dim: m.req("feed_forward_length")?,
        vocab: m.vocab()?,
        rope_base: m.optf("rope.freq_base")?.unwrap_or(GLOBAL_ROPE_BASE),
        rope_dim: m.opt("rope.dimension_count")?.unwrap_or(head_dim),
        rope_mode: RopeMode::NeoX,
        norm_eps: m.optf("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
        train_ctx: m.opt("context_length")?.unwrap_or(32768),
        attn_scale,
        activation: Activation::GeluTanh,
        qk_norm: true,
        post_norms: true,
        embed_scale: Some((dim as f32).sqrt()),
        sliding: Some(SlidingWindow {
            window: m.opt("attention.sliding_window")?.unwrap_or(SLIDING_WINDOW),
            period: period.unwrap_or(LAYER_PERIOD),
            local_rope_base: m.optf("rope.local.freq_base")?.unwrap_or(LOCAL_ROPE_BASE),
        }),
    })
}
