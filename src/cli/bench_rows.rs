//! `onepass bench --rows 1,4,16,32`: batched decode steps as `onepass serve` runs them, without
//! the HTTP side. Every row is a sequence of its own slot, prefilled with the same prompt; the
//! table gives each row count's step time, aggregate and per-row tokens per second and the ratio
//! to one row, the time one prompt prefill takes (what a server's turn adds to the running
//! streams' inter-token latency), and a per-op profile of the largest step.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use onepass::config::RunMode;
use onepass::model::batch::BatchEngine;
use onepass::model::gguf::GgufFile;
use onepass::model::slots::{Pick, RowDraw, RowOutput, SlotModel, StepRow};
use onepass::model::transformer::Transformer;
use onepass::sampler::device::DrawState;
use onepass::sampler::{Sampler, SamplerConfig};
use onepass::trace::Timeline;
use onepass::{Device, Executor};

use super::bench::{pseudo_random_prompt, spread, write_op_table, BenchArgs, OpJson, Spread};
use super::common::load_with_prefill_rows;

/// One row count's figures.
#[derive(Debug, Clone, serde::Serialize)]
struct RowsResult {
    rows: usize,
    /// Wall time of one step, median over the repeats, milliseconds.
    step_ms: f64,
    step_ms_spread: Spread,
    /// Tokens per second of all rows together.
    aggregate_tok_s: f64,
    /// Tokens per second of one row.
    per_row_tok_s: f64,
    /// Aggregate over the one-row aggregate (when 1 is among the row counts).
    speedup: Option<f64>,
}

/// The whole batched run, as `--json` prints it.
#[derive(Debug, Clone, serde::Serialize)]
struct BatchJson {
    mode: &'static str,
    prompt_tokens: usize,
    /// Wall time of one slot's prompt prefill, median over the slots, milliseconds.
    prefill_ms: f64,
    /// The same prefill after the steps' graphs were built, milliseconds.
    prefill_after_ms: f64,
    steps: Vec<RowsResult>,
    /// One profiled step of the largest row count, per op kind.
    per_op: Vec<OpJson>,
}

