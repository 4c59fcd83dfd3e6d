//! Devices, memory and buffers. `cpu/` is the reference backend; a CUDA backend plugs in beside it.
//! Both implement [`Backend`] ([`interface`]); [`Device`] picks one in one place
//! ([`Device::backend`]), and everything above this module goes through that interface.

pub mod cpu;
pub mod cuda;
pub mod interface;
mod memory;

pub use crate::dtype::{DType, Element};
pub use crate::memory::{bytes_of, AllocId, Allocation, Buffer, DeviceMemory, Location, Shape};
pub(crate) use interface::{Backend, Encoder, LaunchMark, Replay, Submission};
pub use interface::{
    Capabilities, EncoderOptions, F16Products, KernelTime, ReplayOrdering, StepClock, WarmReport,
};
pub use memory::{
    available_host_memory, parse_mem_available, HostMemory, MappedMemory, HOST_ALIGN,
};

use std::sync::Arc;

use crate::error::{Error, Result};

/// Which kind of backend a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU reference backend.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// A compute device. Cheap to clone; every clone is the same device.
#[derive(Clone)]
pub enum Device {
    /// The CPU reference backend.
    Cpu(Arc<cpu::CpuDevice>),
    /// An NVIDIA GPU.
    Cuda(Arc<cuda::CudaDevice>),
}

impl Device {
    /// A CPU device whose thread pool has `threads` workers (0: one per core).
    pub fn cpu(threads: usize) -> Result<Device> {
        Ok(Device::Cpu(Arc::new(cpu::CpuDevice::new(threads)?)))
    }

    /// A CPU device that records and optimizes passes as a device of `kind` would (its
    /// declared fusion rules and kernel forms), for inspecting graphs where that hardware is
    /// absent; see [`cpu::CpuDevice::standing_in_for`].
    pub fn cpu_standing_in_for(kind: BackendKind, threads: usize) -> Result<Device> {
        Ok(Device::Cpu(Arc::new(
            cpu::CpuDevice::new(threads)?.standing_in_for(kind),
        )))
    }

