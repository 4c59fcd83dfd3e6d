//! The schedule sanitizer: runs a recorded graph serially and optimized (fused, reordered,
//! concurrent), with every dead scratch byte poisoned, and compares the outputs bitwise.
//!
//! # What it checks
//!
//! The optimizer trusts each dispatch's declared read and write ranges. A kernel that reads bytes it
//! did not declare, or a dispatch whose declarations are incomplete, gives results that depend on
//! the schedule or on stale memory. The sanitizer makes such bugs visible:
//!
//! 1. **Serial, NaN poison** (the reference): the graph as recorded, one dispatch per submission
//!    (with the patterns fused whose fused kernel the backend declares not bit-exact against the
//!    plain ops: CUDA's block fusions). Before each dispatch, every scratch byte that is dead
//!    there is filled with poison.
//! 2. **Serial, zero poison**: the same, with zero bytes as the poison. If its outputs differ from
//!    run 1, some kernel read bytes that were dead by the declarations (a `Write` argument it
//!    actually reads, a read outside its declared views): a *declaration mismatch*.
//! 3. **Optimized, NaN poison**: the graph through [`Executor::optimize`] with the given plan
//!    (fusion, reordering, barrier placement), each concurrent group submitted as a unit (its
//!    dispatches run concurrently on the CPU), with the dead scratch bytes poisoned at every
//!    barrier. If its outputs differ from run 1, the optimized schedule changed the result: a
//!    *schedule mismatch* (a missing write declaration that the reorder used to move a reader
//!    before the writer, a fusion that dropped a live intermediate, ...).
//!
//! All non-scratch state the graph writes (KV cache, logits, any written input) is snapshotted
//! before the first run and restored before each run and once more at the end, so on return only
//! the scratch bytes differ from before the call (they hold poison).
//!
//! # Liveness and poison
//!
//! Scratch is the set of byte ranges the caller names as not meaningful between passes
//! (activations, attention partials; never weights, KV cache or step inputs). The runs are split
//! into units (one dispatch serially, one concurrent group optimized). A scratch byte is *live*
//! before a unit when the first later access to it is a read (a `Read` or `ReadWrite` argument),
//! or when nothing later touches it and it lies in an output; every other scratch byte is *dead*:
//! the next access fully overwrites it (`Write` declares that every byte of the view may be
//! overwritten) or nothing reads it again. Before the first unit all scratch is poisoned (scratch
//! read before it is written is a bug by definition); before unit `i > 0` the bytes that are dead
//! there and were live before unit `i - 1` or written by it are poisoned (the rest still holds
//! poison). Analysis is byte-exact, per allocation.
//!
//! The NaN poison depends on the dtype of the scratch view holding the byte: f32 `0x7FC5A5A5`,
//! f16 `0x7EA5`, bf16 `0x7FE5` (quiet NaNs with a payload), `0xA5` bytes for every other dtype (an
//! i32 index of `0xA5A5A5A5` is negative, so index kernels fail loudly).
//!
//! # Report
//!
//! [`SanitizeReport`] names the first differing output, element, both values (the reference's and
//! the other run's) and the number of differing elements. When a run differs, both runs are
//! repeated with a hash of every dispatch's written ranges taken right after it ran (after its
//! group, in the optimized run; nothing else in a group writes those bytes), and the report names
//! the first dispatch, in recorded order, whose written bytes differ (best effort: a fused dispatch
//! has no serial counterpart and is skipped; other dispatches are matched by kernel, ranges and
//! occurrence, which the reorder pass preserves for dispatches with identical ranges since they
//! conflict). A kernel error in any run is returned as an error naming the run.

use std::collections::{HashMap, HashSet};

use crate::backend::{Buffer, DType, Device};
use crate::error::{Error, Result};
use crate::graph::{passes, Arg, ComputeGraph, Dispatch, KernelId, Node, Range};
use crate::model::transformer::{Logits, Transformer};
use crate::session::{Executor, Mode, Plan};

mod byte_set;

use byte_set::{byte_set_of, ByteSet};

