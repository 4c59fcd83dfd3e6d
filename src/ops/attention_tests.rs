//! Tests of the `attention` op family against a naive float64 reference. The sliding window has
//! its own tests (`attention_window_tests.rs`), which use the helpers here.

use half::f16;

use super::*;
use crate::testutil::{assert_close, random_f32};
use crate::{Device, Executor, Mode, Plan};

/// Outputs are weighted means of values in [-1, 1]; f32 accumulation stays well inside this.
pub(super) const ATOL: f32 = 1e-5;

/// One test configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Case {
    pub(super) n_head: usize,
    pub(super) n_kv_head: usize,
    pub(super) head_dim: usize,
    pub(super) max_ctx: usize,
    pub(super) pos0: usize,
    pub(super) rows: usize,
    pub(super) f16_cache: bool,
    pub(super) softcap: Option<f32>,
    /// The scale, when not the default `1 / sqrt(head_dim)`.
    pub(super) scale: Option<f32>,
    /// The sliding window, if any.
    pub(super) window: Option<usize>,
    pub(super) seed: u64,
}

impl Case {
    pub(super) fn params(&self) -> AttentionParams {
        let mut p = AttentionParams::new(self.n_head, self.n_kv_head, self.head_dim);
        if let Some(cap) = self.softcap {
            p = p.with_softcap(cap);
        }
        if let Some(scale) = self.scale {
            p = p.with_scale(scale);
        }
        if let Some(w) = self.window {
            p = p.with_window(w);
        }
        p
    }

    pub(super) fn width(&self) -> usize {
        self.n_head * self.head_dim
    }

    fn cache_dims(&self) -> [usize; 3] {
        [self.n_kv_head, self.max_ctx, self.head_dim]
    }
}

/// Random inputs; the caches hold values exactly representable in the cache dtype (f16-rounded
/// for an f16 cache), and are filled at every position, so reading past the causal limit
/// would change the result.
pub(super) struct Inputs {
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
}

pub(super) fn inputs(c: &Case) -> Inputs {
    let cache = c.n_kv_head * c.max_ctx * c.head_dim;
    let round = |x: Vec<f32>| -> Vec<f32> {
        if c.f16_cache {
            x.into_iter().map(|v| f16::from_f32(v).to_f32()).collect()
        } else {
            x
        }
    };
    Inputs {
        q: random_f32(c.rows * c.width(), 2.0, c.seed),
        k: round(random_f32(cache, 1.0, c.seed + 1)),
        v: round(random_f32(cache, 1.0, c.seed + 2)),
    }
}

