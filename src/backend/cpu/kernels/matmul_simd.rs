//! SIMD inner loops of the matrix products: fused dequantize-and-dot for one weight row (the vector
//! form) and a register-blocked FMA micro-kernel over a packed f32 weight tile (the matrix form).
//!
//! Each loop has a portable scalar version and an AVX2+FMA version; [`Isa::detect`] picks one once
//! per process, and the tests run both and compare them. Weights are dequantized on the fly and all
//! sums are f32; activations are never quantized.
//!
//! Soundness does not depend on the caller: the safe entry points ([`dot_row`], [`dot_f32`],
//! [`micro_kernel`]) run an instruction set only where [`Isa::detect`] found it (an [`Isa`] above
//! the detected one is lowered to it), and every SIMD load of the dot products stays inside its
//! slices whatever their lengths (each loop runs over whole blocks of both operands, zipped, or to
//! the shorter length). The micro-kernel's reads depend on its sizes, which it asserts once per
//! call. The kernels check their buffers against their scalars before they get here
//! (`check.rs`), so these assertions never fire and a disagreement only ever means a wrong sum.

use std::sync::OnceLock;

use crate::backend::DType;
use crate::quant::{BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8_0, QK, QK_K};

/// Which instruction set the inner loops use, in increasing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// Portable Rust, no explicit SIMD.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// AVX2 as above plus AVX-512F (used for the hottest loops).
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports, detected once and cached.
    pub(crate) fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c")
                {
                    if std::is_x86_feature_detected!("avx512f") {
                        return Isa::Avx512;
                    }
                    return Isa::Avx2;
                }
            }
            Isa::Scalar
        })
    }
}

impl Isa {
    /// This instruction set where the CPU has it, else the best one it has: what the safe entry
    /// points actually run, so an `Isa` named by hand (a test) never runs missing instructions.
    #[inline]
    fn usable(self) -> Isa {
        self.min(Isa::detect())
    }

    /// Activation rows [`micro_kernel`] takes per call with this instruction set (at most [`MR`]).
    pub(crate) const fn rows_per_call(self) -> usize {
        match self {
            Isa::Avx512 => 12,
            _ => 6,
        }
    }
}

/// Output columns of one packed weight tile (the micro-kernel's width).
pub(crate) const NR: usize = 16;
/// The most activation rows of one micro-kernel call (for any instruction set).
pub(crate) const MR: usize = 12;

#[cfg(target_arch = "x86_64")]
#[path = "matmul_avx512.rs"]
mod avx512;

/// The whole blocks of `row` (a trailing partial block is left out, so this never panics: the
/// block types have alignment 1).
#[inline]
fn whole_blocks<B: bytemuck::Pod>(row: &[u8]) -> &[B] {
    let size = std::mem::size_of::<B>();
    bytemuck::cast_slice(&row[..row.len() - row.len() % size])
}

