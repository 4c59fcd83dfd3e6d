//! Tests of the sliding window of the `attention` op family (Gemma 3's sliding layers: the query
//! at position `i` sees keys `i - W < j <= i`) against the float64 reference of
//! `attention_tests.rs`, on seeded random inputs: Gemma 3 270M's shapes (4 query heads, 1 KV head,
//! head_dim 256, scale 1/16, W = 512) and small odd ones (head_dim 64 and 40; 3, 4 or 9 heads;
//! windows 1, 5, 17, 512). Tolerance: `ATOL` (1e-5) absolute against the reference, as for full
//! attention; decode against prefill 1e-6. Every case whose window excludes a key also checks
//! that the result differs from full attention by more than 100 x `ATOL`, so no case passes
//! without the window.

use super::tests::{
    buffers, inputs, reference, run_decode, run_prefill, scratch, Case, Inputs, ATOL,
};
use super::*;
use crate::testutil::{assert_close, max_abs_diff};
use crate::{Device, Executor, Mode, Plan};

/// How far a windowed result must lie from full attention for the window to count as tested.
const MATTERS: f32 = 100.0 * ATOL;

/// Gemma 3 270M's attention: 4 query heads, 1 KV head of 256, scale 1/16.
fn gemma(max_ctx: usize, pos0: usize, rows: usize, window: usize, f16_cache: bool) -> Case {
    Case {
        n_head: 4,
        n_kv_head: 1,
        head_dim: 256,
        max_ctx,
        pos0,
        rows,
        f16_cache,
        softcap: None,
        scale: Some(1.0 / 16.0),
        window: Some(window),
        seed: 7000 + (max_ctx * 31 + pos0 * 7 + rows + window) as u64,
    }
}

/// A small odd shape: `n_head` query heads over `n_kv_head` KV heads of `head_dim`.
fn small(heads: (usize, usize, usize), max_ctx: usize, pos0: usize, rows: usize) -> Case {
    let (n_head, n_kv_head, head_dim) = heads;
    Case {
        n_head,
        n_kv_head,
        head_dim,
        max_ctx,
        pos0,
        rows,
        f16_cache: false,
        softcap: None,
        scale: None,
        window: None,
        seed: 8000 + (n_head * 1000 + head_dim * 100 + max_ctx + pos0 * 3 + rows) as u64,
    }
}

