//! The CPU device behind the backend interface: its declarations, its encoder, and the
//! instantiated schedule a graph becomes.
//!
//! An instantiated graph is sorted into levels (a level holds the dispatches whose longest
//! dependency chain has the same length; no two of them conflict), its kernels resolved once; a
//! replay runs the levels in order, each level's dispatches in parallel on the device's pool,
//! holding the memory lock ([`super::run`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{CpuDevice, CpuKernelFn};
use crate::backend::interface::{
    Backend, Capabilities, Encoder, EncoderOptions, F16Products, KernelTime, LaunchMark, Replay,
    ReplayOrdering, StepClock, StepTimer,
};
use crate::backend::{Allocation, BackendKind, Buffer, DType, Location};
use crate::error::{Error, Result};
use crate::graph::{Dispatch, KernelId};
use crate::kernels::{Fusion, FusionUse};

/// What the CPU backend declares (see each field of [`Capabilities`] for the reasons).
pub const CAPABILITIES: Capabilities = Capabilities {
    fusions: &[
        FusionUse::always(Fusion::NormQkvRope),
        FusionUse::always(Fusion::NormGateUp),
        FusionUse::always(Fusion::NormQkv),
        FusionUse::always(Fusion::MatMulAdd),
        FusionUse::always(Fusion::RmsNormMul),
        FusionUse::always(Fusion::RmsNormAdd),
        FusionUse::always(Fusion::RmsNormRope),
        FusionUse::always(Fusion::RmsNormRopeKv),
        FusionUse::always(Fusion::ProductTriple),
        FusionUse::always(Fusion::ProductPairSwiglu),
        FusionUse::always(Fusion::RopeKv),
    ],
    decode_attention_chunk: 256,
    single_dispatch_decode_attention: false,
    early_submit: true,
    host_memory: true,
    custom_cpu_kernels: true,
    replay_ordering: ReplayOrdering::Barriers,
    f16_products: F16Products::None,
    kv_cache: DType::F32,
    step_clock: StepClock::HostWall,
};

impl Backend for Arc<CpuDevice> {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn name(&self) -> String {
        if self.declares() != BackendKind::Cpu {
            format!(
                "cpu ({} threads) standing in for {}",
                self.threads(),
                self.declares()
            )
        } else {
            format!("cpu ({} threads)", self.threads())
        }
    }

    fn capabilities(&self) -> &'static Capabilities {
        crate::backend::capabilities_of(self.declares())
    }

    fn home(&self) -> Location {
        Location::Host
    }

    fn alloc_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        CpuDevice::alloc_bytes(self, bytes)
    }

    fn alloc_scratch_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        CpuDevice::alloc_bytes(self, bytes)
    }

    fn map_file(
        &self,
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    ) -> Result<Option<Arc<Allocation>>> {
        super::map_allocation(map, offset, len).map(Some)
    }

    fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()> {
        CpuDevice::write_bytes(self, buf, bytes)
    }

    fn read_into(&self, buf: &Buffer, out: &mut [u8]) -> Result<()> {
        CpuDevice::read_into(self, buf, out)
    }

    fn encoder(&self, options: EncoderOptions) -> Box<dyn Encoder> {
        Box::new(self.encoder_with(options))
    }

    fn instantiate(
        &self,
        dispatches: Vec<Dispatch>,
        _preds: &[Vec<usize>],
        levels: &[usize],
    ) -> Result<Box<dyn Replay>> {
        let kernels = dispatches
            .iter()
            .map(|d| self.kernel(d.kernel()))
            .collect::<Result<Vec<_>>>()?;
        let n_levels = levels.iter().max().map_or(0, |m| m + 1);
        let mut schedule = vec![Vec::new(); n_levels];
        for (i, &l) in levels.iter().enumerate() {
            schedule[l].push(i);
        }
        Ok(Box::new(CpuReplay {
            device: self.clone(),
            dispatches,
            kernels,
            schedule,
        }))
    }

    fn register_custom(&self, id: KernelId, kernel: CpuKernelFn) -> Result<()> {
        CpuDevice::register_custom(self, id, kernel)
    }

    fn step_timer(&self) -> Result<Box<dyn StepTimer>> {
        Ok(Box::new(WallTimer(Instant::now())))
    }
}