/// Dot product of activations `x` with one weight row stored as `row` bytes of `dtype`
/// (`x.len()` values). The kernels pass a `row` that encodes exactly `x.len()` values (checked up
/// front); should it not, the sum covers the shorter of the two and every access stays in bounds.
/// f32 rows need not be 4-byte aligned (a view may start anywhere). Formats without a fused loop
/// go through `scratch` (at least 256 values).
#[inline]
pub(crate) fn dot_row(isa: Isa, dtype: DType, row: &[u8], x: &[f32], scratch: &mut [f32]) -> f32 {
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returns `Isa::Avx512` only where `Isa::detect` found avx512f, avx2,
        // fma and f16c; the loops stay in bounds for any lengths (their contracts).
        Isa::Avx512 => unsafe {
            match dtype {
                DType::Q4_1 => avx512::dot_q4_1(whole_blocks(row), x),
                DType::Q4_0 => avx512::dot_q4_0(whole_blocks(row), x),
                DType::Q5_0 => avx512::dot_q5_0(whole_blocks(row), x),
                DType::Q8_0 => avx512::dot_q8_0(whole_blocks(row), x),
                _ => avx2::dot_row(dtype, row, x, scratch),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returns `Isa::Avx2` only where `Isa::detect` found avx2, fma and
        // f16c; the loops stay in bounds for any lengths (their contracts).
        Isa::Avx2 => unsafe { avx2::dot_row(dtype, row, x, scratch) },
        _ => dot_row_scalar(dtype, row, x, scratch),
    }
}

/// The portable form of [`dot_row`].
pub(crate) fn dot_row_scalar(dtype: DType, row: &[u8], x: &[f32], scratch: &mut [f32]) -> f32 {
    let mut sum = 0f32;
    match dtype {
        DType::Q4_0 => {
            let blocks: &[BlockQ4_0] = whole_blocks(row);
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let d = crate::quant::ggml::f16_bits_to_f32(b.d);
                let mut acc = 0f32;
                for j in 0..QK / 2 {
                    acc += xb[j] * ((b.qs[j] & 0x0F) as i32 - 8) as f32;
                    acc += xb[j + QK / 2] * ((b.qs[j] >> 4) as i32 - 8) as f32;
                }
                sum += d * acc;
            }
        }
        DType::Q5_0 => {
            let blocks: &[BlockQ5_0] = whole_blocks(row);
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let d = crate::quant::ggml::f16_bits_to_f32(b.d);
                let q = b.signed_quants();
                let mut acc = 0f32;
                for j in 0..QK / 2 {
                    acc += xb[j] * q[j] as f32;
                    acc += xb[j + QK / 2] * q[j + QK / 2] as f32;
                }
                sum += d * acc;
            }
        }
        DType::Q4_1 => {
            let blocks: &[BlockQ4_1] = whole_blocks(row);
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let d = crate::quant::ggml::f16_bits_to_f32(b.d);
                let m = crate::quant::ggml::f16_bits_to_f32(b.m);
                let (mut acc, mut xs) = (0f32, 0f32);
                for j in 0..QK / 2 {
                    acc += xb[j] * (b.qs[j] & 0x0F) as f32 + xb[j + QK / 2] * (b.qs[j] >> 4) as f32;
                    xs += xb[j] + xb[j + QK / 2];
                }
                sum += d * acc + m * xs;
            }
        }
        DType::Q8_0 => {
            let blocks: &[BlockQ8_0] = whole_blocks(row);
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let d = crate::quant::ggml::f16_bits_to_f32(b.d);
                let acc: f32 = b.qs.iter().zip(xb).map(|(&q, &v)| q as i8 as f32 * v).sum();
                sum += d * acc;
            }
        }
        DType::F32 => match bytemuck::try_cast_slice::<u8, f32>(row) {
            Ok(w) => sum = w.iter().zip(x).map(|(a, b)| a * b).sum(),
            Err(_) => sum = dot_dequantized(dtype, row, x, scratch),
        },
        _ => sum = dot_dequantized(dtype, row, x, scratch),
    }
    sum
}

/// [`dot_row`] by dequantizing a block (or 256 values) at a time into `scratch`, then a dot:
/// Q4_K, Q6_K, F16, BF16, and f32 rows that are not 4-byte aligned (read byte-wise).
fn dot_dequantized(dtype: DType, row: &[u8], x: &[f32], scratch: &mut [f32]) -> f32 {
    let per = if dtype.is_block() {
        dtype.block_elems()
    } else {
        256
    };
    let bytes_per = dtype.bytes_for(per).unwrap_or(0);
    let mut sum = 0f32;
    for (chunk, xb) in row.chunks(bytes_per.max(1)).zip(x.chunks(per)) {
        let tmp = &mut scratch[..xb.len()];
        // A whole block (or 256 values) but for the last chunk, which the kernels size alike;
        // a shorter one fills fewer values (the conversion zips), never reads past `chunk`.
        crate::quant::dequantize_unchecked(dtype, chunk, tmp);
        sum += tmp.iter().zip(xb).map(|(a, b)| a * b).sum::<f32>();
    }
    sum
}

