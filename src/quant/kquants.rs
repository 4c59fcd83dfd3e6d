//! The 256-value GGML "K" super-block formats Q4_K and Q6_K: layouts bit-exact with GGML's, a
//! simple round-to-nearest quantizer (no search) and dequantization.

use bytemuck::{Pod, Zeroable};

use super::ggml::{f16_bits_to_f32, f32_to_f16_bits};

/// Values in one super-block.
pub const QK_K: usize = 256;

/// GGML Q4_K: eight sub-blocks of 32 values, `x = d * sc[j] * q - dmin * m[j]` with 6-bit `sc`
/// and `m` packed into 12 bytes and 4-bit `q`. Sub-block `2i` is the low nibbles of
/// `qs[32i..32i + 32]`, sub-block `2i + 1` their high nibbles.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the sub-block scales, IEEE half.
    pub d: [u8; 2],
    /// Super-block scale of the sub-block minimums, IEEE half.
    pub dmin: [u8; 2],
    /// Packed 6-bit sub-block scales and minimums.
    pub scales: [u8; 12],
    /// Packed 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

/// GGML Q6_K: sixteen sub-blocks of 16 values, `x = d * sc[j] * (q - 32)` with 6-bit `q` split
/// into a low nibble (`ql`) and two high bits (`qh`), and signed 8-bit `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Signed sub-block scales.
    pub scales: [u8; QK_K / 16],
    /// Super-block scale, IEEE half.
    pub d: [u8; 2],
}

/// Unpacks the 6-bit scale and minimum of Q4_K sub-block `j` (0..8).
#[inline(always)]
pub fn q4k_scale_min(scales: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// Packs eight 6-bit scales and minimums into Q4_K's 12 bytes (the inverse of [`q4k_scale_min`]).
fn q4k_pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    s
}

impl BlockQ4K {
    /// Writes the super-block's 256 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_bits_to_f32(self.d);
        let dmin = f16_bits_to_f32(self.dmin);
        for i in 0..4 {
            let q = &self.qs[32 * i..32 * i + 32];
            for half in 0..2 {
                let j = 2 * i + half;
                let (sc, m) = q4k_scale_min(&self.scales, j);
                let d1 = d * sc as f32;
                let m1 = dmin * m as f32;
                let shift = 4 * half;
                for (l, &b) in q.iter().enumerate() {
                    out[32 * j + l] = d1 * ((b >> shift) & 0x0F) as f32 - m1;
                }
            }
        }
    }

    /// Quantizes 256 values: each sub-block gets the scale `(max - min) / 15` and offset `-min`
    /// (with `min <= 0`), rounded up onto the 6-bit grids of `d` and `dmin` so the sub-block's
    /// range stays covered, then `q = round((x + m) / s)` clamped to `0..=15`.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut want_scale = [0f32; 8];
        let mut want_min = [0f32; 8];
        for j in 0..8 {
            let sub = &x[32 * j..32 * j + 32];
            let min = sub.iter().copied().fold(0.0f32, f32::min);
            let max = sub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            want_scale[j] = (max - min) / 15.0;
            want_min[j] = -min;
        }
        let d = f16_round(want_scale.iter().copied().fold(0.0, f32::max) / 63.0);
        let dmin = f16_round(want_min.iter().copied().fold(0.0, f32::max) / 63.0);
        let mut sc = [0u8; 8];
        let mut m = [0u8; 8];
        for j in 0..8 {
            sc[j] = grid_up(want_scale[j], d, 63) as u8;
            m[j] = grid_up(want_min[j], dmin, 63) as u8;
        }
        let mut qs = [0u8; QK_K / 2];
        for j in 0..8 {
            let s = d * sc[j] as f32;
            let off = dmin * m[j] as f32;
            let inv = if s != 0.0 { 1.0 / s } else { 0.0 };
            let (i, shift) = (j / 2, 4 * (j % 2));
            for l in 0..32 {
                let q = ((x[32 * j + l] + off) * inv).round().clamp(0.0, 15.0) as u8;
                qs[32 * i + l] |= q << shift;
            }
        }
        BlockQ4K {
            d: f32_to_f16_bits(d),
            dmin: f32_to_f16_bits(dmin),
            scales: q4k_pack_scales(&sc, &m),
            qs,
        }
    }
}

