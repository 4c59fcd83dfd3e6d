//! `BatchEngine` on small synthetic models of every family (CPU): batch invariance (a row's
//! logits alone and beside 3, 7 and 15 other rows with random histories are bitwise equal, and
//! equal to the single-sequence `Engine::decode` over the same history), in direct and graph
//! mode; padding rows never change a live slot; one instantiated graph per bucket; rows drawn
//! on the device give their host samplers' tokens; bad arguments are errors.

mod batch_common;

use std::path::Path;

use batch_common::*;
use onepass::model::arch::Family;
use onepass::model::batch::BatchEngine;
use onepass::model::engine::{Engine, RunMode};
use onepass::model::slots::{Pick, RowOutput, SlotModel, StepRow};
use onepass::model::transformer::{Logits, Transformer};
use onepass::{DType, Device, Executor};

/// The logits `Engine::decode` gives after prefilling `history` (in the same chunks) and feeding
/// `token` at the next position.
fn engine_logits(path: &Path, history: &[u32], token: u32, mode: RunMode) -> Vec<u32> {
    let device = Device::cpu(0).expect("cpu");
    let model = Transformer::load(open(path), &device, CTX, CHUNK).expect("load");
    let mut engine = Engine::new(model, Executor::new(device), mode);
    engine.prefill(history, Logits::Last).expect("prefill");
    assert_eq!(
        engine.decode(token, history.len(), false).expect("decode"),
        None
    );
    engine
        .logits(1)
        .expect("logits")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn invariance(family: Family, quant: DType, mode: RunMode) {
    let path = write_model(family, quant);
    let mut engine = batch_engine(&path, SLOTS, SLOTS, mode);
    let hist = histories(SLOTS, 0x5eed + family as u64);
    fill(&mut engine, &hist);
    let what = format!("{family:?} {quant} {mode:?}");
    // Slot 5 alone, then beside 3, 7 and 15 others, at different places in the batch.
    let target = 5;
    let alone = logits_of(
        engine
            .decode(&[row(target, &hist, false)])
            .expect("decode")
            .remove(0),
    );
    let want = engine_logits(&path, &hist[target], row(target, &hist, false).token, mode);
    assert_eq!(alone, want, "{what}: alone vs Engine::decode");
    let others: Vec<usize> = (0..SLOTS).filter(|&s| s != target).collect();
    for (count, at) in [(3usize, 0usize), (7, 7), (15, 4), (15, 15)] {
        let mut rows: Vec<StepRow> = others[..count]
            .iter()
            .map(|&s| row(s, &hist, s % 3 == 0))
            .collect();
        rows.insert(at, row(target, &hist, false));
        let mut outs = engine.decode(&rows).expect("decode");
        assert_eq!(outs.len(), rows.len());
        let got = logits_of(outs.remove(at));
        assert_eq!(got, alone, "{what}: beside {count} others at index {at}");
    }
    if mode == RunMode::Graph {
        // Buckets 1, 4, 8 and 16, each instantiated once.
        assert_eq!(engine.instantiations(), 4, "{what}");
    }
}

#[test]
fn llama_rows_are_batch_invariant_and_equal_engine_decode() {
    for mode in [RunMode::Direct, RunMode::Recorded, RunMode::Graph] {
        invariance(Family::Llama, DType::Q4_1, mode);
    }
}

#[test]
fn gemma3_rows_are_batch_invariant_and_equal_engine_decode() {
    for mode in [RunMode::Direct, RunMode::Graph] {
        invariance(Family::Gemma3, DType::Q8_0, mode);
    }
}

#[test]
fn qwen3_rows_are_batch_invariant_and_equal_engine_decode() {
    invariance(Family::Qwen3, DType::Q4K, RunMode::Graph);
}

#[test]
fn greedy_rows_give_the_argmax_of_their_logits() {
    let path = write_model(Family::Gemma3, DType::Q8_0);
    let mut engine = batch_engine(&path, 8, 8, RunMode::Graph);
    let hist = histories(8, 31);
    fill(&mut engine, &hist);
    let slots = [6usize, 1, 4, 0, 7];
    // The same step twice (each row writes the same K and V again): sampled, then greedy.
    let step = |engine: &mut BatchEngine, greedy: bool| {
        let rows: Vec<StepRow> = slots.iter().map(|&s| row(s, &hist, greedy)).collect();
        engine.decode(&rows).expect("decode")
    };
    let sampled = step(&mut engine, false);
    let greedy = step(&mut engine, true);
    for (r, (l, t)) in sampled.into_iter().zip(greedy).enumerate() {
        let (RowOutput::Logits(l), RowOutput::Token(t)) = (l, t) else {
            panic!("row {r}: sampled rows give logits, greedy rows tokens");
        };
        assert_eq!(l.len(), VOCAB);
        let best = l
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > l[b] { i } else { b });
        assert_eq!(t as usize, best, "row {r}");
    }
}

/// Every layer's K and V cache of `slot`, as bits.
fn slot_cache(engine: &BatchEngine, slot: usize) -> Vec<Vec<u32>> {
    let model = engine.model();
    let device = model.device();
    model
        .slot_kv(slot)
        .expect("slot views")
        .iter()
        .flat_map(|(k, v)| [k, v])
        .map(|b| {
            let values: Vec<f32> = device.download(b).expect("download");
            values.iter().map(|v| v.to_bits()).collect()
        })
        .collect()
}

