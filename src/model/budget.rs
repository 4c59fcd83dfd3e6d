//! Memory a loaded model needs beyond its weights (KV cache and scratch), and the memory this
//! machine has available, so that a context too large for the machine is refused before anything
//! is allocated instead of being killed by the kernel's out-of-memory killer halfway through.

use crate::error::{Error, Result};
use crate::model::arch::ModelConfig;
use crate::model::gguf::GgufFile;

/// Bytes of one f32 or i32 element.
const WORD: u128 = 4;

/// Bytes of the KV cache (`kv_bytes` an element: 4 for f32, 2 for f16) and scratch of a model of
/// configuration `c` with a context of `max_ctx` positions, prefill passes of up to `max_batch`
/// rows and `decode_partials` f32 values of decode attention scratch. Weights are not counted (on the CPU they are a mapping of the file, which
/// the kernel can page in and out). Computed in `u128`, so no size overflows.
pub fn cache_and_scratch_bytes(
    c: &ModelConfig,
    max_ctx: usize,
    max_batch: usize,
    decode_partials: usize,
    kv_bytes: u128,
) -> u128 {
    let n = |x: usize| x as u128;
    let rows = n(max_batch.min(max_ctx));
    let kv_width = n(c.n_kv_head) * n(c.head_dim);
    let q_width = n(c.n_head) * n(c.head_dim);
    let kv = 2 * n(c.n_layer) * kv_width * n(max_ctx);
    // x, xn, proj; q, attn; k, v; gate, up, hidden (one set per prefill row, one for decode);
    // the queries and keys before their per-head norm where the family has one.
    let qk_raw = if c.qk_norm { q_width + kv_width } else { 0 };
    let scratch_row = 3 * n(c.dim) + 2 * q_width + 2 * kv_width + 3 * n(c.ffn_dim) + qk_raw;
    let scratch = (rows + 1) * scratch_row + n(decode_partials);
    let outputs = rows * (n(c.dim) + n(c.vocab)) + 1;
    let inputs = 1 + 2 * rows;
    kv_bytes * kv + WORD * (scratch + outputs + inputs)
}

/// Bytes a multi-slot model needs beyond [`cache_and_scratch_bytes`] (which counts one slot):
/// the KV cache of its other `cache_slots - 1` slots (`kv_bytes` an element; the padding slot of
/// batched steps included), and for batched decode steps of up to `max_rows` rows their scratch, one decode
/// attention scratch of `decode_partials` f32 values per row, inputs and outputs.
pub fn slots_and_batch_bytes(
    c: &ModelConfig,
    max_ctx: usize,
    cache_slots: usize,
    max_rows: usize,
    decode_partials: usize,
    kv_bytes: u128,
) -> u128 {
    let n = |x: usize| x as u128;
    let kv_width = n(c.n_kv_head) * n(c.head_dim);
    let q_width = n(c.n_head) * n(c.head_dim);
    let kv = 2 * n(c.n_layer) * kv_width * n(max_ctx) * n(cache_slots.saturating_sub(1));
    let qk_raw = if c.qk_norm { q_width + kv_width } else { 0 };
    let scratch_row = 3 * n(c.dim) + 2 * q_width + 2 * kv_width + 3 * n(c.ffn_dim) + qk_raw;
    let rows = n(max_rows);
    let batch = rows * (scratch_row + n(decode_partials) + n(c.dim) + n(c.vocab) + 4);
    kv_bytes * kv + WORD * batch
}

/// Bytes of K and V one decode step's attention reads (`kv_bytes` an element) when the query is
/// at the last of `keys` cached positions: every layer's rows of the keys it sees, a local
/// layer's window (the query at position `i` sees keys `i + 1 - W..=i`) applied. What
/// `onepass bench` divides the attention's time by; the declared ranges cover the whole cache.
pub fn decode_kv_read_bytes(c: &ModelConfig, keys: usize, kv_bytes: u128) -> u128 {
    let kv_width = c.n_kv_head as u128 * c.head_dim as u128;
    (0..c.n_layer)
        .map(|l| {
            let seen = c.layer_attention(l).window.map_or(keys, |w| keys.min(w));
            2 * kv_width * seen as u128 * kv_bytes
        })
        .sum()
}

/// Bytes of weights one decode step reads from model `file`: every tensor but the token
/// embedding table, one row of that table (the token's), and the whole table again where the
/// file has no output head of its own (`output.weight`), since the table is then the head. What
/// `onepass bench` divides a decode step's device time by for its bytes a second.
pub fn decode_weight_bytes(file: &GgufFile) -> u128 {
    let mut bytes = 0u128;
    for t in file.tensors() {
        if t.name != "token_embd.weight" {
            bytes += t.n_bytes as u128;
            continue;
        }
        let rows = t.ne.get(1).copied().unwrap_or(1).max(1) as u128;
        bytes += t.n_bytes as u128 / rows;
        if !file.has_tensor("output.weight") {
            bytes += t.n_bytes as u128;
        }
    }
    bytes
}

pub use crate::backend::{available_host_memory as available_memory, parse_mem_available};

