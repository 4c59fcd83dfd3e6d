//! The instantiated decode step (graph mode) against recorded and direct mode, and graph mode's
//! pipelined greedy decode against its one-step-at-a-time decode: the same tokens and
//! bitwise the same logits over 64 greedy steps (against direct mode within f32 rounding where the
//! backend's fused kernels are not bit-exact), with the KV length crossing a split-attention chunk, on the
//! CPU (a small Llama written here) and on CUDA (a synthetic SmolLM2-shaped Q4_1 model; ignored by
//! default, it fails where there is no GPU). The graph must be instantiated exactly once for all
//! the steps.

mod cuda_open;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::gguf_write::GgufWriter;
use onepass::model::sampler::SamplerConfig;
use onepass::model::transformer::{Logits, Transformer};
use onepass::{DType, Device, Executor};

const STEPS: usize = 64;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("onepass-replay-{}-{name}", std::process::id()))
}

/// Seeded values uniform in `±scale` (never all zeros).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A two-layer Llama (hidden 64, 4 query / 2 KV heads of 16, FFN 128, vocabulary 256) with Q4_1
/// matrices and a Q8_0 embedding, as the default model stores them.
fn write_small_llama(path: &Path) {
    write_llama(path, false)
}

/// The small Llama; with `nan_norm` its output norm's weight is NaN, so every logit is NaN.
fn write_llama(path: &Path, nan_norm: bool) {
    let (layers, dim, heads, kv_heads, ffn, vocab) =
        (2usize, 64usize, 4usize, 2usize, 128usize, 256usize);
    let hd = dim / heads;
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama").unwrap();
    w.add_u32("llama.context_length", 1024).unwrap();
    w.add_u32("llama.embedding_length", dim as u32).unwrap();
    w.add_u32("llama.block_count", layers as u32).unwrap();
    w.add_u32("llama.feed_forward_length", ffn as u32).unwrap();
    w.add_u32("llama.attention.head_count", heads as u32)
        .unwrap();
    w.add_u32("llama.attention.head_count_kv", kv_heads as u32)
        .unwrap();
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .unwrap();
    w.add_f32("llama.rope.freq_base", 10000.0).unwrap();
    let mut seed = 1u64;
    let mut matrix =
        |w: &mut GgufWriter<'_>, name: &str, rows: usize, cols: usize, dtype: DType| {
            seed += 1;
            let v = values(seed, rows * cols, (3.0 / cols as f32).sqrt() * 2.0);
            let bytes = onepass::quant::quantize(dtype, &v).unwrap();
            w.add_tensor(name, &[rows, cols], dtype, bytes).unwrap();
        };
    matrix(&mut w, "token_embd.weight", vocab, dim, DType::Q8_0);
    let norm = |seed: u64| -> Vec<u8> {
        values(seed, dim, 0.5)
            .iter()
            .flat_map(|v| (1.0 + v).to_le_bytes())
            .collect()
    };
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(&n("attn_norm"), &[dim], DType::F32, norm(100 + i as u64))
            .unwrap();
        matrix(&mut w, &n("attn_q"), heads * hd, dim, DType::Q4_1);
        matrix(&mut w, &n("attn_k"), kv_heads * hd, dim, DType::Q4_1);
        matrix(&mut w, &n("attn_v"), kv_heads * hd, dim, DType::Q4_1);
        matrix(&mut w, &n("attn_output"), dim, heads * hd, DType::Q4_1);
        w.add_tensor(&n("ffn_norm"), &[dim], DType::F32, norm(200 + i as u64))
            .unwrap();
        matrix(&mut w, &n("ffn_gate"), ffn, dim, DType::Q4_1);
        matrix(&mut w, &n("ffn_up"), ffn, dim, DType::Q4_1);
        matrix(&mut w, &n("ffn_down"), dim, ffn, DType::Q4_1);
    }
    let out_norm = if nan_norm {
        vec![f32::NAN; dim]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    } else {
        norm(300)
    };
    w.add_tensor("output_norm.weight", &[dim], DType::F32, out_norm)
        .unwrap();
    w.write_to(path, &mut |_, _| {}).unwrap();
}

