//! The matrix and attention families against hostile scalars (see `hostile_tests.rs`).
//!
//! Besides sizes that are merely too large, these kernels multiply three scalars (or two and a
//! row's byte count), so they also get products that overflow `usize`, and one crafted to wrap
//! to exactly zero: f32 weights of `n = k = 2^31` need `2^31 * 2^33 = 2^64` bytes, which a
//! wrapping multiplication takes for the empty buffer's 0.

use super::{device, Call, MAX};
use crate::backend::{Buffer, DType};
use crate::kernels::{attention as ka, matmul as mm, WEIGHT_FORMATS};
use crate::testutil::{assert_close, random_f32};

/// `2^31`: with f32 weights, `n * 4k` wraps to 0 for `n = k = 2^31`.
const WRAP: u32 = 1 << 31;
/// The largest `k` that is a whole number of blocks of every format (a multiple of 256).
const BIG_K: u32 = (MAX / 256) * 256;

/// f32 values of `dims` in a view that starts 2 bytes into its allocation (not 4-aligned), and
/// the same values in an aligned buffer.
fn misaligned_f32(dims: &[usize], seed: u64) -> (Buffer, Buffer) {
    let values = random_f32(dims.iter().product(), 1.0, seed);
    let mut bytes = vec![0x5A_u8; 2];
    bytes.extend_from_slice(bytemuck::cast_slice(&values));
    bytes.extend_from_slice(&[0x5A, 0x5A]);
    let raw = device()
        .upload_bytes(&bytes, DType::U8, &[bytes.len()])
        .expect("upload");
    let view = raw.view(2, DType::F32, dims).expect("a misaligned view");
    let aligned = device().upload(&values, dims).expect("upload");
    (view, aligned)
}

/// The f32 result of `call` (with `out` as its parameter `name`) run once with weights `w_name`
/// misaligned and once aligned: both succeed and agree.
fn misaligned_weights_agree(
    call: impl Fn() -> Call,
    w_name: &str,
    w_dims: &[usize],
    out_name: &str,
    out_len: usize,
) {
    let (view, aligned) = misaligned_f32(w_dims, 99);
    let mut results = Vec::new();
    for w in [&view, &aligned] {
        let out = device()
            .upload(&random_f32(out_len, 1.0, 7), &[out_len])
            .expect("upload");
        call().buffer(w_name, w).buffer(out_name, &out).accepted();
        results.push(device().download::<f32>(&out).expect("download"));
    }
    assert_close(
        &results[0],
        &results[1],
        1e-4,
        1e-4,
        "misaligned vs aligned weights",
    );
}

#[test]
fn matmuls_refuse_hostile_sizes_and_overflowing_products() {
    // The tensor-core names run the same CPU kernel: they get the same cases.
    let families = mm::MATMUL.iter().chain(&mm::MATMUL_MMA);
    for (sig, dtype) in families.zip(WEIGHT_FORMATS.iter().cycle()) {
        let dtype = *dtype;
        let call = |x: usize, w: &[usize], out: usize, (rows, k, n): (u32, u32, u32)| {
            Call::new(sig)
                .buf("x", &[x])
                .buf("w", w)
                .buf("out", &[out])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n", n)
        };
        call(256, &[5, 256], 5, (1, 256, 5)).accepted();
        call(3 * 256, &[5, 256], 15, (3, 256, 5)).accepted();
        call(0, &[5, 256], 0, (0, 256, 5)).accepted();
        call(0, &[0], 6, (2, 0, 3)).accepted();
        call(256, &[5, 256], 5, (1, 100, 5)).refused("k = 100");
        call(256, &[5, 256], 5, (MAX, 256, 5)).refused("rows = 4294967295");
        call(256, &[5, 256], 5, (1, 256, MAX)).refused("n = 4294967295");
        call(256, &[5, 256], 5, (1, BIG_K, MAX)).refused("n = 4294967295");
        // The product wraps to 0 bytes for f32 (an abort on a 2^35-float scratch before).
        call(0, &[0], 0, (0, WRAP, WRAP)).refused("n = 2147483648");
        call(256, &[5, 256], 4, (1, 256, 5)).refused("out");
        if dtype == DType::F32 {
            for rows in [1usize, 3] {
                let (x, out) = (rows * 256, rows * 5);
                misaligned_weights_agree(
                    || {
                        Call::new(sig)
                            .buf("x", &[x])
                            .u32("rows", rows as u32)
                            .u32("k", 256)
                            .u32("n", 5)
                    },
                    "w",
                    &[5, 256],
                    "out",
                    out,
                );
            }
        }
    }
}

