//! Integer matrix-vector products (decode) for Q4_1 and Q8_0 weights with AVX-512 VNNI.
//!
//! The activation row is quantized once per product into 22-bit integers per 32-value block
//! (`x ~= scale_b * xi`, `|xi| <= 2_000_000`), stored as three int8 parts
//! (`xi = 16384 * hi + 128 * mid + lo`), so every weight block is multiplied with three
//! `vpdpbusd` (unsigned weight bytes times signed activation bytes, four products summed per
//! 32-bit lane); `128 * mid + lo` is recombined exactly in 32-bit integers and the high part in
//! f32. The activation error is at most `scale_b / 2 = max|x_b| / 4e6` per value. (Int8 or 15-bit
//! activations are not enough: rms-normed hidden states have outlier dimensions, and with 15 bits
//! the LM-head logits of SmolLM2 moved by 2e-3.)
//!
//! Layouts of the quantized row (blocks padded with zeros to a multiple of [`SUPER`]):
//! - [`Layout::Q8`]: block `b`'s 32 halves contiguous (`hi[32 b + i]`), the order of a Q8_0 block.
//! - [`Layout::Q4`]: per group of four blocks, 64 bytes holding values 0..16 of each block, then
//!   64 bytes holding values 16..32, which is where the low and high nibbles of four Q4_1 blocks
//!   land after one dword permute.
//!
//! Per block the row also keeps `scale_b`, the float sum of its values (for the Q4_1 minimum
//! term) and, per part, `-128 * sum(part)` (the Q8_0 correction: its signed weights are made
//! unsigned by adding 128).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Values per quantization block (Q4_1, Q8_0 and the activation blocks).
pub(crate) const QK: usize = 32;
/// Blocks whose weight scales are converted together.
pub(crate) const SUPER: usize = 16;
/// Largest magnitude of a quantized activation (`127 * 16384 + 8192` is the most the parts hold).
const XMAX: f32 = 2_000_000.0;
/// Bytes of a Q4_1 block (d, m, 16 bytes of nibbles).
const Q4_1_BYTES: usize = 20;
/// Bytes of a Q8_0 block (d, 32 signed bytes).
const Q8_0_BYTES: usize = 34;

/// How the quantized values of a row are ordered (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Layout {
    /// Natural order, for Q8_0 weights.
    #[default]
    Q8,
    /// Grouped by nibble half, for Q4_1 weights.
    Q4,
}

/// One activation row quantized for the integer products.
#[derive(Debug, Default)]
pub(crate) struct QuantRow {
    layout: Layout,
    blocks: usize,
    hi: Vec<i8>,
    mid: Vec<i8>,
    lo: Vec<i8>,
    scale: Vec<f32>,
    sum: Vec<f32>,
    /// Q8 layout: per pair of blocks and part (hi, mid, lo), 16 lanes holding `-128 * sum` of the
    /// part's values of the first block in lane 0 and of the second in lane 8 (zeros elsewhere),
    /// the starting value of that pair's `vpdpbusd`.
    corr: Vec<i32>,
}

impl QuantRow {
    /// Quantizes `x` (a whole number of 32-value blocks) in `layout`, reusing this row's memory.
    pub(crate) fn quantize(&mut self, x: &[f32], layout: Layout) {
        let blocks = x.len() / QK;
        let padded = blocks.div_ceil(SUPER) * SUPER;
        self.layout = layout;
        self.blocks = blocks;
        for v in [&mut self.hi, &mut self.mid, &mut self.lo] {
            v.clear();
            v.resize(padded * QK, 0);
        }
        for v in [&mut self.scale, &mut self.sum] {
            v.clear();
            v.resize(padded, 0.0);
        }
        self.corr.clear();
        if layout == Layout::Q8 {
            self.corr.resize(padded / 2 * 3 * 16, 0);
        }
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            // Where values 0..16 and 16..32 of block `b` go.
            let (first, second) = match layout {
                Layout::Q8 => (b * QK, b * QK + 16),
                Layout::Q4 => {
                    let (g, j) = (b / 4, b % 4);
                    (g * 4 * QK + j * 16, g * 4 * QK + 64 + j * 16)
                }
            };
            #[cfg(target_arch = "x86_64")]
            let sums = if available() {
                // SAFETY: the features were detected; `xb` holds 32 values and both halves'
                // destinations lie inside the padded part arrays.
                unsafe { self.block_avx512(b, xb, first, second) }
            } else {
                self.block_portable(b, xb, first, second)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let sums = self.block_portable(b, xb, first, second);
            if layout == Layout::Q8 {
                for (i, s) in sums.iter().enumerate() {
                    self.corr[(b / 2 * 3 + i) * 16 + (b % 2) * 8] = -128 * s;
                }
            }
        }
    }