/// Greedy decoding after `prompt`: each step's token and the bits of its logits.
struct Run {
    tokens: Vec<u32>,
    logits: Vec<Vec<u32>>,
    instantiations: usize,
}

fn run(file: &Arc<GgufFile>, device: Device, mode: RunMode, prompt: &[u32]) -> Run {
    let ctx = prompt.len() + STEPS + 1;
    let llama = Transformer::load(file.clone(), &device, ctx, 64).expect("load");
    let mut engine = Engine::new(llama, Executor::new(device), mode);
    engine.prefill(prompt, Logits::Last).expect("prefill");
    let first = engine.logits(1).expect("logits");
    let mut token = first
        .iter()
        .enumerate()
        .fold(0, |b, (i, v)| if *v > first[b] { i } else { b }) as u32;
    let mut out = Run {
        tokens: Vec::new(),
        logits: Vec::new(),
        instantiations: 0,
    };
    for i in 0..STEPS {
        let next = engine
            .decode(token, prompt.len() + i, true)
            .expect("decode")
            .expect("greedy token");
        let logits = engine.logits(1).expect("logits");
        let host_best = logits
            .iter()
            .enumerate()
            .fold(0, |b, (i, v)| if *v > logits[b] { i } else { b }) as u32;
        assert_eq!(
            next, host_best,
            "{mode:?} step {i}: the device argmax is not the logits' argmax"
        );
        out.logits
            .push(logits.iter().map(|v| v.to_bits()).collect());
        out.tokens.push(next);
        token = next;
    }
    out.instantiations = engine.decode_instantiations();
    out
}

/// Graph mode's pipelined greedy decode (`Engine::decode_greedy`: each step launched before the
/// token of the one before it is read back): the tokens, the last step's logits and the one
/// instantiation, with the run stopped after `stop` tokens and resumed where it stopped.
fn run_pipelined(file: &Arc<GgufFile>, device: Device, prompt: &[u32], stop: usize) -> Run {
    let ctx = prompt.len() + STEPS + 1;
    let llama = Transformer::load(file.clone(), &device, ctx, 64).expect("load");
    let mut engine = Engine::new(llama, Executor::new(device), RunMode::Graph);
    engine.prefill(prompt, Logits::Last).expect("prefill");
    let first = engine.logits(1).expect("logits");
    let token = first
        .iter()
        .enumerate()
        .fold(0, |b, (i, v)| if *v > first[b] { i } else { b }) as u32;
    let mut tokens = Vec::new();
    let done = engine
        .decode_greedy(token, prompt.len(), STEPS, |t| {
            tokens.push(t);
            Ok(tokens.len() < stop)
        })
        .expect("pipelined decode");
    assert_eq!(done, stop, "the run did not stop where its callback said");
    let rest = engine
        .decode_greedy(tokens[stop - 1], prompt.len() + stop, STEPS - stop, |t| {
            tokens.push(t);
            Ok(true)
        })
        .expect("pipelined decode, resumed");
    assert_eq!(rest, STEPS - stop);
    let last = engine.logits(1).expect("logits");
    Run {
        tokens,
        logits: vec![last.iter().map(|v| v.to_bits()).collect()],
        instantiations: engine.decode_instantiations(),
    }
}

/// Steps whose logits differ bitwise between two runs, with the largest difference seen.
fn differing_steps(a: &Run, b: &Run) -> (usize, f32) {
    let mut steps = 0;
    let mut worst = 0f32;
    for (x, y) in a.logits.iter().zip(&b.logits) {
        if x != y {
            steps += 1;
        }
        for (p, q) in x.iter().zip(y) {
            worst = worst.max((f32::from_bits(*p) - f32::from_bits(*q)).abs());
        }
    }
    (steps, worst)
}