#[test]
fn padding_rows_never_change_a_live_slot() {
    let path = write_model(Family::Llama, DType::Q8_0);
    for mode in [RunMode::Direct, RunMode::Graph] {
        let slots = 6;
        let mut engine = batch_engine(&path, slots, 8, mode);
        assert_eq!(engine.model().padding_slot(), slots);
        let hist = histories(slots, 99);
        fill(&mut engine, &hist);
        // Three rows (bucket 4, one padding row), then five (bucket 8, three padding rows).
        for live in [&[4usize, 0, 2][..], &[1, 3, 5, 0, 2]] {
            let before: Vec<_> = (0..slots).map(|s| slot_cache(&engine, s)).collect();
            let rows: Vec<StepRow> = live.iter().map(|&s| row(s, &hist, true)).collect();
            let outs = engine.decode(&rows).expect("decode");
            assert_eq!(outs.len(), live.len());
            assert!(outs.iter().all(|o| matches!(o, RowOutput::Token(_))));
            let ctx = CTX;
            for (s, was) in before.iter().enumerate() {
                let now = slot_cache(&engine, s);
                let written = live.contains(&s).then(|| hist[s].len());
                for (layer, (a, b)) in was.iter().zip(&now).enumerate() {
                    for (i, (x, y)) in a.iter().zip(b).enumerate() {
                        // Layout [n_kv_head, ctx, head_dim]: position (i / 32) % ctx.
                        let pos = (i / 32) % ctx;
                        if Some(pos) != written {
                            assert_eq!(
                                x, y,
                                "{mode:?}: slot {s}, cache {layer}, value {i} changed"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rows_drawn_on_the_device_give_their_host_samplers_tokens() {
    for mode in [RunMode::Direct, RunMode::Graph] {
        drawn_rows(Device::cpu(0).expect("cpu"), mode);
    }
}

#[test]
fn a_prompt_fed_as_rows_of_one_step_equals_one_token_per_step() {
    for mode in [RunMode::Direct, RunMode::Graph] {
        prompt_rows(Device::cpu(0).expect("cpu"), mode);
    }
}

#[test]
fn bad_arguments_are_errors() {
    let path = write_model(Family::Llama, DType::Q8_0);
    let mut engine = batch_engine(&path, 3, 2, RunMode::Direct);
    assert_eq!(
        (
            engine.slots(),
            engine.slot_ctx(),
            engine.max_rows(),
            engine.vocab()
        ),
        (3, CTX, 2, VOCAB)
    );
    assert_eq!(engine.max_chunk(), CHUNK);
    let ok = StepRow {
        slot: 0,
        token: 5,
        pos: 0,
        pick: Pick::Greedy,
    };
    let err = |r: onepass::Result<Vec<RowOutput>>, needle: &str| {
        let e = r.expect_err(needle).to_string();
        assert!(e.contains(needle), "{e:?} should say {needle:?}");
    };
    err(
        engine.decode(&[StepRow {
            slot: 3,
            ..ok.clone()
        }]),
        "slot 3",
    );
    err(
        engine.decode(&[StepRow {
            pos: CTX,
            ..ok.clone()
        }]),
        "position 48",
    );
    err(
        engine.decode(&[
            ok.clone(),
            StepRow {
                token: 6,
                ..ok.clone()
            },
        ]),
        "slot 0 already has a row at position 0",
    );
    err(
        engine.decode(&[
            ok.clone(),
            StepRow {
                slot: 1,
                ..ok.clone()
            },
            StepRow {
                slot: 2,
                ..ok.clone()
            },
        ]),
        "1 to 2 rows",
    );
    err(engine.decode(&[]), "1 to 2 rows");
    err(
        engine.decode(&[StepRow {
            token: 300,
            ..ok.clone()
        }]),
        "token id 300",
    );
    // A device draw with the penalty on needs the penalty's window.
    let penalized = onepass::sampler::SamplerConfig {
        temperature: 0.8,
        repetition_penalty: 1.3,
        ..Default::default()
    };
    let state = onepass::sampler::device::DrawState::new(&penalized, 1, 1).expect("a draw state");
    let pick = Pick::Draw(onepass::model::slots::RowDraw {
        state,
        window: Vec::new(),
    });
    err(
        engine.decode(&[StepRow { pick, ..ok.clone() }]),
        "penalizes repetition",
    );
    let perr = |r: onepass::Result<Vec<f32>>, needle: &str| {
        let e = r.expect_err(needle).to_string();
        assert!(e.contains(needle), "{e:?} should say {needle:?}");
    };
    perr(engine.prefill(3, &[1, 2], 0), "slot 3");
    perr(engine.prefill(0, &[], 0), "1 to 8 tokens");
    perr(engine.prefill(0, &[1; 9], 0), "1 to 8 tokens");
    perr(engine.prefill(0, &[1, 2], CTX - 1), "context overflow");
    perr(engine.prefill(0, &[1, 300], 0), "token id 300");
    // Nothing above broke the engine.
    assert_eq!(engine.prefill(0, &[1, 2], 0).expect("prefill").len(), VOCAB);
    assert_eq!(
        engine
            .decode(&[StepRow {
                pos: 2,
                ..ok.clone()
            }])
            .expect("decode")
            .len(),
        1
    );
    // The memory check counts every slot: a million slots of this small model are refused
    // before anything is allocated.
    let device = Device::cpu(0).expect("cpu");
    let e = Transformer::load_slots(open(&path), &device, CTX, CHUNK, 1 << 20, 8)
        .err()
        .expect("a cache larger than the machine")
        .to_string();
    assert!(e.contains("available"), "{e}");
    // A model without batched steps is refused.
    let device = Device::cpu(0).expect("cpu");
    let single = Transformer::load(open(&path), &device, CTX, CHUNK).expect("load");
    assert!(BatchEngine::new(single, Executor::new(device), RunMode::Direct).is_err());
}

/// A server moves the engine to its model thread: it must stay `Send` (checked at compile time).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<BatchEngine>();
};
