//! The 32-value GGML block formats Q4_0, Q4_1, Q5_0 and Q8_0: layouts bit-exact with GGML's, host
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

/// GGML Q5_0: `x = d * (q - 16)` with 5-bit `q`: the low four bits packed as in Q4_0, the fifth
/// bit of value `j` in bit `j` of the little-endian word `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale, IEEE half.
    pub d: [u8; 2],
    /// The fifth bits, one per value (a little-endian u32).
    pub qh: [u8; 4],
    /// Packed low four bits of the quants.
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

impl BlockQ5_0 {
    /// The block's 32 quants less 16 (`q - 16`, in `-16..16`), in value order.
    #[inline]
    pub fn signed_quants(&self) -> [i8; QK] {
        // The fifth bits as 0x10 bytes, eight values per byte of `qh` (a table lookup each).
        let mut high = [0u8; QK];
        for (h, &byte) in high.chunks_exact_mut(8).zip(&self.qh) {
            h.copy_from_slice(&FIFTH_BITS[byte as usize].to_le_bytes());
        }
        let mut q = [0i8; QK];
        for j in 0..QK / 2 {
            let b = self.qs[j];
            q[j] = ((b & 0x0F) | high[j]) as i8 - 16;
            q[j + QK / 2] = ((b >> 4) | high[j + QK / 2]) as i8 - 16;
        }
        q
    }

    /// Writes the block's 32 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK]) {
        let d = f16_bits_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.signed_quants()) {
            *o = d * q as f32;
        }
    }

    /// Quantizes 32 values as GGML's reference does: `d = v / -16` where `v` is the value of
    /// largest magnitude, `q = min(31, trunc(x / d + 16.5))`.
    pub fn quantize(x: &[f32; QK]) -> Self {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; QK / 2];
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let lo = quant5((x[j] * id + 16.5).trunc());
            let hi = quant5((x[j + QK / 2] * id + 16.5).trunc());
            qs[j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            qh |= u32::from(lo >> 4) << j;
            qh |= u32::from(hi >> 4) << (j + QK / 2);
        }
        BlockQ5_0 {
            d: f32_to_f16_bits(d),
            qh: qh.to_le_bytes(),
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

/// Byte `b` of a Q5_0 block's `qh` spread over eight bytes (little-endian): byte `i` is `0x10`
/// where bit `i` of `b` is set, else 0.
const FIFTH_BITS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            if (b >> i) & 1 == 1 {
                table[b] |= 0x10 << (8 * i);
            }
            i += 1;
        }
        b += 1;
    }
    table
};

/// Clamps a truncated quant to `0..=31` (GGML's `MIN(31, ...)` with the cast's saturation at 0).
#[inline]
fn quant5(v: f32) -> u8 {
    v.clamp(0.0, 31.0) as u8
}
