//! CPU kernels of the `attention` op family: causal scaled dot-product attention of query rows
//! against one layer's KV cache, with grouped-query heads, an optional softcap and an optional
//! sliding window.
//!
//! - `attention_{f32,f16}` (prefill, any number of rows): one work item per (row, KV head); the
//!   item computes every query head of that KV head's group with an online softmax over blocks of
//!   keys, so each K/V row is loaded (and converted from f16) once per group.
//! - `attention_decode_partial_{f32,f16}` and `attention_decode_combine` (decode, one row): the KV
//!   length is cut into chunks; the partial pass writes, per (chunk, head), the running maximum,
//!   the sum of exponentials and the unnormalized weighted V sum; the combine pass merges them.
//!   With a window, only the chunks holding a key of the window are computed and combined.
//!
//! Argument order (built by `ops::attention`):
//! - prefill: `q, k_cache, v_cache, step, out, n_head, n_kv_head, head_dim, scale, softcap,
//!   window`;
//! - partial: `q, k_cache, v_cache, step, partials, n_head, n_kv_head, head_dim, scale, softcap,
//!   window, chunk_len, max_chunks`;
//! - combine: `partials, step, out, n_head, head_dim, chunk_len, max_chunks, window`.
//!
//! `softcap` and `window` are 0 when off; with a window `W`, the query at position `i` sees keys
//! `i + 1 - W..=i` (those that exist). The KV length is never a scalar: every kernel reads `pos0`
//! from the step buffer at run time, so one recorded decode graph serves every step.

use std::cell::RefCell;
use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::check::{expect_len, kernel_err, product, read_pos0};
use super::copy::Float;
use crate::backend::cpu::{CpuRegistry, KernelArgs};
use crate::error::Result;
use crate::kernels::attention as ka;

/// Registers this family's kernels against their declarations.
pub(super) fn register(registry: &mut CpuRegistry) {
    use ka::{ATTENTION, ATTENTION_MMA, ATTENTION_MMA_TO_F16, DECODE_COMBINE, DECODE_PARTIAL};
    registry.family(
        &ATTENTION,
        [attention_prefill::<f32, f32>, attention_prefill::<f16, f32>],
    );
    // The tensor-core form is a GPU launch shape: on the CPU it is the same attention.
    registry.family(
        &ATTENTION_MMA,
        [attention_prefill::<f32, f32>, attention_prefill::<f16, f32>],
    );
    registry.family(
        &ATTENTION_MMA_TO_F16,
        [attention_prefill::<f32, f16>, attention_prefill::<f16, f16>],
    );
    registry.family(
        &DECODE_PARTIAL,
        [
            attention_decode_partial::<f32>,
            attention_decode_partial::<f16>,
        ],
    );
    registry.add(&DECODE_COMBINE, attention_decode_combine);
}

/// Keys scored together before one rescale of the running state.
const KEY_BLOCK: usize = 32;

/// The most scores (`group x chunk_len`) a decode work item keeps for the AVX-512 form; larger
/// items (a hostile `chunk_len`, say) take the portable form, whose scratch does not grow with
/// the chunk.
const MAX_ITEM_SCORES: usize = 1 << 20;

/// Argument positions shared by the prefill and partial kernels.
const ARG_Q: usize = 0;
const ARG_K: usize = 1;
const ARG_V: usize = 2;
const ARG_STEP: usize = 3;
const ARG_OUT: usize = 4;
const ARG_N_HEAD: usize = 5;

/// A KV cache element type: f32 rows are used in place, f16 rows are converted into a scratch row.
pub(super) trait CacheElem: bytemuck::Pod + Send + Sync {
    /// Whether the elements are f16 (else f32).
    const HALF: bool;
    /// The row `src` as f32 values, using `buf` (same length) when a conversion is needed.
    fn row<'a>(src: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
}

impl CacheElem for f32 {
    const HALF: bool = false;
    fn row<'a>(src: &'a [f32], _buf: &'a mut [f32]) -> &'a [f32] {
        src
    }
}

impl CacheElem for f16 {
    const HALF: bool = true;
    fn row<'a>(src: &'a [f16], buf: &'a mut [f32]) -> &'a [f32] {
        src.convert_to_f32_slice(buf);
        buf
    }
}