/// Dot product of two f32 slices of equal length.
#[inline]
pub(crate) fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    match isa.usable() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returns `Isa::Avx2` or `Isa::Avx512` only where `Isa::detect` found
        // avx2 and fma; the loop runs to the shorter length (its contract).
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::dot_f32(a, b) },
        _ => a.iter().zip(b).map(|(x, y)| x * y).sum(),
    }
}

/// `c[i][j] = sum_p a[i * lda + p] * b[p * NR + j]` for `i < m` (`m <= MR`) and `j < NR`: one
/// micro-kernel call over a packed tile `b` of `k * NR` values and `m` activation rows `a` of
/// stride `lda`. Panics (once per call, not per element) unless `m` is at most the rows per call
/// of the instruction set that runs and `a` and `b` hold what it reads; the kernels' up-front
/// checks make sure it never does.
#[inline]
pub(crate) fn micro_kernel(
    isa: Isa,
    a: &[f32],
    lda: usize,
    m: usize,
    b: &[f32],
    k: usize,
    c: &mut [[f32; NR]; MR],
) {
    let isa = isa.usable();
    let a_need = match m {
        0 => Some(0),
        _ => (m - 1).checked_mul(lda).and_then(|v| v.checked_add(k)),
    };
    assert!(
        m <= isa.rows_per_call()
            && k.checked_mul(NR).is_some_and(|need| b.len() >= need)
            && a_need.is_some_and(|need| a.len() >= need),
        "micro_kernel: m = {m} rows of k = {k} (stride {lda}) do not fit a ({}) or b ({})",
        a.len(),
        b.len()
    );
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returns `Isa::Avx512` only where avx512f, avx2 and fma were detected;
        // `m <= 12`, `b` holds `k * NR` values and `a` `(m - 1) * lda + k` (asserted above).
        Isa::Avx512 => unsafe { avx512::micro_kernel(a, lda, m, b, k, c) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `usable` returns `Isa::Avx2` only where avx2 and fma were detected; `m <= 6`,
        // `b` holds `k * NR` values and `a` `(m - 1) * lda + k` (asserted above).
        Isa::Avx2 => unsafe { avx2::micro_kernel(a, lda, m, b, k, c) },
        _ => {
            for (i, ci) in c.iter_mut().enumerate().take(m) {
                *ci = [0.0; NR];
                let ai = &a[i * lda..i * lda + k];
                for (p, &av) in ai.iter().enumerate() {
                    let bp = &b[p * NR..p * NR + NR];
                    for j in 0..NR {
                        ci[j] += av * bp[j];
                    }
                }
            }
        }
    }
}

/// Dequantizes one Q4_K or Q6_K super-block into `out` (used by the AVX2 dot for these formats).
#[inline]
fn dequant_k_block(dtype: DType, block: &[u8], out: &mut [f32; QK_K]) {
    if dtype == DType::Q4K {
        bytemuck::from_bytes::<BlockQ4K>(block).dequantize(out);
    } else {
        bytemuck::from_bytes::<BlockQ6K>(block).dequantize(out);
    }
}

