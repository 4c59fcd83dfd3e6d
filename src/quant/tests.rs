//! Round trips (quantize then dequantize) within each format's error bound, and layout checks.

use super::*;
use crate::testutil::random_f32;

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

#[test]
fn block_structs_have_ggml_sizes() {
    assert_eq!(std::mem::size_of::<BlockQ4_0>(), DType::Q4_0.block_bytes());
    assert_eq!(std::mem::size_of::<BlockQ4_1>(), DType::Q4_1.block_bytes());
    assert_eq!(std::mem::size_of::<BlockQ5_0>(), DType::Q5_0.block_bytes());
    assert_eq!(std::mem::align_of::<BlockQ5_0>(), 1);
    assert_eq!(std::mem::size_of::<BlockQ8_0>(), DType::Q8_0.block_bytes());
    assert_eq!(std::mem::size_of::<BlockQ4K>(), DType::Q4K.block_bytes());
    assert_eq!(std::mem::size_of::<BlockQ6K>(), DType::Q6K.block_bytes());
    assert_eq!(std::mem::align_of::<BlockQ6K>(), 1);
}

/// Q8_0: `|x - x'| <= d/2 + 127 * |d - f16(d)|` with `d = amax / 127`; we assert
/// `amax * (0.5 / 127 + 2^-11) * 1.001`.
#[test]
fn q8_0_round_trip_within_half_step() {
    let x = random_f32(32 * 40, 3.0, 11);
    let y = dequantize(DType::Q8_0, &quantize(DType::Q8_0, &x).unwrap()).unwrap();
    for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let bound = amax(xb) * (0.5 / 127.0 + 1.0 / 2048.0) * 1.001;
        for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
            assert!(
                (a - c).abs() <= bound,
                "block {b} value {i}: {a} vs {c}, bound {bound}"
            );
        }
    }
}

/// Q4_0: one step `amax / 8` (the value opposite the largest one may clamp at q = 15); we assert
/// `amax / 8 * 1.002`.
#[test]
fn q4_0_round_trip_within_one_step() {
    let x = random_f32(32 * 40, 2.0, 12);
    let y = dequantize(DType::Q4_0, &quantize(DType::Q4_0, &x).unwrap()).unwrap();
    for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let bound = amax(xb) / 8.0 * 1.002;
        for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
            assert!(
                (a - c).abs() <= bound,
                "block {b} value {i}: {a} vs {c}, bound {bound}"
            );
        }
    }
}

/// Q5_0: one step `d = amax / 16` (the value opposite the largest one may clamp at q = 31) plus
/// the f16 rounding of `d` (at most `2^-11 d`) times `|q - 16| <= 16`; we assert
/// `amax / 16 * (1 + 16 / 2048)`.
#[test]
fn q5_0_round_trip_within_one_step() {
    let x = random_f32(32 * 40, 2.0, 19);
    let y = dequantize(DType::Q5_0, &quantize(DType::Q5_0, &x).unwrap()).unwrap();
    for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let bound = amax(xb) / 16.0 * (1.0 + 16.0 / 2048.0);
        for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
            assert!(
                (a - c).abs() <= bound,
                "block {b} value {i}: {a} vs {c}, bound {bound}"
            );
        }
    }
}

/// Q5_0's layout: value `j` is `d * ((low nibble of qs[j] | bit j of qh << 4) - 16)`, value
/// `j + 16` the high nibble with bit `j + 16`; every one of the 32 fifth bits is read from its
/// own place (each block sets one bit, the others stay clear).
#[test]
fn q5_0_fifth_bits_sit_in_qh_little_endian() {
    let qs: [u8; 16] = std::array::from_fn(|j| j as u8 * 7 + 3);
    let d = 0.375f32;
    for bit in 0..32usize {
        let blk = BlockQ5_0 {
            d: ggml::f32_to_f16_bits(d),
            qh: (1u32 << bit).to_le_bytes(),
            qs,
        };
        let mut out = [0f32; 32];
        blk.dequantize(&mut out);
        for (i, &o) in out.iter().enumerate() {
            let nib = if i < 16 {
                qs[i] & 0x0F
            } else {
                qs[i - 16] >> 4
            };
            let q = nib as i32 + if i == bit { 16 } else { 0 };
            assert_eq!(o, d * (q - 16) as f32, "bit {bit} value {i}");
        }
    }
}

