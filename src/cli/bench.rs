//! `onepass bench`: prefill and decode speed of one or several execution modes, side by side,
//! on a model file or on a synthetic model of a known shape made on the fly.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use onepass::config::RunMode;
use onepass::model::budget::{decode_kv_read_bytes, decode_weight_bytes};
use onepass::model::engine::Engine;
use onepass::model::gguf::GgufFile;
use onepass::model::synth::{write_synthetic, MatrixFormats, SynthShape, SynthSpec};
use onepass::model::transformer::{Logits, Transformer};
use onepass::trace::{kernel_summary, op_summary, write_chrome_trace, OpTime, Timeline};
use onepass::DType;
use onepass::Executor;

use super::common::{
    check_output_path, count, load_with_prefill_rows, open_device, open_model, ModelArgs, RunArgs,
};
use super::synth::{head_format, SynthQuant};

/// Flags of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Instead of `--model`, a synthetic model of this shape, written to a temporary file.
    #[arg(long, value_enum)]
    pub like: Option<SynthShape>,
    /// Format of the synthetic model's matrices (with `--like`).
    #[arg(long, value_enum, default_value_t = SynthQuant::Q4_1, requires = "like")]
    pub quant: SynthQuant,
    /// Format of the synthetic model's output head, where it differs from the matrices' (as
    /// `synth --head`; with `--like` of a shape whose head is not its embedding: llama-3.1-8b).
    #[arg(long, value_name = "FORMAT", value_parser = head_format, requires = "like")]
    pub head: Option<DType>,
    /// Give the synthetic model Llama 3's RoPE frequency factors (as `synth --rope-freqs`; with
    /// `--like` of a Llama shape): the path llama.cpp's Llama 3.1 and 3.2 files take.
    #[arg(long, requires = "like")]
    pub rope_freqs: bool,
    /// Modes to measure, comma-separated (default: the `--mode` flag's).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<RunMode>,
    /// Decode steps per repeat.
    #[arg(short = 'n', long = "decode", default_value_t = 128,
          allow_negative_numbers = true, value_parser = count)]
    pub decode: usize,
    /// Prompt tokens per repeat.
    #[arg(short = 'p', long = "prompt", default_value_t = 512,
          allow_negative_numbers = true, value_parser = count)]
    pub prompt: usize,
    /// Measured repeats (after one warm-up that is not counted).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = count)]
    pub repeat: usize,
    /// Print the results as a JSON list (one object per mode).
    #[arg(long)]
    pub json: bool,
    /// Instead of one sequence, batched decode steps of these row counts (1 to 32, comma-separated),
    /// as `onepass serve` runs them: each row a sequence of its own slot.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<usize>,
    /// With `--rows`: sample every row at this temperature (a seed a row) instead of taking the
    /// most likely token, drawn on the device as `serve` draws.
    #[arg(long, value_name = "T", default_value_t = 0.0, requires = "rows")]
    pub rows_temperature: f32,
    /// With `--rows-temperature`: sample on the host from each row's logits instead (as `serve`
    /// did before rows drew on the device).
    #[arg(long, requires = "rows_temperature")]
    pub rows_on_host: bool,
    /// Write a Chrome-trace JSON (Perfetto) of one profiled decode step and one profiled prompt
    /// pass per mode.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// CUDA: write a Chrome-trace JSON (Perfetto) of one graph-mode decode step as the GPU ran it
    /// (every block's start and end, per SM; kernels compiled again with block stamps, which slow
    /// each a little) and print where its time went.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(super) struct Spread {
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
}

pub(super) fn spread(mut v: Vec<f64>) -> Spread {
    if v.is_empty() {
        return Spread::default();
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Spread {
        median,
        min: v[0],
        max: v[n - 1],
    }
}

/// One mode's figures.
#[derive(Debug, Clone, serde::Serialize)]
struct ModeResult {
    mode: &'static str,
    /// The device, as the text output's header names it.
    device: String,
    /// Bytes of weights a decode step reads ([`decode_weight_bytes`]).
    decode_weight_bytes: u64,
    /// Those bytes over the device time of a step, TB/s.
    decode_tb_per_s: f64,
    decode_tok_s: f64,
    decode_tok_s_spread: Spread,
    prefill_tok_s: f64,
    prefill_tok_s_spread: Spread,
    kernels_per_token: usize,
    edges_or_barriers_per_token: usize,
    /// Device time of one decode step (CUDA events; wall time on the CPU), median, microseconds.
    gpu_us_per_token: f64,
    /// One profiled decode step (kernels timed one by one), per op kind.
    per_op: Vec<OpJson>,
    /// The same step per kernel (`kernel` names it), largest first.
    per_kernel: Vec<OpJson>,
    /// One profiled prompt pass (the first `min(prompt, batch)` tokens), per op kind.
    prefill_per_op: Vec<OpJson>,
    /// The same pass per kernel.
    prefill_per_kernel: Vec<OpJson>,
}

/// One op kind (or one kernel) of a profiled pass.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct OpJson {
    op: &'static str,
    /// The kernel, in a per-kernel list.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel: Option<&'static str>,
    /// Launches.
    kernels: usize,
    total_us: f64,
    /// Bytes of the buffers only read or only written, over the time; for a decode step's
    /// attention the K and V rows it reads at the step's length; `None` for gathers, cache
    /// writes and a prompt pass's attention (they declare a whole cache or table).
    gb_per_s: Option<f64>,
    /// Floating-point operations of the matrix products over the time; `None` for other kinds.
    tflop_per_s: Option<f64>,
}

