//! The one interface every backend implements, and what a backend declares about itself.
//!
//! - [`Backend`]: memory (allocate, map, write, read), encoders for passes, instantiation of a
//!   recorded graph, user kernels, step timers, and the backend's [`Capabilities`].
//! - [`Encoder`] / [`Submission`]: encode / barrier / submit, then wait. Whether an encoder waits
//!   after every dispatch is one of its [`EncoderOptions`], chosen by the session that opens it,
//!   never a setting of the shared device.
//! - [`Replay`]: an instantiated graph: launch / wait / profile, and launches marked for a
//!   [`LaunchMark`], which reads a small buffer once its launch has run while later launches
//!   still run.
//!
//! Code above `backend/` reads a device only through this interface (the [`Device`] enum picks
//! the backend in one place, [`Device::backend`]): ops, model and engine never match on devices.
//!
//! [`Device`]: super::Device
//! [`Device::backend`]: super::Device::backend

use std::sync::Arc;

use super::cpu::CpuKernelFn;
use super::{Allocation, BackendKind, Buffer, DType, Location};
use crate::error::Result;
use crate::graph::{Dispatch, DispatchRef, KernelId};
use crate::kernels::{Fusion, FusionUse};

/// What a backend declares about itself: which kernels and sizes suit it, and what its memory
/// and submissions are like. Each backend has constant values (CUDA: one for Hopper's sm_90a
/// target, one for every other GPU); the model, the ops and the engine read these fields
/// instead of asking which device they run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The fused kernels the optimizer makes for this backend out of plain ops, each with the
    /// most rows it pays for (the rules that make them are in `ops/`; see
    /// [`Fusion`](crate::kernels::Fusion)). CPU: every fusion at every row count, bit-exact (its
    /// fused kernels run the plain ops' own loops and normalize each row once). CUDA: `matmul_add`,
    /// `rms_norm_mul` and `rms_norm_add` everywhere, bit-exact; the block fusions (`norm_qkv_rope`,
    /// `norm_gate_up`) for one row only, within rounding of the plain ops: f32, and for the
    /// 32-value block formats the int8 activations every product of their quantized row reads
    /// (the plain one-row matmul takes them from 2^21 weights). They normalize the row in every
    /// block or warp, which a decode step hides but a prefill pass pays for each of its outputs,
    /// where the plain ops normalize once and take the tiled matmul.
    pub fusions: &'static [FusionUse],
    /// Chunk length, in KV positions, of the split decode attention. CPU: 256 (long chunks keep
    /// the per-task overhead low). CUDA: 32 (short chunks give one block per (chunk, head),
    /// enough blocks to fill the SMs at short contexts).
    pub decode_attention_chunk: usize,
    /// Whether decode attention is one dispatch (the block that finishes a head's last chunk
    /// merges the head) rather than two (a partial pass, then a combine pass). CPU: `false`.
    /// CUDA: `true` (one launch less in the dependency chain of every layer).
    pub single_dispatch_decode_attention: bool,
    /// Whether a submission made before a pass ends runs while the rest is still encoded, so a
    /// direct session gains from submitting its first dispatches early. CPU: `true` (a worker
    /// thread runs submissions). CUDA: `false` (launches run as they are encoded).
    pub early_submit: bool,
    /// Whether allocations come out of the host's memory, so a model load checks its KV cache
    /// and scratch against the memory available first. CPU: `true`. CUDA: `false`.
    pub host_memory: bool,
    /// Whether user kernels with a CPU function (`ops::custom`) can be registered and run. CPU:
    /// `true`. CUDA: `false`.
    pub custom_cpu_kernels: bool,
    /// How an instantiated graph orders its kernels, which is what the engine reports for a
    /// replayed step. CPU: [`ReplayOrdering::Barriers`]. CUDA: [`ReplayOrdering::Edges`].
    pub replay_ordering: ReplayOrdering,
    /// What [`Backend::step_timer`] measures. CPU: [`StepClock::HostWall`]. CUDA:
    /// [`StepClock::DeviceEvents`].
    pub step_clock: StepClock,
    /// Which prompt products the optimizer gives f16 activations: an f32 norm, SwiGLU or
    /// attention whose every reader is such a tensor-core product is narrowed to f16
    /// (`graph::passes::narrow`, `ops::narrow`), the backend's `_h` products then read half the
    /// activation bytes with the bits of the f32 forms, and a gate/up pair of them fuses with its
    /// SwiGLU (`ops::matmul_swiglu`). CPU: [`F16Products::None`] (its products read the f32
    /// values: the f16 rounding would be new there). CUDA: [`F16Products::SmallBlocks`] (the
    /// Llama 3.1 8B's 512-token prompt 19% faster on an H100, `tests/cuda_narrow.rs` checks the
    /// bits); on compute capability 9.0, compiled for sm_90a, [`F16Products::AllBlocks`] (the
    /// `wgmma` form takes every GGML block format).
    pub f16_products: F16Products,
    /// The element type of a model's KV cache unless its loader is told otherwise
    /// ([`KvCache::Auto`](crate::model::transformer::KvCache::Auto)). CPU: f32 (the reference:
    /// every backend's results are checked against it). CUDA: f16 (half the bytes the decode and
    /// prompt attention read and the cache's memory; each cached value rounded to nearest once,
    /// a relative change of at most 2^-11).
    pub kv_cache: DType,
}