#[test]
fn f16_activation_products_refuse_hostile_sizes() {
    for sig in &mm::MATMUL_MMA_H {
        let call = |x: usize, out: usize, (rows, k, n): (u32, u32, u32)| {
            Call::new(sig)
                .buf("x", &[x])
                .buf("w", &[5, 256])
                .buf("out", &[out])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n", n)
        };
        call(512, 10, (2, 256, 5)).accepted();
        call(512, 10, (2, 100, 5)).refused("k = 100");
        call(512, 10, (MAX, 256, 5)).refused("rows = 4294967295");
        call(512, 10, (2, 256, MAX)).refused("n = 4294967295");
        call(512, 9, (2, 256, 5)).refused("out");
        call(500, 10, (2, 256, 5)).refused("x");
    }
}

#[test]
fn f16_activation_product_adds_refuse_hostile_sizes() {
    for sig in &mm::MATMUL_ADD_MMA_H {
        let call = |x: usize, acc: usize, (rows, k, n): (u32, u32, u32)| {
            Call::new(sig)
                .buf("x", &[x])
                .buf("w", &[5, 256])
                .buf("acc", &[acc])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n", n)
        };
        call(512, 10, (2, 256, 5)).accepted();
        call(0, 0, (0, 256, 5)).accepted();
        call(512, 10, (2, 100, 5)).refused("k = 100");
        call(512, 10, (MAX, 256, 5)).refused("rows = 4294967295");
        call(512, 10, (2, 256, MAX)).refused("n = 4294967295");
        call(512, 9, (2, 256, 5)).refused("acc");
        call(500, 10, (2, 256, 5)).refused("x");
    }
}

#[test]
fn gate_up_swiglu_kernels_refuse_hostile_sizes_naming_the_weight() {
    for sig in &mm::MATMUL_SWIGLU_MMA_H {
        let call = |x: usize, wu: &[usize], out: usize, (rows, k, n): (u32, u32, u32)| {
            Call::new(sig)
                .buf("x", &[x])
                .buf("wg", &[5, 256])
                .buf("wu", wu)
                .buf("out", &[out])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n", n)
        };
        call(512, &[5, 256], 10, (2, 256, 5)).accepted();
        call(0, &[5, 256], 0, (0, 256, 5)).accepted();
        call(512, &[4, 256], 10, (2, 256, 5)).refused("wu");
        call(512, &[5, 256], 10, (2, 100, 5)).refused("k = 100");
        call(512, &[5, 256], 10, (MAX, 256, 5)).refused("rows = 4294967295");
        call(512, &[5, 256], 10, (2, 256, MAX)).refused("n = 4294967295");
        call(512, &[5, 256], 9, (2, 256, 5)).refused("out");
        call(500, &[5, 256], 10, (2, 256, 5)).refused("x");
    }
}

#[test]
fn three_product_kernels_refuse_hostile_sizes_naming_the_product() {
    for (sig, dtype) in mm::MATMUL3_MMA
        .iter()
        .chain(&mm::MATMUL3_MMA_H)
        .zip(WEIGHT_FORMATS.iter().cycle().copied())
    {
        // Two rows of 256 activations, weights of 5, 4 and 3 rows of k = 256; `n` the three
        // widths, `outs` the outputs' lengths.
        let call = |rows: u32, k: u32, n: [u32; 3], outs: [usize; 3]| {
            Call::new(sig)
                .buf("x", &[512])
                .buf("w0", &[5, 256])
                .buf("w1", &[4, 256])
                .buf("w2", &[3, 256])
                .buf("out0", &[outs[0]])
                .buf("out1", &[outs[1]])
                .buf("out2", &[outs[2]])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n0", n[0])
                .u32("n1", n[1])
                .u32("n2", n[2])
        };
        call(2, 256, [5, 4, 3], [10, 8, 6]).accepted();
        call(2, 256, [5, 5, 3], [10, 10, 6]).refused("w1");
        call(2, 256, [5, 4, MAX], [10, 8, 6]).refused("n2 = 4294967295");
        call(2, 256, [5, 4, 3], [10, 8, 5]).refused("out2");
        call(2, 100, [5, 4, 3], [10, 8, 6]).refused("k = 100");
        call(MAX, 256, [5, 4, 3], [10, 8, 6]).refused("rows = 4294967295");
        if dtype == DType::F32 {
            call(2, WRAP, [WRAP, 4, 3], [0, 0, 0]).refused("n0 = 2147483648");
        }
    }
}