impl OpJson {
    /// Per op kind.
    pub(super) fn of(kernels: &[onepass::executable::KernelTiming]) -> Vec<OpJson> {
        Self::from_groups(&op_summary(kernels))
    }

    /// Per kernel.
    pub(super) fn per_kernel(kernels: &[onepass::executable::KernelTiming]) -> Vec<OpJson> {
        Self::from_groups(&kernel_summary(kernels))
    }

    /// `list` with the attention's GB/s over `bytes`, the K and V rows a decode step reads
    /// ([`decode_kv_read_bytes`]).
    pub(super) fn with_attention_reads(mut list: Vec<OpJson>, bytes: u128) -> Vec<OpJson> {
        for op in list.iter_mut().filter(|o| o.op == "attention") {
            op.gb_per_s = attention_gb_per_s(bytes, op.total_us);
        }
        list
    }

    fn from_groups(groups: &[OpTime]) -> Vec<OpJson> {
        groups
            .iter()
            .map(|op| OpJson {
                op: op.op,
                kernel: op.kernel,
                kernels: op.count,
                total_us: op.total_us,
                gb_per_s: op.gb_per_s(),
                tflop_per_s: op.tflop_per_s(),
            })
            .collect()
    }
}

/// A synthetic model in a temporary directory, removed on drop.
struct TempModel {
    dir: PathBuf,
    path: PathBuf,
    shape_name: &'static str,
}

impl TempModel {
    fn write(shape: SynthShape, quant: MatrixFormats, rope_freqs: bool) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("onepass-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("synthetic.gguf");
        let spec = SynthSpec {
            shape,
            quant,
            seed: 0,
            rope_freqs,
            layers: None,
        };
        let t = Instant::now();
        if let Err(e) = write_synthetic(&spec, None, &path, &mut |_, _| {}) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        eprintln!(
            "wrote a synthetic {shape:?} {quant} model in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        Ok(TempModel {
            dir,
            path,
            shape_name: shape.params().name,
        })
    }
}

