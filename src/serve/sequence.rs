//! One request as the scheduler sees it: the [`Job`] a handler submits, the [`Event`]s it gets
//! back, and the [`Sequence`] state while the job holds a KV-cache slot (its sampler, its
//! detokenizer and stop matcher, its timings).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::metrics::Metrics;
use super::stop::{StopMatcher, StopOutcome};
use super::text::{TextCodec, Utf8Stream};
use crate::error::Result;
use crate::model::sampler::{Sampler, SamplerConfig};
use crate::model::slots::{Pick, RowDraw};
use crate::sampler::device::DrawState;

/// How a sequence picks its tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// The most likely token (computed on the device in decode steps).
    Greedy,
    /// The sampler on the row's logits, with these settings (seed included).
    Sample(SamplerConfig),
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

impl FinishReason {
    /// The name the API gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a job's handler receives, in order: text pieces, then one `Done` or one `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Newly generated text (never empty, never a split character, never part of a stop string).
    Text(String),
    /// The generation ended.
    Done {
        /// Why.
        reason: FinishReason,
        /// Tokens of the prompt.
        prompt_tokens: usize,
        /// Tokens generated (an end-of-generation token included, as `generate` counts it).
        completion_tokens: usize,
        /// The generated token ids.
        token_ids: Vec<u32>,
    },
    /// The request failed (the others go on).
    Failed(ApiError),
}

/// A request for the scheduler.
#[derive(Debug)]
pub struct Job {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least one).
    pub max_tokens: usize,
    /// How tokens are picked.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Go on past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Where the job's events go; a closed channel means the client has gone.
    pub events: UnboundedSender<Event>,
    /// When the request arrived (time to first token counts from here).
    pub arrived: Instant,
}

/// A job's place among those a scheduler holds, queued or running: taken at submission (if the
/// count is below the limit), given back when dropped, wherever the job ends.
#[derive(Debug)]
pub struct Ticket(Arc<AtomicUsize>);

impl Ticket {
    /// Takes a place in `held` if fewer than `limit` are taken.
    pub fn take(held: &Arc<AtomicUsize>, limit: usize) -> Option<Ticket> {
        held.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < limit).then_some(n + 1)
        })
        .ok()
        .map(|_| Ticket(held.clone()))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a sequence stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Its prompt is being prefilled: this many tokens are in the slot.
    Prefill(usize),
    /// It takes part in decode steps.
    Decode,
}

/// A job holding a slot.
pub struct Sequence {
    /// The job.
    pub job: Job,
    /// Its KV-cache slot.
    pub slot: usize,
    /// Where it stands.
    pub phase: Phase,
    /// Prompt and generated tokens so far (the sampler's history).
    pub history: Vec<u32>,
    generated: usize,
    sampler: Sampler,
    utf8: Utf8Stream,
    stop: StopMatcher,
    last_token_at: Option<Instant>,
    ticket: Option<Ticket>,
}

impl Sequence {
    /// A job placed in `slot`, its prompt not yet prefilled.
    pub fn new(job: Job, slot: usize) -> Result<Self> {
        let config = match &job.sampling {
            Sampling::Greedy => SamplerConfig::default(),
            Sampling::Sample(c) => c.clone(),
        };
        Ok(Sequence {
            sampler: Sampler::new(config)?,
            history: job.prompt.clone(),
            stop: StopMatcher::new(job.stop.clone()),
            utf8: Utf8Stream::default(),
            generated: 0,
            last_token_at: None,
            ticket: None,
            phase: Phase::Prefill(0),
            slot,
            job,
        })
    }

    /// Holds the job's ticket for as long as the sequence lives.
    pub fn with_ticket(mut self, ticket: Ticket) -> Self {
        self.ticket = Some(ticket);
        self
    }

    /// Whether the client has gone (its events have no receiver).
    pub fn is_abandoned(&self) -> bool {
        self.job.events.is_closed()
    }

    /// Whether decode steps may give this row only its most likely token.
    pub fn greedy(&self) -> bool {
        self.job.sampling == Sampling::Greedy
    }

