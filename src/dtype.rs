//! Element types, including the GGML block formats.

/// The element type of a buffer. Block formats store `block_elems()` values in `block_bytes()` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
    /// Raw bytes (also used for MLX packed weights).
    U8,
    /// GGML Q4_0: 32 values, f16 scale + 16 bytes of 4-bit quants.
    Q4_0,
    /// GGML Q4_1: 32 values, f16 scale + f16 min + 16 bytes of 4-bit quants.
    Q4_1,
    /// GGML Q5_0: 32 values, f16 scale + 4 bytes of fifth bits + 16 bytes of low 4-bit quants.
    Q5_0,
    /// GGML Q8_0: 32 values, f16 scale + 32 signed bytes.
    Q8_0,
    /// GGML Q4_K: 256-value super-block with 6-bit sub-block scales and mins.
    Q4K,
    /// GGML Q6_K: 256-value super-block, 6-bit quants, 8-bit sub-block scales.
    Q6K,
}

impl DType {
    /// Values per block (1 for plain types).
    pub const fn block_elems(self) -> usize {
        match self {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 => 32,
            DType::Q4K | DType::Q6K => 256,
            _ => 1,
        }
    }

    /// Bytes per block (the element size for plain types).
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q8_0 => 34,
            DType::Q4K => 144,
            DType::Q6K => 210,
        }
    }

    /// Whether this is a GGML block format.
    pub const fn is_block(self) -> bool {
        self.block_elems() > 1
    }

    /// Whether this is a floating-point type (f32, f16, bf16).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Bytes needed to store `elems` values, or `None` when `elems` is not a whole number of blocks
    /// or the size overflows.
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        if !elems.is_multiple_of(self.block_elems()) {
            return None;
        }
        (elems / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Lowercase name as used in GGML and in kernel names (`f32`, `q4_1`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::U8 => "u8",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q8_0 => "q8_0",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Plain Rust types that map to a [`DType`]; used for typed upload and download.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml() {
        assert_eq!(DType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(DType::Q5_0.bytes_for(640), Some(440));
        assert_eq!(DType::Q5_0.bytes_for(48), None);
        assert_eq!(DType::Q6K.bytes_for(512), Some(420));
        assert_eq!(DType::Q8_0.bytes_for(33), None);
        assert_eq!(DType::F16.bytes_for(3), Some(6));
        assert!(DType::Q4K.is_block() && !DType::BF16.is_block());
    }
}
