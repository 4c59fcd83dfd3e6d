//! What the CLI says: errors that name the user's path once, the cache variable, the flag as it is
//! spelled; plain log lines; doctor on a machine without CUDA; where generation stopped; each
//! token's text; the random seed of a sampled run.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod common;
use common::{cli, cli_env, one_error_line, write_tiny, Tiny, TRAIN_CTX};

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| common::scratch_dir("cli-messages"))
}

fn tiny() -> String {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| write_tiny(dir(), "tiny.gguf", &Tiny::default()))
        .display()
        .to_string()
}

#[test]
fn write_errors_name_the_users_path_and_the_cause_once() {
    let args = ["synth", "--like", "smollm2", "-o", "/proc/onepass-x.gguf"];
    let line = one_error_line(&args, &cli(dir(), &args, b""), "/proc/onepass-x.gguf");
    assert!(!line.contains(".tmp."), "{line}");
    assert_eq!(line.matches("(os error").count(), 1, "{line}");
}

#[test]
fn cache_errors_name_the_cache_variable() {
    let file = dir().join("not-a-folder");
    std::fs::write(&file, b"x").unwrap();
    let args = ["tokenize", "hi"];
    let out = cli_env(
        dir(),
        &args,
        b"",
        &[("ONEPASS_CACHE_DIR", file.to_str().unwrap())],
    );
    let line = one_error_line(&args, &out, "ONEPASS_CACHE_DIR");
    assert_eq!(line.matches("(os error").count(), 1, "{line}");
}

#[test]
fn log_lines_are_plain_and_a_bad_filter_is_named() {
    let m = tiny();
    let ctx = (2 * TRAIN_CTX).to_string();
    let args = [
        "generate",
        "--model",
        &m,
        "--backend",
        "cpu",
        "--ctx",
        &ctx,
        "-n",
        "1",
        "hi",
    ];
    let out = cli(dir(), &args, b"");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("WARN"), "{}", out.stderr);
    assert!(!out.stderr.contains('\x1b'), "{:?}", out.stderr);
    let out = cli_env(dir(), &args, b"", &[("ONEPASS_LOG", "onepass=loud")]);
    assert_eq!(out.code, 0, "{out:?}");
    let first = out.stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("ONEPASS_LOG") && first.contains("onepass=loud"),
        "{}",
        out.stderr
    );
}

#[test]
fn flags_are_named_as_spelled_and_negative_counts_are_refused() {
    let m = tiny();
    let base = ["generate", "--model", m.as_str(), "--backend", "cpu"];
    let out = cli(
        dir(),
        &[&base[..], &["--repeat-penalty", "0", "hi"]].concat(),
        b"",
    );
    one_error_line(&base, &out, "--repeat-penalty");
    for (flag, value) in [
        ("-n", "-1"),
        ("--top-k", "-3"),
        ("--ctx", "-5"),
        ("--threads", "-2"),
        ("--seed", "-7"),
    ] {
        let args = [&base[..], &[flag, value, "hi"]].concat();
        let out = cli(dir(), &args, b"");
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains(value) && first.contains("must be 0 or more"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("-- "), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn doctor_without_cuda_says_the_cpu_is_ready_and_succeeds() {
    if onepass::backend::cuda::driver_present() {
        eprintln!("skipping: a CUDA driver is present");
        return;
    }
    let out = cli(dir(), &["doctor"], b"");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("CPU backend:  ready"), "{}", out.stdout);
    assert!(out.stdout.contains("CUDA:         absent") || out.stdout.contains("no driver"));
    let json = cli(dir(), &["doctor", "--json"], b"");
    assert_eq!(json.code, 0, "{json:?}");
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["cpu_ready"], true);
    assert_eq!(v["problems"], serde_json::json!([]));
}

#[test]
fn a_first_token_at_the_end_of_sequence_is_explained() {
    // Every logit 0: greedy decoding picks token 0, which this model calls end-of-sequence.
    let m = write_tiny(
        dir(),
        "eos-first.gguf",
        &Tiny {
            output_norm: 0.0,
            eos_id: 0,
            ..Tiny::default()
        },
    );
    let m = m.display().to_string();
    let out = cli(
        dir(),
        &["generate", "--model", &m, "--backend", "cpu", "hi"],
        b"",
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "", "no empty line");
    assert!(
        out.stderr
            .contains("stopped at the end-of-sequence token before any text")
            && out.stderr.contains("--chat"),
        "{}",
        out.stderr
    );
}

#[test]
fn chat_on_a_model_without_a_template_says_what_to_do() {
    let m = tiny();
    let args = [
        "generate",
        "--model",
        &m,
        "--backend",
        "cpu",
        "--chat",
        "-n",
        "1",
        "hi",
    ];
    let line = one_error_line(&args, &cli(dir(), &args, b""), "no chat template");
    assert!(line.contains("without --chat"), "{line}");
}

#[test]
fn tokenize_shows_the_text_of_each_token() {
    let m = tiny();
    let out = cli(dir(), &["tokenize", "--model", &m, "a b\u{e9}"], b"");
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    // Byte-level tokens: `a`, a space (`Ġ` in the vocabulary), `b`, and the two bytes of `é`.
    assert_eq!(lines.len(), 5, "{}", out.stdout);
    assert!(lines[1].ends_with("  \" \""), "{}", lines[1]);
    assert!(lines[3].ends_with("  \"\\xC3\""), "{}", lines[3]);
    assert!(!out.stdout.contains('\u{120}'), "{}", out.stdout);
    let json = cli(dir(), &["tokenize", "--json", "--model", &m, "a b"], b"");
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["text"], serde_json::json!(["a", " ", "b"]));
    assert_eq!(v["tokens"][1], "\u{120}");
}