impl Capabilities {
    /// These capabilities with `products` in place of the backend's (see
    /// [`Capabilities::f16_products`]): for tests and measurements of the narrowing.
    pub const fn with_f16_products(mut self, products: F16Products) -> Capabilities {
        self.f16_products = products;
        self
    }

    /// These declarations with `fusions` in place of the backend's (tests compare a graph with
    /// and without a fusion on one device).
    pub const fn with_fusions(mut self, fusions: &'static [FusionUse]) -> Capabilities {
        self.fusions = fusions;
        self
    }

    /// How this backend uses `fusion`, if it uses it at all.
    pub fn fusion(&self, fusion: Fusion) -> Option<&FusionUse> {
        self.fusions.iter().find(|u| u.fusion == fusion)
    }
}

/// The weight formats whose prompt products a backend runs on f16 activations
/// ([`Capabilities::f16_products`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F16Products {
    /// None: activations stay f32.
    None,
    /// Q4_0, Q4_1 and Q5_0 (CUDA's `mma.sync` f16 form stages them in 64-value steps; on other
    /// formats it would take a two-buffer form slower than the f32 pipelined one).
    SmallBlocks,
    /// Every GGML block format: Q8_0, Q4_K and Q6_K too (CUDA's Hopper `wgmma` form).
    AllBlocks,
}

impl F16Products {
    /// Whether products of `format` weights run on f16 activations.
    pub fn takes(self, format: DType) -> bool {
        match self {
            F16Products::None => false,
            F16Products::SmallBlocks => matches!(format, DType::Q4_0 | DType::Q4_1 | DType::Q5_0),
            F16Products::AllBlocks => matches!(
                format,
                DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 | DType::Q4K | DType::Q6K
            ),
        }
    }
}

/// How an instantiated graph keeps its kernels in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOrdering {
    /// Dependency edges between kernel nodes (a CUDA graph).
    Edges,
    /// Barriers between levels of concurrent kernels (the CPU schedule).
    Barriers,
}

/// The clock of a step timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepClock {
    /// Wall time on the host around the step's work.
    HostWall,
    /// Device time between two events recorded around the step's work.
    DeviceEvents,
}

/// How an encoder runs what it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncoderOptions {
    /// Wait for each dispatch to finish before the next is encoded: every dispatch is its own
    /// submission (per-op synchronized runs, for comparison). Off by default.
    pub sync_each_dispatch: bool,
}

/// A backend: a CPU pool or a GPU. Implemented by the handles of [`super::cpu::CpuDevice`] and
/// [`super::cuda::CudaDevice`]; reached through [`super::Device::backend`].
pub(crate) trait Backend: Send + Sync {
    /// The backend kind.
    fn kind(&self) -> BackendKind;

    /// A human-readable name.
    fn name(&self) -> String;

    /// What the backend declares about itself.
    fn capabilities(&self) -> &'static Capabilities;

    /// Where this backend's allocations live; a buffer elsewhere is not this backend's.
    fn home(&self) -> Location;

    /// A zeroed allocation of `bytes` bytes.
    fn alloc_bytes(&self, bytes: usize) -> Result<Arc<Allocation>>;

