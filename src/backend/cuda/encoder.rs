//! Launching dispatches into the device's stream.
//!
//! A dispatch's arguments become kernel parameters in order: a buffer becomes the device address
//! of its first byte (allocation base + view offset), a scalar its 32-bit value. After them come
//! the element counts of the buffer arguments, in order, as `uint64_t` (a CUDA kernel sees only
//! pointers; the counts let it check bounds and tell a broadcast operand from a full one, as the
//! CPU kernel does with slice lengths). So a CPU kernel `(x, out, eps: f32, dim: u32)` is the CUDA
//! kernel `(const T* x, T* out, float eps, uint32_t dim, uint64_t n_x, uint64_t n_out)`.
//! Barriers need no
//! command: launches on one stream run in order. With `sync_each_launch` the encoder waits for
//! the stream after every launch (the "one submission per op" pattern, for comparison).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;

use super::CudaDevice;
use crate::backend::{Buffer, Memory};
use crate::error::{Error, Result};
use crate::graph::{Arg, DispatchRef, Scalar};

/// Encodes dispatches into a CUDA device's stream.
pub struct CudaEncoder {
    device: Arc<CudaDevice>,
    sync_each_launch: bool,
    launches: usize,
    slots: Vec<u64>,
    params: Vec<*mut c_void>,
}

// SAFETY: `params` only ever points into `slots` of the same encoder, and is rebuilt before each
// launch; nothing in it outlives a call to `encode`.
unsafe impl Send for CudaEncoder {}

/// The device address of a buffer view on `device`, or an error naming the kernel and argument.
pub(crate) fn device_address(
    device: &CudaDevice,
    kernel: &'static str,
    index: usize,
    buf: &Buffer,
) -> Result<u64> {
    match &buf.allocation().memory {
        Memory::Cuda(mem) if mem.ordinal() == device.ordinal() => {
            Ok(mem.device_ptr() + buf.offset() as u64)
        }
        other => Err(Error::Kernel {
            kernel,
            msg: format!(
                "argument {index} lives on {}, not cuda:{}",
                other.location(),
                device.ordinal()
            ),
        }),
    }
}

impl CudaEncoder {
    pub(crate) fn new(device: Arc<CudaDevice>) -> Self {
        let sync_each_launch = device.sync_each_launch();
        CudaEncoder {
            device,
            sync_each_launch,
            launches: 0,
            slots: Vec::new(),
            params: Vec::new(),
        }
    }

    /// Launches one dispatch (asynchronously, unless the device synchronizes every launch).
    pub fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()> {
        let name = dispatch.kernel().0;
        // First, so that a device broken by an earlier fault fails here, naming the fault.
        self.device.bind()?;
        let kernel = self.device.registry().get(dispatch.kernel())?;
        let grid = dispatch.grid();
        if grid.blocks.contains(&0) || grid.threads.contains(&0) {
            return Err(Error::Kernel {
                kernel: name,
                msg: format!("empty launch geometry {grid:?}"),
            });
        }
        kernel.ensure_dynamic_shared(grid.shared_bytes)?;
        self.slots.clear();
        for (i, arg) in dispatch.args().iter().enumerate() {
            let v = match arg {
                Arg::Buffer(buf, _) => device_address(&self.device, name, i, buf)?,
                Arg::Scalar(Scalar::U32(v)) => *v as u64,
                Arg::Scalar(Scalar::I32(v)) => *v as u32 as u64,
                Arg::Scalar(Scalar::F32(v)) => v.to_bits() as u64,
            };
            self.slots.push(v);
        }
        for arg in dispatch.args() {
            if let Arg::Buffer(buf, _) = arg {
                self.slots.push(buf.elems() as u64);
            }
        }
        // A 32-bit scalar is read from the low 4 bytes of its 8-byte slot (little-endian host).
        self.params.clear();
        let base = self.slots.as_mut_ptr();
        for i in 0..self.slots.len() {
            // SAFETY: `i` is in bounds of `slots`, which is not resized until the launch is done.
            self.params.push(unsafe { base.add(i) } as *mut c_void);
        }
        // SAFETY: the function handle is valid while `kernel` lives (it holds its module); each
        // parameter points to a live 8-byte slot holding a value of the type the kernel declares
        // for that position (same order and types as the CPU kernel's arguments, checked by the op
        // builders); the driver copies the parameter values during this call. Buffer addresses are
        // inside allocations kept alive by the dispatch (and by the session until it has waited).
        unsafe {
            result::launch_kernel(
                kernel.cu_function(),
                (grid.blocks[0], grid.blocks[1], grid.blocks[2]),
                (grid.threads[0], grid.threads[1], grid.threads[2]),
                grid.shared_bytes,
                self.device.cu_stream(),
                &mut self.params,
            )
        }
        .map_err(|e| Error::Kernel {
            kernel: name,
            msg: format!(
                "launch {grid:?} failed: {}",
                self.device.driver_error("cuLaunchKernel", e)
            ),
        })?;
        self.launches += 1;
        if self.sync_each_launch {
            self.device.synchronize().map_err(|e| Error::Kernel {
                kernel: name,
                msg: format!("while running: {e}"),
            })?;
        }
        Ok(())
    }

    /// A barrier: nothing to do, launches on one stream run in order.
    pub fn barrier(&mut self) {}

    /// Launches made so far.
    pub fn launch_count(&self) -> usize {
        self.launches
    }

    /// Waits for everything launched so far.
    pub fn finish(self) -> Result<()> {
        self.device.synchronize()
    }
}

/// Waits for a stream, with context in the error.
pub(crate) fn sync_stream(device: &CudaDevice) -> Result<()> {
    device.bind()?;
    // SAFETY: the stream handle belongs to the device's live stream object.
    let waited = unsafe { result::stream::synchronize(device.cu_stream()) };
    device.driver("waiting for the CUDA stream (cuStreamSynchronize)", waited)
}