#[test]
fn matmul_adds_refuse_hostile_sizes_and_overflowing_products() {
    let families = mm::MATMUL_ADD.iter().chain(&mm::MATMUL_ADD_MMA);
    for (sig, dtype) in families.zip(WEIGHT_FORMATS.iter().cycle()) {
        let dtype = *dtype;
        let call = |x: usize, w: &[usize], acc: usize, (rows, k, n): (u32, u32, u32)| {
            Call::new(sig)
                .buf("x", &[x])
                .buf("w", w)
                .buf("acc", &[acc])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n", n)
        };
        call(256, &[5, 256], 5, (1, 256, 5)).accepted();
        call(3 * 256, &[5, 256], 15, (3, 256, 5)).accepted();
        call(0, &[5, 256], 0, (0, 256, 5)).accepted();
        call(0, &[0], 6, (2, 0, 3)).refused("k = 0");
        call(256, &[0], 0, (1, 256, 0)).refused("n = 0");
        call(256, &[5, 256], 5, (1, 100, 5)).refused("k = 100");
        call(256, &[5, 256], 5, (MAX, 256, 5)).refused("rows = 4294967295");
        call(256, &[5, 256], 5, (1, BIG_K, MAX)).refused("n = 4294967295");
        call(0, &[0], 0, (0, WRAP, WRAP)).refused("n = 2147483648");
        call(256, &[5, 256], 6, (1, 256, 5)).refused("acc");
        if dtype == DType::F32 {
            misaligned_weights_agree(
                || {
                    Call::new(sig)
                        .buf("x", &[256])
                        .u32("rows", 1)
                        .u32("k", 256)
                        .u32("n", 5)
                },
                "w",
                &[5, 256],
                "acc",
                5,
            );
        }
    }
}

#[test]
fn expert_matmuls_refuse_hostile_sizes_and_ids() {
    for (sig, dtype) in mm::MATMUL_ID.iter().zip(WEIGHT_FORMATS) {
        let call = |ids: &[i32], dims: (u32, u32, u32, u32, u32)| {
            let (rows, k, n, slots, experts) = dims;
            Call::new(sig)
                .buf("x", &[2 * 256])
                .buf("w", &[3 * 4, 256])
                .ints("ids", ids)
                .buf("out", &[2 * 2 * 4])
                .u32("rows", rows)
                .u32("k", k)
                .u32("n", n)
                .u32("slots", slots)
                .u32("experts", experts)
        };
        let ids = [0, 2, 1, 1];
        call(&ids, (2, 256, 4, 2, 3)).accepted();
        call(&[0, -1, 1, 1], (2, 256, 4, 2, 3)).refused("expert id -1");
        call(&[0, 3, 1, 1], (2, 256, 4, 2, 3)).refused("expert id 3");
        call(&[i32::MIN, 0, 1, 1], (2, 256, 4, 2, 3)).refused("expert id -2147483648");
        call(&ids, (2, 256, 4, 2, 0)).refused("experts = 0");
        call(&ids, (2, 256, 4, 2, MAX)).refused("experts = 4294967295");
        call(&ids, (2, BIG_K, MAX, 2, MAX)).refused("experts = 4294967295");
        call(&ids, (2, 256, 4, MAX, 3)).refused("slots = 4294967295");
        call(&ids, (MAX, 256, 4, 2, 3)).refused("rows = 4294967295");
        call(&ids, (2, 100, 4, 2, 3)).refused("k = 100");
        call(&ids, (2, 256, MAX, 2, 3)).refused("n = 4294967295");
        call(&ids[..3], (2, 256, 4, 2, 3)).refused("ids");
        // No slots: no ids, no outputs.
        Call::new(sig)
            .buf("x", &[2 * 256])
            .buf("w", &[3 * 4, 256])
            .ints("ids", &[])
            .buf("out", &[0])
            .u32("rows", 2)
            .u32("k", 256)
            .u32("n", 4)
            .u32("slots", 0)
            .u32("experts", 3)
            .accepted();
        if dtype == DType::F32 {
            misaligned_weights_agree(
                || {
                    Call::new(sig)
                        .buf("x", &[2 * 256])
                        .ints("ids", &ids)
                        .u32("rows", 2)
                        .u32("k", 256)
                        .u32("n", 4)
                        .u32("slots", 2)
                        .u32("experts", 3)
                },
                "w",
                &[3 * 4, 256],
                "out",
                16,
            );
        }
    }
}

