//! [`BatchEngine`]: the [`SlotModel`] a batching server runs. It owns a [`Transformer`] whose KV
//! cache holds several sequences ([`Transformer::load_slots`]) and the [`Executor`] that runs it,
//! prefills a prompt chunk into one slot with the single-sequence pass, and runs one decode step
//! for a batch of slots with one recorded graph per batch-size bucket.
//!
//! Buckets are 1, 2, 4, 8, 16 and 32 rows, capped by `max_rows` (which is a bucket itself). A step
//! of `n` rows runs the smallest bucket that holds them; the rows past `n` are padding: token 0
//! at position 0 of the padding slot (a slot of its own, so they never touch a sequence), and their
//! outputs are dropped. In graph mode each bucket's step is recorded, optimized and instantiated
//! once, then replayed for every step: the per-row tokens, positions and slots live in a device
//! buffer written once per step. Every step ends with a per-row device argmax; greedy rows read back
//! only their token id, rows for a host sampler their logits row. Rows that draw on the device
//! ([`Pick::Draw`]) take a second graph per bucket, whose step ends with a draw for every row
//! (`draw_rows`, a block a row) after the argmax: each sampled row reads back its token and its
//! generator's state, so no logits cross to the host. Its buffers are allocated at the first such
//! step: the draw's scratch is `36 * vocab` bytes a row of the largest bucket (147 MB for 32 rows
//! of Llama 3's 128,256 tokens).
//!
//! On the CPU a decode row gives the bits of `Engine::decode` over the same slot contents, so a
//! sequence's greedy tokens equal `Engine::generate`'s when its prompt was prefilled as `generate`
//! prefills it. Prefill passes of two or more tokens give the same bits whatever their length;
//! a one-token chunk takes the one-row (decode) form, whose sums run in another order. So chunk a
//! prompt as `generate` does (chunks of its `max_batch`, `--batch`: 512 by default on the CPU, 4096 on CUDA, from
//! position 0), or at least never leave a one-token chunk where it has none.

use crate::backend::EncoderOptions;
use crate::backend::{Buffer, DType};
use crate::error::{Error, Result};
use crate::executable::{Executable, KernelTiming, StableSet};
use crate::model::engine::RunMode;
use crate::model::sampler::{Sampler, SamplerConfig};
use crate::model::slots::{Pick, RowOutput, SlotModel, StepRow};
use crate::model::transformer::{Logits, Transformer};
use crate::ops::draw::{draw_scratch_len, DrawState, DRAW_MAX_ROW, DRAW_STATE_WORDS, DRAW_WINDOW};
use crate::session::{Executor, Mode, Plan, Session};

/// The batch sizes a decode step is recorded for (capped by `max_rows`).
pub const BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// A multi-slot model and the executor that runs it, as a [`SlotModel`].
pub struct BatchEngine {
    model: Transformer,
    executor: Executor,
    mode: RunMode,
    plan: Plan,
    buckets: Vec<usize>,
    /// The instantiated decode step of each bucket (graph mode), built at first use.
    graphs: Vec<Option<Executable>>,
    /// The same, ending with a draw for every row, for steps with rows that draw on the device.
    draw_graphs: Vec<Option<Executable>>,
    /// The draws' buffers, allocated at the first step that draws.
    draw: Option<RowDrawBuffers>,
    instantiations: usize,
}

/// What the device draws of a batched step read and write, a row for each of `max_rows`.
struct RowDrawBuffers {
    /// u32 `[max_rows, DRAW_STATE_WORDS]`: each row's settings and generator.
    state: Buffer,
    /// i32 `[max_rows, DRAW_WINDOW]`: each row's penalty window.
    window: Buffer,
    /// u32 `[max_rows, draw_scratch_len(vocab)]`: the draws' candidates.
    scratch: Buffer,
    /// i32 `[max_rows]`: the drawn tokens.
    out: Buffer,
}

