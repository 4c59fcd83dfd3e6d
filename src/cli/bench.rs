//! `onepass bench`: prefill and decode speed, median and spread over repeats.

use std::time::Instant;

use clap::Args;
use onepass::model::llama::Logits;

use super::common::{load, ModelArgs, RunArgs};

/// Flags of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Decode steps per repeat.
    #[arg(short = 'n', long = "decode", default_value_t = 128)]
    pub decode: usize,
    /// Prompt tokens per repeat.
    #[arg(short = 'p', long = "prompt", default_value_t = 512)]
    pub prompt: usize,
    /// Measured repeats (after one warm-up that is not counted).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut v: Vec<f64>) -> Spread {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Spread { median, min: v[0], max: v[n - 1] }
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.repeat == 0 || args.prompt == 0 {
        anyhow::bail!("--repeat and --prompt must be at least 1");
    }
    let mut run = args.run.clone();
    run.ctx = run.ctx.max(args.prompt + args.decode + 1);
    let mut loaded = load(&args.model, &run)?;
    let engine = &mut loaded.engine;
    let vocab = engine.llama().config().vocab as u64;
    // Seeded pseudo-random prompt tokens (speed does not depend on which tokens).
    let mut state = 0x1234_5678_9abc_def0u64;
    let prompt: Vec<u32> = (0..args.prompt)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab) as u32
        })
        .collect();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for rep in 0..=args.repeat {
        let t0 = Instant::now();
        engine.prefill(&prompt, Logits::Last)?;
        let p = t0.elapsed().as_secs_f64();
        let mut token = prompt[prompt.len() - 1];
        let t1 = Instant::now();
        for i in 0..args.decode {
            token = engine.decode(token, prompt.len() + i, true)?.unwrap_or(token);
        }
        let d = t1.elapsed().as_secs_f64();
        if rep > 0 {
            prefill.push(args.prompt as f64 / p);
            if args.decode > 0 {
                decode.push(args.decode as f64 / d);
            }
        }
    }
    let prefill = spread(prefill);
    let decode = if decode.is_empty() { None } else { Some(spread(decode)) };
    let device = engine.llama().device().name();
    let mode = engine.mode().name();
    if args.json {
        let obj = serde_json::json!({
            "model": args.model.model,
            "device": device,
            "mode": mode,
            "prompt_tokens": args.prompt,
            "decode_tokens": args.decode,
            "repeat": args.repeat,
            "prefill_tok_s": prefill.median,
            "prefill_tok_s_spread": prefill,
            "decode_tok_s": decode.map(|d| d.median),
            "decode_tok_s_spread": decode,
        });
        println!("{obj}");
    } else {
        println!("model {}  device {device}  mode {mode}  repeats {}", args.model.model, args.repeat);
        println!(
            "prefill {:>5} tokens  {:>9.1} tok/s  (min {:.1}, max {:.1})",
            args.prompt, prefill.median, prefill.min, prefill.max
        );
        if let Some(d) = decode {
            println!(
                "decode  {:>5} tokens  {:>9.1} tok/s  (min {:.1}, max {:.1})",
                args.decode, d.median, d.min, d.max
            );
        }
    }
    Ok(())
}
