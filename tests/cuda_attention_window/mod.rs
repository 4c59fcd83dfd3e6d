//! The sliding window of the attention op (Gemma 3's sliding layers: the query at position `i`
//! sees keys `i - W < j <= i`) on CUDA against the CPU backend, whose kernels the library's tests
//! hold to a float64 reference. Part of `cuda_ops.rs`; every test needs a GPU.
//!
//! Tolerance, as for full attention in `cuda_ops.rs`: `|cuda - cpu| <= 2e-5 + 2e-4 |cpu|` for the
//! outputs (weighted means of values in [-1, 1], summed in another order). The decode scratch's
//! records are each backend's own (per chunk on the CPU, per split of the run-time length in
//! CUDA's split form), so only CUDA's counters after them are checked: they must end at zero. Shapes: Gemma 3 270M (4 query heads, 1 KV head,
//! head_dim 256, scale 1/16, W = 512) and small odd ones (head_dim 64, which takes the CUDA
//! kernels' four-value path, and 40, the scalar path). Decode runs CUDA's one-launch form against
//! the CPU's partial + combine, with chunk lengths that put the window's first key inside a chunk
//! and exactly on a chunk boundary.

use crate::cuda_harness::*;
use crate::cuda_open::cuda_device;
use onepass::executable::StableSet;
use onepass::ops::attention::{attention_decode_scratch_len, AttentionParams};
use onepass::{Buffer, DType, Device, Executor, Mode, Plan};

const ATOL: f64 = 2e-5;
const RTOL: f64 = 2e-4;

/// One attention case: heads, cache, pass and window.
#[derive(Debug, Clone, Copy)]
struct Case {
    n_head: usize,
    n_kv: usize,
    hd: usize,
    max_ctx: usize,
    pos0: usize,
    rows: usize,
    cache: DType,
    window: Option<usize>,
    softcap: Option<f32>,
    /// Gemma's 1/16 instead of the default 1/sqrt(hd).
    gemma_scale: bool,
}

impl Case {
    fn gemma(max_ctx: usize, pos0: usize, rows: usize, cache: DType) -> Case {
        Case {
            n_head: 4,
            n_kv: 1,
            hd: 256,
            max_ctx,
            pos0,
            rows,
            cache,
            window: Some(512),
            softcap: None,
            gemma_scale: true,
        }
    }

    fn small(heads: (usize, usize, usize), window: usize, max_ctx: usize) -> Case {
        Case {
            n_head: heads.0,
            n_kv: heads.1,
            hd: heads.2,
            max_ctx,
            pos0: 0,
            rows: 1,
            cache: DType::F32,
            window: Some(window),
            softcap: None,
            gemma_scale: false,
        }
    }

    fn at(self, pos0: usize, rows: usize) -> Case {
        Case { pos0, rows, ..self }
    }

    fn params(&self) -> AttentionParams {
        let mut p = AttentionParams::new(self.n_head, self.n_kv, self.hd);
        if self.gemma_scale {
            p = p.with_scale(1.0 / 16.0);
        }
        if let Some(cap) = self.softcap {
            p = p.with_softcap(cap);
        }
        if let Some(w) = self.window {
            p = p.with_window(w);
        }
        p
    }

    fn width(&self) -> usize {
        self.n_head * self.hd
    }

    /// The first key the last row sees.
    fn first_key_of_last_row(&self) -> usize {
        let pos = self.pos0 + self.rows - 1;
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    fn seed(&self) -> u64 {
        (self.n_head * 100_000 + self.hd * 1000 + self.max_ctx) as u64 * 31
            + (self.pos0 * 7 + self.rows) as u64
    }

    /// q (scaled by 2 so the softmax is not flat), K and V caches, and the step.
    fn inputs(&self) -> [Host; 4] {
        let s = self.seed();
        let cache = [self.n_kv, self.max_ctx, self.hd];
        [
            random_tensor(DType::F32, &[self.rows, self.width()], 2.0, s),
            random_tensor(self.cache, &cache, 1.0, s + 1),
            random_tensor(self.cache, &cache, 1.0, s + 2),
            i32_tensor(&[self.pos0 as i32, 0], &[2]),
        ]
    }

    fn scratch_len(&self, chunk: usize) -> usize {
        attention_decode_scratch_len(self.params(), self.max_ctx, chunk).unwrap()
    }
}

/// Prefill of `c` on CUDA against the CPU, and the check that the window matters.
fn prefill(dev: &Device, c: Case) {
    let params = c.params();
    let what = format!("prefill {c:?}");
    let out = [(DType::F32, vec![c.rows, c.width()])];
    let ins = c.inputs();
    let op = |s: &mut onepass::Session, i: &[Buffer], o: &[Buffer]| {
        s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], params)
    };
    compare(&what, dev, &ins, &out, ATOL, RTOL, &op);
    window_matters(dev, c, &what, &ins, &op);
}

