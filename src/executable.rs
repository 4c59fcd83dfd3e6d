//! An instantiated graph: a recorded (and optimized) [`ComputeGraph`] turned once into something a
//! device replays many times with no per-step host work beyond writing its step buffers.
//!
//! - Dependencies come from byte ranges: a dispatch depends on every earlier dispatch it conflicts
//!   with (read-after-write, write-after-read, write-after-write; a non-reorderable op conflicts
//!   with everything), and the edge list is transitively reduced, so an edge `a -> b` exists only
//!   when no other path leads from `a` to `b`.
//! - The device's backend instantiates the dispatches with those dependencies and levels
//!   ([`crate::backend::Backend::instantiate`]). On CUDA they become kernel nodes of one CUDA
//!   graph with exactly those edges, instantiated once ([`crate::backend::cuda::CudaGraph`]); a
//!   step is one `cuGraphLaunch`. On the CPU they are sorted into levels (a level holds the
//!   dispatches whose longest dependency chain has the same length; no two of them conflict),
//!   their kernels resolved once; a step runs the levels in order, each level's dispatches in
//!   parallel on the device's pool.
//! - Every pointer must stay valid and mean the same memory for the executable's whole life: the
//!   caller names the allocations it keeps for that long in a [`StableSet`], instantiation refuses a
//!   graph that touches any other allocation (with a report naming each one), and the executable
//!   holds an `Arc` to every allocation it references, so none can be freed or reused under it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use crate::backend::{AllocId, Allocation, Buffer, Device, Element, LaunchMark, Replay};
use crate::error::{Error, Result};
use crate::graph::conflict::conflict;
use crate::graph::{Arg, ComputeGraph, Dispatch};
use crate::session::Executor;

/// One launch of an [`Executable`] ([`Executable::launch_marked`]): reads a small buffer as that
/// launch left it, without waiting for the launches made after it.
pub struct Launched(Box<dyn LaunchMark>);

impl Launched {
    /// The values of `buf` once the launch has run: it waits for this launch and the work before
    /// it, not for later launches, which must not write `buf` (a step's token in a ring slot the
    /// next step does not use). Fails with the first kernel error or fault reported by then.
    pub fn read<T: Element>(&self, buf: &Buffer) -> Result<Vec<T>> {
        crate::backend::read_values(buf, |b| self.0.read(b))
    }
}

/// The allocations a caller promises to keep, unchanged in place, for as long as an executable
/// built over them lives (weights, KV cache, scratch, step buffers), each with a name for reports.
#[derive(Debug, Clone, Default)]
pub struct StableSet {
    names: BTreeMap<AllocId, String>,
}

impl StableSet {
    /// An empty set.
    pub fn new() -> Self {
        StableSet::default()
    }

    /// Marks the allocation under `buf` stable, naming it (the first name given is kept).
    pub fn add(&mut self, name: &str, buf: &Buffer) {
        self.names
            .entry(buf.alloc_id())
            .or_insert_with(|| name.to_string());
    }

    /// A set from named buffers.
    pub fn from_named<'a>(buffers: impl IntoIterator<Item = (&'a str, &'a Buffer)>) -> Self {
        let mut s = StableSet::new();
        for (name, buf) in buffers {
            s.add(name, buf);
        }
        s
    }

    /// Whether an allocation is in the set.
    pub fn contains(&self, id: AllocId) -> bool {
        self.names.contains_key(&id)
    }

    /// The name an allocation was marked with.
    pub fn name(&self, id: AllocId) -> Option<&str> {
        self.names.get(&id).map(String::as_str)
    }

    /// Number of allocations in the set.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// The transitively reduced dependencies of a dispatch sequence: entry `i` lists, in increasing
