//! What the batched-decode tests share: small synthetic models of every family, random slot
//! histories, and the rows of a step.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use onepass::model::arch::Family;
use onepass::model::batch::BatchEngine;
use onepass::model::engine::RunMode;
use onepass::model::gguf::GgufFile;
use onepass::model::slots::{RowOutput, SlotModel, StepRow};
use onepass::model::synth::{write_synthetic_shape, ShapeParams};
use onepass::model::transformer::Transformer;
use onepass::{DType, Device, Executor};

/// Positions per slot.
pub const CTX: usize = 48;
/// Prefill chunk (of both engines).
pub const CHUNK: usize = 8;
/// Slots of the invariance tests (and rows of their largest bucket).
pub const SLOTS: usize = 16;
/// Vocabulary of the small models.
pub const VOCAB: usize = 300;

/// A small model of `family`, as `tests/families.rs` makes them (Gemma 3 with a window of 5, so
/// histories run past it).
pub fn write_model(family: Family, quant: DType) -> PathBuf {
    let p = ShapeParams {
        name: "tiny",
        family,
        n_layer: 6,
        dim: 64,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
        ffn_dim: 96,
        vocab: VOCAB,
        rope_base: 1000.0,
        ctx: 256,
        tied: family != Family::Llama,
        window: (family == Family::Gemma3).then_some(5),
    };
    let dir = std::env::temp_dir().join(format!("onepass-batch-models-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{quant}.gguf", family.architecture()));
    write_synthetic_shape(&p, quant.into(), 11, None, &path, &mut |_, _| {}).expect("write");
    path
}

pub fn open(path: &Path) -> Arc<GgufFile> {
    Arc::new(GgufFile::open(path).expect("open"))
}

pub fn batch_engine(path: &Path, slots: usize, max_rows: usize, mode: RunMode) -> BatchEngine {
    batch_engine_on(Device::cpu(0).expect("cpu"), path, slots, max_rows, mode)
}

/// [`batch_engine`] on `device`.
pub fn batch_engine_on(
    device: Device,
    path: &Path,
    slots: usize,
    max_rows: usize,
    mode: RunMode,
) -> BatchEngine {
    let model = Transformer::load_slots(open(path), &device, CTX, CHUNK, slots, max_rows)
        .expect("load slots");
    BatchEngine::new(model, Executor::new(device), mode).expect("batch engine")
}

/// Seeded pseudo-random values (xorshift).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Random histories of 1 to 40 tokens for `slots` slots.
pub fn histories(slots: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng(seed);
    (0..slots)
        .map(|_| {
            let len = 1 + rng.below(40);
            (0..len).map(|_| rng.below(VOCAB) as u32).collect()
        })
        .collect()
}

/// Prefills every slot with its history, in chunks.
pub fn fill(engine: &mut BatchEngine, hist: &[Vec<u32>]) {
    for (slot, h) in hist.iter().enumerate() {
        for (c, chunk) in h.chunks(CHUNK).enumerate() {
            engine.prefill(slot, chunk, c * CHUNK).expect("prefill");
        }
    }
}

/// The decode row of `slot`: its next token (a function of the slot) at the end of its history.
pub fn row(slot: usize, hist: &[Vec<u32>], greedy: bool) -> StepRow {
    StepRow {
        slot,
        token: (7 * slot as u32 + 3) % VOCAB as u32,
        pos: hist[slot].len(),
        greedy,
    }
}

pub fn logits_of(out: RowOutput) -> Vec<u32> {
    match out {
        RowOutput::Logits(l) => l.iter().map(|v| v.to_bits()).collect(),
        RowOutput::Token(t) => panic!("a sampled row gave token {t}"),
    }
}
