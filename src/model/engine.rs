//! Running a model: prefill in batched passes, decode one token at a time, in one of several
//! execution modes, and the generation loop on top.

use std::time::{Duration, Instant};

use crate::backend::{EncoderOptions, ReplayOrdering};
use crate::error::{Error, Result};
use crate::executable::{Executable, KernelTiming, StableSet};
use crate::model::sampler::{Sampler, SamplerConfig, NO_FINITE_LOGIT};
use crate::model::transformer::{Logits, StepEnd, Transformer};
use crate::ops::draw::{DrawState, DRAW_MAX_ROW};
use crate::session::{Executor, Mode, Plan};

/// How passes are executed; defined with the rest of the configuration.
pub use crate::config::RunMode;

/// A model plus the executor and mode that run it.
pub struct Engine {
    model: Transformer,
    executor: Executor,
    mode: RunMode,
    plan: Plan,
    /// The instantiated decode step and how it ends.
    decode_exec: Option<(Executable, StepEnd)>,
    last_pass: PassStats,
    step_timing: bool,
    step_times: Vec<f64>,
    instantiations: usize,
}

/// Shape of the last pass an engine ran: kernels launched, and the ordering it needed (dependency
/// edges of an instantiated CUDA graph; barriers between concurrent groups otherwise; one wait per
/// kernel in per-op-sync mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PassStats {
    /// Kernel launches.
    pub kernels: usize,
    /// Dependency edges (CUDA graph) or barriers / waits (every other way of running).
    pub edges_or_barriers: usize,
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
    /// An engine running `model` with `executor` in `mode`.
    pub fn new(model: Transformer, executor: Executor, mode: RunMode) -> Self {
        let plan = executor.config().plan();
        Engine {
            model,
            executor,
            mode,
            plan,
            decode_exec: None,
            last_pass: PassStats::default(),
            step_timing: false,
            step_times: Vec::new(),
            instantiations: 0,
        }
    }

    /// Switches the execution mode (drops an instantiated decode step).
    pub fn set_mode(&mut self, mode: RunMode) {
        if mode != self.mode {
            self.mode = mode;
            self.decode_exec = None;
        }
    }

    /// How many times graph mode has instantiated the decode step (once per run of steps with the
    /// same sampling kind: never again as the position grows).
    pub fn decode_instantiations(&self) -> usize {
        self.instantiations
    }

    /// Kernels and edges or barriers of the last pass.
    pub fn last_pass(&self) -> PassStats {
        self.last_pass
    }

    /// Turns on (or off) timing of each decode step's device work: GPU time between two events on
    /// CUDA, wall time on the CPU. [`Engine::take_step_times`] returns the figures.
    pub fn set_step_timing(&mut self, on: bool) {
        self.step_timing = on;
        self.step_times.clear();
    }

    /// The decode-step times (seconds) measured since timing was turned on or last taken.
    pub fn take_step_times(&mut self) -> Vec<f64> {
        std::mem::take(&mut self.step_times)
    }

    /// The allocations the model keeps for its whole life, which an instantiated step may use.
    pub fn stable_set(&self) -> StableSet {
        let named = self.model.stable_buffers();
        StableSet::from_named(named.iter().map(|(n, b)| (n.as_str(), b)))
    }

    /// Records the decode step (`argmax`: ending with the on-device argmax), optimizes it as this
    /// engine's mode does and instantiates it.
    pub fn instantiate_decode(&self, argmax: bool) -> Result<Executable> {
        self.instantiate_step(step_end(argmax))
    }

    /// Records the decode step ending as `end` says, optimizes and instantiates it.
    fn instantiate_step(&self, end: StepEnd) -> Result<Executable> {
        let mut s = self.executor.begin(Mode::Recorded);
        self.model.record_pass(&mut s, 1, Logits::Last, end, 0)?;
        let mut graph = s.into_graph()?;
        let plan = match self.mode {
            RunMode::Graph | RunMode::Recorded => self.plan,
            RunMode::Direct | RunMode::PerOpSync => Plan::SEQUENTIAL,
        };
        let report = Executor::optimize(&mut graph, &plan, self.executor.device().capabilities());
        let exec = self.executor.instantiate(&graph, &self.stable_set())?;
        tracing::info!(?report, stats = ?exec.stats(), "instantiated the decode step");
        Ok(exec)
    }

    /// A profiling run of one decode step for `token` at `pos`: every kernel timed (GPU time from
    /// events on CUDA, wall time and thread on the CPU). Leaves the step's results in place.
    pub fn profile_decode(
        &mut self,
        token: u32,
        pos: usize,
        argmax: bool,
    ) -> Result<Vec<KernelTiming>> {
        self.model.set_inputs(&[token], pos)?;
        match &self.decode_exec {
            Some((exec, e)) if *e == step_end(argmax) && self.mode == RunMode::Graph => {
                exec.profile()
            }
            _ => self.instantiate_decode(argmax)?.profile(),
        }
    }

    /// A profiling run of one prompt pass over `tokens` (at most [`Transformer::max_batch`]) from
    /// position 0, recorded and optimized as this engine's mode does: every kernel timed. Leaves
    /// the pass's results (its KV-cache rows, the last position's logits) in place.
    pub fn profile_prefill(&mut self, tokens: &[u32]) -> Result<Vec<KernelTiming>> {
        if tokens.len() > self.model.max_batch() {
            return Err(Error::InvalidArgument(format!(
                "a profiled prompt pass takes at most {} tokens, got {}",
                self.model.max_batch(),
                tokens.len()
            )));
        }
        self.model.set_inputs(tokens, 0)?;
        let mut s = self.executor.begin(Mode::Recorded);
        self.model
            .record(&mut s, tokens.len(), Logits::Last, false)?;
        let mut graph = s.into_graph()?;
        let plan = match self.mode {
            RunMode::Graph | RunMode::Recorded => self.plan,
            RunMode::Direct | RunMode::PerOpSync => Plan::SEQUENTIAL,
        };
        Executor::optimize(&mut graph, &plan, self.executor.device().capabilities());
        self.executor
            .instantiate(&graph, &self.stable_set())?
            .profile()
    }

    /// The model.
    pub fn model(&self) -> &Transformer {
        &self.model
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
            return Err(Error::InvalidArgument(
                "the prompt is empty: give at least one token".into(),
            ));
        }
        if tokens.len() > self.model.max_ctx() {
            return Err(Error::InvalidArgument(format!(
                "the prompt has {} tokens, more than the context of {}",
                tokens.len(),
                self.model.max_ctx()
            )));
        }
        if logits == Logits::All && tokens.len() > self.model.max_batch() {
            return Err(Error::InvalidArgument(format!(
                "logits of every position need the prompt in one pass of at most {} tokens",
                self.model.max_batch()
            )));
        }
        let mut pos = 0;
        for chunk in tokens.chunks(self.model.max_batch()) {
            self.model.set_inputs(chunk, pos)?;
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
        self.model.set_inputs(&[token], pos)?;
        if self.mode == RunMode::Graph {
            self.ensure_decode_exec(step_end(argmax))?;
        }
        let timer = if self.step_timing {
            Some(self.executor.device().backend().step_timer()?)
        } else {
            None
        };
        match (&self.decode_exec, self.mode) {
            (Some((exec, _)), RunMode::Graph) => {
                exec.launch()?;
                self.last_pass = self.graph_pass_stats();
            }
            _ => self.run_pass(1, Logits::Last, argmax)?,
        }
        if let Some(t) = timer {
            self.step_times.push(t.stop()?);
        }
        if argmax {
            // The only read-back of a greedy step: the token's 4 bytes (it waits for the launch).
            let device = self.executor.device();
            let id = device.download::<i32>(&self.model.step_token(pos)?)?[0];
            match self.device_token(id)? {
                Some(t) => Ok(Some(t)),
                // The largest logit is not finite (the device argmax gives -1): the host's greedy
                // choice over the finite logits decides, or fails as sampling does when there is
                // none.
                None => {
                    let mut greedy = Sampler::new(SamplerConfig::default())?;
                    Ok(Some(greedy.sample(&self.logits(1)?, &[])?))
                }
            }
        } else {
            if let Some((exec, _)) = &self.decode_exec {
                exec.wait()?;
            }
            Ok(None)
        }
    }

    /// Greedy decode from `token` at `pos`: up to `steps` steps, each new token handed to
    /// `on_token` as soon as it is known, which returns whether to go on; returns how many steps
    /// gave a token. In graph mode the step's argmax also advances the step's inputs on the
    /// device (the next token, position and length), so each step is launched before the token of
    /// the step before it is read back and the device does not wait for the host between steps;
    /// when `on_token` stops early, the one step already launched after it has run too (it wrote
    /// what [`Engine::decode`] of that token would). Other modes, and step timing, run one
    /// [`Engine::decode`] a step. Fails as [`Engine::decode`] does, at the first step that would
    /// pass the end of the context.
    pub fn decode_greedy(
        &mut self,
        mut token: u32,
        pos: usize,
        steps: usize,
        mut on_token: impl FnMut(u32) -> Result<bool>,
    ) -> Result<usize> {
        let mut done = 0;
        if self.mode != RunMode::Graph || self.step_timing {
            while done < steps {
                token = self
                    .decode(token, pos + done, true)?
                    .ok_or_else(|| Error::Backend("a greedy step gave no token".into()))?;
                done += 1;
                if !on_token(token)? {
                    break;
                }
            }
            return Ok(done);
        }
        self.decode_pipelined(StepEnd::Argmax, token, pos, steps, &mut on_token)
    }

    /// Sampled decode after `history` (the tokens so far; its last is fed to the first step):
    /// up to `steps` steps, each token drawn by `sampler` as [`Sampler::sample`] draws it, handed
    /// to `on_token`, which returns whether to go on; returns how many steps gave a token. In
    /// graph mode the draw runs on the device at the end of the step (`ops::draw`, the same
    /// tokens), so the steps are pipelined as [`Engine::decode_greedy`]'s are, and `sampler`'s
    /// generator is advanced past the draws the device made; settings a device draw cannot take
    /// (a penalty window over `DRAW_WINDOW` tokens, a vocabulary over `DRAW_MAX_ROW`), other
    /// modes and step timing read the logits and draw on the host each step.
    pub fn decode_sampled(
        &mut self,
        sampler: &mut Sampler,
        history: &[u32],
        steps: usize,
        mut on_token: impl FnMut(u32) -> Result<bool>,
    ) -> Result<usize> {
        let Some(&first) = history.last() else {
            return Err(Error::InvalidArgument(
                "sampled decode needs at least one token of history".into(),
            ));
        };
        let pos = history.len() - 1;
        let cfg = sampler.config().clone();
        let fits = self.model.config().vocab <= DRAW_MAX_ROW;
        let device = DrawState::new(&cfg, sampler.state(), history.len()).ok();
        if let (Some(state), RunMode::Graph, false, true) =
            (device, self.mode, self.step_timing, fits)
        {
            self.model.set_draw(&state, history)?;
            let done = self.decode_pipelined(StepEnd::Draw, first, pos, steps, &mut on_token)?;
            if cfg.temperature != 0.0 {
                sampler.skip_draws(done);
            }
            return Ok(done);
        }
        let mut history = history.to_vec();
        let mut logits = Vec::new();
        let mut done = 0;
        while done < steps {
            let token = *history.last().unwrap_or(&first);
            self.decode(token, history.len() - 1, false)?;
            self.logits_into(1, &mut logits)?;
            let next = sampler.sample(&logits, &history)?;
            history.push(next);
            done += 1;
            if !on_token(next)? {
                break;
            }
        }
        Ok(done)
    }

    /// Graph-mode decode whose step ends with a token on the device (`end`: argmax or draw),
    /// which also advances the step's inputs: each step is launched before the token of the step
    /// before it is read back. A greedy step whose largest logit is not finite is redone on the
    /// host; a draw from logits of which none is finite is an error, as on the host.
    fn decode_pipelined(
        &mut self,
        end: StepEnd,
        mut token: u32,
        pos: usize,
        steps: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<usize> {
        let mut done = 0;
        while done < steps {
            // One pipeline from `token` at `p0`: the host writes the inputs once, then each launch
            // reads what the launch before it left.
            let p0 = pos + done;
            self.model.set_inputs(&[token], p0)?;
            self.ensure_decode_exec(end)?;
            let Some((exec, _)) = &self.decode_exec else {
                return Err(Error::Backend(
                    "the decode step was not instantiated".into(),
                ));
            };
            let room = (steps - done).min(self.model.max_ctx() - p0);
            let mut marks = std::collections::VecDeque::with_capacity(2);
            marks.push_back(exec.launch_marked()?);
            let (mut launched, mut read) = (1, 0);
            while let Some(mark) = marks.pop_front() {
                if launched < room {
                    marks.push_back(exec.launch_marked()?);
                    launched += 1;
                }
                let id = mark.read::<i32>(&self.model.step_token(p0 + read)?)?[0];
                read += 1;
                let Some(next) = self.device_token(id)? else {
                    // A step whose largest logit is not finite: the steps launched after it ran on
                    // token 0. Drain them; a draw fails as the host's does, and a greedy step is
                    // redone alone (the host decides its token), with a new pipeline after it.
                    drop(marks);
                    exec.wait()?;
                    if end == StepEnd::Draw {
                        return Err(Error::InvalidArgument(NO_FINITE_LOGIT.into()));
                    }
                    token = self
                        .decode(token, p0 + read - 1, true)?
                        .ok_or_else(|| Error::Backend("a greedy step gave no token".into()))?;
                    done += 1;
                    if !on_token(token)? {
                        return Ok(done);
                    }
                    break;
                };
                token = next;
                done += 1;
                if !on_token(token)? {
                    exec.wait()?;
                    return Ok(done);
                }
            }
            self.last_pass = self.graph_pass_stats();
        }
        Ok(done)
    }

    /// The shape of the instantiated decode step (kernels, and edges or barriers).
    fn graph_pass_stats(&self) -> PassStats {
        let Some((exec, _)) = &self.decode_exec else {
            return self.last_pass;
        };
        let st = exec.stats();
        let ordering = match self.executor.device().capabilities().replay_ordering {
            ReplayOrdering::Edges => st.edges,
            ReplayOrdering::Barriers => st.barriers,
        };
        PassStats {
            kernels: st.kernels,
            edges_or_barriers: ordering,
        }
    }

    /// The token a device argmax gave: `None` for its -1 (the largest logit is not finite), an
    /// error outside the vocabulary.
    fn device_token(&self, id: i32) -> Result<Option<u32>> {
        if id < 0 {
            return Ok(None);
        }
        let vocab = self.model.config().vocab;
        usize::try_from(id)
            .ok()
            .filter(|&i| i < vocab)
            .map(|i| Some(i as u32))
            .ok_or_else(|| {
                Error::Backend(format!(
                    "the device argmax gave token {id}, outside the vocabulary of {vocab}"
                ))
            })
    }

    /// Instantiates the decode step once (and again only if the caller switches between greedy
    /// and sampled steps): the step reads its position and KV length from the step buffer, so
    /// the same graph serves every position up to the cache size.
    fn ensure_decode_exec(&mut self, end: StepEnd) -> Result<()> {
        if !matches!(&self.decode_exec, Some((_, e)) if *e == end) {
            self.decode_exec = Some((self.instantiate_step(end)?, end));
            self.instantiations += 1;
        }
        Ok(())
    }

    fn run_pass(&mut self, rows: usize, logits: Logits, argmax: bool) -> Result<()> {
        let mode = match self.mode {
            RunMode::Direct => Mode::Direct,
            RunMode::PerOpSync | RunMode::Recorded | RunMode::Graph => Mode::Recorded,
        };
        if self.mode == RunMode::PerOpSync {
            // A direct session whose encoder waits after every dispatch: each dispatch is its own
            // submission, in program order, waited for before the next.
            let sync_each = EncoderOptions {
                sync_each_dispatch: true,
            };
            let mut s = self.executor.begin_with(Mode::Direct, sync_each);
            self.model.record(&mut s, rows, logits, argmax)?;
            let report = s.finish(&self.plan)?;
            self.last_pass = PassStats {
                kernels: report.dispatches,
                edges_or_barriers: report.dispatches,
            };
            return Ok(());
        }
        let mut s = self.executor.begin(mode);
        self.model.record(&mut s, rows, logits, argmax)?;
        let report = s.finish(&self.plan)?;
        self.last_pass = PassStats {
            kernels: report.dispatches,
            edges_or_barriers: report.barriers,
        };
        Ok(())
    }

    /// The logits of the last pass: `rows` rows of `vocab` values.
    pub fn logits(&self, rows: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.logits_into(rows, &mut out)?;
        Ok(out)
    }

    /// As `logits`, into `out` (resized): a sampled decode loop reads every step's logits into
    /// one allocation.
    pub fn logits_into(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        self.executor
            .device()
            .download_into(&self.model.logits_buffer(rows)?, out)
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
        if prompt.len() + max_tokens > self.model.max_ctx() + 1 {
            return Err(Error::InvalidArgument(format!(
                "prompt ({} tokens) plus {max_tokens} new tokens exceeds the context of {} tokens",
                prompt.len(),
                self.model.max_ctx()
            )));
        }
        let t0 = Instant::now();
        self.prefill(prompt, Logits::Last)?;
        let mut history: Vec<u32> = prompt.to_vec();
        let greedy = sampler.config().is_greedy();
        let mut stats = GenerateStats {
            prompt_ids: prompt.to_vec(),
            ..GenerateStats::default()
        };
        let next = if max_tokens > 0 {
            Some(sampler.sample(&self.logits(1)?, &history)?)
        } else {
            None
        };
        stats.prompt_time = t0.elapsed();
        let t1 = Instant::now();
        // Takes a new token; whether to go on.
        let mut emit =
            |token: u32, history: &mut Vec<u32>, stats: &mut GenerateStats| -> Result<bool> {
                history.push(token);
                stats.generated_ids.push(token);
                on_token(token)?;
                if stop_ids.contains(&token) {
                    stats.stopped_at_eos = true;
                    return Ok(false);
                }
                Ok(stats.generated_ids.len() < max_tokens)
            };
        if let Some(first) = next {
            if emit(first, &mut history, &mut stats)? {
                let pos = history.len() - 1;
                if greedy {
                    let steps = max_tokens - stats.generated_ids.len();
                    self.decode_greedy(first, pos, steps, |t| emit(t, &mut history, &mut stats))?;
                } else {
                    let steps = max_tokens - stats.generated_ids.len();
                    let start = history.clone();
                    self.decode_sampled(&mut sampler, &start, steps, |t| {
                        emit(t, &mut history, &mut stats)
                    })?;
                }
            }
        }
        stats.decode_time = t1.elapsed();
        stats.prompt_tok_s = prompt.len() as f64 / stats.prompt_time.as_secs_f64().max(1e-9);
        let decoded = stats.generated_ids.len().saturating_sub(1);
        stats.decode_tok_s = decoded as f64 / stats.decode_time.as_secs_f64().max(1e-9);
        Ok(stats)
    }
}

/// How a decode step ends: with the device's argmax, or with its logits.
fn step_end(argmax: bool) -> StepEnd {
    if argmax {
        StepEnd::Argmax
    } else {
        StepEnd::Logits
    }
}
