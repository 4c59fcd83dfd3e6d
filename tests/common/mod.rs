//! A tiny synthetic llama (2 layers, dim 64, byte-level vocabulary) written with the crate's GGUF
//! writer, with knobs for the broken models the bad-input tests need, and a runner for the CLI.
//! Shared by several test files; each uses a part of it.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use onepass::model::gguf_write::GgufWriter;
use onepass::DType;

/// Hidden size.
pub const DIM: usize = 64;
/// Blocks.
pub const N_LAYER: usize = 2;
/// Query heads.
pub const N_HEAD: usize = 4;
/// Key/value heads.
pub const N_KV_HEAD: usize = 2;
/// Feed-forward size.
pub const FFN: usize = 128;
/// The context length the model says it was trained for.
pub const TRAIN_CTX: u32 = 4096;

/// What to change in the tiny model.
#[derive(Debug, Clone)]
pub struct Tiny {
    /// `llama.block_count` (default: the blocks written).
    pub block_count: Option<u32>,
    /// Blocks whose tensors are written.
    pub blocks: usize,
    /// The value of every `output_norm.weight` entry (1: a working model; 0: every logit is 0, so
    /// greedy decoding picks token 0; NaN: every logit is NaN).
    pub output_norm: f32,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: u32,
}

impl Default for Tiny {
    fn default() -> Self {
        Tiny {
            block_count: None,
            blocks: N_LAYER,
            output_norm: 1.0,
            eos_id: 2,
        }
    }
}

/// The GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256 + rank.
pub fn byte_char(b: u8) -> char {
    let printable =
        |x: u32| (33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x);
    let b = u32::from(b);
    if printable(b) {
        char::from_u32(b).unwrap()
    } else {
        char::from_u32(256 + (0..b).filter(|&x| !printable(x)).count() as u32).unwrap()
    }
}

/// Three special tokens, then one token per byte.
pub fn tiny_tokens() -> Vec<String> {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    tokens
}

/// Deterministic values in about `±scale`.
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<u8> {
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

fn filled(n: usize, v: f32) -> Vec<u8> {
    (0..n).flat_map(|_| v.to_le_bytes()).collect()
}

/// The GGUF bytes of the tiny model with the changes `t` asks for.
pub fn tiny_model_bytes(t: &Tiny) -> Vec<u8> {
    let tokens = tiny_tokens();
    let vocab = tokens.len();
    let head_dim = DIM / N_HEAD;
    let block_count = t.block_count.unwrap_or(t.blocks as u32);
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama").unwrap();
    w.add_u32("llama.context_length", TRAIN_CTX).unwrap();
    w.add_u32("llama.embedding_length", DIM as u32).unwrap();
    w.add_u32("llama.block_count", block_count).unwrap();
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
    w.add_u32("tokenizer.ggml.eos_token_id", t.eos_id).unwrap();
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
    mat(&mut w, "token_embd.weight", vocab, DIM);
    for i in 0..t.blocks {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.add_tensor(&n("attn_norm"), &[DIM], DType::F32, filled(DIM, 1.0))
            .unwrap();
        mat(&mut w, &n("attn_q"), N_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_k"), N_KV_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_v"), N_KV_HEAD * head_dim, DIM);
        mat(&mut w, &n("attn_output"), DIM, N_HEAD * head_dim);
        w.add_tensor(&n("ffn_norm"), &[DIM], DType::F32, filled(DIM, 1.0))
            .unwrap();
        mat(&mut w, &n("ffn_gate"), FFN, DIM);
        mat(&mut w, &n("ffn_up"), FFN, DIM);
        mat(&mut w, &n("ffn_down"), DIM, FFN);
    }
    w.add_tensor(
        "output_norm.weight",
        &[DIM],
        DType::F32,
        filled(DIM, t.output_norm),
    )
    .unwrap();
    w.to_bytes().unwrap()
}

/// A folder of this test process's own under the system's temporary folder.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("onepass-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes the tiny model with changes `t` as `dir/name` and returns its path.
pub fn write_tiny(dir: &Path, name: &str, t: &Tiny) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, tiny_model_bytes(t)).unwrap();
    p
}

/// What a run of the CLI gave.
#[derive(Debug)]
pub struct Output {
    /// The exit code (-1 when a signal ended it).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `onepass` with `args`, `stdin`, extra environment `env` and a cache under `dir`.
pub fn cli_env(dir: &Path, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onepass"));
    cmd.args(args)
        .env("ONEPASS_CACHE_DIR", dir.join("cache"))
        .env_remove("ONEPASS_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// [`cli_env`] without extra environment.
pub fn cli(dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    cli_env(dir, args, stdin, &[])
}

/// The run failed with exactly one `error: ...` line on stderr that mentions `needle`, and no
/// panic; returns that line.
pub fn one_error_line(args: &[&str], out: &Output, needle: &str) -> String {
    let err = &out.stderr;
    assert!(
        out.code != 0 && out.code != 101,
        "{args:?}: exit {}, stderr {err:?}",
        out.code
    );
    assert!(!err.contains("panicked"), "{args:?}: panic: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: stderr is not one line: {err:?}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {err:?}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: `{}` does not mention `{needle}`",
        lines[0]
    );
    lines[0].to_string()
}
