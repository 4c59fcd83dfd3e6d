//! Marked launches: an event recorded on the device's stream after a graph launch, and a stream
//! of the replay's own on which a small buffer is copied to the host once the event has passed,
//! while the launches queued after the mark keep the device's stream busy (a greedy decode reads
//! each step's token while the next step runs).

use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::{fault, CudaDevice};
use crate::backend::interface::LaunchMark;
use crate::backend::Buffer;
use crate::error::{Error, Result};

/// Bytes of pinned host memory a side stream copies into: the kernel error record, then the
/// buffer read (larger buffers are refused: a mark reads a step's few words, not its outputs).
const STAGE_BYTES: usize = 4096;

/// A non-blocking stream, the pinned memory its copies land in, and the events of dropped marks,
/// kept for the next marks (a greedy decode marks every step).
pub(crate) struct SideStream {
    device: Arc<CudaDevice>,
    stream: sys::CUstream,
    stage: Mutex<*mut u8>,
    spare: Mutex<Vec<sys::CUevent>>,
}

// SAFETY: the stream and the pinned allocation are owned by this value alone, and every driver
// call binds the device's context first.
unsafe impl Send for SideStream {}
// SAFETY: the state shared between threads is the stage and the spare events, each used under its
// mutex; the stream handle is only passed to the driver, which allows that from any thread.
unsafe impl Sync for SideStream {}

fn check(device: &CudaDevice, what: &str, r: sys::CUresult) -> Result<()> {
    device.driver(what, r.result())
}

impl SideStream {
    /// A stream that does not wait for the device's stream, and its pinned stage.
    pub fn new(device: &Arc<CudaDevice>) -> Result<Arc<Self>> {
        device.bind()?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: `stream` is valid for writes; the context is bound.
        check(device, "cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut stream, flags)
        })?;
        let mut stage: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `stage` is valid for writes; the context is bound.
        let pinned = check(device, "cuMemAllocHost", unsafe {
            sys::cuMemAllocHost_v2(&mut stage, STAGE_BYTES)
        });
        let this = SideStream {
            device: device.clone(),
            stream,
            stage: Mutex::new(stage.cast()),
            spare: Mutex::new(Vec::new()),
        };
        pinned?;
        Ok(Arc::new(this))
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        // SAFETY: both were created by this value and are released once; a copy still queued on
        // the stream completes before the driver releases it.
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
            if let Ok(stage) = self.stage.lock() {
                if !stage.is_null() {
                    let _ = sys::cuMemFreeHost(stage.cast());
                }
            }
            if let Ok(spare) = self.spare.lock() {
                for &event in spare.iter() {
                    let _ = sys::cuEventDestroy_v2(event);
                }
            }
        }
    }
}

/// An event recorded on the device's stream after one launch.
pub(crate) struct CudaMark {
    side: Arc<SideStream>,
    event: sys::CUevent,
}

// SAFETY: the event is this value's alone until it goes back to the side stream's spares, and it
// is only used with the context bound.
unsafe impl Send for CudaMark {}

impl CudaMark {
    /// Records a mark after everything queued on the device's stream so far.
    pub fn record(side: &Arc<SideStream>) -> Result<Self> {
        let device = &side.device;
        device.bind()?;
        let reused = side.spare.lock().ok().and_then(|mut spare| spare.pop());
        let event = match reused {
            Some(event) => event,
            None => {
                let mut event: sys::CUevent = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: `event` is valid for writes; the context is bound.
                check(device, "cuEventCreate", unsafe {
                    sys::cuEventCreate(&mut event, flags)
                })?;
                event
            }
        };
        let mark = CudaMark {
            side: side.clone(),
            event,
        };
        // SAFETY: a live event and stream of the bound context.
        check(device, "cuEventRecord", unsafe {
            sys::cuEventRecord(event, device.cu_stream())
        })?;
        Ok(mark)
    }
}

impl LaunchMark for CudaMark {
    /// On the side stream: waits for the event, copies the kernel error record and `buf` into
    /// the pinned stage, and waits for the copies. A claimed error record is then reported
    /// through the device's own wait (which clears it), as every other read does.
    fn read(&self, buf: &Buffer) -> Result<Vec<u8>> {
        let device = &self.side.device;
        let src = device.address(buf)?;
        let len = buf.len_bytes();
        if len > STAGE_BYTES - fault::RECORD_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a launch mark reads at most {} bytes; {buf:?} has {len}",
                STAGE_BYTES - fault::RECORD_BYTES
            )));
        }
        device.bind()?;
        let stage = self
            .side
            .stage
            .lock()
            .map_err(|_| Error::Backend("the launch mark's stage lock is poisoned".into()))?;
        let stream = self.side.stream;
        let record = device.error_record.device_ptr();
        // SAFETY: the stage is pinned memory of STAGE_BYTES bytes held under its lock until the
        // stream has finished both copies; the sources are live device memory of the bound
        // context (the view lies inside its allocation, the record has RECORD_BYTES bytes).
        unsafe {
            check(
                device,
                "cuStreamWaitEvent",
                sys::cuStreamWaitEvent(stream, self.event, 0),
            )?;
            check(
                device,
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2((*stage).cast(), record, fault::RECORD_BYTES, stream),
            )?;
            if len > 0 {
                check(
                    device,
                    "cuMemcpyDtoHAsync",
                    sys::cuMemcpyDtoHAsync_v2(
                        (*stage).add(fault::RECORD_BYTES).cast(),
                        src,
                        len,
                        stream,
                    ),
                )?;
            }
            check(
                device,
                "cuStreamSynchronize",
                sys::cuStreamSynchronize(stream),
            )?;
        }
        let mut words = [0u32; fault::RECORD_WORDS];
        // SAFETY: the copies have completed; the stage holds RECORD_BYTES + len bytes.
        let bytes = unsafe {
            for (i, w) in words.iter_mut().enumerate() {
                *w = std::ptr::read_unaligned((*stage).add(4 * i).cast::<u32>());
            }
            std::slice::from_raw_parts((*stage).add(fault::RECORD_BYTES), len).to_vec()
        };
        drop(stage);
        if fault::record_error(&words).is_some() {
            // The device's wait takes the record (and clears it) and returns its error.
            device.synchronize()?;
            return Err(Error::Backend(
                "a kernel reported an error that the device's wait did not return".into(),
            ));
        }
        Ok(bytes)
    }
}

impl Drop for CudaMark {
    /// The event goes back to the side stream for the next mark (recording it again replaces
    /// this record; a wait on it already queued still waits for this one).
    fn drop(&mut self) {
        if let Ok(mut spare) = self.side.spare.lock() {
            spare.push(self.event);
            return;
        }
        if self.side.device.bind().is_ok() {
            // SAFETY: the event is this mark's alone (it could not go back) and is destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
        }
    }
}
