//! How a [`Transformer`](super::Transformer) is loaded: its context, pass sizes, cache slots and
//! the element type of its KV cache.

use crate::backend::{DType, Device};
use crate::error::{Error, Result};

/// The element type of a model's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCache {
    /// The device's choice ([`Capabilities::kv_cache`](crate::backend::Capabilities::kv_cache):
    /// f32 on the CPU, f16 on CUDA).
    #[default]
    Auto,
    /// f32: every value as the products computed it (the CPU reference).
    F32,
    /// f16: half the memory and half the bytes the attention reads; each value rounded to
    /// nearest once (a relative change of at most 2^-11, which moves the logits slightly).
    F16,
}

impl KvCache {
    /// The element type this choice gives on `device`.
    pub fn dtype(self, device: &Device) -> DType {
        match self {
            KvCache::Auto => device.capabilities().kv_cache,
            KvCache::F32 => DType::F32,
            KvCache::F16 => DType::F16,
        }
    }

    /// Parses `auto`, `f32` or `f16` (the CLI's `--kv-cache`).
    pub fn parse(s: &str) -> Result<KvCache> {
        match s {
            "auto" => Ok(KvCache::Auto),
            "f32" => Ok(KvCache::F32),
            "f16" => Ok(KvCache::F16),
            other => Err(Error::InvalidArgument(format!(
                "KV cache type `{other}`: expected auto, f32 or f16"
            ))),
        }
    }
}

/// What [`Transformer::load_with`](super::Transformer::load_with) allocates besides the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Positions the KV cache holds per sequence.
    pub max_ctx: usize,
    /// Most tokens of one prefill pass.
    pub max_batch: usize,
    /// Sequences the KV cache holds (each its own slot).
    pub slots: usize,
    /// Most rows of a batched decode step (one per slot); 0 for none.
    pub max_rows: usize,
    /// The KV cache's element type.
    pub kv_cache: KvCache,
}

impl LoadOptions {
    /// One sequence of `max_ctx` positions, prefill passes of up to `max_batch` tokens, no
    /// batched decode steps, the device's KV cache type.
    pub fn new(max_ctx: usize, max_batch: usize) -> LoadOptions {
        LoadOptions {
            max_ctx,
            max_batch,
            slots: 1,
            max_rows: 0,
            kv_cache: KvCache::Auto,
        }
    }

    /// These options with the KV cache type `kv_cache`.
    pub fn with_kv_cache(mut self, kv_cache: KvCache) -> LoadOptions {
        self.kv_cache = kv_cache;
        self
    }

    /// These options with `slots` sequences and batched decode steps of up to `max_rows` rows.
    pub fn with_slots(mut self, slots: usize, max_rows: usize) -> LoadOptions {
        self.slots = slots;
        self.max_rows = max_rows;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_type_follows_the_device_unless_told() {
        let cpu = Device::cpu(1).unwrap();
        assert_eq!(KvCache::Auto.dtype(&cpu), DType::F32);
        assert_eq!(KvCache::F16.dtype(&cpu), DType::F16);
        let stand_in = Device::cpu_standing_in_for(crate::backend::BackendKind::Cuda, 1).unwrap();
        assert_eq!(KvCache::Auto.dtype(&stand_in), DType::F16);
        assert_eq!(KvCache::F32.dtype(&stand_in), DType::F32);
    }

    #[test]
    fn parses_the_three_names_and_refuses_others() {
        assert_eq!(KvCache::parse("auto").unwrap(), KvCache::Auto);
        assert_eq!(KvCache::parse("f32").unwrap(), KvCache::F32);
        assert_eq!(KvCache::parse("f16").unwrap(), KvCache::F16);
        let err = KvCache::parse("bf16").unwrap_err().to_string();
        assert!(
            err.contains("bf16") && err.contains("auto, f32 or f16"),
            "{err}"
        );
    }
}