impl BatchEngine {
    /// An engine running `model` (loaded with [`Transformer::load_slots`] and `max_rows > 0`)
    /// with `executor` in `mode`.
    pub fn new(model: Transformer, executor: Executor, mode: RunMode) -> Result<Self> {
        let max_rows = model.max_rows();
        if max_rows == 0 {
            return Err(Error::InvalidArgument(
                "a batch engine needs a model loaded with batched decode steps \
                 (Transformer::load_slots with max_rows > 0)"
                    .into(),
            ));
        }
        let mut buckets: Vec<usize> = BUCKETS.iter().copied().filter(|&b| b < max_rows).collect();
        buckets.push(max_rows);
        let plan = executor.config().plan();
        Ok(BatchEngine {
            graphs: buckets.iter().map(|_| None).collect(),
            draw_graphs: buckets.iter().map(|_| None).collect(),
            draw: None,
            buckets,
            model,
            executor,
            mode,
            plan,
            instantiations: 0,
        })
    }

    /// The model.
    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// The execution mode.
    pub fn mode(&self) -> RunMode {
        self.mode
    }

    /// The batch sizes decode steps run at, smallest first.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// The bucket a step of `rows` rows runs in: the smallest that holds them.
    pub fn bucket_for(&self, rows: usize) -> Result<usize> {
        self.buckets
            .iter()
            .copied()
            .find(|&b| b >= rows && rows > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a decode step takes 1 to {} rows, got {rows}",
                    self.model.max_rows()
                ))
            })
    }

    /// How many bucket graphs graph mode has instantiated (at most one per bucket, whatever the
    /// number of steps).
    pub fn instantiations(&self) -> usize {
        self.instantiations
    }

    /// A profiling run of one decode step of `rows` (every kernel timed), recorded and optimized
    /// as graph mode records it. Leaves the step's results in place, as [`SlotModel::decode`].
    pub fn profile_decode(&mut self, rows: &[StepRow]) -> Result<Vec<KernelTiming>> {
        let bucket = self.bucket_for(rows.len())?;
        let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let positions: Vec<usize> = rows.iter().map(|r| r.pos).collect();
        let slots: Vec<usize> = rows.iter().map(|r| r.slot).collect();
        self.model.set_rows(bucket, &tokens, &positions, &slots)?;
        self.instantiate(bucket, false)?.profile()
    }

    /// The allocations the model keeps for its whole life, which an instantiated step may use.
    fn stable_set(&self) -> StableSet {
        let mut named = self.model.stable_buffers();
        if let Some(d) = &self.draw {
            named.extend([
                ("draw_rows.state".to_string(), d.state.clone()),
                ("draw_rows.window".to_string(), d.window.clone()),
                ("draw_rows.scratch".to_string(), d.scratch.clone()),
                ("draw_rows.out".to_string(), d.out.clone()),
            ]);
        }
        StableSet::from_named(named.iter().map(|(n, b)| (n.as_str(), b)))
    }

    /// Records the decode step of `bucket` rows, with `draws` ending in a draw for every row.
    fn record_step(&self, s: &mut Session, bucket: usize, draws: bool) -> Result<()> {
        self.model.record_decode_rows(s, bucket, true)?;
        if !draws {
            return Ok(());
        }
        let d = self.draw.as_ref().ok_or_else(|| {
            Error::Backend("a drawing step was recorded before its buffers existed".into())
        })?;
        s.draw_rows(
            &self.model.batch_logits(bucket)?,
            &d.state.rows(0, bucket)?,
            &d.window.rows(0, bucket)?,
            &d.scratch.rows(0, bucket)?,
            &d.out.rows(0, bucket)?,
        )
    }

    /// Allocates the draws' buffers (once) and writes each row's state and, where a row's
    /// penalty looks at it, its window; rows that do not draw (greedy ones, a prompt's inner
    /// rows, the padding) draw greedily, and their tokens are not read.
    fn set_draws(&mut self, bucket: usize, rows: &[StepRow]) -> Result<()> {
        let device = self.executor.device().clone();
        if self.draw.is_none() {
            let (r, vocab) = (self.model.max_rows(), self.model.config().vocab);
            self.draw = Some(RowDrawBuffers {
                state: device.alloc(DType::U32, &[r, DRAW_STATE_WORDS])?,
                window: device.alloc(DType::I32, &[r, DRAW_WINDOW])?,
                scratch: device.alloc(DType::U32, &[r, draw_scratch_len(vocab)])?,
                out: device.alloc(DType::I32, &[r])?,
            });
        }
        let Some(d) = &self.draw else {
            return Ok(());
        };
        let greedy = DrawState::new(&SamplerConfig::default(), 0, 0)?;
        let mut words = Vec::with_capacity(bucket * DRAW_STATE_WORDS);
        let mut windows: Vec<i32> = Vec::new();
        for r in 0..bucket {
            let draw = rows.get(r).and_then(|row| match &row.pick {
                Pick::Draw(draw) => Some(draw),
                _ => None,
            });
            words.extend(draw.map_or(greedy, |d| d.state).words());
            // The window is read only where the penalty is on; then it must be whole.
            if let Some(d) = draw.filter(|d| d.state.penalty != 1.0) {
                if d.window.len() != DRAW_WINDOW {
                    return Err(Error::InvalidArgument(format!(
                        "row {r} penalizes repetition, and its window has {} tokens, not {DRAW_WINDOW} \
                         (RowDraw::new)",
                        d.window.len()
                    )));
                }
                windows.resize(r * DRAW_WINDOW, 0);
                windows.extend_from_slice(&d.window);
            }
        }
        device.write(&d.state.rows(0, bucket)?, &words)?;
        if !windows.is_empty() {
            windows.resize(bucket * DRAW_WINDOW, 0);
            device.write(&d.window.rows(0, bucket)?, &windows)?;
        }
        Ok(())
    }

    /// Records the decode step of `bucket` rows (with `draws`, ending in the rows' draws),
    /// optimizes it as this engine's mode does and instantiates it.
    fn instantiate(&self, bucket: usize, draws: bool) -> Result<Executable> {
        let mut s = self.executor.begin(Mode::Recorded);
        self.record_step(&mut s, bucket, draws)?;
        let mut graph = s.into_graph()?;
        let report = Executor::optimize(
            &mut graph,
            &self.plan,
            self.executor.device().capabilities(),
        );
        let exec = self.executor.instantiate(&graph, &self.stable_set())?;
        tracing::info!(bucket, draws, ?report, stats = ?exec.stats(), "instantiated a batched decode step");
        Ok(exec)
    }

    /// Records and runs one pass with `record` in this engine's mode (graph mode runs passes it
    /// does not instantiate as recorded mode does).
    fn run(&self, record: impl Fn(&mut crate::session::Session) -> Result<()>) -> Result<()> {
        if self.mode == RunMode::PerOpSync {
            let sync_each = EncoderOptions {
                sync_each_dispatch: true,
            };
            let mut s = self.executor.begin_with(Mode::Direct, sync_each);
            record(&mut s)?;
            s.finish(&self.plan)?;
            return Ok(());
        }
        let mode = match self.mode {
            RunMode::Direct => Mode::Direct,
            _ => Mode::Recorded,
        };
        let mut s = self.executor.begin(mode);
        record(&mut s)?;
        s.finish(&self.plan)?;
        Ok(())
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.model.slots() {
            return Err(Error::InvalidArgument(format!(
                "slot {slot} is outside the cache's {} slots",
                self.model.slots()
            )));
        }
        Ok(())
    }

    /// The token a greedy row's device argmax gave, or the host's greedy choice over its logits
    /// when the device found no finite maximum (-1).
    fn greedy_token(&self, id: i32, logits_row: impl FnOnce() -> Result<Vec<f32>>) -> Result<u32> {
        if id < 0 {
            let mut greedy = Sampler::new(SamplerConfig::default())?;
            return greedy.sample(&logits_row()?, &[]);
        }
        self.device_token(id, "argmax")
    }

    /// A token the device's `what` (its argmax, its draw) gave, checked against the vocabulary.
    fn device_token(&self, id: i32, what: &str) -> Result<u32> {
        let vocab = self.model.config().vocab;
        usize::try_from(id)
            .ok()
            .filter(|&i| i < vocab)
            .map(|i| i as u32)
            .ok_or_else(|| {
                Error::Backend(format!(
                    "the device {what} gave token {id}, outside the vocabulary of {vocab}"
                ))
            })
    }

    /// Where bucket `index`'s instantiated step is kept (with `draws`, the one ending in draws).
    fn graph_for(&mut self, index: usize, draws: bool) -> &mut Option<Executable> {
        if draws {
            &mut self.draw_graphs[index]
        } else {
            &mut self.graphs[index]
        }
    }
}