/// Head geometry and score parameters, read from the scalars and the cache's dimensions.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    pub(super) n_head: usize,
    pub(super) n_kv_head: usize,
    pub(super) head_dim: usize,
    /// Query heads per KV head.
    pub(super) group: usize,
    /// Positions the cache holds.
    pub(super) max_ctx: usize,
    pub(super) scale: f32,
    pub(super) softcap: Option<f32>,
    /// Sliding window in positions, if any.
    pub(super) window: Option<usize>,
}

impl Geometry {
    /// Reads the six scalars starting at `ARG_N_HEAD` and checks them against the shapes of the
    /// K and V caches (`[n_kv_head, max_ctx, head_dim]`, both).
    fn read(args: &KernelArgs<'_>) -> Result<Geometry> {
        let n_head = args.usize(ARG_N_HEAD)?;
        let n_kv_head = args.usize(ARG_N_HEAD + 1)?;
        let head_dim = args.usize(ARG_N_HEAD + 2)?;
        let scale = args.f32(ARG_N_HEAD + 3)?;
        let cap = args.f32(ARG_N_HEAD + 4)?;
        let window = args.usize(ARG_N_HEAD + 5)?;
        if n_head == 0 || n_kv_head == 0 || head_dim == 0 || n_head % n_kv_head != 0 {
            return Err(kernel_err(
                args,
                format!(
                    "n_head = {n_head}, n_kv_head = {n_kv_head}, head_dim = {head_dim}: each must \
                     be at least 1, and n_kv_head must divide n_head"
                ),
            ));
        }
        let (k, _) = args.buffer(ARG_K)?;
        let (v, _) = args.buffer(ARG_V)?;
        let dims = k.dims();
        if dims.len() != 3 || dims[0] != n_kv_head || dims[2] != head_dim {
            return Err(kernel_err(
                args,
                format!(
                    "k_cache has shape {dims:?}, expected [n_kv_head = {n_kv_head}, max_ctx, \
                     head_dim = {head_dim}]"
                ),
            ));
        }
        if v.dims() != dims {
            return Err(kernel_err(
                args,
                format!("v_cache has shape {:?}, k_cache {dims:?}", v.dims()),
            ));
        }
        Ok(Geometry {
            n_head,
            n_kv_head,
            head_dim,
            group: n_head / n_kv_head,
            max_ctx: dims[1],
            scale,
            softcap: (cap != 0.0).then_some(cap),
            window: (window != 0).then_some(window),
        })
    }

    /// The first key the query at position `pos` sees.
    fn first_key(&self, pos: usize) -> usize {
        first_key(pos, self.window)
    }

    /// Elements of one KV head's slab of the cache.
    pub(super) fn kv_stride(&self) -> usize {
        self.max_ctx * self.head_dim
    }

    /// Checks the lengths of the cache slices themselves (their views' shapes say the same, but
    /// the slab arithmetic of the kernels then rests on this check alone): on success the slab of
    /// KV head `h < n_kv_head` is elements `h * kv_stride()..(h + 1) * kv_stride()` of either.
    fn check_caches(&self, args: &KernelArgs<'_>, k: usize, v: usize) -> Result<()> {
        let cache = [
            ("n_kv_head", self.n_kv_head),
            ("max_ctx", self.max_ctx),
            ("head_dim", self.head_dim),
        ];
        expect_len(args, "k_cache", k, &cache)?;
        expect_len(args, "v_cache", v, &cache)
    }
}

