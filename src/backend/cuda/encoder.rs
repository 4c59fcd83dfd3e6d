//! Launching dispatches into the device's stream, through [`launch`](super::launch). Barriers need
//! no command: launches on one stream run in order. With
//! [`EncoderOptions::sync_each_dispatch`] the encoder waits for the stream after every launch
//! (the "one submission per op" pattern, for comparison); that is the encoder's option, chosen by
//! whoever opens it, so other encoders on the same device are unaffected.

use std::sync::Arc;

use cudarc::driver::result;

use super::launch::LaunchParams;
use super::CudaDevice;
use crate::backend::interface::{Encoder, EncoderOptions, Submission};
use crate::error::{Error, Result};
use crate::graph::DispatchRef;

/// Encodes dispatches into a CUDA device's stream.
pub struct CudaEncoder {
    device: Arc<CudaDevice>,
    options: EncoderOptions,
    launches: usize,
    /// Launches since the last submission.
    pending: usize,
    params: LaunchParams,
}

impl CudaEncoder {
    pub(crate) fn new(device: Arc<CudaDevice>, options: EncoderOptions) -> Self {
        CudaEncoder {
            device,
            options,
            launches: 0,
            pending: 0,
            params: LaunchParams::default(),
        }
    }

    /// Launches one dispatch (asynchronously, unless the encoder waits after every launch).
    pub fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()> {
        let name = dispatch.kernel().name();
        // First, so that a device broken by an earlier fault fails here, naming the fault.
        self.device.bind()?;
        self.params.launch(&self.device, dispatch)?;
        self.launches += 1;
        self.pending += 1;
        if self.options.sync_each_dispatch {
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

impl Encoder for CudaEncoder {
    fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()> {
        CudaEncoder::encode(self, dispatch)
    }

    fn barrier(&mut self) {}

    fn encoded(&self) -> usize {
        self.pending
    }

    /// The launches are already in the stream: the submission only waits for it.
    fn submit(&mut self) -> Result<Box<dyn Submission>> {
        self.pending = 0;
        Ok(Box::new(StreamWork(self.device.clone())))
    }
}

/// Work launched into a device's stream; waiting synchronizes the stream.
struct StreamWork(Arc<CudaDevice>);

impl Submission for StreamWork {
    fn wait(self: Box<Self>) -> Result<()> {
        self.0.synchronize()
    }
}

/// Waits for a stream, with context in the error.
pub(crate) fn sync_stream(device: &CudaDevice) -> Result<()> {
    device.bind()?;
    // SAFETY: the stream handle belongs to the device's live stream object.
    let waited = unsafe { result::stream::synchronize(device.cu_stream()) };
    device.driver("waiting for the CUDA stream (cuStreamSynchronize)", waited)
}