/// Naive float64 `softmax(scale * Q K^T + causal mask) V`, with the softcap and the sliding
/// window when set: row `r` (position `i = pos0 + r`) sees keys `i + 1 - W..=i` of a window `W`,
/// else `0..=i`.
pub(super) fn reference(c: &Case, inp: &Inputs) -> Vec<f32> {
    let hd = c.head_dim;
    let group = c.n_head / c.n_kv_head;
    let scale = c.params().scale as f64;
    let mut out = vec![0.0f32; c.rows * c.width()];
    for r in 0..c.rows {
        let pos = c.pos0 + r;
        let first = c.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..c.n_head {
            let kv = h / group;
            let q = &inp.q[r * c.width() + h * hd..][..hd];
            let at = |j: usize| (kv * c.max_ctx + j) * hd..(kv * c.max_ctx + j + 1) * hd;
            let scores: Vec<f64> = (first..=pos)
                .map(|j| {
                    let dot: f64 = q
                        .iter()
                        .zip(&inp.k[at(j)])
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                    let s = dot * scale;
                    match c.softcap {
                        Some(cap) => cap as f64 * (s / cap as f64).tanh(),
                        None => s,
                    }
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = w.iter().sum();
            let mut acc = vec![0.0f64; hd];
            for (j, w) in (first..=pos).zip(&w) {
                for (a, x) in acc.iter_mut().zip(&inp.v[at(j)]) {
                    *a += w * *x as f64;
                }
            }
            for (o, a) in out[r * c.width() + h * hd..][..hd].iter_mut().zip(&acc) {
                *o = (a / total) as f32;
            }
        }
    }
    out
}

fn upload_cache(dev: &Device, c: &Case, vals: &[f32]) -> Buffer {
    if c.f16_cache {
        let h: Vec<f16> = vals.iter().map(|&v| f16::from_f32(v)).collect();
        dev.upload(&h, &c.cache_dims()).unwrap()
    } else {
        dev.upload(vals, &c.cache_dims()).unwrap()
    }
}

/// Device buffers of one case: q, k, v, step, out.
pub(super) fn buffers(dev: &Device, c: &Case, inp: &Inputs, pos0: i32) -> [Buffer; 5] {
    [
        dev.upload(&inp.q, &[c.rows, c.width()]).unwrap(),
        upload_cache(dev, c, &inp.k),
        upload_cache(dev, c, &inp.v),
        dev.upload(&[pos0], &[1]).unwrap(),
        dev.alloc(DType::F32, &[c.rows, c.width()]).unwrap(),
    ]
}

pub(super) fn run_prefill(dev: &Device, c: &Case, inp: &Inputs, mode: Mode) -> Result<Vec<f32>> {
    let [q, k, v, step, out] = buffers(dev, c, inp, c.pos0 as i32);
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.attention(&q, &k, &v, &step, &out, c.params())?;
    s.finish(&Plan::OPTIMIZED)?;
    dev.download(&out)
}

fn cases(rows: &[usize], pos0s: &[usize], max_ctx: usize) -> Vec<Case> {
    let mut all = Vec::new();
    let mut seed = 1000;
    for (n_head, n_kv_head) in [(9, 3), (4, 4), (8, 2)] {
        for &pos0 in pos0s {
            for &rows in rows {
                for f16_cache in [false, true] {
                    for softcap in [None, Some(1.5)] {
                        seed += 7;
                        all.push(Case {
                            n_head,
                            n_kv_head,
                            head_dim: 64,
                            max_ctx,
                            pos0,
                            rows,
                            f16_cache,
                            softcap,
                            scale: None,
                            window: None,
                            seed,
                        });
                    }
                }
            }
        }
    }
    all
}

#[test]
fn prefill_matches_f64_reference() {
    let dev = Device::cpu(2).unwrap();
    for (i, c) in cases(&[1, 7, 33], &[0, 5, 100], 160).iter().enumerate() {
        let inp = inputs(c);
        let want = reference(c, &inp);
        let mode = if i % 2 == 0 {
            Mode::Direct
        } else {
            Mode::Recorded
        };
        let got = run_prefill(&dev, c, &inp, mode).unwrap();
        assert_close(&got, &want, ATOL, 0.0, &format!("prefill {c:?}"));
    }
}

#[test]
fn prefill_softcap_changes_the_result() {
    // Guards the softcap test cases: with q scaled up, a cap of 1.5 must matter.
    let dev = Device::cpu(2).unwrap();
    let c = cases(&[7], &[5], 64)[1];
    assert_eq!(c.softcap, Some(1.5));
    let inp = inputs(&c);
    let capped = run_prefill(&dev, &c, &inp, Mode::Direct).unwrap();
    let plain = run_prefill(&dev, &Case { softcap: None, ..c }, &inp, Mode::Direct).unwrap();
    let diff = crate::testutil::max_abs_diff(&capped, &plain);
    assert!(diff > 1e-3, "softcap made a difference of only {diff}");
}

#[test]
fn prefill_direct_and_recorded_agree_bitwise() {
    let dev = Device::cpu(2).unwrap();
    let c = cases(&[33], &[5], 64)[2];
    let inp = inputs(&c);
    let a = run_prefill(&dev, &c, &inp, Mode::Direct).unwrap();
    let b = run_prefill(&dev, &c, &inp, Mode::Recorded).unwrap();
    assert_eq!(a, b);
}

#[test]
fn prefill_rejects_bad_arguments() {
    let dev = Device::cpu(1).unwrap();
    let c = cases(&[2], &[0], 16)[0];
    let inp = inputs(&c);
    let [q, k, v, step, out] = buffers(&dev, &c, &inp, 0);
    let p = c.params();
    let arg_of = |r: Result<Dispatch>| match r {
        Err(Error::DType { op, arg, .. }) | Err(Error::Shape { op, arg, .. }) => (op, arg),
        other => panic!("expected an argument error, got {other:?}"),
    };
    let q16 = dev.alloc(DType::F16, &[2, c.width()]).unwrap();
    assert_eq!(
        arg_of(attention(&q16, &k, &v, &step, &out, p)),
        ("attention", "q")
    );
    let q_narrow = dev.alloc(DType::F32, &[2, c.width() - 1]).unwrap();
    assert_eq!(
        arg_of(attention(&q_narrow, &k, &v, &step, &out, p)),
        ("attention", "q")
    );
    let k_flat = k.reshape(&[c.n_kv_head * 16, 64]).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k_flat, &v, &step, &out, p)),
        ("attention", "k_cache")
    );
    let k_wrong_heads = dev.alloc(DType::F32, &[c.n_kv_head + 1, 16, 64]).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k_wrong_heads, &v, &step, &out, p)),
        ("attention", "k_cache")
    );
    let k_i32 = dev.alloc(DType::I32, &c.cache_dims()).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k_i32, &v, &step, &out, p)),
        ("attention", "k_cache")
    );
    let v16 = dev.alloc(DType::F16, &c.cache_dims()).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k, &v16, &step, &out, p)),
        ("attention", "v_cache")
    );
    let v_short = dev.alloc(DType::F32, &[c.n_kv_head, 8, 64]).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k, &v_short, &step, &out, p)),
        ("attention", "v_cache")
    );
    let step_u32 = dev.alloc(DType::U32, &[1]).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k, &v, &step_u32, &out, p)),
        ("attention", "step")
    );
    let out_1row = dev.alloc(DType::F32, &[1, c.width()]).unwrap();
    assert_eq!(
        arg_of(attention(&q, &k, &v, &step, &out_1row, p)),
        ("attention", "out")
    );
    let bad_group = AttentionParams { n_kv_head: 2, ..p };
    assert_eq!(
        arg_of(attention(&q, &k, &v, &step, &out, bad_group)),
        ("attention", "params")
    );
    let bad_cap = p.with_softcap(0.0);
    assert_eq!(
        arg_of(attention(&q, &k, &v, &step, &out, bad_cap)),
        ("attention", "params")
    );
    let q_long = dev.alloc(DType::F32, &[17, c.width()]).unwrap();
    let out_long = dev.alloc(DType::F32, &[17, c.width()]).unwrap();
    assert_eq!(
        arg_of(attention(&q_long, &k, &v, &step, &out_long, p)),
        ("attention", "q")
    );
    // The output may not alias an input.
    assert!(matches!(
        attention(&q, &k, &v, &step, &q, p),
        Err(Error::InvalidArgument(_))
    ));
}

