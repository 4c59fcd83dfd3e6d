//! Running a model: prefill in batched passes, decode one token at a time, in one of several
//! execution modes, and the generation loop on top.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::graph::ComputeGraph;
use crate::model::llama::{Llama, Logits};
use crate::model::sampler::{Sampler, SamplerConfig};
use crate::session::{Executor, Mode, Plan};

/// How passes are executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunMode {
    /// Every pass in a direct session: dispatches encoded as they come, barriers from ranges.
    Direct,
    /// Every pass recorded, optimized (fusion, reorder) and then run.
    Recorded,
    /// The decode step recorded and optimized once, then replayed for every step.
    Graph,
}

impl RunMode {
    /// The mode's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            RunMode::Direct => "direct",
            RunMode::Recorded => "recorded",
            RunMode::Graph => "graph",
        }
    }
}

/// A model plus the executor and mode that run it.
pub struct Engine {
    llama: Llama,
    executor: Executor,
    mode: RunMode,
    plan: Plan,
    decode_graph: Option<(ComputeGraph, bool)>,
}

/// What a generation produced, and how fast.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GenerateStats {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Generated token ids (the stop token included when one ended the run).
    pub generated_ids: Vec<u32>,
    /// Prompt tokens per second.
    pub prompt_tok_s: f64,
    /// Generated tokens per second (decode steps only).
    pub decode_tok_s: f64,
    /// Prompt processing time.
    pub prompt_time: Duration,
    /// Decode time.
    pub decode_time: Duration,
    /// Whether an end-of-generation token stopped the run.
    pub stopped_at_eos: bool,
}

impl Engine {
    /// An engine running `llama` with `executor` in `mode`.
    pub fn new(llama: Llama, executor: Executor, mode: RunMode) -> Self {
        let plan = executor.config().plan();
        Engine { llama, executor, mode, plan, decode_graph: None }
    }

    /// The model.
    pub fn llama(&self) -> &Llama {
        &self.llama
    }

    /// The execution mode.
    pub fn mode(&self) -> RunMode {
        self.mode
    }

    /// Runs the prompt through the model in passes of at most `max_batch` tokens starting at
    /// position 0. Leaves the logits of the last position (or of every position of the last pass,
    /// with [`Logits::All`]) in the logits buffer.
    pub fn prefill(&mut self, tokens: &[u32], logits: Logits) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty: give at least one token".into()));
        }
        if tokens.len() > self.llama.max_ctx() {
            return Err(Error::InvalidArgument(format!(
                "the prompt has {} tokens, more than the context of {}",
                tokens.len(),
                self.llama.max_ctx()
            )));
        }
        if logits == Logits::All && tokens.len() > self.llama.max_batch() {
            return Err(Error::InvalidArgument(format!(
                "logits of every position need the prompt in one pass of at most {} tokens",
                self.llama.max_batch()
            )));
        }
        let mut pos = 0;
        for chunk in tokens.chunks(self.llama.max_batch()) {
            self.llama.set_inputs(chunk, pos)?;
            let last = pos + chunk.len() == tokens.len();
            self.run_pass(chunk.len(), if last { logits } else { Logits::Last }, false)?;
            pos += chunk.len();
        }
        Ok(())
    }

    /// Runs one decode step for `token` at position `pos`. With `argmax`, the most likely next
    /// token is computed on the device and returned; otherwise `None` and the logits are left in
    /// the logits buffer.
    pub fn decode(&mut self, token: u32, pos: usize, argmax: bool) -> Result<Option<u32>> {
        self.llama.set_inputs(&[token], pos)?;
        match self.mode {
            RunMode::Graph => {
                let stale = !matches!(&self.decode_graph, Some((_, a)) if *a == argmax);
                if stale {
                    let mut s = self.executor.begin(Mode::Recorded);
                    self.llama.record(&mut s, 1, Logits::Last, argmax)?;
                    let mut graph = s.into_graph()?;
                    let report = Executor::optimize(&mut graph, &self.plan);
                    tracing::info!(?report, "recorded the decode step once; replaying it every step");
                    self.decode_graph = Some((graph, argmax));
                }
                let (graph, _) = self.decode_graph.as_ref().expect("decode graph was just built");
                self.executor.run(graph, self.plan.split)?;
            }
            _ => self.run_pass(1, Logits::Last, argmax)?,
        }
        if argmax {
            let id = self.executor.device().download::<i32>(self.llama.next_token_buffer())?;
            Ok(Some(id[0] as u32))
        } else {
            Ok(None)
        }
    }

    fn run_pass(&mut self, rows: usize, logits: Logits, argmax: bool) -> Result<()> {
        let mode = match self.mode {
            RunMode::Direct => Mode::Direct,
            RunMode::Recorded | RunMode::Graph => Mode::Recorded,
        };
        let mut s = self.executor.begin(mode);
        self.llama.record(&mut s, rows, logits, argmax)?;
        s.finish(&self.plan)?;
        Ok(())
    }

    /// The logits of the last pass: `rows` rows of `vocab` values.
    pub fn logits(&self, rows: usize) -> Result<Vec<f32>> {
        self.executor.device().download(&self.llama.logits_buffer(rows)?)
    }

    /// Generates up to `max_tokens` tokens after `prompt`, calling `on_token` with each new token
    /// as soon as it exists. Stops after a token in `stop_ids` (which is included in the output).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampler: &SamplerConfig,
        stop_ids: &[u32],
        mut on_token: impl FnMut(u32) -> Result<()>,
    ) -> Result<GenerateStats> {
        let mut sampler = Sampler::new(sampler.clone())?;
        if prompt.len() + max_tokens > self.llama.max_ctx() + 1 {
            return Err(Error::InvalidArgument(format!(
                "prompt ({} tokens) plus {max_tokens} new tokens exceeds the context of {} tokens",
                prompt.len(),
                self.llama.max_ctx()
            )));
        }
        let t0 = Instant::now();
        self.prefill(prompt, Logits::Last)?;
        let mut history: Vec<u32> = prompt.to_vec();
        let greedy = sampler.config().is_greedy();
        let mut stats = GenerateStats { prompt_ids: prompt.to_vec(), ..GenerateStats::default() };
        let mut next = if max_tokens > 0 { Some(sampler.sample(&self.logits(1)?, &history)?) } else { None };
        stats.prompt_time = t0.elapsed();
        let t1 = Instant::now();
        while let Some(token) = next {
            history.push(token);
            stats.generated_ids.push(token);
            on_token(token)?;
            if stop_ids.contains(&token) {
                stats.stopped_at_eos = true;
                break;
            }
            if stats.generated_ids.len() == max_tokens {
                break;
            }
            let pos = history.len() - 1;
            next = Some(match self.decode(token, pos, greedy)? {
                Some(id) => id,
                None => sampler.sample(&self.logits(1)?, &history)?,
            });
        }
        stats.decode_time = t1.elapsed();
        stats.prompt_tok_s = prompt.len() as f64 / stats.prompt_time.as_secs_f64().max(1e-9);
        let decoded = stats.generated_ids.len().saturating_sub(1);
        stats.decode_tok_s = decoded as f64 / stats.decode_time.as_secs_f64().max(1e-9);
        Ok(stats)
    }
}