    /// An allocation of `bytes` bytes whose contents are undefined (a backend may take it from a
    /// caching pool).
    fn alloc_scratch_bytes(&self, bytes: usize) -> Result<Arc<Allocation>>;

    /// The window of `len` bytes at `offset` of a file mapping as a read-only allocation, without
    /// a copy, when the backend can use host mappings; `None` when it cannot (the caller uploads
    /// instead). An error when the window does not lie inside the map.
    fn map_file(
        &self,
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    ) -> Result<Option<Arc<Allocation>>>;

    /// Copies `bytes` into `buf` (lengths already checked equal), after the work before it.
    fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()>;

    /// Copies `buf` into `out` (lengths already checked equal), after the work before it.
    fn read_into(&self, buf: &Buffer, out: &mut [u8]) -> Result<()>;

    /// A fresh encoder for one pass (or part of one).
    fn encoder(&self, options: EncoderOptions) -> Box<dyn Encoder>;

    /// Instantiates dispatches whose dependencies are `preds` (entry `i`: the earlier dispatches
    /// `i` waits for directly) and levels `levels` (two dispatches of one level never conflict)
    /// into something replayed many times. The caller has checked that every buffer lives on
    /// this backend and stays valid for the replay's life.
    fn instantiate(
        &self,
        dispatches: Vec<Dispatch>,
        preds: &[Vec<usize>],
        levels: &[usize],
    ) -> Result<Box<dyn Replay>>;

    /// Adds a user kernel's CPU function; an error when another kernel holds its name, or when
    /// the backend runs no user kernels ([`Capabilities::custom_cpu_kernels`]).
    fn register_custom(&self, id: KernelId, kernel: CpuKernelFn) -> Result<()>;

    /// Starts timing the work queued from now on ([`Capabilities::step_clock`] says how).
    fn step_timer(&self) -> Result<Box<dyn StepTimer>>;

    /// Compiles ahead, on up to `threads` threads, the kernels the backend would otherwise
    /// compile at their first use, calling `progress(done, total, what)` (first `(0, total, "")`
    /// when there is anything to compile). The default: a backend that compiles nothing.
    fn warm_kernels(
        &self,
        threads: usize,
        progress: &(dyn Fn(usize, usize, &str) + Sync),
    ) -> Result<WarmReport> {
        let _ = (threads, progress);
        Ok(WarmReport::default())
    }
}

/// What [`super::Device::warm_kernels`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WarmReport {
    /// Kernel families (compilation units) the backend has; 0 for a backend that compiles none.
    pub families: usize,
    /// Families compiled now (the others were cached).
    pub compiled: usize,
    /// Threads that compiled them.
    pub threads: usize,
    /// Wall-clock seconds the compiles took.
    pub seconds: f64,
}

/// Encodes dispatches for submission. Barriers separate groups whose dispatches may run at the
/// same time; a backend whose work runs in order may ignore them.
pub(crate) trait Encoder: Send {
    /// Adds one dispatch (a backend may start it at once). With
    /// [`EncoderOptions::sync_each_dispatch`] it has run when this returns.
    fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()>;

    /// Ends the current group: what follows waits for what came before.
    fn barrier(&mut self);

    /// Dispatches encoded since the last submission.
    fn encoded(&self) -> usize;

    /// Hands what was encoded since the last submission to the device and returns at once; the
    /// encoder stays open for more.
    fn submit(&mut self) -> Result<Box<dyn Submission>>;
}

/// Work handed to a device.
pub(crate) trait Submission: Send {
    /// Blocks until the work has run; returns the first error, if any.
    fn wait(self: Box<Self>) -> Result<()>;
}

/// One kernel's time in a profiling run of a [`Replay`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KernelTime {
    /// The CPU pool thread that ran it, or 0 on a GPU (one stream).
    pub track: usize,
    /// Start, in microseconds from the start of the run.
    pub start_us: f64,
    /// Duration in microseconds.
    pub dur_us: f64,
}

/// An instantiated graph, replayed by launching it.
pub(crate) trait Replay: Send + Sync {
    /// The dispatches, in the order they were instantiated.
    fn dispatches(&self) -> &[Dispatch];

    /// Starts a replay; a backend may return before it has run ([`Replay::wait`] waits).
    fn launch(&self) -> Result<()>;