/// Q4_1: half a step `d = (max - min) / 15` plus the f16 rounding of `d` (times 15) and of `m`;
/// we assert `0.52 * d + |min| / 1024`.
#[test]
fn q4_1_round_trip_within_half_step() {
    let x = random_f32(32 * 40, 2.0, 13);
    let y = dequantize(DType::Q4_1, &quantize(DType::Q4_1, &x).unwrap()).unwrap();
    for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let min = xb.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xb.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let bound = 0.52 * (max - min) / 15.0 + min.abs() / 1024.0;
        for (i, (a, c)) in xb.iter().zip(yb).enumerate() {
            assert!(
                (a - c).abs() <= bound,
                "block {b} value {i}: {a} vs {c}, bound {bound}"
            );
        }
    }
}

/// Q4_K: half the sub-block's step `s = d * sc` plus one `dmin` grid step (the offset is rounded
/// up) plus 1% of `s` for the f16 rounding of `d`; the step itself stays within the sub-block's
/// `(max - min) / 15 + d`.
#[test]
fn q4_k_round_trip_within_sub_block_bound() {
    let x = random_f32(256 * 12, 1.5, 14);
    let bytes = quantize(DType::Q4K, &x).unwrap();
    let y = dequantize(DType::Q4K, &bytes).unwrap();
    let blocks: &[BlockQ4K] = bytemuck::cast_slice(&bytes);
    for (b, blk) in blocks.iter().enumerate() {
        let d = ggml::f16_bits_to_f32(blk.d);
        let dmin = ggml::f16_bits_to_f32(blk.dmin);
        for j in 0..8 {
            let (sc, _) = kquants::q4k_scale_min(&blk.scales, j);
            let s = d * sc as f32;
            let xs = &x[256 * b + 32 * j..256 * b + 32 * j + 32];
            let ys = &y[256 * b + 32 * j..256 * b + 32 * j + 32];
            let range = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                - xs.iter().copied().fold(0.0, f32::min);
            assert!(
                s <= range / 15.0 + d * 1.01,
                "block {b} sub {j}: step {s} for range {range}"
            );
            let bound = 0.51 * s + dmin * 1.01;
            for (i, (a, c)) in xs.iter().zip(ys).enumerate() {
                assert!(
                    (a - c).abs() <= bound,
                    "block {b} sub {j} value {i}: {a} vs {c}, bound {bound}"
                );
            }
        }
    }
}

/// Q6_K: half the sub-block's step `s = d * sc` (1% slack for the f16 rounding of `d`); the step
/// stays within `amax / 31 + d` of the 16-value sub-block.
#[test]
fn q6_k_round_trip_within_half_step() {
    let x = random_f32(256 * 12, 1.5, 15);
    let bytes = quantize(DType::Q6K, &x).unwrap();
    let y = dequantize(DType::Q6K, &bytes).unwrap();
    let blocks: &[BlockQ6K] = bytemuck::cast_slice(&bytes);
    for (b, blk) in blocks.iter().enumerate() {
        let d = ggml::f16_bits_to_f32(blk.d);
        for j in 0..16 {
            let s = d * blk.scales[j] as i8 as f32;
            let xs = &x[256 * b + 16 * j..256 * b + 16 * j + 16];
            let ys = &y[256 * b + 16 * j..256 * b + 16 * j + 16];
            assert!(
                s <= amax(xs) / 31.0 + d * 1.01,
                "block {b} sub {j}: step {s}"
            );
            for (i, (a, c)) in xs.iter().zip(ys).enumerate() {
                assert!(
                    (a - c).abs() <= 0.51 * s,
                    "block {b} sub {j} value {i}: {a} vs {c}, step {s}"
                );
            }
        }
    }
}

