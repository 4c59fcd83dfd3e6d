//! AVX-512 form of one decode-attention work item: the query heads of one KV-head group against one
//! chunk of keys, for head sizes 32, 64 and 128 and f32 or f16 caches.
//!
//! Three passes over the chunk instead of the portable form's online softmax: all scores (each K
//! row loaded, and converted from f16, once for the whole group, with up to four heads' queries in
//! registers), then per head the maximum and `exp(score - max)` sixteen lanes at a time, then the
//! probability-weighted V sum with the heads' accumulators in registers (each V row loaded once per
//! group). The record written per head is the portable form's: `[max, sum, acc[head_dim]]`, `acc`
//! relative to `max` and unnormalized.

use std::arch::x86_64::*;
use std::ops::Range;

/// The geometry of one work item.
pub(super) struct Item<'a> {
    /// The group's query rows, `[group, head_dim]`.
    pub q: &'a [f32],
    /// The KV head's K slab (the bytes of f32 or f16 values, `[max_ctx, head_dim]`).
    pub k: &'a [u8],
    /// The V slab, as `k`.
    pub v: &'a [u8],
    /// Positions of the chunk.
    pub keys: Range<usize>,
    /// Query heads of the group.
    pub group: usize,
    /// Score scale.
    pub scale: f32,
    /// Softcap (`cap * tanh(score / cap)`), if any.
    pub softcap: Option<f32>,
}

/// Whether this CPU has what [`decode_item`] needs (AVX-512F, FMA, F16C), detected once.
pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    })
}

/// Runs one item for a head size the fast form takes (32, 64 or 128), writing `group` records of
/// `head_dim + 2` values into `recs`; `scores` is scratch of at least `group * keys.len()` values.
/// Returns `false` (writing nothing) for other head sizes, when the CPU lacks AVX-512, or when a
/// length disagrees: the slabs must hold every position of `keys` (rows of `head_dim` elements
/// of the type `half` names), `q` `group * head_dim` values and `recs` `group * (head_dim + 2)`.
/// These checks, once per item, are what every access of the fast form rests on.
pub(super) fn decode_item(
    item: &Item<'_>,
    head_dim: usize,
    half: bool,
    scores: &mut [f32],
    recs: &mut [f32],
) -> bool {
    if !available()
        || !matches!(head_dim, 32 | 64 | 128)
        || !sizes_fit(item, head_dim, half, scores, recs)
    {
        return false;
    }
    // SAFETY: the CPU has the features (`available`), and `sizes_fit` checked every length that
    // `run` reads or writes within (its contract); the ISA only decides which loads run, never
    // their bounds.
    unsafe {
        match (head_dim, half) {
            (32, false) => run::<false, 2, 4>(item, scores, recs),
            (32, true) => run::<true, 2, 4>(item, scores, recs),
            (64, false) => run::<false, 4, 4>(item, scores, recs),
            (64, true) => run::<true, 4, 4>(item, scores, recs),
            (128, false) => run::<false, 8, 2>(item, scores, recs),
            (128, true) => run::<true, 8, 2>(item, scores, recs),
            _ => return false,
        }
    }
    true
}

/// Whether every length [`run`] relies on holds: the slabs hold rows `0..keys.end` of `head_dim`
/// elements of 2 (`half`) or 4 bytes, `q` holds `group * head_dim` values, `scores`
/// `group * keys.len()` and `recs` `group * (head_dim + 2)` (checked arithmetic throughout).
fn sizes_fit(item: &Item<'_>, head_dim: usize, half: bool, scores: &[f32], recs: &[f32]) -> bool {
    let fits = |need: Option<usize>, len: usize| need.is_some_and(|n| n <= len);
    let elem = if half { 2 } else { 4 };
    let slab = item
        .keys
        .end
        .checked_mul(head_dim)
        .and_then(|e| e.checked_mul(elem));
    item.keys.start <= item.keys.end
        && fits(slab, item.k.len())
        && fits(slab, item.v.len())
        && fits(item.group.checked_mul(head_dim), item.q.len())
        && fits(item.group.checked_mul(item.keys.len()), scores.len())
        && fits(
            head_dim
                .checked_add(2)
                .and_then(|r| r.checked_mul(item.group)),
            recs.len(),
        )
}

/// Sixteen cache values starting at element `i` of `p`, as f32.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn load16<const HALF: bool>(p: *const u8, i: usize) -> __m512 {
    // SAFETY: the caller keeps `i + 16` elements inside the slab.
    unsafe {
        if HALF {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
        } else {
            _mm512_loadu_ps(p.add(4 * i) as *const f32)
        }
    }
}

/// `exp(x)` on sixteen lanes for `x <= 0` (larger inputs are not needed here): Cody-Waite
/// reduction by ln 2, a degree-7 Taylor polynomial on `|r| <= ln2 / 2` (truncation below 5e-9
/// relative) and an exact power-of-two scaling. Inputs below -87.3 give about 1e-38 instead of a
/// subnormal or zero.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
fn exp16(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.3));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

