//! The executor and its sessions: every op goes through [`Session::push`], which places barriers
//! automatically (direct mode) or records the dispatch (recorded mode). [`Session::finish`] is
//! the one way to end a session; it takes a [`Plan`] and returns a named [`FinishReport`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::backend::{Buffer, Capabilities, Device, Encoder, EncoderOptions, Submission};
use crate::config::RuntimeConfig;
pub use crate::config::{Mode, Plan};
use crate::error::{Error, Result};
use crate::graph::{passes, Arg, ComputeGraph, Dispatch, Node, Nodes, RangeSet};

mod ops;

/// What `finish` did, every figure named.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FinishReport {
    /// Dispatches executed.
    pub dispatches: usize,
    /// Barriers executed.
    pub barriers: usize,
    /// Barriers the same dispatches would need in program order, before any pass.
    pub barriers_sequential: usize,
    /// Patterns of dispatches fused into one.
    pub fusions: usize,
    /// Fusions per rule name.
    pub fusions_by_rule: BTreeMap<&'static str, usize>,
    /// Producers the narrowing pass narrowed to f16 (`graph::passes::narrow`).
    pub narrowed: usize,
    /// Dispatches the reorder pass moved.
    pub reordered: usize,
    /// Concurrent-group size -> number of groups of that size.
    pub group_sizes: BTreeMap<usize, usize>,
    /// Submissions made (2 for a split submission).
    pub submissions: usize,
    /// Time spent optimizing and encoding (zero unless the plan asked for timing).
    pub encode_time: Duration,
    /// Time spent waiting for the device after the last submission (zero unless timed).
    pub wait_time: Duration,
}

/// Owns a device and hands out sessions.
#[derive(Debug, Clone)]
pub struct Executor {
    device: Device,
    config: RuntimeConfig,
}

impl Executor {
    /// An executor for `device`.
    pub fn new(device: Device) -> Self {
        Executor {
            device,
            config: RuntimeConfig::default(),
        }
    }

    /// The same executor with other settings.
    pub fn with_config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }

    /// The settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Starts a session.
    pub fn begin(&self, mode: Mode) -> Session {
        self.begin_with(mode, EncoderOptions::default())
    }

    /// Starts a session whose encoders have `options` (with
    /// [`EncoderOptions::sync_each_dispatch`], every dispatch is waited for before the next: the
    /// per-op synchronized pattern). Other sessions on the same device are unaffected.
    pub fn begin_with(&self, mode: Mode, options: EncoderOptions) -> Session {
        Session::new(self.clone(), mode, options)
    }

    /// Optimizes a recorded graph as `plan` says (fuse with the fusion rules the backend of
    /// `caps` declares, reorder, place barriers) and reports.
    pub fn optimize(graph: &mut ComputeGraph, plan: &Plan, caps: &Capabilities) -> FinishReport {
        let barriers_sequential = passes::program_order_barriers(graph);
        let rules = if plan.fuse {
            crate::ops::fusion_rules_for(caps)
        } else {
            Vec::new()
        };
        let narrowings = if plan.fuse {
            crate::ops::narrow::rules_for(caps.f16_products)
        } else {
            Vec::new()
        };
        let passes::Optimized {
            fusions,
            fusions_by_rule,
            narrowed,
            reordered,
            barriers,
        } = passes::optimize(graph, &rules, &narrowings, plan.reorder.unwrap_or(0));
        tracing::debug!(
            dispatches = graph.dispatch_count(),
            barriers,
            barriers_sequential,
            fusions,
            narrowed,
            reordered,
            "optimized graph"
        );
        FinishReport {
            dispatches: graph.dispatch_count(),
            barriers,
            barriers_sequential,
            fusions,
            fusions_by_rule: fusions_by_rule.into_iter().collect(),
            narrowed,
            reordered,
            group_sizes: histogram(&graph.group_sizes()),
            ..FinishReport::default()
        }
    }

    /// Runs a graph whose barriers are already placed, split or not, and waits for it.
    pub fn run(&self, graph: &ComputeGraph, split: bool) -> Result<RunTimes> {
        self.run_with(graph, split, EncoderOptions::default())
    }

    /// [`Executor::run`] with encoders of `options`.
    fn run_with(
        &self,
        graph: &ComputeGraph,
        split: bool,
        options: EncoderOptions,
    ) -> Result<RunTimes> {
        let len = graph.len();
        let cut = if split {
            passes::split_index(graph)
        } else {
            len
        };
        let start = Instant::now();
        let mut submissions = Vec::with_capacity(2);
        for part in [graph.nodes_in(0..cut), graph.nodes_in(cut..len)] {
            if part.clone().any(|n| n.as_dispatch().is_some()) {
                submissions.push(self.encode_part(part, options)?);
            }
        }
        let encoded = Instant::now();
        let count = submissions.len();
        for s in submissions {
            s.wait()?;
        }
        Ok(RunTimes {
            submissions: count,
            encode: encoded - start,
            wait: encoded.elapsed(),
        })
    }

    fn encode_part(
        &self,
        nodes: Nodes<'_>,
        options: EncoderOptions,
    ) -> Result<Box<dyn Submission>> {
        let mut enc = self.device.backend().encoder(options);
        for node in nodes {
            match node {
                Node::Dispatch(d) => enc.encode(d)?,
                Node::Barrier => enc.barrier(),
            }
        }
        enc.submit()
    }
}

/// Encode and wait times of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunTimes {
    /// Submissions made.
    pub submissions: usize,
    /// Time from the start to the last submission.
    pub encode: Duration,
    /// Time from the last submission until the work was done.
    pub wait: Duration,
}