/// The f32 poison: a quiet NaN with payload `0x45A5A5`.
pub const POISON_F32: u32 = 0x7FC5_A5A5;
/// The f16 poison: a quiet NaN with a payload.
pub const POISON_F16: u16 = 0x7EA5;
/// The bf16 poison: a quiet NaN with a payload.
pub const POISON_BF16: u16 = 0x7FE5;
/// The poison byte of every other dtype.
pub const POISON_BYTE: u8 = 0xA5;

/// What a sanitizer run checks: a recorded graph, its scratch and its outputs.
#[derive(Debug, Clone, Copy)]
pub struct SanitizeInput<'a> {
    /// The graph as recorded, before any optimization (barriers in it are ignored).
    pub graph: &'a ComputeGraph,
    /// Views whose bytes are not meaningful between passes; the sanitizer poisons them. The view's
    /// dtype picks the poison pattern.
    pub scratch: &'a [Buffer],
    /// The outputs to compare bitwise, each with a name for the report.
    pub outputs: &'a [(String, Buffer)],
}

/// The first difference between the outputs of two runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    /// The run the other is compared against.
    pub reference_run: &'static str,
    /// The run that differs.
    pub other_run: &'static str,
    /// The output's name.
    pub output: String,
    /// Index of the first differing element (of a block, for block formats).
    pub element: usize,
    /// The output's dtype.
    pub dtype: String,
    /// The element in the reference run, with its bits.
    pub expected: String,
    /// The element in the other run, with its bits.
    pub got: String,
    /// Elements of this output that differ.
    pub differing_elements: usize,
    /// The first dispatch, in recorded order, whose written bytes differ between the two runs.
    pub first_divergent: Option<DivergentDispatch>,
}

/// A dispatch whose written bytes differ between two runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DivergentDispatch {
    /// Its index among the recorded graph's dispatches.
    pub index: usize,
    /// Its kernel.
    pub kernel: String,
    /// Its op kind.
    pub op: String,
}

/// What the sanitizer did and found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SanitizeReport {
    /// Dispatches of the recorded graph (run serially).
    pub dispatches: usize,
    /// Dispatches of the optimized graph.
    pub dispatches_optimized: usize,
    /// Concurrent groups of the optimized graph.
    pub groups_optimized: usize,
    /// Fusions the optimizer made.
    pub fusions: usize,
    /// Dispatches the reorder pass moved.
    pub reordered: usize,
    /// Bytes poisoned during the serial NaN run.
    pub poisoned_bytes_serial: u64,
    /// Bytes poisoned during the optimized run.
    pub poisoned_bytes_optimized: u64,
    /// Outputs compared.
    pub outputs: usize,
    /// Bytes of output compared per run.
    pub output_bytes: usize,
    /// Serial with NaN poison versus serial with zero poison: a difference means some kernel read
    /// bytes its declarations say are dead.
    pub declaration_mismatch: Option<Mismatch>,
    /// Serial versus optimized (both NaN poison): a difference means the schedule changed the result.
    pub schedule_mismatch: Option<Mismatch>,
}

impl SanitizeReport {
    /// Whether every compared output was bitwise equal.
    pub fn passed(&self) -> bool {
        self.declaration_mismatch.is_none() && self.schedule_mismatch.is_none()
    }

    /// A one-line verdict.
    pub fn verdict(&self) -> String {
        let shape = format!(
            "{} dispatches serial vs {} optimized in {} groups ({} fusions, {} reordered)",
            self.dispatches,
            self.dispatches_optimized,
            self.groups_optimized,
            self.fusions,
            self.reordered
        );
        match self.schedule_mismatch.as_ref().or(self.declaration_mismatch.as_ref()) {
            None => format!(
                "sanitize: ok: {shape}; {} outputs ({} bytes) bitwise equal; {} + {} bytes poisoned",
                self.outputs, self.output_bytes, self.poisoned_bytes_serial, self.poisoned_bytes_optimized
            ),
            Some(m) => {
                let node = match &m.first_divergent {
                    Some(d) => format!("; first divergent dispatch #{} {} ({})", d.index, d.kernel, d.op),
                    None => String::new(),
                };
                format!(
                    "sanitize: MISMATCH ({} vs {}): output `{}` element {}: expected {}, got {} \
                     ({} elements differ){node}; {shape}",
                    m.other_run, m.reference_run, m.output, m.element, m.expected, m.got, m.differing_elements
                )
            }
        }
    }
}