#[test]
fn affine_matmuls_refuse_hostile_bits_groups_and_sizes() {
    for sig in &mm::MATMUL_AFFINE {
        // rows 2, n 3; `k` values per row in groups of `group`, `bits` per value.
        let call = |k: usize, bits: u32, group: u32, dims: (u32, u32, u32)| {
            let (rows, kk, n) = dims;
            let per_word = if bits == 8 { 4 } else { 8 };
            Call::new(sig)
                .buf("x", &[2 * k])
                .buf("w", &[3 * k / per_word])
                .buf("scales", &[3 * (k / 32).max(1)])
                .buf("biases", &[3 * (k / 32).max(1)])
                .buf("out", &[6])
                .u32("rows", rows)
                .u32("k", kk)
                .u32("n", n)
                .u32("bits", bits)
                .u32("group_size", group)
        };
        call(64, 4, 32, (2, 64, 3)).accepted();
        call(64, 8, 32, (2, 64, 3)).accepted();
        call(64, 3, 32, (2, 64, 3)).refused("bits");
        call(64, MAX, 32, (2, 64, 3)).refused("bits");
        call(64, 4, 0, (2, 64, 3)).refused("group");
        call(64, 4, 16, (2, 64, 3)).refused("group");
        // 40 values: one group of 32 and 8 values no group covers.
        call(40, 4, 32, (2, 40, 3)).refused("k = 40");
        call(64, 4, 32, (2, 64, MAX)).refused("n = 4294967295");
        call(64, 4, 32, (MAX, 64, 3)).refused("rows = 4294967295");
        call(64, 4, 32, (2, BIG_K, MAX)).refused("n = 4294967295");
        call(64, 4, 32, (2, 128, 3)).refused("k = 128");
    }
}

/// The scalars and sizes of a `norm_qkv_rope` call. The buffers are always sized for rows of 256
/// values, two query and one key/value head of 8: `rows` rows, caches of `ctx` positions, the
/// step buffer `step` (positions follow from it); the scalars are the fields.
struct Qkv<'a> {
    rows: usize,
    dim: u32,
    n_head: u32,
    n_kv: u32,
    hd: u32,
    ctx: usize,
    step: &'a [i32],
    mode: u32,
}

impl Qkv<'_> {
    fn call(&self, sig: &'static crate::graph::KernelSig) -> Call {
        let (rows, dim) = (self.rows, 256usize);
        let positions: Vec<i32> = (0..rows as i32)
            .map(|r| self.step.first().unwrap_or(&0) + r)
            .collect();
        // The `_ff` kernels' frequency factors: four, the pairs of the valid heads of 8.
        let call = Call::new(sig);
        let call = if sig.index_of("freq_factors").is_some() {
            call.buf("freq_factors", &[4])
        } else {
            call
        };
        call.buf("x", &[rows * dim])
            .buf("norm", &[dim])
            .buf("wq", &[16, dim])
            .buf("wk", &[8, dim])
            .buf("wv", &[8, dim])
            .ints("positions", &positions)
            .ints("step", self.step)
            .buf("q", &[rows * 16])
            .buf("k_cache", &[self.ctx * 8])
            .buf("v_cache", &[self.ctx * 8])
            .f32("eps", 1e-5)
            .u32("dim", self.dim)
            .u32("n_head", self.n_head)
            .u32("n_kv_head", self.n_kv)
            .u32("head_dim", self.hd)
            .f32("base", 10_000.0)
            .u32("mode", self.mode)
            .u32("cache_f16", 0)
    }
}