/// order, the earlier dispatches `i` waits for directly. Every conflicting pair
/// ([`conflict`](crate::graph::conflict::conflict)) is
/// connected by a path, and no listed edge is implied by a longer path.
pub fn reduced_dependencies(dispatches: &[Dispatch]) -> Vec<Vec<usize>> {
    let n = dispatches.len();
    let words = n.div_ceil(64).max(1);
    // ancestors[i]: bit j set when i transitively depends on j.
    let mut ancestors = vec![0u64; n * words];
    let mut preds = Vec::with_capacity(n);
    for i in 0..n {
        let mut mine = vec![0u64; words];
        let mut direct = Vec::new();
        // Latest first: an earlier node reachable through a later direct predecessor is implied.
        for j in (0..i).rev() {
            if mine[j / 64] & (1u64 << (j % 64)) != 0 {
                continue;
            }
            if conflict(dispatches[j].as_view(), dispatches[i].as_view()) {
                direct.push(j);
                mine[j / 64] |= 1u64 << (j % 64);
                for (m, a) in mine.iter_mut().zip(&ancestors[j * words..(j + 1) * words]) {
                    *m |= *a;
                }
            }
        }
        ancestors[i * words..(i + 1) * words].copy_from_slice(&mine);
        direct.reverse();
        preds.push(direct);
    }
    preds
}

/// The level of each dispatch: 0 without dependencies, else one more than its deepest
/// predecessor. Two dispatches of one level never conflict.
pub fn levels(preds: &[Vec<usize>]) -> Vec<usize> {
    let mut level = vec![0usize; preds.len()];
    for i in 0..preds.len() {
        level[i] = preds[i].iter().map(|&j| level[j] + 1).max().unwrap_or(0);
    }
    level
}

/// The shape of a graph's dependency DAG, as an instantiated graph would have it: what the
/// reorder pass and fusion leave for a GPU to run side by side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DagShape {
    /// Dependency edges after transitive reduction.
    pub edges: usize,
    /// Dispatches on the longest dependency chain (the number of levels).
    pub critical_path: usize,
    /// Dispatches of the widest level: the most that may run at the same time.
    pub widest_level: usize,
}

impl DagShape {
    /// The DAG shape of a graph's dispatches (barriers play no part: edges come from ranges).
    pub fn of(graph: &ComputeGraph) -> DagShape {
        let dispatches: Vec<Dispatch> = graph.dispatches().map(|d| d.to_dispatch()).collect();
        DagShape::of_dependencies(&reduced_dependencies(&dispatches))
    }

    /// The DAG shape of dependencies `preds` (entry `i`: the dispatches `i` waits for directly).
    pub fn of_dependencies(preds: &[Vec<usize>]) -> DagShape {
        let level = levels(preds);
        let critical_path = level.iter().max().map_or(0, |m| m + 1);
        let mut width = vec![0usize; critical_path];
        for &l in &level {
            width[l] += 1;
        }
        DagShape {
            edges: preds.iter().map(Vec::len).sum(),
            critical_path,
            widest_level: width.into_iter().max().unwrap_or(0),
        }
    }
}

/// What an executable is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExecutableStats {
    /// Kernel launches per replay.
    pub kernels: usize,
    /// Dependency edges after transitive reduction.
    pub edges: usize,
    /// Levels of the schedule (the longest dependency chain, in kernels).
    pub levels: usize,
    /// Barriers of the CPU schedule (levels minus one); what CUDA expresses as edges.
    pub barriers: usize,
    /// Distinct allocations the executable references (and keeps alive).
    pub allocations: usize,
}

/// One kernel's time in a profiling run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KernelTiming {
    /// Position of the dispatch in the executable.
    pub index: usize,
    /// Kernel name.
    pub kernel: &'static str,
    /// Op kind name.
    pub op: &'static str,
    /// Level (concurrent group) of the dispatch.
    pub level: usize,
    /// Track: the CPU pool thread that ran it, or 0 on CUDA (one stream).
    pub track: usize,
    /// Start, in microseconds from the start of the run.
    pub start_us: f64,
    /// Duration in microseconds (GPU time from events on CUDA, wall time on the CPU).
    pub dur_us: f64,
    /// Bytes of the buffers the dispatch only reads plus those it only writes (a buffer read and
    /// written in place is left out: an accumulator, or a KV cache of which a fused kernel writes
    /// one row). For the products that is what they move; attention, gathers and cache writes
    /// declare a whole cache or table of which they touch a part known only at run time.
    pub bytes: u64,
    /// Floating-point operations of a matrix product (`2 rows k n`, read from its `rows`, `k` and
    /// `n` arguments); 0 for every other kernel.
    pub flops: u64,
}