const SERIAL_NAN: &str = "serial, NaN poison";
const SERIAL_ZERO: &str = "serial, zero poison";
const OPTIMIZED_NAN: &str = "optimized, NaN poison";

/// Runs the three runs described in the module documentation and compares their outputs.
/// `plan` chooses the optimizations of the optimized run (its `split` and `timing` are ignored:
/// every group is its own submission there).
pub fn sanitize(
    executor: &Executor,
    plan: &Plan,
    input: &SanitizeInput<'_>,
) -> Result<SanitizeReport> {
    if input.outputs.is_empty() {
        return Err(Error::InvalidArgument(
            "sanitize: no outputs to compare".into(),
        ));
    }
    let device = executor.device();
    let caps = device.capabilities();
    // The reference keeps the plain ops, except where the backend's fused kernel is not
    // bit-exact against them: those patterns are fused in the reference too (their kernels are
    // compared against the plain ops, within a tolerance, by their own tests).
    let mut reference = input.graph.clone();
    if plan.fuse {
        let inexact: Vec<_> = caps
            .fusions
            .iter()
            .filter(|u| !u.exact)
            .map(|u| crate::ops::fusion_rule(u.fusion, caps).up_to_rows(u.max_rows))
            .collect();
        passes::fuse(&mut reference, &inexact);
    }
    let serial: Vec<Vec<Dispatch>> = reference
        .dispatches()
        .map(|d| vec![d.to_dispatch()])
        .collect();
    let mut optimized_graph = input.graph.clone();
    let opt = Executor::optimize(&mut optimized_graph, plan, caps);
    let optimized = groups_of(&optimized_graph);

    let scratch = byte_set_of(input.scratch.iter().map(Range::of));
    let outputs = byte_set_of(input.outputs.iter().map(|(_, b)| Range::of(b)));
    let serial_sched = Schedule::new(serial, &scratch, &outputs);
    let optimized_sched = Schedule::new(optimized, &scratch, &outputs);
    let snapshot = Snapshot::take(device, input.graph, &scratch)?;
    let ctx = RunContext {
        executor,
        scratch_views: input.scratch,
        outputs: input.outputs,
        snapshot: &snapshot,
    };

    let a = ctx
        .run(&serial_sched, Poison::Nan, false)
        .map_err(|e| in_run(SERIAL_NAN, e))?;
    let b = ctx
        .run(&serial_sched, Poison::Zero, false)
        .map_err(|e| in_run(SERIAL_ZERO, e))?;
    let c = ctx
        .run(&optimized_sched, Poison::Nan, false)
        .map_err(|e| in_run(OPTIMIZED_NAN, e))?;

    let mut declaration_mismatch = first_mismatch(
        input.outputs,
        &a.outputs,
        &b.outputs,
        SERIAL_NAN,
        SERIAL_ZERO,
    );
    let mut schedule_mismatch = first_mismatch(
        input.outputs,
        &a.outputs,
        &c.outputs,
        SERIAL_NAN,
        OPTIMIZED_NAN,
    );
    if declaration_mismatch.is_some() || schedule_mismatch.is_some() {
        let ta = ctx
            .run(&serial_sched, Poison::Nan, true)
            .map_err(|e| in_run(SERIAL_NAN, e))?;
        if let Some(m) = &mut declaration_mismatch {
            let tb = ctx
                .run(&serial_sched, Poison::Zero, true)
                .map_err(|e| in_run(SERIAL_ZERO, e))?;
            m.first_divergent = first_divergent(&ta.trace, &tb.trace);
        }
        if let Some(m) = &mut schedule_mismatch {
            let tc = ctx
                .run(&optimized_sched, Poison::Nan, true)
                .map_err(|e| in_run(OPTIMIZED_NAN, e))?;
            m.first_divergent = first_divergent(&ta.trace, &tc.trace);
        }
    }
    snapshot.restore(device)?;
    Ok(SanitizeReport {
        dispatches: input.graph.dispatch_count(),
        dispatches_optimized: opt.dispatches,
        groups_optimized: optimized_sched.units.len(),
        fusions: opt.fusions,
        reordered: opt.reordered,
        poisoned_bytes_serial: a.poisoned_bytes,
        poisoned_bytes_optimized: c.poisoned_bytes,
        outputs: input.outputs.len(),
        output_bytes: input.outputs.iter().map(|(_, b)| b.len_bytes()).sum(),
        declaration_mismatch,
        schedule_mismatch,
    })
}

