//! Continuous batching. The scheduler runs on its own OS thread and owns the model; handlers
//! hand it [`Job`]s through a bounded queue and read [`Event`]s back. Each turn of its loop:
//!
//! 1. drops the sequences whose client has gone (their slot is free for the next turn);
//! 2. moves queued jobs into free slots;
//! 3. runs at most one prefill chunk (at most [`SlotModel::max_chunk`] tokens) for the oldest
//!    sequence whose prompt is long (more than the mix limit), so a long prompt delays the
//!    running streams by one chunk;
//! 4. runs one decode step for every decoding sequence, its spare rows (up to a whole number of
//!    [`SlotModel::max_rows`]) taken by the tokens of short prompts (at most the mix limit,
//!    oldest sequence first, as many of its tokens as fit; the rest in the next steps): row `p`
//!    feeds prompt token `p` at position `p` of the sequence's slot, and the row of a prompt's
//!    last token gives the sequence's first token. A slot holds a sequence that prefills or
//!    decodes, so with no more slots than rows a step always has a spare row for the oldest
//!    prompt.
//!
//! A short prompt thus costs the running streams a few rows of a step they run anyway, not a
//! pass of its own; its tokens take the decode step's arithmetic, which does not depend on the
//! rows beside them, so its answer is the same alone or in a crowd (and on the CPU, the bits of
//! `Engine::decode` fed the prompt token by token). Which path a prompt takes depends only on its
//! length. A long prompt is cut into chunks of `max_chunk` tokens from position 0, as
//! `Engine::prefill` cuts it into passes of its batch size: with the same size (`--batch`), a
//! sequence's prefill gives the bits `generate`'s does.
//!
//! A failing request fails alone: a decode step that fails for a batch is run again row by row,
//! so only the row at fault gets the error.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::http::StatusCode;

use super::error::ApiError;
use super::metrics::Metrics;
use super::sequence::{Event, Job, Phase, Sequence, Ticket, TokenContext};
use super::text::TextCodec;
use crate::error::{Error, Result};
use crate::model::sampler::SamplerConfig;
use crate::model::slots::{Pick, RowDraw, RowOutput, SlotModel, StepRow};
use crate::sampler::device::DrawState;

/// How long an idle scheduler waits for a job before it looks at its flags again.
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// Flags the server raises to end the scheduler.
#[derive(Debug, Default)]
struct Flags {
    /// New jobs are refused (the server is shutting down).
    draining: AtomicBool,
    /// Running and queued jobs are ended with an error.
    abort: AtomicBool,
    /// The thread returns.
    stop: AtomicBool,
}

