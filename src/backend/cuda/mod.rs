//! The CUDA backend, through `cudarc` with dynamic loading: the crate builds and runs where there
//! is no CUDA, and finds the driver and NVRTC at run time.
//!
//! - Discovery never panics: [`driver_present`] is checked before any driver call.
//! - [`CudaDevice`]: one context (the device's primary context), one stream, a
//!   [`KernelRegistry`] (NVRTC-compiled, disk-cached cubins) and a [`ScratchPool`].
//! - Memory is plain device memory (`cuMemAlloc`), never managed memory. Host copies go through
//!   the device's stream and wait for it, so they are ordered after every launch before them.
//! - [`CudaEncoder`] launches dispatches into the stream; stream order is the barrier. The raw
//!   launch and graph-node calls live in `launch.rs`, with their safety contract.
//! - Kernel-detected bad arguments (a token id outside the vocabulary, ...) land in the device's
//!   error record and come back as errors from [`CudaDevice::synchronize`] (see [`fault`]).
//! - Every driver call's failure becomes [`Error::Driver`] naming the call, with the driver's
//!   status as its typed source. Out of memory names the size and what the device had free (the
//!   scratch pool's cached blocks are freed and the allocation tried once more first). A kernel
//!   fault (an illegal address, ...) breaks the context for good: the error says so, the device
//!   remembers it, and every later call on it returns [`Error::Faulted`] at once
//!   ([`CudaDevice::fault`]) instead of reaching the driver.

mod backend;
mod cache;
mod encoder;
pub mod fault;
mod graph;
mod launch;
mod mark;
mod memory;
pub mod nvrtc;
mod registry;
pub mod stamps;
mod warm;

pub use backend::{CAPABILITIES, CAPABILITIES_SM90A};
pub use cache::{cache_key, default_cache_dir, CubinCache};
pub use encoder::CudaEncoder;
pub use graph::{profile_dispatches, CudaGraph, GpuEvent};
pub use memory::{size_class, CudaMemory, PoolStats, ScratchPool};
pub use registry::{
    all_kernel_names, arch_for, include_dir_from_env, kernel_names_in, Kernel, KernelCompiler,
    KernelRegistry, KernelSource, PRELUDE, SOURCES,
};
pub use warm::MAX_WARM_THREADS;

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::{Allocation, Buffer, EncoderOptions, WarmReport};
use crate::error::{Error, Result};
use memory::{driver_err, is_sticky};

/// The architecture NVRTC targets when there is no device to ask (H100 / H200).
pub const DEFAULT_ARCH: &str = "sm_90a";

/// Whether the CUDA driver library (`libcuda`) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no driver function is called.
    unsafe { sys::is_culib_present() }
}

fn require_driver() -> Result<()> {
    if !driver_present() {
        return Err(Error::Unavailable(
            "no CUDA driver found (libcuda is not on the library path)".into(),
        ));
    }
    result::init().map_err(driver_err("cuInit"))
}

/// The driver's CUDA version (`"13.0"`), or `None` without a driver.
pub fn driver_version() -> Option<String> {
    if !driver_present() {
        return None;
    }
    let mut v: c_int = 0;
    // SAFETY: the library is present; `v` is valid for writes. No context is needed.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    (r == sys::CUresult::CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// Number of CUDA devices (an error without a driver).
pub fn device_count() -> Result<usize> {
    require_driver()?;
    result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(driver_err("cuDeviceGetCount"))
}

/// What discovery knows about one device, without creating a context.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// The ordinal.
    pub ordinal: usize,
    /// The marketing name.
    pub name: String,
    /// Compute capability, major and minor.
    pub compute_capability: (i32, i32),
    /// Total memory in bytes.
    pub total_memory: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// The most dynamic shared memory one block may ask for (bytes, with the opt-in attribute):
    /// 227 KiB on an H100, 99 KiB on sm_86 and sm_89.
    pub max_shared_per_block: i32,
    /// Shared memory of one multiprocessor (bytes): 228 KiB on an H100.
    pub shared_per_sm: i32,
    /// Shared memory the driver sets aside for each resident block (bytes; 1 KiB from sm_80).
    pub reserved_shared_per_block: i32,
}