/// Records one decode step of `llama` (token `token` at position `pos`, ending with the on-device
/// argmax) and sanitizes it. Scratch: the model's decode activations and partials; outputs: the
/// logits, the next token and every layer's K and V cache.
pub fn sanitize_decode_step(
    llama: &Transformer,
    executor: &Executor,
    plan: &Plan,
    token: u32,
    pos: usize,
) -> Result<SanitizeReport> {
    llama.set_inputs(&[token], pos)?;
    let mut session = executor.begin(Mode::Recorded);
    llama.record(&mut session, 1, Logits::Last, true)?;
    let graph = session.into_graph()?;
    let scratch = llama.scratch_buffers(1);
    let outputs = llama.output_buffers(1, Logits::Last, true)?;
    sanitize(
        executor,
        plan,
        &SanitizeInput {
            graph: &graph,
            scratch: &scratch,
            outputs: &outputs,
        },
    )
}

/// Runs `prompt` through `llama` from position 0 (direct sessions, in passes of at most
/// `max_batch` tokens), then sanitizes the decode step of the token the prefill predicts.
pub fn prefill_and_sanitize_decode(
    llama: &Transformer,
    executor: &Executor,
    plan: &Plan,
    prompt: &[u32],
) -> Result<SanitizeReport> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument(
            "sanitize: the prompt is empty".into(),
        ));
    }
    if prompt.len() >= llama.max_ctx() {
        return Err(Error::InvalidArgument(format!(
            "sanitize: a prompt of {} tokens leaves no room for a decode step in a context of {}",
            prompt.len(),
            llama.max_ctx()
        )));
    }
    let mut pos = 0;
    let mut slot = None;
    for chunk in prompt.chunks(llama.max_batch()) {
        llama.set_inputs(chunk, pos)?;
        let last = pos + chunk.len() == prompt.len();
        let mut session = executor.begin(Mode::Direct);
        llama.record(&mut session, chunk.len(), Logits::Last, last)?;
        session.finish(&Plan::SEQUENTIAL)?;
        slot = Some(llama.argmax_token(chunk.len(), pos)?);
        pos += chunk.len();
    }
    let slot =
        slot.ok_or_else(|| Error::InvalidArgument("sanitize: the prompt is empty".into()))?;
    let next = executor.device().download::<i32>(&slot)?;
    let token = next.first().copied().unwrap_or(0).max(0) as u32;
    sanitize_decode_step(llama, executor, plan, token, prompt.len())
}

fn in_run(run: &str, e: Error) -> Error {
    Error::Backend(format!("sanitize: the {run} run failed: {e}"))
}

/// The concurrent groups of a graph whose barriers are placed.
fn groups_of(graph: &ComputeGraph) -> Vec<Vec<Dispatch>> {
    let mut groups = Vec::new();
    let mut current = Vec::new();
    for node in graph.nodes() {
        match node {
            Node::Dispatch(d) => current.push(d.to_dispatch()),
            Node::Barrier => groups.push(std::mem::take(&mut current)),
        }
    }
    groups.push(current);
    groups.retain(|g| !g.is_empty());
    groups
}

/// Which poison a run writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poison {
    Nan,
    Zero,
}

impl Poison {
    /// The poison byte at `offset` bytes into an element of `dtype` (little-endian).
    fn byte(self, dtype: DType, offset: usize) -> u8 {
        let pattern: &[u8] = match (self, dtype) {
            (Poison::Zero, _) => return 0,
            (Poison::Nan, DType::F32) => &[0xA5, 0xA5, 0xC5, 0x7F],
            (Poison::Nan, DType::F16) => &[0xA5, 0x7E],
            (Poison::Nan, DType::BF16) => &[0xE5, 0x7F],
            (Poison::Nan, _) => return POISON_BYTE,
        };
        pattern[offset % pattern.len()]
    }
}