    /// Quantizes block `b` (`xb`), writing its values 0..16 at `first` and 16..32 at `second` of
    /// the part arrays and its scale and float sum; returns the sums of the three parts.
    fn block_portable(&mut self, b: usize, xb: &[f32], first: usize, second: usize) -> [i32; 3] {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let inv = if amax > 0.0 { XMAX / amax } else { 0.0 };
        let mut sums = [0i32; 3];
        for (i, &v) in xb.iter().enumerate() {
            let (h, m, l) = split((v * inv).round_ties_even() as i32);
            let pos = if i < 16 { first + i } else { second + i - 16 };
            self.hi[pos] = h;
            self.mid[pos] = m;
            self.lo[pos] = l;
            for (s, p) in sums.iter_mut().zip([h, m, l]) {
                *s += p as i32;
            }
        }
        self.scale[b] = amax / XMAX;
        self.sum[b] = xb.iter().sum();
        sums
    }

    /// [`QuantRow::block_portable`] with AVX-512 (the same rounding: to nearest, ties to even).
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW; `xb` holds 32 values; `first + 16` and `second + 16` are within
    /// the part arrays.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
    unsafe fn block_avx512(
        &mut self,
        b: usize,
        xb: &[f32],
        first: usize,
        second: usize,
    ) -> [i32; 3] {
        // SAFETY: per the contract above.
        unsafe {
            let x0 = _mm512_loadu_ps(xb.as_ptr());
            let x1 = _mm512_loadu_ps(xb.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            let inv = _mm512_set1_ps(if amax > 0.0 { XMAX / amax } else { 0.0 });
            let mut sums = [_mm512_setzero_si512(); 3];
            for (half, xv) in [(first, x0), (second, x1)] {
                let xi = _mm512_cvtps_epi32(_mm512_mul_ps(xv, inv));
                let h = _mm512_srai_epi32(_mm512_add_epi32(xi, _mm512_set1_epi32(8192)), 14);
                let r = _mm512_sub_epi32(xi, _mm512_slli_epi32(h, 14));
                let m = _mm512_srai_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(64)), 7);
                let l = _mm512_sub_epi32(r, _mm512_slli_epi32(m, 7));
                for (i, (part, arr)) in [(h, &mut self.hi), (m, &mut self.mid), (l, &mut self.lo)]
                    .into_iter()
                    .enumerate()
                {
                    _mm_storeu_si128(
                        arr.as_mut_ptr().add(half) as *mut __m128i,
                        _mm512_cvtepi32_epi8(part),
                    );
                    sums[i] = _mm512_add_epi32(sums[i], part);
                }
            }
            self.scale[b] = amax / XMAX;
            self.sum[b] = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
            sums.map(|v| _mm512_reduce_add_epi32(v))
        }
    }

    /// The value `i` as the integer products see it (`scale * xi`), for tests.
    #[cfg(test)]
    pub(crate) fn value(&self, i: usize) -> f64 {
        let (b, e) = (i / QK, i % QK);
        let pos = match self.layout {
            Layout::Q8 => i,
            Layout::Q4 => {
                let (g, j) = (b / 4, b % 4);
                g * 4 * QK
                    + if e < 16 {
                        j * 16 + e
                    } else {
                        64 + j * 16 + e - 16
                    }
            }
        };
        let xi = 16384 * self.hi[pos] as i32 + 128 * self.mid[pos] as i32 + self.lo[pos] as i32;
        self.scale[b] as f64 * xi as f64
    }
}

