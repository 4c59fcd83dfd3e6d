//! The fused kernels a backend can ask the optimizer to make, named as types so that a backend's
//! declaration ([`Capabilities::fusions`](crate::backend::Capabilities::fusions)) can list them
//! without knowing the rules that make them (the rules live in `ops/`, above the backends).

/// A fused kernel family, made by one fusion rule out of plain ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fusion {
    /// `rms_norm` and the three q/k/v products that read it, RoPE on q and k, and the k and v
    /// rows written into the KV cache: one `norm_qkv_rope`.
    NormQkvRope,
    /// `rms_norm`, the gate and up products that read it and SwiGLU or GeGLU: one `norm_gate_up`.
    NormGateUp,
    /// `rms_norm` and the three q/k/v products that read it, nothing after them (where the
    /// per-head norms of Qwen 3 and Gemma 3 stand between the products and the RoPE): one
    /// `norm_qkv`.
    NormQkv,
    /// A product and the in-place residual add of its output: one `matmul_add`.
    MatMulAdd,
    /// `rms_norm` and a multiply of its output: one `rms_norm_mul`.
    RmsNormMul,
    /// `rms_norm` and the in-place add of its output into an accumulator (the post-block norms
    /// of Gemma 3): one `rms_norm_add`.
    RmsNormAdd,
    /// A per-head `rms_norm` (the query and key norms of Gemma 3 and Qwen 3) and the in-place
    /// RoPE of its output: one `rms_norm_rope`.
    RmsNormRope,
    /// The query and key `rms_norm_rope`s of a block and the cache writes of k and v after them:
    /// one `rms_norm_rope_kv`.
    RmsNormRopeKv,
    /// Three tensor-core products of one x with weights of one format (a prompt's q, k and v
    /// products): one `matmul3_mma`.
    ProductTriple,
    /// The gate and up tensor-core products of one f16 x and the f16 SwiGLU of their outputs (a
    /// prompt's MLP input, once narrowed): one `matmul_swiglu_mma_h`.
    ProductPairSwiglu,
    /// A prompt's in-place RoPE of q and of k and the cache writes of k and v: one `rope_kv`.
    RopeKv,
}

impl Fusion {
    /// Every fusion, in the order the optimizer tries them where two share an anchor.
    pub const ALL: [Fusion; 11] = [
        Fusion::NormQkvRope,
        Fusion::NormGateUp,
        Fusion::NormQkv,
        Fusion::MatMulAdd,
        Fusion::RmsNormMul,
        Fusion::RmsNormAdd,
        Fusion::RmsNormRope,
        Fusion::RmsNormRopeKv,
        Fusion::ProductTriple,
        Fusion::ProductPairSwiglu,
        Fusion::RopeKv,
    ];
}

/// One fusion a backend applies, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusionUse {
    /// The fused kernel family.
    pub fusion: Fusion,
    /// The most rows (tokens) of a pass for which the fused kernel pays; `None`: every pass.
    pub max_rows: Option<usize>,
    /// Whether the backend's fused kernel gives the bits of the plain ops it replaces (the
    /// schedule sanitizer compares such fusions bitwise; the others are compared against the
    /// plain ops by their kernel tests, within a stated tolerance).
    pub exact: bool,
}

impl FusionUse {
    /// `fusion` for every pass, bit-exact.
    pub const fn always(fusion: Fusion) -> FusionUse {
        FusionUse {
            fusion,
            max_rows: None,
            exact: true,
        }
    }
}