#[test]
fn fused_qkv_kernels_refuse_hostile_heads_positions_and_modes() {
    let qkv = mm::NORM_QKV_ROPE.iter().chain(&mm::NORM_QKV_ROPE_SHARED);
    let ff = mm::NORM_QKV_ROPE_FF
        .iter()
        .chain(&mm::NORM_QKV_ROPE_FF_SHARED);
    for sig in qkv
        .chain(&mm::NORM_QKV_ROPE_MIXED)
        .chain(ff)
        .chain(&mm::NORM_QKV_ROPE_FF_MIXED)
    {
        let ok = Qkv {
            rows: 1,
            dim: 256,
            n_head: 2,
            n_kv: 1,
            hd: 8,
            ctx: 8,
            step: &[2],
            mode: 0,
        };
        ok.call(sig).accepted();
        Qkv { rows: 3, ..ok }.call(sig).accepted();
        Qkv {
            rows: 3,
            mode: 1,
            ..ok
        }
        .call(sig)
        .accepted();
        Qkv { dim: 0, ..ok }.call(sig).refused("dim = 0");
        Qkv { dim: 255, ..ok }.call(sig).refused("dim = 255");
        Qkv { dim: MAX, ..ok }.call(sig).refused("dim = 4294967295");
        Qkv { hd: 0, ..ok }.call(sig).refused("head_dim = 0");
        Qkv { hd: 7, ..ok }.call(sig).refused("head_dim = 7");
        Qkv { hd: 2048, ..ok }.call(sig).refused("head_dim = 2048");
        Qkv { hd: MAX, ..ok }
            .call(sig)
            .refused("head_dim = 4294967295");
        Qkv { n_head: 0, ..ok }.call(sig).refused("n_head = 0");
        Qkv { n_kv: 0, ..ok }.call(sig).refused("n_kv_head = 0");
        Qkv { n_head: MAX, ..ok }
            .call(sig)
            .refused("n_head = 4294967295");
        Qkv { n_kv: MAX, ..ok }
            .call(sig)
            .refused("n_kv_head = 4294967295");
        Qkv { mode: 2, ..ok }.call(sig).refused("mode = 2");
        Qkv { step: &[-1], ..ok }.call(sig).refused("pos0 = -1");
        Qkv {
            step: &[i32::MAX],
            ..ok
        }
        .call(sig)
        .refused("pos0 = 2147483647");
        Qkv {
            step: &[6],
            rows: 3,
            ..ok
        }
        .call(sig)
        .refused("pos0 = 6");
        Qkv { step: &[], ..ok }.call(sig).refused("step");
        Qkv { ctx: 0, ..ok }.call(sig).refused("k_cache");
        ok.call(sig)
            .buf("k_cache", &[61])
            .buf("v_cache", &[61])
            .refused("k_cache");
        ok.call(sig).buf("v_cache", &[56]).refused("v_cache");
        ok.call(sig).ints("positions", &[1, 2]).refused("positions");
        ok.call(sig).buf("q", &[15]).refused("q");
        ok.call(sig).buf("norm", &[255]).refused("norm");
        // Any position is an angle.
        ok.call(sig).ints("positions", &[i32::MIN]).accepted();
        if sig.index_of("freq_factors").is_some() {
            ok.call(sig)
                .buf("freq_factors", &[3])
                .refused("freq_factors");
        }
    }
}

#[test]
fn fused_gate_up_kernels_refuse_hostile_sizes() {
    for sig in mm::NORM_GATE_UP.iter().chain(&mm::NORM_GATE_UP_SHARED) {
        let call = |rows: usize, hidden: usize, dim: u32, ffn: u32| {
            Call::new(sig)
                .buf("x", &[rows * 256])
                .buf("norm", &[256])
                .buf("w_gate", &[16, 256])
                .buf("w_up", &[16, 256])
                .buf("hidden", &[hidden])
                .f32("eps", 1e-5)
                .u32("dim", dim)
                .u32("ffn", ffn)
                .u32("act", 0)
        };
        call(1, 16, 256, 16).accepted();
        call(3, 48, 256, 16).accepted();
        call(3, 48, 256, 16).u32("act", 1).accepted();
        call(1, 16, 256, 16).u32("act", 2).refused("act = 2");
        call(1, 16, 256, 16)
            .u32("act", MAX)
            .refused("act = 4294967295");
        call(1, 16, 0, 16).refused("dim = 0");
        call(1, 16, MAX, 16).refused("dim = 4294967295");
        call(1, 16, 100, 16).refused("dim = 100");
        call(1, 16, 256, MAX).refused("ffn = 4294967295");
        call(1, 16, 256, 15).refused("ffn = 15");
        call(3, 47, 256, 16).refused("hidden");
        call(1, 16, 256, 16).buf("norm", &[255]).refused("norm");
        call(1, 16, 256, 16).buf("w_up", &[15, 256]).refused("w_up");
    }
}

