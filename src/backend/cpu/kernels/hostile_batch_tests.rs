//! The batched decode step's kernels (row-invariant products, slotted KV writes and decode
//! attention) against hostile scalars, slots and positions (see `hostile_tests.rs`).

use super::{Call, MAX};
use crate::kernels::batch::{ATTENTION_SLOTS, KV_WRITE_SLOTS, MATMUL_ROWS};

#[test]
fn row_invariant_products_refuse_hostile_sizes_and_overflowing_products() {
    for sig in &MATMUL_ROWS {
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
        call(0, &[0], 0, (0, 1 << 31, 1 << 31)).refused("n = 2147483648");
        call(256, &[5, 256], 4, (1, 256, 5)).refused("out");
    }
}

#[test]
fn slotted_kv_writes_refuse_hostile_slots_positions_and_heads() {
    for sig in &KV_WRITE_SLOTS {
        // A cache of 3 slots, 2 KV heads, 5 positions, head_dim 4; two rows.
        let call = |slots: &[i32], positions: &[i32], n_kv: u32, hd: u32, ctx: u32| {
            Call::new(sig)
                .buf("new", &[slots.len(), 8])
                .ints("slots", slots)
                .ints("positions", positions)
                .buf("cache", &[3, 2, 5, 4])
                .u32("n_kv_head", n_kv)
                .u32("head_dim", hd)
                .u32("slot_ctx", ctx)
        };
        call(&[0, 2], &[0, 4], 2, 4, 5).accepted();
        call(&[2, 2], &[0, 0], 2, 4, 5).accepted();
        call(&[0, 3], &[0, 4], 2, 4, 5).refused("slot 3");
        call(&[-1, 0], &[0, 4], 2, 4, 5).refused("slot -1");
        call(&[0, 1], &[5, 0], 2, 4, 5).refused("position 5");
        call(&[0, 1], &[0, i32::MIN], 2, 4, 5).refused("position -2147483648");
        call(&[0, 1], &[0, 1], 4, 2, 5).refused("cache");
        call(&[0, 1], &[0, 1], 2, 4, 4).refused("slot_ctx = 4");
        call(&[0, 1], &[0, 1], MAX, MAX, MAX).refused("cache");
        call(&[0, 1], &[0, 1], 2, 0, 5).refused("cache");
        // Fewer positions than rows.
        Call::new(sig)
            .buf("new", &[2, 8])
            .ints("slots", &[0, 1])
            .ints("positions", &[0])
            .buf("cache", &[3, 2, 5, 4])
            .u32("n_kv_head", 2)
            .u32("head_dim", 4)
            .u32("slot_ctx", 5)
            .refused("positions");
    }
}

#[test]
fn slotted_decode_attention_refuses_hostile_slots_positions_and_scratch() {
    for sig in &ATTENTION_SLOTS {
        // Caches of 3 slots, 1 KV head, 10 positions, head_dim 8; 2 query heads; chunks of 4.
        let (hd, n_head, chunk) = (8usize, 2usize, 4u32);
        let per_row = 3 * n_head * (hd + 2) + n_head;
        let call = |slots: &[i32], positions: &[i32], partials: usize, chunks: u32| {
            let rows = slots.len();
            Call::new(sig)
                .buf("q", &[rows, n_head * hd])
                .buf("k_cache", &[3, 1, 10, hd])
                .buf("v_cache", &[3, 1, 10, hd])
                .ints("slots", slots)
                .ints("positions", positions)
                .buf("partials", &[partials])
                .buf("out", &[rows, n_head * hd])
                .u32("n_head", n_head as u32)
                .u32("n_kv_head", 1)
                .u32("head_dim", hd as u32)
                .u32("slot_ctx", 10)
                .f32("scale", 0.3)
                .f32("softcap", 0.0)
                .u32("window", 0)
                .u32("chunk_len", chunk)
                .u32("chunks", chunks)
        };
        call(&[0, 2], &[9, 0], 2 * per_row, 3).accepted();
        call(&[1], &[5], per_row, 3).u32("window", 2).accepted();
        call(&[0, 3], &[9, 0], 2 * per_row, 3).refused("slot 3");
        call(&[0, i32::MAX], &[9, 0], 2 * per_row, 3).refused("slot 2147483647");
        call(&[0, 1], &[10, 0], 2 * per_row, 3).refused("position 10");
        call(&[0, 1], &[-1, 0], 2 * per_row, 3).refused("position -1");
        call(&[0, 1], &[1, 0], 2 * per_row - 1, 3).refused("partials");
        call(&[0, 1], &[1, 0], 2 * per_row, 3)
            .u32("chunk_len", 0)
            .refused("chunk_len = 0");
        // Scratch for two chunks of 4 cannot hold position 9.
        let small = 2 * n_head * (hd + 2) + n_head;
        call(&[0], &[9], small, 2).refused("chunks = 2");
        call(&[0], &[1], per_row, 3).u32("n_head", 3).refused("q");
        call(&[0], &[1], per_row, 3)
            .u32("n_kv_head", 0)
            .refused("n_kv_head = 0");
        call(&[0], &[1], per_row, 3)
            .u32("head_dim", MAX)
            .refused("k_cache");
    }
}