/// The units of one run and the bytes to poison before each.
struct Schedule {
    units: Vec<Vec<Dispatch>>,
    graphs: Vec<ComputeGraph>,
    poison: Vec<ByteSet>,
}

impl Schedule {
    fn new(units: Vec<Vec<Dispatch>>, scratch: &ByteSet, outputs: &ByteSet) -> Schedule {
        let in_scratch = |r: &&Range| scratch.has_alloc(r.alloc);
        let n = units.len();
        // live[i]: scratch bytes live just before unit i; live[n]: the outputs.
        let mut live = vec![ByteSet::default(); n + 1];
        live[n] = outputs.intersection(scratch);
        let mut writes = vec![ByteSet::default(); n];
        for i in (0..n).rev() {
            let mut l = live[i + 1].clone();
            for d in &units[i] {
                for w in d.writes().iter().filter(in_scratch) {
                    writes[i].insert(w);
                }
            }
            l.subtract(&writes[i]);
            for d in &units[i] {
                for r in d.reads().iter().filter(in_scratch) {
                    l.insert(r);
                }
            }
            live[i] = l;
        }
        let mut poison = Vec::with_capacity(n);
        for i in 0..n {
            let mut dead = scratch.clone();
            dead.subtract(&live[i]);
            poison.push(if i == 0 {
                scratch.clone()
            } else {
                let mut changed = live[i - 1].clone();
                changed.union_with(&writes[i - 1]);
                dead.intersection(&changed)
            });
        }
        let graphs = units
            .iter()
            .map(|u| {
                let mut g = ComputeGraph::with_capacity(u.len());
                u.iter().for_each(|d| g.push_ref(d.as_view()));
                g
            })
            .collect();
        Schedule {
            units,
            graphs,
            poison,
        }
    }
}

/// The bytes of every non-scratch range the graph writes, as they were before the runs.
struct Snapshot {
    saved: Vec<(Buffer, Vec<u8>)>,
}

impl Snapshot {
    fn take(device: &Device, graph: &ComputeGraph, scratch: &ByteSet) -> Result<Snapshot> {
        let mut seen = HashSet::new();
        let mut saved = Vec::new();
        for d in graph.dispatches() {
            for arg in d.args() {
                let Arg::Buffer(buf, access) = arg else {
                    continue;
                };
                let range = Range::of(buf);
                if access.writes() && !scratch.covers(&range) && seen.insert(range) {
                    saved.push((buf.clone(), device.download_bytes(buf)?));
                }
            }
        }
        Ok(Snapshot { saved })
    }

    fn restore(&self, device: &Device) -> Result<()> {
        for (buf, bytes) in &self.saved {
            device.write_bytes(buf, bytes)?;
        }
        Ok(())
    }
}

/// The key matching a dispatch of one run with the same dispatch of another.
type DispatchKey = (KernelId, Vec<Range>, Vec<Range>);

/// Hashes of each dispatch's written bytes, in the order the dispatches ran.
#[derive(Default)]
struct Trace {
    entries: Vec<(DispatchKey, String, u64)>,
}

struct RunResult {
    outputs: Vec<Vec<u8>>,
    poisoned_bytes: u64,
    trace: Trace,
}

struct RunContext<'a> {
    executor: &'a Executor,
    scratch_views: &'a [Buffer],
    outputs: &'a [(String, Buffer)],
    snapshot: &'a Snapshot,
}

