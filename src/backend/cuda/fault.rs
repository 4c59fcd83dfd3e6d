//! Kernel-detected errors on CUDA: a token id outside the vocabulary, a position outside the KV
//! cache, an expert id outside `0..experts`, argument sizes that disagree with the scalars.
//!
//! A CUDA kernel cannot return an error, so each device keeps one small *error record* in device
//! memory (eight u32 words). Every loaded module's `op_error_word` global points at it (set when
//! the module is loaded). A kernel that finds a bad argument claims the record with `atomicCAS`
//! on word 0 (the first error wins: its kernel tag), fills in the check's code and values, and
//! returns without writing. After the stream is synchronized the host reads the record; a
//! claimed record becomes [`Error::Kernel`] naming the kernel and the bad value, and the record
//! is zeroed again, so it is zero at the start of every submission.
//!
//! Layout, in u32 words (see `kernels/prelude.cuh`): `[0]` the kernel's tag ([`kernel_tag`] of
//! its name), `[1]` the check's code, `[2..3]` value (i64), `[4..5]` bound (u64), `[6..7]`
//! index (u64).

use super::registry::all_kernel_names;
use crate::error::Error;

/// Words in the device's error record.
pub const RECORD_WORDS: usize = 8;

/// Bytes of the device's error record.
pub const RECORD_BYTES: usize = RECORD_WORDS * 4;

/// The name of the module global that points at the error record.
pub(crate) const ERROR_WORD_SYMBOL: &str = "op_error_word";

const SHAPE: u32 = 1;
const TOKEN_ID: u32 = 2;
const EXPERT_ID: u32 = 3;
const POS0: u32 = 4;
const CHUNKS: u32 = 5;
const SCRATCH: u32 = 6;
const SLOT_ROW: u32 = 7;
const DRAW: u32 = 8;

/// A kernel's tag in the error record: FNV-1a (32-bit) of its name, as `op_tag` in the prelude.
pub fn kernel_tag(name: &str) -> u32 {
    name.bytes().fold(2_166_136_261u32, |h, b| {
        (h ^ b as u32).wrapping_mul(16_777_619)
    })
}

/// The kernel whose tag is `tag`, if one has it.
fn kernel_named_by(tag: u32) -> Option<&'static str> {
    all_kernel_names()
        .into_iter()
        .find(|name| kernel_tag(name) == tag)
}

/// The error a claimed record describes; `None` for a clear record (word 0 is zero).
pub fn record_error(words: &[u32; RECORD_WORDS]) -> Option<Error> {
    if words[0] == 0 {
        return None;
    }
    let wide = |i: usize| words[i] as u64 | (words[i + 1] as u64) << 32;
    let (value, bound, index) = (wide(2) as i64, wide(4), wide(6));
    let msg = match words[1] {
        SHAPE => format!(
            "argument sizes disagree with the kernel's scalars (size check at line {value} of \
             its CUDA source)"
        ),
        TOKEN_ID => {
            format!("token id {value} at ids[{index}] is outside the vocabulary 0..{bound}")
        }
        EXPERT_ID => format!("expert id {value} at ids[{index}] is outside 0..{bound}"),
        POS0 => {
            format!("pos0 {value} with {index} rows does not fit in a cache of {bound} positions")
        }
        CHUNKS => format!(
            "KV length {value} needs more than the {bound} chunks of {index} the scratch holds"
        ),
        SCRATCH => format!(
            "the attention scratch's counter for head {index} was {value}, not below {bound}: pass \
             a partials buffer from Device::alloc (zeroed) used by this op only"
        ),
        SLOT_ROW => format!(
            "row {index}: slot or position {value} is outside 0..{bound} (a batched step's slot \
             outside the cache, or a position outside its slot)"
        ),
        DRAW => format!(
            "the draw's point fell past every candidate ({index} candidates, nucleus {value} of \
             {bound} quanta)"
        ),
        code => format!("unknown error code {code} (value {value}, bound {bound}, index {index})"),
    };
    Some(match kernel_named_by(words[0]) {
        Some(kernel) => Error::Kernel { kernel, msg },
        None => Error::Backend(format!(
            "a kernel with unknown tag {:#010x} reported: {msg}",
            words[0]
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_nonzero_and_distinct() {
        let names = all_kernel_names();
        let mut tags: Vec<u32> = names.iter().map(|n| kernel_tag(n)).collect();
        assert!(tags.iter().all(|&t| t != 0), "a kernel's tag is zero");
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), names.len(), "two kernels share a tag");
    }

    #[test]
    fn tag_is_fnv1a() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(kernel_tag(""), 0x811c_9dc5);
        assert_eq!(kernel_tag("a"), 0xe40c_292c);
        assert_eq!(kernel_tag("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn records_decode_to_kernel_errors() {
        assert!(record_error(&[0; RECORD_WORDS]).is_none());
        let id = -5i64 as u64;
        let rec = [
            kernel_tag("embedding_q8_0"),
            TOKEN_ID,
            id as u32,
            (id >> 32) as u32,
            50,
            0,
            3,
            0,
        ];
        match record_error(&rec) {
            Some(Error::Kernel { kernel, msg }) => {
                assert_eq!(kernel, "embedding_q8_0");
                assert!(
                    msg.contains("token id -5 at ids[3]") && msg.contains("0..50"),
                    "{msg}"
                );
            }
            other => panic!("expected a kernel error, got {other:?}"),
        }
        let rec = [kernel_tag("kv_write_f32_f16"), POS0, 40, 0, 40, 0, 1, 0];
        let msg = record_error(&rec).unwrap().to_string();
        assert!(
            msg.contains("kv_write_f32_f16") && msg.contains("pos0 40"),
            "{msg}"
        );
        let msg = record_error(&[7, SHAPE, 12, 0, 0, 0, 0, 0])
            .unwrap()
            .to_string();
        assert!(
            msg.contains("unknown tag") && msg.contains("line 12"),
            "{msg}"
        );
    }
}