/// Runs prefill with `pos0` written into the step buffer; returns the session's result.
fn prefill_at(dev: &Device, c: &Case, pos0: i32) -> Result<()> {
    let inp = inputs(c);
    let [q, k, v, step, out] = buffers(dev, c, &inp, pos0);
    let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
    s.attention(&q, &k, &v, &step, &out, c.params())?;
    s.finish(&Plan::SEQUENTIAL).map(|_| ())
}

#[test]
fn prefill_out_of_range_position_is_a_kernel_error() {
    let dev = Device::cpu(2).unwrap();
    let c = Case {
        rows: 4,
        ..cases(&[4], &[0], 16)[0]
    };
    prefill_at(&dev, &c, 12).unwrap();
    for pos0 in [13, -1, i32::MAX] {
        match prefill_at(&dev, &c, pos0) {
            Err(Error::Kernel { kernel, msg }) => {
                assert_eq!(kernel, "attention_f32");
                assert!(msg.contains("pos0"), "{msg}");
            }
            other => panic!("pos0 {pos0}: expected a kernel error, got {other:?}"),
        }
    }
}

pub(super) fn scratch(dev: &Device, c: &Case, chunk_len: usize) -> Buffer {
    let len = attention_decode_scratch_len(c.params(), c.max_ctx, chunk_len).unwrap();
    dev.alloc(DType::F32, &[len]).unwrap()
}

pub(super) fn run_decode(
    dev: &Device,
    c: &Case,
    inp: &Inputs,
    chunk_len: usize,
    mode: Mode,
) -> Result<Vec<f32>> {
    let [q, k, v, step, out] = buffers(dev, c, inp, c.pos0 as i32);
    let partials = scratch(dev, c, chunk_len);
    let mut s = Executor::new(dev.clone()).begin(mode);
    s.attention_decode(&q, &k, &v, &step, &partials, &out, c.params(), chunk_len)?;
    s.finish(&Plan::OPTIMIZED)?;
    dev.download(&out)
}