impl RunContext<'_> {
    fn run(&self, sched: &Schedule, poison: Poison, trace: bool) -> Result<RunResult> {
        let device = self.executor.device();
        self.snapshot.restore(device)?;
        let mut poisoned_bytes = 0;
        let mut t = Trace::default();
        for ((unit, graph), set) in sched.units.iter().zip(&sched.graphs).zip(&sched.poison) {
            poisoned_bytes += self.poison(device, set, poison)?;
            self.executor.run(graph, false)?;
            if trace {
                for d in unit {
                    let key = (d.kernel(), d.reads().to_vec(), d.writes().to_vec());
                    t.entries
                        .push((key, d.op().name().to_string(), hash_writes(device, d)?));
                }
            }
        }
        let outputs = self
            .outputs
            .iter()
            .map(|(_, b)| device.download_bytes(b))
            .collect::<Result<Vec<_>>>()?;
        Ok(RunResult {
            outputs,
            poisoned_bytes,
            trace: t,
        })
    }

    /// Writes the poison into every byte of `set`, each byte with the pattern of the first scratch
    /// view holding it. Returns the bytes written.
    fn poison(&self, device: &Device, set: &ByteSet, poison: Poison) -> Result<u64> {
        let mut left = set.clone();
        let mut written = 0;
        for view in self.scratch_views {
            if left.is_empty() {
                break;
            }
            let vr = Range::of(view);
            let mut within = ByteSet::default();
            within.insert(&vr);
            let pieces = left.intersection(&within);
            for piece in pieces.ranges() {
                let bytes: Vec<u8> = (piece.start..piece.end)
                    .map(|o| poison.byte(view.dtype(), o - vr.start))
                    .collect();
                let target = view.view(piece.start - vr.start, DType::U8, &[piece.len()])?;
                device.write_bytes(&target, &bytes)?;
            }
            written += pieces.bytes();
            left.subtract(&pieces);
        }
        Ok(written)
    }
}

/// A hash of the bytes of every argument `d` writes, as they are now.
fn hash_writes(device: &Device, d: &Dispatch) -> Result<u64> {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for arg in d.args() {
        if let Arg::Buffer(buf, access) = arg {
            if access.writes() {
                for chunk in device.download_bytes(buf)?.chunks(8) {
                    let mut word = [0u8; 8];
                    word[..chunk.len()].copy_from_slice(chunk);
                    h = (h.rotate_left(5) ^ u64::from_le_bytes(word))
                        .wrapping_mul(0x517C_C1B7_2722_0A95);
                }
            }
        }
    }
    Ok(h)
}

/// The first dispatch of `reference` (in its order) whose counterpart in `other` wrote other
/// bytes. Counterparts share kernel, ranges and occurrence number.
fn first_divergent(reference: &Trace, other: &Trace) -> Option<DivergentDispatch> {
    let mut seen: HashMap<&DispatchKey, usize> = HashMap::new();
    let mut theirs: HashMap<(&DispatchKey, usize), u64> = HashMap::new();
    for (key, _, hash) in &other.entries {
        let n = seen.entry(key).or_insert(0);
        theirs.insert((key, *n), *hash);
        *n += 1;
    }
    seen.clear();
    for (index, (key, op, hash)) in reference.entries.iter().enumerate() {
        let n = seen.entry(key).or_insert(0);
        let occurrence = *n;
        *n += 1;
        match theirs.get(&(key, occurrence)) {
            Some(h) if h != hash => {
                return Some(DivergentDispatch {
                    index,
                    kernel: key.0.name().to_string(),
                    op: op.clone(),
                })
            }
            _ => {}
        }
    }
    None
}

/// The first output (in the caller's order) whose bytes differ between two runs.
fn first_mismatch(
    outputs: &[(String, Buffer)],
    reference: &[Vec<u8>],
    other: &[Vec<u8>],
    reference_run: &'static str,
    other_run: &'static str,
) -> Option<Mismatch> {
    for (((name, buf), want), got) in outputs.iter().zip(reference).zip(other) {
        if want == got {
            continue;
        }
        let size = buf.dtype().block_bytes();
        let differing = want
            .chunks(size)
            .zip(got.chunks(size))
            .filter(|(a, b)| a != b)
            .count();
        let element = want
            .chunks(size)
            .zip(got.chunks(size))
            .position(|(a, b)| a != b)?;
        let at = |bytes: &[u8]| {
            format_element(buf.dtype(), &bytes[element * size..(element + 1) * size])
        };
        return Some(Mismatch {
            reference_run,
            other_run,
            output: name.clone(),
            element,
            dtype: buf.dtype().name().to_string(),
            expected: at(want),
            got: at(got),
            differing_elements: differing,
            first_divergent: None,
        });
    }
    None
}

