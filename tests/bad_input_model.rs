//! Bad input to the model, the engine and the CLI: context overflow, token ids outside the
//! vocabulary, empty prompts, and the CLI given non-UTF-8 input, broken model files and bad flags
//! (one `error: ...` line and a non-zero exit, never a panic). The op argument checks are in
//! `bad_input.rs`.
//!
//! The tests use a tiny synthetic llama (2 layers, dim 64, byte-level vocabulary, `common/`)
//! written with the GGUF writer, so they need no downloaded model.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::sampler::SamplerConfig;
use onepass::model::transformer::{Logits, Transformer};
use onepass::{Device, Executor, Result};

mod common;
use common::{tiny_tokens, Tiny};

/// One CPU device shared by the tests of this file.
fn dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| Device::cpu(1).expect("a CPU device"))
}

fn tiny_model_bytes() -> Vec<u8> {
    common::tiny_model_bytes(&Tiny::default())
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
    let llama = Transformer::load(file, dev(), max_ctx, max_batch).unwrap();
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
    let llama = engine.model();
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
    let vocab = engine.model().config().vocab as u32;
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
        (vec!["--repeat-penalty", "0"], "--repeat-penalty"),
    ] {
        let mut args = vec!["generate", "--model", m.as_str(), "--backend", "cpu"];
        args.extend(flags);
        args.push("hi");
        fails_with_one_line(&args, b"", needle);
    }
}