/// Online-softmax state of the query heads of one group, kept per thread and reused.
#[derive(Default)]
struct Scratch {
    /// `[group, KEY_BLOCK]` scores, then probabilities, of the current block.
    scores: Vec<f32>,
    /// `[group, head_dim]` weighted V sums, relative to `max`.
    acc: Vec<f32>,
    /// Running maximum score per head.
    max: Vec<f32>,
    /// Running sum of `exp(score - max)` per head.
    sum: Vec<f32>,
    /// One K row converted to f32 (f16 caches).
    k_row: Vec<f32>,
    /// One V row converted to f32 (f16 caches).
    v_row: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// Scores of one decode work item for the AVX-512 form (`[group, chunk]`).
    static ITEM_SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Scratch {
    /// Empties the state for `group` heads of `head_dim`; grows the vectors only when needed.
    fn reset(&mut self, group: usize, head_dim: usize) {
        fn refill(v: &mut Vec<f32>, len: usize, value: f32) {
            v.clear();
            v.resize(len, value);
        }
        refill(&mut self.scores, group * KEY_BLOCK, 0.0);
        refill(&mut self.acc, group * head_dim, 0.0);
        refill(&mut self.max, group, f32::NEG_INFINITY);
        refill(&mut self.sum, group, 0.0);
        refill(&mut self.k_row, head_dim, 0.0);
        refill(&mut self.v_row, head_dim, 0.0);
    }

    /// Folds keys `keys` of one KV head into the state of its `group` query heads. `q` holds the
    /// group's query vectors (`[group, head_dim]`), `k` and `v` the KV head's cache slab.
    fn accumulate<T: CacheElem>(
        &mut self,
        geo: &Geometry,
        q: &[f32],
        k: &[T],
        v: &[T],
        keys: Range<usize>,
    ) {
        let hd = geo.head_dim;
        let Scratch {
            scores,
            acc,
            max,
            sum,
            k_row,
            v_row,
        } = self;
        let mut start = keys.start;
        while start < keys.end {
            let n = KEY_BLOCK.min(keys.end - start);
            for t in 0..n {
                let pos = start + t;
                let key = T::row(&k[pos * hd..(pos + 1) * hd], k_row);
                for (j, qh) in q.chunks_exact(hd).enumerate() {
                    let mut s = dot(qh, key) * geo.scale;
                    if let Some(cap) = geo.softcap {
                        s = cap * (s / cap).tanh();
                    }
                    scores[j * KEY_BLOCK + t] = s;
                }
            }
            for j in 0..geo.group {
                let row = &mut scores[j * KEY_BLOCK..j * KEY_BLOCK + n];
                let block_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let new_max = max[j].max(block_max);
                if new_max > max[j] {
                    // exp(-inf) = 0 on the first block, where the state is still empty.
                    let c = (max[j] - new_max).exp();
                    sum[j] *= c;
                    acc[j * hd..(j + 1) * hd].iter_mut().for_each(|a| *a *= c);
                    max[j] = new_max;
                }
                let mut block_sum = 0.0f32;
                for s in row.iter_mut() {
                    *s = (*s - new_max).exp();
                    block_sum += *s;
                }
                sum[j] += block_sum;
            }
            for t in 0..n {
                let pos = start + t;
                let value = T::row(&v[pos * hd..(pos + 1) * hd], v_row);
                for (j, a) in acc.chunks_exact_mut(hd).enumerate() {
                    axpy(a, scores[j * KEY_BLOCK + t], value);
                }
            }
            start += n;
        }
    }
}

/// Dot product with eight independent partial sums (so the loop vectorizes).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y += a * x`.
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The first key the query at position `pos` sees with `window` (none: 0).
pub(super) fn first_key(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// Prefill: `out[r, h] = softmax(q[r, h] . K[lo..=pos0+r] * scale) V` per query row and head,
/// `lo` the row's first key (0 without a window); out in f32, or its values rounded to f16.
fn attention_prefill<T: CacheElem, O: Float>(args: &KernelArgs<'_>) -> Result<()> {
    let geo = Geometry::read(args)?;
    let q = args.input::<f32>(ARG_Q)?;
    let k = args.input::<T>(ARG_K)?;
    let v = args.input::<T>(ARG_V)?;
    let out = args.output::<O>(ARG_OUT)?;
    geo.check_caches(args, k.len(), v.len())?;
    let heads = [("n_head", geo.n_head), ("head_dim", geo.head_dim)];
    let width = product(args, "a row of q", &heads)?;
    if q.len() != out.len() || q.len() % width != 0 || q.is_empty() {
        return Err(kernel_err(
            args,
            format!(
                "q has {} and out {} values, expected whole rows of n_head = {} x head_dim = {}",
                q.len(),
                out.len(),
                geo.n_head,
                geo.head_dim
            ),
        ));
    }
    // Query row `r < rows` sees keys `0..=pos0 + r`, all inside the cache.
    let rows = q.len() / width;
    let pos0 = read_pos0(args, ARG_STEP, rows, geo.max_ctx)?;
    let unit = geo.group * geo.head_dim;
    let stride = geo.kv_stride();
    out.par_chunks_mut(unit).enumerate().for_each(|(item, o)| {
        let (row, kv) = (item / geo.n_kv_head, item % geo.n_kv_head);
        let qh = &q[item * unit..(item + 1) * unit];
        let slab = kv * stride..(kv + 1) * stride;
        SCRATCH.with(|cell| {
            let mut st = cell.borrow_mut();
            st.reset(geo.group, geo.head_dim);
            let pos = pos0 + row;
            let keys = geo.first_key(pos)..pos + 1;
            st.accumulate(&geo, qh, &k[slab.clone()], &v[slab], keys);
            for ((o, acc), sum) in o
                .chunks_exact_mut(geo.head_dim)
                .zip(st.acc.chunks_exact(geo.head_dim))
                .zip(&st.sum)
            {
                let inv = 1.0 / sum;
                o.iter_mut()
                    .zip(acc)
                    .for_each(|(o, a)| *o = O::from_f32(a * inv));
            }
        });
    });
    Ok(())
}

/// Decode, first pass: one partial record `[max, sum, acc[head_dim]]` per (chunk, head), laid out
/// `[max_chunks, n_head, head_dim + 2]`; only the chunks holding a key the query sees (`0..=pos0`,
/// or the window's part of it) are written, each over those of its keys.
fn attention_decode_partial<T: CacheElem>(args: &KernelArgs<'_>) -> Result<()> {
    let geo = Geometry::read(args)?;
    let chunk_len = args.usize(ARG_N_HEAD + 6)?;
    let max_chunks = args.usize(ARG_N_HEAD + 7)?;
    let q = args.input::<f32>(ARG_Q)?;
    let k = args.input::<T>(ARG_K)?;
    let v = args.input::<T>(ARG_V)?;
    let partials = args.output::<f32>(ARG_OUT)?;
    geo.check_caches(args, k.len(), v.len())?;
    let hd = geo.head_dim;
    let rec = hd + 2;
    expect_len(
        args,
        "q",
        q.len(),
        &[("n_head", geo.n_head), ("head_dim", hd)],
    )?;
    check_partials(args, partials.len(), geo.n_head, hd, chunk_len, max_chunks)?;
    // Keys `lo..kv_len`, all inside the cache (`kv_len <= max_ctx`), in chunks
    // `first..chunks` (`chunks <= max_chunks`): the records written below lie inside `partials`.
    let pos0 = read_pos0(args, ARG_STEP, 1, geo.max_ctx)?;
    let kv_len = pos0 + 1;
    let chunks = used_chunks(args, kv_len, chunk_len, max_chunks)?;
    let lo = geo.first_key(pos0);
    let first = lo / chunk_len;
    let unit = geo.group * rec;
    let stride = geo.kv_stride();
    partials[first * geo.n_head * rec..chunks * geo.n_head * rec]
        .par_chunks_mut(unit)
        .enumerate()
        .for_each(|(item, recs)| {
            let (chunk, kv) = (first + item / geo.n_kv_head, item % geo.n_kv_head);
            let keys = (chunk * chunk_len).max(lo)..((chunk + 1) * chunk_len).min(kv_len);
            let qh = &q[kv * geo.group * hd..(kv + 1) * geo.group * hd];
            let slab = kv * stride..(kv + 1) * stride;
            decode_partial_item(&geo, qh, &k[slab.clone()], &v[slab], keys, recs);
        });
    Ok(())
}

/// One work item of the decode partial pass: the records (`[group, head_dim + 2]`, one per query
/// head of the group) of `keys` of one KV head, whose queries are `qh` (`[group, head_dim]`) and
/// whose cache slabs are `k` and `v` (`[max_ctx, head_dim]`). The slotted decode attention
/// (`attention_slots.rs`) calls it too, so a row of a batch gets the one-row kernel's bits.
pub(super) fn decode_partial_item<T: CacheElem>(
    geo: &Geometry,
    qh: &[f32],
    k: &[T],
    v: &[T],
    keys: Range<usize>,
    recs: &mut [f32],
) {
    let hd = geo.head_dim;
    let rec = hd + 2;
    #[cfg(target_arch = "x86_64")]
    if geo.group * keys.len() <= MAX_ITEM_SCORES {
        // The slabs as bytes; `decode_item` checks every length it relies on (and
        // declines, leaving the item to the portable form, should one disagree).
        let item = super::attention_avx512::Item {
            q: qh,
            k: bytemuck::cast_slice(k),
            v: bytemuck::cast_slice(v),
            keys: keys.clone(),
            group: geo.group,
            scale: geo.scale,
            softcap: geo.softcap,
        };
        let done = ITEM_SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            let need = geo.group * keys.len();
            if scores.len() < need {
                scores.resize(need, 0.0);
            }
            super::attention_avx512::decode_item(&item, hd, T::HALF, &mut scores, recs)
        });
        if done {
            return;
        }
    }
    SCRATCH.with(|cell| {
        let mut st = cell.borrow_mut();
        st.reset(geo.group, hd);
        st.accumulate(geo, qh, k, v, keys);
        for (j, r) in recs.chunks_exact_mut(rec).enumerate() {
            r[0] = st.max[j];
            r[1] = st.sum[j];
            r[2..].copy_from_slice(&st.acc[j * hd..(j + 1) * hd]);
        }
    });
}