/// Graph replay against the same optimized step launched on a stream (recorded mode), and the
/// per-op-synchronized run against direct mode (the same unoptimized ops): bitwise equal. Graph
/// mode against direct mode: bitwise where the backend declares every fusion bit-exact (the CPU);
/// where it declares some within f32 rounding (CUDA's block fusions, `Capabilities::fusions`),
/// the same tokens and logits within `inexact_tol * (1 + max |logit|)` of direct mode's.
fn check_modes(file: &Arc<GgufFile>, device: &Device, prompt: &[u32], inexact_tol: f32) {
    let direct = run(file, device.clone(), RunMode::Direct, prompt);
    assert!(
        direct.logits.iter().all(|l| l.iter().any(|&b| b != 0)),
        "direct mode wrote no logits"
    );
    let graph = run(file, device.clone(), RunMode::Graph, prompt);
    assert_eq!(
        graph.instantiations, 1,
        "graph mode instantiated the step more than once"
    );
    let piped = run_pipelined(file, device.clone(), prompt, 10);
    assert_eq!(
        piped.tokens, graph.tokens,
        "pipelined greedy decode vs graph mode: tokens differ"
    );
    assert_eq!(
        piped.logits.last(),
        graph.logits.last(),
        "pipelined greedy decode vs graph mode: the last step's logits differ bitwise"
    );
    assert_eq!(
        piped.instantiations, 1,
        "the pipelined run instantiated again"
    );
    let recorded = run(file, device.clone(), RunMode::Recorded, prompt);
    let per_op = run(file, device.clone(), RunMode::PerOpSync, prompt);
    assert_eq!((recorded.instantiations, per_op.instantiations), (0, 0));
    for (name, a, b) in [
        ("graph vs recorded", &graph, &recorded),
        ("per-op-sync vs direct", &per_op, &direct),
    ] {
        assert_eq!(a.tokens, b.tokens, "{name}: tokens differ");
        assert_eq!(differing_steps(a, b).0, 0, "{name}: logits differ bitwise");
    }
    assert_eq!(
        graph.tokens, direct.tokens,
        "graph vs direct: tokens differ"
    );
    let (steps, worst) = differing_steps(&graph, &direct);
    if device.capabilities().fusions.iter().all(|u| u.exact) {
        assert_eq!(steps, 0, "graph vs direct: logits differ bitwise");
    } else {
        let scale = direct
            .logits
            .iter()
            .flatten()
            .fold(0f32, |m, &b| m.max(f32::from_bits(b).abs()));
        eprintln!(
            "graph vs direct: {steps} of {STEPS} steps differ, by at most {worst:.3e} (max |logit| \
             {scale:.3})"
        );
        let tol = inexact_tol * (1.0 + scale);
        assert!(
            worst <= tol,
            "graph vs direct: logits differ by {worst:.3e} > {tol:.3e}"
        );
    }
}

#[test]
fn cpu_graph_replay_matches_direct_mode_bitwise_over_64_steps() {
    let path = temp_path("small.gguf");
    write_small_llama(&path);
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    // 220 prompt tokens, so the 64 decode steps cross the 256-position attention chunk.
    let prompt: Vec<u32> = values(7, 220, 1.0)
        .iter()
        .map(|v| ((v + 1.0) * 127.0) as u32 % 256)
        .collect();
    check_modes(&file, &Device::cpu(2).expect("cpu"), &prompt, 0.0);
    let _ = std::fs::remove_file(&path);
}