/// Q6_K's quant accessor agrees with the block dequantizer.
#[test]
fn q6_k_quant_accessor_matches_dequantize() {
    let x = random_f32(256, 1.0, 16);
    let bytes = quantize(DType::Q6K, &x).unwrap();
    let blk: &BlockQ6K = bytemuck::from_bytes(&bytes);
    let mut out = [0f32; 256];
    blk.dequantize(&mut out);
    let d = ggml::f16_bits_to_f32(blk.d);
    for (i, &o) in out.iter().enumerate() {
        let want = d * blk.scales[i / 16] as i8 as f32 * (blk.quant(i) as i32 - 32) as f32;
        assert_eq!(o, want, "value {i}");
    }
}

/// f16 and bf16: one rounding, relative error at most 2^-11 and 2^-8.
#[test]
fn float_formats_round_trip() {
    let x = random_f32(100, 4.0, 17);
    for (dtype, rel) in [
        (DType::F32, 0.0),
        (DType::F16, 1.0 / 2048.0),
        (DType::BF16, 1.0 / 256.0),
    ] {
        let y = dequantize(dtype, &quantize(dtype, &x).unwrap()).unwrap();
        for (i, (a, c)) in x.iter().zip(&y).enumerate() {
            assert!(
                (a - c).abs() <= rel * a.abs(),
                "{dtype} value {i}: {a} vs {c}"
            );
        }
    }
}

/// Affine: half a step `scale = (max - min) / (2^bits - 1)` (plus 1e-6 of the group's range for
/// f32 rounding), for 4 and 8 bits and every group size; packing puts value 0 in the lowest bits.
#[test]
fn affine_round_trip_within_half_step() {
    for bits in [4u32, 8] {
        for group in [32usize, 64, 128] {
            let p = AffineParams::new(bits, group).unwrap();
            let cols = 256;
            let x = random_f32(cols * 3, 2.0, 18 + bits as u64 + group as u64);
            let m = quantize_affine(&x, cols, p).unwrap();
            assert_eq!(m.packed.len(), 3 * cols * bits as usize / 32);
            let y = m.dequantize();
            for (g, (xg, yg)) in x.chunks(group).zip(y.chunks(group)).enumerate() {
                let range = xg.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                    - xg.iter().copied().fold(f32::INFINITY, f32::min);
                let bound = 0.5 * m.scales[g] + 1e-6 * range;
                for (i, (a, c)) in xg.iter().zip(yg).enumerate() {
                    assert!(
                        (a - c).abs() <= bound,
                        "bits {bits} group {group} g {g} i {i}: {a} vs {c}"
                    );
                }
            }
            let q0 = m.packed[0] & ((1 << bits) - 1);
            let want0 = ((x[0] - m.biases[0]) / m.scales[0]).round() as u32;
            assert_eq!(q0, want0, "bits {bits}: value 0 sits in the lowest bits");
        }
    }
}

#[test]
fn bad_lengths_and_dtypes_are_errors() {
    assert!(quantize(DType::Q8_0, &[1.0; 31]).is_err());
    assert!(dequantize(DType::Q4_1, &[0u8; 21]).is_err());
    assert!(dequantize(DType::Q5_0, &[0u8; 23]).is_err());
    assert!(quantize(DType::Q5_0, &[1.0; 48]).is_err());
    assert!(dequantize(DType::I32, &[0u8; 4]).is_err());
    assert!(AffineParams::new(3, 32).is_err());
    assert!(AffineParams::new(4, 48).is_err());
    let mut out = [0f32; 32];
    assert!(dequantize_into(DType::Q8_0, &[0u8; 33], &mut out).is_err());
}
