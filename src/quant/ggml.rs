//! The 32-value GGML block formats Q4_0, Q4_1 and Q8_0: layouts bit-exact with GGML's, host
//! quantization (round to nearest as GGML's reference quantizer does) and dequantization.
//!
//! Every struct is `#[repr(C)]` with byte-array fields only, so its alignment is 1 and a slice of
//! blocks can be viewed in place from any byte slice of the right length (a mapped model file, say).

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Values in one block of the 32-value formats.
pub const QK: usize = 32;

/// Reads a little-endian IEEE half stored as two bytes.
#[inline(always)]
pub fn f16_bits_to_f32(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Rounds an f32 to the nearest IEEE half and returns its two little-endian bytes.
#[inline]
pub fn f32_to_f16_bits(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// GGML Q4_0: `x = d * (q - 8)`; value `j` is the low nibble of `qs[j]`, value `j + 16` its high
/// nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Packed 4-bit quants.
    pub qs: [u8; QK / 2],
}

/// GGML Q4_1: `x = d * q + m`, nibbles packed as in Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Minimum (offset), IEEE half.
    pub m: [u8; 2],
    /// Packed 4-bit quants.
    pub qs: [u8; QK / 2],
}

/// GGML Q8_0: `x = d * q` with signed 8-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// Signed quants, stored as bytes.
    pub qs: [u8; QK],
}

impl BlockQ4_0 {
    /// Writes the block's 32 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK]) {
        let d = f16_bits_to_f32(self.d);
        for (j, &b) in self.qs.iter().enumerate() {
            out[j] = d * ((b & 0x0F) as i32 - 8) as f32;
            out[j + QK / 2] = d * ((b >> 4) as i32 - 8) as f32;
        }
    }

    /// Quantizes 32 values as GGML's reference does: `d = v / -8` where `v` is the value of largest
    /// magnitude, `q = min(15, trunc(x / d + 8.5))`.
    pub fn quantize(x: &[f32; QK]) -> Self {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            let lo = nibble((x[j] * id + 8.5).trunc());
            let hi = nibble((x[j + QK / 2] * id + 8.5).trunc());
            qs[j] = lo | (hi << 4);
        }
        BlockQ4_0 {
            d: f32_to_f16_bits(d),
            qs,
        }
    }
}

impl BlockQ4_1 {
    /// Writes the block's 32 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK]) {
        let d = f16_bits_to_f32(self.d);
        let m = f16_bits_to_f32(self.m);
        for (j, &b) in self.qs.iter().enumerate() {
            out[j] = d * (b & 0x0F) as f32 + m;
            out[j + QK / 2] = d * (b >> 4) as f32 + m;
        }
    }

    /// Quantizes 32 values as GGML's reference does: `d = (max - min) / 15`, `m = min`,
    /// `q = min(15, trunc((x - min) / d + 0.5))`.
    pub fn quantize(x: &[f32; QK]) -> Self {
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            let lo = nibble(((x[j] - min) * id + 0.5).trunc());
            let hi = nibble(((x[j + QK / 2] - min) * id + 0.5).trunc());
            qs[j] = lo | (hi << 4);
        }
        BlockQ4_1 {
            d: f32_to_f16_bits(d),
            m: f32_to_f16_bits(min),
            qs,
        }
    }
}

impl BlockQ8_0 {
    /// Writes the block's 32 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK]) {
        let d = f16_bits_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as i8 as f32 * d;
        }
    }

    /// Quantizes 32 values as GGML's reference does: `d = amax / 127`, `q = round(x / d)` (half
    /// away from zero).
    pub fn quantize(x: &[f32; QK]) -> Self {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = ((v * id).round().clamp(-128.0, 127.0) as i8) as u8;
        }
        BlockQ8_0 {
            d: f32_to_f16_bits(d),
            qs,
        }
    }
}

/// Clamps a truncated quant to `0..=15` (GGML's `MIN(15, ...)` with the cast's saturation at 0).
#[inline]
fn nibble(v: f32) -> u8 {
    v.clamp(0.0, 15.0) as u8
}