#[test]
fn a_sampled_run_without_a_seed_prints_its_random_seed() {
    let m = tiny();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "--json",
            "--ignore-eos",
            "--temperature",
            "1.5",
            "-n",
            "24",
        ];
        args.extend_from_slice(extra);
        args.push("hi");
        let out = cli(dir(), &args, b"");
        assert_eq!(out.code, 0, "{out:?}");
        let v: serde_json::Value =
            serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
        (v, out.stderr)
    };
    let (first, err) = run(&[]);
    let seed = first["seed"].as_u64().expect("a seed in --json");
    assert!(
        err.contains(&format!("seed {seed} (pass --seed {seed}")),
        "{err}"
    );
    let (second, _) = run(&[]);
    assert_ne!(second["seed"], first["seed"], "two runs drew the same seed");
    // The printed seed repeats the run, and says nothing more on stderr about seeds.
    let seed_arg = seed.to_string();
    let (again, err) = run(&["--seed", &seed_arg]);
    assert_eq!(again["generated_ids"], first["generated_ids"]);
    assert_eq!(again["seed"], first["seed"]);
    assert!(!err.contains("pass --seed"), "{err}");
}

#[test]
fn graph_stats_report_the_shape_of_the_dependency_dag() {
    let m = tiny();
    for fusion in [&[][..], &["--no-fusion"][..]] {
        let mut args = vec!["graph", "--json", "--model", &m];
        args.extend_from_slice(fusion);
        let out = cli(dir(), &args, b"");
        assert_eq!(out.code, 0, "{out:?}");
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let count = |key: &str| v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"));
        let (dispatches, path, widest) = (
            count("dispatches"),
            count("critical_path"),
            count("widest_level"),
        );
        // The levels hold every dispatch: at most `widest` in each of `path` levels.
        assert!(path >= 1 && path <= dispatches, "{v}");
        assert!(widest >= 1 && path * widest >= dispatches, "{v}");
        // A dispatch past level 0 waits for at least one other.
        assert!(count("edges") >= path - 1, "{v}");
    }
    let text = cli(dir(), &["graph", "--stats", "--model", &m], b"");
    assert_eq!(text.code, 0, "{text:?}");
    assert!(text.stdout.contains("critical path"), "{}", text.stdout);
}