/// Sizes in words: `1.5 GiB`, `300.0 MiB`, `12 bytes`.
pub fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// An error when `need` bytes for a context of `max_ctx` positions exceed the `available` bytes;
/// nothing is refused when the available memory is unknown.
pub fn check_fits(need: u128, available: Option<u64>, max_ctx: usize) -> Result<()> {
    match available {
        Some(have) if need > u128::from(have) => Err(Error::InvalidArgument(format!(
            "a context of {max_ctx} tokens needs {} for the KV cache and scratch, but this \
             machine has {} available: use a smaller context (--ctx)",
            human_bytes(need),
            human_bytes(u128::from(have))
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        ModelConfig {
            family: crate::model::arch::Family::Llama,
            n_layer: 30,
            dim: 576,
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
            ffn_dim: 1536,
            vocab: 49152,
            rope_base: 10000.0,
            rope_dim: 64,
            rope_mode: crate::ops::rope::RopeMode::Normal,
            norm_eps: 1e-5,
            train_ctx: 8192,
            attn_scale: 0.125,
            activation: crate::model::arch::Activation::Silu,
            qk_norm: false,
            post_norms: false,
            embed_scale: None,
            sliding: None,
        }
    }

    #[test]
    fn the_kv_cache_dominates_long_contexts_and_nothing_overflows() {
        let c = config();
        // 2 (K and V) x 30 layers x 3 heads x 64 x 4 bytes = 46,080 bytes per position.
        let per_position = 46_080u128;
        let small = cache_and_scratch_bytes(&c, 2048, 512, 0, 4);
        let big = cache_and_scratch_bytes(&c, 10_000_000, 512, 0, 4);
        assert_eq!(big - small, per_position * (10_000_000 - 2048));
        assert!(small > per_position * 2048);
        // An f16 cache: half the bytes a position, the scratch unchanged.
        let big16 = cache_and_scratch_bytes(&c, 10_000_000, 512, 0, 2);
        let small16 = cache_and_scratch_bytes(&c, 2048, 512, 0, 2);
        assert_eq!(big16 - small16, per_position / 2 * (10_000_000 - 2048));
        assert_eq!(small - small16, per_position / 2 * 2048);
        // The largest sizes do not wrap around.
        let huge = cache_and_scratch_bytes(&c, usize::MAX, usize::MAX, usize::MAX, 4);
        assert!(huge > u128::from(u64::MAX));
    }

    /// A one-layer synthetic SmolLM2 file (Q4_1 matrices, f32 norms, its head the Q8_0
    /// embedding table): the layer's nine tensors, the final norm, the whole table as the head
    /// and one row of it for the token, counted by hand from the shapes.
    #[test]
    fn a_decode_step_reads_every_matrix_the_head_and_one_embedding_row() {
        use crate::model::synth::{write_synthetic, SynthShape, SynthSpec};
        let dir = std::env::temp_dir().join(format!("onepass-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("one-layer.gguf");
        let spec = SynthSpec {
            shape: SynthShape::SmolLm2,
            quant: crate::dtype::DType::Q4_1.into(),
            seed: 1,
            rope_freqs: false,
            layers: Some(1),
        };
        write_synthetic(&spec, None, &path, &mut |_, _| {}).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let got = decode_weight_bytes(&file);
        std::fs::remove_dir_all(&dir).unwrap();
        // Q4_1 rows: 20 bytes a 32 values (576 wide: 360 bytes, 1536 wide: 960); Q8_0: 34.
        let norms = 3 * 576 * 4;
        let attention = (576 + 192 + 192 + 576) * 360;
        let ffn = 2 * 1536 * 360 + 576 * 960;
        let table = 49_152 * 18 * 34;
        assert_eq!(got, norms + attention + ffn + table + 18 * 34);
    }

    #[test]
    fn a_decode_step_reads_the_rows_each_layer_sees() {
        let c = config();
        // 2 x 3 heads x 64 x 2 bytes = 768 bytes a key a layer, 30 layers.
        assert_eq!(decode_kv_read_bytes(&c, 513, 2), 768 * 30 * 513);
        assert_eq!(decode_kv_read_bytes(&c, 1, 4), 1536 * 30);
        // Five of every six layers see a window of 512 keys (layers 5, 11, .. see them all).
        let gemma = ModelConfig {
            sliding: Some(crate::model::arch::SlidingWindow {
                window: 512,
                period: 6,
                local_rope_base: 10000.0,
            }),
            ..config()
        };
        assert_eq!(decode_kv_read_bytes(&gemma, 300, 2), 768 * 30 * 300);
        assert_eq!(
            decode_kv_read_bytes(&gemma, 4096, 2),
            768 * (25 * 512 + 5 * 4096)
        );
    }

    #[test]
    fn refuses_only_what_does_not_fit_in_known_memory() {
        assert!(check_fits(100, Some(100), 8).is_ok());
        assert!(check_fits(1 << 50, None, 8).is_ok());
        let e = check_fits(3 << 30, Some(1 << 30), 10_000_000)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("10000000 tokens") && e.contains("3.0 GiB") && e.contains("1.0 GiB"),
            "{e}"
        );
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23717220 kB\n";
        assert_eq!(parse_mem_available(text), Some(23_717_220 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }
}