impl SlotModel for BatchEngine {
    fn slots(&self) -> usize {
        self.model.slots()
    }

    fn slot_ctx(&self) -> usize {
        self.model.max_ctx()
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab
    }

    fn max_chunk(&self) -> usize {
        self.model.max_batch()
    }

    fn max_rows(&self) -> usize {
        self.model.max_rows()
    }

    fn prefill(&mut self, slot: usize, tokens: &[u32], pos0: usize) -> Result<Vec<f32>> {
        self.check_slot(slot)?;
        if tokens.is_empty() || tokens.len() > self.max_chunk() {
            return Err(Error::InvalidArgument(format!(
                "a prefill chunk takes 1 to {} tokens, got {}",
                self.max_chunk(),
                tokens.len()
            )));
        }
        // Checks the tokens and that the chunk fits in the slot.
        self.model.set_inputs(tokens, pos0)?;
        let rows = tokens.len();
        let start = std::time::Instant::now();
        self.run(|s| {
            self.model
                .record_in_slot(s, rows, Logits::Last, false, slot)
        })?;
        let ran = start.elapsed();
        let logits = self
            .executor
            .device()
            .download(&self.model.logits_buffer(1)?)?;
        tracing::trace!(
            rows,
            run_us = ran.as_micros() as u64,
            total_us = start.elapsed().as_micros() as u64,
            "a prefill chunk"
        );
        Ok(logits)
    }

