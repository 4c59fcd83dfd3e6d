//! The CPU reference backend.
//!
//! Kernels are plain Rust functions in a registry keyed by kernel name. A submission is a list of
//! groups separated by barriers; a worker thread runs the groups in order, and the dispatches of
//! one group in parallel on a rayon pool. `submit` returns at once and [`CpuSubmission::wait`]
//! blocks, so a split submission really overlaps encoding with execution.

mod args;
pub mod kernels;
mod worker;

pub use args::KernelArgs;
pub use worker::{CpuEncoder, CpuSubmission};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::{Allocation, Buffer, HostMemory, Memory};
use crate::error::{Error, Result};
use crate::kernels::{KernelId, KernelSig};

/// A CPU kernel: reads and writes its dispatch's arguments.
pub type CpuKernelFn = fn(&KernelArgs<'_>) -> Result<()>;

/// The table of CPU kernels: each function registered against its kernel's declaration, found
/// by name and handed out only for that very declaration.
#[derive(Default)]
pub struct CpuRegistry {
    kernels: HashMap<&'static str, (KernelId, CpuKernelFn)>,
}

impl CpuRegistry {
    /// Adds (or replaces) the function of a declared kernel.
    pub(crate) fn add(&mut self, sig: &'static KernelSig, kernel: CpuKernelFn) {
        self.kernels.insert(sig.name(), (KernelId::of(sig), kernel));
    }

    /// Adds the functions of a family of declared kernels, in the family's order.
    pub(crate) fn family<const N: usize>(
        &mut self,
        sigs: &'static [KernelSig; N],
        kernels: [CpuKernelFn; N],
    ) {
        for (sig, kernel) in sigs.iter().zip(kernels) {
            self.add(sig, kernel);
        }
    }

    /// Adds a user kernel's function; an error when another declaration or function holds the
    /// name (the same pair again is fine).
    pub(crate) fn add_custom(&mut self, id: KernelId, kernel: CpuKernelFn) -> Result<()> {
        match self.kernels.get(id.name()) {
            Some(&(held, f)) if held == id && f as usize == kernel as usize => Ok(()),
            Some(_) => Err(Error::InvalidArgument(format!(
                "kernel {id}: another kernel of that name is already registered"
            ))),
            None => {
                self.kernels.insert(id.name(), (id, kernel));
                Ok(())
            }
        }
    }

    /// The function of `id`: an error when no function is registered for that declaration (an
    /// untyped kernel, or another declaration of the same name, has none).
    pub fn get(&self, id: KernelId) -> Result<CpuKernelFn> {
        match self.kernels.get(id.name()) {
            Some(&(held, f)) if held == id => Ok(f),
            _ => Err(Error::UnknownKernel {
                name: id.name().to_string(),
                backend: "cpu",
            }),
        }
    }

    /// Number of kernels.
    pub fn len(&self) -> usize {
        self.kernels.len()
    }

    /// Whether the registry is empty.
    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }

    /// Kernel names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.kernels.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// The CPU device: its thread pool, its worker and its kernel registry.
pub struct CpuDevice {
    pool: Arc<rayon::ThreadPool>,
    registry: Arc<RwLock<CpuRegistry>>,
    worker: worker::Worker,
}

impl CpuDevice {
    /// A device with `threads` pool threads (0: one per core).
    pub fn new(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("onepass-cpu-{i}"))
            .build()
            .map_err(|e| Error::Backend(format!("cannot start the CPU thread pool: {e}")))?;
        let pool = Arc::new(pool);
        let mut registry = CpuRegistry::default();
        kernels::register_all(&mut registry);
        let worker = worker::Worker::start(pool.clone())?;
        Ok(CpuDevice {
            pool,
            registry: Arc::new(RwLock::new(registry)),
            worker,
        })
    }

    /// Number of pool threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` inside the device's thread pool (so rayon calls in `f` use its threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Adds a user kernel to the registry; an error when another kernel holds its name.
    pub fn register_custom(&self, id: KernelId, kernel: CpuKernelFn) -> Result<()> {
        self.registry
            .write()
            .map_err(|_| Error::Backend("kernel registry lock poisoned".into()))?
            .add_custom(id, kernel)
    }

    /// Looks a kernel up.
    pub fn kernel(&self, id: KernelId) -> Result<CpuKernelFn> {
        self.registry
            .read()
            .map_err(|_| Error::Backend("kernel registry lock poisoned".into()))?
            .get(id)
    }

    /// Kernel names in the registry.
    pub fn kernel_names(&self) -> Vec<&'static str> {
        self.registry.read().map(|r| r.names()).unwrap_or_default()
    }

    /// A fresh encoder for one submission.
    pub fn encoder(self: &Arc<Self>) -> CpuEncoder {
        CpuEncoder::new(self.clone())
    }

    pub(crate) fn worker(&self) -> &worker::Worker {
        &self.worker
    }

    pub(crate) fn alloc_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        let mem = HostMemory::zeroed(bytes).ok_or_else(|| {
            Error::Backend(format!("out of host memory allocating {bytes} bytes"))
        })?;
        Ok(Allocation::new(bytes, Memory::Host(mem)))
    }

    pub(crate) fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()> {
        let ptr = buf.allocation().memory.host_ptr_mut().ok_or_else(|| {
            Error::View(format!(
                "{buf:?} is read-only ({})",
                buf.allocation().location()
            ))
        })?;
        // SAFETY: the view lies inside its allocation and `bytes` has the view's length (checked
        // by `Device::write_bytes`); no submission is in flight while the host writes (sessions
        // wait for their submissions before returning).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.add(buf.offset()), bytes.len())
        };
        Ok(())
    }

    pub(crate) fn read_bytes(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let ptr = buf
            .allocation()
            .memory
            .host_ptr()
            .ok_or_else(|| Error::View(format!("{buf:?} is not host-visible")))?;
        // SAFETY: as in `write_bytes`.
        Ok(unsafe { std::slice::from_raw_parts(ptr.add(buf.offset()), buf.len_bytes()) }.to_vec())
    }
}

/// Wraps a file mapping as a read-only allocation (zero-copy model weights on the CPU); an error
/// when the window of `len` bytes at `offset` does not lie inside the map.
pub fn map_allocation(
    map: Arc<memmap2::Mmap>,
    offset: usize,
    len: usize,
) -> Result<Arc<Allocation>> {
    let window = super::MappedMemory::new(map, offset, len)?;
    Ok(Allocation::new(window.len(), Memory::Mapped(window)))
}
