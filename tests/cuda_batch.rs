//! The batched decode step on CUDA: its ops against the CPU's (seeded random inputs, stated
//! tolerances; the row-invariant product's in `cuda_matmul_mma.rs`, with the tensor-core bound),
//! the row-invariant product's rows bitwise equal whatever the row count, and
//! `BatchEngine` on small synthetic models: a row's logits bitwise equal alone and beside 3, 7 and
//! 15 others, graph mode bitwise equal to direct mode, and close to the CPU's logits. Every test
//! needs a GPU: ignored by default, it fails where there is none.

mod batch_common;
#[allow(dead_code, unused_imports)] // this file uses part of the shared harness
mod cuda_harness;
mod cuda_open;
mod seeded;

use batch_common::*;
use cuda_harness::*;
use cuda_open::cuda_device;
use onepass::model::arch::Family;
use onepass::model::batch::BatchEngine;
use onepass::model::engine::RunMode;
use onepass::model::slots::{SlotModel, StepRow};
use onepass::ops::attention::AttentionParams;
use onepass::ops::attention_slots::attention_slots_scratch_len;
use onepass::{DType, Device, Executor, Mode, Plan, Session};

fn run(dev: &Device, f: impl FnOnce(&mut Session) -> onepass::Result<()>) {
    let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
    f(&mut s).unwrap_or_else(|e| panic!("{} failed: {e}", dev.name()));
    s.finish(&Plan::SEQUENTIAL)
        .unwrap_or_else(|e| panic!("{} failed: {e}", dev.name()));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn row_invariant_products_keep_each_rows_bits() {
    let dev = cuda_device();
    let (n, k) = (40usize, 576usize);
    for (j, &dt) in WEIGHT_DTYPES.iter().enumerate() {
        if k % dt.block_elems() != 0 {
            continue;
        }
        let w = weight_tensor(dt, n, k, 1800 + j as u64);
        // Rows 0..32 in calls of 32, 17, 13, 8, 2 and 1 rows: each row's bits never change.
        let wb = dev.upload_bytes(&w.bytes, dt, &w.dims).unwrap();
        let xs = random_f32(32 * k, 1.0, 1850 + j as u64);
        let mut first: Option<Vec<u32>> = None;
        for rows in [32usize, 17, 13, 8, 2, 1] {
            let mut got = Vec::new();
            for start in (0..32).step_by(rows) {
                let count = rows.min(32 - start);
                let x = dev
                    .upload(&xs[start * k..(start + count) * k], &[count, k])
                    .unwrap();
                let out = dev.alloc(DType::F32, &[count, n]).unwrap();
                run(&dev, |s| s.matmul_rows(&x, &wb, &out));
                got.extend(bits(&dev.download::<f32>(&out).unwrap()));
            }
            match &first {
                None => first = Some(got),
                Some(want) => assert_eq!(&got, want, "matmul_rows {dt}: calls of {rows} rows"),
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn slotted_kv_writes_match_the_cpu() {
    let dev = cuda_device();
    for dt in [DType::F32, DType::F16] {
        let (slots, heads, ctx, hd) = (4usize, 3usize, 11usize, 16usize);
        let cache = random_tensor(dt, &[slots, heads, ctx, hd], 1.0, 1900);
        let new = random_tensor(DType::F32, &[3, heads * hd], 2.0, 1901);
        let ids = i32_tensor(&[3, 0, 2], &[3]);
        let pos = i32_tensor(&[10, 0, 5], &[3]);
        // Both copy values (rounded once to the cache's dtype): exact.
        compare(
            &format!("kv_write_slots {dt}"),
            &dev,
            &[new, ids, pos, cache],
            &[],
            0.0,
            0.0,
            &|s, i, _| s.kv_write_slots(&i[0], &i[3], &i[1], &i[2]),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn slotted_decode_attention_matches_the_cpu() {
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    let (slots, n_head, n_kv, ctx, hd) = (4usize, 8usize, 2usize, 300usize, 64usize);
    let base = AttentionParams::new(n_head, n_kv, hd);
    let places: [(i32, i32); 5] = [(2, 299), (0, 0), (3, 130), (1, 64), (2, 63)];
    let rows = places.len();
    for dt in [DType::F32, DType::F16] {
        for (pi, prm) in [base, base.with_window(100), base.with_softcap(20.0)]
            .into_iter()
            .enumerate()
        {
            let k = random_tensor(dt, &[slots, n_kv, ctx, hd], 1.0, 1950);
            let v = random_tensor(dt, &[slots, n_kv, ctx, hd], 1.0, 1951);
            let q = random_f32(rows * n_head * hd, 1.0, 1952);
            let ids: Vec<i32> = places.iter().map(|p| p.0).collect();
            let pos: Vec<i32> = places.iter().map(|p| p.1).collect();
            let mut outs = Vec::new();
            for d in [&cpu, &dev] {
                let chunk = d.capabilities().decode_attention_chunk;
                let len = attention_slots_scratch_len(prm, ctx, chunk, rows).unwrap();
                let kb = d.upload_bytes(&k.bytes, dt, &k.dims).unwrap();
                let vb = d.upload_bytes(&v.bytes, dt, &v.dims).unwrap();
                let qb = d.upload(&q, &[rows, n_head * hd]).unwrap();
                let ib = d.upload(&ids, &[rows]).unwrap();
                let pb = d.upload(&pos, &[rows]).unwrap();
                let partials = d.alloc(DType::F32, &[len]).unwrap();
                let out = d.alloc(DType::F32, &[rows, n_head * hd]).unwrap();
                // Twice: the counters must be back at zero after the first run.
                for _ in 0..2 {
                    run(d, |s| {
                        s.attention_slots(&qb, &kb, &vb, &ib, &pb, &partials, &out, prm, chunk)
                    });
                }
                outs.push(d.download::<f32>(&out).unwrap());
            }
            for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 + 1e-4 * a.abs(),
                    "attention_slots {dt} params {pi}: element {i}: cuda {b}, cpu {a}"
                );
            }
        }
    }
}

/// Enough rows and heads that a launch takes one block per row and head (each block merging its
/// own chunks, no tickets): every row's bits equal those of the row run alone (blocks per chunk,
/// tickets), and close to the CPU's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn slotted_attention_with_a_block_per_head_keeps_each_rows_bits() {
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    let (rows, n_head, n_kv, ctx, hd) = (32usize, 32usize, 8usize, 300usize, 64usize);
    let chunk = dev.capabilities().decode_attention_chunk;
    for (pi, prm) in [
        AttentionParams::new(n_head, n_kv, hd),
        AttentionParams::new(n_head, n_kv, hd).with_window(100),
    ]
    .into_iter()
    .enumerate()
    {
        let k = random_tensor(DType::F16, &[rows, n_kv, ctx, hd], 1.0, 1960);
        let v = random_tensor(DType::F16, &[rows, n_kv, ctx, hd], 1.0, 1961);
        let q = random_f32(rows * n_head * hd, 1.0, 1962);
        let ids: Vec<i32> = (0..rows as i32).rev().collect();
        let pos: Vec<i32> = (0..rows).map(|r| ((r * 97 + 11) % ctx) as i32).collect();
        let launch = |d: &Device, first: usize, count: usize| -> Vec<f32> {
            let c = d.capabilities().decode_attention_chunk;
            let len = attention_slots_scratch_len(prm, ctx, c, count).unwrap();
            let kb = d.upload_bytes(&k.bytes, DType::F16, &k.dims).unwrap();
            let vb = d.upload_bytes(&v.bytes, DType::F16, &v.dims).unwrap();
            let width = n_head * hd;
            let qb = d
                .upload(&q[first * width..(first + count) * width], &[count, width])
                .unwrap();
            let ib = d.upload(&ids[first..first + count], &[count]).unwrap();
            let pb = d.upload(&pos[first..first + count], &[count]).unwrap();
            let partials = d.alloc(DType::F32, &[len]).unwrap();
            let out = d.alloc(DType::F32, &[count, width]).unwrap();
            run(d, |s| {
                s.attention_slots(&qb, &kb, &vb, &ib, &pb, &partials, &out, prm, c)
            });
            d.download::<f32>(&out).unwrap()
        };
        let together = launch(&dev, 0, rows);
        let alone: Vec<f32> = (0..rows).flat_map(|r| launch(&dev, r, 1)).collect();
        assert_eq!(
            bits(&together),
            bits(&alone),
            "params {pi}: 32 rows together vs one at a time (chunk {chunk})"
        );
        let want = launch(&cpu, 0, rows);
        for (i, (a, b)) in want.iter().zip(&together).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-4 * a.abs(),
                "params {pi}: element {i}: cuda {b}, cpu {a}"
            );
        }
    }
}

/// The logits (bits) of the target row alone and beside 3, 7 and 15 other rows, in `mode`.
fn target_logits(engine: &mut BatchEngine, hist: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let target = 5;
    let others: Vec<usize> = (0..SLOTS).filter(|&s| s != target).collect();
    let mut all = Vec::new();
    for (count, at) in [(0usize, 0usize), (3, 1), (7, 7), (15, 9)] {
        let mut rows: Vec<StepRow> = others[..count]
            .iter()
            .map(|&s| row(s, hist, s % 2 == 0))
            .collect();
        rows.insert(at, row(target, hist, false));
        let mut outs = engine.decode(&rows).expect("decode");
        all.push(logits_of(outs.remove(at)));
    }
    all
}

fn invariance_on_cuda(family: Family, quant: DType) {
    let dev = cuda_device();
    let path = write_model(family, quant);
    let hist = histories(SLOTS, 0xc0da + family as u64);
    let mut per_mode = Vec::new();
    for mode in [RunMode::Direct, RunMode::Graph] {
        let mut engine = batch_engine_on(dev.clone(), &path, SLOTS, SLOTS, mode);
        fill(&mut engine, &hist);
        let mut all = target_logits(&mut engine, &hist);
        for (i, l) in all.iter().enumerate().skip(1) {
            assert_eq!(
                l, &all[0],
                "{family:?} {quant} {mode:?}: bucket case {i} vs alone"
            );
        }
        if mode == RunMode::Graph {
            assert_eq!(engine.instantiations(), 4, "buckets 1, 4, 8, 16");
        }
        per_mode.push(all.swap_remove(0));
    }
    assert_eq!(
        per_mode[0], per_mode[1],
        "{family:?} {quant}: graph vs direct"
    );
    // Against the CPU: every product of the step rounds x and w to f16 (at most 2^-10 of each
    // product's magnitude, as the tensor-core prefill), which the layers' norms and residual adds
    // carry into the logits as a relative error of that order: the bound is ROWS_RTOL of the
    // largest |logit| (the prompt logits' bound in cuda_e2e.rs), while a wrong row, slot or
    // position moves logits by a sizable fraction of their scale.
    const ROWS_RTOL: f32 = 5e-3;
    let mut cpu = batch_engine(&path, SLOTS, SLOTS, RunMode::Graph);
    fill(&mut cpu, &hist);
    let want: Vec<f32> = target_logits(&mut cpu, &hist)
        .swap_remove(0)
        .into_iter()
        .map(f32::from_bits)
        .collect();
    let got: Vec<f32> = per_mode[1].iter().map(|&b| f32::from_bits(b)).collect();
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("{family:?} {quant}: max |cuda - cpu| {worst:.3e}, max |cpu| {scale:.3}");
    assert!(
        worst <= ROWS_RTOL * scale,
        "{family:?} {quant}: logits differ by {worst:.3e} (> {ROWS_RTOL} x {scale})"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn llama_rows_are_batch_invariant_on_cuda() {
    invariance_on_cuda(Family::Llama, DType::Q4_1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemma3_rows_are_batch_invariant_on_cuda() {
    invariance_on_cuda(Family::Gemma3, DType::Q8_0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_rows_are_batch_invariant_on_cuda() {
    invariance_on_cuda(Family::Qwen3, DType::Q4K);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_prompt_fed_as_rows_of_one_step_equals_one_token_per_step_on_cuda() {
    for mode in [RunMode::Direct, RunMode::Graph] {
        prompt_rows(cuda_device(), mode);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rows_drawn_on_the_device_give_their_host_samplers_tokens_on_cuda() {
    for mode in [RunMode::Direct, RunMode::Graph] {
        drawn_rows(cuda_device(), mode);
    }
}