/// `xi = 16384 h + 128 m + l` with `|m|, |l| <= 64` and `|h| <= 127` for `|xi| <= XMAX`.
fn split(xi: i32) -> (i8, i8, i8) {
    let h = (xi + 8192).div_euclid(16384);
    let r = xi - 16384 * h;
    let m = (r + 64).div_euclid(128);
    let l = r - 128 * m;
    (h as i8, m as i8, l as i8)
}

/// Whether this CPU runs the integer products (AVX-512 F/BW/VNNI with F16C and FMA), detected
/// once.
pub(crate) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("f16c")
                && std::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether `w` is exactly `rows` rows of `blocks` blocks of `block_bytes` each (checked
/// arithmetic: a product that overflows never matches, so a short `w` cannot pass for a long one).
fn whole_rows(w: &[u8], rows: usize, blocks: usize, block_bytes: usize) -> bool {
    blocks
        .checked_mul(block_bytes)
        .and_then(|row| row.checked_mul(rows))
        == Some(w.len())
}

/// `out[o] = dot(W[o], x)` for `out.len()` consecutive rows of `row_bytes` bytes of Q4_1 weights
/// starting at `w`; `x` was quantized in [`Layout::Q4`] with as many blocks as a row holds.
/// Returns `false` (doing nothing) when the CPU lacks the instructions or the sizes disagree:
/// this check, not the caller's, is what the integer loops' bounds rest on.
pub(crate) fn rows_q4_1(w: &[u8], x: &QuantRow, out: &mut [f32]) -> bool {
    if !available() || x.layout != Layout::Q4 || !whole_rows(w, out.len(), x.blocks, Q4_1_BYTES) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the features were detected above; `w` is exactly `out.len()` rows of `x.blocks`
    // Q4_1 blocks (checked above, without overflow), and `x`'s arrays hold `x.blocks` rounded up
    // to whole super-blocks (`QuantRow::quantize` keeps them so; the fields are private).
    unsafe {
        q4_1_rows(w, x, out)
    };
    true
}

/// As [`rows_q4_1`] for Q8_0 weights and a row quantized in [`Layout::Q8`].
pub(crate) fn rows_q8_0(w: &[u8], x: &QuantRow, out: &mut [f32]) -> bool {
    if !available() || x.layout != Layout::Q8 || !whole_rows(w, out.len(), x.blocks, Q8_0_BYTES) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `rows_q4_1`, with Q8_0 blocks (and the correction array of the Q8 layout,
    // which `quantize` sizes for the padded blocks).
    unsafe {
        q8_0_rows(w, x, out)
    };
    true
}

/// Bytes ahead of the current row that each row's loop asks the prefetcher for.
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache lines of `len` bytes at `p + PREFETCH_AHEAD`, clamped to `end`.
///
/// # Safety
/// `base` points at a slice of `end` bytes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch(base: *const u8, from: usize, len: usize, end: usize) {
    let mut off = from + PREFETCH_AHEAD;
    let stop = (from + PREFETCH_AHEAD + len).min(end);
    while off < stop {
        // SAFETY: `off < end`, the length of the slice at `base`.
        unsafe { _mm_prefetch(base.add(off) as *const i8, _MM_HINT_T0) };
        off += 64;
    }
}

/// Lane `l` of the result takes dword `QIDX[l]` of (`a`, `b`): the 16 nibble bytes of each of
/// four consecutive Q4_1 blocks (dwords 1..5 of each 5-dword block) in its own 128-bit lane.
#[cfg(target_arch = "x86_64")]
const Q4_IDX: [i32; 16] = [1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 18, 19];

/// # Safety
/// The CPU supports the enabled features; `w` is exactly `out.len()` rows of `x.blocks` Q4_1
/// blocks, and `x` was quantized in [`Layout::Q4`] (its arrays padded to whole super-blocks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
unsafe fn q4_1_rows(w: &[u8], x: &QuantRow, out: &mut [f32]) {
    let nb = x.blocks;
    let row_bytes = nb * Q4_1_BYTES;
    let base = w.as_ptr();
    // SAFETY: row `r < out.len()` is bytes `r * row_bytes..(r + 1) * row_bytes` of `w` (the
    // contract). Within it, the gather reads blocks `b0..b0 + cnt` (`cnt <= nb - b0` lanes), the
    // full loads read four whole blocks `blk..blk + 4 <= b0 + cnt` (80 bytes), the masked load
    // only the remaining `cnt - 4g` blocks' bytes. The activation arrays are read at blocks
    // `blk..blk + 4 <= b0 + 16`, within the `nb` rounded up to 16 that `quantize` allocates.
    unsafe {
        let qidx = _mm512_loadu_si512(Q4_IDX.as_ptr() as *const _);
        let block_offsets = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(Q4_1_BYTES as i32),
        );
        let nib = _mm512_set1_epi8(0x0F);
        let (xh, xm, xl) = (x.hi.as_ptr(), x.mid.as_ptr(), x.lo.as_ptr());
        for (r, o) in out.iter_mut().enumerate() {
            let row = base.add(r * row_bytes);
            prefetch(base, r * row_bytes, row_bytes, w.len());
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm512_setzero_ps();
            let mut b0 = 0;
            while b0 < nb {
                let cnt = SUPER.min(nb - b0);
                let dm = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    lanes_below(cnt),
                    block_offsets,
                    row.add(b0 * Q4_1_BYTES) as *const _,
                );
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
                let s = _mm512_mul_ps(d, _mm512_loadu_ps(x.scale.as_ptr().add(b0)));
                acc_m = _mm512_fmadd_ps(m, _mm512_loadu_ps(x.sum.as_ptr().add(b0)), acc_m);
                let mut g = 0;
                while 4 * g < cnt {
                    let blk = b0 + 4 * g;
                    let p = row.add(blk * Q4_1_BYTES);
                    let (a, b) = if cnt - 4 * g >= 4 {
                        (
                            _mm512_loadu_si512(p as *const _),
                            _mm512_castsi128_si512(_mm_loadu_si128(p.add(64) as *const _)),
                        )
                    } else {
                        let bytes = (cnt - 4 * g) * Q4_1_BYTES;
                        (
                            _mm512_maskz_loadu_epi8((1u64 << bytes) - 1, p as *const _),
                            _mm512_setzero_si512(),
                        )
                    };
                    let q = _mm512_permutex2var_epi32(a, qidx, b);
                    let lo = _mm512_and_si512(q, nib);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
                    let xo = blk * QK;
                    let part = |xp: *const i8| {
                        let ld = |ptr: *const i8| _mm512_loadu_si512(ptr as *const _);
                        let first = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, ld(xp.add(xo)));
                        _mm512_dpbusd_epi32(first, hi, ld(xp.add(xo + 64)))
                    };
                    let sum = combine(part(xh), part(xm), part(xl));
                    let lane_scale = _mm512_permutexvar_ps(group_lanes(g), s);
                    acc = _mm512_fmadd_ps(lane_scale, sum, acc);
                    g += 1;
                }
                b0 += SUPER;
            }
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc, acc_m));
        }
    }
}