#[test]
fn graph_reports_the_fusions_each_backend_declares_without_its_hardware() {
    let m = tiny();
    // On either backend (CUDA is stood in for by the CPU where no GPU is), the tiny model's
    // blocks fuse into the attention input, the MLP input and two products with their adds.
    for backend in ["cpu", "cuda"] {
        let args = ["graph", "--json", "--model", &m, "--backend", backend];
        let out = cli(dir(), &args, b"");
        assert_eq!(out.code, 0, "{out:?}");
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let by_rule = &v["fusions_by_rule"];
        for (rule, per_layer) in [
            ("rms_norm+qkv+rope+kv_write", 1),
            ("rms_norm+gate_up+glu", 1),
            ("matmul+add", 2),
        ] {
            let want = (per_layer * common::N_LAYER) as u64;
            assert_eq!(by_rule[rule].as_u64(), Some(want), "{backend}: {v}");
        }
    }
    // The rules of a backend, listed without a model or a device.
    let out = cli(dir(), &["graph", "--rules", "--backend", "cuda"], b"");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("rms_norm+qkv+rope+kv_write") && out.stdout.contains("up to 1 rows"),
        "{}",
        out.stdout
    );
    let json = cli(
        dir(),
        &["graph", "--rules", "--json", "--backend", "cpu"],
        b"",
    );
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["rules"].as_array().map(Vec::len), Some(11), "{v}");
    let names: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["rule"].as_str())
        .collect();
    assert!(names.contains(&"rms_norm+add"), "{v}");
    assert!(names.contains(&"rms_norm+rope"), "{v}");
    assert!(names.contains(&"rms_norm+qkv"), "{v}");
    assert!(names.contains(&"rms_norm_rope+kv_write"), "{v}");
    assert_eq!(names.last(), Some(&"rope_kv"), "{v}");
    // The gate/up/SwiGLU rule matches what the narrowing makes: the one rule of the late stage.
    let late: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["after_narrowing"].as_bool() == Some(true))
        .filter_map(|r| r["rule"].as_str())
        .collect();
    assert_eq!(late, ["matmul_swiglu"], "{v}");
}

