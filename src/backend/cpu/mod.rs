//! The CPU reference backend.
//!
//! Kernels are plain Rust functions in a registry keyed by kernel name. A submission is a list of
//! groups separated by barriers; a worker thread runs the groups in order, and the dispatches of
//! one group in parallel on a rayon pool. `submit` returns at once and [`CpuSubmission::wait`]
//! blocks, so a split submission really overlaps encoding with execution.

mod args;
mod backend;
pub mod kernels;
pub(crate) mod run;
#[cfg(test)]
mod run_tests;
mod worker;

pub use args::KernelArgs;
pub use backend::CAPABILITIES;
pub use worker::{CpuEncoder, CpuSubmission};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::{Allocation, Buffer, EncoderOptions, HostMemory};
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
    /// Keeps host copies off memory that kernels may be using ([`run`]).
    memory: Arc<run::MemoryLock>,
    /// The backend whose declarations it reports: the CPU's own, or those of the backend it
    /// stands in for ([`CpuDevice::standing_in_for`]).
    declares: crate::backend::BackendKind,
}

impl CpuDevice {
    /// A device with `threads` pool threads (0: one per core; more than
    /// [`MAX_THREADS_PER_CORE`] per core are capped, with a warning). A thread that cannot be
    /// started is an error.
    pub fn new(threads: usize) -> Result<Self> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = capped_threads(threads, cores);
        let pool = Arc::new(build_pool(threads, |t| {
            let mut b = std::thread::Builder::new();
            if let Some(name) = t.name() {
                b = b.name(name.to_string());
            }
            if let Some(size) = t.stack_size() {
                b = b.stack_size(size);
            }
            b.spawn(|| t.run()).map(drop)
        })?);
        let mut registry = CpuRegistry::default();
        kernels::register_all(&mut registry);
        let memory = Arc::new(run::MemoryLock::default());
        let worker = worker::Worker::start(pool.clone(), memory.clone())?;
        Ok(CpuDevice {
            pool,
            registry: Arc::new(RwLock::new(registry)),
            worker,
            memory,
            declares: crate::backend::BackendKind::Cpu,
        })
    }

    /// The same device reporting the declarations of the backend `kind`, so that passes record
    /// and optimize as on that backend (its fusion rules, its decode attention form) where that
    /// backend's hardware is absent: for inspecting graphs (`graph --backend cuda` without a
    /// GPU). Running such passes fails on the first kernel the CPU does not have.
    pub fn standing_in_for(mut self, kind: crate::backend::BackendKind) -> Self {
        self.declares = kind;
        self
    }

    /// The backend whose declarations it reports (`Cpu` unless it stands in for another).
    pub fn declares(&self) -> crate::backend::BackendKind {
        self.declares
    }

    /// Number of pool threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs kernels through `f` inside the pool, holding the memory lock ([`run`]) so that no
    /// host copy overlaps them.
    pub(crate) fn run_kernels<R: Send>(&self, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        let _held = self.memory.hold()?;
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

    /// A fresh encoder with the default options.
    pub fn encoder(self: &Arc<Self>) -> CpuEncoder {
        self.encoder_with(EncoderOptions::default())
    }

    /// A fresh encoder with `options`.
    pub fn encoder_with(self: &Arc<Self>, options: EncoderOptions) -> CpuEncoder {
        CpuEncoder::new(self.clone(), options)
    }

    pub(crate) fn worker(&self) -> &worker::Worker {
        &self.worker
    }

    pub(crate) fn alloc_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        let mem = HostMemory::zeroed(bytes).ok_or_else(|| {
            Error::Backend(format!("out of host memory allocating {bytes} bytes"))
        })?;
        Ok(Allocation::new(bytes, mem))
    }

    pub(crate) fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()> {
        let ptr = buf.allocation().memory().host_ptr_mut().ok_or_else(|| {
            Error::View(format!(
                "{buf:?} is read-only ({})",
                buf.allocation().location()
            ))
        })?;
        let _held = self.memory.hold()?;
        // SAFETY: the view lies inside its allocation and `bytes` has the view's length (checked
        // by `Device::write_bytes`); no kernel runs while the memory lock is held.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.add(buf.offset()), bytes.len())
        };
        Ok(())
    }

    pub(crate) fn read_into(&self, buf: &Buffer, out: &mut [u8]) -> Result<()> {
        let ptr = buf
            .allocation()
            .memory()
            .host_ptr()
            .ok_or_else(|| Error::View(format!("{buf:?} is not host-visible")))?;
        let _held = self.memory.hold()?;
        // SAFETY: as in `write_bytes`.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.add(buf.offset()), buf.len_bytes()) };
        if out.len() != bytes.len() {
            return Err(Error::View(format!(
                "reading a view of {} bytes into {} bytes",
                bytes.len(),
                out.len()
            )));
        }
        out.copy_from_slice(bytes);
        Ok(())
    }
}

