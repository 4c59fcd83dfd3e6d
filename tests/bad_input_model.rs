//! Bad input to the model, the engine and the CLI: context overflow, token ids outside the
//! vocabulary, empty prompts, and the CLI given non-UTF-8 input, broken model files and bad flags
//! (one `error: ...` line and a non-zero exit, never a panic). The op argument checks are in
//! `bad_input.rs`.
//!
//! The tests use a tiny synthetic llama (2 layers, dim 64, byte-level vocabulary) written with the
//! GGUF writer, so they need no downloaded model.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::gguf_write::GgufWriter;
use onepass::model::llama::{Llama, Logits};
use onepass::model::sampler::SamplerConfig;
use onepass::{DType, Device, Executor, Result};

/// One CPU device shared by the tests of this file.
fn dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| Device::cpu(1).expect("a CPU device"))
}

const DIM: usize = 64;
const N_LAYER: usize = 2;
const N_HEAD: usize = 4;
const N_KV_HEAD: usize = 2;
const FFN: usize = 128;

/// The GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256 + rank.
fn byte_char(b: u8) -> char {
    let printable =
        |x: u32| (33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x);
    let b = u32::from(b);
    if printable(b) {
        char::from_u32(b).unwrap()
    } else {
        char::from_u32(256 + (0..b).filter(|&x| !printable(x)).count() as u32).unwrap()
    }
}

fn tiny_tokens() -> Vec<String> {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    tokens
}

/// Deterministic values in about `±scale`.
fn values(n: usize, seed: u64, scale: f32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            ((u * 2.0 - 1.0) * scale).to_le_bytes()
        })
        .collect()
}

fn tiny_model_bytes() -> Vec<u8> {
    let tokens = tiny_tokens();
    let vocab = tokens.len();
    let head_dim = DIM / N_HEAD;
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama").unwrap();
    w.add_u32("llama.context_length", 256).unwrap();
    w.add_u32("llama.embedding_length", DIM as u32).unwrap();
    w.add_u32("llama.block_count", N_LAYER as u32).unwrap();
    w.add_u32("llama.feed_forward_length", FFN as u32).unwrap();
    w.add_u32("llama.attention.head_count", N_HEAD as u32)
        .unwrap();
    w.add_u32("llama.attention.head_count_kv", N_KV_HEAD as u32)
        .unwrap();
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .unwrap();
    w.add_f32("llama.rope.freq_base", 10000.0).unwrap();
    w.add_str("tokenizer.ggml.model", "gpt2").unwrap();
    w.add_str("tokenizer.ggml.pre", "smollm").unwrap();
    w.add_u32("tokenizer.ggml.bos_token_id", 1).unwrap();
    w.add_u32("tokenizer.ggml.eos_token_id", 2).unwrap();
    w.add_bool("tokenizer.ggml.add_bos_token", false).unwrap();
    let mut types = vec![3i32; 3];
    types.extend(std::iter::repeat_n(1, 256));
    w.add_str_array("tokenizer.ggml.tokens", &tokens).unwrap();
    w.add_i32_array("tokenizer.ggml.token_type", &types)
        .unwrap();
    w.add_str_array::<&str>("tokenizer.ggml.merges", &[])
        .unwrap();
    let mut seed = 0;
    let mut mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize| {
        seed += 1;
        let scale = (3.0 / cols as f32).sqrt();
        w.add_tensor(
            name,
            &[rows, cols],
            DType::F32,
            values(rows * cols, seed, scale),
        )
        .unwrap();
    };
    let ones = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect() };
    mat(&mut w, "token_embd.weight", vocab, DIM);
    for i in 0..N_LAYER {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(&n("attn_norm"), &[DIM], DType::F32, ones(DIM))
            .unwrap();
        mat(&mut w, &n("attn_q"), N_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_k"), N_KV_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_v"), N_KV_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_output"), DIM, N_HEAD * head_dim);
        w.add_tensor(&n("ffn_norm"), &[DIM], DType::F32, ones(DIM))
            .unwrap();
        mat(&mut w, &n("ffn_gate"), FFN, DIM);
        mat(&mut w, &n("ffn_up"), FFN, DIM);
        mat(&mut w, &n("ffn_down"), DIM, FFN);
    }
    w.add_tensor("output_norm.weight", &[DIM], DType::F32, ones(DIM))
        .unwrap();
    w.to_bytes().unwrap()
}

fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("onepass-bad-input-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// The tiny model, written once per test run.
fn tiny_model_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = scratch_dir().join("tiny.gguf");
        std::fs::write(&p, tiny_model_bytes()).unwrap();
        p
    })
}

fn tiny_engine(max_ctx: usize, max_batch: usize) -> Engine {
    let file = Arc::new(GgufFile::open(tiny_model_path()).unwrap());
    let llama = Llama::load(file, dev(), max_ctx, max_batch).unwrap();
    Engine::new(llama, Executor::new(dev().clone()), RunMode::Graph)
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, needle: &str) {
    let e = r.expect_err(needle).to_string();
    assert!(
        e.contains(needle),
        "error `{e}` does not mention `{needle}`"
    );
    assert!(!e.contains('\n'), "error is not one line: {e:?}");
}

#[test]
fn out_of_vocabulary_and_bad_passes_in_set_inputs() {
    let engine = tiny_engine(16, 8);
    let llama = engine.llama();
    let vocab = llama.config().vocab as u32;
    assert_eq!(vocab as usize, tiny_tokens().len());
    llama.set_inputs(&[0, vocab - 1], 0).unwrap();
    expect_err(llama.set_inputs(&[vocab], 0), "out of range");
    expect_err(llama.set_inputs(&[1, u32::MAX], 0), "out of range");
    expect_err(llama.set_inputs(&[], 0), "got 0");
    expect_err(llama.set_inputs(&[1; 9], 0), "got 9");
    expect_err(llama.set_inputs(&[1; 4], 13), "context overflow");
    expect_err(llama.set_inputs(&[1], 16), "context overflow");
    expect_err(llama.set_inputs(&[1], usize::MAX), "context overflow");
}

#[test]
fn engine_rejects_overflow_empty_prompts_and_bad_ids() {
    let mut engine = tiny_engine(16, 8);
    let greedy = SamplerConfig::default();
    let vocab = engine.llama().config().vocab as u32;
    let none = |_| Ok(());
    expect_err(
        engine.generate(&[5; 10], 8, &greedy, &[], none),
        "exceeds the context",
    );
    expect_err(engine.generate(&[5; 17], 0, &greedy, &[], none), "context");
    expect_err(engine.generate(&[], 4, &greedy, &[], none), "empty");
    expect_err(engine.prefill(&[], Logits::Last), "empty");
    expect_err(
        engine.generate(&[5, vocab + 3], 2, &greedy, &[], none),
        "out of range",
    );
    expect_err(engine.decode(7, 16, true), "context overflow");
    // Right at the limit: the prompt and the new tokens fill the context exactly (the last new
    // token is never fed back), which is defined and works.
    // 10 + 7 = 17 = ctx + 1 is allowed: positions 0..16 are used, the 7th new token is not fed.
    let stats = engine.generate(&[5; 10], 7, &greedy, &[], none).unwrap();
    assert_eq!(stats.generated_ids.len(), 7);
    assert!(stats.generated_ids.iter().all(|&t| t < vocab));
    // The engine stays usable after the errors and gives the same tokens again.
    let again = engine.generate(&[5; 10], 7, &greedy, &[], none).unwrap();
    assert_eq!(again.generated_ids, stats.generated_ids);
}

// ---------------------------------------------------------------------------------------------
// The CLI.