    /// The token fed at the next decode step and its position.
    pub fn next_input(&self) -> (u32, usize) {
        let pos = self.history.len() - 1;
        (self.history[pos], pos)
    }

    /// How its next token is chosen: greedily, drawn on the device as its sampler would draw it,
    /// or (settings a device draw cannot take: a penalty window over 1,024 tokens) by its
    /// sampler from the logits.
    pub fn pick(&self) -> Pick {
        if self.greedy() {
            return Pick::Greedy;
        }
        let (config, rng) = (self.sampler.config(), self.sampler.state());
        match DrawState::new(config, rng, self.history.len()) {
            Ok(state) => Pick::Draw(RowDraw::new(state, &self.history)),
            Err(_) => Pick::Logits,
        }
    }

    /// Picks the next token from a logits row with the sequence's sampler.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        self.sampler.sample(logits, &self.history)
    }

    /// Takes the generator's state after a device draw from [`Sequence::pick`]'s state, so that
    /// the next draw goes on from it (the token itself goes to [`Sequence::accept`]).
    pub fn drawn(&mut self, rng: u64) {
        self.sampler.set_state(rng);
    }

    /// Takes a new token: counts it, turns it into text, checks the end conditions, and sends
    /// what the client may see. `slot_ctx` is the slot's size. Returns why the sequence ended, if
    /// it did (its `Done` event is sent then).
    pub fn accept(
        &mut self,
        token: u32,
        codec: &dyn TextCodec,
        end_ids: &[u32],
        slot_ctx: usize,
        metrics: &Metrics,
    ) -> Result<Option<FinishReason>> {
        let now = Instant::now();
        let since = self.last_token_at.unwrap_or(self.job.arrived);
        metrics.add_generated_token(self.last_token_at.is_none(), now - since);
        self.last_token_at = Some(now);
        self.history.push(token);
        self.generated += 1;
        if !self.job.ignore_eos && end_ids.contains(&token) {
            return Ok(Some(self.finish(FinishReason::Stop, true)));
        }
        if !codec.is_special(token) {
            let mut bytes = Vec::new();
            codec.token_bytes(token, &mut bytes)?;
            let text = self.utf8.push(&bytes);
            match self.stop.push(&text) {
                StopOutcome::Continue(t) => self.send_text(t),
                StopOutcome::Stopped(t) => {
                    self.send_text(t);
                    return Ok(Some(self.finish(FinishReason::Stop, false)));
                }
            }
        }
        // The next step would feed this token at position history.len() - 1.
        if self.generated >= self.job.max_tokens || self.history.len() > slot_ctx {
            return Ok(Some(self.finish(FinishReason::Length, true)));
        }
        Ok(None)
    }

    /// Sends the failure; the sequence is over.
    pub fn fail(&self, error: ApiError) {
        let _ = self.job.events.send(Event::Failed(error));
    }

    fn send_text(&self, text: String) {
        if !text.is_empty() {
            let _ = self.job.events.send(Event::Text(text));
        }
    }

    /// Sends the text still held (when `flush`) and the `Done` event.
    fn finish(&mut self, reason: FinishReason, flush: bool) -> FinishReason {
        if flush {
            let tail = self.utf8.finish();
            match self.stop.push(&tail) {
                StopOutcome::Continue(t) => {
                    let rest = self.stop.finish();
                    self.send_text(t + &rest);
                }
                StopOutcome::Stopped(t) => self.send_text(t),
            }
        }
        let _ = self.job.events.send(Event::Done {
            reason,
            prompt_tokens: self.job.prompt.len(),
            completion_tokens: self.generated,
            token_ids: self.history[self.job.prompt.len()..].to_vec(),
        });
        reason
    }
}

/// The shared parts every sequence's token handling needs.
pub struct TokenContext {
    /// The tokenizer's side the server needs.
    pub codec: Arc<dyn TextCodec>,
    /// Tokens that end a generation.
    pub end_ids: Vec<u32>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
}
