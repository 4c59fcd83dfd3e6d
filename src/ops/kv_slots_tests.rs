//! The slotted KV write against a direct reference on seeded random caches, for both cache
//! dtypes; its run-time refusal of a bad slot or position (the cache left as it was); and its
//! argument checks.

use crate::backend::{DType, Device};
use crate::error::Error;
use crate::ops::copy::float_io::{download, rounded, run_direct, upload};
use crate::session::{Executor, Mode, Plan};
use crate::testutil::{assert_close, random_f32};

/// The cache `[slots, heads, ctx, hd]` after writing row `r` of `new` at `(slots[r], pos[r])`.
fn reference(
    before: &[f32],
    new: &[f32],
    places: &[(usize, usize)],
    (heads, ctx, hd): (usize, usize, usize),
) -> Vec<f32> {
    let mut cache = before.to_vec();
    for (row, &(slot, pos)) in new.chunks(heads * hd).zip(places) {
        for h in 0..heads {
            let dst = ((slot * heads + h) * ctx + pos) * hd;
            cache[dst..dst + hd].copy_from_slice(&row[h * hd..(h + 1) * hd]);
        }
    }
    cache
}

#[test]
fn kv_write_slots_places_each_row_in_its_slot_and_position() {
    let dev = Device::cpu(2).unwrap();
    // (slots, heads, ctx, hd, rows' (slot, pos))
    type Case<'a> = (usize, usize, usize, usize, &'a [(usize, usize)]);
    let cases: [Case<'_>; 3] = [
        (3, 2, 7, 5, &[(2, 6), (0, 0), (1, 3)]),
        (5, 3, 11, 16, &[(4, 10)]),
        (4, 1, 9, 3, &[(1, 8), (3, 0), (0, 4), (2, 2)]),
    ];
    for dt in [DType::F32, DType::F16] {
        for (case, &(slots, heads, ctx, hd, places)) in cases.iter().enumerate() {
            let seed = 700 + case as u64;
            let dims = [slots, heads, ctx, hd];
            let before = rounded(dt, &random_f32(slots * heads * ctx * hd, 1.0, seed));
            let cache = upload(&dev, dt, &before, &dims);
            let rows = places.len();
            let newv = random_f32(rows * heads * hd, 2.0, seed + 1);
            let new = dev.upload(&newv, &[rows, heads * hd]).unwrap();
            let s: Vec<i32> = places.iter().map(|p| p.0 as i32).collect();
            let p: Vec<i32> = places.iter().map(|p| p.1 as i32).collect();
            let slots_buf = dev.upload(&s, &[rows]).unwrap();
            let pos_buf = dev.upload(&p, &[rows]).unwrap();
            run_direct(&dev, |sess| {
                sess.kv_write_slots(&new, &cache, &slots_buf, &pos_buf)
            });
            // Exact: each new value rounded once to the cache's dtype, nothing else touched.
            let want = rounded(dt, &reference(&before, &newv, places, (heads, ctx, hd)));
            let what = format!("kv_write_slots {dt} case {case}");
            assert_close(&download(&dev, &cache), &want, 0.0, 0.0, &what);
        }
    }
}

#[test]
fn a_bad_slot_or_position_is_a_kernel_error_and_writes_nothing() {
    let dev = Device::cpu(2).unwrap();
    let (slots, heads, ctx, hd) = (3, 2, 4, 8);
    let before = random_f32(slots * heads * ctx * hd, 1.0, 77);
    let cache = dev.upload(&before, &[slots, heads, ctx, hd]).unwrap();
    let new = dev
        .upload(&random_f32(2 * heads * hd, 1.0, 78), &[2, heads * hd])
        .unwrap();
    let slot_buf = dev.alloc(DType::I32, &[2]).unwrap();
    let pos_buf = dev.alloc(DType::I32, &[2]).unwrap();
    let executor = Executor::new(dev.clone());
    let mut s = executor.begin(Mode::Recorded);
    s.kv_write_slots(&new, &cache, &slot_buf, &pos_buf).unwrap();
    let mut graph = s.into_graph().unwrap();
    Executor::optimize(&mut graph, &Plan::SEQUENTIAL, dev.capabilities());
    for (slots_v, pos_v) in [
        ([0, 3], [0, 1]),
        ([0, -1], [0, 1]),
        ([1, 2], [4, 0]),
        ([1, 2], [0, i32::MIN]),
    ] {
        dev.write(&slot_buf, &slots_v).unwrap();
        dev.write(&pos_buf, &pos_v).unwrap();
        match executor.run(&graph, false) {
            Err(Error::Kernel {
                kernel: "kv_write_slots_f32",
                ..
            }) => {}
            other => {
                panic!("slots {slots_v:?} at {pos_v:?}: expected a kernel error, got {other:?}")
            }
        }
        let after: Vec<f32> = dev.download(&cache).unwrap();
        assert_close(&after, &before, 0.0, 0.0, "cache after a refused write");
    }
}

#[test]
fn kv_write_slots_rejects_bad_arguments() {
    let dev = Device::cpu(2).unwrap();
    let cache = dev.alloc(DType::F32, &[3, 2, 16, 8]).unwrap();
    let new = dev.alloc(DType::F32, &[2, 16]).unwrap();
    let ids = dev.alloc(DType::I32, &[2]).unwrap();
    let pos = dev.alloc(DType::I32, &[2]).unwrap();
    let expect = |r: crate::error::Result<crate::graph::Dispatch>, arg: &str| match r {
        Err(Error::DType {
            op: "kv_write_slots",
            arg: a,
            ..
        })
        | Err(Error::Shape {
            op: "kv_write_slots",
            arg: a,
            ..
        }) if a == arg => {}
        other => panic!("expected an error naming kv_write_slots and `{arg}`, got {other:?}"),
    };
    assert!(super::kv_write_slots(&new, &cache, &ids, &pos).is_ok());
    let f32s = |dims: &[usize]| dev.alloc(DType::F32, dims).unwrap();
    expect(
        super::kv_write_slots(&f32s(&[2, 15]), &cache, &ids, &pos),
        "new",
    );
    expect(
        super::kv_write_slots(
            &dev.alloc(DType::F16, &[2, 16]).unwrap(),
            &cache,
            &ids,
            &pos,
        ),
        "new",
    );
    expect(
        super::kv_write_slots(&new, &f32s(&[2, 16, 8]), &ids, &pos),
        "cache",
    );
    expect(
        super::kv_write_slots(
            &new,
            &dev.alloc(DType::BF16, &[3, 2, 16, 8]).unwrap(),
            &ids,
            &pos,
        ),
        "cache",
    );
    expect(
        super::kv_write_slots(&new, &cache, &dev.alloc(DType::I32, &[3]).unwrap(), &pos),
        "slots",
    );
    expect(
        super::kv_write_slots(&new, &cache, &ids, &dev.alloc(DType::U32, &[2]).unwrap()),
        "positions",
    );
    expect(
        super::kv_write_slots(
            &new,
            &cache,
            &ids,
            &cache.view(0, DType::I32, &[2]).unwrap(),
        ),
        "cache",
    );
}