impl Drop for TempModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.repeat == 0 || args.prompt == 0 {
        anyhow::bail!("--repeat and --prompt must be at least 1");
    }
    let config = args.run.config();
    let modes = if args.modes.is_empty() {
        vec![config.mode]
    } else {
        args.modes.clone()
    };
    let ctx = args.run.ctx.max(args.prompt + args.decode + 2);
    // Everything that can fail at once is checked before the model is written or read.
    if let Some(path) = &args.trace {
        check_output_path("--trace", path)?;
    }
    if let Some(path) = &args.timeline {
        check_output_path("--timeline", path)?;
    }
    let device = open_device(&config)?;
    if args.timeline.is_some() && !matches!(device, onepass::Device::Cuda(_)) {
        anyhow::bail!(
            "--timeline reads the GPU's block stamps: it needs the CUDA backend (on {})",
            device.name()
        );
    }
    let quant = args.quant.formats_with(args.head)?;
    let temp = args
        .like
        .map(|shape| TempModel::write(shape, quant, args.rope_freqs))
        .transpose()?;
    let (file, model_name) = match &temp {
        Some(t) => (
            Arc::new(GgufFile::open(&t.path)?),
            format!(
                "{} {quant}{}",
                t.shape_name,
                if args.rope_freqs {
                    " with rope_freqs"
                } else {
                    ""
                }
            ),
        ),
        None => (
            open_model(&args.model.model, &config)?,
            args.model.model.clone(),
        ),
    };
    let executor = Executor::new(device.clone()).with_config(config.clone());
    if !args.rows.is_empty() {
        if args.trace.is_some() || args.timeline.is_some() {
            anyhow::bail!(
                "--trace and --timeline show one sequence's steps; leave them out with --rows"
            );
        }
        return super::bench_rows::run(&args, file, &model_name, &device, executor, modes[0], ctx);
    }
    let llama = load_with_prefill_rows(&args.run, &device, |rows| {
        Transformer::load_with(file.clone(), &device, &args.run.load_options(ctx, rows))
    })?;
    let mut engine = Engine::new(llama, executor, modes[0]);
    let prompt = pseudo_random_prompt(args.prompt, engine.model().config().vocab as u64);

    // The K and V rows the profiled step (the query at the prompt's end) reads.
    let kv_elem = args.run.kv_cache.dtype(&device).block_bytes() as u128;
    let kv_read = decode_kv_read_bytes(engine.model().config(), prompt.len() + 1, kv_elem);
    let weight_bytes = decode_weight_bytes(&file);
    let mut results = Vec::new();
    let mut timelines = Vec::new();
    let mut prefill_timelines = Vec::new();
    for &mode in &modes {
        engine.set_mode(mode);
        let mut result = measure(&mut engine, &prompt, &args)?;
        result.device = device.name();
        result.decode_weight_bytes = weight_bytes as u64;
        result.decode_tb_per_s = weight_bytes as f64 / (result.gpu_us_per_token * 1e6);
        let pos = prompt.len();
        let kernels = engine.profile_decode(prompt[pos - 1], pos, true)?;
        result.per_op = OpJson::with_attention_reads(OpJson::of(&kernels), kv_read);
        result.per_kernel = OpJson::per_kernel(&kernels);
        let pass = &prompt[..prompt.len().min(engine.model().max_batch())];
        let prefill_kernels = engine.profile_prefill(pass)?;
        result.prefill_per_op = OpJson::of(&prefill_kernels);
        result.prefill_per_kernel = OpJson::per_kernel(&prefill_kernels);
        results.push(result);
        timelines.push(Timeline {
            name: format!("decode step, {} mode", mode.name()),
            kernels,
        });
        prefill_timelines.push(Timeline {
            name: format!("prompt pass of {} tokens, {} mode", pass.len(), mode.name()),
            kernels: prefill_kernels,
        });
    }
    drop(engine);
    if let Some(path) = &args.timeline {
        super::bench_timeline::run(&args, &config, file.clone(), &prompt, path)?;
    }
    if let Some(path) = &args.trace {
        let all: Vec<Timeline> = timelines
            .iter()
            .chain(&prefill_timelines)
            .cloned()
            .collect();
        write_chrome_trace(path, &all)?;
        eprintln!(
            "wrote the trace of {} profiled decode step(s) and prompt pass(es) to {}",
            all.len(),
            path.display()
        );
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&results)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "model {model_name}  device {}  prompt {}  decode {}  repeats {}",
        device.name(),
        args.prompt,
        args.decode,
        args.repeat
    )?;
    writeln!(
        out,
        "{:<12} {:>12} {:>19} {:>12} {:>9} {:>15} {:>12}",
        "mode",
        "decode tok/s",
        "(min..max)",
        "prefill t/s",
        "kernels",
        "edges/barriers",
        "device us/tok"
    )?;
    for r in &results {
        writeln!(
            out,
            "{:<12} {:>12.1} {:>19} {:>12.1} {:>9} {:>15} {:>12.1}",
            r.mode,
            r.decode_tok_s,
            format!(
                "({:.1}..{:.1})",
                r.decode_tok_s_spread.min, r.decode_tok_s_spread.max
            ),
            r.prefill_tok_s,
            r.kernels_per_token,
            r.edges_or_barriers_per_token,
            r.gpu_us_per_token
        )?;
    }
    let rates: Vec<String> = results
        .iter()
        .map(|r| format!("{} {:.2} TB/s", r.mode, r.decode_tb_per_s))
        .collect();
    writeln!(
        out,
        "weights a decode step reads: {:.3} GB ({} at the device time a step)",
        weight_bytes as f64 / 1e9,
        rates.join(", ")
    )?;
    for (what, timeline, attention) in [
        ("decode step", timelines.last(), Some(kv_read)),
        ("prompt pass", prefill_timelines.last(), None),
    ] {
        if let Some(t) = timeline {
            write_op_table(&mut out, what, t, attention)?;
        }
    }
    writeln!(
        out,
        "  (GB/s: bytes of the buffers only read or only written, over the time; a decode \
         step's attention: the K and V rows it reads at its length; gathers, cache writes and a \
         prompt's attention touch a run-time part of what they declare: -. TFLOP/s: the matrix \
         products' 2 rows k n operations over the time)"
    )?;
    Ok(())
}