/// The most pool threads per core: more only take turns on the cores (and each costs a stack).
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The pool size for a request of `threads` (0: one per core) on `cores` cores: at most
/// [`MAX_THREADS_PER_CORE`] per core, with a warning when the request is lowered.
fn capped_threads(threads: usize, cores: usize) -> usize {
    let cap = cores.max(1).saturating_mul(MAX_THREADS_PER_CORE);
    if threads == 0 {
        return cores.max(1);
    }
    if threads > cap {
        tracing::warn!(
            "{threads} CPU threads requested on {cores} cores; using {cap} \
             ({MAX_THREADS_PER_CORE} per core): more would only take turns on the cores"
        );
        return cap;
    }
    threads
}

/// Builds the device's rayon pool of `threads` threads, starting each with `spawn`. A thread that
/// does not start is an error that names it (rayon stops the threads already started).
fn build_pool(
    threads: usize,
    spawn: impl FnMut(rayon::ThreadBuilder) -> std::io::Result<()>,
) -> Result<rayon::ThreadPool> {
    let mut spawn = spawn;
    let mut started = 0usize;
    let mut failed = None;
    let result = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("onepass-cpu-{i}"))
        .spawn_handler(|t| {
            let r = spawn(t);
            match &r {
                Ok(()) => started += 1,
                Err(_) => failed = Some(started),
            }
            r
        })
        .build();
    result.map_err(|e| {
        let which = failed.map_or(String::new(), |i| {
            format!(" (thread {} of {threads})", i + 1)
        });
        Error::Backend(format!("cannot start the CPU thread pool{which}: {e}"))
    })
}

/// Wraps a file mapping as a read-only allocation (zero-copy model weights on the CPU); an error
/// when the window of `len` bytes at `offset` does not lie inside the map.
pub fn map_allocation(
    map: Arc<memmap2::Mmap>,
    offset: usize,
    len: usize,
) -> Result<Arc<Allocation>> {
    let window = super::MappedMemory::new(map, offset, len)?;
    Ok(Allocation::new(window.len(), window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_requests_are_capped_at_a_multiple_of_the_cores() {
        assert_eq!(capped_threads(0, 8), 8);
        assert_eq!(capped_threads(0, 0), 1);
        assert_eq!(capped_threads(3, 8), 3);
        assert_eq!(capped_threads(32, 8), 32);
        assert_eq!(capped_threads(33, 8), 32);
        assert_eq!(capped_threads(100_000, 2), 8);
    }

    #[test]
    fn a_thread_that_does_not_start_is_an_error() {
        let mut handles = Vec::new();
        let mut n = 0;
        let e = build_pool(4, |t| {
            n += 1;
            if n == 3 {
                return Err(std::io::Error::from(std::io::ErrorKind::WouldBlock));
            }
            handles.push(std::thread::spawn(|| t.run()));
            Ok(())
        })
        .expect_err("the pool must not start");
        let msg = e.to_string();
        assert!(msg.contains("thread 3 of 4"), "{msg}");
        // The two threads that did start are told to stop, and do.
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_device_with_too_many_threads_is_capped() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let d = CpuDevice::new(100_000).unwrap();
        assert_eq!(d.threads(), cores * MAX_THREADS_PER_CORE);
    }
}