/// A direct session's encoder and what it submitted early.
struct Direct {
    encoder: Box<dyn Encoder>,
    submitted: Vec<Box<dyn Submission>>,
}

/// One pass of work on a device. Every op is a method (see `ops/`), each declaring which of its
/// arguments it reads and writes; barriers follow from those declarations.
pub struct Session {
    executor: Executor,
    device: Device,
    mode: Mode,
    options: EncoderOptions,
    graph: ComputeGraph,
    group: RangeSet,
    direct: Option<Direct>,
    /// Whether a direct session submits its first `DIRECT_SPLIT_AT` dispatches early.
    split_early: bool,
    barriers: usize,
    dispatches: usize,
    started: Instant,
}

const DIRECT_SPLIT_AT: usize = 64;

impl Session {
    fn new(executor: Executor, mode: Mode, options: EncoderOptions) -> Self {
        let device = executor.device.clone();
        let direct = match mode {
            Mode::Direct => Some(Direct {
                encoder: device.backend().encoder(options),
                submitted: Vec::new(),
            }),
            Mode::Recorded => None,
        };
        // Direct mode does not know the pass's length; where a submission runs while the rest is
        // encoded, it submits its first dispatches early (not when each dispatch is its own).
        let split_early = executor.config.split
            && device.capabilities().early_submit
            && !options.sync_each_dispatch;
        Session {
            executor,
            device,
            mode,
            options,
            graph: ComputeGraph::new(),
            group: RangeSet::new(),
            direct,
            split_early,
            barriers: 0,
            dispatches: 0,
            started: Instant::now(),
        }
    }

    /// The session's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The session's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The options of the session's encoders.
    pub fn options(&self) -> EncoderOptions {
        self.options
    }

    /// Adds one dispatch: checks that its buffers live on this device, then encodes it (direct
    /// mode, with a barrier first if it conflicts with the current group) or records it.
    pub fn push(&mut self, dispatch: Dispatch) -> Result<()> {
        for arg in dispatch.args() {
            if let Arg::Buffer(buf, _) = arg {
                self.check_device(dispatch.kernel().name(), buf)?;
            }
        }
        self.dispatches += 1;
        let Some(direct) = &mut self.direct else {
            self.graph.push(dispatch);
            return Ok(());
        };
        // Barriers are counted where they are needed, whether or not the backend needs a command
        // for them (one in-order stream does not).
        if self.group.conflicts(dispatch.reads(), dispatch.writes()) {
            direct.encoder.barrier();
            self.barriers += 1;
            self.group.clear();
        }
        self.group.add(dispatch.reads(), dispatch.writes());
        direct.encoder.encode(dispatch.as_view())?;
        if self.split_early
            && direct.submitted.is_empty()
            && direct.encoder.encoded() == DIRECT_SPLIT_AT
        {
            direct.submitted.push(direct.encoder.submit()?);
            self.group.clear();
        }
        Ok(())
    }

    fn check_device(&self, op: &'static str, buf: &Buffer) -> Result<()> {
        if self.device.owns(buf) {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                op,
                arg: "buffer",
                got: buf.allocation().location(),
                expected: self.device.name(),
            })
        }
    }

    /// Declares that nobody reads `buf` after this pass (see [`ComputeGraph::mark_scratch`]):
    /// the optimizer may then drop a write to it that nothing in the pass reads again. A direct
    /// session runs every dispatch as recorded, so there it changes nothing.
    pub fn mark_scratch(&mut self, buf: &Buffer) {
        if self.direct.is_none() {
            self.graph.mark_scratch(buf);
        }
    }

    /// Ends a recorded session without running it, handing over its graph (for inspection,
    /// export, or replay with [`Executor::run`]). A direct session has no graph: an error.
    pub fn into_graph(self) -> Result<ComputeGraph> {
        match self.mode {
            Mode::Recorded => Ok(self.graph),
            Mode::Direct => Err(Error::InvalidArgument(
                "into_graph needs a recorded session; this one is direct".into(),
            )),
        }
    }

    /// Ends the session: optimizes (recorded mode) as the plan says, submits, waits, reports.
    pub fn finish(mut self, plan: &Plan) -> Result<FinishReport> {
        match self.direct.take() {
            Some(Direct {
                mut encoder,
                submitted,
            }) => {
                let encode_start = self.started;
                let mut all = submitted;
                all.push(encoder.submit()?);
                let encoded = Instant::now();
                let submissions = all.len();
                for s in all {
                    s.wait()?;
                }
                let waited = encoded.elapsed();
                let mut report = FinishReport {
                    dispatches: self.dispatches,
                    barriers: self.barriers,
                    barriers_sequential: self.barriers,
                    submissions,
                    ..FinishReport::default()
                };
                if plan.timing {
                    report.encode_time = encoded - encode_start;
                    report.wait_time = waited;
                }
                Ok(report)
            }
            None => {
                let start = Instant::now();
                let mut graph = std::mem::take(&mut self.graph);
                let mut report = Executor::optimize(&mut graph, plan, self.device.capabilities());
                let optimize_time = start.elapsed();
                let times = self.executor.run_with(&graph, plan.split, self.options)?;
                report.submissions = times.submissions;
                if plan.timing {
                    report.encode_time = optimize_time + times.encode;
                    report.wait_time = times.wait;
                }
                Ok(report)
            }
        }
    }
}

fn histogram(sizes: &[usize]) -> BTreeMap<usize, usize> {
    let mut h = BTreeMap::new();
    for &s in sizes {
        *h.entry(s).or_insert(0) += 1;
    }
    h
}