/// The AVX2 loops. Every `unsafe fn` here requires the CPU features its `target_feature` names
/// and nothing else, except the micro-kernel (sizes, see its contract): the dot products load
/// whole blocks of `row` zipped with whole 32-value chunks of `x`, or run to the shorter length,
/// so any slice lengths stay in bounds.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{dequant_k_block, whole_blocks, MR, NR};
    use crate::backend::DType;
    use crate::quant::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, QK, QK_K};

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
        _mm_cvtss_f32(s)
    }

    /// An IEEE half broadcast to eight f32 lanes. (Built from a full-register broadcast: a
    /// scalar insert would carry a false dependency on whatever register it merges into.)
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn splat_half(bits: [u8; 2]) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(bits)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn half(bits: [u8; 2]) -> f32 {
        _mm256_cvtss_f32(splat_half(bits))
    }

    /// The low eight unsigned bytes as f32 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn u8x8(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    }

    /// The low eight signed bytes as f32 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn i8x8(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
    }

    /// The fifth bits of a Q5_0 block (`qh`, little-endian) as bytes: `0x10` in byte `j` of the
    /// first vector where bit `j` is set, in byte `j` of the second where bit `16 + j` is.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn q5_fifth_bits(qh: [u8; 4]) -> (__m128i, __m128i) {
        let word = _mm_set1_epi32(i32::from_le_bytes(qh));
        // Byte e of each 8 selects bit e of the byte of qh it was given.
        let bits = _mm_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let sixteen = _mm_set1_epi8(0x10);
        // Bytes 0..8 take byte 0 of qh, 8..16 byte 1 (the second vector: bytes 2 and 3).
        let lo = _mm_shuffle_epi8(word, _mm_set_epi64x(0x0101_0101_0101_0101, 0));
        let hi = _mm_shuffle_epi8(
            word,
            _mm_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202),
        );
        let lo = _mm_cmpeq_epi8(_mm_and_si128(lo, bits), bits);
        let hi = _mm_cmpeq_epi8(_mm_and_si128(hi, bits), bits);
        (_mm_and_si128(lo, sixteen), _mm_and_si128(hi, sixteen))
    }

    /// The 32 signed quants `q - 16` of a Q5_0 block: values `0..16` in the first vector,
    /// `16..32` in the second.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn q5_quants(b: &BlockQ5_0) -> (__m128i, __m128i) {
        let mask = _mm_set1_epi8(0x0F);
        let sixteen = _mm_set1_epi8(16);
        // SAFETY: `qs` is 16 bytes; unaligned load.
        let q = unsafe { _mm_loadu_si128(b.qs.as_ptr() as *const __m128i) };
        let (h_lo, h_hi) = q5_fifth_bits(b.qh);
        let lo = _mm_or_si128(_mm_and_si128(q, mask), h_lo);
        let hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), mask), h_hi);
        (_mm_sub_epi8(lo, sixteen), _mm_sub_epi8(hi, sixteen))
    }

    /// [`super::dot_row`] with AVX2.
    ///
    /// # Safety
    /// The CPU supports avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_row(dtype: DType, row: &[u8], x: &[f32], scratch: &mut [f32]) -> f32 {
        // SAFETY: the features are this function's contract; the loops called stay inside their
        // slices for any lengths (the module documentation).
        unsafe {
            match dtype {
                DType::Q4_1 => dot_q4_1(whole_blocks(row), x),
                DType::Q4_0 => dot_q4_0(whole_blocks(row), x),
                DType::Q5_0 => dot_q5_0(whole_blocks(row), x),
                DType::Q8_0 => dot_q8_0(whole_blocks(row), x),
                DType::F32 => match bytemuck::try_cast_slice::<u8, f32>(row) {
                    Ok(w) => dot_f32(w, x),
                    // Not 4-byte aligned: read byte-wise.
                    Err(_) => super::dot_row_scalar(dtype, row, x, scratch),
                },
                DType::F16 => dot_f16(row, x),
                DType::Q4K | DType::Q6K => {
                    let mut sum = 0f32;
                    let bytes = dtype.block_bytes();
                    let mut tmp = [0f32; QK_K];
                    for (block, xb) in row.chunks_exact(bytes).zip(x.chunks_exact(QK_K)) {
                        dequant_k_block(dtype, block, &mut tmp);
                        sum += dot_f32(&tmp, xb);
                    }
                    sum
                }
                _ => super::dot_row_scalar(dtype, row, x, scratch),
            }
        }
    }

    /// # Safety
    /// The CPU supports avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q4_1(blocks: &[BlockQ4_1], x: &[f32]) -> f32 {
        // SAFETY: the features are this function's contract. Each iteration loads one block's
        // quants (inside `b`) and the 32 values of `xb` (a `chunks_exact(QK)` chunk of `x`).
        unsafe {
            let mask = _mm_set1_epi8(0x0F);
            let mut acc_d = _mm256_setzero_ps();
            let mut acc_m = _mm256_setzero_ps();
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let xp = xb.as_ptr();
                let q = _mm_loadu_si128(b.qs.as_ptr() as *const __m128i);
                let lo = _mm_and_si128(q, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                let x0 = _mm256_loadu_ps(xp);
                let x1 = _mm256_loadu_ps(xp.add(8));
                let x2 = _mm256_loadu_ps(xp.add(16));
                let x3 = _mm256_loadu_ps(xp.add(24));
                let mut p = _mm256_mul_ps(u8x8(lo), x0);
                p = _mm256_fmadd_ps(u8x8(_mm_srli_si128(lo, 8)), x1, p);
                p = _mm256_fmadd_ps(u8x8(hi), x2, p);
                p = _mm256_fmadd_ps(u8x8(_mm_srli_si128(hi, 8)), x3, p);
                let xs = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
                acc_d = _mm256_fmadd_ps(splat_half(b.d), p, acc_d);
                acc_m = _mm256_fmadd_ps(splat_half(b.m), xs, acc_m);
            }
            hsum(_mm256_add_ps(acc_d, acc_m))
        }
    }

    /// # Safety
    /// The CPU supports avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q4_0(blocks: &[BlockQ4_0], x: &[f32]) -> f32 {
        // SAFETY: the features are this function's contract. Each iteration loads one block's
        // quants (inside `b`) and the 32 values of `xb` (a `chunks_exact(QK)` chunk of `x`).
        unsafe {
            let mask = _mm_set1_epi8(0x0F);
            let eight = _mm_set1_epi8(8);
            let mut acc = _mm256_setzero_ps();
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let xp = xb.as_ptr();
                let q = _mm_loadu_si128(b.qs.as_ptr() as *const __m128i);
                let lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);
                let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight);
                let mut p = _mm256_mul_ps(i8x8(lo), _mm256_loadu_ps(xp));
                p = _mm256_fmadd_ps(i8x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(xp.add(8)), p);
                p = _mm256_fmadd_ps(i8x8(hi), _mm256_loadu_ps(xp.add(16)), p);
                p = _mm256_fmadd_ps(i8x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(xp.add(24)), p);
                acc = _mm256_fmadd_ps(splat_half(b.d), p, acc);
            }
            hsum(acc)
        }
    }

    /// # Safety
    /// The CPU supports avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q5_0(blocks: &[BlockQ5_0], x: &[f32]) -> f32 {
        // SAFETY: the features are this function's contract. Each iteration loads one block's
        // quants (inside `b`) and the 32 values of `xb` (a `chunks_exact(QK)` chunk of `x`).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let xp = xb.as_ptr();
                let (lo, hi) = q5_quants(b);
                let mut p = _mm256_mul_ps(i8x8(lo), _mm256_loadu_ps(xp));
                p = _mm256_fmadd_ps(i8x8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(xp.add(8)), p);
                p = _mm256_fmadd_ps(i8x8(hi), _mm256_loadu_ps(xp.add(16)), p);
                p = _mm256_fmadd_ps(i8x8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(xp.add(24)), p);
                acc = _mm256_fmadd_ps(splat_half(b.d), p, acc);
            }
            hsum(acc)
        }
    }

    /// # Safety
    /// The CPU supports avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q8_0(blocks: &[BlockQ8_0], x: &[f32]) -> f32 {
        // SAFETY: the features are this function's contract. Each iteration loads one block's
        // quants (inside `b`) and the 32 values of `xb` (a `chunks_exact(QK)` chunk of `x`).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for (b, xb) in blocks.iter().zip(x.chunks_exact(QK)) {
                let xp = xb.as_ptr();
                let qp = b.qs.as_ptr();
                let q0 = _mm_loadu_si128(qp as *const __m128i);
                let q1 = _mm_loadu_si128(qp.add(16) as *const __m128i);
                let mut p = _mm256_mul_ps(i8x8(q0), _mm256_loadu_ps(xp));
                p = _mm256_fmadd_ps(i8x8(_mm_srli_si128(q0, 8)), _mm256_loadu_ps(xp.add(8)), p);
                p = _mm256_fmadd_ps(i8x8(q1), _mm256_loadu_ps(xp.add(16)), p);
                p = _mm256_fmadd_ps(i8x8(_mm_srli_si128(q1, 8)), _mm256_loadu_ps(xp.add(24)), p);
                acc = _mm256_fmadd_ps(splat_half(b.d), p, acc);
            }
            hsum(acc)
        }
    }

    /// The dot product of the first `min(a.len(), b.len())` values.
    ///
    /// # Safety
    /// The CPU supports avx2 and fma.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: the features are this function's contract; every load reads 8 values at
        // `i + 8 u` with `i + 32 <= n` or `i + 8 <= n`, `n` the shorter length.
        unsafe {
            let n = a.len().min(b.len());
            let (ap, bp) = (a.as_ptr(), b.as_ptr());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (u, s) in acc.iter_mut().enumerate() {
                    *s = _mm256_fmadd_ps(
                        _mm256_loadu_ps(ap.add(i + 8 * u)),
                        _mm256_loadu_ps(bp.add(i + 8 * u)),
                        *s,
                    );
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps(
                    _mm256_loadu_ps(ap.add(i)),
                    _mm256_loadu_ps(bp.add(i)),
                    acc[0],
                );
                i += 8;
            }
            let mut sum = hsum(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ));
            while i < n {
                sum += a[i] * b[i];
                i += 1;
            }
            sum
        }
    }

    /// # Safety
    /// The CPU supports avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
        // SAFETY: the features are this function's contract; with `n` the values both hold,
        // each iteration reads halves `i..i + 16` (bytes `2 i..2 i + 32` of `row`) and values
        // `i..i + 16` of `x`, with `i + 16 <= n`.
        unsafe {
            let n = x.len().min(row.len() / 2);
            let (wp, xp) = (row.as_ptr(), x.as_ptr());
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut i = 0;
            while i + 16 <= n {
                let w0 = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * i) as *const __m128i));
                let w1 = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * i + 16) as *const __m128i));
                acc[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp.add(i)), acc[0]);
                acc[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(i + 8)), acc[1]);
                i += 16;
            }
            let mut sum = hsum(_mm256_add_ps(acc[0], acc[1]));
            while i < n {
                sum += half([row[2 * i], row[2 * i + 1]]) * x[i];
                i += 1;
            }
            sum
        }
    }

    /// The AVX2 micro-kernel: up to 6 rows times `NR` (two vectors) columns in 12 registers.
    ///
    /// # Safety
    /// The CPU supports avx2 and fma; `m <= 6`, `b` holds `k * NR` values and `a` (for `m > 0`)
    /// `(m - 1) * lda + k` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn micro_kernel(
        a: &[f32],
        lda: usize,
        m: usize,
        b: &[f32],
        k: usize,
        c: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: forwarded from this function's contract (`tile::<M>` with `M = m`).
        unsafe {
            match m {
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
    /// The CPU supports avx2, fma and f16c; `M <= MR`, `b` holds `k * NR` values and `a`
    /// `(M - 1) * lda + k` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile<const M: usize>(
        a: &[f32],
        lda: usize,
        b: &[f32],
        k: usize,
        c: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: per the contract: `a[i * lda + p]` for `i < M`, `p < k` is below
        // `(M - 1) * lda + k`; `b` is read `NR` values at a time, `k` times; `c` has `MR >= M`
        // rows of `NR` values.
        unsafe {
            let ap = a.as_ptr();
            let mut bp = b.as_ptr();
            let mut acc0 = [_mm256_setzero_ps(); M];
            let mut acc1 = [_mm256_setzero_ps(); M];
            for p in 0..k {
                let b0 = _mm256_loadu_ps(bp);
                let b1 = _mm256_loadu_ps(bp.add(8));
                for i in 0..M {
                    let av = _mm256_broadcast_ss(&*ap.add(i * lda + p));
                    acc0[i] = _mm256_fmadd_ps(av, b0, acc0[i]);
                    acc1[i] = _mm256_fmadd_ps(av, b1, acc1[i]);
                }
                bp = bp.add(NR);
            }
            for i in 0..M {
                _mm256_storeu_ps(c[i].as_mut_ptr(), acc0[i]);
                _mm256_storeu_ps(c[i].as_mut_ptr().add(8), acc1[i]);
            }
        }
    }
}
