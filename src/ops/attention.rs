//! The `attention` op family: causal scaled dot-product attention of query rows against one
//! layer's KV cache, with grouped-query heads and an optional softcap.
//!
//! Layouts: `q` and `out` are f32 `[rows, n_head * head_dim]`; the K and V caches are
//! `[n_kv_head, max_ctx, head_dim]`, f32 or f16, and already hold the rows of this pass (written
//! by `kv_write`); `step` is an i32 buffer whose element 0 is `pos0`, the absolute position of the
//! first query row. Query row `r` sits at position `pos0 + r` and attends to cache positions
//! `0..=pos0 + r`; query head `h` uses KV head `h / (n_head / n_kv_head)`. Scores are
//! `scale * q.k`, then `cap * tanh(score / cap)` when a softcap is set, then a softmax.
//!
//! The KV length is read from `step` inside the kernels, never passed as a scalar, so a recorded
//! decode graph serves every step. A `pos0` that is negative or puts the last row past `max_ctx`
//! is a kernel error (reported by `Session::finish`), never an out-of-bounds read.
//!
//! Two forms:
//! - [`attention`]: prefill, any number of rows, one dispatch;
//! - [`attention_decode`]: one row, the KV length split into chunks processed in parallel and
//!   then combined (two dispatches and a caller-allocated scratch buffer, see
//!   [`attention_decode_scratch_len`]).

use crate::backend::{Buffer, DType};
use crate::error::{Error, Result};
use crate::graph::{Arg, Dispatch, Grid, KernelId, OpKind};
use crate::ops::Check;
use crate::session::Session;

/// A reasonable KV chunk length for [`attention_decode`].
pub const DEFAULT_DECODE_CHUNK_LEN: usize = 64;