/// A pipelined greedy step whose logits are all NaN (the device argmax's -1): the steps launched
/// after it are drained, the step is redone alone, and the host's greedy choice fails with the
/// sampler's error, as `Engine::decode` does, rather than a token.
#[test]
fn cpu_pipelined_greedy_decode_of_nan_logits_is_the_samplers_error() {
    let path = temp_path("nan-norm.gguf");
    write_llama(&path, true);
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let device = Device::cpu(2).expect("cpu");
    let llama = Transformer::load(file, &device, 64, 16).expect("load");
    let mut engine = Engine::new(llama, Executor::new(device), RunMode::Graph);
    engine.prefill(&[1, 2, 3], Logits::Last).expect("prefill");
    let mut tokens = Vec::new();
    let err = engine
        .decode_greedy(3, 3, 8, |t| {
            tokens.push(t);
            Ok(true)
        })
        .expect_err("NaN logits gave tokens");
    assert!(tokens.is_empty(), "tokens from NaN logits: {tokens:?}");
    assert!(
        err.to_string()
            .contains(onepass::model::sampler::NO_FINITE_LOGIT),
        "{err}"
    );
    let _ = std::fs::remove_file(&path);
}

/// Sampled generation: graph mode draws each token on the device at the end of the step
/// (`Engine::decode_sampled`, pipelined), `host` mode reads the logits and draws on the host
/// (direct mode on the CPU; graph mode with step timing on CUDA, the same graph's logits). The
/// generated ids, and the device draw's history count after the run (0 where the host drew).
fn sampled(
    file: &Arc<GgufFile>,
    device: Device,
    mode: RunMode,
    timing: bool,
    prompt: &[u32],
    cfg: &SamplerConfig,
) -> (Vec<u32>, u32) {
    let llama =
        Transformer::load(file.clone(), &device, prompt.len() + STEPS + 1, 64).expect("load");
    let mut engine = Engine::new(llama, Executor::new(device), mode);
    engine.set_step_timing(timing);
    let stats = engine
        .generate(prompt, STEPS, cfg, &[], |_| Ok(()))
        .expect("generate");
    let history = engine.model().draw_state().expect("draw state").history;
    (stats.generated_ids, history)
}

/// Settings for the sampled runs: temperature alone, with top-k and top-p, with min-p and a
/// repetition penalty, and a penalized greedy run.
fn sampled_configs() -> Vec<SamplerConfig> {
    let c = |temperature, top_k, top_p, min_p, repetition_penalty, seed| SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        penalty_window: 32,
        seed,
    };
    vec![
        c(0.9, 0, 1.0, 0.0, 1.0, 1),
        c(1.2, 40, 0.9, 0.0, 1.0, 2),
        c(0.8, 0, 1.0, 0.05, 1.3, 3),
        c(0.0, 0, 1.0, 0.0, 1.5, 4),
    ]
}

/// The device's draws give the host's tokens for every setting (temperatures times `heat`), and
/// graph mode did draw on the device (its history count moved past the prompt and every
/// generated token).
fn check_sampled(
    file: &Arc<GgufFile>,
    device: &Device,
    prompt: &[u32],
    host: (RunMode, bool),
    heat: f32,
) {
    for mut cfg in sampled_configs() {
        cfg.temperature *= heat;
        let (want, host_history) = sampled(file, device.clone(), host.0, host.1, prompt, &cfg);
        let (got, history) = sampled(file, device.clone(), RunMode::Graph, false, prompt, &cfg);
        assert_eq!(got, want, "device draw vs host draw: {cfg:?}");
        assert_eq!(host_history, 0, "the host's run drew on the device");
        assert_eq!(history as usize, prompt.len() + STEPS, "{cfg:?}");
        let distinct: std::collections::BTreeSet<_> = got.iter().collect();
        assert!(
            cfg.temperature == 0.0 || distinct.len() > 4,
            "{cfg:?}: a sampled run of few tokens {got:?}"
        );
    }
}