#[test]
fn bench_takes_the_synthetic_format_and_reports_bandwidth_per_op_kind() {
    let trace = dir().join("bench-trace.json");
    let trace_arg = trace.to_str().unwrap();
    let args = [
        "bench",
        "--like",
        "smollm2",
        "--quant",
        "q8_0",
        "--backend",
        "cpu",
        "--json",
        "-p",
        "2",
        "-n",
        "1",
        "--repeat",
        "1",
        "--trace",
        trace_arg,
    ];
    let out = cli(dir(), &args, b"");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("q8_0"), "{}", out.stderr);
    // The trace holds the profiled decode step and the profiled prompt pass, each with kernels.
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().expect("traceEvents");
    for what in ["decode step", "prompt pass"] {
        let pid = events
            .iter()
            .find(|e| e["ph"] == "M" && e["args"]["name"].as_str().unwrap_or("").contains(what))
            .unwrap_or_else(|| panic!("no {what} in the trace"))["pid"]
            .clone();
        let kernels = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .count();
        assert!(kernels > 0, "the {what} has no kernels");
    }
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    // The weights a decode step reads: 30 layers of two f32 norms (576 values) and seven Q8_0
    // matrices (34 bytes a 32 values: q and o 576 x 576, k and v 192 x 576, gate and up 1536 x
    // 576, down 576 x 1536), the final norm, the Q8_0 embedding table whole as the head and
    // one row of it for the token.
    let layer = 2 * 576 * 4 + (2 * 576 + 2 * 192 + 2 * 1536) * 18 * 34 + 576 * 48 * 34;
    let table = 49_152 * 18 * 34;
    let weights = 30 * layer + 576 * 4 + table + 18 * 34;
    assert_eq!(v[0]["decode_weight_bytes"], weights, "{}", v[0]);
    let tb = v[0]["decode_tb_per_s"].as_f64().unwrap();
    let us = v[0]["gpu_us_per_token"].as_f64().unwrap();
    assert!(
        (tb * us * 1e6 / weights as f64 - 1.0).abs() < 1e-9,
        "{tb} TB/s"
    );
    assert!(
        v[0]["device"].as_str().unwrap().starts_with("cpu"),
        "{}",
        v[0]
    );
    let per_op = v[0]["per_op"].as_array().expect("per_op");
    let op = |name: &str| per_op.iter().find(|o| o["op"] == name).cloned();
    let matmul = op("matmul").expect("a matmul entry");
    assert!(
        matmul["gb_per_s"].as_f64().is_some_and(|g| g > 0.0),
        "{matmul}"
    );
    // A decode step's attention: GB/s over the K and V rows it reads at its length, here the
    // query at position 2 over 3 keys: 2 (K, V) x 3 KV heads x 64 x 4 bytes (the CPU's f32
    // cache) x 3 keys x 30 layers.
    let attention = op("attention").expect("attention");
    let gb = attention["gb_per_s"].as_f64().expect("attention GB/s");
    let us = attention["total_us"].as_f64().unwrap();
    assert!((gb * us * 1e3 - 138_240.0).abs() < 1.0, "{attention}");
    // A prompt pass's attention declares its whole cache: no bandwidth figure.
    let prefill = v[0]["prefill_per_op"].as_array().expect("prefill_per_op");
    let prompt_attention = prefill.iter().find(|o| o["op"] == "attention").unwrap();
    assert!(prompt_attention["gb_per_s"].is_null(), "{prompt_attention}");
    // The same step per kernel: every launch in one kernel's entry, a kernel's op kind with it.
    let per_kernel = v[0]["per_kernel"].as_array().expect("per_kernel");
    let launches = |list: &[serde_json::Value]| -> u64 {
        list.iter().map(|o| o["kernels"].as_u64().unwrap()).sum()
    };
    assert_eq!(launches(per_kernel), launches(per_op));
    assert!(
        per_kernel.iter().any(|o| o["op"] == "matmul"
            && o["kernel"]
                .as_str()
                .is_some_and(|k| k.starts_with("matmul"))),
        "{per_kernel:?}"
    );
    assert!(per_op.iter().all(|o| o.get("kernel").is_none()));
    // The format needs a synthetic model to apply to.
    let out = cli(dir(), &["bench", "--quant", "q4_0"], b"");
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("--like"), "{}", out.stderr);
    // So does a head format, and only a shape whose head is not its embedding takes one.
    let out = cli(dir(), &["bench", "--head", "q6_k"], b"");
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("--like"), "{}", out.stderr);
    let tied = "bench --like smollm2 --head q6_k --backend cpu -p 2 -n 1 --repeat 1";
    let out = cli(dir(), &tied.split_whitespace().collect::<Vec<_>>(), b"");
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("is its embedding"), "{}", out.stderr);
    // Llama 3's RoPE frequency factors: with a synthetic model, and only of a Llama shape.
    let out = cli(dir(), &["bench", "--rope-freqs"], b"");
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("--like"), "{}", out.stderr);
    let gemma = "bench --like gemma3-270m --rope-freqs --backend cpu -p 2 -n 1 --repeat 1";
    let out = cli(dir(), &gemma.split_whitespace().collect::<Vec<_>>(), b"");
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("not a Llama shape"), "{}", out.stderr);
    let mixed = [
        "synth",
        "--like",
        "llama-3.1-8b",
        "--quant",
        "q4_k_m",
        "--head",
        "q8_0",
        "-o",
    ];
    let file = dir().join("never-written.gguf");
    let mut args = mixed.to_vec();
    args.push(file.to_str().unwrap());
    let out = cli(dir(), &args, b"");
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("sets its own head format"),
        "{}",
        out.stderr
    );
    assert!(!file.exists());
    // A layer count outside 1..=512 names the flag and writes nothing.
    for layers in ["0", "513"] {
        let args = ["synth", "--like", "smollm2", "--layers", layers, "-o"];
        let mut args = args.to_vec();
        args.push(file.to_str().unwrap());
        let out = cli(dir(), &args, b"");
        assert_ne!(out.code, 0);
        assert!(out.stderr.contains("--layers"), "{}", out.stderr);
        assert!(!file.exists());
    }
}

#[test]
fn bench_timeline_on_the_cpu_says_it_needs_cuda_before_any_work() {
    let out_file = dir().join("bench-timeline.json");
    let model = tiny();
    let mut args: Vec<&str> = "bench --backend cpu -p 2 -n 1 --repeat 1 --model"
        .split_whitespace()
        .collect();
    args.extend([model.as_str(), "--timeline", out_file.to_str().unwrap()]);
    let out = cli(dir(), &args, b"");
    assert_ne!(out.code, 0, "{out:?}");
    let err = &out.stderr;
    assert!(
        err.contains("--timeline") && err.contains("CUDA backend"),
        "{err}"
    );
    assert!(!out.stdout.contains("decode tok/s"), "{}", out.stdout);
    assert!(!out_file.exists(), "no timeline written");
}