/// Runs the batched-decode benchmark on `file` with `mode`.
pub(super) fn run(
    args: &BenchArgs,
    file: Arc<GgufFile>,
    model_name: &str,
    device: &Device,
    executor: Executor,
    mode: RunMode,
    ctx: usize,
) -> anyhow::Result<()> {
    let max = args.rows.iter().copied().max().unwrap_or(1);
    if args.rows.contains(&0) || max > 32 {
        anyhow::bail!("--rows takes row counts from 1 to 32, got {:?}", args.rows);
    }
    let model = load_with_prefill_rows(&args.run, device, |rows| {
        let options = args.run.load_options(ctx, rows).with_slots(max, max);
        Transformer::load_with(file.clone(), device, &options)
    })?;
    let mut engine = BatchEngine::new(model, executor, mode)?;
    let prompt = pseudo_random_prompt(args.prompt, engine.vocab() as u64);
    let mut prefill = Vec::new();
    let mut last = Vec::new();
    for slot in 0..max {
        let t = Instant::now();
        let mut logits = Vec::new();
        for (i, chunk) in prompt.chunks(engine.max_chunk()).enumerate() {
            logits = engine.prefill(slot, chunk, i * engine.max_chunk())?;
        }
        prefill.push(t.elapsed().as_secs_f64() * 1e3);
        last.push(greedy(&logits));
    }
    let prefill_ms = spread(prefill).median;
    if !(args.rows_temperature.is_finite() && args.rows_temperature >= 0.0) {
        anyhow::bail!(
            "--rows-temperature must be a finite number >= 0, got {}",
            args.rows_temperature
        );
    }
    let config = SamplerConfig {
        temperature: args.rows_temperature,
        ..SamplerConfig::default()
    };
    // Each row's sampler (a seed a slot) and history: the prompt, then its tokens.
    let samplers = || -> anyhow::Result<Vec<(Sampler, Vec<u32>)>> {
        (0..max)
            .map(|slot| {
                let cfg = SamplerConfig {
                    seed: slot as u64,
                    ..config.clone()
                };
                let history = [prompt.as_slice(), &[last[slot]]].concat();
                Ok((Sampler::new(cfg)?, history))
            })
            .collect()
    };
    let pick = |sampler: &Sampler, history: &[u32]| -> anyhow::Result<Pick> {
        Ok(if config.temperature == 0.0 {
            Pick::Greedy
        } else if args.rows_on_host {
            Pick::Logits
        } else {
            let state = DrawState::new(sampler.config(), sampler.state(), history.len())?;
            Pick::Draw(RowDraw::new(state, history))
        })
    };
    let rows_of = |n: usize, step: usize, tokens: &[u32]| -> Vec<StepRow> {
        (0..n)
            .map(|slot| StepRow {
                slot,
                token: tokens[slot],
                pos: prompt.len() + step,
                pick: Pick::Greedy,
            })
            .collect()
    };
    let mut steps = Vec::new();
    for &n in &args.rows {
        let mut times = Vec::new();
        for rep in 0..=args.repeat {
            let mut tokens = last.clone();
            let mut rows_state = samplers()?;
            let t = Instant::now();
            for step in 0..args.decode.max(1) {
                let mut rows = rows_of(n, step, &tokens);
                for (row, (sampler, history)) in rows.iter_mut().zip(&rows_state) {
                    row.pick = pick(sampler, history)?;
                }
                let out = engine.decode(&rows)?;
                for (slot, o) in out.into_iter().enumerate() {
                    let (sampler, history) = &mut rows_state[slot];
                    tokens[slot] = match o {
                        RowOutput::Token(id) => id,
                        RowOutput::Logits(logits) => sampler.sample(&logits, history)?,
                        RowOutput::Drawn { token, rng } => {
                            sampler.set_state(rng);
                            token
                        }
                    };
                    history.push(tokens[slot]);
                }
            }
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64() * 1e3 / args.decode.max(1) as f64);
            }
        }
        let step = spread(times);
        steps.push(RowsResult {
            rows: n,
            step_ms: step.median,
            step_ms_spread: step,
            aggregate_tok_s: n as f64 * 1e3 / step.median,
            per_row_tok_s: 1e3 / step.median,
            speedup: None,
        });
    }
    let one = steps
        .iter()
        .find(|s| s.rows == 1)
        .map(|s| s.aggregate_tok_s);
    for s in &mut steps {
        s.speedup = one.map(|o| s.aggregate_tok_s / o);
    }
    let min = args.rows.iter().copied().min().unwrap_or(1);
    let small = engine.profile_decode(&rows_of(min, 0, &last))?;
    let kernels = engine.profile_decode(&rows_of(max, 0, &last))?;
    // A prefill once the steps' graphs exist (the server's case).
    let t = Instant::now();
    for (i, chunk) in prompt.chunks(engine.max_chunk()).enumerate() {
        engine.prefill(0, chunk, i * engine.max_chunk())?;
    }
    let prefill_after_ms = t.elapsed().as_secs_f64() * 1e3;
    let result = BatchJson {
        mode: mode.name(),
        prompt_tokens: prompt.len(),
        prefill_ms,
        prefill_after_ms,
        steps,
        per_op: OpJson::of(&kernels),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&result)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "model {model_name}  device {}  mode {}  prompt {}  steps {}  repeats {}",
        device.name(),
        result.mode,
        prompt.len(),
        args.decode.max(1),
        args.repeat
    )?;
    writeln!(
        out,
        "prefill of one slot's {} prompt tokens: {:.2} ms (median over {max} slots), {:.2} ms \
         once the steps' graphs exist",
        prompt.len(),
        result.prefill_ms,
        result.prefill_after_ms
    )?;
    writeln!(
        out,
        "{:>5} {:>10} {:>19} {:>14} {:>12} {:>10}",
        "rows", "step ms", "(min..max)", "aggregate t/s", "per-row t/s", "x 1 row"
    )?;
    for s in &result.steps {
        writeln!(
            out,
            "{:>5} {:>10.3} {:>19} {:>14.1} {:>12.1} {:>10}",
            s.rows,
            s.step_ms,
            format!("({:.3}..{:.3})", s.step_ms_spread.min, s.step_ms_spread.max),
            s.aggregate_tok_s,
            s.per_row_tok_s,
            s.speedup.map_or("-".into(), |x| format!("{x:.2}"))
        )?;
    }
    for (rows, ks) in [(min, &small), (max, &kernels)] {
        let mut slowest: Vec<_> = ks.iter().collect();
        slowest.sort_by(|a, b| b.dur_us.total_cmp(&a.dur_us));
        writeln!(out, "\nslowest dispatches of a step of {rows} rows:")?;
        for k in slowest.iter().take(8) {
            writeln!(
                out,
                "  {:<24} {:>9.1} us {:>12} bytes {:>8.0} GB/s",
                k.kernel,
                k.dur_us,
                k.bytes,
                k.bytes as f64 / (k.dur_us * 1e3).max(1e-9)
            )?;
        }
    }
    let small = Timeline {
        name: format!("batched step of {min} rows, {} mode", result.mode),
        kernels: small,
    };
    write_op_table(&mut out, "batched decode step", &small, None)?;
    let timeline = Timeline {
        name: format!("batched step of {max} rows, {} mode", result.mode),
        kernels,
    };
    write_op_table(&mut out, "batched decode step", &timeline, None)?;
    Ok(())
}

/// The index of the largest logit (the first one on ties).
fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}