/// A graph instantiated for one device, replayed by [`Executable::run`].
pub struct Executable {
    device: Device,
    level: Vec<usize>,
    stats: ExecutableStats,
    replay: Box<dyn Replay>,
    /// Every allocation referenced, held so none can be freed or reused while this lives.
    _allocations: Vec<Arc<Allocation>>,
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("device", &self.device)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Executor {
    /// Instantiates a recorded graph (normally already optimized) for this executor's device.
    /// Refuses, with a report naming every offending buffer, a graph that touches an allocation
    /// not in `stable`.
    pub fn instantiate(&self, graph: &ComputeGraph, stable: &StableSet) -> Result<Executable> {
        Executable::new(self.device().clone(), graph, stable)
    }
}

impl Executable {
    fn new(device: Device, graph: &ComputeGraph, stable: &StableSet) -> Result<Self> {
        let dispatches: Vec<Dispatch> = graph.dispatches().map(|d| d.to_dispatch()).collect();
        if dispatches.is_empty() {
            return Err(Error::InvalidArgument(
                "instantiate: the graph has no dispatch".into(),
            ));
        }
        let allocations = check_stable(&dispatches, stable, &device)?;
        let preds = reduced_dependencies(&dispatches);
        let level = levels(&preds);
        let n_levels = level.iter().max().map_or(0, |m| m + 1);
        let stats = ExecutableStats {
            kernels: dispatches.len(),
            edges: preds.iter().map(Vec::len).sum(),
            levels: n_levels,
            barriers: n_levels.saturating_sub(1),
            allocations: allocations.len(),
        };
        let replay = device.backend().instantiate(dispatches, &preds, &level)?;
        tracing::debug!(?stats, "instantiated graph");
        Ok(Executable {
            device,
            level,
            stats,
            replay,
            _allocations: allocations,
        })
    }

