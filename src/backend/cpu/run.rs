//! Running CPU kernels safely: the one place a kernel is called (its arguments checked, a panic
//! turned into an error), and the device's memory lock, which keeps host copies off memory that
//! kernels may be using.
//!
//! The lock: the submission worker holds it while it runs a submission, a CPU executable while it
//! runs a replay, and [`CpuDevice`](super::CpuDevice)'s host reads and writes while they copy. So a
//! host copy never overlaps a kernel, whatever the caller does: download before a session
//! finished, drop a session with a submission in flight, touch the device from another thread.
//! A kernel itself may not touch the device's memory through the host API (it would wait for the
//! lock its own submission holds): such a call is an error, found through a per-thread count of
//! the kernels running on the thread.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

use super::{CpuKernelFn, KernelArgs};
use crate::error::{Error, Result};
use crate::graph::{Arg, KernelId};

thread_local! {
    /// How many kernels are running on this thread (a kernel that uses the pool may run another
    /// dispatch's kernel on its thread while it waits).
    static KERNELS_RUNNING: Cell<u32> = const { Cell::new(0) };
}

/// Counts a running kernel on this thread for as long as it lives.
struct Running;

impl Running {
    fn start() -> Running {
        KERNELS_RUNNING.with(|n| n.set(n.get() + 1));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        KERNELS_RUNNING.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// Runs `kernel` over `args`: checks the arguments (no written argument aliases another), counts
/// the kernel as running on this thread, and turns a panic into an error naming it.
pub(crate) fn call_kernel(kernel: CpuKernelFn, id: KernelId, args: &[Arg]) -> Result<()> {
    let args = KernelArgs::new(id, args)?;
    let _running = Running::start();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel(&args))) {
        Ok(r) => r,
        Err(_) => Err(Error::Kernel {
            kernel: id.name(),
            msg: "the kernel panicked (a bug in onepass: please report it)".into(),
        }),
    }
}

/// The device's memory lock (see the module documentation).
#[derive(Default)]
pub(crate) struct MemoryLock(Mutex<()>);

impl MemoryLock {
    /// Holds the lock until the guard is dropped; an error on a thread that is running a kernel.
    pub(crate) fn hold(&self) -> Result<MutexGuard<'_, ()>> {
        if KERNELS_RUNNING.with(Cell::get) > 0 {
            return Err(Error::Backend(
                "a CPU kernel may not read or write device buffers through the host API; \
                 declare what it touches as its arguments"
                    .into(),
            ));
        }
        // A poisoned lock guards no data: the memory it orders is checked elsewhere.
        Ok(self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