/// GB/s of `bytes` read in `total_us` microseconds (`None` for no time).
fn attention_gb_per_s(bytes: u128, total_us: f64) -> Option<f64> {
    (total_us > 0.0).then(|| bytes as f64 / total_us / 1e3)
}

/// The per-op-kind time of one profiled pass, largest first, with the GB/s and TFLOP/s achieved;
/// the attention's GB/s over `attention_bytes` where given (a decode step's K and V reads).
pub(super) fn write_op_table(
    out: &mut impl Write,
    what: &str,
    t: &Timeline,
    attention_bytes: Option<u128>,
) -> anyhow::Result<()> {
    let total: f64 = t.kernels.iter().map(|k| k.dur_us).sum();
    writeln!(
        out,
        "\nper-op time of one profiled {what} ({}; kernels timed one by one): {total:.1} us",
        t.name
    )?;
    for op in op_summary(&t.kernels) {
        let gb_per_s = match attention_bytes {
            Some(bytes) if op.op == "attention" => attention_gb_per_s(bytes, op.total_us),
            _ => op.gb_per_s(),
        };
        let rate = gb_per_s.map_or("-".to_string(), |g| format!("{g:.0} GB/s"));
        let flops = op
            .tflop_per_s()
            .map_or(String::new(), |f| format!("{f:>8.2} TFLOP/s"));
        writeln!(
            out,
            "  {:<14} {:>5} kernels {:>10.1} us {:>6.1}% {:>11}{flops}",
            op.op,
            op.count,
            op.total_us,
            100.0 * op.total_us / total.max(1e-9),
            rate
        )?;
    }
    let kernels = kernel_summary(&t.kernels);
    writeln!(
        out,
        "  the kernels that take the most of it (launches x us a launch, each timed by itself):"
    )?;
    for k in kernels.iter().take(TOP_KERNELS) {
        let rate = k
            .gb_per_s()
            .map_or("-".to_string(), |g| format!("{g:.0} GB/s"));
        writeln!(
            out,
            "    {:<32} {:>5} x {:>9.2} us {:>6.1}% {:>11}",
            k.kernel.unwrap_or(k.op),
            k.count,
            k.total_us / k.count.max(1) as f64,
            100.0 * k.total_us / total.max(1e-9),
            rate
        )?;
    }
    Ok(())
}

/// Kernels listed under a profiled pass's per-op table.
const TOP_KERNELS: usize = 8;

/// Seeded pseudo-random prompt tokens (speed does not depend on which tokens).
pub(super) fn pseudo_random_prompt(n: usize, vocab: u64) -> Vec<u32> {
    let mut state = 0x1234_5678_9abc_def0u64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab) as u32
        })
        .collect()
}

/// Warm-up plus `repeat` measured rounds of prefill then greedy decode, then one round of decode
/// steps with device timing.
fn measure(engine: &mut Engine, prompt: &[u32], args: &BenchArgs) -> anyhow::Result<ModeResult> {
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut pass = onepass::model::engine::PassStats::default();
    // Greedy steps as `generate` runs them (graph mode: each step launched before the token of
    // the one before it is read back; with step timing, one step at a time).
    let decode_round = |engine: &mut Engine| -> anyhow::Result<f64> {
        let token = prompt[prompt.len() - 1];
        let t = Instant::now();
        engine.decode_greedy(token, prompt.len(), args.decode, |_| Ok(true))?;
        Ok(t.elapsed().as_secs_f64())
    };
    for rep in 0..=args.repeat {
        let t0 = Instant::now();
        engine.prefill(prompt, Logits::Last)?;
        let p = t0.elapsed().as_secs_f64();
        let d = decode_round(engine)?;
        if args.decode > 0 {
            pass = engine.last_pass();
        }
        if rep > 0 {
            prefill.push(prompt.len() as f64 / p);
            if args.decode > 0 {
                decode.push(args.decode as f64 / d);
            }
        }
    }
    engine.set_step_timing(true);
    decode_round(engine)?;
    let step = spread(engine.take_step_times());
    engine.set_step_timing(false);
    let (decode, prefill) = (spread(decode), spread(prefill));
    Ok(ModeResult {
        mode: engine.mode().name(),
        device: String::new(),
        decode_weight_bytes: 0,
        decode_tb_per_s: 0.0,
        decode_tok_s: decode.median,
        decode_tok_s_spread: decode,
        prefill_tok_s: prefill.median,
        prefill_tok_s_spread: prefill,
        kernels_per_token: pass.kernels,
        edges_or_barriers_per_token: pass.edges_or_barriers,
        gpu_us_per_token: step.median * 1e6,
        per_op: Vec::new(),
        per_kernel: Vec::new(),
        prefill_per_op: Vec::new(),
        prefill_per_kernel: Vec::new(),
    })
}
