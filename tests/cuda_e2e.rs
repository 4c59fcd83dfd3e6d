//! End to end on CUDA: synthetic models (random weights, written through `onepass::model::synth`)
//! decoded greedily for 64 steps on the CUDA backend and on the CPU backend: the SmolLM2 shape in
//! Q4_1 after an 8-token prompt, and the Gemma 3 270M shape in the Q4_K_M mix of the real file
//! (Q5_0, Q8_0, Q4_K, Q6_K) after a 600-token prompt, past its 512-token sliding window. The
//! tokens must agree step for step, and the last position's logits within a stated tolerance. A divergence reports the step and the CPU's top-2 logit gap there (a tiny gap means
//! a near-tie that rounding may flip; a large one a real bug). Needs a GPU: ignored by default, it
//! fails where there is none.

mod cuda_open;

use std::path::PathBuf;
use std::sync::Arc;

use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::synth::{write_synthetic, MatrixFormats, SynthShape, SynthSpec};
use onepass::model::transformer::{Logits, Transformer};
use onepass::{DType, Device, Executor};

const STEPS: usize = 64;

/// Logits tolerance, CUDA against the CPU: `|cuda - cpu| <= ATOL + RTOL * max |cpu|`. Both sum in
/// f32 in different orders through 30 layers; the logits are O(10).
const ATOL: f32 = 2e-3;
const RTOL: f32 = 2e-3;

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |b, (i, x)| if *x > v[b] { i } else { b })
}

/// The gap between the largest and the second largest value.
fn top2_gap(v: &[f32]) -> f32 {
    let best = argmax(v);
    let second = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .map(|(_, x)| *x)
        .fold(f32::NEG_INFINITY, f32::max);
    v[best] - second
}

/// Prefill, then `STEPS` greedy steps: the tokens and every step's logits.
fn greedy(
    file: &Arc<GgufFile>,
    prompt: &[u32],
    device: Device,
    mode: RunMode,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let ctx = prompt.len() + STEPS + 1;
    let model = Transformer::load(file.clone(), &device, ctx, 256).expect("load");
    let mut engine = Engine::new(model, Executor::new(device), mode);
    engine.prefill(prompt, Logits::Last).expect("prefill");
    let first = engine.logits(1).expect("logits");
    let mut token = argmax(&first) as u32;
    let (mut tokens, mut logits) = (vec![token], vec![first]);
    for i in 0..STEPS - 1 {
        token = engine
            .decode(token, prompt.len() + i, true)
            .expect("decode")
            .expect("greedy token");
        tokens.push(token);
        logits.push(engine.logits(1).expect("logits"));
    }
    (tokens, logits)
}

fn temp_model(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onepass-cuda-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// A prompt of `n` pseudo-random token ids below `vocab`.
fn prompt(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % u64::from(vocab)) as u32)
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_greedy_matches_cpu_for_64_steps_smollm2_shape() {
    check(
        SynthShape::SmolLm2,
        DType::Q4_1.into(),
        8,
        "smollm2-q4_1.gguf",
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_greedy_matches_cpu_for_64_steps_gemma3_shape_past_its_window() {
    check(
        SynthShape::Gemma3_270m,
        MatrixFormats::Q4KM,
        600,
        "gemma3-q4_k_m.gguf",
    );
}

fn check(shape: SynthShape, quant: MatrixFormats, prompt_len: usize, name: &str) {
    cuda_open::require_gpu();
    let path = temp_model(name);
    let spec = SynthSpec {
        shape,
        quant,
        seed: 0,
    };
    write_synthetic(&spec, None, &path, &mut |_, _| {}).expect("synth");
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let prompt = prompt(prompt_len, shape.params().vocab as u32);
    let cuda = Device::cuda(0).expect("a CUDA device is present, opening it must work");
    let cpu = Device::cpu(0).expect("cpu");
    let (cpu_tokens, cpu_logits) = greedy(&file, &prompt, cpu, RunMode::Direct);
    for mode in [RunMode::Direct, RunMode::Graph] {
        let (tokens, logits) = greedy(&file, &prompt, cuda.clone(), mode);
        eprintln!("{mode:?}: cuda {tokens:?}\n        cpu  {cpu_tokens:?}");
        if let Some(step) = (0..STEPS).find(|&i| tokens[i] != cpu_tokens[i]) {
            panic!(
                "{mode:?}: CUDA diverges from the CPU at step {step}: token {} vs {}; the CPU's \
                 top-2 logit gap there is {:.3e}, CUDA's {:.3e}",
                tokens[step],
                cpu_tokens[step],
                top2_gap(&cpu_logits[step]),
                top2_gap(&logits[step])
            );
        }
        let min_gap = cpu_logits
            .iter()
            .map(|l| top2_gap(l))
            .fold(f32::INFINITY, f32::min);
        let (got, want) = (&logits[STEPS - 1], &cpu_logits[STEPS - 1]);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{name} {mode:?}: {STEPS} tokens agree; smallest CPU top-2 gap {min_gap:.3e}; last logits: max \
             |cuda - cpu| {worst:.3e}, max |cpu| {scale:.3}"
        );
        assert!(
            worst <= ATOL + RTOL * scale,
            "{mode:?}: last-position logits differ by {worst:.3e} (> {ATOL} + {RTOL} x {scale})"
        );
    }
    let _ = std::fs::remove_file(&path);
}
