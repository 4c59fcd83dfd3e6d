//! `onepass generate`: stream text from a prompt.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use onepass::model::chat::{ChatMessage, ChatTemplate};
use onepass::model::llama::Logits;
use onepass::model::sampler::SamplerConfig;
use onepass::sanitize::prefill_and_sanitize_decode;
use onepass::Executor;

use super::common::{load, ModelArgs, RunArgs};

/// Flags of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt (read from standard input when absent).
    pub prompt: Option<String>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one (0: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalty for tokens seen recently (1: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep generating after an end-of-generation token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (ids, text, speeds) on the last line of standard output.
    #[arg(long)]
    pub json: bool,
    /// Write the logits of the last prompt position to FILE (raw little-endian f32).
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// After generating, profile one decode step (each kernel timed) and write it to FILE as a
    /// Chrome-trace JSON (opens in Perfetto).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Before generating, run the first decode step serially and optimized with dead scratch
    /// poisoned and compare the outputs bitwise; print the verdict on standard error and stop
    /// with an error on a mismatch.
    #[arg(long)]
    pub sanitize: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Reads the prompt from the argument or from standard input.
fn prompt_text(arg: Option<String>) -> anyhow::Result<String> {
    let text = match arg {
        Some(t) => t,
        None => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("reading the prompt from standard input")?;
            String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "the prompt on standard input is not valid UTF-8 (byte {})",
                    e.utf8_error().valid_up_to()
                )
            })?
        }
    };
    if text.is_empty() {
        bail!("the prompt is empty: pass a prompt as an argument or on standard input");
    }
    Ok(text)
}

/// Runs `generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let sampler = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplerConfig::default()
    };
    sampler.validate()?;
    let text = prompt_text(args.prompt)?;
    let mut loaded = load(&args.model, &args.run)?;
    let tok = &loaded.tokenizer;
    let text = if args.chat {
        let template = ChatTemplate::from_gguf(&loaded.file, tok)?
            .ok_or_else(|| anyhow::anyhow!("--chat: the model has no chat template"))?;
        template.render(&[ChatMessage::user(text)], true)?
    } else {
        text
    };
    let prompt_ids = tok.encode(&text, true)?;
    if prompt_ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let stop_ids = if args.ignore_eos {
        Vec::new()
    } else {
        tok.eog_ids().to_vec()
    };
    if args.sanitize {
        let llama = loaded.engine.llama();
        let executor = Executor::new(llama.device().clone()).with_config(args.run.config());
        let report =
            prefill_and_sanitize_decode(llama, &executor, &executor.config().plan(), &prompt_ids)?;
        if !report.passed() {
            bail!("{}", report.verdict());
        }
        eprintln!("{}", report.verdict());
    }
    let engine = &mut loaded.engine;
    if let Some(path) = &args.logits_out {
        engine.prefill(&prompt_ids, Logits::Last)?;
        let logits = engine.logits(1)?;
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let stream = !args.json;
    let mut out = std::io::stdout().lock();
    let mut decoder = tok.stream_decoder().skip_special(true);
    let stats = engine.generate(&prompt_ids, args.max_tokens, &sampler, &stop_ids, |id| {
        if stream {
            let piece = decoder.push(id)?;
            // A closed stdout (a pipe into `head`) ends the output, not the run.
            let _ = out.write_all(piece.as_bytes()).and_then(|()| out.flush());
        }
        Ok(())
    })?;
    let text = tok.decode_skip_special(&stats.generated_ids)?;
    if let Some(path) = &args.trace {
        let last = stats
            .generated_ids
            .last()
            .copied()
            .unwrap_or(prompt_ids[prompt_ids.len() - 1]);
        let pos = (stats.prompt_ids.len() + stats.generated_ids.len()).saturating_sub(1);
        if pos < engine.llama().max_ctx() {
            let kernels = engine.profile_decode(last, pos, true)?;
            let name = format!(
                "decode step at position {pos}, {} mode",
                engine.mode().name()
            );
            onepass::trace::write_chrome_trace(
                path,
                &[onepass::trace::Timeline { name, kernels }],
            )?;
            eprintln!(
                "wrote the trace of one profiled decode step to {}",
                path.display()
            );
        } else {
            eprintln!("no trace: the context is full");
        }
    }
    if stream {
        let _ = out.write_all(decoder.finish().as_bytes());
        writeln!(out)?;
    } else {
        let obj = serde_json::json!({
            "prompt_ids": stats.prompt_ids,
            "generated_ids": stats.generated_ids,
            "text": text,
            "prompt_tok_s": stats.prompt_tok_s,
            "decode_tok_s": stats.decode_tok_s,
            "stopped_at_eos": stats.stopped_at_eos,
            "mode": engine.mode().name(),
        });
        writeln!(out, "{obj}")?;
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s ({}, {})",
        stats.prompt_ids.len(),
        stats.prompt_tok_s,
        stats.generated_ids.len(),
        stats.decode_tok_s,
        engine.llama().device().name(),
        engine.mode().name(),
    );
    Ok(())
}