/// The first key the row at position `pos` sees.
fn first_key(c: &Case, pos: usize) -> usize {
    c.window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// When the window of `c` hides a key from some row: checks that `got` lies far from full
/// attention (else the case could not tell a window from none).
fn check_window_matters(c: &Case, inp: &Inputs, got: &[f32], what: &str) {
    if first_key(c, c.pos0 + c.rows - 1) == 0 {
        return;
    }
    let full = reference(&Case { window: None, ..*c }, inp);
    let diff = max_abs_diff(got, &full);
    assert!(
        diff > MATTERS,
        "{what}: the window changed the result by only {diff} (must exceed {MATTERS}); the case \
         cannot tell the window from full attention"
    );
}

#[test]
fn window_zero_is_refused_with_a_clear_error() {
    let dev = Device::cpu(1).unwrap();
    let c = Case {
        window: Some(0),
        ..small((3, 1, 64), 16, 0, 1)
    };
    let inp = inputs(&c);
    let [q, k, v, step, out] = buffers(&dev, &c, &inp, 0);
    let part = scratch(&dev, &Case { window: None, ..c }, 4);
    let check = |r: Result<()>, op: &str| match r {
        Err(Error::Shape { op: o, arg, msg }) => {
            assert_eq!((o, arg), (op, "params"));
            assert!(msg.contains("window 0"), "{msg}");
        }
        other => panic!("{op}: expected a params error for window 0, got {other:?}"),
    };
    check(
        attention(&q, &k, &v, &step, &out, c.params()).map(|_| ()),
        "attention",
    );
    check(
        attention_decode(&q, &k, &v, &step, &part, &out, c.params(), 4).map(|_| ()),
        "attention_decode",
    );
    // A window of 1 is the smallest one: each row sees only itself.
    attention(&q, &k, &v, &step, &out, c.params().with_window(1)).unwrap();
}

#[test]
fn window_param_defaults_to_none_and_travels_as_u32() {
    let p = AttentionParams::new(4, 1, 256);
    assert_eq!(p.window, None);
    assert_eq!(p.window_arg(), 0);
    assert_eq!(p.with_window(512).window, Some(512));
    assert_eq!(p.with_window(512).window_arg(), 512);
    // Past 32 bits: the same as none for any i32 position, sent as the largest window.
    assert_eq!(p.with_window(usize::MAX).window_arg(), u32::MAX);
}

/// Prefill of `c` against the reference (direct or recorded), and the window-matters check.
fn check_prefill(dev: &Device, c: &Case, mode: Mode) {
    let inp = inputs(c);
    let want = reference(c, &inp);
    let got = run_prefill(dev, c, &inp, mode).unwrap();
    let what = format!("prefill {mode:?} {c:?}");
    assert_close(&got, &want, ATOL, 0.0, &what);
    check_window_matters(c, &inp, &got, &what);
}

#[test]
fn prefill_with_window_matches_f64_reference_gemma_shapes() {
    let dev = Device::cpu(2).unwrap();
    // A whole 824-token prompt: rows 0..=511 see every earlier key, later rows only 512.
    check_prefill(&dev, &gemma(824, 0, 824, 512, false), Mode::Direct);
    // A chunk of a prompt starting at step 600 (every row's window starts inside the cache).
    check_prefill(&dev, &gemma(640, 600, 30, 512, false), Mode::Recorded);
    check_prefill(&dev, &gemma(640, 600, 30, 512, true), Mode::Direct);
    // A chunk straddling the window's size: rows at positions 500..=539.
    check_prefill(&dev, &gemma(600, 500, 40, 512, true), Mode::Recorded);
}

#[test]
fn prefill_with_window_matches_f64_reference_small_shapes() {
    let dev = Device::cpu(2).unwrap();
    let mut n = 0;
    for (heads, window) in [
        ((3, 1, 64), 1),
        ((3, 1, 64), 5),
        ((3, 1, 64), 17),
        ((3, 1, 64), 512),
        ((4, 2, 40), 17),
        ((9, 3, 64), 5),
    ] {
        // (pos0, rows): a first pass crossing the window, a short pass, a late chunked pass.
        for (pos0, rows) in [(0, 40), (13, 9), (600, 30)] {
            n += 1;
            let c = Case {
                window: Some(window),
                f16_cache: n % 2 == 0,
                softcap: (n % 3 == 0).then_some(1.5),
                ..small(heads, 640, pos0, rows)
            };
            let mode = if n % 2 == 0 {
                Mode::Direct
            } else {
                Mode::Recorded
            };
            check_prefill(&dev, &c, mode);
        }
    }
}

/// The categories of decode cases a test must cover (counted, then asserted).
#[derive(Default, Debug)]
struct Coverage {
    /// The window reaches the first key (position below the window).
    below: usize,
    /// The position is exactly `W - 1` (the last with every key) or `W` (the first without).
    at: usize,
    /// Whole chunks lie before the window and are skipped.
    skipped: usize,
    /// The window starts inside a chunk (that chunk is masked).
    inside: usize,
    /// The window starts exactly on a chunk boundary.
    boundary: usize,
}

impl Coverage {
    fn add(&mut self, c: &Case, chunk_len: usize) {
        let (pos, w) = (c.pos0, c.window.expect("a windowed case"));
        let lo = first_key(c, pos);
        if lo == 0 {
            self.below += 1;
        }
        if pos + 1 == w || pos == w {
            self.at += 1;
        }
        if lo >= chunk_len {
            self.skipped += 1;
        }
        if lo > 0 && !lo.is_multiple_of(chunk_len) {
            self.inside += 1;
        }
        if lo > 0 && lo.is_multiple_of(chunk_len) {
            self.boundary += 1;
        }
    }

    fn assert_all(&self) {
        let Coverage {
            below,
            at,
            skipped,
            inside,
            boundary,
        } = *self;
        assert!(
            below > 0 && at > 0 && skipped > 0 && inside > 0 && boundary > 0,
            "not every kind of decode case ran: {self:?}"
        );
    }
}

/// Decode of `c` with each chunk length against the reference and the one-row prefill.
fn check_decode(dev: &Device, c: &Case, chunks: &[usize], cov: &mut Coverage) {
    let inp = inputs(c);
    let want = reference(c, &inp);
    let prefill = run_prefill(dev, c, &inp, Mode::Direct).unwrap();
    for (i, &chunk_len) in chunks.iter().enumerate() {
        cov.add(c, chunk_len);
        let mode = if i % 2 == 0 {
            Mode::Recorded
        } else {
            Mode::Direct
        };
        let got = run_decode(dev, c, &inp, chunk_len, mode).unwrap();
        let what = format!(
            "decode chunk_len {chunk_len} (first key {}) {c:?}",
            first_key(c, c.pos0)
        );
        assert_close(&got, &want, ATOL, 0.0, &what);
        assert_close(&got, &prefill, 1e-6, 0.0, &format!("{what} vs prefill"));
        check_window_matters(c, &inp, &got, &what);
    }
}

#[test]
fn decode_with_window_matches_f64_reference_gemma_shapes() {
    let dev = Device::cpu(2).unwrap();
    let mut cov = Coverage::default();
    // W = 512; chunks of 32 (CUDA's), 256 (the CPU's), 64 and 100. First keys: 0 (below and at
    // W), 1, 256 (a boundary of every chunk but 100), 300 (a boundary of 100 only), 489, 588.
    for (pos, f16_cache) in [
        (100, false),
        (511, true),
        (512, false),
        (767, true),
        (811, false),
        (1000, true),
        (1099, false),
    ] {
        let c = gemma(1100, pos, 1, 512, f16_cache);
        check_decode(&dev, &c, &[32, 64, 100, 256], &mut cov);
    }
    cov.assert_all();
}

#[test]
fn decode_with_window_matches_f64_reference_small_shapes() {
    let dev = Device::cpu(2).unwrap();
    let mut cov = Coverage::default();
    let mut n = 0;
    for (heads, window, max_ctx) in [
        ((3, 1, 64), 1, 160),
        ((3, 1, 64), 5, 160),
        ((3, 1, 64), 17, 160),
        ((3, 1, 64), 512, 700),
        ((4, 2, 40), 17, 160),
        ((9, 3, 64), 5, 160),
    ] {
        let positions = [
            0,
            window / 2,
            window - 1,
            window,
            window + 1,
            2 * window + 3,
        ];
        let mut positions: Vec<usize> = positions
            .into_iter()
            .chain([max_ctx - 1])
            .filter(|&p| p < max_ctx)
            .collect();
        positions.dedup();
        for pos in positions {
            n += 1;
            let c = Case {
                window: Some(window),
                f16_cache: n % 2 == 0,
                softcap: (n % 3 == 0).then_some(1.5),
                ..small(heads, max_ctx, pos, 1)
            };
            check_decode(&dev, &c, &[1, 4, 5, 7, 16, 64, 256], &mut cov);
        }
    }
    cov.assert_all();
}

/// Replaces every K and V value at positions `..end` of every KV head with NaN.
fn poison_before(c: &Case, inp: &mut Inputs, end: usize) {
    let hd = c.head_dim;
    for kv in 0..c.n_kv_head {
        let rows = kv * c.max_ctx * hd..(kv * c.max_ctx + end) * hd;
        inp.k[rows.clone()].fill(f32::NAN);
        inp.v[rows].fill(f32::NAN);
    }
}

/// Asserts that every value is finite and close to the reference.
fn assert_finite_and_close(got: &[f32], want: &[f32], what: &str) {
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        panic!(
            "{what}: element {i} is {}: a key or record before the window was read",
            got[i]
        );
    }
    assert_close(got, want, ATOL, 0.0, what);
}