impl BlockQ6K {
    /// The 6-bit quant (0..64, before subtracting 32) of value `i` (0..256).
    #[inline(always)]
    pub fn quant(&self, i: usize) -> u8 {
        let (h, r) = (i / 128, i % 128);
        let (quarter, l) = (r / 32, r % 32);
        let lo_byte = self.ql[64 * h + 32 * (quarter % 2) + l];
        let lo = if quarter < 2 {
            lo_byte & 0x0F
        } else {
            lo_byte >> 4
        };
        let hi = (self.qh[32 * h + l] >> (2 * quarter)) & 3;
        lo | (hi << 4)
    }

    /// Writes the super-block's 256 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_bits_to_f32(self.d);
        for h in 0..2 {
            for l in 0..32 {
                let qh = self.qh[32 * h + l];
                let a = self.ql[64 * h + l];
                let b = self.ql[64 * h + 32 + l];
                let q = [
                    (a & 0x0F) | ((qh & 3) << 4),
                    (b & 0x0F) | (((qh >> 2) & 3) << 4),
                    (a >> 4) | (((qh >> 4) & 3) << 4),
                    (b >> 4) | (((qh >> 6) & 3) << 4),
                ];
                for (quarter, &qv) in q.iter().enumerate() {
                    let i = 128 * h + 32 * quarter + l;
                    let sc = self.scales[i / 16] as i8 as f32;
                    out[i] = d * sc * (qv as i32 - 32) as f32;
                }
            }
        }
    }

    /// Quantizes 256 values: each 16-value sub-block gets the scale `amax / 31`, rounded up onto
    /// the signed 8-bit grid of `d = max scale / 127`, then `q = round(x / s)` clamped to
    /// `-32..=31`.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut want = [0f32; 16];
        for (j, w) in want.iter_mut().enumerate() {
            *w = x[16 * j..16 * j + 16]
                .iter()
                .fold(0.0f32, |a, v| a.max(v.abs()))
                / 31.0;
        }
        let d = f16_round(want.iter().copied().fold(0.0, f32::max) / 127.0);
        let mut blk = BlockQ6K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: [0; QK_K / 16],
            d: f32_to_f16_bits(d),
        };
        for (sc, &w) in blk.scales.iter_mut().zip(&want) {
            *sc = grid_up(w, d, 127) as i8 as u8;
        }
        for (i, &v) in x.iter().enumerate() {
            let s = d * blk.scales[i / 16] as i8 as f32;
            let inv = if s != 0.0 { 1.0 / s } else { 0.0 };
            let q = ((v * inv).round().clamp(-32.0, 31.0) as i32 + 32) as u8;
            let (h, r) = (i / 128, i % 128);
            let (quarter, l) = (r / 32, r % 32);
            let lo_idx = 64 * h + 32 * (quarter % 2) + l;
            blk.ql[lo_idx] |= if quarter < 2 {
                q & 0x0F
            } else {
                (q & 0x0F) << 4
            };
            blk.qh[32 * h + l] |= (q >> 4) << (2 * quarter);
        }
        blk
    }
}

/// The value after rounding to IEEE half and back.
fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// The smallest integer `k <= limit` with `k * step >= want` (0 when `step` is 0).
fn grid_up(want: f32, step: f32, limit: u32) -> u32 {
    if step <= 0.0 || want <= 0.0 {
        return 0;
    }
    let mut k = (want / step).ceil().min(limit as f32) as u32;
    while k < limit && (k as f32) * step < want {
        k += 1;
    }
    k
}