/// Runs `onepass` with `args` and `stdin`; returns (exit code, stdout, stderr).
fn cli(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .args(args)
        .env("ONEPASS_CACHE_DIR", scratch_dir().join("cache"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command fails with exactly one `error: ...` line on stderr that mentions `needle`.
fn fails_with_one_line(args: &[&str], stdin: &[u8], needle: &str) {
    let (code, _, err) = cli(args, stdin);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        code != 0 && code != 101,
        "{args:?}: exit {code}, stderr {err:?}"
    );
    assert!(!err.contains("panicked"), "{args:?}: panic: {err}");
    assert_eq!(lines.len(), 1, "{args:?}: stderr is not one line: {err:?}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {err:?}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: `{}` does not mention `{needle}`",
        lines[0]
    );
}

fn model_arg() -> String {
    tiny_model_path().display().to_string()
}

#[test]
fn cli_generates_with_the_tiny_model() {
    // The baseline the failure cases below differ from in one thing each.
    let m = model_arg();
    let (code, out, err) = cli(
        &[
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "-n",
            "3",
            "hi",
        ],
        b"",
    );
    assert_eq!(code, 0, "stderr: {err}");
    assert!(!out.is_empty() || !err.is_empty());
    let (code, _, err) = cli(
        &["generate", "--model", &m, "--backend", "cpu", "-n", "2"],
        b"from stdin",
    );
    assert_eq!(code, 0, "stderr: {err}");
}

#[test]
fn cli_rejects_bad_prompts() {
    let m = model_arg();
    let base = [
        "generate",
        "--model",
        m.as_str(),
        "--backend",
        "cpu",
        "-n",
        "2",
    ];
    fails_with_one_line(&base, &[0x68, 0x69, 0xff, 0xfe, 0x20], "not valid UTF-8");
    fails_with_one_line(&base, b"", "empty");
    fails_with_one_line(&[&base[..], &[""]].concat(), b"", "empty");
    // Context overflow through the flags.
    let small = [
        "generate",
        "--model",
        m.as_str(),
        "--backend",
        "cpu",
        "--ctx",
        "4",
        "-n",
        "8",
        "hello",
    ];
    fails_with_one_line(&small, b"", "context");
}

#[test]
fn cli_rejects_broken_model_files() {
    let bytes = std::fs::read(tiny_model_path()).unwrap();
    let dir = scratch_dir();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated-header.gguf",
            bytes[..20].to_vec(),
            "shorter than a GGUF header",
        ),
        ("truncated-meta.gguf", bytes[..400].to_vec(), "truncated"),
        (
            "truncated-data.gguf",
            bytes[..bytes.len() - 100].to_vec(),
            "past the end",
        ),
        (
            "text.gguf",
            b"this is not a model file, just some text\n".to_vec(),
            "not a GGUF file",
        ),
        ("empty.gguf", vec![], "shorter than a GGUF header"),
    ];
    for (name, content, needle) in cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        let ps = p.display().to_string();
        fails_with_one_line(
            &["generate", "--model", &ps, "--backend", "cpu", "hi"],
            b"",
            needle,
        );
    }
    let missing = dir.join("missing.gguf").display().to_string();
    fails_with_one_line(
        &["generate", "--model", &missing, "--backend", "cpu", "hi"],
        b"",
        "--model",
    );
}

#[test]
fn cli_rejects_bad_sampling_flags() {
    let m = model_arg();
    for (flags, needle) in [
        (vec!["--top-p", "2"], "--top-p"),
        (vec!["--top-p", "0"], "--top-p"),
        (vec!["--temperature=-1"], "--temperature"),
        (vec!["--temperature", "-1"], "--temperature"),
        (vec!["--temperature", "nan"], "--temperature"),
        (vec!["--min-p", "1.5"], "--min-p"),
        (vec!["--repeat-penalty", "0"], "penalty"),
    ] {
        let mut args = vec!["generate", "--model", m.as_str(), "--backend", "cpu"];
        args.extend(flags);
        args.push("hi");
        fails_with_one_line(&args, b"", needle);
    }
}