/// The scoring scalars of an attention call with `n_head` query and `n_kv` key/value heads (no
/// window).
fn heads(c: Call, n_head: u32, n_kv: u32, hd: u32) -> Call {
    c.u32("n_head", n_head)
        .u32("n_kv_head", n_kv)
        .u32("head_dim", hd)
        .f32("scale", 0.35)
        .f32("softcap", 0.0)
        .u32("window", 0)
}

#[test]
fn prefill_attention_refuses_hostile_heads_and_positions() {
    let families = ka::ATTENTION.iter().chain(&ka::ATTENTION_MMA);
    for sig in families.chain(&ka::ATTENTION_MMA_TO_F16) {
        // 2 rows, 4 query and 2 key/value heads of 8, a cache of 6 positions.
        let call = |step: &[i32], (n_head, n_kv, hd): (u32, u32, u32)| {
            heads(
                Call::new(sig)
                    .buf("q", &[2 * 32])
                    .buf("k_cache", &[2, 6, 8])
                    .buf("v_cache", &[2, 6, 8])
                    .ints("step", step)
                    .buf("out", &[2 * 32]),
                n_head,
                n_kv,
                hd,
            )
        };
        let ok = (4, 2, 8);
        call(&[3], ok).accepted();
        call(&[4], ok).accepted();
        call(&[0], ok).f32("softcap", 30.0).accepted();
        call(&[0], ok).f32("scale", f32::NAN).accepted();
        // Every window is meaningful: 1 (each row sees itself), inside, past the cache.
        for w in [1, 3, 6, MAX] {
            call(&[4], ok).u32("window", w).accepted();
        }
        call(&[0], (0, 2, 8)).refused("n_head = 0");
        call(&[0], (4, 0, 8)).refused("n_kv_head = 0");
        call(&[0], (4, 2, 0)).refused("head_dim = 0");
        call(&[0], (3, 2, 8)).refused("n_head = 3");
        call(&[0], (4, 1, 8)).refused("k_cache");
        call(&[0], (4, 4, 8)).refused("k_cache");
        call(&[0], (MAX, 2, 8)).refused("n_head = 4294967295");
        call(&[0], (MAX - 1, 2, 8)).refused("n_head = 4294967294");
        call(&[0], (4, 2, MAX)).refused("head_dim = 4294967295");
        call(&[-1], ok).refused("pos0 = -1");
        call(&[i32::MIN], ok).refused("pos0 = -2147483648");
        call(&[i32::MAX], ok).refused("pos0 = 2147483647");
        call(&[5], ok).refused("pos0 = 5");
        call(&[], ok).refused("step");
        call(&[0], ok).buf("v_cache", &[2, 5, 8]).refused("v_cache");
        call(&[0], ok).buf("q", &[0]).buf("out", &[0]).refused("q");
        call(&[0], ok)
            .buf("q", &[31])
            .buf("out", &[31])
            .refused("q");
        call(&[0], ok).buf("out", &[32]).refused("out");
    }
}