/// Decode of `c` (one row) with chunks of `chunk` on CUDA against the CPU, records included.
fn decode(dev: &Device, c: Case, chunk: usize) {
    let params = c.params();
    let lo = c.first_key_of_last_row();
    let what = format!(
        "decode chunk {chunk} (first key {lo}: {}) {c:?}",
        if lo.is_multiple_of(chunk) {
            "on a chunk boundary"
        } else {
            "inside a chunk"
        }
    );
    // The scratch starts zeroed (the CUDA counters must end at zero again).
    let n = c.scratch_len(chunk);
    let mut ins = c.inputs().to_vec();
    ins.push(float_tensor(&vec![0.0; n], DType::F32, &[n]));
    let out = [(DType::F32, vec![1, c.width()])];
    let op = move |s: &mut onepass::Session, i: &[Buffer], o: &[Buffer]| {
        s.attention_decode(&i[0], &i[1], &i[2], &i[3], &i[4], &o[0], params, chunk)
    };
    let cuda = run_on(dev, &ins, &out, &op);
    let host = run_on(&Device::cpu(2).unwrap(), &ins, &out, &op);
    for (t, name) in ["q", "k_cache", "v_cache", "step"].iter().enumerate() {
        assert!(
            cuda[t] == ins[t].bytes,
            "{what}: CUDA changed the input {name}"
        );
    }
    let (got, want) = (to_f32(&cuda[5]), to_f32(&host[5]));
    assert_close_finite(&format!("{what}: out"), &got, &want, ATOL);
    // The records are the backend's: per chunk on the CPU, per split of the run-time length
    // in CUDA's split form (heads of 64, 128, 256); only the counters after them are defined.
    let records = n - c.n_head;
    let got = to_f32(&cuda[4]);
    let counters: Vec<u32> = got[records..].iter().map(|x| x.to_bits()).collect();
    assert!(
        counters.iter().all(|&c| c == 0),
        "{what}: the counters ended at {counters:?}, not zero"
    );
    window_matters(dev, c, &what, &ins, &op);
}