    /// CUDA device `ordinal` with options from the environment ([`cuda::CudaOptions::from_env`]);
    /// an error (never a panic) when there is no driver or no such device.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Device::cuda_with(ordinal, &cuda::CudaOptions::from_env())
    }

    /// CUDA device `ordinal` with explicit options.
    pub fn cuda_with(ordinal: usize, options: &cuda::CudaOptions) -> Result<Device> {
        Ok(Device::Cuda(Arc::new(cuda::CudaDevice::new(
            ordinal, options,
        )?)))
    }

    /// CUDA device 0 when a driver and a device are present, else the CPU with `threads` threads.
    pub fn auto(threads: usize) -> Result<Device> {
        if cuda::driver_present() && cuda::device_count().unwrap_or(0) > 0 {
            if let Ok(d) = Device::cuda(0) {
                return Ok(d);
            }
        }
        Device::cpu(threads)
    }

    /// The device's backend: the one place that tells the backends apart. Everything else in the
    /// crate reads a device through this interface. Crate-internal, as the interface is: its
    /// `instantiate` trusts the caller's levels (the executable derives them from the conflict
    /// rule), and a wrong level would let two CPU kernels write the same bytes at once.
    pub(crate) fn backend(&self) -> &dyn Backend {
        match self {
            Device::Cpu(d) => d,
            Device::Cuda(d) => d,
        }
    }

    /// Compiles ahead, on up to `threads` threads, the kernels this device would compile at
    /// their first use (CUDA: the kernel families its cubin cache lacks; the CPU: none), calling
    /// `progress(done, total, family)`, first `(0, total, "")` when there is anything to compile.
    /// A compile error is returned as the first use would have returned it.
    pub fn warm_kernels(
        &self,
        threads: usize,
        progress: &(dyn Fn(usize, usize, &str) + Sync),
    ) -> Result<WarmReport> {
        self.backend().warm_kernels(threads, progress)
    }

    /// What the device's backend declares about itself.
    pub fn capabilities(&self) -> &'static Capabilities {
        self.backend().capabilities()
    }

    /// Bytes that new allocations on this device may still take, where the backend can tell
    /// before allocating: on a backend whose allocations come out of host memory
    /// ([`Capabilities::host_memory`]), what this process may still take
    /// ([`available_host_memory`]); `None` elsewhere (a failed allocation is the check there).
    pub fn allocatable_bytes(&self) -> Option<u64> {
        if self.capabilities().host_memory {
            available_host_memory()
        } else {
            None
        }
    }

    /// The backend kind.
    pub fn kind(&self) -> BackendKind {
        self.backend().kind()
    }

    /// A human-readable name.
    pub fn name(&self) -> String {
        self.backend().name()
    }

    /// Allocates a zeroed buffer.
    pub fn alloc(&self, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let shape = Shape::new(dims)?;
        let bytes = bytes_of(dtype, shape)?;
        let alloc = self.backend().alloc_bytes(bytes)?;
        Buffer::whole(alloc, dtype, shape)
    }

    /// Allocates a scratch buffer whose contents are undefined (zeroed on the CPU). On CUDA it
    /// comes from the device's caching pool, so steady-state passes make no driver allocation.
    pub fn alloc_scratch(&self, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let shape = Shape::new(dims)?;
        let bytes = bytes_of(dtype, shape)?;
        let alloc = self.backend().alloc_scratch_bytes(bytes)?;
        Buffer::whole(alloc, dtype, shape)
    }

    /// Allocates a buffer and copies `data` into it.
    pub fn upload<T: Element>(&self, data: &[T], dims: &[usize]) -> Result<Buffer> {
        let buf = self.alloc(T::DTYPE, dims)?;
        self.write(&buf, data)?;
        Ok(buf)
    }

    /// Allocates a buffer of any dtype (block formats included) from raw bytes.
    pub fn upload_bytes(&self, bytes: &[u8], dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let buf = self.alloc(dtype, dims)?;
        self.write_bytes(&buf, bytes)?;
        Ok(buf)
    }

    /// Copies `data` into `buf`; its byte length must equal the view's.
    pub fn write<T: Element>(&self, buf: &Buffer, data: &[T]) -> Result<()> {
        if buf.dtype() != T::DTYPE {
            return Err(Error::View(format!(
                "writing {} values into a {} buffer",
                T::DTYPE,
                buf.dtype()
            )));
        }
        self.write_bytes(buf, bytemuck::cast_slice(data))
    }

    /// Copies raw bytes into `buf`; the length must equal the view's.
    pub fn write_bytes(&self, buf: &Buffer, bytes: &[u8]) -> Result<()> {
        if bytes.len() != buf.len_bytes() {
            return Err(Error::View(format!(
                "writing {} bytes into a view of {} bytes",
                bytes.len(),
                buf.len_bytes()
            )));
        }
        self.backend().write_bytes(buf, bytes)
    }

    /// Copies a buffer's contents to the host.
    pub fn download<T: Element>(&self, buf: &Buffer) -> Result<Vec<T>> {
        read_values(buf, |b| self.download_bytes(b))
    }

    /// Copies a buffer's raw bytes to the host.
    pub fn download_bytes(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let mut out = vec![0u8; buf.len_bytes()];
        self.backend().read_into(buf, &mut out)?;
        Ok(out)
    }

    /// Copies a buffer's contents into `out`, resized to the buffer's length: a loop that reads
    /// the same buffer each step (a decode step's logits) reuses one allocation rather than
    /// making two a step. `T` must be the buffer's element type.
    pub fn download_into<T: Element>(&self, buf: &Buffer, out: &mut Vec<T>) -> Result<()> {
        if buf.dtype() != T::DTYPE {
            return Err(Error::View(format!(
                "reading {} values from a {} buffer",
                T::DTYPE,
                buf.dtype()
            )));
        }
        out.resize(buf.elems(), T::zeroed());
        self.backend()
            .read_into(buf, bytemuck::cast_slice_mut::<T, u8>(out))
    }

    /// Whether a buffer lives on this device.
    pub fn owns(&self, buf: &Buffer) -> bool {
        buf.allocation().home() == self.backend().home()
    }
}

/// A typed read: `T` must be the buffer's element type; `read` gives the buffer's bytes.
pub(crate) fn read_values<T: Element>(
    buf: &Buffer,
    read: impl FnOnce(&Buffer) -> Result<Vec<u8>>,
) -> Result<Vec<T>> {
    if buf.dtype() != T::DTYPE {
        return Err(Error::View(format!(
            "reading {} values from a {} buffer",
            T::DTYPE,
            buf.dtype()
        )));
    }
    let bytes = read(buf)?;
    let mut out = vec![T::zeroed(); buf.elems()];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
    Ok(out)
}

/// What the backend of `kind` declares about itself, known without a device of that kind.
pub fn capabilities_of(kind: BackendKind) -> &'static Capabilities {
    match kind {
        BackendKind::Cpu => &cpu::CAPABILITIES,
        BackendKind::Cuda => &cuda::CAPABILITIES,
    }
}

/// What the backend that owns memory at `location` declares about itself: for op builders, which
/// see buffers, not devices. The one place that tells backends apart by location.
pub fn capabilities_at(location: Location) -> &'static Capabilities {
    match location {
        Location::Host => &cpu::CAPABILITIES,
        Location::Cuda(_) => &cuda::CAPABILITIES,
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}