#[test]
fn cpu_sampled_decode_draws_on_the_device_the_tokens_the_host_draws() {
    let path = temp_path("small-sampled.gguf");
    write_small_llama(&path);
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
    let cpu = Device::cpu(2).expect("cpu");
    check_sampled(&file, &cpu, &prompt, (RunMode::Direct, false), 1.0);
    let _ = std::fs::remove_file(&path);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_graph_replay_matches_direct_mode_bitwise_over_64_steps() {
    cuda_open::require_gpu();
    let device = Device::cuda(0).expect("cuda device");
    let path = temp_path("smollm2-q4_1.gguf");
    let spec = onepass::model::synth::SynthSpec {
        shape: onepass::model::synth::SynthShape::SmolLm2,
        quant: DType::Q4_1.into(),
        seed: 3,
        rope_freqs: false,
        layers: None,
    };
    onepass::model::synth::write_synthetic(&spec, None, &path, &mut |_, _| {}).expect("synth");
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let prompt: Vec<u32> = values(9, 220, 1.0)
        .iter()
        .map(|v| ((v + 1.0) * 20000.0) as u32 % 49152)
        .collect();
    // The fused block kernels agree with the separate ops within f32 rounding; through 30 layers
    // and 64 steps that stays under 2e-3 of the logits' scale (cuda_e2e's bound against the CPU).
    check_modes(&file, &device, &prompt, 2e-3);
    let _ = std::fs::remove_file(&path);
}

/// CUDA's draw against the host's on the synthetic SmolLM2 (the host reading the same graph's
/// logits, step timing on).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_sampled_decode_draws_on_the_device_the_tokens_the_host_draws() {
    cuda_open::require_gpu();
    let device = Device::cuda(0).expect("cuda device");
    let path = temp_path("smollm2-sampled.gguf");
    let spec = onepass::model::synth::SynthSpec {
        shape: onepass::model::synth::SynthShape::SmolLm2,
        quant: DType::Q4_1.into(),
        seed: 5,
        rope_freqs: false,
        layers: Some(4),
    };
    onepass::model::synth::write_synthetic(&spec, None, &path, &mut |_, _| {}).expect("synth");
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7_919 % 49_152) as u32).collect();
    // The synthetic model's top logit stands far above the rest: temperatures 60 times the
    // usual make its runs draw more than a few tokens.
    check_sampled(&file, &device, &prompt, (RunMode::Graph, true), 60.0);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn cpu_profiled_step_times_every_kernel_and_traces_them() {
    let path = temp_path("small-profile.gguf");
    write_small_llama(&path);
    let file = Arc::new(GgufFile::open(&path).expect("open"));
    let device = Device::cpu(2).expect("cpu");
    let llama = Transformer::load(file, &device, 64, 16).expect("load");
    let mut engine = Engine::new(llama, Executor::new(device), RunMode::Graph);
    engine.prefill(&[1, 2, 3], Logits::Last).expect("prefill");
    engine.decode(4, 3, true).expect("decode");
    let kernels = engine.profile_decode(5, 4, true).expect("profile");
    assert_eq!(kernels.len(), engine.last_pass().kernels);
    assert!(
        kernels.iter().all(|k| k.dur_us > 0.0),
        "a kernel has no time"
    );
    assert!(kernels.iter().any(|k| k.op == "matmul") && kernels.iter().any(|k| k.op == "argmax"));
    let levels = kernels.iter().map(|k| k.level).max().expect("levels") + 1;
    assert_eq!(
        levels - 1,
        engine.last_pass().edges_or_barriers,
        "CPU graph mode reports its barriers"
    );
    // With the fused block ops a CPU decode step is nearly one dependency chain, so levels may
    // hold one kernel each; every level holds at least one.
    assert!(
        (0..levels).all(|l| kernels.iter().any(|k| k.level == l)),
        "a level without kernels"
    );
    let trace = temp_path("trace.json");
    let timeline = onepass::trace::Timeline {
        name: "step".into(),
        kernels,
    };
    onepass::trace::write_chrome_trace(&trace, &[timeline]).expect("trace");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&trace).expect("read")).expect("json");
    let slices = v["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(slices, engine.last_pass().kernels);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&trace);
}
