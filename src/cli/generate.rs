//! `onepass generate`: stream text from a prompt.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use onepass::model::chat::{ChatMessage, ChatTemplate};
use onepass::model::engine::GenerateStats;
use onepass::model::sampler::SamplerConfig;
use onepass::model::transformer::Logits;
use onepass::sanitize::prefill_and_sanitize_decode;
use onepass::Executor;

use super::common::{check_output_path, count, load, seed, write_output, ModelArgs, RunArgs};

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
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128,
          allow_negative_numbers = true, value_parser = count)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0: off).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count)]
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
    /// Seed of the sampler (default: a new random seed, printed so that the run can be repeated).
    #[arg(long, allow_negative_numbers = true, value_parser = seed)]
    pub seed: Option<u64>,
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

/// What to tell a user who gave no prompt argument, before reading standard input: nothing when
/// the input is a pipe or a file, a hint when it is a terminal (else the command waits silently).
fn stdin_hint(stdin_is_terminal: bool) -> Option<&'static str> {
    stdin_is_terminal.then_some(
        "reading the prompt from standard input (end it with Ctrl-D), or pass it as an argument",
    )
}

/// Reads the prompt from the argument or from standard input.
fn prompt_text(arg: Option<String>) -> anyhow::Result<String> {
    let text = match arg {
        Some(t) => t,
        None => {
            if let Some(hint) = stdin_hint(std::io::stdin().is_terminal()) {
                eprintln!("{hint}");
            }
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

/// A seed that differs from run to run: std's randomly keyed hasher over the time and the pid.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish()
}

/// The standard-output error of a streamed piece, as the library's I/O error (a closed pipe then
/// ends the run, and the CLI exits quietly).
fn stdout_error(e: std::io::Error) -> onepass::Error {
    onepass::Error::io("standard output", e)
}

/// Runs `generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(random_seed);
    let sampler = SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed,
        ..SamplerConfig::default()
    };
    sampler.validate()?;
    for (flag, path) in [("--logits-out", &args.logits_out), ("--trace", &args.trace)] {
        if let Some(path) = path {
            check_output_path(flag, path)?;
        }
    }
    if args.seed.is_none() && !sampler.is_greedy() {
        eprintln!("seed {seed} (pass --seed {seed} to repeat this run)");
    }
    let text = prompt_text(args.prompt)?;
    let config = args.run.config();
    let mut loaded = load(&args.model, &args.run, &config)?;
    let tok = &loaded.tokenizer;
    let text = if args.chat {
        let template = ChatTemplate::from_gguf(&loaded.file, tok)?.ok_or_else(|| {
            anyhow::anyhow!(
                "--chat: the model has no chat template (no `tokenizer.chat_template` in \
                     the file; base models such as `gemma3` carry none): run without --chat to \
                     continue plain text"
            )
        })?;
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
        let llama = loaded.engine.model();
        let executor = Executor::new(llama.device().clone()).with_config(config.clone());
        let report = prefill_and_sanitize_decode(llama, &executor, &config.plan(), &prompt_ids)?;
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
        write_output("--logits-out", path, &bytes)?;
    }
    let stream = !args.json;
    let mut out = std::io::stdout().lock();
    let mut decoder = tok.stream_decoder().skip_special(true);
    let mut wrote_text = false;
    let stats = engine.generate(&prompt_ids, args.max_tokens, &sampler, &stop_ids, |id| {
        if stream {
            let piece = decoder.push(id)?;
            wrote_text |= !piece.is_empty();
            out.write_all(piece.as_bytes())
                .and_then(|()| out.flush())
                .map_err(stdout_error)?;
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
        if pos < engine.model().max_ctx() {
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
        let rest = decoder.finish();
        wrote_text |= !rest.is_empty();
        out.write_all(rest.as_bytes())?;
        if wrote_text {
            writeln!(out)?;
        }
    } else {
        let obj = serde_json::json!({
            "prompt_ids": stats.prompt_ids,
            "generated_ids": stats.generated_ids,
            "text": text,
            "prompt_tok_s": stats.prompt_tok_s,
            "decode_tok_s": stats.decode_tok_s,
            "stopped_at_eos": stats.stopped_at_eos,
            "mode": engine.mode().name(),
            "seed": seed,
        });
        writeln!(out, "{obj}")?;
    }
    out.flush()?;
    if let Some(note) = eos_note(&stats, text.is_empty(), args.chat) {
        eprintln!("{note}");
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s ({}, {})",
        stats.prompt_ids.len(),
        stats.prompt_tok_s,
        stats.generated_ids.len(),
        stats.decode_tok_s,
        engine.model().device().name(),
        engine.mode().name(),
    );
    Ok(())
}

/// The line that says a run ended at the end-of-sequence token, when it did: with a hint when it
/// ended before any text (a raw prompt to an instruct model often does; `--chat` wraps it).
fn eos_note(stats: &GenerateStats, no_text: bool, chat: bool) -> Option<String> {
    if !stats.stopped_at_eos {
        return None;
    }
    let n = stats.generated_ids.len();
    Some(if no_text && n == 1 {
        let hint = if chat {
            ""
        } else {
            "; for an instruct model, try --chat to wrap the prompt in its chat template"
        };
        format!("generation stopped at the end-of-sequence token before any text{hint}")
    } else {
        format!("generation stopped at the end-of-sequence token after {n} tokens")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_on_stdin_gets_a_hint_and_a_pipe_does_not() {
        assert!(stdin_hint(true).is_some_and(|h| h.contains("standard input")));
        assert_eq!(stdin_hint(false), None);
    }

    #[test]
    fn random_seeds_differ() {
        let seeds: std::collections::HashSet<u64> = (0..8).map(|_| random_seed()).collect();
        assert!(seeds.len() > 1, "{seeds:?}");
    }

    #[test]
    fn the_eos_note_says_where_generation_stopped() {
        let mut stats = GenerateStats {
            generated_ids: vec![2],
            stopped_at_eos: true,
            ..GenerateStats::default()
        };
        let first = eos_note(&stats, true, false).unwrap();
        assert!(
            first.contains("end-of-sequence") && first.contains("--chat"),
            "{first}"
        );
        assert!(!eos_note(&stats, true, true).unwrap().contains("--chat"));
        stats.generated_ids = vec![5, 6, 2];
        assert!(eos_note(&stats, false, false)
            .unwrap()
            .contains("after 3 tokens"));
        stats.stopped_at_eos = false;
        assert_eq!(eos_note(&stats, false, false), None);
    }
}