/// Head geometry and score parameters of an attention op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_head: usize,
    /// KV heads; must divide `n_head`.
    pub n_kv_head: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Factor applied to `q.k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// When set, scores become `cap * tanh(score / cap)` before the softmax; `cap > 0`.
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// Parameters with the default scale `1 / sqrt(head_dim)` and no softcap.
    pub fn new(n_head: usize, n_kv_head: usize, head_dim: usize) -> Self {
        AttentionParams {
            n_head,
            n_kv_head,
            head_dim,
            scale: 1.0 / (head_dim.max(1) as f32).sqrt(),
            softcap: None,
        }
    }

    /// The same parameters with another scale.
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }

    /// The same parameters with a softcap.
    pub fn with_softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Values in one row of `q` and `out`: `n_head * head_dim`.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    fn check(&self, c: &Check) -> Result<()> {
        c.require(
            "params",
            self.n_head > 0 && self.n_kv_head > 0 && self.head_dim > 0,
            || {
                format!(
                    "n_head {}, n_kv_head {} and head_dim {} must be positive",
                    self.n_head, self.n_kv_head, self.head_dim
                )
            },
        )?;
        c.require("params", self.n_head % self.n_kv_head == 0, || {
            format!(
                "n_kv_head {} does not divide n_head {}",
                self.n_kv_head, self.n_head
            )
        })?;
        let fits = |v: usize| u32::try_from(v).is_ok();
        c.require(
            "params",
            fits(self.n_head)
                && fits(self.head_dim)
                && self.head_dim.checked_add(2).is_some_and(fits),
            || "n_head and head_dim must fit in 32 bits".into(),
        )?;
        c.require("params", self.scale.is_finite(), || {
            format!("scale {} is not finite", self.scale)
        })?;
        if let Some(cap) = self.softcap {
            c.require("params", cap.is_finite() && cap > 0.0, || {
                format!("softcap {cap} must be finite and positive")
            })?;
        }
        Ok(())
    }
}

/// Elements (f32) of the scratch buffer [`attention_decode`] needs for a cache of `max_ctx`
/// positions cut into chunks of `chunk_len`: `ceil(max_ctx / chunk_len) * n_head * (head_dim + 2)`,
/// laid out `[max_chunks, n_head, head_dim + 2]`.
pub fn attention_decode_scratch_len(
    params: AttentionParams,
    max_ctx: usize,
    chunk_len: usize,
) -> Result<usize> {
    let c = Check::op("attention_decode");
    c.require("chunk_len", chunk_len > 0, || {
        "chunk_len must be positive".into()
    })?;
    c.require("k_cache", max_ctx > 0, || "max_ctx must be positive".into())?;
    max_chunks(max_ctx, chunk_len)
        .checked_mul(params.n_head)
        .and_then(|n| n.checked_mul(params.head_dim.checked_add(2)?))
        .ok_or_else(|| Error::shape("attention_decode", "partials", "scratch size overflows"))
}

fn max_chunks(max_ctx: usize, chunk_len: usize) -> usize {
    max_ctx.div_ceil(chunk_len)
}

/// What the shared checks learned about the arguments.
struct Checked {
    rows: usize,
    max_ctx: usize,
    cache: DType,
}

fn check_common(
    c: &Check,
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    out: &Buffer,
    params: &AttentionParams,
) -> Result<Checked> {
    params.check(c)?;
    c.dtype("q", q, &[DType::F32])?;
    c.last_dim("q", q, params.q_width())?;
    let rows = q.shape().rows();
    c.require("q", rows > 0, || {
        format!("has shape {:?}: no rows", q.dims())
    })?;
    c.dtype("k_cache", k_cache, &[DType::F32, DType::F16])?;
    let kd = k_cache.dims();
    c.require(
        "k_cache",
        kd.len() == 3 && kd[0] == params.n_kv_head && kd[1] > 0 && kd[2] == params.head_dim,
        || {
            format!(
                "has shape {kd:?}, expected [n_kv_head {}, max_ctx > 0, head_dim {}]",
                params.n_kv_head, params.head_dim
            )
        },
    )?;
    let max_ctx = kd[1];
    c.dtype("v_cache", v_cache, &[k_cache.dtype()])?;
    c.dims("v_cache", v_cache, kd)?;
    c.dtype("step", step, &[DType::I32])?;
    c.require("step", step.elems() >= 1, || {
        "is empty; element 0 must hold pos0".into()
    })?;
    c.dtype("out", out, &[DType::F32])?;
    c.require("q", rows <= max_ctx, || {
        format!("has {rows} rows, more than the cache's {max_ctx} positions")
    })?;
    Ok(Checked {
        rows,
        max_ctx,
        cache: k_cache.dtype(),
    })
}

fn to_u32(op: &'static str, arg: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::shape(op, arg, format!("{v} does not fit in 32 bits")))
}

/// The scalar arguments shared by the prefill and partial kernels.
fn score_args(params: &AttentionParams) -> [Arg; 5] {
    [
        Arg::u32(params.n_head as u32),
        Arg::u32(params.n_kv_head as u32),
        Arg::u32(params.head_dim as u32),
        Arg::f32(params.scale),
        Arg::f32(params.softcap.unwrap_or(0.0)),
    ]
}

/// Prefill attention: `out[r, h] = softmax(scale * q[r, h] . K[0..=pos0 + r]) V` for every query
/// row `r` and head `h`, reading `pos0` from `step` at run time. `q` and `out` are f32
/// `[rows, n_head * head_dim]` (same shape); the caches are `[n_kv_head, max_ctx, head_dim]`, both
/// f32 or both f16. One dispatch, [`OpKind::Attention`].
pub fn attention(
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    out: &Buffer,
    params: AttentionParams,
) -> Result<Dispatch> {
    let c = Check::op("attention");
    let checked = check_common(&c, q, k_cache, v_cache, step, out, &params)?;
    c.dims("out", out, q.dims())?;
    let kernel = match checked.cache {
        DType::F16 => KernelId("attention_f16"),
        _ => KernelId("attention_f32"),
    };
    let items = to_u32("attention", "q", checked.rows.saturating_mul(params.n_head))?;
    let mut args = vec![
        Arg::read(q),
        Arg::read(k_cache),
        Arg::read(v_cache),
        Arg::read(step),
        Arg::write(out),
    ];
    args.extend(score_args(&params));
    Dispatch::new(kernel, args, Grid::new(items, 128), OpKind::Attention)
}

/// Decode attention for one query row, split along the KV length: a partial pass computes, for
/// each chunk of `chunk_len` positions and each head, the running maximum, the sum of
/// exponentials and the weighted V sum into `partials`; a combine pass merges them into `out`.
/// Both passes read `pos0` from `step`, so the number of chunks used follows the KV length at run
/// time. `q` and `out` are f32 `[1, n_head * head_dim]`; `partials` is f32 with exactly
/// [`attention_decode_scratch_len`] elements (any shape). Two dispatches, both
/// [`OpKind::Attention`]; the same function as [`attention`] with one row.
#[allow(clippy::too_many_arguments)] // the op's natural argument list; each is a distinct buffer
pub fn attention_decode(
    q: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    step: &Buffer,
    partials: &Buffer,
    out: &Buffer,
    params: AttentionParams,
    chunk_len: usize,
) -> Result<[Dispatch; 2]> {
    let c = Check::op("attention_decode");
    let checked = check_common(&c, q, k_cache, v_cache, step, out, &params)?;
    c.require("q", checked.rows == 1, || {
        format!(
            "has {} rows (shape {:?}); the decode form takes one",
            checked.rows,
            q.dims()
        )
    })?;
    c.dims("out", out, q.dims())?;
    c.require("chunk_len", chunk_len > 0, || {
        "chunk_len must be positive".into()
    })?;
    let chunk = to_u32("attention_decode", "chunk_len", chunk_len)?;
    let chunks = max_chunks(checked.max_ctx, chunk_len);
    let chunks_u32 = to_u32("attention_decode", "chunk_len", chunks)?;
    c.dtype("partials", partials, &[DType::F32])?;
    let need = attention_decode_scratch_len(params, checked.max_ctx, chunk_len)?;
    c.elems("partials", partials, need)?;
    let partial_kernel = match checked.cache {
        DType::F16 => KernelId("attention_decode_partial_f16"),
        _ => KernelId("attention_decode_partial_f32"),
    };
    let mut args = vec![
        Arg::read(q),
        Arg::read(k_cache),
        Arg::read(v_cache),
        Arg::read(step),
        Arg::write(partials),
    ];
    args.extend(score_args(&params));
    args.extend([Arg::u32(chunk), Arg::u32(chunks_u32)]);
    let blocks = to_u32(
        "attention_decode",
        "chunk_len",
        chunks.saturating_mul(params.n_head),
    )?;
    let partial = Dispatch::new(
        partial_kernel,
        args,
        Grid::new(blocks, 128),
        OpKind::Attention,
    )?;
    let combine = Dispatch::new(
        KernelId("attention_decode_combine"),
        vec![
            Arg::read(partials),
            Arg::read(step),
            Arg::write(out),
            Arg::u32(params.n_head as u32),
            Arg::u32(params.head_dim as u32),
            Arg::u32(chunk),
            Arg::u32(chunks_u32),
        ],
        Grid::new(params.n_head as u32, 128),
        OpKind::Attention,
    )?;
    Ok([partial, combine])
}

impl Session {
    /// Prefill attention over the KV cache; see [`attention`].
    pub fn attention(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        step: &Buffer,
        out: &Buffer,
        params: AttentionParams,
    ) -> Result<()> {
        self.push(attention(q, k_cache, v_cache, step, out, params)?)
    }

    /// Split-KV decode attention for one query row (two dispatches); see [`attention_decode`].
    #[allow(clippy::too_many_arguments)] // mirrors `attention_decode`
    pub fn attention_decode(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        step: &Buffer,
        partials: &Buffer,
        out: &Buffer,
        params: AttentionParams,
        chunk_len: usize,
    ) -> Result<()> {
        let [partial, combine] =
            attention_decode(q, k_cache, v_cache, step, partials, out, params, chunk_len)?;
        self.push(partial)?;
        self.push(combine)
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::testutil::{assert_close, random_f32};
    use crate::{Device, Executor, Mode, Plan};

    /// Outputs are weighted means of values in [-1, 1]; f32 accumulation stays well inside this.
    const ATOL: f32 = 1e-5;

    /// One test configuration.
    #[derive(Debug, Clone, Copy)]
    struct Case {
        n_head: usize,
        n_kv_head: usize,
        head_dim: usize,
        max_ctx: usize,
        pos0: usize,
        rows: usize,
        f16_cache: bool,
        softcap: Option<f32>,
        seed: u64,
    }

    impl Case {
        fn params(&self) -> AttentionParams {
            let p = AttentionParams::new(self.n_head, self.n_kv_head, self.head_dim);
            match self.softcap {
                Some(cap) => p.with_softcap(cap),
                None => p,
            }
        }

        fn width(&self) -> usize {
            self.n_head * self.head_dim
        }

        fn cache_dims(&self) -> [usize; 3] {
            [self.n_kv_head, self.max_ctx, self.head_dim]
        }
    }

    /// Random inputs; the caches hold values exactly representable in the cache dtype (f16-rounded
    /// for an f16 cache), and are filled at every position, so reading past the causal limit
    /// would change the result.
    struct Inputs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
    }

    fn inputs(c: &Case) -> Inputs {
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

    /// Naive float64 `softmax(scale * Q K^T + causal mask) V`, with the softcap when set.
    fn reference(c: &Case, inp: &Inputs) -> Vec<f32> {
        let hd = c.head_dim;
        let group = c.n_head / c.n_kv_head;
        let mut out = vec![0.0f32; c.rows * c.width()];
        for r in 0..c.rows {
            for h in 0..c.n_head {
                let kv = h / group;
                let q = &inp.q[r * c.width() + h * hd..][..hd];
                let row = |m: &[f32], j: usize| m[(kv * c.max_ctx + j) * hd..][..hd].to_vec();
                let scores: Vec<f64> = (0..=c.pos0 + r)
                    .map(|j| {
                        let k = row(&inp.k, j);
                        let dot: f64 = q.iter().zip(&k).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let s = dot * c.params().scale as f64;
                        match c.softcap {
                            Some(cap) => cap as f64 * (s / cap as f64).tanh(),
                            None => s,
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = w.iter().sum();
                for d in 0..hd {
                    let acc: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(j, w)| w * row(&inp.v, j)[d] as f64)
                        .sum();
                    out[r * c.width() + h * hd + d] = (acc / total) as f32;
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
    fn buffers(dev: &Device, c: &Case, inp: &Inputs, pos0: i32) -> [Buffer; 5] {
        [
            dev.upload(&inp.q, &[c.rows, c.width()]).unwrap(),
            upload_cache(dev, c, &inp.k),
            upload_cache(dev, c, &inp.v),
            dev.upload(&[pos0], &[1]).unwrap(),
            dev.alloc(DType::F32, &[c.rows, c.width()]).unwrap(),
        ]
    }

    fn run_prefill(dev: &Device, c: &Case, inp: &Inputs, mode: Mode) -> Result<Vec<f32>> {
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
}