#[test]
fn decode_attention_partials_refuse_hostile_chunks_and_positions() {
    for sig in &ka::DECODE_PARTIAL {
        // One row, `n_head` query and `n_kv` key/value heads of `hd`, a cache of 40 positions.
        let call = |step: &[i32], (n_head, n_kv, hd): (u32, u32, u32), records: usize| {
            let c = Call::new(sig)
                .buf("q", &[(n_head * hd) as usize])
                .buf("k_cache", &[n_kv as usize, 40, hd as usize])
                .buf("v_cache", &[n_kv as usize, 40, hd as usize])
                .ints("step", step)
                .buf("records", &[records]);
            heads(c, n_head, n_kv, hd)
                .u32("chunk_len", 16)
                .u32("chunks", 4)
        };
        let ok = (4, 2, 8);
        let recs = 4 * 4 * 10;
        call(&[20], ok, recs).accepted();
        call(&[39], ok, recs).accepted();
        // The head sizes of the AVX-512 form (on CPUs that have it).
        call(&[20], (2, 1, 32), 4 * 2 * 34).accepted();
        call(&[39], (4, 2, 64), 4 * 4 * 66).accepted();
        // Windows starting inside a chunk, on a chunk boundary, or covering everything.
        for w in [1, 5, 8, 24, 40, MAX] {
            call(&[39], ok, recs).u32("window", w).accepted();
            call(&[39], (4, 2, 64), 4 * 4 * 66)
                .u32("window", w)
                .accepted();
        }
        // A window never lets a position past the records through.
        call(&[39], ok, recs)
            .u32("window", 8)
            .u32("chunks", 2)
            .refused("chunks = 2");
        call(&[20], ok, recs)
            .u32("chunk_len", 0)
            .refused("chunk_len = 0");
        call(&[20], ok, recs).u32("chunks", 0).refused("chunks = 0");
        call(&[20], ok, recs)
            .u32("chunks", MAX)
            .refused("chunks = 4294967295");
        call(&[39], ok, recs).u32("chunks", 2).refused("chunks = 2");
        call(&[39], ok, 2 * 4 * 10)
            .u32("chunks", 2)
            .refused("chunks = 2");
        call(&[20], ok, recs - 1).refused("records");
        call(&[-1], ok, recs).refused("pos0 = -1");
        call(&[40], ok, recs).refused("pos0 = 40");
        call(&[i32::MAX], ok, recs).refused("pos0 = 2147483647");
        call(&[], ok, recs).refused("step");
        call(&[20], ok, recs).u32("n_head", 0).refused("n_head = 0");
        call(&[20], ok, recs)
            .u32("n_kv_head", 3)
            .refused("n_head = 4");
        call(&[20], ok, recs)
            .u32("head_dim", MAX)
            .refused("head_dim = 4294967295");
        call(&[20], ok, recs).buf("q", &[31]).refused("q");
    }
}

#[test]
fn decode_attention_combines_refuse_hostile_chunks_and_positions() {
    let sig = &ka::DECODE_COMBINE;
    let call = |step: &[i32], records: usize, out: usize, dims: (u32, u32, u32, u32)| {
        let (n_head, hd, chunk_len, chunks) = dims;
        Call::new(sig)
            .buf("records", &[records])
            .ints("step", step)
            .buf("out", &[out])
            .u32("n_head", n_head)
            .u32("head_dim", hd)
            .u32("chunk_len", chunk_len)
            .u32("chunks", chunks)
            .u32("window", 0)
    };
    let ok = (4, 8, 16, 4);
    call(&[20], 160, 32, ok).accepted();
    call(&[63], 160, 32, ok).accepted();
    for w in [1, 16, 17, 64, MAX] {
        call(&[63], 160, 32, ok).u32("window", w).accepted();
    }
    call(&[64], 160, 32, ok)
        .u32("window", 1)
        .refused("pos0 = 64");
    call(&[20], 160, 32, (0, 8, 16, 4)).refused("n_head = 0");
    call(&[20], 160, 32, (4, 0, 16, 4)).refused("head_dim = 0");
    call(&[20], 160, 32, (4, 8, 0, 4)).refused("chunk_len = 0");
    call(&[20], 160, 32, (4, 8, 16, 0)).refused("chunks = 0");
    call(&[20], 160, 32, (MAX, MAX, 16, 4)).refused("n_head = 4294967295");
    call(&[20], 160, 32, (4, 8, 16, MAX)).refused("chunks = 4294967295");
    call(&[20], 160, 32, (4, 8, MAX, 4)).accepted();
    call(&[20], 159, 32, ok).refused("records");
    call(&[20], 160, 31, ok).refused("out");
    call(&[-1], 160, 32, ok).refused("pos0 = -1");
    call(&[64], 160, 32, ok).refused("pos0 = 64");
    call(&[i32::MAX], 160, 32, ok).refused("pos0 = 2147483647");
    call(&[], 160, 32, ok).refused("step");
}
