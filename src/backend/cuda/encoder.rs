//! Launching dispatches into the device's stream, with the parameter layout of
//! [`launch`](super::launch). Barriers need no command: launches on one stream run in order. With `sync_each_launch` the encoder waits for
//! the stream after every launch (the "one submission per op" pattern, for comparison).

use std::sync::Arc;

use cudarc::driver::result;

use super::launch::LaunchParams;
use super::CudaDevice;
use crate::error::{Error, Result};
use crate::graph::DispatchRef;

/// Encodes dispatches into a CUDA device's stream.
pub struct CudaEncoder {
    device: Arc<CudaDevice>,
    sync_each_launch: bool,
    launches: usize,
    params: LaunchParams,
}

impl CudaEncoder {
    pub(crate) fn new(device: Arc<CudaDevice>) -> Self {
        let sync_each_launch = device.sync_each_launch();
        CudaEncoder {
            device,
            sync_each_launch,
            launches: 0,
            params: LaunchParams::default(),
        }
    }

    /// Launches one dispatch (asynchronously, unless the device synchronizes every launch).
    pub fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()> {
        let name = dispatch.kernel().name();
        // First, so that a device broken by an earlier fault fails here, naming the fault.
        self.device.bind()?;
        let kernel = self.params.prepare(&self.device, dispatch)?;
        let grid = dispatch.grid();
        // SAFETY: the function handle is valid while `kernel` lives (it holds its module); the
        // parameters were laid out by `prepare` under the contract of `launch` (each slot holds a
        // value of the type the function takes there); the driver copies the parameter values
        // during this call. Buffer addresses are inside allocations kept alive by the dispatch (and
        // by the session until it has waited).
        unsafe {
            result::launch_kernel(
                kernel.cu_function(),
                (grid.blocks[0], grid.blocks[1], grid.blocks[2]),
                (grid.threads[0], grid.threads[1], grid.threads[2]),
                grid.shared_bytes,
                self.device.cu_stream(),
                self.params.pointers(),
            )
        }
        .map_err(|e| {
            self.device
                .driver_error(&format!("cuLaunchKernel of `{name}` {grid:?}"), e)
        })?;
        self.launches += 1;
        if self.sync_each_launch {
            self.device.synchronize().map_err(|e| Error::Kernel {
                kernel: name,
                msg: format!("while running: {}", e.with_causes()),
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