/// Every device the driver reports (an error without a driver).
pub fn devices() -> Result<Vec<DeviceInfo>> {
    (0..device_count()?).map(device_info).collect()
}

/// One device's description.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    require_driver()?;
    let dev = result::device::get(ordinal as c_int).map_err(driver_err("cuDeviceGet"))?;
    let attr = |a: sys::CUdevice_attribute| {
        // SAFETY: `dev` is a valid device handle from `cuDeviceGet`.
        unsafe { result::device::get_attribute(dev, a) }.map_err(driver_err("cuDeviceGetAttribute"))
    };
    use sys::CUdevice_attribute as A;
    Ok(DeviceInfo {
        ordinal,
        name: result::device::get_name(dev).map_err(driver_err("cuDeviceGetName"))?,
        compute_capability: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        // SAFETY: as above.
        total_memory: unsafe { result::device::total_mem(dev) }
            .map_err(driver_err("cuDeviceTotalMem"))?,
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        shared_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        reserved_shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)?,
    })
}

/// How a CUDA device is set up. Built once (from the environment or flags) and passed down.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CudaOptions {
    /// Directory of the CUDA headers (`cuda_fp16.h`) for NVRTC.
    pub include_dir: Option<PathBuf>,
    /// Directory of the cubin cache; `None` compiles every run.
    pub cache_dir: Option<PathBuf>,
    /// Architecture to compile for; `None` asks the device (`sm_90a` on H100/H200).
    pub arch: Option<String>,
    /// Compile the kernels with block stamps ([`stamps`]): every block records when it ran, which
    /// [`CudaDevice::take_block_stamps`] reads. Each kernel runs a little slower; for timelines.
    pub block_stamps: bool,
}

impl CudaOptions {
    /// The defaults, reading the environment once: headers from `ONEPASS_CUDA_INCLUDE` or the
    /// toolkit, cubins cached under `kernels` in the cache root (`$ONEPASS_CACHE_DIR`, else the
    /// user's cache directory).
    pub fn from_env() -> Self {
        CudaOptions {
            include_dir: include_dir_from_env(),
            cache_dir: default_cache_dir(),
            arch: None,
            block_stamps: false,
        }
    }
}

/// One CUDA device: context, stream, kernels and scratch pool.
pub struct CudaDevice {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    registry: KernelRegistry,
    pool: Arc<ScratchPool>,
    error_record: CudaMemory,
    block_stamps: bool,
    fault: OnceLock<String>,
}