    /// What the executable is made of.
    pub fn stats(&self) -> ExecutableStats {
        self.stats
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dispatches, in the order they were recorded (optimized).
    pub fn dispatches(&self) -> &[Dispatch] {
        self.replay.dispatches()
    }

    /// Replays the graph once and waits for it: on CUDA one graph launch and a stream wait, on the
    /// CPU the precomputed schedule on the device's pool.
    pub fn run(&self) -> Result<()> {
        self.launch()?;
        self.wait()
    }

    /// Starts a replay without waiting (CUDA: the launch is queued on the device's stream; the
    /// next download or [`Executable::wait`] waits for it). On the CPU the replay runs to the end.
    pub fn launch(&self) -> Result<()> {
        self.replay.launch()
    }

    /// Waits for the last launch.
    pub fn wait(&self) -> Result<()> {
        self.replay.wait()
    }

    /// Starts a replay as [`Executable::launch`] does and returns what reads its results while
    /// later launches run (CUDA: an event after the launch, and reads on a stream of their own;
    /// on the CPU the replay has run when this returns).
    pub fn launch_marked(&self) -> Result<Launched> {
        Ok(Launched(self.replay.launch_marked()?))
    }

    /// A profiling run: the same work, with each kernel timed (CUDA: the dispatches launched one
    /// by one between events, in order; CPU: the schedule with each kernel's wall time and thread).
    pub fn profile(&self) -> Result<Vec<KernelTiming>> {
        let times = self.replay.profile()?;
        if times.len() != self.level.len() {
            return Err(Error::Backend(format!(
                "a profiling run timed {} kernels of {}",
                times.len(),
                self.level.len()
            )));
        }
        Ok(times
            .into_iter()
            .enumerate()
            .map(|(i, t)| self.timing(i, t.track, t.start_us, t.dur_us))
            .collect())
    }

    fn timing(&self, i: usize, track: usize, start_us: f64, dur_us: f64) -> KernelTiming {
        let d = &self.dispatches()[i];
        let bytes = (0..d.args().len())
            .filter_map(|a| d.buffer_arg(a))
            .filter(|(_, access)| *access != crate::kernels::Access::ReadWrite)
            .map(|(b, _)| b.len_bytes() as u64)
            .sum();
        let size = |name: &str| match d.as_view().scalar(name) {
            Some(crate::kernels::Scalar::U32(v)) => Some(u64::from(v)),
            _ => None,
        };
        // A product's outputs: `n`, or the three widths of a `matmul3_mma`.
        let outputs = size("n").or_else(|| Some(size("n0")? + size("n1")? + size("n2")?));
        let flops = match (d.op(), size("rows"), size("k"), outputs) {
            (crate::kernels::OpKind::MatMul, Some(rows), Some(k), Some(n)) => 2 * rows * k * n,
            _ => 0,
        };
        KernelTiming {
            index: i,
            flops,
            kernel: d.kernel().name(),
            op: d.op().name(),
            level: self.level[i],
            track,
            start_us,
            dur_us,
            bytes,
        }
    }
}

/// Checks that every buffer argument lives in a stable allocation on `device`; returns each
/// referenced allocation once, or an error listing every buffer that is not stable.
fn check_stable(
    dispatches: &[Dispatch],
    stable: &StableSet,
    device: &Device,
) -> Result<Vec<Arc<Allocation>>> {
    let mut seen = BTreeSet::new();
    let mut allocations = Vec::new();
    let mut bad: BTreeMap<AllocId, Vec<String>> = BTreeMap::new();
    for (i, d) in dispatches.iter().enumerate() {
        for (a, arg) in d.args().iter().enumerate() {
            let Arg::Buffer(buf, _) = arg else { continue };
            let id = buf.alloc_id();
            if !device.owns(buf) {
                return Err(Error::WrongDevice {
                    op: d.kernel().name(),
                    arg: "buffer",
                    got: buf.allocation().location(),
                    expected: device.name(),
                });
            }
            if !stable.contains(id) {
                bad.entry(id).or_default().push(format!(
                    "argument {a} of dispatch {i} `{}`",
                    d.kernel().name()
                ));
            } else if seen.insert(id) {
                allocations.push(buf.allocation().clone());
            }
        }
    }
    if bad.is_empty() {
        return Ok(allocations);
    }
    let mut report = format!(
        "instantiate: the graph refers to {} allocation(s) not marked stable; their pointers could \
         change between steps, so the graph is refused:",
        bad.len()
    );
    for (id, uses) in &bad {
        let more = if uses.len() > 3 {
            format!(" and {} more", uses.len() - 3)
        } else {
            String::new()
        };
        let shown: Vec<&str> = uses.iter().take(3).map(String::as_str).collect();
        let _ = write!(
            report,
            "\n  allocation #{} used as {}{more}",
            id.0,
            shown.join(", ")
        );
    }
    Err(Error::InvalidArgument(report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::synthetic::untyped_kernel;
    use crate::graph::{Grid, OpKind};

    fn d(device: &Device, reads: &[&Buffer], writes: &[&Buffer]) -> Dispatch {
        let mut args: Vec<Arg> = reads.iter().map(|b| Arg::read(b)).collect();
        args.extend(writes.iter().map(|b| Arg::write(b)));
        let _ = device;
        Dispatch::new(untyped_kernel(OpKind::Add), args, Grid::cover(1, 1)).expect("dispatch")
    }

    #[test]
    fn given_a_chain_with_shortcuts_when_reduced_should_keep_only_direct_edges() {
        let dev = Device::cpu(1).expect("cpu");
        let a = dev.alloc(crate::DType::F32, &[4]).expect("a");
        let b = dev.alloc(crate::DType::F32, &[4]).expect("b");
        let c = dev.alloc(crate::DType::F32, &[4]).expect("c");
        let e = dev.alloc(crate::DType::F32, &[4]).expect("e");
        // 0 writes a; 1 reads a writes b; 2 reads a,b writes c (a->c implied via b); 3 writes e.
        let ds = vec![
            d(&dev, &[], &[&a]),
            d(&dev, &[&a], &[&b]),
            d(&dev, &[&a, &b], &[&c]),
            d(&dev, &[], &[&e]),
        ];
        let preds = reduced_dependencies(&ds);
        assert_eq!(preds, vec![vec![], vec![0], vec![1], vec![]]);
        assert_eq!(levels(&preds), vec![0, 1, 2, 0]);
    }

    #[test]
    fn given_a_write_after_read_when_reduced_should_order_the_writer_after_the_readers() {
        let dev = Device::cpu(1).expect("cpu");
        let a = dev.alloc(crate::DType::F32, &[4]).expect("a");
        let b = dev.alloc(crate::DType::F32, &[4]).expect("b");
        let c = dev.alloc(crate::DType::F32, &[4]).expect("c");
        // Two readers of a (independent), then a writer of a: depends on both readers.
        let ds = vec![
            d(&dev, &[&a], &[&b]),
            d(&dev, &[&a], &[&c]),
            d(&dev, &[&b, &c], &[&a]),
        ];
        assert_eq!(reduced_dependencies(&ds), vec![vec![], vec![], vec![0, 1]]);
    }

    #[test]
    fn given_a_diamond_and_a_loner_when_shaped_should_count_edges_path_and_width() {
        let dev = Device::cpu(1).expect("cpu");
        let buf = |name: &str| dev.alloc(crate::DType::F32, &[4]).expect(name);
        let (x, y, z, w, e) = (buf("x"), buf("y"), buf("z"), buf("w"), buf("e"));
        // 0 writes x; 1 and 2 read x; 3 reads what both wrote; 4 stands alone.
        let ds = vec![
            d(&dev, &[], &[&x]),
            d(&dev, &[&x], &[&y]),
            d(&dev, &[&x], &[&z]),
            d(&dev, &[&y, &z], &[&w]),
            d(&dev, &[], &[&e]),
        ];
        let shape = DagShape::of_dependencies(&reduced_dependencies(&ds));
        assert_eq!(
            shape,
            DagShape {
                edges: 4,
                critical_path: 3,
                widest_level: 2,
            }
        );
        let mut g = ComputeGraph::new();
        for dispatch in ds {
            g.push(dispatch);
            g.push_barrier();
        }
        assert_eq!(DagShape::of(&g), shape);
        assert_eq!(DagShape::of_dependencies(&[]), DagShape::default());
    }

    #[test]
    fn given_an_unstable_buffer_when_instantiated_should_refuse_naming_it() {
        let dev = Device::cpu(1).expect("cpu");
        let a = dev.alloc(crate::DType::F32, &[4]).expect("a");
        let b = dev.alloc(crate::DType::F32, &[4]).expect("b");
        let mut g = ComputeGraph::new();
        g.push(d(&dev, &[&a], &[&b]));
        let exec = Executor::new(dev.clone());
        let stable = StableSet::from_named([("a", &a)]);
        let err = exec
            .instantiate(&g, &stable)
            .expect_err("b is not stable")
            .to_string();
        assert!(
            err.contains(&format!("allocation #{}", b.alloc_id().0)),
            "{err}"
        );
        assert!(err.contains("argument 1 of dispatch 0"), "{err}");
        let both = StableSet::from_named([("a", &a), ("b", &b)]);
        assert!(
            exec.instantiate(&g, &both).is_err(),
            "kernel `test` is unknown on the CPU"
        );
    }
}
