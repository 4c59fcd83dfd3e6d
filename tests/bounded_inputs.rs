//! Inputs that used to crash, hang or exhaust the machine get a clean refusal, bounded in time and
//! memory: a block count larger than the file, a model with no blocks, a context larger than the
//! memory, a huge thread count, NaN weights under greedy decoding, a closed standard output, and
//! a backend or output path that cannot work, found before the long work. (Stale download
//! temporaries are covered by the unit tests of `model::fetch`.)

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use onepass::model::budget::available_memory;
use onepass::model::engine::{Engine, RunMode};
use onepass::model::gguf::GgufFile;
use onepass::model::sampler::{SamplerConfig, NO_FINITE_LOGIT};
use onepass::model::transformer::Transformer;
use onepass::{Device, Executor};

mod common;
use common::{cli, one_error_line, write_tiny, Tiny, TRAIN_CTX};

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| common::scratch_dir("bounded-inputs"))
}

fn dev() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| Device::cpu(1).expect("a CPU device"))
}

fn tiny() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| write_tiny(dir(), "tiny.gguf", &Tiny::default()))
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn load(path: &Path, ctx: usize) -> onepass::Result<Transformer> {
    Transformer::load(Arc::new(GgufFile::open(path)?), dev(), ctx, 8)
}

#[test]
fn a_block_count_beyond_the_file_names_the_first_missing_block() {
    let path = write_tiny(
        dir(),
        "blocks-2e31.gguf",
        &Tiny {
            block_count: Some(1 << 31),
            ..Tiny::default()
        },
    );
    let e = load(&path, 16).err().expect("must be refused").to_string();
    assert!(
        e.contains("2147483648") && e.contains("the tensors of block 2 are missing"),
        "{e}"
    );
    // A file with only the first of its two declared blocks.
    let short = write_tiny(
        dir(),
        "blocks-short.gguf",
        &Tiny {
            block_count: Some(2),
            blocks: 1,
            ..Tiny::default()
        },
    );
    let e = load(&short, 16).err().expect("must be refused").to_string();
    assert!(e.contains("block 1 are missing"), "{e}");
    let m = s(&path);
    let args = ["generate", "--model", &m, "--backend", "cpu", "hi"];
    one_error_line(&args, &cli(dir(), &args, b""), "block 2 are missing");
}

#[test]
fn a_model_with_no_blocks_is_an_error() {
    let path = write_tiny(
        dir(),
        "blocks-0.gguf",
        &Tiny {
            blocks: 0,
            ..Tiny::default()
        },
    );
    let e = load(&path, 16).err().expect("must be refused").to_string();
    assert!(e.contains("a model with no blocks"), "{e}");
    let m = s(&path);
    let args = ["generate", "--model", &m, "--backend", "cpu", "hi"];
    one_error_line(&args, &cli(dir(), &args, b""), "no blocks");
}

#[test]
fn a_context_larger_than_the_memory_is_refused_up_front() {
    let Some(have) = available_memory() else {
        eprintln!("skipping: the available memory is not known on this system");
        return;
    };
    // 2 layers x 2 KV heads x 16 x 2 (K and V) x 4 bytes = 512 bytes per position.
    let ctx = (have / 512 + 1).next_power_of_two() as usize * 4;
    let e = load(tiny(), ctx)
        .err()
        .expect("must be refused")
        .to_string();
    assert!(
        e.contains(&format!("a context of {ctx} tokens needs")) && e.contains("available"),
        "{e}"
    );
    let m = s(tiny());
    let ctx = ctx.to_string();
    let args = [
        "generate",
        "--model",
        &m,
        "--backend",
        "cpu",
        "--ctx",
        &ctx,
        "hi",
    ];
    one_error_line(&args, &cli(dir(), &args, b""), "available");
}

#[test]
fn a_context_past_the_trained_one_warns() {
    let m = s(tiny());
    let over = (2 * TRAIN_CTX).to_string();
    let within = TRAIN_CTX.to_string();
    let run = |ctx: &str| {
        let args = [
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "--ctx",
            ctx,
            "-n",
            "1",
            "hi",
        ];
        let out = cli(dir(), &args, b"");
        assert_eq!(out.code, 0, "{out:?}");
        out.stderr
    };
    let err = run(&over);
    assert!(
        err.contains(&format!(
            "exceeds the {TRAIN_CTX} the model was trained for"
        )),
        "{err}"
    );
    assert!(!run(&within).contains("trained for"));
}