/// One element's value and bits, for reports.
fn format_element(dtype: DType, bytes: &[u8]) -> String {
    let word = |n: usize| {
        bytes
            .iter()
            .take(n)
            .rev()
            .fold(0u32, |acc, &b| (acc << 8) | b as u32)
    };
    match dtype {
        DType::F32 => format!("{:?} (0x{:08x})", f32::from_bits(word(4)), word(4)),
        DType::F16 => format!(
            "{:?} (0x{:04x})",
            half::f16::from_bits(word(2) as u16),
            word(2)
        ),
        DType::BF16 => format!(
            "{:?} (0x{:04x})",
            half::bf16::from_bits(word(2) as u16),
            word(2)
        ),
        DType::I32 => format!("{} (0x{:08x})", word(4) as i32, word(4)),
        DType::U32 => format!("{} (0x{:08x})", word(4), word(4)),
        _ => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::synthetic::untyped_kernel;

    use super::byte_set::tests::intervals;

    #[test]
    fn given_a_chain_when_scheduled_should_poison_each_byte_right_after_it_dies() {
        use crate::graph::{Grid, OpKind};
        let dev = Device::cpu(1).expect("cpu");
        let a = dev.alloc(DType::F32, &[4]).expect("a");
        let b = dev.alloc(DType::F32, &[4]).expect("b");
        let out = dev.alloc(DType::F32, &[4]).expect("out");
        let d = |args: Vec<Arg>| {
            Dispatch::new(untyped_kernel(OpKind::Copy), args, Grid::new(1, 1)).expect("dispatch")
        };
        let a_front = a.view(0, DType::F32, &[2]).expect("front");
        let units = vec![
            vec![d(vec![Arg::write(&a)])],
            vec![d(vec![Arg::read(&a_front), Arg::write(&b)])],
            vec![d(vec![Arg::read(&b), Arg::write(&out)])],
        ];
        let scratch = byte_set_of([Range::of(&a), Range::of(&b)]);
        let outputs = byte_set_of([Range::of(&out)]);
        let sched = Schedule::new(units, &scratch, &outputs);
        let (ai, bi) = (a.alloc_id().0, b.alloc_id().0);
        // Everything at the start; then the back half of `a`, written but never read; then the
        // front half of `a` after its last read. `b` is poisoned only at the start: it is never
        // dead again before the end.
        assert_eq!(intervals(&sched.poison[0]), vec![(ai, 0, 16), (bi, 0, 16)]);
        assert_eq!(intervals(&sched.poison[1]), vec![(ai, 8, 16)]);
        assert_eq!(intervals(&sched.poison[2]), vec![(ai, 0, 8)]);
    }

    #[test]
    fn given_each_dtype_when_poisoned_with_nan_should_give_nan_or_a5_bytes() {
        let f32_bytes: Vec<u8> = (0..4).map(|o| Poison::Nan.byte(DType::F32, o)).collect();
        let v = u32::from_le_bytes([f32_bytes[0], f32_bytes[1], f32_bytes[2], f32_bytes[3]]);
        assert_eq!(v, POISON_F32);
        assert!(f32::from_bits(v).is_nan());
        let f16 = u16::from_le_bytes([
            Poison::Nan.byte(DType::F16, 0),
            Poison::Nan.byte(DType::F16, 1),
        ]);
        assert_eq!(f16, POISON_F16);
        assert!(half::f16::from_bits(f16).is_nan());
        let bf16 = u16::from_le_bytes([
            Poison::Nan.byte(DType::BF16, 0),
            Poison::Nan.byte(DType::BF16, 1),
        ]);
        assert_eq!(bf16, POISON_BF16);
        assert!(half::bf16::from_bits(bf16).is_nan());
        assert_eq!(Poison::Nan.byte(DType::I32, 3), POISON_BYTE);
        assert_eq!(Poison::Zero.byte(DType::F32, 2), 0);
    }
}
