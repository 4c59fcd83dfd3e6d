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
//! only their token id, sampled rows their logits row.
//!
//! On the CPU a decode row gives the bits of `Engine::decode` over the same slot contents, so a
//! sequence's greedy tokens equal `Engine::generate`'s when its prompt was prefilled as `generate`
//! prefills it. Prefill passes of two or more tokens give the same bits whatever their length;
//! a one-token chunk takes the one-row (decode) form, whose sums run in another order. So chunk a
//! prompt as `generate` does (chunks of its `max_batch`, `--batch`: 512 by default on the CPU, 4096 on CUDA, from
//! position 0), or at least never leave a one-token chunk where it has none.

use crate::backend::EncoderOptions;
use crate::error::{Error, Result};
use crate::executable::{Executable, KernelTiming, StableSet};
use crate::model::engine::RunMode;
use crate::model::sampler::{Sampler, SamplerConfig};
use crate::model::slots::{RowOutput, SlotModel, StepRow};
use crate::model::transformer::{Logits, Transformer};
use crate::session::{Executor, Mode, Plan};

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
    instantiations: usize,
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
        self.instantiate(bucket)?.profile()
    }

    /// The allocations the model keeps for its whole life, which an instantiated step may use.
    fn stable_set(&self) -> StableSet {
        let named = self.model.stable_buffers();
        StableSet::from_named(named.iter().map(|(n, b)| (n.as_str(), b)))
    }

    /// Records the decode step of `bucket` rows, optimizes it as this engine's mode does and
    /// instantiates it.
    fn instantiate(&self, bucket: usize) -> Result<Executable> {
        let mut s = self.executor.begin(Mode::Recorded);
        self.model.record_decode_rows(&mut s, bucket, true)?;
        let mut graph = s.into_graph()?;
        let report = Executor::optimize(
            &mut graph,
            &self.plan,
            self.executor.device().capabilities(),
        );
        let exec = self.executor.instantiate(&graph, &self.stable_set())?;
        tracing::info!(bucket, ?report, stats = ?exec.stats(), "instantiated a batched decode step");
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
        let vocab = self.model.config().vocab;
        usize::try_from(id)
            .ok()
            .filter(|&i| i < vocab)
            .map(|i| i as u32)
            .ok_or_else(|| {
                Error::Backend(format!(
                    "the device argmax gave token {id}, outside the vocabulary of {vocab}"
                ))
            })
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
        let index = self
            .buckets
            .iter()
            .position(|&b| b == bucket)
            .unwrap_or_default();
        if self.mode == RunMode::Graph {
            if self.graphs[index].is_none() {
                // Built once per bucket: the step reads its rows' tokens, positions and slots
                // from the step buffer, so the same graph serves every step.
                self.graphs[index] = Some(self.instantiate(bucket)?);
                self.instantiations += 1;
            }
            if let Some(exec) = &self.graphs[index] {
                exec.launch()?;
            }
        } else {
            self.run(|s| self.model.record_decode_rows(s, bucket, true))?;
        }
        let device = self.executor.device();
        let ids = device.download::<i32>(&self.model.batch_next_tokens(rows.len())?)?;
        let logits = self.model.batch_logits(rows.len())?;
        let logits_row = |r: usize| device.download::<f32>(&logits.rows(r, 1)?);
        rows.iter()
            .zip(ids)
            .enumerate()
            .map(|(r, (row, id))| {
                if row.greedy {
                    Ok(RowOutput::Token(self.greedy_token(id, || logits_row(r))?))
                } else {
                    Ok(RowOutput::Logits(logits_row(r)?))
                }
            })
            .collect()
    }
}