/// Decode, second pass: merges the partial records of each head into its output row: those of
/// the chunks the partial pass wrote (the ones holding a key of the window).
fn attention_decode_combine(args: &KernelArgs<'_>) -> Result<()> {
    let partials = args.input::<f32>(0)?;
    let out = args.output::<f32>(2)?;
    let n_head = args.usize(3)?;
    let hd = args.usize(4)?;
    let chunk_len = args.usize(5)?;
    let max_chunks = args.usize(6)?;
    let window = args.usize(7)?;
    if n_head == 0 || hd == 0 {
        return Err(kernel_err(
            args,
            format!("n_head = {n_head} and head_dim = {hd} must be at least 1"),
        ));
    }
    expect_len(
        args,
        "out",
        out.len(),
        &[("n_head", n_head), ("head_dim", hd)],
    )?;
    check_partials(args, partials.len(), n_head, hd, chunk_len, max_chunks)?;
    // The records of chunks `first..chunks` (`chunks <= max_chunks`) lie inside `partials`; each
    // holds at least one key (the window's first key lies in chunk `first`).
    let positions = max_chunks.saturating_mul(chunk_len);
    let pos0 = read_pos0(args, 1, 1, positions)?;
    let chunks = used_chunks(args, pos0 + 1, chunk_len, max_chunks)?;
    let first = first_key(pos0, (window != 0).then_some(window)) / chunk_len;
    out.par_chunks_mut(hd).enumerate().for_each(|(h, o)| {
        combine_head(partials, n_head, h, first..chunks, o);
    });
    Ok(())
}