/// When the window hides a key from the last row: CUDA's windowed result (`op` on `ins`, its
/// output after the inputs) must lie farther from the CPU's full attention than ten times the
/// tolerance, at some element (else the case cannot tell the window from none).
fn window_matters(dev: &Device, c: Case, what: &str, ins: &[Host], op: &OpFn<'_>) {
    if c.first_key_of_last_row() == 0 {
        return;
    }
    let out = [(DType::F32, vec![c.rows, c.width()])];
    let got = run_on(dev, ins, &out, op);
    let full = Case { window: None, ..c }.params();
    let cpu = Device::cpu(2).unwrap();
    let want = run_on(&cpu, &c.inputs(), &out, &|s, i, o| {
        s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], full)
    });
    let (g, w) = (
        to_f64(&got[ins.len()], DType::F32),
        to_f64(&want[4], DType::F32),
    );
    // The largest difference in units of the element's tolerance.
    let apart = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs() / (ATOL + RTOL * b.abs()))
        .fold(0.0, f64::max);
    assert!(
        apart > 10.0,
        "{what}: the windowed result lies within {apart:.2} tolerances of full attention (must \
         exceed 10)"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_window_prefill() {
    let dev = cuda_device();
    for cache in [DType::F32, DType::F16] {
        // A whole 824-token prompt, and a chunk of a prompt starting at step 600.
        prefill(&dev, Case::gemma(824, 0, 824, cache));
        prefill(&dev, Case::gemma(640, 600, 30, cache));
        for (heads, window) in [
            ((3, 1, 64), 1),
            ((3, 1, 64), 5),
            ((3, 1, 64), 17),
            ((3, 1, 64), 512),
            ((4, 2, 40), 17),
        ] {
            for (pos0, rows) in [(0, 40), (13, 9), (600, 30)] {
                let c = Case {
                    cache,
                    ..Case::small(heads, window, 640).at(pos0, rows)
                };
                prefill(&dev, c);
            }
        }
    }
    let capped = Case {
        softcap: Some(1.5),
        ..Case::small((3, 1, 64), 17, 640).at(600, 30)
    };
    prefill(&dev, capped);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_window_decode() {
    let dev = cuda_device();
    for cache in [DType::F32, DType::F16] {
        // W = 512. First keys: 0 (positions 100 and 511), 1 (512), 256 (767: a boundary of
        // 32, 64 and 256), 300 (811: a boundary of 100), 489 (1000), 588 (1099).
        for pos in [100, 511, 512, 767, 811, 1000, 1099] {
            for chunk in [32, 64, 100, 256] {
                decode(&dev, Case::gemma(1100, pos, 1, cache), chunk);
            }
        }
        for (heads, window, max_ctx) in [
            ((3, 1, 64), 1, 160),
            ((3, 1, 64), 5, 160),
            ((3, 1, 64), 17, 160),
            ((3, 1, 64), 512, 700),
            ((4, 2, 40), 17, 160),
        ] {
            let c = Case {
                cache,
                ..Case::small(heads, window, max_ctx)
            };
            for pos in [
                0,
                window - 1,
                window,
                window + 1,
                2 * window + 3,
                max_ctx - 1,
            ] {
                if pos < max_ctx {
                    for chunk in [1, 4, 5, 7, 16, 64] {
                        decode(&dev, c.at(pos, 1), chunk);
                    }
                }
            }
        }
    }
}

/// Asserts `got` finite and within `atol + RTOL |want|` of `want`; prints the worst error.
fn assert_close_finite(what: &str, got: &[f32], want: &[f32], atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() && w.is_finite(),
            "{what}: element {i}: cuda {g}, cpu {w} (a key or record before the window was read, \
             or a record was never written)"
        );
        let err = (g as f64 - w as f64).abs();
        assert!(
            err <= atol + RTOL * (w as f64).abs(),
            "{what}: element {i}: cuda {g}, cpu {w} (atol {atol}, rtol {RTOL})"
        );
        if err > worst.0 {
            worst = (err, i);
        }
    }
    eprintln!("{what}: max abs error {:.3e} at {}", worst.0, worst.1);
}

/// The inputs of `c` with every K and V value before position `end` replaced by NaN.
fn poisoned_inputs(c: &Case, end: usize) -> [Host; 4] {
    let s = c.seed();
    let mut k = random_f32(c.n_kv * c.max_ctx * c.hd, 1.0, s + 1);
    let mut v = random_f32(c.n_kv * c.max_ctx * c.hd, 1.0, s + 2);
    for kv in 0..c.n_kv {
        let rows = kv * c.max_ctx * c.hd..(kv * c.max_ctx + end) * c.hd;
        k[rows.clone()].fill(f32::NAN);
        v[rows].fill(f32::NAN);
    }
    let dims = [c.n_kv, c.max_ctx, c.hd];
    let [q, _, _, step] = c.inputs();
    [
        q,
        float_tensor(&k, c.cache, &dims),
        float_tensor(&v, c.cache, &dims),
        step,
    ]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_window_reads_nothing_before_the_window() {
    // NaN in the cache before the window's first key, and NaN in every record of the scratch
    // (its counters zero): a kernel that reads a key of a skipped chunk, of the masked part of
    // the first chunk, or a record of a skipped chunk, gives NaN.
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    let cases = [
        // First key 489: inside a chunk of 32, on a boundary of 163.
        (Case::gemma(1100, 1000, 1, DType::F16), &[32, 163][..]),
        (Case::small((3, 1, 64), 17, 64).at(29, 1), &[4, 5, 13][..]),
    ];
    for (c, chunks) in cases {
        let lo = c.first_key_of_last_row();
        let ins = poisoned_inputs(&c, lo);
        let params = c.params();
        for &chunk in chunks {
            let n = c.scratch_len(chunk);
            let mut scratch = vec![f32::NAN; n];
            scratch[n - c.n_head..].fill(0.0);
            let mut all = ins.to_vec();
            all.push(float_tensor(&scratch, DType::F32, &[n]));
            let out = [(DType::F32, vec![1, c.width()])];
            let op = |s: &mut onepass::Session, i: &[Buffer], o: &[Buffer]| {
                s.attention_decode(&i[0], &i[1], &i[2], &i[3], &i[4], &o[0], params, chunk)
            };
            let got = to_f32(&run_on(&dev, &all, &out, &op)[5]);
            let want = to_f32(&run_on(&cpu, &all, &out, &op)[5]);
            let what = format!("poisoned decode chunk {chunk} first key {lo} {c:?}");
            assert_close_finite(&what, &got, &want, ATOL);
        }
    }
    // Prefill: rows at 600..630, W = 512: keys before 89 are NaN.
    let c = Case::gemma(640, 600, 30, DType::F16);
    let ins = poisoned_inputs(&c, c.pos0 + 1 - 512);
    let params = c.params();
    let out = [(DType::F32, vec![c.rows, c.width()])];
    let op = |s: &mut onepass::Session, i: &[Buffer], o: &[Buffer]| {
        s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], params)
    };
    let got = to_f32(&run_on(&dev, &ins, &out, &op)[4]);
    let want = to_f32(&run_on(&cpu, &ins, &out, &op)[4]);
    assert_close_finite(&format!("poisoned prefill {c:?}"), &got, &want, ATOL);
}

fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_window_decode_graph_serves_every_step() {
    // One decode step recorded, optimized and instantiated once (a CUDA graph), replayed at every
    // position: the chunks skipped, masked and merged, and the one-launch counters, follow the
    // step buffer alone. The grid is sized for the window, not the cache.
    let dev = cuda_device();
    let cpu = Device::cpu(2).unwrap();
    let cases = [
        (Case::small((3, 1, 64), 17, 96), 5usize, 1usize),
        (Case::gemma(1100, 0, 1, DType::F16), 32, 7),
    ];
    for (c, chunk, stride) in cases {
        let params = c.params();
        let [q, k, v, _] = c.inputs();
        let up = |h: &Host| dev.upload_bytes(&h.bytes, h.dtype, &h.dims).unwrap();
        let (qb, kb, vb) = (up(&q), up(&k), up(&v));
        let step = dev.upload(&[0i32], &[1]).unwrap();
        let partials = dev.alloc(DType::F32, &[c.scratch_len(chunk)]).unwrap();
        let out = dev.alloc(DType::F32, &[1, c.width()]).unwrap();
        let exec = Executor::new(dev.clone());
        let mut s = exec.begin(Mode::Recorded);
        s.attention_decode(&qb, &kb, &vb, &step, &partials, &out, params, chunk)
            .unwrap();
        let mut graph = s.into_graph().unwrap();
        Executor::optimize(&mut graph, &Plan::OPTIMIZED, dev.capabilities());
        let stable = StableSet::from_named([
            ("q", &qb),
            ("k", &kb),
            ("v", &vb),
            ("step", &step),
            ("partials", &partials),
            ("out", &out),
        ]);
        let replay = exec.instantiate(&graph, &stable).unwrap();
        let mut positions: Vec<usize> = (0..c.max_ctx).step_by(stride).collect();
        positions.extend(
            [511, 512, 513, c.max_ctx - 1]
                .iter()
                .filter(|&&p| p < c.max_ctx),
        );
        for pos in positions {
            dev.write(&step, &[pos as i32]).unwrap();
            replay.run().unwrap();
            let got: Vec<f32> = dev.download(&out).unwrap();
            let ins = [
                q.clone(),
                k.clone(),
                v.clone(),
                i32_tensor(&[pos as i32], &[1]),
            ];
            let o = [(DType::F32, vec![1, c.width()])];
            let want = to_f32(
                &run_on(&cpu, &ins, &o, &|s, i, o| {
                    s.attention(&i[0], &i[1], &i[2], &i[3], &o[0], params)
                })[4],
            );
            let what = format!("replayed step {pos}, chunk {chunk}, {c:?}");
            assert_close_finite(&what, &got, &want, ATOL);
        }
        // The counters are back at zero after the last replay.
        let counters: Vec<f32> = dev.download(&partials).unwrap();
        let tail = &counters[counters.len() - c.n_head..];
        assert!(
            tail.iter().all(|x| x.to_bits() == 0),
            "counters left at {:?}",
            tail.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