#[test]
fn decode_matches_f64_reference_and_prefill() {
    let dev = Device::cpu(2).unwrap();
    let (mut dividing, mut ragged) = (0, 0);
    for (i, c) in cases(&[1], &[0, 5, 100, 159], 160).iter().enumerate() {
        let inp = inputs(c);
        let want = reference(c, &inp);
        let prefill = run_prefill(&dev, c, &inp, Mode::Direct).unwrap();
        for chunk_len in [1, 6, 7, 32, 64, 256] {
            if (c.pos0 + 1) % chunk_len == 0 {
                dividing += 1;
            } else {
                ragged += 1;
            }
            let mode = if i % 2 == 0 {
                Mode::Recorded
            } else {
                Mode::Direct
            };
            let got = run_decode(&dev, c, &inp, chunk_len, mode).unwrap();
            let what = format!("decode chunk_len {chunk_len} {c:?}");
            assert_close(&got, &want, ATOL, 0.0, &what);
            assert_close(&got, &prefill, 1e-6, 0.0, &format!("{what} vs prefill"));
        }
    }
    assert!(
        dividing > 0 && ragged > 0,
        "{dividing} dividing, {ragged} ragged chunkings"
    );
}

#[test]
fn decode_graph_recorded_once_serves_every_step() {
    let dev = Device::cpu(2).unwrap();
    let exec = Executor::new(dev.clone());
    let c = Case {
        max_ctx: 96,
        f16_cache: true,
        ..cases(&[1], &[0], 96)[0]
    };
    let inp = inputs(&c);
    let [q, k, v, step, out] = buffers(&dev, &c, &inp, 0);
    let partials = scratch(&dev, &c, 16);
    let mut s = exec.begin(Mode::Recorded);
    s.attention_decode(&q, &k, &v, &step, &partials, &out, c.params(), 16)
        .unwrap();
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, dev.capabilities());
    assert_eq!((report.dispatches, report.barriers), (2, 1), "{report:?}");
    for pos0 in [0usize, 3, 15, 16, 17, 60, 95] {
        dev.write(&step, &[pos0 as i32]).unwrap();
        exec.run(&graph, false).unwrap();
        let got: Vec<f32> = dev.download(&out).unwrap();
        let want = reference(&Case { pos0, ..c }, &inp);
        assert_close(
            &got,
            &want,
            ATOL,
            0.0,
            &format!("replayed step pos0 {pos0}"),
        );
    }
    dev.write(&step, &[96]).unwrap();
    assert!(matches!(exec.run(&graph, false), Err(Error::Kernel { .. })));
}

