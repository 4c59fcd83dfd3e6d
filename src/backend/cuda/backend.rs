//! The CUDA device behind the backend interface: its declarations, its encoder, the CUDA graph an
//! instantiated graph becomes (and its marked launches), and event timers.

use std::sync::{Arc, Mutex};

use super::mark::{CudaMark, SideStream};
use super::{CudaDevice, CudaGraph, GpuEvent};
use crate::backend::cpu::CpuKernelFn;
use crate::backend::interface::{
    Backend, Capabilities, Encoder, EncoderOptions, F16Products, KernelTime, LaunchMark, Replay,
    ReplayOrdering, StepClock, StepTimer,
};
use crate::backend::{Allocation, BackendKind, Buffer, DType, Location, WarmReport};
use crate::error::{Error, Result};
use crate::graph::{Dispatch, KernelId};
use crate::kernels::{Fusion, FusionUse};

/// What the CUDA backend declares on a GPU whose kernels are not compiled for sm_90a (see each
/// field of [`Capabilities`] for the reasons); [`CAPABILITIES_SM90A`] where they are.
pub const CAPABILITIES: Capabilities = Capabilities {
    fusions: &[
        FusionUse {
            fusion: Fusion::NormQkvRope,
            max_rows: Some(1),
            exact: false,
        },
        FusionUse {
            fusion: Fusion::NormGateUp,
            max_rows: Some(1),
            exact: false,
        },
        FusionUse {
            fusion: Fusion::NormQkv,
            max_rows: Some(1),
            exact: false,
        },
        FusionUse::always(Fusion::MatMulAdd),
        FusionUse::always(Fusion::RmsNormMul),
        FusionUse::always(Fusion::RmsNormAdd),
        FusionUse::always(Fusion::RmsNormRope),
        FusionUse::always(Fusion::RmsNormRopeKv),
        FusionUse::always(Fusion::ProductTriple),
        FusionUse::always(Fusion::ProductPairSwiglu),
        FusionUse::always(Fusion::RopeKv),
    ],
    decode_attention_chunk: 32,
    single_dispatch_decode_attention: true,
    early_submit: false,
    host_memory: false,
    custom_cpu_kernels: false,
    replay_ordering: ReplayOrdering::Edges,
    f16_products: F16Products::SmallBlocks,
    kv_cache: DType::F16,
    step_clock: StepClock::DeviceEvents,
};

/// What the CUDA backend declares on a GPU of compute capability 9.0 whose kernels are compiled
/// for sm_90a: [`CAPABILITIES`] with every GGML block format's prompt products on f16
/// activations (the `wgmma` form, `matmul_wgmma.cuh`, takes them all).
pub const CAPABILITIES_SM90A: Capabilities = CAPABILITIES.with_f16_products(F16Products::AllBlocks);

impl Backend for Arc<CudaDevice> {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn name(&self) -> String {
        CudaDevice::name(self)
    }

    fn capabilities(&self) -> &'static Capabilities {
        if self.registry().compiler().arch() == "sm_90a" {
            &CAPABILITIES_SM90A
        } else {
            &CAPABILITIES
        }
    }

    fn home(&self) -> Location {
        Location::Cuda(self.ordinal())
    }

    fn alloc_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        CudaDevice::alloc_bytes(self, bytes)
    }

    fn alloc_scratch_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        CudaDevice::alloc_scratch_bytes(self, bytes)
    }

    /// Device memory cannot be a host mapping: `None`, the caller uploads.
    fn map_file(
        &self,
        _map: Arc<memmap2::Mmap>,
        _offset: usize,
        _len: usize,
    ) -> Result<Option<Arc<Allocation>>> {
        Ok(None)
    }

    fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()> {
        CudaDevice::write_bytes(self, buf, bytes)
    }

    fn read_into(&self, buf: &Buffer, out: &mut [u8]) -> Result<()> {
        CudaDevice::read_into(self, buf, out)
    }

    fn encoder(&self, options: EncoderOptions) -> Box<dyn Encoder> {
        Box::new(self.encoder_with(options))
    }

    /// One CUDA graph with a kernel node per dispatch and exactly the edges of `preds`,
    /// instantiated once.
    fn instantiate(
        &self,
        dispatches: Vec<Dispatch>,
        preds: &[Vec<usize>],
        _levels: &[usize],
    ) -> Result<Box<dyn Replay>> {
        let graph = CudaGraph::build(self, &dispatches, preds)?;
        Ok(Box::new(CudaReplay {
            device: self.clone(),
            dispatches,
            graph,
            side: Mutex::new(None),
        }))
    }

    fn register_custom(&self, id: KernelId, _kernel: CpuKernelFn) -> Result<()> {
        Err(Error::Unsupported(format!(
            "custom kernel `{}`: custom kernels run on the CPU backend only",
            id.name()
        )))
    }

    /// A pair of events around the step's work on the device's stream.
    fn step_timer(&self) -> Result<Box<dyn StepTimer>> {
        let (start, end) = (GpuEvent::new(self)?, GpuEvent::new(self)?);
        start.record()?;
        Ok(Box::new(EventTimer { start, end }))
    }

    fn warm_kernels(
        &self,
        threads: usize,
        progress: &(dyn Fn(usize, usize, &str) + Sync),
    ) -> Result<WarmReport> {
        CudaDevice::warm_kernels(self, threads, progress)
    }
}

/// Device time between two events.
struct EventTimer {
    start: GpuEvent,
    end: GpuEvent,
}

impl StepTimer for EventTimer {
    fn stop(self: Box<Self>) -> Result<f64> {
        self.end.record()?;
        Ok(f64::from(self.start.elapsed_ms(&self.end)?) / 1e3)
    }
}

/// A graph instantiated for a GPU: one CUDA graph, launched on the device's stream.
struct CudaReplay {
    device: Arc<CudaDevice>,
    dispatches: Vec<Dispatch>,
    graph: CudaGraph,
    /// The stream marked launches are read on, made at the first mark.
    side: Mutex<Option<Arc<SideStream>>>,
}

impl Replay for CudaReplay {
    fn dispatches(&self) -> &[Dispatch] {
        &self.dispatches
    }

    /// One graph launch, queued on the device's stream (the next download or wait waits for it).
    fn launch(&self) -> Result<()> {
        self.graph.launch()
    }

    fn wait(&self) -> Result<()> {
        self.device.synchronize()
    }

    /// The graph launch, then an event on the device's stream; reads wait for the event on a
    /// stream of their own.
    fn launch_marked(&self) -> Result<Box<dyn LaunchMark>> {
        let side = {
            let mut slot = self
                .side
                .lock()
                .map_err(|_| Error::Backend("the replay's side stream lock is poisoned".into()))?;
            match &*slot {
                Some(side) => side.clone(),
                None => slot.insert(SideStream::new(&self.device)?).clone(),
            }
        };
        self.graph.launch()?;
        Ok(Box::new(CudaMark::record(&side)?))
    }

    /// The dispatches launched one by one between events, in order (track 0, one stream).
    fn profile(&self) -> Result<Vec<KernelTime>> {
        let times = super::profile_dispatches(&self.device, &self.dispatches)?;
        let mut start_us = 0.0;
        Ok(times
            .into_iter()
            .map(|ms| {
                let dur_us = f64::from(ms) * 1e3;
                let t = KernelTime {
                    track: 0,
                    start_us,
                    dur_us,
                };
                start_us += dur_us;
                t
            })
            .collect())
    }
}
