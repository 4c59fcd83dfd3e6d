//! What the batched-decode tests share: small synthetic models of every family, random slot
//! histories, and the rows of a step.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use onepass::model::arch::Family;
use onepass::model::batch::BatchEngine;
use onepass::model::engine::RunMode;
use onepass::model::gguf::GgufFile;
use onepass::model::slots::{Pick, RowOutput, SlotModel, StepRow};
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
        pick: if greedy { Pick::Greedy } else { Pick::Logits },
    }
}

pub fn logits_of(out: RowOutput) -> Vec<u32> {
    match out {
        RowOutput::Logits(l) => l.iter().map(|v| v.to_bits()).collect(),
        RowOutput::Token(t) => panic!("a sampled row gave token {t}"),
        RowOutput::Drawn { token, .. } => panic!("a row for the host's sampler drew token {token}"),
    }
}

/// A prompt fed as several rows of one step (its tokens at consecutive positions of one slot,
/// beside other sequences' rows) gives the bits of feeding it one token per step alone: each row
/// attends over the rows before it, and nothing depends on the rows beside it.
pub fn prompt_rows(device: Device, mode: RunMode) {
    let path = write_model(Family::Llama, DType::Q4_1);
    let hist = histories(SLOTS, 0xfeed);
    let (slot, prompt): (usize, Vec<u32>) = (3, vec![11, 250, 7, 42, 99, 5]);
    let prompt_row = |p: usize| StepRow {
        slot,
        token: prompt[p],
        pos: p,
        pick: Pick::Logits,
    };
    // One token per step, alone.
    let mut one = batch_engine_on(device.clone(), &path, SLOTS, SLOTS, mode);
    let mut want = Vec::new();
    for p in 0..prompt.len() {
        want.push(logits_of(
            one.decode(&[prompt_row(p)]).expect("decode").remove(0),
        ));
    }
    // The first four tokens in one step beside four other sequences, the last two in the next.
    let mut mixed = batch_engine_on(device, &path, SLOTS, SLOTS, mode);
    fill(&mut mixed, &hist);
    let others: Vec<StepRow> = [0usize, 6, 9, 14]
        .iter()
        .map(|&s| row(s, &hist, s % 2 == 0))
        .collect();
    let mut rows = vec![
        others[0].clone(),
        prompt_row(0),
        prompt_row(1),
        others[1].clone(),
    ];
    rows.extend([
        prompt_row(2),
        others[2].clone(),
        prompt_row(3),
        others[3].clone(),
    ]);
    let mut got = Vec::new();
    for (i, out) in mixed.decode(&rows).expect("decode").into_iter().enumerate() {
        if rows[i].slot == slot {
            got.push(logits_of(out));
        }
    }
    for out in mixed
        .decode(&[prompt_row(4), prompt_row(5)])
        .expect("decode")
    {
        got.push(logits_of(out));
    }
    assert_eq!(got.len(), want.len());
    for (p, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{mode:?}: prompt token {p}");
    }
}

/// Rows drawn on the device give the tokens, and leave the generators where, their sequences'
/// host samplers draw from the same rows' logits, step after step, beside greedy rows: each step
/// runs once with every row giving its logits, then again at the same positions (the same
/// logits: a row's bits depend only on its slot) with the sampled rows drawing.
pub fn drawn_rows(device: Device, mode: RunMode) {
    use onepass::model::slots::RowDraw;
    use onepass::sampler::device::DrawState;
    use onepass::sampler::{Sampler, SamplerConfig};
    let path = write_model(Family::Llama, DType::Q4_1);
    let mut hist = histories(SLOTS, 0xd4a3);
    let mut engine = batch_engine_on(device, &path, SLOTS, SLOTS, mode);
    fill(&mut engine, &hist);
    let config = |slot: usize| SamplerConfig {
        temperature: [0.0, 0.8, 1.3, 2.0][slot % 4],
        top_k: [0, 0, 20, 0][slot % 4],
        top_p: [1.0, 0.95, 1.0, 0.9][slot % 4],
        min_p: [0.0, 0.0, 0.02, 0.0][slot % 4],
        repetition_penalty: [1.0, 1.0, 1.3, 0.9][slot % 4],
        penalty_window: 16,
        seed: slot as u64,
    };
    let mut samplers: Vec<Sampler> = (0..SLOTS)
        .map(|s| Sampler::new(config(s)).expect("sampler"))
        .collect();
    let mut tokens: Vec<u32> = (0..SLOTS).map(|s| row(s, &hist, true).token).collect();
    let mut drawn = 0;
    for step in 0..4 {
        let rows_with = |pick: &dyn Fn(usize, &[u32]) -> Pick| -> Vec<StepRow> {
            (0..SLOTS)
                .map(|slot| {
                    let fed = [hist[slot].as_slice(), &[tokens[slot]]].concat();
                    StepRow {
                        slot,
                        token: tokens[slot],
                        pos: hist[slot].len(),
                        pick: pick(slot, &fed),
                    }
                })
                .collect()
        };
        let logits = engine
            .decode(&rows_with(&|_, _| Pick::Logits))
            .expect("a step for the host");
        let picks = |slot: usize, fed: &[u32]| {
            let s = &samplers[slot];
            if s.config().temperature == 0.0 {
                return Pick::Greedy;
            }
            let state = DrawState::new(s.config(), s.state(), fed.len()).expect("a draw state");
            Pick::Draw(RowDraw::new(state, fed))
        };
        let outputs = engine.decode(&rows_with(&picks)).expect("a drawing step");
        for (slot, (out, host_out)) in outputs.into_iter().zip(logits).enumerate() {
            let RowOutput::Logits(row_logits) = host_out else {
                panic!("slot {slot} gave no logits");
            };
            hist[slot].push(tokens[slot]);
            let mut host = samplers[slot].clone();
            let want = host.sample(&row_logits, &hist[slot]).expect("a host draw");
            tokens[slot] = match out {
                RowOutput::Drawn { token, rng } => {
                    assert_eq!(
                        rng,
                        host.state(),
                        "{mode:?} step {step} slot {slot}: generator"
                    );
                    drawn += 1;
                    token
                }
                RowOutput::Token(t) => t,
                RowOutput::Logits(_) => panic!("slot {slot} was not drawn"),
            };
            assert_eq!(tokens[slot], want, "{mode:?} step {step} slot {slot}");
            samplers[slot] = host;
        }
    }
    assert_eq!(
        drawn,
        4 * SLOTS * 3 / 4,
        "{mode:?}: every sampled row drew on the device"
    );
}
