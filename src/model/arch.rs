//! A model family as data: the shapes of a decoder-only transformer and the few choices that tell
//! the families apart (activation, extra norms, RoPE layout, sliding windows, embedding scale).
//!
//! One skeleton ([`crate::model::transformer`]) records every family from a [`ModelConfig`]; a
//! family is a small file that reads its GGUF metadata into one ([`crate::model::llama`],
//! [`crate::model::gemma3`], [`crate::model::qwen3`]). [`ModelConfig::from_gguf`] picks the family
//! by `general.architecture`.

use crate::error::Result;
use crate::model::gguf::GgufFile;
use crate::ops::attention::AttentionParams;
use crate::ops::rope::RopeMode;

/// The model families onepass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Llama 2/3, SmolLM2 (`general.architecture = llama`).
    Llama,
    /// Gemma 3 (`gemma3`).
    Gemma3,
    /// Qwen 3 dense models (`qwen3`).
    Qwen3,
}

impl Family {
    /// The `general.architecture` value of the family.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Gemma3 => "gemma3",
            Family::Qwen3 => "qwen3",
        }
    }
}

/// The gated activation of the feed-forward block: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SiLU (SwiGLU): Llama, Qwen.
    Silu,
    /// GELU, tanh form (GeGLU): Gemma.
    GeluTanh,
}

/// Sliding-window attention on some layers (Gemma 3: five local layers, then one global).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SlidingWindow {
    /// Keys a local layer's query sees: positions `i - window < j <= i`.
    pub window: usize,
    /// Every `period`-th layer (1-based) is global; the others are local.
    pub period: usize,
    /// The RoPE base of the local layers (the global ones use [`ModelConfig::rope_base`]).
    pub local_rope_base: f32,
}

/// Shapes and choices of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    /// The family the file declares.
    pub family: Family,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub dim: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base frequency (of the global layers where layers differ).
    pub rope_base: f32,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    /// Which values RoPE pairs.
    pub rope_mode: RopeMode,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// Context length the model was trained for.
    pub train_ctx: usize,
    /// Factor applied to `q.k` in attention.
    pub attn_scale: f32,
    /// The feed-forward activation.
    pub activation: Activation,
    /// RMSNorm of every query and key head (weights `attn_q_norm`, `attn_k_norm`) before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before the residual add (weights
    /// `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Factor applied to the embedding rows (Gemma: `sqrt(dim)`).
    pub embed_scale: Option<f32>,
    /// Sliding-window attention, if some layers use it.
    pub sliding: Option<SlidingWindow>,
}

/// What one layer's attention does differently from the others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerAttention {
    /// The RoPE base of the layer.
    pub rope_base: f32,
    /// The layer's sliding window, if it is a local layer.
    pub window: Option<usize>,
}