/// Host wall time since it started.
struct WallTimer(Instant);

impl StepTimer for WallTimer {
    fn stop(self: Box<Self>) -> Result<f64> {
        Ok(self.0.elapsed().as_secs_f64())
    }
}

/// A graph instantiated for the CPU: resolved kernels and the levels to run them in.
struct CpuReplay {
    device: Arc<CpuDevice>,
    dispatches: Vec<Dispatch>,
    kernels: Vec<CpuKernelFn>,
    schedule: Vec<Vec<usize>>,
}

impl Replay for CpuReplay {
    fn dispatches(&self) -> &[Dispatch] {
        &self.dispatches
    }

    /// Runs the schedule to the end on the device's pool.
    fn launch(&self) -> Result<()> {
        self.device.run_kernels(|| self.run(None))
    }

    fn wait(&self) -> Result<()> {
        Ok(())
    }

    /// The schedule run to the end; the mark reads at once.
    fn launch_marked(&self) -> Result<Box<dyn LaunchMark>> {
        self.launch()?;
        Ok(Box::new(CpuMark(self.device.clone())))
    }

    /// The schedule with each kernel's wall time and the pool thread that ran it.
    fn profile(&self) -> Result<Vec<KernelTime>> {
        let slots: Vec<Mutex<Option<KernelTime>>> = (0..self.dispatches.len())
            .map(|_| Mutex::new(None))
            .collect();
        let t0 = Instant::now();
        self.device.run_kernels(|| self.run(Some((&slots, t0))))?;
        slots
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .map(Option::unwrap_or_default)
                    .map_err(|_| Error::Backend("profiling lock poisoned".into()))
            })
            .collect()
    }
}

type ProfileSlots<'a> = (&'a [Mutex<Option<KernelTime>>], Instant);

/// A CPU launch has run when it returns: its mark reads the buffer as it is.
struct CpuMark(Arc<CpuDevice>);

impl LaunchMark for CpuMark {
    fn read(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let mut out = vec![0u8; buf.len_bytes()];
        self.0.read_into(buf, &mut out)?;
        Ok(out)
    }
}

impl CpuReplay {
    fn run(&self, profile: Option<ProfileSlots<'_>>) -> Result<()> {
        let (dispatches, kernels) = (&self.dispatches, &self.kernels);
        for level in &self.schedule {
            if let [only] = level.as_slice() {
                run_one(&dispatches[*only], kernels[*only], *only, profile)?;
                continue;
            }
            // No two dispatches of one level conflict (each conflicting pair is joined by a
            // dependency path, so their levels differ): they touch overlapping bytes only when all
            // of them only read, which makes running them on several threads at once sound.
            let mut results: Vec<Result<()>> = level.iter().map(|_| Ok(())).collect();
            rayon::scope(|s| {
                for (slot, &i) in results.iter_mut().zip(level) {
                    s.spawn(move |_| *slot = run_one(&dispatches[i], kernels[i], i, profile));
                }
            });
            results.into_iter().collect::<Result<()>>()?;
        }
        Ok(())
    }
}

fn run_one(
    d: &Dispatch,
    kernel: CpuKernelFn,
    index: usize,
    profile: Option<ProfileSlots<'_>>,
) -> Result<()> {
    let start = Instant::now();
    let result = super::run::call_kernel(kernel, d.kernel(), d.args());
    if let Some((slots, t0)) = profile {
        let track = rayon::current_thread_index().unwrap_or(0);
        let start_us = (start - t0).as_secs_f64() * 1e6;
        let dur_us = start.elapsed().as_secs_f64() * 1e6;
        if let Ok(mut s) = slots[index].lock() {
            *s = Some(KernelTime {
                track,
                start_us,
                dur_us,
            });
        }
    }
    result
}
