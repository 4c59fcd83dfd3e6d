//! The batched `SlotModel` against `Engine::generate` on the CPU with the real SmolLM2-135M:
//! greedy tokens of sequences prefilled in chunks into their slots and decoded in batched steps
//! beside each other (in buckets of 1, 2 and 4 rows, sequences joining at different steps) equal
//! `generate` with the default greedy sampler, token for token.

use std::path::PathBuf;
use std::sync::Arc;

use onepass::model::batch::BatchEngine;
use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::sampler::{Sampler, SamplerConfig};
use onepass::model::slots::{Pick, RowOutput, SlotModel, StepRow};
use onepass::model::tokenizer::Tokenizer;
use onepass::model::transformer::Transformer;
use onepass::{Device, Executor};

/// Prompt chunk length (of both engines), shorter than the prompts so prefill takes chunks.
const CHUNK: usize = 8;
/// Context of a slot.
const CTX: usize = 96;
/// Tokens generated per prompt.
const NEW: usize = 10;

fn model_file() -> Arc<GgufFile> {
    let cache = std::env::var_os("ONEPASS_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dirs::cache_dir().expect("cache dir").join("onepass"));
    let path = onepass::model::fetch::resolve_model("smollm2", &cache, false).expect("model");
    Arc::new(GgufFile::open(&path).expect("open model"))
}

fn prompts(file: &GgufFile) -> Vec<Vec<u32>> {
    let tokenizer = Tokenizer::from_gguf(file).expect("tokenizer");
    [
        "The capital of France is",
        "Water boils at a temperature of one hundred degrees when",
        "def fibonacci(n):\n    if n < 2:",
        "Once upon a time, in a small village by the sea, there lived",
    ]
    .iter()
    .map(|p| tokenizer.encode(p, false).expect("encode"))
    .collect()
}

/// What `Engine::generate` gives for each prompt (greedy, no stop token).
fn generated(file: &Arc<GgufFile>, prompts: &[Vec<u32>], mode: RunMode) -> Vec<Vec<u32>> {
    let device = Device::cpu(0).expect("cpu");
    let model = Transformer::load(file.clone(), &device, CTX, CHUNK).expect("load");
    let mut engine = Engine::new(model, Executor::new(device), mode);
    prompts
        .iter()
        .map(|p| {
            engine
                .generate(p, NEW, &SamplerConfig::default(), &[], |_| Ok(()))
                .expect("generate")
                .generated_ids
        })
        .collect()
}

/// The same through a `BatchEngine`: sequence `i` is prefilled (in chunks of `CHUNK`) after
/// `i` decode steps of the others, so steps run 1, 2, 3 and 4 rows; its first token comes from
/// its prefill logits with the default greedy sampler, as `generate` takes it.
fn batched(file: &Arc<GgufFile>, prompts: &[Vec<u32>], mode: RunMode) -> Vec<Vec<u32>> {
    let device = Device::cpu(0).expect("cpu");
    let model = Transformer::load_slots(file.clone(), &device, CTX, CHUNK, 6, 4).expect("load");
    let mut engine = BatchEngine::new(model, Executor::new(device), mode).expect("engine");
    // Slots out of order, so a row's slot is not its index.
    let slot_of = [3, 0, 5, 1];
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    while out.iter().any(|o| o.len() < NEW) {
        if step < prompts.len() {
            let p = &prompts[step];
            let mut logits = Vec::new();
            for (c, chunk) in p.chunks(CHUNK).enumerate() {
                logits = engine
                    .prefill(slot_of[step], chunk, c * CHUNK)
                    .expect("prefill");
            }
            let mut greedy = Sampler::new(SamplerConfig::default()).expect("sampler");
            out[step].push(greedy.sample(&logits, p).expect("sample"));
        }
        let live: Vec<usize> = (0..prompts.len().min(step + 1))
            .filter(|&i| !out[i].is_empty() && out[i].len() < NEW)
            .collect();
        if !live.is_empty() {
            let rows: Vec<StepRow> = live
                .iter()
                .map(|&i| StepRow {
                    slot: slot_of[i],
                    token: *out[i].last().expect("a token"),
                    pos: prompts[i].len() + out[i].len() - 1,
                    pick: Pick::Greedy,
                })
                .collect();
            let outputs = engine.decode(&rows).expect("decode");
            for (&i, o) in live.iter().zip(outputs) {
                match o {
                    RowOutput::Token(t) => out[i].push(t),
                    other => panic!("a greedy row gave {other:?}"),
                }
            }
        }
        step += 1;
    }
    out
}

#[test]
fn batched_greedy_tokens_equal_generate_in_graph_mode() {
    let file = model_file();
    let prompts = prompts(&file);
    assert!(
        prompts.iter().any(|p| p.len() > CHUNK),
        "a prompt longer than a chunk"
    );
    let want = generated(&file, &prompts, RunMode::Graph);
    let got = batched(&file, &prompts, RunMode::Graph);
    assert_eq!(got, want);
}

#[test]
fn batched_greedy_tokens_equal_generate_in_direct_mode() {
    let file = model_file();
    let prompts = prompts(&file);
    let want = generated(&file, &prompts, RunMode::Direct);
    let got = batched(&file, &prompts, RunMode::Direct);
    assert_eq!(got, want);
}