impl ModelConfig {
    /// Reads the configuration from a GGUF file's metadata, by its `general.architecture`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file.get_str("general.architecture")?;
        let cfg = match arch {
            "llama" => crate::model::llama::config(file)?,
            "gemma3" => crate::model::gemma3::config(file)?,
            "qwen3" => crate::model::qwen3::config(file)?,
            other => {
                return Err(file.err(format!(
                    "architecture `{other}` is not supported (supported: `llama` (SmolLM2, \
                     Llama 2 and 3), `gemma3`, `qwen3`)"
                )))
            }
        };
        cfg.check(file)?;
        Ok(cfg)
    }

    fn check(&self, file: &GgufFile) -> Result<()> {
        let heads_ok = self.n_head > 0
            && self.n_kv_head > 0
            && self.head_dim > 0
            && self.n_head.is_multiple_of(self.n_kv_head);
        let rope_ok = self.rope_dim <= self.head_dim && self.rope_dim.is_multiple_of(2);
        let window_ok = self.sliding.is_none_or(|s| s.window > 0 && s.period > 0);
        let sizes_ok = self.dim > 0 && self.ffn_dim > 0 && self.vocab > 0;
        let numbers_ok = self.norm_eps > 0.0
            && self.attn_scale.is_finite()
            && self.attn_scale > 0.0
            && self.rope_base > 0.0
            && self.embed_scale.is_none_or(f32::is_finite);
        if heads_ok && rope_ok && window_ok && sizes_ok && numbers_ok {
            Ok(())
        } else {
            Err(file.err(format!("inconsistent configuration {self:?}")))
        }
    }

    /// Weights per token, roughly (for reports).
    pub fn params(&self) -> usize {
        let attn = self.dim * self.head_dim * (2 * self.n_head + 2 * self.n_kv_head);
        let ffn = 3 * self.dim * self.ffn_dim;
        self.n_layer * (attn + ffn) + self.vocab * self.dim
    }

    /// Width of a row of queries (and of the attention output): `n_head * head_dim`.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of a row of keys or values: `n_kv_head * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Whether layer `layer` (0-based) uses the sliding window.
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding
            .is_some_and(|s| !(layer + 1).is_multiple_of(s.period))
    }

    /// The attention of layer `layer`: its RoPE base and window.
    pub fn layer_attention(&self, layer: usize) -> LayerAttention {
        match self.sliding {
            Some(s) if self.is_local(layer) => LayerAttention {
                rope_base: s.local_rope_base,
                window: Some(s.window),
            },
            _ => LayerAttention {
                rope_base: self.rope_base,
                window: None,
            },
        }
    }

    /// The attention parameters of a global layer (no window): heads and scale.
    pub fn full_attention(&self) -> AttentionParams {
        AttentionParams::new(self.n_head, self.n_kv_head, self.head_dim).with_scale(self.attn_scale)
    }
}

/// Reads `<arch>.<key>` metadata values of one family.
pub(crate) struct Meta<'a> {
    /// The file.
    pub file: &'a GgufFile,
    /// The key prefix (`llama`, `gemma3`).
    pub arch: &'static str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required unsigned value.
    pub fn req(&self, k: &str) -> Result<usize> {
        self.file.get_u32(&self.key(k)).map(|v| v as usize)
    }

    /// An optional unsigned value.
    pub fn opt(&self, k: &str) -> Result<Option<usize>> {
        Ok(self.file.opt_u32(&self.key(k))?.map(|v| v as usize))
    }

    /// An optional float value.
    pub fn optf(&self, k: &str) -> Result<Option<f32>> {
        self.file.opt_f32(&self.key(k))
    }

    /// `block_count`, checked against the file before anything is sized by it: a model needs at
    /// least one block, and the tensors of every block it declares. The scan stops at the first
    /// missing block, so it looks at no more blocks than the file has tensors.
    pub fn blocks(&self) -> Result<usize> {
        let n_layer = self.req("block_count")?;
        let key = self.key("block_count");
        if n_layer == 0 {
            return Err(self
                .file
                .err(format!("`{key}` is 0: a model with no blocks cannot run")));
        }
        let first_missing =
            (0..n_layer).find(|i| !self.file.has_tensor(&format!("blk.{i}.attn_norm.weight")));
        match first_missing {
            Some(i) => Err(self.file.err(format!(
                "`{key}` is {n_layer}, but the tensors of block {i} are missing \
                 (no `blk.{i}.attn_norm.weight`)"
            ))),
            None => Ok(n_layer),
        }
    }

    /// Heads: `(n_head, n_kv_head, head_dim)`, the head size from `attention.key_length` or
    /// `dim / n_head`.
    pub fn heads(&self, dim: usize) -> Result<(usize, usize, usize)> {
        let n_head = self.req("attention.head_count")?;
        let n_kv_head = self.opt("attention.head_count_kv")?.unwrap_or(n_head);
        let key_length = self.opt("attention.key_length")?;
        let bad = n_head == 0
            || n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || (key_length.is_none() && !dim.is_multiple_of(n_head));
        if bad {
            return Err(self.file.err(format!(
                "inconsistent heads: dim {dim}, {n_head} heads, {n_kv_head} kv heads"
            )));
        }
        Ok((n_head, n_kv_head, key_length.unwrap_or(dim / n_head)))
    }

    /// The vocabulary size: rows of `token_embd.weight`.
    pub fn vocab(&self) -> Result<usize> {
        let embd = self.file.tensor("token_embd.weight")?.dims_row_major();
        Ok(embd.first().copied().unwrap_or(0))
    }
}