    fn decode(&mut self, rows: &[StepRow]) -> Result<Vec<RowOutput>> {
        let bucket = self.bucket_for(rows.len())?;
        let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
        let positions: Vec<usize> = rows.iter().map(|r| r.pos).collect();
        let slots: Vec<usize> = rows.iter().map(|r| r.slot).collect();
        self.model.set_rows(bucket, &tokens, &positions, &slots)?;
        // Rows of a vocabulary too large for the device's draw read their logits instead.
        let draws = self.model.config().vocab <= DRAW_MAX_ROW
            && rows.iter().any(|r| matches!(r.pick, Pick::Draw(_)));
        if draws {
            self.set_draws(bucket, rows)?;
        }
        let index = self
            .buckets
            .iter()
            .position(|&b| b == bucket)
            .unwrap_or_default();
        if self.mode == RunMode::Graph {
            if self.graph_for(index, draws).is_none() {
                // Built once per bucket: the step reads its rows' tokens, positions and slots
                // (and draws' states) from device buffers, so the same graph serves every step.
                let exec = self.instantiate(bucket, draws)?;
                self.instantiations += 1;
                *self.graph_for(index, draws) = Some(exec);
            }
            if let Some(exec) = self.graph_for(index, draws) {
                exec.launch()?;
            }
        } else {
            self.run(|s| self.record_step(s, bucket, draws))?;
        }
        let device = self.executor.device();
        let ids = device.download::<i32>(&self.model.batch_next_tokens(rows.len())?)?;
        let drawn = match (&self.draw, draws) {
            (Some(d), true) => Some((
                device.download::<i32>(&d.out.rows(0, rows.len())?)?,
                device.download::<u32>(&d.state.rows(0, rows.len())?)?,
            )),
            _ => None,
        };
        let logits = self.model.batch_logits(rows.len())?;
        let logits_row = |r: usize| device.download::<f32>(&logits.rows(r, 1)?);
        rows.iter()
            .zip(ids)
            .enumerate()
            .map(|(r, (row, id))| match (&row.pick, &drawn) {
                (Pick::Greedy, _) => Ok(RowOutput::Token(self.greedy_token(id, || logits_row(r))?)),
                (Pick::Draw(_), Some((tokens, words))) if tokens[r] >= 0 => Ok(RowOutput::Drawn {
                    token: self.device_token(tokens[r], "draw")?,
                    rng: words[r * DRAW_STATE_WORDS] as u64
                        | (words[r * DRAW_STATE_WORDS + 1] as u64) << 32,
                }),
                // No finite logit (the host's sampler says so), or no device draw.
                _ => Ok(RowOutput::Logits(logits_row(r)?)),
            })
            .collect()
    }
}