#[test]
fn keys_and_records_before_the_window_are_never_read() {
    // The cache holds NaN at every position before the window's first key, and the decode
    // scratch starts as NaN: a kernel that reads a key before the window (in a skipped chunk or
    // in the masked part of the first chunk) or a record of a skipped chunk gives NaN.
    let dev = Device::cpu(2).unwrap();
    for (c, chunks) in [
        // First key 489: inside a chunk of 32 and of 256, on a boundary of 163.
        (gemma(1100, 1000, 1, 512, false), &[32, 256, 163][..]),
        // First key 13: inside a chunk of 4 and of 5, on a boundary of 1 and of 13.
        (
            Case {
                window: Some(17),
                f16_cache: true,
                ..small((3, 1, 64), 64, 29, 1)
            },
            &[1, 4, 5, 13][..],
        ),
    ] {
        let lo = first_key(&c, c.pos0);
        let mut inp = inputs(&c);
        poison_before(&c, &mut inp, lo);
        let want = reference(&c, &inp);
        for &chunk_len in chunks {
            let [q, k, v, step, out] = buffers(&dev, &c, &inp, c.pos0 as i32);
            let part = scratch(&dev, &c, chunk_len);
            dev.write(&part, &vec![f32::NAN; part.elems()]).unwrap();
            let mut s = Executor::new(dev.clone()).begin(Mode::Recorded);
            s.attention_decode(&q, &k, &v, &step, &part, &out, c.params(), chunk_len)
                .unwrap();
            s.finish(&Plan::OPTIMIZED).unwrap();
            let got: Vec<f32> = dev.download(&out).unwrap();
            let what = format!("decode chunk_len {chunk_len} first key {lo} {c:?}");
            assert_finite_and_close(&got, &want, &what);
        }
    }
    // Prefill: rows at 600..630 with W = 512 see keys from 89 on; keys before are NaN.
    let c = gemma(640, 600, 30, 512, true);
    let mut inp = inputs(&c);
    poison_before(&c, &mut inp, first_key(&c, c.pos0));
    let want = reference(&c, &inp);
    let got = run_prefill(&dev, &c, &inp, Mode::Direct).unwrap();
    assert_finite_and_close(&got, &want, &format!("prefill {c:?}"));
}

