//! What the kernel declarations are made of and what the IR reuses: how a kernel uses a buffer
//! ([`Access`]), its scalar values ([`Scalar`]) and what kind of operation it performs
//! ([`OpKind`]), which the passes read instead of kernel names.

/// How a dispatch uses a buffer argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only read.
    Read,
    /// Only written (every byte of the view may be overwritten).
    Write,
    /// Read and written in place.
    ReadWrite,
}

impl Access {
    /// Whether the dispatch reads the argument.
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether the dispatch writes the argument.
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// A scalar kernel argument, fixed at record time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// Unsigned 32-bit.
    U32(u32),
    /// Signed 32-bit.
    I32(i32),
    /// 32-bit float.
    F32(f32),
}

/// What kind of operation a dispatch performs. Passes use it instead of kernel names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// Matrix (or matrix-vector) product.
    MatMul,
    /// Expert-routed matrix product.
    MatMulId,
    /// RMS normalization (with or without weight).
    RmsNorm,
    /// RMS normalization fused with a following multiply.
    RmsNormMul,
    /// RMS normalization fused with the in-place add of its output into an accumulator.
    RmsNormAdd,
    /// Rotary position embedding.
    Rope,
    /// Per-head RMS normalization fused with the RoPE that follows it.
    RmsNormRope,
    /// Elementwise addition.
    Add,
    /// Elementwise multiplication.
    Mul,
    /// Other elementwise ops: scale, activations, softcap, SwiGLU.
    Elementwise,
    /// Copies and dtype conversions.
    Copy,
    /// Writes of new rows into a KV cache.
    KvWrite,
    /// Embedding lookups and other gathers.
    Gather,
    /// Softmax over rows.
    Softmax,
    /// Attention (prefill or decode).
    Attention,
    /// Reductions that pick an index (argmax, the sampled draw).
    Argmax,
    /// A user kernel; `reorderable` is the user's declaration.
    Custom {
        /// Whether the optimizer may move it.
        reorderable: bool,
    },
}

impl OpKind {
    /// Whether the reorder pass may move dispatches of this kind. Attention, softmax and argmax
    /// stay in place (as in the seeds); everything else is a pure function of its declared ranges.
    pub fn is_reorderable(self) -> bool {
        match self {
            OpKind::Attention | OpKind::Softmax | OpKind::Argmax => false,
            OpKind::Custom { reorderable } => reorderable,
            _ => true,
        }
    }

    /// Number of distinct values ([`code`](Self::code) is below it).
    pub(crate) const CODES: usize = 18;

    /// A distinct small number per value, below [`CODES`](Self::CODES), for tables keyed by op
    /// kind.
    #[inline]
    pub(crate) fn code(self) -> usize {
        match self {
            OpKind::MatMul => 0,
            OpKind::MatMulId => 1,
            OpKind::RmsNorm => 2,
            OpKind::RmsNormMul => 3,
            OpKind::RmsNormAdd => 4,
            OpKind::Rope => 5,
            OpKind::Add => 6,
            OpKind::Mul => 7,
            OpKind::Elementwise => 8,
            OpKind::Copy => 9,
            OpKind::KvWrite => 10,
            OpKind::Gather => 11,
            OpKind::Softmax => 12,
            OpKind::Attention => 13,
            OpKind::Argmax => 14,
            OpKind::Custom { reorderable: false } => 15,
            OpKind::Custom { reorderable: true } => 16,
            OpKind::RmsNormRope => 17,
        }
    }

    /// A short lowercase name for reports and traces.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::MatMul => "matmul",
            OpKind::MatMulId => "matmul_id",
            OpKind::RmsNorm => "rms_norm",
            OpKind::RmsNormMul => "rms_norm_mul",
            OpKind::RmsNormAdd => "rms_norm_add",
            OpKind::Rope => "rope",
            OpKind::RmsNormRope => "rms_norm_rope",
            OpKind::Add => "add",
            OpKind::Mul => "mul",
            OpKind::Elementwise => "elementwise",
            OpKind::Copy => "copy",
            OpKind::KvWrite => "kv_write",
            OpKind::Gather => "gather",
            OpKind::Softmax => "softmax",
            OpKind::Attention => "attention",
            OpKind::Argmax => "argmax",
            OpKind::Custom { .. } => "custom",
        }
    }
}