/// The handlers' side of the scheduler: submit jobs, shut it down.
pub struct SchedulerHandle {
    jobs: Sender<(Job, Ticket)>,
    /// Jobs queued or running, and how many may be.
    held: Arc<AtomicUsize>,
    capacity: usize,
    flags: Arc<Flags>,
    metrics: Arc<Metrics>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Runs one decode step of each row count a model may build something for (1, 2, 4, ... below
/// [`SlotModel::max_rows`], and `max_rows` itself: the batch-size buckets of an instantiated
/// graph per bucket, greedy and drawing on the device) on throwaway slot contents, so that the
/// first requests do not pay for it.
/// Each step's slots are first prefilled with one token at position 0, which a sequence's own
/// prefill overwrites later. Returns the number of step sizes run.
pub fn warm_up(model: &mut dyn SlotModel) -> Result<usize> {
    let most = model.max_rows().min(model.slots());
    if most == 0 || model.slot_ctx() < 2 || model.vocab() == 0 {
        return Ok(0);
    }
    let mut sizes = Vec::new();
    let mut n = 1;
    while n < most {
        sizes.push(n);
        n *= 2;
    }
    sizes.push(most);
    // Greedy steps, then steps whose rows draw on the device (each has its graphs).
    let sampled = SamplerConfig {
        temperature: 1.0,
        ..SamplerConfig::default()
    };
    let draw = Pick::Draw(RowDraw::new(DrawState::new(&sampled, 0, 2)?, &[0, 0]));
    for &n in &sizes {
        for pick in [Pick::Greedy, draw.clone()] {
            for slot in 0..n {
                model.prefill(slot, &[0], 0)?;
            }
            let rows: Vec<StepRow> = (0..n)
                .map(|slot| StepRow {
                    slot,
                    token: 0,
                    pos: 1,
                    pick: pick.clone(),
                })
                .collect();
            model.decode(&rows)?;
        }
    }
    Ok(sizes.len())
}

/// The default mix limit: prompts of at most four steps' rows ride in decode steps (a prompt's
/// rows may span several steps).
pub fn default_mix_limit(max_rows: usize) -> usize {
    max_rows.saturating_mul(4)
}

/// Starts the scheduler thread with a queue of `queue` jobs beyond the model's slots; prompts
/// of at most `mix_limit` tokens (0: none) are prefilled as rows of decode steps.
pub fn spawn(
    model: Box<dyn SlotModel>,
    codec: Arc<dyn TextCodec>,
    metrics: Arc<Metrics>,
    queue: usize,
    mix_limit: usize,
) -> Result<SchedulerHandle> {
    if model.slots() == 0 || model.max_rows() == 0 || model.max_chunk() == 0 {
        return Err(Error::InvalidArgument(format!(
            "the model offers {} slots, {} rows per step and {} tokens per chunk: each must be \
             at least 1",
            model.slots(),
            model.max_rows(),
            model.max_chunk()
        )));
    }
    // The tickets bound the jobs in the channel, so the channel itself needs no bound (and
    // allocates nothing up front, whatever `queue` is).
    let capacity = model.slots().saturating_add(queue);
    let (jobs, receiver) = std::sync::mpsc::channel();
    let flags = Arc::new(Flags::default());
    let end_ids = codec.end_ids();
    let mut scheduler = Scheduler {
        free: (0..model.slots()).rev().collect(),
        mix_limit,
        model,
        jobs: receiver,
        running: Vec::new(),
        flags: flags.clone(),
        ctx: TokenContext {
            codec,
            end_ids,
            metrics: metrics.clone(),
        },
    };
    let thread = std::thread::Builder::new()
        .name("onepass-scheduler".into())
        .spawn(move || scheduler.run())
        .map_err(|e| Error::Backend(format!("cannot start the scheduler thread: {e}")))?;
    Ok(SchedulerHandle {
        jobs,
        held: Arc::new(AtomicUsize::new(0)),
        capacity,
        flags,
        metrics,
        thread: Mutex::new(Some(thread)),
    })
}

impl SchedulerHandle {
    /// Queues a job: a 429 when the queue is full, a 503 when the server is shutting down.
    pub fn submit(&self, job: Job) -> std::result::Result<(), ApiError> {
        if self.flags.draining.load(Ordering::SeqCst) {
            return Err(shutting_down());
        }
        // Every slot busy and the queue full: the job's place is refused before it is sent.
        let full = || {
            ApiError::with_status(
                StatusCode::TOO_MANY_REQUESTS,
                "the server is at capacity: every KV-cache slot is busy and the queue of waiting \
                 requests is full; retry later",
            )
            .code("queue_full")
        };
        let ticket = Ticket::take(&self.held, self.capacity).ok_or_else(full)?;
        let queued = self.metrics.queue_length();
        queued.fetch_add(1, Ordering::SeqCst);
        self.jobs.send((job, ticket)).map_err(|_| {
            queued.fetch_sub(1, Ordering::SeqCst);
            ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "the scheduler has stopped")
        })
    }

    /// Refuses new jobs from now on; running and queued ones go on.
    pub fn drain(&self) {
        self.flags.draining.store(true, Ordering::SeqCst);
    }

    /// Ends running and queued jobs with a "shutting down" error.
    pub fn abort(&self) {
        self.drain();
        self.flags.abort.store(true, Ordering::SeqCst);
    }

    /// Whether the scheduler thread is still running.
    pub fn is_running(&self) -> bool {
        self.thread
            .lock()
            .is_ok_and(|t| t.as_ref().is_some_and(|t| !t.is_finished()))
    }

    /// Stops the thread (ending what still runs) and waits for it.
    pub fn stop(&self) -> Result<()> {
        self.abort();
        self.flags.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        match thread.map(JoinHandle::join) {
            Some(Err(_)) => Err(Error::Backend("the scheduler thread panicked".into())),
            _ => Ok(()),
        }
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        self.flags.abort.store(true, Ordering::SeqCst);
        self.flags.stop.store(true, Ordering::SeqCst);
    }
}

fn shutting_down() -> ApiError {
    ApiError::with_status(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is shutting down",
    )
}

/// The scheduler thread's state.
struct Scheduler {
    model: Box<dyn SlotModel>,
    jobs: Receiver<(Job, Ticket)>,
    /// Sequences holding a slot, oldest first.
    running: Vec<Sequence>,
    /// Free slots (the lowest is taken first: it is at the end).
    free: Vec<usize>,
    /// Prompts of at most this many tokens are prefilled as rows of decode steps.
    mix_limit: usize,
    flags: Arc<Flags>,
    ctx: TokenContext,
}

impl Scheduler {
    fn run(&mut self) {
        loop {
            if self.flags.abort.load(Ordering::SeqCst) {
                self.end_all();
            }
            if self.flags.stop.load(Ordering::SeqCst) {
                self.end_all();
                return;
            }
            self.drop_abandoned();
            if !self.admit() {
                self.end_all();
                return;
            }
            let turn = std::time::Instant::now();
            self.prefill_one();
            let prefill = turn.elapsed();
            self.decode_step();
            self.ctx.metrics.set_slots_in_use(self.running.len());
            if !self.running.is_empty() {
                tracing::trace!(
                    running = self.running.len(),
                    prefill_us = prefill.as_micros() as u64,
                    turn_us = turn.elapsed().as_micros() as u64,
                    "a scheduler turn"
                );
            }
        }
    }