#[test]
fn a_huge_thread_count_is_capped_with_a_warning() {
    let m = s(tiny());
    let args = [
        "generate",
        "--model",
        &m,
        "--backend",
        "cpu",
        "--threads",
        "100000",
        "-n",
        "2",
        "hi",
    ];
    let out = cli(dir(), &args, b"");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("100000 CPU threads requested") && out.stderr.contains("per core"),
        "{}",
        out.stderr
    );
}

#[test]
fn nan_weights_fail_greedy_decoding_in_every_mode() {
    let path = write_tiny(
        dir(),
        "nan.gguf",
        &Tiny {
            output_norm: f32::NAN,
            ..Tiny::default()
        },
    );
    let greedy = SamplerConfig::default();
    for mode in [
        RunMode::Graph,
        RunMode::Recorded,
        RunMode::Direct,
        RunMode::PerOpSync,
    ] {
        let llama = load(&path, 16).unwrap();
        let mut engine = Engine::new(llama, Executor::new(dev().clone()), mode);
        // The first token, chosen on the host from the prefill's logits.
        let e = engine
            .generate(&[5, 6], 3, &greedy, &[], |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(NO_FINITE_LOGIT), "{mode:?}: {e}");
        // A decode step whose argmax runs on the device.
        let e = engine.decode(5, 0, true).unwrap_err().to_string();
        assert!(e.contains(NO_FINITE_LOGIT), "{mode:?}: {e}");
    }
    let m = s(&path);
    let args = ["generate", "--model", &m, "--backend", "cpu", "hi"];
    one_error_line(&args, &cli(dir(), &args, b""), NO_FINITE_LOGIT);
}

/// Runs `onepass args`, reads `keep` lines of its standard output and then closes it.
fn run_into_closed_pipe(args: &[&str], keep: usize) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .args(args)
        .env("ONEPASS_CACHE_DIR", dir().join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..keep {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
    }
    drop(reader);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_commands_quietly() {
    let m = s(tiny());
    // Far more than a pipe holds (about 1 MB of lines), so that writing goes on after the reader
    // has gone; the argument stays under the 128 KiB a single argument may have.
    let text = "a b c ".repeat(16_000);
    let (code, err) = run_into_closed_pipe(&["tokenize", "--model", &m, &text], 2);
    assert_eq!(code, 0, "tokenize: {err}");
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    let (code, err) = run_into_closed_pipe(
        &[
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "--ignore-eos",
            "-n",
            "200",
            "hi",
        ],
        0,
    );
    assert_eq!(code, 0, "generate: {err}");
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
}

#[test]
fn bench_checks_the_backend_before_writing_a_model() {
    if onepass::backend::cuda::driver_present() {
        eprintln!("skipping: a CUDA driver is present, so the CUDA backend may start");
        return;
    }
    let child = Command::new(env!("CARGO_BIN_EXE_onepass"))
        .args(["bench", "--like", "llama-3.1-8b", "--backend", "cuda"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cuda") && !err.contains("wrote a synthetic"),
        "{err}"
    );
    assert!(!std::env::temp_dir()
        .join(format!("onepass-bench-{pid}"))
        .exists());
}

#[test]
fn output_paths_are_checked_before_the_work() {
    let m = s(tiny());
    let missing = dir().join("no-such-folder").join("out");
    let missing = s(&missing);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "bench",
                "--like",
                "llama-3.1-8b",
                "--backend",
                "cpu",
                "--trace",
                &missing,
            ],
            "--trace",
        ),
        (
            vec![
                "generate",
                "--model",
                &m,
                "--backend",
                "cpu",
                "--trace",
                &missing,
                "hi",
            ],
            "--trace",
        ),
        (
            vec![
                "generate",
                "--model",
                &m,
                "--backend",
                "cpu",
                "--logits-out",
                &missing,
                "hi",
            ],
            "--logits-out",
        ),
        (
            vec![
                "graph",
                "--model",
                &m,
                "--backend",
                "cpu",
                "--svg",
                &missing,
            ],
            "--svg",
        ),
        (
            vec![
                "graph",
                "--model",
                &m,
                "--backend",
                "cpu",
                "--dot",
                &missing,
            ],
            "--dot",
        ),
        (
            vec!["synth", "--like", "llama-3.1-8b", "-o", &missing],
            "-o",
        ),
    ];
    for (args, flag) in cases {
        let out = cli(dir(), &args, b"");
        let line = one_error_line(&args, &out, &missing);
        assert!(line.contains(flag), "{line}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
    // A folder given as the output file.
    let d = s(dir());
    let args = ["synth", "--like", "smollm2", "-o", &d];
    one_error_line(&args, &cli(dir(), &args, b""), "is a folder");
}