/// The mask of the first `n` of sixteen lanes.
#[inline]
fn first(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// The three passes for `C` vectors per head (`head_dim = 16 C`), `HT` heads per register tile.
///
/// # Safety
/// The CPU supports avx512f, avx2, fma and f16c, and [`sizes_fit`] holds for `head_dim = 16 C`
/// (the slabs' element type `HALF` names).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn run<const HALF: bool, const C: usize, const HT: usize>(
    item: &Item<'_>,
    scores: &mut [f32],
    recs: &mut [f32],
) {
    let hd = 16 * C;
    let n = item.keys.len();
    let rec = hd + 2;
    let (kp, vp) = (item.k.as_ptr(), item.v.as_ptr());
    // SAFETY: row `t` of a slab is `hd` elements at element offset `t * hd`, inside the slab for
    // every `t` in `keys` (`keys.end * hd` elements fit, checked by `sizes_fit`); `scores` holds
    // `group * n` values, `q` `group * hd` and `recs` `group * rec` (likewise). The masked loads
    // and stores of pass 2 touch only lanes below `n - t` of row `j` of `scores`.
    unsafe {
        // Pass 1: scores.
        let mut h0 = 0;
        while h0 < item.group {
            let ht = HT.min(item.group - h0);
            let mut qv = [[_mm512_setzero_ps(); C]; HT];
            for (h, qh) in qv.iter_mut().enumerate().take(ht) {
                for (c, v) in qh.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(item.q.as_ptr().add((h0 + h) * hd + 16 * c));
                }
            }
            for t in 0..n {
                let row = (item.keys.start + t) * hd;
                let mut kv = [_mm512_setzero_ps(); C];
                for (c, v) in kv.iter_mut().enumerate() {
                    *v = load16::<HALF>(kp, row + 16 * c);
                }
                for (h, qh) in qv.iter().enumerate().take(ht) {
                    let mut s = _mm512_mul_ps(qh[0], kv[0]);
                    for c in 1..C {
                        s = _mm512_fmadd_ps(qh[c], kv[c], s);
                    }
                    *scores.get_unchecked_mut((h0 + h) * n + t) = _mm512_reduce_add_ps(s);
                }
            }
            h0 += HT;
        }
        for s in scores[..item.group * n].iter_mut() {
            *s *= item.scale;
            if let Some(cap) = item.softcap {
                *s = cap * (*s / cap).tanh();
            }
        }
        // Pass 2: per head, the maximum, then exp(score - max) in place and its sum.
        for j in 0..item.group {
            let sp = scores.as_mut_ptr().add(j * n);
            let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut t = 0;
            while t < n {
                let v = _mm512_mask_loadu_ps(mx, first(n - t), sp.add(t));
                mx = _mm512_max_ps(mx, v);
                t += 16;
            }
            let m = _mm512_reduce_max_ps(mx);
            let mv = _mm512_set1_ps(m);
            let mut sum = _mm512_setzero_ps();
            let mut t = 0;
            while t < n {
                let mask = first(n - t);
                let p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sp.add(t)), mv));
                let p = _mm512_maskz_mov_ps(mask, p);
                _mm512_mask_storeu_ps(sp.add(t), mask, p);
                sum = _mm512_add_ps(sum, p);
                t += 16;
            }
            recs[j * rec] = m;
            recs[j * rec + 1] = _mm512_reduce_add_ps(sum);
        }
        // Pass 3: the probability-weighted V sums.
        let mut h0 = 0;
        while h0 < item.group {
            let ht = HT.min(item.group - h0);
            let mut acc = [[_mm512_setzero_ps(); C]; HT];
            for t in 0..n {
                let row = (item.keys.start + t) * hd;
                let mut vv = [_mm512_setzero_ps(); C];
                for (c, v) in vv.iter_mut().enumerate() {
                    *v = load16::<HALF>(vp, row + 16 * c);
                }
                for (h, ah) in acc.iter_mut().enumerate().take(ht) {
                    let p = _mm512_set1_ps(*scores.get_unchecked((h0 + h) * n + t));
                    for c in 0..C {
                        ah[c] = _mm512_fmadd_ps(p, vv[c], ah[c]);
                    }
                }
            }
            for (h, ah) in acc.iter().enumerate().take(ht) {
                let out = recs.as_mut_ptr().add((h0 + h) * rec + 2);
                for (c, v) in ah.iter().enumerate() {
                    _mm512_storeu_ps(out.add(16 * c), *v);
                }
            }
            h0 += HT;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each record against a float64 reference of the same chunk: `max` within 1e-6 relative,
    //! `sum` and every `acc` value within `1e-5 * (1 + |reference|)` (f32 scores, a
    //! Taylor-polynomial exp within a few ulp, f32 sums over at most 300 keys).

    use super::*;
    use crate::testutil::random_f32;
    use half::f16;

    fn check(head_dim: usize, group: usize, half: bool, keys: Range<usize>, softcap: Option<f32>) {
        let ctx = keys.end + 3;
        let seed = (head_dim * 7 + group * 3 + keys.len()) as u64;
        let q = random_f32(group * head_dim, 1.0, seed);
        let kf = random_f32(ctx * head_dim, 1.0, seed + 1);
        let vf = random_f32(ctx * head_dim, 1.0, seed + 2);
        // The values the kernel sees (f16 caches round their values).
        let round = |v: &[f32]| -> Vec<f32> {
            if half {
                v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
            } else {
                v.to_vec()
            }
        };
        let (kr, vr) = (round(&kf), round(&vf));
        let kh: Vec<f16> = kf.iter().map(|&x| f16::from_f32(x)).collect();
        let vh: Vec<f16> = vf.iter().map(|&x| f16::from_f32(x)).collect();
        let (kp, vp): (&[u8], &[u8]) = if half {
            (bytemuck::cast_slice(&kh), bytemuck::cast_slice(&vh))
        } else {
            (bytemuck::cast_slice(&kf), bytemuck::cast_slice(&vf))
        };
        let scale = 1.0 / (head_dim as f32).sqrt();
        let item = Item {
            q: &q,
            k: kp,
            v: vp,
            keys: keys.clone(),
            group,
            scale,
            softcap,
        };
        let rec = head_dim + 2;
        let mut scores = vec![0f32; group * keys.len()];
        let mut recs = vec![f32::NAN; group * rec];
        let ran = decode_item(&item, head_dim, half, &mut scores, &mut recs);
        if !available() {
            assert!(!ran);
            return;
        }
        assert!(ran, "head_dim {head_dim} must take the fast form");
        for j in 0..group {
            let qj = &q[j * head_dim..(j + 1) * head_dim];
            let s: Vec<f64> = keys
                .clone()
                .map(|t| {
                    let kt = &kr[t * head_dim..(t + 1) * head_dim];
                    let d: f64 = qj.iter().zip(kt).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let d = d * scale as f64;
                    softcap.map_or(d, |c| c as f64 * (d / c as f64).tanh())
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let what = format!("hd {head_dim} group {group} half {half} keys {keys:?} head {j}");
            let r = &recs[j * rec..(j + 1) * rec];
            assert!(
                (r[0] as f64 - m).abs() <= 1e-6 * m.abs().max(1.0),
                "{what}: max"
            );
            let sum: f64 = p.iter().sum();
            assert!(
                (r[1] as f64 - sum).abs() <= 1e-5 * (1.0 + sum),
                "{what}: sum"
            );
            for e in 0..head_dim {
                let want: f64 = keys
                    .clone()
                    .zip(&p)
                    .map(|(t, pt)| pt * vr[t * head_dim + e] as f64)
                    .sum();
                let got = r[2 + e] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{what}: acc[{e}] {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn decode_items_match_the_f64_reference() {
        for head_dim in [32, 64, 128] {
            for group in [1, 3, 4, 5] {
                for half in [false, true] {
                    for keys in [0..1, 5..21, 0..16, 40..300] {
                        check(head_dim, group, half, keys, None);
                    }
                }
            }
        }
        check(64, 3, false, 3..90, Some(1.5));
        check(128, 2, true, 0..33, Some(0.7));
    }

    #[test]
    fn other_head_sizes_decline() {
        let item = Item {
            q: &[],
            k: &[],
            v: &[],
            keys: 0..1,
            group: 1,
            scale: 1.0,
            softcap: None,
        };
        assert!(!decode_item(&item, 48, false, &mut [], &mut []));
    }

    #[test]
    fn short_slices_decline() {
        fn item<'a>(q: &'a [f32], k: &'a [u8], v: &'a [u8], keys: Range<usize>) -> Item<'a> {
            Item {
                q,
                k,
                v,
                keys,
                group: 1,
                scale: 1.0,
                softcap: None,
            }
        }
        // A valid item (head_dim 32, one head, keys 0..4), then each length one short.
        let qv = random_f32(32, 1.0, 1);
        let q: &[f32] = &qv;
        let kv = random_f32(4 * 32, 1.0, 2);
        let bytes: &[u8] = bytemuck::cast_slice(&kv);
        let short = &bytes[..bytes.len() - 1];
        let (mut scores, mut recs) = (vec![0f32; 4], vec![0f32; 34]);
        let ok = decode_item(
            &item(q, bytes, bytes, 0..4),
            32,
            false,
            &mut scores,
            &mut recs,
        );
        assert_eq!(ok, available());
        for (it, s, r) in [
            (item(q, short, bytes, 0..4), 4, 34),
            (item(q, bytes, short, 0..4), 4, 34),
            (item(&q[..31], bytes, bytes, 0..4), 4, 34),
            (item(q, bytes, bytes, 0..5), 5, 34),
            (item(q, bytes, bytes, 0..4), 3, 34),
            (item(q, bytes, bytes, 0..4), 4, 33),
        ] {
            let (mut scores, mut recs) = (vec![0f32; s], vec![0f32; r]);
            assert!(!decode_item(&it, 32, false, &mut scores, &mut recs));
        }
    }
}