    /// Ends every running and queued job with the shutdown error.
    fn end_all(&mut self) {
        for seq in self.running.drain(..) {
            seq.fail(shutting_down());
            self.free.push(seq.slot);
        }
        while let Ok((job, _ticket)) = self.jobs.try_recv() {
            self.ctx
                .metrics
                .queue_length()
                .fetch_sub(1, Ordering::SeqCst);
            let _ = job.events.send(Event::Failed(shutting_down()));
        }
        self.ctx.metrics.set_slots_in_use(0);
    }

    /// Frees the slots of sequences whose client has gone.
    fn drop_abandoned(&mut self) {
        let free = &mut self.free;
        self.running.retain(|seq| {
            let gone = seq.is_abandoned();
            if gone {
                tracing::debug!(slot = seq.slot, "the client has gone: the slot is free");
                free.push(seq.slot);
            }
            !gone
        });
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Moves queued jobs into free slots; waits a little when nothing runs. Returns false when
    /// every sender has gone (the server has ended).
    fn admit(&mut self) -> bool {
        while !self.free.is_empty() {
            let (job, ticket) = if self.running.is_empty() {
                match self.jobs.recv_timeout(IDLE_WAIT) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match self.jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => return true,
                }
            };
            self.ctx
                .metrics
                .queue_length()
                .fetch_sub(1, Ordering::SeqCst);
            if job.events.is_closed() {
                continue;
            }
            if let Err(e) = self.check(&job) {
                let _ = job.events.send(Event::Failed(e));
                continue;
            }
            let Some(slot) = self.free.pop() else {
                return true;
            };
            let prompt_tokens = job.prompt.len();
            match Sequence::new(job, slot) {
                Ok(seq) => {
                    let seq = seq.with_ticket(ticket);
                    tracing::debug!(slot, prompt_tokens, "a sequence takes a slot");
                    self.running.push(seq);
                    self.ctx.metrics.set_slots_in_use(self.running.len());
                }
                Err(e) => {
                    self.free.push(slot);
                    tracing::warn!("a job could not start: {e}");
                }
            }
        }
        true
    }

