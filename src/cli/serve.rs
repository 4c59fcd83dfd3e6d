//! `onepass serve`: the OpenAI-compatible HTTP server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use onepass::model::batch::BatchEngine;
use onepass::model::chat::ChatTemplate;
use onepass::model::fetch;
use onepass::model::gguf::GgufFile;
use onepass::model::slots::SlotModel;
use onepass::model::tokenizer::Tokenizer;
use onepass::model::transformer::Transformer;
use onepass::serve::{Limits, ServeOptions, ServedModel};
use onepass::Executor;

use super::common::{count, load_with_prefill_rows, model_path, open_device, ModelArgs, RunArgs};

/// Flags of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences served at once (KV-cache slots, each of --ctx tokens).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = count)]
    pub parallel: usize,
    /// Requests that may wait for a free slot; beyond them, 429.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true, value_parser = count)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on every /v1 route.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20, allow_negative_numbers = true, value_parser = count)]
    pub max_body_bytes: usize,
    /// Most prompt tokens per request (0: the context).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count)]
    pub max_prompt_tokens: usize,
    /// Largest `max_tokens` a request may ask for (0: the context).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = count)]
    pub max_new_tokens: usize,
    /// Seconds a client has to send a request's headers.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = count)]
    pub header_timeout: usize,
    /// Seconds open answers may go on after SIGINT/SIGTERM before they are ended.
    #[arg(long, default_value_t = 30, allow_negative_numbers = true, value_parser = count)]
    pub shutdown_grace: usize,
    /// Skip the decode step of every batch size run before listening (which builds each
    /// bucket's graph before the first request needs it).
    #[arg(long)]
    pub no_warmup: bool,
    /// Prompts of at most this many tokens ride as rows of the running streams' decode steps
    /// instead of prefill passes of their own (default: 4 x --parallel; 0: never).
    #[arg(long, value_name = "TOKENS", allow_negative_numbers = true, value_parser = count)]
    pub mix_prompt_tokens: Option<usize>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The id `/v1/models` lists: a known model's short name, else the file's stem.
fn model_id(spec: &str, path: &Path) -> String {
    if fetch::known_model(spec).is_some() {
        return spec.to_owned();
    }
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(spec)
        .to_owned()
}

/// Runs `serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if !(1..=3600).contains(&args.header_timeout) {
        bail!("--header-timeout must be 1 to 3600 seconds");
    }
    if args.shutdown_grace > 86_400 {
        bail!("--shutdown-grace must be at most 86400 seconds (a day)");
    }
    let listener = onepass::serve::bind(&args.host, args.port)?;
    let config = args.run.config();
    let path = model_path(&args.model.model, &config)?;
    let file = Arc::new(GgufFile::open(&path)?);
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let template = ChatTemplate::from_gguf(&file, &tokenizer)?;
    let device = open_device(&config)?;
    let transformer = load_with_prefill_rows(&args.run, &device, |rows| {
        let options = args
            .run
            .load_options(args.run.ctx, rows)
            .with_slots(args.parallel, args.parallel);
        Transformer::load_with(file.clone(), &device, &options)
    })?;
    let executor = Executor::new(device).with_config(config.clone());
    let model = BatchEngine::new(transformer, executor, config.mode)?;
    let ctx = model.slot_ctx();
    let or_ctx = |v: usize| if v == 0 { ctx } else { v };
    let options = ServeOptions {
        api_key: args.api_key.clone(),
        model_id: model_id(&args.model.model, &path),
        limits: Limits {
            max_body_bytes: args.max_body_bytes,
            max_prompt_tokens: or_ctx(args.max_prompt_tokens),
            max_new_tokens: or_ctx(args.max_new_tokens),
            context: ctx,
        },
        queue: args.queue,
        header_timeout: Duration::from_secs(args.header_timeout as u64),
        shutdown_grace: Duration::from_secs(args.shutdown_grace as u64),
        http_threads: 2,
        warm_up: !args.no_warmup,
        mix_limit: args.mix_prompt_tokens,
    };
    let served = ServedModel {
        model: Box::new(model),
        codec: Arc::new(tokenizer),
        template,
    };
    onepass::serve::run(listener, options, served, |addr| {
        eprintln!("listening on http://{addr}");
    })?;
    eprintln!("server stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_model_is_served_by_its_name_and_a_file_by_its_stem() {
        let cached = Path::new("cache/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(model_id("smollm2", cached), "smollm2");
        let file = Path::new("models/llama-1b.q4_0.gguf");
        assert_eq!(model_id("models/llama-1b.q4_0.gguf", file), "llama-1b.q4_0");
    }
}
