//! The slotted decode attention against a float64 reference on seeded random caches (odd sizes,
//! grouped heads, a window, a softcap, f32 and f16 caches), bitwise against the one-row
//! `attention_decode` over the same slot, and its argument checks.
//!
//! Tolerance against the reference: `1e-5 + 1e-4 * |want|` (f32 scores, exponentials and sums
//! over at most a few dozen keys).

use crate::backend::{Buffer, DType, Device};
use crate::error::Error;
use crate::ops::attention::{attention_decode_scratch_len, AttentionParams};
use crate::ops::copy::float_io::{rounded, run_direct, upload};
use crate::testutil::random_f32;

/// Cache geometry of a case.
#[derive(Clone, Copy)]
struct Geo {
    slots: usize,
    n_head: usize,
    n_kv: usize,
    ctx: usize,
    hd: usize,
}

/// The f64 attention of query row `q` (`[n_head, hd]`) over keys `lo..=pos` of slot `slot`.
fn reference(
    g: Geo,
    p: &AttentionParams,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    slot: usize,
    pos: usize,
) -> Vec<f64> {
    let group = g.n_head / g.n_kv;
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let mut out = vec![0f64; g.n_head * g.hd];
    for h in 0..g.n_head {
        let base = (slot * g.n_kv + h / group) * g.ctx * g.hd;
        let scores: Vec<f64> = (lo..=pos)
            .map(|j| {
                let dot: f64 = (0..g.hd)
                    .map(|d| q[h * g.hd + d] as f64 * k[base + j * g.hd + d] as f64)
                    .sum();
                let s = dot * p.scale as f64;
                p.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        for (j, s) in (lo..=pos).zip(&scores) {
            let w = (s - max).exp() / total;
            for d in 0..g.hd {
                out[h * g.hd + d] += w * v[base + j * g.hd + d] as f64;
            }
        }
    }
    out
}

/// Slot `slot` of a `[slots, n_kv, ctx, hd]` cache as a single-sequence cache view.
fn slot_view(cache: &Buffer, g: Geo, slot: usize) -> Buffer {
    let bytes = cache.len_bytes() / g.slots;
    cache
        .view(slot * bytes, cache.dtype(), &[g.n_kv, g.ctx, g.hd])
        .unwrap()
}

#[test]
fn each_row_matches_the_reference_and_the_one_row_decode_attention_bitwise() {
    let dev = Device::cpu(2).unwrap();
    let g = Geo {
        slots: 4,
        n_head: 6,
        n_kv: 2,
        ctx: 37,
        hd: 20,
    };
    let chunk = 8;
    let base = AttentionParams::new(g.n_head, g.n_kv, g.hd);
    let params = [
        base,
        base.with_window(5),
        base.with_softcap(3.0).with_window(13),
    ];
    // Rows' (slot, position): different slots and lengths (one at the last position, one at 0),
    // and two rows of one slot (attention only reads).
    let places = [(2usize, 36usize), (0, 0), (3, 17), (1, 8), (2, 9)];
    let rows = places.len();
    for dt in [DType::F32, DType::F16] {
        let n = g.slots * g.n_kv * g.ctx * g.hd;
        let kv = rounded(dt, &random_f32(n, 1.0, 900));
        let vv = rounded(dt, &random_f32(n, 1.0, 901));
        let dims = [g.slots, g.n_kv, g.ctx, g.hd];
        let (k, v) = (upload(&dev, dt, &kv, &dims), upload(&dev, dt, &vv, &dims));
        let qv = random_f32(rows * g.n_head * g.hd, 1.0, 902);
        let q = dev.upload(&qv, &[rows, g.n_head * g.hd]).unwrap();
        let s: Vec<i32> = places.iter().map(|p| p.0 as i32).collect();
        let p: Vec<i32> = places.iter().map(|p| p.1 as i32).collect();
        let slots = dev.upload(&s, &[rows]).unwrap();
        let positions = dev.upload(&p, &[rows]).unwrap();
        for (pi, prm) in params.iter().enumerate() {
            let len = super::attention_slots_scratch_len(*prm, g.ctx, chunk, rows).unwrap();
            let partials = dev.alloc(DType::F32, &[len]).unwrap();
            let out = dev.alloc(DType::F32, &[rows, g.n_head * g.hd]).unwrap();
            run_direct(&dev, |sess| {
                sess.attention_slots(&q, &k, &v, &slots, &positions, &partials, &out, *prm, chunk)
            });
            let got: Vec<f32> = dev.download(&out).unwrap();
            let width = g.n_head * g.hd;
            for (r, &(slot, pos)) in places.iter().enumerate() {
                let what = format!("{dt} params {pi} row {r} (slot {slot}, position {pos})");
                let q_row = &qv[r * width..(r + 1) * width];
                let want = reference(g, prm, q_row, &kv, &vv, slot, pos);
                for (i, (&a, &b)) in got[r * width..(r + 1) * width]
                    .iter()
                    .zip(&want)
                    .enumerate()
                {
                    assert!(
                        ((a as f64) - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                        "{what}: out[{i}] = {a}, want {b}"
                    );
                }
                // The one-row decode attention over that slot: the same bits.
                let one_q = dev.upload(q_row, &[1, width]).unwrap();
                let step = dev.upload(&[pos as i32], &[1]).unwrap();
                let one_len = attention_decode_scratch_len(*prm, g.ctx, chunk).unwrap();
                let one_partials = dev.alloc(DType::F32, &[one_len]).unwrap();
                let one_out = dev.alloc(DType::F32, &[1, width]).unwrap();
                let (ks, vs) = (slot_view(&k, g, slot), slot_view(&v, g, slot));
                run_direct(&dev, |sess| {
                    sess.attention_decode(
                        &one_q,
                        &ks,
                        &vs,
                        &step,
                        &one_partials,
                        &one_out,
                        *prm,
                        chunk,
                    )
                });
                let alone: Vec<f32> = dev.download(&one_out).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[r * width..(r + 1) * width]),
                    bits(&alone),
                    "{what}: differs from the one-row decode attention"
                );
            }
        }
    }
}

#[test]
fn attention_slots_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let prm = AttentionParams::new(4, 2, 8);
    let (rows, ctx, chunk) = (2, 16, 4);
    let f32s = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    let q = f32s(&[rows, 32]);
    let k = f32s(&[3, 2, ctx, 8]);
    let v = f32s(&[3, 2, ctx, 8]);
    let ids = dev.alloc(DType::I32, &[rows]).unwrap();
    let pos = dev.alloc(DType::I32, &[rows]).unwrap();
    let len = super::attention_slots_scratch_len(prm, ctx, chunk, rows).unwrap();
    let partials = f32s(&[len]);
    let out = f32s(&[rows, 32]);
    let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
        Err(Error::DType {
            op: "attention_slots",
            arg: a,
            ..
        })
        | Err(Error::Shape {
            op: "attention_slots",
            arg: a,
            ..
        }) if a == arg => {}
        other => panic!("expected an error naming attention_slots and `{arg}`, got {other:?}"),
    };
    let build = |q: &Buffer, k: &Buffer, ids: &Buffer, partials: &Buffer, out: &Buffer| {
        super::attention_slots(q, k, &v, ids, &pos, partials, out, prm, chunk)
    };
    assert!(build(&q, &k, &ids, &partials, &out).is_ok());
    expect(build(&f32s(&[rows, 31]), &k, &ids, &partials, &out), "q");
    expect(
        build(&q, &f32s(&[2, ctx, 8]), &ids, &partials, &out),
        "k_cache",
    );
    expect(
        build(&q, &f32s(&[3, 1, ctx, 8]), &ids, &partials, &out),
        "k_cache",
    );
    expect(
        build(
            &q,
            &k,
            &dev.alloc(DType::I32, &[3]).unwrap(),
            &partials,
            &out,
        ),
        "slots",
    );
    expect(build(&q, &k, &ids, &f32s(&[len - 1]), &out), "partials");
    expect(build(&q, &k, &ids, &partials, &f32s(&[rows, 33])), "out");
    expect(build(&q, &k, &ids, &partials, &q), "out");
    expect(
        super::attention_slots(
            &q,
            &k,
            &f32s(&[3, 2, ctx, 9]),
            &ids,
            &pos,
            &partials,
            &out,
            prm,
            chunk,
        ),
        "v_cache",
    );
    expect(
        super::attention_slots(
            &q,
            &k,
            &v,
            &ids,
            &pos,
            &partials,
            &out,
            prm.with_window(0),
            chunk,
        ),
        "params",
    );
    expect(
        super::attention_slots(&q, &k, &v, &ids, &pos, &partials, &out, prm, 0),
        "chunk_len",
    );
}
