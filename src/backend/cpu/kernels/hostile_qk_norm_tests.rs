//! The norm + three products kernels (`norm_qkv_*`) and the q/k norm + cache write kernel
//! (`rms_norm_rope_kv_f32`) against hostile scalars (see `hostile_tests.rs`).

use super::{Call, MAX};
use crate::kernels::{matmul as mm, norm as kn};

#[test]
fn norm_qkv_kernels_refuse_hostile_widths() {
    let qkv = mm::NORM_QKV.iter().chain(&mm::NORM_QKV_SHARED);
    for sig in qkv.chain(&mm::NORM_QKV_MIXED) {
        // Rows of 256 values, 16 q and 8 k and v outputs a row.
        let call = |rows: usize, dim: u32, n_q: u32, n_kv: u32| {
            Call::new(sig)
                .buf("x", &[rows * 256])
                .buf("norm", &[256])
                .buf("wq", &[16, 256])
                .buf("wk", &[8, 256])
                .buf("wv", &[8, 256])
                .buf("q", &[rows * 16])
                .buf("k", &[rows * 8])
                .buf("v", &[rows * 8])
                .f32("eps", 1e-5)
                .u32("dim", dim)
                .u32("n_q", n_q)
                .u32("n_kv", n_kv)
        };
        call(1, 256, 16, 8).accepted();
        call(3, 256, 16, 8).accepted();
        call(1, 256, 16, 8).f32("eps", f32::NAN).accepted();
        call(1, 0, 16, 8).refused("dim = 0");
        call(1, 255, 16, 8).refused("dim = 255");
        call(1, MAX, 16, 8).refused("dim = 4294967295");
        call(1, 256, 0, 8).refused("n_q = 0");
        call(1, 256, 16, 0).refused("n_kv = 0");
        call(1, 256, 32, 8).refused("n_q");
        call(1, 256, 16, 16).refused("n_kv");
        call(1, 256, MAX, 8).refused("n_q");
        call(1, 256, 16, MAX).refused("n_kv");
        call(1, 256, 16, 8).buf("q", &[15]).refused("q");
        call(1, 256, 16, 8).buf("k", &[9]).refused("k");
        call(3, 256, 16, 8).buf("v", &[8]).refused("v");
        call(1, 256, 16, 8).buf("norm", &[255]).refused("norm");
        call(1, 256, 16, 8).buf("x", &[300]).refused("x");
    }
}

#[test]
fn rms_norm_rope_kv_refuses_hostile_heads_steps_and_caches() {
    // Two q heads and one k and v head of `hd` a row, caches of `ctx` positions.
    // The buffers are sized for heads of 64 whatever `hd` says.
    let call = |rows: usize, hd: u32, ctx: usize, step: &[i32]| {
        let positions: Vec<i32> = (0..rows as i32).map(|r| 7 + r).collect();
        Call::new(&kn::RMS_NORM_ROPE_KV[0])
            .buf("q_in", &[rows * 2 * 64])
            .buf("q_weight", &[64])
            .buf("k_in", &[rows * 64])
            .buf("k_weight", &[64])
            .buf("v", &[rows * 64])
            .ints("positions", &positions)
            .ints("step", step)
            .buf("q", &[rows * 2 * 64])
            .buf("k_cache", &[ctx * 64])
            .buf("v_cache", &[ctx * 64])
            .f32("eps", 1e-6)
            .u32("head_dim", hd)
            .f32("base", 10_000.0)
            .u32("mode", 1)
            .u32("n_kv_head", 1)
            .u32("cache_f16", 0)
    };
    call(1, 64, 8, &[3]).accepted();
    call(3, 64, 8, &[5]).accepted();
    call(1, 64, 8, &[3]).f32("eps", f32::NAN).accepted();
    call(3, 64, 8, &[6]).refused("pos0 = 6");
    call(1, 64, 8, &[-1]).refused("pos0 = -1");
    call(1, 64, 8, &[i32::MAX]).refused("pos0 = 2147483647");
    call(1, 64, 8, &[]).refused("step");
    call(1, 64, 0, &[0]).refused("pos0 = 0");
    call(1, 0, 8, &[3]).refused("head_dim = 0");
    call(1, 63, 8, &[3]).refused("head_dim = 63");
    call(1, MAX, 8, &[3]).refused("head_dim = 4294967295");
    call(1, 32, 8, &[3]).refused("q_weight");
    call(1, 64, 8, &[3]).u32("mode", 0).refused("mode = 0");
    call(1, 64, 8, &[3])
        .u32("mode", MAX)
        .refused("mode = 4294967295");
    call(1, 64, 8, &[3])
        .u32("n_kv_head", 0)
        .refused("n_kv_head = 0");
    call(1, 64, 8, &[3]).u32("n_kv_head", MAX).refused("k_in");
    call(1, 64, 8, &[3]).u32("n_kv_head", 2).refused("k_in");
    call(1, 64, 8, &[3]).buf("q", &[127]).refused("q");
    call(1, 64, 8, &[3]).buf("q_in", &[64]).refused("q_in");
    call(1, 64, 8, &[3]).buf("v", &[65]).refused("v");
    call(1, 64, 8, &[3])
        .buf("v_cache", &[7 * 64])
        .refused("v_cache");
    call(1, 64, 8, &[3])
        .buf("k_cache", &[8 * 64 + 1])
        .buf("v_cache", &[8 * 64 + 1])
        .refused("k_cache");
    call(1, 64, 8, &[3]).ints("positions", &[]).refused("q");
    call(1, 64, 8, &[3])
        .u32("cache_f16", 1)
        .refused("cache_f16");
}