#[test]
fn decode_graph_with_window_recorded_once_serves_every_step() {
    // One recorded decode graph (window 17, chunks of 5) replayed at every position of the
    // cache: the chunks skipped, masked and combined follow the step buffer alone.
    let dev = Device::cpu(2).unwrap();
    let exec = Executor::new(dev.clone());
    let c = Case {
        window: Some(17),
        f16_cache: true,
        ..small((3, 1, 64), 96, 0, 1)
    };
    let inp = inputs(&c);
    let [q, k, v, step, out] = buffers(&dev, &c, &inp, 0);
    let partials = scratch(&dev, &c, 5);
    let mut s = exec.begin(Mode::Recorded);
    s.attention_decode(&q, &k, &v, &step, &partials, &out, c.params(), 5)
        .unwrap();
    let mut graph = s.into_graph().unwrap();
    let report = Executor::optimize(&mut graph, &Plan::OPTIMIZED, dev.capabilities());
    assert_eq!((report.dispatches, report.barriers), (2, 1), "{report:?}");
    for pos0 in 0..c.max_ctx {
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
fn no_window_and_a_window_covering_the_cache_agree_bitwise() {
    // `None` runs the code paths of full attention (first key 0); so does any window at least
    // the cache length, so all of them give the same bits.
    let dev = Device::cpu(2).unwrap();
    for (heads, f16_cache) in [((4, 1, 256), false), ((3, 1, 64), true)] {
        let base = Case {
            f16_cache,
            ..small(heads, 200, 150, 1)
        };
        let wide = [None, Some(200), Some(1 << 20), Some(usize::MAX)];
        for (pos0, rows) in [(150, 1), (0, 200), (120, 40)] {
            let runs: Vec<Vec<f32>> = wide
                .iter()
                .map(|&window| {
                    let c = Case {
                        window,
                        pos0,
                        rows,
                        ..base
                    };
                    let inp = inputs(&c);
                    let mut all = run_prefill(&dev, &c, &inp, Mode::Direct).unwrap();
                    if rows == 1 {
                        for chunk_len in [7, 64, 256] {
                            all.extend(
                                run_decode(&dev, &c, &inp, chunk_len, Mode::Recorded).unwrap(),
                            );
                        }
                    }
                    all
                })
                .collect();
            for (w, r) in wide.iter().zip(&runs).skip(1) {
                let same = r
                    .iter()
                    .zip(&runs[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "window {w:?} differs from none: {heads:?} pos0 {pos0} rows {rows}"
                );
            }
        }
    }
}

#[test]
fn windowed_decode_passes_the_schedule_sanitizer() {
    // The partial pass writes only the records of live chunks and the combine reads only those:
    // the declarations (records written whole, read by the combine) stay truthful, which the
    // sanitizer checks with the records poisoned between passes.
    use crate::sanitize::{sanitize, SanitizeInput};
    let dev = Device::cpu(2).unwrap();
    let exec = Executor::new(dev.clone());
    for (window, chunk_len, pos0) in [(17usize, 5usize, 60i32), (17, 4, 12), (5, 16, 95)] {
        let c = Case {
            window: Some(window),
            ..small((3, 1, 64), 96, pos0 as usize, 1)
        };
        let inp = inputs(&c);
        let [q, k, v, step, out] = buffers(&dev, &c, &inp, pos0);
        let partials = scratch(&dev, &c, chunk_len);
        let records = attention_decode_records(&partials, c.params()).unwrap();
        let mut s = exec.begin(Mode::Recorded);
        s.attention_decode(&q, &k, &v, &step, &partials, &out, c.params(), chunk_len)
            .unwrap();
        let graph = s.into_graph().unwrap();
        let outputs = [("out".to_string(), out.clone())];
        let input = SanitizeInput {
            graph: &graph,
            scratch: std::slice::from_ref(&records),
            outputs: &outputs,
        };
        let report = sanitize(&exec, &Plan::OPTIMIZED, &input).unwrap();
        let what = format!("window {window} chunk_len {chunk_len} pos0 {pos0}");
        assert!(report.passed(), "{what}: {}", report.verdict());
        // The sanitizer restores the outputs; the graph itself, run once more, is right.
        exec.run(&graph, false).unwrap();
        let got: Vec<f32> = dev.download(&out).unwrap();
        assert_finite_and_close(&got, &reference(&c, &inp), &what);
    }
}

#[test]
fn every_kernel_gets_the_window_and_the_decode_grid_fits_it() {
    // The window reaches each kernel as its `window` scalar (0 for none), and the two-dispatch
    // decode grid holds the chunks a window can touch, ceil(W / chunk_len) + 1, not the cache's.
    use crate::graph::Scalar;
    let dev = Device::cpu(1).unwrap();
    let c = small((4, 1, 64), 4096, 0, 1);
    let inp = inputs(&c);
    let [q, k, v, step, out] = buffers(&dev, &c, &inp, 0);
    let part = scratch(&dev, &c, 32);
    let window_of = |d: &Dispatch| {
        let at = d
            .kernel()
            .sig()
            .index_of("window")
            .expect("a window parameter");
        match d.args()[at] {
            Arg::Scalar(Scalar::U32(w)) => w,
            ref other => panic!("{}: window is {other:?}", d.kernel().name()),
        }
    };
    for (window, blocks) in [
        (None, 128),
        (Some(512), 17),
        (Some(1), 2),
        (Some(10_000), 128),
    ] {
        let p = AttentionParams {
            window,
            ..c.params()
        };
        let want = window.map_or(0, |w| w as u32);
        assert_eq!(
            window_of(&attention(&q, &k, &v, &step, &out, p).unwrap()),
            want
        );
        for single in [true, false] {
            let ds = attention_decode_as(&q, &k, &v, &step, &part, &out, p, 32, single).unwrap();
            assert_eq!(ds.len(), if single { 1 } else { 2 });
            for d in &ds {
                assert_eq!(window_of(d), want, "{}", d.kernel().name());
            }
            // The one-dispatch form of 64-wide heads is the split form: its grid is sized by
            // the target block count, whatever the window (at run time its splits cover the
            // keys from the window's first to pos0): 4 owners (one query head a block with one
            // KV head) x 33 splits (132 blocks, one an SM of an H100).
            let want_blocks = if single { 132 } else { blocks * 4 };
            assert_eq!(
                ds[0].grid().blocks[0] * ds[0].grid().blocks[1],
                want_blocks,
                "window {window:?}: blocks of {}",
                ds[0].kernel().name()
            );
        }
    }
}
