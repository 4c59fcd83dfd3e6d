//! Explicit CUDA graphs and events: the one module that creates, instantiates, launches and
//! destroys `cuGraph*` handles and calls the `cuEvent*` functions (kernel nodes are added through
//! [`launch`](super::launch), with the parameters of every other launch).
//!
//! # Safety contract
//!
//! - Every handle (`CUgraph`, `CUgraphExec`, `CUevent`) is created here, owned by exactly one
//!   value, used only while the device's context is bound to the calling thread (each method binds
//!   it first), and destroyed once, in `Drop`.
//! - A kernel node's parameters are the values [`CudaEncoder`](super::CudaEncoder) would pass for
//!   the same dispatch (buffer addresses, 32-bit scalars in 8-byte slots, then the buffers' element
//!   counts). The driver copies them while the node is added, so the slots only live for that call.
//! - The addresses baked into the nodes stay valid because a [`CudaGraph`] holds every
//!   [`Kernel`] (whose module owns the function handles) and an `Arc` to every allocation the
//!   dispatches reference, for as long as the graph lives (whatever its caller keeps).
//! - Launches go into the device's one stream, so they are ordered with every copy and direct
//!   launch on that stream.

use std::sync::Arc;

use cudarc::driver::sys;

use super::launch::LaunchParams;
use super::{CudaDevice, Kernel};
use crate::backend::Allocation;
use crate::error::{Error, Result};
use crate::graph::{Arg, Dispatch};

/// A raw driver status as a result, through the device (so a fault that breaks the context is
/// remembered and named in the error).
fn check(device: &CudaDevice, what: &str, r: sys::CUresult) -> Result<()> {
    device.driver(what, r.result())
}

/// Each allocation the dispatches' buffer arguments live in, once.
fn allocations_of(dispatches: &[Dispatch]) -> Vec<Arc<Allocation>> {
    let mut seen = std::collections::HashSet::new();
    dispatches
        .iter()
        .flat_map(|d| d.args())
        .filter_map(|a| match a {
            Arg::Buffer(b, _) if seen.insert(b.alloc_id()) => Some(b.allocation().clone()),
            _ => None,
        })
        .collect()
}

/// Set to `0` to build graphs with plain edges only (for measuring what programmatic launch
/// gives; see [`edge_data`]).
pub const PDL_ENV: &str = "ONEPASS_CUDA_PDL";

/// The kind of every edge between kernels: programmatic (the dependent kernel may be scheduled
/// once every block of the kernel before it has passed `OP_GRID_ENTRY()`, `kernels/prelude.cuh`;
/// its own `griddepcontrol.wait` still waits for that kernel's completion and writes) on a GPU of
/// compute capability 9.0 or later, where every onepass kernel begins with that wait; plain (the
/// dependent starts after the kernel completes) elsewhere or with [`PDL_ENV`] set to `0`. The
/// edges into the big products were plain until stop 46 (they cost on the 8B shape then,
/// docs/kernels.md item 17); with item 24's kernels every edge programmatic measured 1B +4.6%
/// and 8B +2% on an H100 against plain edges into kernels reading 16 MiB or more.
fn edge_data(device: &CudaDevice) -> sys::CUgraphEdgeData {
    // SAFETY: the all-zero bit pattern is valid for this plain C struct (a default edge).
    let mut edge: sys::CUgraphEdgeData = unsafe { std::mem::zeroed() };
    let off = std::env::var(PDL_ENV).is_ok_and(|v| v.trim() == "0");
    if device.info().compute_capability.0 >= 9 && !off {
        edge.type_ = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        edge.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
    }
    edge
}

/// An instantiated CUDA graph of kernel nodes with explicit dependency edges.
pub struct CudaGraph {
    device: Arc<CudaDevice>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: usize,
    edges: usize,
    _kernels: Vec<Kernel>,
    /// Every allocation a node's parameters point into, so none is freed or reused while the
    /// graph can still be launched.
    _allocations: Vec<Arc<Allocation>>,
}