/// Merges the records of chunks `live` of head `h` (records laid out `[chunks, n_head, head_dim
/// + 2]` in `partials`) into the head's output `o` (`head_dim` values). The slotted decode
/// attention (`attention_slots.rs`) calls it too.
pub(super) fn combine_head(
    partials: &[f32],
    n_head: usize,
    h: usize,
    live: Range<usize>,
    o: &mut [f32],
) {
    let rec = o.len() + 2;
    let record = |c: usize| &partials[(c * n_head + h) * rec..(c * n_head + h + 1) * rec];
    let max = live
        .clone()
        .map(|c| record(c)[0])
        .fold(f32::NEG_INFINITY, f32::max);
    o.fill(0.0);
    let mut total = 0.0f32;
    for c in live {
        let r = record(c);
        let w = (r[0] - max).exp();
        total += w * r[1];
        axpy(o, w, &r[2..]);
    }
    let inv = 1.0 / total;
    o.iter_mut().for_each(|x| *x *= inv);
}

/// Checks the records' length against `[chunks, n_head, head_dim + 2]`, and that `chunk_len`
/// and `chunks` (`max_chunks`) are at least 1.
pub(super) fn check_partials(
    args: &KernelArgs<'_>,
    len: usize,
    n_head: usize,
    hd: usize,
    chunk_len: usize,
    max_chunks: usize,
) -> Result<()> {
    if chunk_len == 0 || max_chunks == 0 {
        return Err(kernel_err(
            args,
            format!("chunk_len = {chunk_len} and chunks = {max_chunks} must be at least 1"),
        ));
    }
    let record = hd.saturating_add(2);
    expect_len(
        args,
        "records",
        len,
        &[
            ("chunks", max_chunks),
            ("n_head", n_head),
            ("head_dim + 2", record),
        ],
    )
}

/// Chunks of `chunk_len` covering `kv_len` keys; an error when the scratch has fewer.
pub(super) fn used_chunks(
    args: &KernelArgs<'_>,
    kv_len: usize,
    chunk_len: usize,
    max_chunks: usize,
) -> Result<usize> {
    let chunks = kv_len.div_ceil(chunk_len);
    if chunks > max_chunks {
        return Err(kernel_err(
            args,
            format!(
                "the KV length {kv_len} needs {chunks} chunks of chunk_len = {chunk_len}, the \
                 records hold chunks = {max_chunks}"
            ),
        ));
    }
    Ok(chunks)
}