    /// What makes a job impossible on this model (it then fails alone, before any work).
    fn check(&self, job: &Job) -> std::result::Result<(), ApiError> {
        let vocab = self.model.vocab();
        if job.prompt.is_empty() {
            return Err(ApiError::invalid_field(
                "prompt",
                "the prompt has no tokens",
            ));
        }
        if let Some(bad) = job.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid_field(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        let ctx = self.model.slot_ctx();
        if job.prompt.len() + job.max_tokens > ctx {
            return Err(ApiError::invalid_field(
                "max_tokens",
                format!(
                    "the prompt ({} tokens) plus max_tokens ({}) exceeds the context of {ctx} \
                     tokens",
                    job.prompt.len(),
                    job.max_tokens
                ),
            )
            .code("context_length_exceeded"));
        }
        Ok(())
    }

    /// Ends sequence `index` with `error`, freeing its slot.
    fn fail(&mut self, index: usize, error: ApiError) {
        let seq = self.running.remove(index);
        tracing::warn!(slot = seq.slot, "a request failed: {}", error.message);
        seq.fail(error);
        self.free.push(seq.slot);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Frees the slots of the sequences at `ended` (indices into `running`, any order).
    fn remove(&mut self, mut ended: Vec<usize>) {
        ended.sort_unstable_by(|a, b| b.cmp(a));
        ended.dedup();
        for i in ended {
            let seq = self.running.remove(i);
            self.free.push(seq.slot);
        }
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Runs one prompt chunk of the oldest sequence still prefilling; when its prompt is done,
    /// picks its first token.
    fn prefill_one(&mut self) {
        let mix_limit = self.mix_limit;
        let Some(index) = self
            .running
            .iter()
            .position(|s| matches!(s.phase, Phase::Prefill(_)) && s.job.prompt.len() > mix_limit)
        else {
            return;
        };
        let max_chunk = self.model.max_chunk();
        let seq = &self.running[index];
        let Phase::Prefill(done) = seq.phase else {
            return;
        };
        let end = (done + max_chunk).min(seq.job.prompt.len());
        let result = self
            .model
            .prefill(seq.slot, &seq.job.prompt[done..end], done);
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => return self.fail(index, model_error("the prompt's prefill", &e)),
        };
        self.ctx.metrics.add_prompt_tokens(end - done);
        let seq = &mut self.running[index];
        if end < seq.job.prompt.len() {
            seq.phase = Phase::Prefill(end);
            return;
        }
        seq.phase = Phase::Decode;
        let start = std::time::Instant::now();
        let first = seq.sample(&logits);
        tracing::trace!(
            sample_us = start.elapsed().as_micros() as u64,
            "sampled a first token"
        );
        match first {
            Ok(token) => self.take_token(index, token),
            Err(e) => self.fail(index, model_error("sampling the first token", &e)),
        }
    }

    /// Gives sequence `index` its next token; frees its slot when it ends.
    fn take_token(&mut self, index: usize, token: u32) {
        let slot_ctx = self.model.slot_ctx();
        let ctx = &self.ctx;
        let result = self.running[index].accept(
            token,
            ctx.codec.as_ref(),
            &ctx.end_ids,
            slot_ctx,
            &ctx.metrics,
        );
        match result {
            Ok(None) => {}
            Ok(Some(reason)) => {
                tracing::debug!(
                    reason = reason.as_str(),
                    "a sequence ends at its first token"
                );
                self.remove(vec![index]);
            }
            Err(e) => self.fail(index, model_error("detokenizing", &e)),
        }
    }

    /// One decode step (in groups of at most `max_rows` rows) for every decoding sequence.
    fn decode_step(&mut self) {
        let max_rows = self.model.max_rows();
        // Decoding sequences first, then the tokens of short prompts in the spare rows.
        let mut items: Vec<(usize, Option<usize>)> = (0..self.running.len())
            .filter(|&i| self.running[i].phase == Phase::Decode)
            .map(|i| (i, None))
            .collect();
        let capacity = items.len().div_ceil(max_rows).max(1) * max_rows;
        for (i, seq) in self.running.iter().enumerate() {
            let Phase::Prefill(done) = seq.phase else {
                continue;
            };
            if seq.job.prompt.len() > self.mix_limit {
                continue;
            }
            let take = (seq.job.prompt.len() - done).min(capacity - items.len());
            items.extend((done..done + take).map(|p| (i, Some(p))));
        }
        if items.is_empty() {
            return;
        }
        let mut outputs: Vec<(
            usize,
            Option<usize>,
            std::result::Result<RowOutput, ApiError>,
        )> = Vec::new();
        for group in items.chunks(max_rows) {
            let rows: Vec<StepRow> = group.iter().map(|&(i, p)| self.row(i, p)).collect();
            match self.model.decode(&rows) {
                Ok(out) if out.len() == rows.len() => {
                    outputs.extend(group.iter().zip(out).map(|(&(i, p), o)| (i, p, Ok(o))));
                }
                Ok(out) => {
                    let e = ApiError::with_status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("the decode step gave {} rows for {}", out.len(), rows.len()),
                    );
                    outputs.extend(group.iter().map(|&(i, p)| (i, p, Err(e.clone()))));
                }
                // Row by row (a prompt's rows in order), so that only the sequence at fault fails.
                Err(e) if rows.len() == 1 => {
                    let (i, p) = group[0];
                    outputs.push((i, p, Err(model_error("the decode step", &e))));
                }
                Err(_) => {
                    let mut failed: Vec<usize> = Vec::new();
                    for (&(i, p), row) in group.iter().zip(&rows) {
                        if failed.contains(&i) {
                            continue;
                        }
                        let one = match self.model.decode(std::slice::from_ref(row)) {
                            Ok(mut out) if out.len() == 1 => Ok(out.remove(0)),
                            Ok(_) => Err(ApiError::with_status(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "the decode step gave no row",
                            )),
                            Err(e) => Err(model_error("the decode step", &e)),
                        };
                        if one.is_err() {
                            failed.push(i);
                        }
                        outputs.push((i, p, one));
                    }
                }
            }
        }
        let vocab = self.model.vocab();
        let mut failed = Vec::new();
        let mut ended = Vec::new();
        let slot_ctx = self.model.slot_ctx();
        for (i, p, output) in outputs {
            if failed.contains(&i) {
                continue;
            }
            let seq = &mut self.running[i];
            if let Some(p) = p {
                // A prompt row: only the prompt's last row gives a token.
                let last = p + 1 == seq.job.prompt.len();
                if output.is_ok() {
                    self.ctx.metrics.add_prompt_tokens(1);
                    seq.phase = if last {
                        Phase::Decode
                    } else {
                        Phase::Prefill(p + 1)
                    };
                }
                if output.is_ok() && !last {
                    continue;
                }
            }
            let token = match output {
                Ok(RowOutput::Token(t)) if (t as usize) < vocab => Ok(t),
                Ok(RowOutput::Token(t)) => Err(ApiError::with_status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the model gave token {t}, outside the vocabulary of {vocab}"),
                )),
                Ok(RowOutput::Logits(logits)) => {
                    seq.sample(&logits).map_err(|e| model_error("sampling", &e))
                }
                Ok(RowOutput::Drawn { token, rng }) if (token as usize) < vocab => {
                    seq.drawn(rng);
                    Ok(token)
                }
                Ok(RowOutput::Drawn { token, .. }) => Err(ApiError::with_status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the model drew token {token}, outside the vocabulary of {vocab}"),
                )),
                Err(e) => Err(e),
            };
            let ctx = &self.ctx;
            let accepted = token.and_then(|t| {
                seq.accept(t, ctx.codec.as_ref(), &ctx.end_ids, slot_ctx, &ctx.metrics)
                    .map_err(|e| model_error("detokenizing", &e))
            });
            match accepted {
                Ok(None) => {}
                Ok(Some(_)) => ended.push(i),
                Err(e) => {
                    tracing::warn!(slot = seq.slot, "a request failed: {}", e.message);
                    seq.fail(e);
                    failed.push(i);
                }
            }
        }
        ended.extend(failed);
        self.remove(ended);
    }

    /// The decode-step row of sequence `index`: its next input, or with `prompt`, its prompt
    /// token at that position (only the prompt's last row asks for logits when it samples).
    fn row(&self, index: usize, prompt: Option<usize>) -> StepRow {
        let seq = &self.running[index];
        match prompt {
            Some(p) => StepRow {
                slot: seq.slot,
                token: seq.job.prompt[p],
                pos: p,
                pick: if p + 1 < seq.job.prompt.len() {
                    Pick::Greedy
                } else {
                    seq.pick()
                },
            },
            None => {
                let (token, pos) = seq.next_input();
                StepRow {
                    slot: seq.slot,
                    token,
                    pos,
                    pick: seq.pick(),
                }
            }
        }
    }
}

/// A 500 for a model failure during `what`.
fn model_error(what: &str, e: &Error) -> ApiError {
    ApiError::with_status(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{what} failed: {e}"),
    )
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
