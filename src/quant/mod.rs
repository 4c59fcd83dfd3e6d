//! Quantized weight formats: GGML block layouts and the MLX affine format, with host
//! quantization and dequantization.
//!
//! [`dequantize`] and [`quantize`] cover every weight dtype (the float types too, as plain
//! conversions), so tests and the synthetic-model writer can treat all formats alike.
//! [`dequantize_into`] is the allocation-free form the CPU kernels use on one row at a time.

pub mod affine;
pub mod ggml;
pub mod kquants;

pub use affine::{dequantize_affine_row, quantize_affine, AffineMatrix, AffineParams};
pub use ggml::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, QK};
pub use kquants::{BlockQ4K, BlockQ6K, QK_K};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Whether `dtype` is a weight format [`dequantize`] understands.
pub const fn is_weight_dtype(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q8_0
            | DType::Q4K
            | DType::Q6K
    )
}

fn unsupported(dtype: DType) -> Error {
    Error::Unsupported(format!("{dtype} is not a weight format"))
}

/// Dequantizes `bytes` of `dtype` into `out`, which must hold exactly the values the bytes encode.
pub fn dequantize_into(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    if !is_weight_dtype(dtype) {
        return Err(unsupported(dtype));
    }
    if dtype.bytes_for(out.len()) != Some(bytes.len()) {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of {dtype} do not encode {} values",
            bytes.len(),
            out.len()
        )));
    }
    dequantize_unchecked(dtype, bytes, out);
    Ok(())
}

/// [`dequantize_into`] without the checks; the caller guarantees that `bytes` encodes exactly
/// `out.len()` values of `dtype` and that `dtype` is a weight format (else `out` is left as is).
#[inline]
pub(crate) fn dequantize_unchecked(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::Q4_0 => blocks::<BlockQ4_0, QK>(bytes, out, BlockQ4_0::dequantize),
        DType::Q4_1 => blocks::<BlockQ4_1, QK>(bytes, out, BlockQ4_1::dequantize),
        DType::Q5_0 => blocks::<BlockQ5_0, QK>(bytes, out, BlockQ5_0::dequantize),
        DType::Q8_0 => blocks::<BlockQ8_0, QK>(bytes, out, BlockQ8_0::dequantize),
        DType::Q4K => blocks::<BlockQ4K, QK_K>(bytes, out, BlockQ4K::dequantize),
        DType::Q6K => blocks::<BlockQ6K, QK_K>(bytes, out, BlockQ6K::dequantize),
        DType::I32 | DType::U32 | DType::U8 => {}
    }
}

#[inline(always)]
fn blocks<B: bytemuck::Pod, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    f: fn(&B, &mut [f32; N]),
) {
    let blocks: &[B] = bytemuck::cast_slice(bytes);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(N)) {
        if let Ok(o) = <&mut [f32; N]>::try_from(o) {
            f(b, o);
        }
    }
}

/// Dequantizes `bytes` of `dtype` (a whole number of blocks) into f32 values.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    if !is_weight_dtype(dtype) {
        return Err(unsupported(dtype));
    }
    if !bytes.len().is_multiple_of(dtype.block_bytes()) {
        return Err(Error::InvalidArgument(format!(
            "{} bytes are not a whole number of {dtype} blocks of {} bytes",
            bytes.len(),
            dtype.block_bytes()
        )));
    }
    let mut out = vec![0f32; bytes.len() / dtype.block_bytes() * dtype.block_elems()];
    dequantize_unchecked(dtype, bytes, &mut out);
    Ok(out)
}

/// Quantizes f32 values (a whole number of blocks) into `dtype`'s bytes: round to nearest as
/// GGML's reference quantizers do for Q4_0, Q4_1, Q5_0 and Q8_0 (bit-exact with them), a simpler
/// search-free quantizer for Q4_K and Q6_K, plain conversion for the float types.
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    if !is_weight_dtype(dtype) {
        return Err(unsupported(dtype));
    }
    if !values.len().is_multiple_of(dtype.block_elems()) {
        return Err(Error::InvalidArgument(format!(
            "{} values are not a whole number of {dtype} blocks of {}",
            values.len(),
            dtype.block_elems()
        )));
    }
    fn each<B: bytemuck::Pod, const N: usize>(values: &[f32], f: fn(&[f32; N]) -> B) -> Vec<u8> {
        let mut out = Vec::with_capacity(values.len() / N * std::mem::size_of::<B>());
        for chunk in values.chunks_exact(N) {
            if let Ok(c) = <&[f32; N]>::try_from(chunk) {
                out.extend_from_slice(bytemuck::bytes_of(&f(c)));
            }
        }
        out
    }
    Ok(match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::Q4_0 => each::<BlockQ4_0, QK>(values, BlockQ4_0::quantize),
        DType::Q4_1 => each::<BlockQ4_1, QK>(values, BlockQ4_1::quantize),
        DType::Q5_0 => each::<BlockQ5_0, QK>(values, BlockQ5_0::quantize),
        DType::Q8_0 => each::<BlockQ8_0, QK>(values, BlockQ8_0::quantize),
        DType::Q4K => each::<BlockQ4K, QK_K>(values, BlockQ4K::quantize),
        DType::Q6K => each::<BlockQ6K, QK_K>(values, BlockQ6K::quantize),
        DType::I32 | DType::U32 | DType::U8 => return Err(unsupported(dtype)),
    })
}

#[cfg(test)]
mod tests;