// SAFETY: the handles are owned by this value alone; the driver API is thread-safe, and each
// method binds the context on the calling thread before using them.
unsafe impl Send for CudaGraph {}
// SAFETY: `launch` only enqueues work (thread-safe in the driver); nothing is mutated through `&self`.
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// Builds the graph node by node (`preds[i]`: the earlier dispatches node `i` waits for) and
    /// instantiates it once.
    pub fn build(
        device: &Arc<CudaDevice>,
        dispatches: &[Dispatch],
        preds: &[Vec<usize>],
    ) -> Result<Self> {
        if preds.len() != dispatches.len()
            || preds
                .iter()
                .enumerate()
                .any(|(i, p)| p.iter().any(|&j| j >= i))
        {
            return Err(Error::InvalidArgument(
                "CudaGraph::build: every dependency must name an earlier dispatch".into(),
            ));
        }
        device.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is valid for writes; flags must be 0.
        check(device, "cuGraphCreate", unsafe {
            sys::cuGraphCreate(&mut graph, 0)
        })?;
        let mut this = CudaGraph {
            device: device.clone(),
            graph,
            exec: std::ptr::null_mut(),
            nodes: 0,
            edges: 0,
            _kernels: Vec::with_capacity(dispatches.len()),
            _allocations: allocations_of(dispatches),
        };
        let mut handles: Vec<sys::CUgraphNode> = Vec::with_capacity(dispatches.len());
        let mut deps: Vec<sys::CUgraphNode> = Vec::new();
        let mut params = LaunchParams::default();
        let edge = edge_data(device);
        for (d, p) in dispatches.iter().zip(preds) {
            deps.clear();
            deps.extend(p.iter().map(|&j| handles[j]));
            // SAFETY: `this.graph` is a live graph of the device's context (bound above). The
            // kernel, which owns the node's function handle, is kept in `_kernels` for the
            // graph's life.
            let (node, kernel) = unsafe { params.add_node(device, this.graph, &[], d.as_view()) }?;
            if !deps.is_empty() {
                let to = vec![node; deps.len()];
                let data = vec![edge; deps.len()];
                // SAFETY: every node of `deps` and `to` was added to `this.graph` in this loop;
                // the three arrays hold `deps.len()` entries each, which the driver copies.
                check(device, "cuGraphAddDependencies", unsafe {
                    sys::cuGraphAddDependencies_v2(
                        this.graph,
                        deps.as_ptr(),
                        to.as_ptr(),
                        data.as_ptr(),
                        deps.len(),
                    )
                })?;
            }
            handles.push(node);
            this.edges += deps.len();
            this.nodes += 1;
            this._kernels.push(kernel);
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `this.graph` is a complete, live graph; `exec` is valid for writes.
        check(device, "cuGraphInstantiateWithFlags", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, this.graph, 0)
        })?;
        this.exec = exec;
        Ok(this)
    }

    /// Kernel nodes.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// Dependency edges.
    pub fn edge_count(&self) -> usize {
        self.edges
    }

    /// Queues one replay on the device's stream (returns at once).
    pub fn launch(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: `exec` is the live instantiation of this graph; the stream is the device's.
        check(&self.device, "cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, self.device.cu_stream())
        })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: both handles were created by this value and are destroyed once; a launch still
        // running completes before the driver releases the executable's resources.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// A CUDA event recorded on the device's stream, for GPU timings.
pub struct GpuEvent {
    device: Arc<CudaDevice>,
    event: sys::CUevent,
}

// SAFETY: the handle is owned by this value alone and only used with the context bound.
unsafe impl Send for GpuEvent {}

impl GpuEvent {
    /// A new timing event.
    pub fn new(device: &Arc<CudaDevice>) -> Result<Self> {
        device.bind()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `event` is valid for writes; flags 0 is a default (timing) event.
        check(device, "cuEventCreate", unsafe {
            sys::cuEventCreate(&mut event, 0)
        })?;
        Ok(GpuEvent {
            device: device.clone(),
            event,
        })
    }

    /// Records the event on the device's stream (after everything queued so far).
    pub fn record(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live event and stream of the same context.
        check(&self.device, "cuEventRecord", unsafe {
            sys::cuEventRecord(self.event, self.device.cu_stream())
        })
    }

    /// Milliseconds of GPU time from `self` to `later`, once `later` has completed.
    pub fn elapsed_ms(&self, later: &GpuEvent) -> Result<f32> {
        self.device.bind()?;
        let mut ms = 0f32;
        // SAFETY: both events are live and recorded; `ms` is valid for writes.
        unsafe {
            check(
                &self.device,
                "cuEventSynchronize",
                sys::cuEventSynchronize(later.event),
            )?;
            check(
                &self.device,
                "cuEventElapsedTime",
                sys::cuEventElapsedTime_v2(&mut ms, self.event, later.event),
            )?;
        }
        Ok(ms)
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the event was created by this value and is destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
        }
    }
}

/// Launches `dispatches` one by one on the device's stream with an event between each two, and
/// returns each kernel's GPU time in milliseconds (a profiling run: serial, so times add up).
pub fn profile_dispatches(device: &Arc<CudaDevice>, dispatches: &[Dispatch]) -> Result<Vec<f32>> {
    let events = (0..=dispatches.len())
        .map(|_| GpuEvent::new(device))
        .collect::<Result<Vec<_>>>()?;
    let mut enc = device.encoder();
    events[0].record()?;
    for (d, ev) in dispatches.iter().zip(&events[1..]) {
        enc.encode(d.as_view())?;
        ev.record()?;
    }
    enc.finish()?;
    events.windows(2).map(|w| w[0].elapsed_ms(&w[1])).collect()
}