impl CudaDevice {
    /// Opens device `ordinal`: an error (never a panic) when there is no driver or no such device.
    pub fn new(ordinal: usize, options: &CudaOptions) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument(format!(
                "no CUDA device {ordinal} (found {count})"
            )));
        }
        let info = device_info(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver_err("creating the CUDA context"))?;
        let stream = ctx
            .new_stream()
            .map_err(driver_err("creating the CUDA stream"))?;
        let arch = options
            .arch
            .clone()
            .unwrap_or_else(|| arch_for(info.compute_capability));
        let mut compiler = KernelCompiler::new(
            &arch,
            options.include_dir.as_deref(),
            options.cache_dir.clone(),
        );
        let mut record_bytes = fault::RECORD_BYTES;
        if options.block_stamps {
            compiler = compiler.with_block_stamps();
            record_bytes += stamps::RING_BYTES;
        }
        let error_record = CudaMemory::alloc_zeroed(&ctx, record_bytes)?;
        let registry =
            KernelRegistry::new(ctx.clone(), compiler).with_error_record(error_record.device_ptr());
        let pool = ScratchPool::new(ctx.clone());
        Ok(CudaDevice {
            info,
            ctx,
            stream,
            registry,
            pool,
            error_record,
            block_stamps: options.block_stamps,
            fault: OnceLock::new(),
        })
    }

    /// What discovery reported about the device.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    /// A human-readable name (`cuda:0 (NVIDIA H100 80GB HBM3, sm_90a)`).
    pub fn name(&self) -> String {
        format!(
            "cuda:{} ({}, {})",
            self.info.ordinal,
            self.info.name,
            self.registry.compiler().arch()
        )
    }

    /// Compiles into the cubin cache, on up to `threads` threads, every kernel family it lacks
    /// ([`KernelCompiler::warm`]), so that the first pass loads them instead of compiling them
    /// one by one.
    pub fn warm_kernels(
        &self,
        threads: usize,
        progress: &(dyn Fn(usize, usize, &str) + Sync),
    ) -> Result<WarmReport> {
        self.registry.compiler().warm(SOURCES, threads, progress)
    }

    /// The kernel registry.
    pub fn registry(&self) -> &KernelRegistry {
        &self.registry
    }

    /// The scratch pool.
    pub fn pool(&self) -> &Arc<ScratchPool> {
        &self.pool
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The raw stream handle every launch and copy goes into.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// The fault that broke the device's context, if one did: after a kernel faulted (an illegal
    /// address, a trap, ...) every call on this device returns an error naming it.
    pub fn fault(&self) -> Option<&str> {
        self.fault.get().map(String::as_str)
    }

    /// An error when an earlier fault broke the context.
    fn ensure_usable(&self) -> Result<()> {
        match self.fault.get() {
            None => Ok(()),
            Some(first) => Err(Error::Faulted {
                device: self.name(),
                first: first.clone(),
            }),
        }
    }

    /// Converts a driver call's result, naming the call (`what`). A fault that breaks the
    /// context is remembered (later calls fail at once) and the error says so.
    pub(crate) fn driver<T>(&self, what: &str, r: Result<T, result::DriverError>) -> Result<T> {
        r.map_err(|e| self.driver_error(what, e))
    }

    /// The error for a failed driver call (see [`CudaDevice::driver`]).
    pub(crate) fn driver_error(&self, what: &str, e: result::DriverError) -> Error {
        if !is_sticky(&e) {
            return Error::driver(what, e);
        }
        let this = format!("{what}: {e}");
        let first = self.fault.get_or_init(|| this.clone());
        let earlier = if *first == this {
            String::new()
        } else {
            format!("; first fault: {first}")
        };
        Error::driver(
            format!(
                "{what} on {}: a kernel faulted, which leaves the CUDA context unusable (every \
                 later call on it fails{earlier}); restart the process",
                self.name()
            ),
            e,
        )
    }

    /// Makes the device's context current on this thread (an error once a fault broke it).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ensure_usable()?;
        self.driver("binding the CUDA context", self.ctx.bind_to_thread())
    }

    /// Waits until everything in the stream has run; reports asynchronous kernel faults, and the
    /// first bad argument a kernel detected since the last call (an [`Error::Kernel`] naming the
    /// kernel and the value; the error record is cleared).
    pub fn synchronize(&self) -> Result<()> {
        encoder::sync_stream(self)?;
        self.take_kernel_error()
    }

    /// Reads the error record (the stream is idle); a claimed record is cleared and returned.
    fn take_kernel_error(&self) -> Result<()> {
        let mut words = [0u32; fault::RECORD_WORDS];
        let record = self.error_record.device_ptr();
        // SAFETY: the record is a live allocation of `RECORD_BYTES` bytes in this (current, bound
        // by `sync_stream`) context, and the stream that kernels write it from is idle.
        let copied = unsafe { result::memcpy_dtoh_sync(&mut words, record) };
        self.driver("reading the kernel error record", copied)?;
        let Some(err) = fault::record_error(&words) else {
            return Ok(());
        };
        // SAFETY: as above.
        let cleared = unsafe { result::memset_d8_sync(record, 0, fault::RECORD_BYTES) };
        self.driver("clearing the kernel error record", cleared)?;
        Err(err)
    }

    /// The block stamps written since the last call (oldest first; at most
    /// [`stamps::STAMP_CAP`]), after waiting for the stream; the ring is emptied. An error on a
    /// device opened without [`CudaOptions::block_stamps`].
    pub fn take_block_stamps(&self) -> Result<Vec<stamps::BlockStamp>> {
        if !self.block_stamps {
            return Err(Error::InvalidArgument(
                "this CUDA device was opened without block stamps".into(),
            ));
        }
        self.synchronize()?;
        let mut words = vec![0u64; stamps::RING_BYTES / 8];
        let ring = self.error_record.device_ptr() + fault::RECORD_BYTES as u64;
        // SAFETY: the ring is the live tail of the error record allocation (`RING_BYTES` after
        // its `RECORD_BYTES`, allocated so in `new`), in this context, which `synchronize` bound;
        // the stream that kernels write it from is idle.
        let copied = unsafe { result::memcpy_dtoh_sync(&mut words, ring) };
        self.driver("reading the block stamps", copied)?;
        // SAFETY: as above; only the counter is cleared (the records are overwritten in order).
        let cleared = unsafe { result::memset_d8_sync(ring, 0, 8) };
        self.driver("clearing the block stamps", cleared)?;
        Ok(stamps::decode_ring(&words))
    }

    /// A fresh encoder with the default options.
    pub fn encoder(self: &Arc<Self>) -> CudaEncoder {
        self.encoder_with(EncoderOptions::default())
    }

    /// A fresh encoder with `options` (whether it waits after every launch, ...); encoders on one
    /// device do not share options.
    pub fn encoder_with(self: &Arc<Self>, options: EncoderOptions) -> CudaEncoder {
        CudaEncoder::new(self.clone(), options)
    }

    /// A zeroed plain allocation. Out of memory, the scratch pool's cached blocks are freed and
    /// the allocation tried once more; the error names the size.
    pub(crate) fn alloc_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        self.ensure_usable()?;
        let mem =
            CudaMemory::alloc_zeroed_reclaiming(&self.ctx, bytes, &|| self.pool.release_cached())?;
        Ok(Allocation::new(bytes, mem))
    }

    /// A scratch allocation from the pool; its contents are undefined.
    pub(crate) fn alloc_scratch_bytes(&self, bytes: usize) -> Result<Arc<Allocation>> {
        self.ensure_usable()?;
        let mem = self.pool.take(bytes)?;
        Ok(Allocation::new(bytes, mem))
    }

    fn address(&self, buf: &Buffer) -> Result<u64> {
        match cuda_memory(buf) {
            Some(m) if m.ordinal() == self.ordinal() => Ok(m.device_ptr() + buf.offset() as u64),
            _ => Err(Error::View(format!(
                "{buf:?} lives on {}, not {}",
                buf.allocation().location(),
                self.name()
            ))),
        }
    }

    /// Copies host bytes into a view, ordered after every launch before it; returns when done.
    pub(crate) fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()> {
        let dst = self.address(buf)?;
        if bytes.len() != buf.len_bytes() {
            return Err(Error::View(format!(
                "writing {} bytes into {buf:?}",
                bytes.len()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the destination view lies inside its live allocation and has `bytes.len()`
        // bytes; the copy is waited for before `bytes` can go away.
        let queued = unsafe { result::memcpy_htod_async(dst, bytes, self.cu_stream()) };
        self.driver("cuMemcpyHtoDAsync", queued)?;
        self.synchronize()
    }

    /// Copies a view into `out` (as long as the view), after every launch before it.
    pub(crate) fn read_into(&self, buf: &Buffer, out: &mut [u8]) -> Result<()> {
        let src = self.address(buf)?;
        if out.len() != buf.len_bytes() {
            return Err(Error::View(format!(
                "reading a view of {} bytes into {} bytes",
                buf.len_bytes(),
                out.len()
            )));
        }
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the source view lies inside its live allocation and has `out.len()` bytes; the
        // copy is waited for before `out` is handed back.
        let queued = unsafe { result::memcpy_dtoh_async(out, src, self.cu_stream()) };
        self.driver("cuMemcpyDtoHAsync", queued)?;
        self.synchronize()
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The CUDA memory behind a buffer, when it lives on a GPU.
pub(crate) fn cuda_memory(buf: &Buffer) -> Option<&CudaMemory> {
    buf.allocation()
        .memory()
        .as_any()
        .downcast_ref::<CudaMemory>()
}