    /// Waits for the last launch.
    fn wait(&self) -> Result<()>;

    /// Starts a replay as [`Replay::launch`] does and returns a mark of it: the mark reads a
    /// buffer once this launch (and all work before it) has run, without waiting for launches
    /// made after it. A backend whose launches run to the end before they return reads at once.
    fn launch_marked(&self) -> Result<Box<dyn LaunchMark>>;

    /// A profiling run: the same work, each kernel timed; one entry per dispatch, in order.
    fn profile(&self) -> Result<Vec<KernelTime>>;
}

/// A point in a device's work after one launch ([`Replay::launch_marked`]).
pub(crate) trait LaunchMark: Send {
    /// The bytes of `buf` as the marked launch left them: waits for that launch, not for work
    /// queued after it, which must not write `buf`. Fails with the first kernel error or fault
    /// the device reports by then.
    fn read(&self, buf: &Buffer) -> Result<Vec<u8>>;
}

/// Times the work queued between its start and [`StepTimer::stop`].
pub(crate) trait StepTimer {
    /// Seconds since the start (waits for the work queued so far).
    fn stop(self: Box<Self>) -> Result<f64>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{capabilities_at, cpu, cuda, Device};

    /// The declarations hold what the model, the ops and the engine did per device before they
    /// read them: any change here changes plans (and speed) on that backend.
    #[test]
    fn the_declarations_keep_each_backends_choices() {
        let (c, g) = (&cpu::CAPABILITIES, &cuda::CAPABILITIES);
        // Every fusion at every row count on the CPU, bit-exact; on CUDA the block fusions only
        // for one-row passes and within rounding, the others everywhere and bit-exact.
        for f in Fusion::ALL {
            let u = c.fusion(f).expect("the cpu makes every fusion");
            assert_eq!((u.max_rows, u.exact), (None, true), "cpu {f:?}");
            let u = g.fusion(f).expect("cuda makes every fusion");
            let block = matches!(
                f,
                Fusion::NormQkvRope | Fusion::NormGateUp | Fusion::NormQkv
            );
            let want = if block {
                (Some(1), false)
            } else {
                (None, true)
            };
            assert_eq!((u.max_rows, u.exact), want, "cuda {f:?}");
        }
        assert_eq!(
            (c.decode_attention_chunk, g.decode_attention_chunk),
            (256, 32)
        );
        assert!(!c.single_dispatch_decode_attention && g.single_dispatch_decode_attention);
        assert!(c.early_submit && !g.early_submit);
        assert!(c.host_memory && !g.host_memory);
        assert!(c.custom_cpu_kernels && !g.custom_cpu_kernels);
        assert_eq!(c.replay_ordering, ReplayOrdering::Barriers);
        assert_eq!(g.replay_ordering, ReplayOrdering::Edges);
        assert_eq!(c.step_clock, StepClock::HostWall);
        assert_eq!(g.step_clock, StepClock::DeviceEvents);
    }

    #[test]
    fn a_device_and_its_memory_read_the_same_declarations() {
        let dev = Device::cpu(1).unwrap();
        assert_eq!(dev.capabilities(), &cpu::CAPABILITIES);
        assert_eq!(dev.backend().capabilities(), &cpu::CAPABILITIES);
        let buf = dev.alloc(crate::DType::F32, &[4]).unwrap();
        assert_eq!(dev.backend().home(), Location::Host);
        assert_eq!(capabilities_at(buf.allocation().home()), dev.capabilities());
        assert_eq!(capabilities_at(Location::Cuda(3)), &cuda::CAPABILITIES);
        assert_eq!(dev.backend().kind(), BackendKind::Cpu);
        assert_eq!(dev.name(), "cpu (1 threads)");
    }

    #[test]
    fn a_fusion_a_backend_does_not_declare_is_absent() {
        const ONLY_MATMUL_ADD: &[FusionUse] = &[FusionUse::always(Fusion::MatMulAdd)];
        let caps = Capabilities {
            fusions: ONLY_MATMUL_ADD,
            ..cpu::CAPABILITIES
        };
        assert!(caps.fusion(Fusion::MatMulAdd).is_some());
        assert!(caps.fusion(Fusion::NormQkvRope).is_none());
    }
}
