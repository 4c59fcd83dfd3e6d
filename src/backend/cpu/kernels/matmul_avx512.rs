//! AVX-512 forms of the hottest matrix-product loops: the fused dequantize-and-dot of Q4_0, Q4_1,
//! Q5_0 and Q8_0 rows (one 32-value block is two 16-lane vectors, half the shuffles and
//! conversions of the AVX2 form) and a 12-row micro-kernel over the packed 16-column tile. Other
//! formats use the AVX2 loops (this CPU has both).
//!
//! The AVX-512 intrinsics are stable since Rust 1.89, the crate's `rust-version`.
//!
//! The bounds of every load here follow from the slices alone, as in the AVX2 loops: the dot
//! products zip whole blocks with whole 32-value chunks of `x`, and the micro-kernel's sizes are
//! asserted by its safe caller (`matmul_simd::micro_kernel`). The only thing the AVX-512 forms
//! add to their callers' obligations is the CPU features.

use std::arch::x86_64::*;

use super::avx2::q5_quants;
use super::{MR, NR};
use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, QK};

/// Sixteen unsigned bytes as f32 lanes.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
fn u8x16(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
}

/// Sixteen signed bytes as f32 lanes.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
fn i8x16(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
}

/// Blocks whose f16 scales are converted together (one 16-lane conversion).
const GROUP: usize = 16;

/// Converts the f16 scales `f(block)` of up to [`GROUP`] blocks to f32 in one vector conversion,
/// so the block loop broadcasts them from memory (a load, not a shuffle-port conversion per
/// block).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
fn scales_f32<B>(blocks: &[B], f: impl Fn(&B) -> [u8; 2]) -> [f32; GROUP] {
    let mut bits = [0u16; GROUP];
    for (o, b) in bits.iter_mut().zip(blocks) {
        *o = u16::from_le_bytes(f(b));
    }
    let mut out = [0f32; GROUP];
    // SAFETY: both arrays hold 16 elements; unaligned load and store.
    unsafe {
        let v = _mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr() as *const __m256i));
        _mm512_storeu_ps(out.as_mut_ptr(), v);
    }
    out
}

/// `sum_b d_b * sum_j x_j q_j + m_b * sum_j x_j` over the Q4_1 blocks of one row (as many blocks
/// as both `blocks` and `x` cover; the kernels pass `32 * blocks.len()` values).
///
/// # Safety
/// The CPU must support avx512f, avx2, fma and f16c. Nothing is required of the lengths: each
/// iteration loads one block's 16 quant bytes and one `chunks_exact(QK)` chunk of `x`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_1(blocks: &[BlockQ4_1], x: &[f32]) -> f32 {
    let mask = _mm_set1_epi8(0x0F);
    let mut acc_d = _mm512_setzero_ps();
    let mut acc_m = _mm512_setzero_ps();
    for (group, xg) in blocks.chunks(GROUP).zip(x.chunks(GROUP * QK)) {
        let ds = scales_f32(group, |b| b.d);
        let ms = scales_f32(group, |b| b.m);
        for (i, (b, xb)) in group.iter().zip(xg.chunks_exact(QK)).enumerate() {
            // SAFETY: `qs` is 16 bytes and `xb` 32 values; unaligned loads.
            let (q, x0, x1) = unsafe {
                (
                    _mm_loadu_si128(b.qs.as_ptr() as *const __m128i),
                    _mm512_loadu_ps(xb.as_ptr()),
                    _mm512_loadu_ps(xb.as_ptr().add(16)),
                )
            };
            let lo = u8x16(_mm_and_si128(q, mask));
            let hi = u8x16(_mm_and_si128(_mm_srli_epi16(q, 4), mask));
            let p = _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0));
            acc_d = _mm512_fmadd_ps(_mm512_set1_ps(ds[i]), p, acc_d);
            acc_m = _mm512_fmadd_ps(_mm512_set1_ps(ms[i]), _mm512_add_ps(x0, x1), acc_m);
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc_d, acc_m))
}