/// `16384 * hi + 128 * mid + lo` as f32 lanes: the low parts exactly in 32-bit integers, the
/// high part scaled in f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn combine(hi: __m512i, mid: __m512i, lo: __m512i) -> __m512 {
    let low = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(mid, 7), lo));
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_set1_ps(16384.0), low)
}

/// The mask of lanes `0..n` (`n <= 16`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes_below(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// Indices that spread scales `4g..4g+4` over four lanes each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn group_lanes(g: usize) -> __m512i {
    let b = 4 * g as i32;
    _mm512_set_epi32(
        b + 3,
        b + 3,
        b + 3,
        b + 3,
        b + 2,
        b + 2,
        b + 2,
        b + 2,
        b + 1,
        b + 1,
        b + 1,
        b + 1,
        b,
        b,
        b,
        b,
    )
}

/// Indices that spread scales `2p` and `2p + 1` over eight lanes each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn pair_lanes(p: usize) -> __m512i {
    let lo = _mm256_set1_epi32(2 * p as i32);
    let hi = _mm256_set1_epi32(2 * p as i32 + 1);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// # Safety
/// As for [`q4_1_rows`], with Q8_0 blocks and a row quantized in [`Layout::Q8`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
unsafe fn q8_0_rows(w: &[u8], x: &QuantRow, out: &mut [f32]) {
    let nb = x.blocks;
    let row_bytes = nb * Q8_0_BYTES;
    let base = w.as_ptr();
    // SAFETY: as in `q4_1_rows`: the gather reads the scales of blocks `b0..b0 + cnt` of row `r`,
    // each 32-byte load the quants of block `blk` or `blk + 1 < b0 + cnt` (at byte 2 of its 34),
    // and the activation and correction arrays are read at blocks below `b0 + 16`, inside the
    // padded arrays.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        let block_offsets = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(Q8_0_BYTES as i32),
        );
        let (xh, xm, xl) = (x.hi.as_ptr(), x.mid.as_ptr(), x.lo.as_ptr());
        for (r, o) in out.iter_mut().enumerate() {
            let row = base.add(r * row_bytes);
            prefetch(base, r * row_bytes, row_bytes, w.len());
            let mut acc = _mm512_setzero_ps();
            let mut b0 = 0;
            while b0 < nb {
                let cnt = SUPER.min(nb - b0);
                let dw = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    lanes_below(cnt),
                    block_offsets,
                    row.add(b0 * Q8_0_BYTES) as *const _,
                );
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw));
                let s = _mm512_mul_ps(d, _mm512_loadu_ps(x.scale.as_ptr().add(b0)));
                let mut pair = 0;
                while 2 * pair < cnt {
                    let blk = b0 + 2 * pair;
                    let p = row.add(blk * Q8_0_BYTES + 2);
                    let first = _mm512_castsi256_si512(_mm256_loadu_si256(p as *const _));
                    let wv = if cnt - 2 * pair >= 2 {
                        let second = _mm256_loadu_si256(p.add(Q8_0_BYTES) as *const _);
                        _mm512_inserti64x4(first, second, 1)
                    } else {
                        first
                    };
                    let wv = _mm512_xor_si512(wv, flip);
                    let xo = blk * QK;
                    let corr = x.corr.as_ptr().add(blk / 2 * 3 * 16);
                    let part = |xp: *const i8, i: usize| {
                        let start = _mm512_loadu_si512(corr.add(16 * i) as *const _);
                        _mm512_dpbusd_epi32(start, wv, _mm512_loadu_si512(xp.add(xo) as *const _))
                    };
                    let sum = combine(part(xh, 0), part(xm, 1), part(xl, 2));
                    let lane_scale = _mm512_permutexvar_ps(pair_lanes(pair), s);
                    acc = _mm512_fmadd_ps(lane_scale, sum, acc);
                    pair += 1;
                }
                b0 += SUPER;
            }
            *o = _mm512_reduce_add_ps(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against a float64 reference of the dequantized weights times the float activations.
    //! Tolerance per output: the activation rounding bound `sum_b 0.65 max|x_b| / 2e6 * sum_{i in b}
    //! |w_i|` (each value is off by at most 0.65 of a step of `max|x_b| / 2e6`: half a step of
    //! rounding plus the f32 rounding of `x / step`) plus `2e-6 * sum_i
    //! |x_i w_i|` for the f32 scaling and summation.

    use super::*;
    use crate::backend::DType;
    use crate::quant::{dequantize, quantize};
    use crate::testutil::random_f32;

    fn bound(x: &[f32], w: &[f32]) -> f64 {
        let mut b = 0f64;
        for (xb, wb) in x.chunks(QK).zip(w.chunks(QK)) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            let wsum: f64 = wb.iter().map(|v| v.abs() as f64).sum();
            let xw: f64 = xb.iter().zip(wb).map(|(a, b)| (a * b).abs() as f64).sum();
            b += amax / 2.0e6 * 0.65 * wsum + 2e-6 * xw;
        }
        b
    }

    fn check(dtype: DType, k: usize, n: usize, seed: u64, x: &[f32]) {
        let wf = random_f32(n * k, 0.5, seed + 1);
        let wb = quantize(dtype, &wf).expect("quantize");
        let wd = dequantize(dtype, &wb).expect("dequantize");
        let mut q = QuantRow::default();
        let layout = if dtype == DType::Q4_1 {
            Layout::Q4
        } else {
            Layout::Q8
        };
        q.quantize(x, layout);
        let mut out = vec![f32::NAN; n];
        let ran = if dtype == DType::Q4_1 {
            rows_q4_1(&wb, &q, &mut out)
        } else {
            rows_q8_0(&wb, &q, &mut out)
        };
        if !available() {
            assert!(!ran, "no VNNI: the path must decline");
            return;
        }
        assert!(ran, "{dtype} k {k} n {n}: the path declined");
        for o in 0..n {
            let row = &wd[o * k..(o + 1) * k];
            let want: f64 = row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let tol = bound(x, row);
            assert!(
                (out[o] as f64 - want).abs() <= tol,
                "{dtype} k {k} n {n} row {o}: got {} want {want} tol {tol:e}",
                out[o]
            );
        }
    }

    #[test]
    fn integer_rows_match_the_f64_reference_for_every_block_count() {
        // 1..5 blocks, one short of / exactly / one past a super-block, SmolLM2's 18 and 48.
        for blocks in [1, 2, 3, 4, 5, 7, 15, 16, 17, 18, 33, 48] {
            for (n, dtype) in [
                (1, DType::Q4_1),
                (19, DType::Q4_1),
                (1, DType::Q8_0),
                (19, DType::Q8_0),
            ] {
                let k = blocks * QK;
                let seed = (blocks * 131 + n) as u64;
                check(dtype, k, n, seed, &random_f32(k, 1.0, seed));
            }
        }
    }

    #[test]
    fn integer_rows_handle_zero_blocks_and_wide_ranges() {
        // A block of zeros (scale 0) next to blocks of very different magnitudes.
        let k = 5 * QK;
        let mut x = random_f32(k, 1.0, 77);
        x[QK..2 * QK].fill(0.0);
        x[2 * QK..3 * QK].iter_mut().for_each(|v| *v *= 1e-4);
        x[3 * QK..4 * QK].iter_mut().for_each(|v| *v *= 300.0);
        for dtype in [DType::Q4_1, DType::Q8_0] {
            check(dtype, k, 9, 78, &x);
        }
    }

    #[test]
    fn vector_and_portable_quantization_agree() {
        if !available() {
            return;
        }
        let x = random_f32(3 * QK, 2.0, 9);
        let mut a = QuantRow::default();
        a.quantize(&x, Layout::Q8);
        let mut b = QuantRow::default();
        b.quantize(&x, Layout::Q8);
        for (blk, xb) in x.chunks(QK).enumerate() {
            let sums = b.block_portable(blk, xb, blk * QK, blk * QK + 16);
            let want = [&b.hi, &b.mid, &b.lo].map(|p| {
                p[blk * QK..(blk + 1) * QK]
                    .iter()
                    .map(|&v| v as i32)
                    .sum::<i32>()
            });
            assert_eq!(sums, want, "block {blk}: part sums");
        }
        assert_eq!((&a.hi, &a.mid, &a.lo), (&b.hi, &b.mid, &b.lo));
        assert_eq!(a.scale, b.scale);
    }

    #[test]
    fn quantized_values_are_within_half_a_step() {
        let x = random_f32(7 * QK, 3.0, 5);
        for layout in [Layout::Q8, Layout::Q4] {
            let mut q = QuantRow::default();
            q.quantize(&x, layout);
            for (b, xb) in x.chunks(QK).enumerate() {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (i, &v) in xb.iter().enumerate() {
                    let got = q.value(b * QK + i);
                    // Half a step, plus the f32 rounding of `x / scale` (under 0.15 of a step).
                    assert!(
                        (got - v as f64).abs() <= amax as f64 / 2.0e6 * 0.65,
                        "{layout:?} value {}: {got} vs {v}",
                        b * QK + i
                    );
                }
            }
        }
    }
}
