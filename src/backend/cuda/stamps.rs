//! Block stamps: when each block of each kernel ran, as the GPU ran it (CUDA graphs and
//! programmatic launches included), for `onepass bench --timeline`.
//!
//! A device opened with [`super::CudaOptions::block_stamps`] compiles its kernels with
//! `-DOP_STAMPS` (`kernels/prelude.cuh`): every block then writes one record when its last thread
//! leaves, into a ring of [`STAMP_CAP`] records that follows the error record in the same
//! allocation (so every module finds it through `op_error_word`). Layout after the error record's
//! [`super::fault::RECORD_BYTES`]: a u64 write counter, then records of [`STAMP_WORDS`] u64 words:
//! `[0]` kernel tag | SM << 32, `[1]` block index | grid blocks << 32, `[2]` arrival (thread 0's
//! first instruction, `%globaltimer` ns), `[3]` when its grid wait returned, `[4]` when its last
//! thread left. The stamps cost each block a barrier and a few atomics, so a stamped kernel runs
//! a little slower than a plain one.

use super::fault::kernel_tag;
use super::registry::all_kernel_names;
use std::collections::HashMap;

/// u64 words of one record.
pub const STAMP_WORDS: usize = 5;
/// Records the ring holds (`OP_STAMP_CAP` in the prelude); a step that writes more keeps the last.
pub const STAMP_CAP: usize = 1 << 18;
/// Bytes of the ring: the counter and the records.
pub const RING_BYTES: usize = 8 * (1 + STAMP_CAP * STAMP_WORDS);

/// One block of one kernel launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockStamp {
    /// The kernel's name (`"?"` plus its tag in hex for a tag no kernel has).
    pub kernel: String,
    /// The SM the block ran on.
    pub sm: u32,
    /// The block's linear index in its grid.
    pub block: u32,
    /// Blocks in its grid.
    pub grid: u32,
    /// When the block started (ns, the GPU's global timer).
    pub arrive_ns: u64,
    /// When its grid wait returned: the kernels it depends on had finished (ns).
    pub start_ns: u64,
    /// When its last thread left (ns).
    pub end_ns: u64,
}

/// The records in a ring's words (`words[0]` the counter), oldest first: the last
/// `min(counter, STAMP_CAP)` written.
pub fn decode_ring(words: &[u64]) -> Vec<BlockStamp> {
    let Some((&count, records)) = words.split_first() else {
        return Vec::new();
    };
    let cap = records.len() / STAMP_WORDS;
    if cap == 0 {
        return Vec::new();
    }
    let names: HashMap<u32, &str> = all_kernel_names()
        .into_iter()
        .map(|n| (kernel_tag(n), n))
        .collect();
    let count = count as usize;
    (count.saturating_sub(cap)..count)
        .map(|i| {
            let r = &records[(i % cap) * STAMP_WORDS..][..STAMP_WORDS];
            let tag = (r[0] & 0xffff_ffff) as u32;
            BlockStamp {
                kernel: names
                    .get(&tag)
                    .map_or_else(|| format!("?{tag:08x}"), |n| n.to_string()),
                sm: (r[0] >> 32) as u32,
                block: (r[1] & 0xffff_ffff) as u32,
                grid: (r[1] >> 32) as u32,
                arrive_ns: r[2],
                start_ns: r[3],
                end_ns: r[4],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, sm: u32, block: u32, grid: u32, t: [u64; 3]) -> [u64; STAMP_WORDS] {
        [
            kernel_tag(name) as u64 | (sm as u64) << 32,
            block as u64 | (grid as u64) << 32,
            t[0],
            t[1],
            t[2],
        ]
    }

    /// Records decode to their fields and kernel names, oldest first, also after the ring wrapped.
    #[test]
    fn given_a_wrapped_ring_when_decoded_should_keep_the_last_records_in_order() {
        let cap = 3;
        let mut words = vec![0u64; 1 + cap * STAMP_WORDS];
        let recs = [
            record("embedding_q8_0", 1, 0, 2, [10, 11, 20]),
            record("embedding_q8_0", 2, 1, 2, [10, 12, 21]),
            record("argmax_f32", 7, 0, 1, [30, 31, 40]),
            record("argmax_f32", 9, 0, 1, [50, 51, 60]),
        ];
        for (i, r) in recs.iter().enumerate() {
            words[1 + (i % cap) * STAMP_WORDS..][..STAMP_WORDS].copy_from_slice(r);
        }
        words[0] = recs.len() as u64;
        let got = decode_ring(&words);
        assert_eq!(got.len(), cap);
        assert_eq!(got[0].kernel, "embedding_q8_0");
        assert_eq!((got[0].sm, got[0].block, got[0].grid), (2, 1, 2));
        assert_eq!(
            (got[0].arrive_ns, got[0].start_ns, got[0].end_ns),
            (10, 12, 21)
        );
        assert_eq!(got[2].kernel, "argmax_f32");
        assert_eq!(got[2].end_ns, 60);
        words[1] = 0x1234_5678;
        assert!(decode_ring(&words)[2].kernel.starts_with('?'));
        assert!(decode_ring(&[0]).is_empty());
    }
}