#[test]
fn decode_rejects_bad_arguments() {
    let dev = Device::cpu(1).unwrap();
    let c = cases(&[1], &[0], 16)[0];
    let inp = inputs(&c);
    let [q, k, v, step, out] = buffers(&dev, &c, &inp, 0);
    let p = c.params();
    let part = scratch(&dev, &c, 4);
    let arg_of = |r: Result<Vec<Dispatch>>| match r {
        Err(Error::DType { op, arg, .. }) | Err(Error::Shape { op, arg, .. }) => (op, arg),
        other => panic!("expected an argument error, got {other:?}"),
    };
    let op = "attention_decode";
    attention_decode(&q, &k, &v, &step, &part, &out, p, 4).unwrap();
    let q2 = dev.alloc(DType::F32, &[2, c.width()]).unwrap();
    let out2 = dev.alloc(DType::F32, &[2, c.width()]).unwrap();
    assert_eq!(
        arg_of(attention_decode(&q2, &k, &v, &step, &part, &out2, p, 4)),
        (op, "q")
    );
    let part_small = dev.alloc(DType::F32, &[part.elems() - 1]).unwrap();
    assert_eq!(
        arg_of(attention_decode(&q, &k, &v, &step, &part_small, &out, p, 4)),
        (op, "partials")
    );
    // A scratch sized for another chunk length is rejected too.
    assert_eq!(
        arg_of(attention_decode(&q, &k, &v, &step, &part, &out, p, 3)),
        (op, "partials")
    );
    let part16 = dev.alloc(DType::F16, &[part.elems()]).unwrap();
    assert_eq!(
        arg_of(attention_decode(&q, &k, &v, &step, &part16, &out, p, 4)),
        (op, "partials")
    );
    assert_eq!(
        arg_of(attention_decode(&q, &k, &v, &step, &part, &out, p, 0)),
        (op, "chunk_len")
    );
    let v16 = dev.alloc(DType::F16, &c.cache_dims()).unwrap();
    assert_eq!(
        arg_of(attention_decode(&q, &k, &v16, &step, &part, &out, p, 4)),
        (op, "v_cache")
    );
    assert!(matches!(
        attention_decode_scratch_len(p, 16, 0),
        Err(Error::Shape {
            arg: "chunk_len",
            ..
        })
    ));
    assert_eq!(
        attention_decode_scratch_len(p, 16, 5).unwrap(),
        4 * c.n_head * 66 + c.n_head,
        "four chunks of records, then one counter per head"
    );
    let part_out = part.view(0, DType::F32, &[1, c.width()]).unwrap();
    assert!(matches!(
        attention_decode(&q, &k, &v, &step, &part, &part_out, p, 4),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn decode_out_of_range_position_is_a_kernel_error() {
    let dev = Device::cpu(2).unwrap();
    let c = cases(&[1], &[0], 16)[3];
    let inp = inputs(&c);
    let run = |pos0: i32| -> Result<()> {
        let [q, k, v, step, out] = buffers(&dev, &c, &inp, pos0);
        let part = scratch(&dev, &c, 5);
        let mut s = Executor::new(dev.clone()).begin(Mode::Direct);
        s.attention_decode(&q, &k, &v, &step, &part, &out, c.params(), 5)?;
        s.finish(&Plan::SEQUENTIAL).map(|_| ())
    };
    run(15).unwrap();
    for pos0 in [16, -1, i32::MIN] {
        match run(pos0) {
            Err(Error::Kernel { kernel, msg }) => {
                assert!(kernel.starts_with("attention_decode_partial_"), "{kernel}");
                assert!(msg.contains("pos0"), "{msg}");
            }
            other => panic!("pos0 {pos0}: expected a kernel error, got {other:?}"),
        }
    }
}

/// The tensor-core prompt attention is chosen where the op is recorded: heads of 64 and 128
/// values from 64 rows, a block of 128 threads per 64 rows and head; with an f32 cache, K and V
/// tiles of 64 rows (padded by 8 values) in f16 and two f32 slots of 64 rows for the next tile's
/// copies, with an f16 cache Q, K and V tiles in f16; other head sizes and shorter passes keep
/// the one-row form. The CPU runs the same function for both kernels.
#[test]
fn the_tensor_core_attention_takes_heads_of_64_and_128_from_64_rows() {
    let dev = Device::cpu(2).unwrap();
    let launch_in = |cache: DType, n_head: usize, n_kv: usize, hd: usize, rows: usize| {
        let q = dev.alloc(DType::F32, &[rows, n_head * hd]).unwrap();
        let k = dev.alloc(cache, &[n_kv, 1024, hd]).unwrap();
        let v = dev.alloc(cache, &[n_kv, 1024, hd]).unwrap();
        let step = dev.alloc(DType::I32, &[2]).unwrap();
        let out = dev.alloc(DType::F32, &[rows, n_head * hd]).unwrap();
        let d = attention(
            &q,
            &k,
            &v,
            &step,
            &out,
            AttentionParams::new(n_head, n_kv, hd),
        )
        .unwrap();
        let g = d.grid();
        let mma = ka::ATTENTION_MMA
            .iter()
            .any(|k| d.kernel() == KernelId::of(k));
        (mma, g.blocks[0], g.threads[0], g.shared_bytes)
    };
    let launch = |n_head, n_kv, hd, rows| launch_in(DType::F32, n_head, n_kv, hd, rows);
    // SmolLM2 (9 heads of 64), 512 rows: 8 row tiles a head.
    let pipelined = |hd: u32| 2 * 64 * (hd + 8) * 2 + 2 * 64 * hd * 4;
    assert_eq!(launch(9, 3, 64, 512), (true, 72, 128, pipelined(64)));
    // Llama 3 8B (32 heads of 128), 100 rows: 2 row tiles a head.
    assert_eq!(launch(32, 8, 128, 100), (true, 64, 128, pipelined(128)));
    // An f16 cache: two pairs of K and V tiles.
    assert_eq!(
        launch_in(DType::F16, 32, 8, 128, 100),
        (true, 64, 128, 4 * 64 * 136 * 2)
    );
    // Under 64 rows, or heads of 40 or 256: one block per row and head.
    assert!(!launch(9, 3, 64, 63).0);
    assert!(!launch(6, 1, 40, 512).0);
    assert!(!launch(4, 1, 256, 512).0);
}