/// `sum_b d_b * sum_j x_j (q_j - 8)` over the Q4_0 blocks of one row (as [`dot_q4_1`]).
///
/// # Safety
/// As for [`dot_q4_1`]: the CPU features only.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_0(blocks: &[BlockQ4_0], x: &[f32]) -> f32 {
    let mask = _mm_set1_epi8(0x0F);
    let eight = _mm_set1_epi8(8);
    let mut acc = _mm512_setzero_ps();
    for (group, xg) in blocks.chunks(GROUP).zip(x.chunks(GROUP * QK)) {
        let ds = scales_f32(group, |b| b.d);
        for (i, (b, xb)) in group.iter().zip(xg.chunks_exact(QK)).enumerate() {
            // SAFETY: as in `dot_q4_1`.
            let (q, x0, x1) = unsafe {
                (
                    _mm_loadu_si128(b.qs.as_ptr() as *const __m128i),
                    _mm512_loadu_ps(xb.as_ptr()),
                    _mm512_loadu_ps(xb.as_ptr().add(16)),
                )
            };
            let lo = i8x16(_mm_sub_epi8(_mm_and_si128(q, mask), eight));
            let hi = i8x16(_mm_sub_epi8(
                _mm_and_si128(_mm_srli_epi16(q, 4), mask),
                eight,
            ));
            let p = _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(ds[i]), p, acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

/// `sum_b d_b * sum_j x_j (q_j - 16)` over the Q5_0 blocks of one row (as [`dot_q4_1`]), the
/// 5-bit quants unpacked as the AVX2 loop does.
///
/// # Safety
/// As for [`dot_q4_1`]: the CPU features only.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn dot_q5_0(blocks: &[BlockQ5_0], x: &[f32]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    for (group, xg) in blocks.chunks(GROUP).zip(x.chunks(GROUP * QK)) {
        let ds = scales_f32(group, |b| b.d);
        for (i, (b, xb)) in group.iter().zip(xg.chunks_exact(QK)).enumerate() {
            // SAFETY: `xb` is 32 values; unaligned loads.
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(xb.as_ptr()),
                    _mm512_loadu_ps(xb.as_ptr().add(16)),
                )
            };
            let (lo, hi) = q5_quants(b);
            let p = _mm512_fmadd_ps(i8x16(hi), x1, _mm512_mul_ps(i8x16(lo), x0));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(ds[i]), p, acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

/// `sum_b d_b * sum_j x_j q_j` over the Q8_0 blocks of one row (as [`dot_q4_1`]).
///
/// # Safety
/// As for [`dot_q4_1`]: the CPU features only.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn dot_q8_0(blocks: &[BlockQ8_0], x: &[f32]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    for (group, xg) in blocks.chunks(GROUP).zip(x.chunks(GROUP * QK)) {
        let ds = scales_f32(group, |b| b.d);
        for (i, (b, xb)) in group.iter().zip(xg.chunks_exact(QK)).enumerate() {
            // SAFETY: `qs` is 32 bytes and `xb` 32 values; unaligned loads.
            let (q0, q1, x0, x1) = unsafe {
                (
                    _mm_loadu_si128(b.qs.as_ptr() as *const __m128i),
                    _mm_loadu_si128(b.qs.as_ptr().add(16) as *const __m128i),
                    _mm512_loadu_ps(xb.as_ptr()),
                    _mm512_loadu_ps(xb.as_ptr().add(16)),
                )
            };
            let p = _mm512_fmadd_ps(i8x16(q1), x1, _mm512_mul_ps(i8x16(q0), x0));
            acc = _mm512_fmadd_ps(_mm512_set1_ps(ds[i]), p, acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

/// The AVX-512 micro-kernel: up to 12 rows times one 16-lane vector of columns.
///
/// # Safety
/// The CPU must support avx512f, avx2, fma and f16c; `m <= 12`, `b` holds `k * NR` values and
/// `a` (for `m > 0`) holds `(m - 1) * lda + k` values (`matmul_simd::micro_kernel` asserts all
/// three before it calls this).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn micro_kernel(
    a: &[f32],
    lda: usize,
    m: usize,
    b: &[f32],
    k: usize,
    c: &mut [[f32; NR]; MR],
) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match m {
            12 => tile::<12>(a, lda, b, k, c),
            11 => tile::<11>(a, lda, b, k, c),
            10 => tile::<10>(a, lda, b, k, c),
            9 => tile::<9>(a, lda, b, k, c),
            8 => tile::<8>(a, lda, b, k, c),
            7 => tile::<7>(a, lda, b, k, c),
            6 => tile::<6>(a, lda, b, k, c),
            5 => tile::<5>(a, lda, b, k, c),
            4 => tile::<4>(a, lda, b, k, c),
            3 => tile::<3>(a, lda, b, k, c),
            2 => tile::<2>(a, lda, b, k, c),
            1 => tile::<1>(a, lda, b, k, c),
            _ => {}
        }
    }
}

/// # Safety
/// As for [`micro_kernel`], with `M` rows.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn tile<const M: usize>(
    a: &[f32],
    lda: usize,
    b: &[f32],
    k: usize,
    c: &mut [[f32; NR]; MR],
) {
    // SAFETY: per the contract: `a[i * lda + p]` for `i < M`, `p < k` is below
    // `(M - 1) * lda + k`; `b` is read `NR` values at a time, `k` times; `c` has `MR >= M` rows
    // of `NR` (16) values.
    unsafe {
        let ap = a.as_ptr();
        let mut bp = b.as_ptr();
        let mut acc = [_mm512_setzero_ps(); M];
        for p in 0..k {
            let bv = _mm512_loadu_ps(bp);
            for (i, s) in acc.iter_mut().enumerate() {
                *s = _mm512_fmadd_ps(_mm512_set1_ps(*ap.add(i * lda + p)), bv, *s);
            }
            bp = bp.add(NR);
        }
        for (ci, s) in c.iter_mut().zip(acc) {
            _mm512_storeu_ps(ci.as_mut_ptr(), s);
        }
    }
}
