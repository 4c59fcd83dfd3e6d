//! Every model family through the one transformer skeleton on the CPU, against the float64
//! reference pass of `forward_f64` (written from the families' definitions): small synthetic
//! models of each family (random norm weights, a query width unlike the hidden size, a sliding
//! window shorter than the prompt for Gemma 3), and the Qwen3-0.6B shape as `synth --like` writes
//! it.
//!
//! Tolerance: the CPU computes in f32 from the same dequantized weights, so the logits differ
//! from the f64 pass by f32 rounding through a few layers: at most 2e-4 of the largest |logit|
//! (measured: about 1e-5). A wrong norm, RoPE layout, window or scale moves them by far more
//! (checked by `a_wrong_family_choice_is_caught`).

mod forward_f64;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use onepass::model::arch::{Family, ModelConfig};
use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::synth::{write_synthetic_shape, ShapeParams, SynthShape};
use onepass::model::transformer::{Logits, Transformer};
use onepass::{DType, Device, Executor};

const REL_TOL: f64 = 2e-4;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onepass-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A small model of `family`: 6 layers (so Gemma 3's sixth is its global layer), hidden 64,
/// 4 query heads and 2 KV heads of 32 (queries 128 wide), FFN 96, 300 tokens.
fn tiny(family: Family) -> ShapeParams {
    ShapeParams {
        name: "tiny",
        family,
        n_layer: 6,
        dim: 64,
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
        ffn_dim: 96,
        vocab: 300,
        rope_base: 1000.0,
        ctx: 256,
        tied: family != Family::Llama,
        window: (family == Family::Gemma3).then_some(5),
    }
}

fn write(p: &ShapeParams, quant: DType, name: &str) -> PathBuf {
    let path = scratch(name);
    write_synthetic_shape(p, quant.into(), 7, None, &path, &mut |_, _| {}).expect("write model");
    path
}

/// The CPU logits of every position of `tokens` (one prefill pass from position 0).
fn cpu_logits(path: &Path, tokens: &[u32], logits: Logits) -> Vec<f32> {
    let device = Device::cpu(0).unwrap();
    let file = Arc::new(GgufFile::open(path).unwrap());
    let model = Transformer::load(file, &device, 64, 64).unwrap();
    let mut e = Engine::new(model, Executor::new(device), RunMode::Graph);
    e.prefill(tokens, logits).unwrap();
    let rows = if logits == Logits::All {
        tokens.len()
    } else {
        1
    };
    e.logits(rows).unwrap()
}

fn prompt(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab).collect()
}

fn check_family(family: Family) {
    let p = tiny(family);
    let path = write(&p, DType::Q8_0, &format!("tiny-{family:?}.gguf"));
    let file = GgufFile::open(&path).unwrap();
    let reference = forward_f64::Reference::new(&file);
    assert_eq!(reference.cfg.family, family);
    // 12 positions: past Gemma's window of 5.
    let tokens = prompt(12, p.vocab as u32);
    let want = reference.logits(&tokens);
    let got = cpu_logits(&path, &tokens, Logits::All);
    for (row, w) in want.iter().enumerate() {
        let g = &got[row * p.vocab..(row + 1) * p.vocab];
        let (diff, scale) = forward_f64::max_diff(g, w);
        assert!(scale > 0.1, "{family:?}: row {row} logits are all near 0");
        assert!(
            diff <= REL_TOL * scale,
            "{family:?} row {row}: max |cpu - f64| {diff:e}, largest |logit| {scale}"
        );
    }
}

#[test]
fn llama_matches_the_f64_reference() {
    check_family(Family::Llama);
}

#[test]
fn qwen3_matches_the_f64_reference() {
    check_family(Family::Qwen3);
}

#[test]
fn gemma3_matches_the_f64_reference() {
    check_family(Family::Gemma3);
}

/// The reference tells the families apart: a Qwen 3 file read as Llama (no q/k norms, the other
/// RoPE layout) gives logits far outside the tolerance.
#[test]
fn a_wrong_family_choice_is_caught() {
    let p = tiny(Family::Qwen3);
    let path = write(&p, DType::Q8_0, "tiny-wrong.gguf");
    let file = GgufFile::open(&path).unwrap();
    let mut reference = forward_f64::Reference::new(&file);
    let tokens = prompt(8, p.vocab as u32);
    let got = cpu_logits(&path, &tokens, Logits::Last);
    reference.cfg = ModelConfig {
        rope_mode: onepass::ops::rope::RopeMode::Normal,
        ..reference.cfg.clone()
    };
    let want = reference.logits(&tokens);
    let (diff, scale) = forward_f64::max_diff(&got, want.last().unwrap());
    assert!(
        diff > 100.0 * REL_TOL * scale,
        "the RoPE layout changed the logits by only {diff:e} (largest {scale})"
    );
}

/// `synth --like qwen3-0.6b` end to end: the real shape (28 layers, 16/8 heads of 128, tied head
/// of 151936 rows) in Q8_0, the last position's logits of a short prompt.
#[test]
fn qwen3_0_6b_shape_matches_the_f64_reference() {
    let p = SynthShape::Qwen3_0_6b.params();
    let path = write(&p, DType::Q8_0, "qwen3-0.6b.gguf");
    let file = GgufFile::open(&path).unwrap();
    let reference = forward_f64::Reference::new(&file);
    let tokens = prompt(4, p.vocab as u32);
    let want = reference.logits(&tokens);
    let got = cpu_logits(&path, &tokens, Logits::Last);
    let (diff, scale) = forward_f64::max_diff(&got, want.last().unwrap());
    assert!(scale > 0.1, "logits are all near 0");
    assert!(
        diff <= REL_TOL * scale,
        "max |cpu - f64| {diff:e}, largest |logit| {scale}"
    );
    std::fs::remove_file(&path).unwrap();
}
