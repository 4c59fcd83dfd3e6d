//! The CPU backend's submission worker and encoder.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::run::MemoryLock;
use super::{CpuDevice, CpuKernelFn};
use crate::backend::interface::{Encoder, EncoderOptions, Submission};
use crate::error::{Error, Result};
use crate::graph::{Access, Arg, Dispatch, DispatchRef, Range, RangeSet};

/// One encoded dispatch: the resolved kernel and the dispatch it runs.
struct Encoded {
    kernel: CpuKernelFn,
    dispatch: Dispatch,
}

/// Groups of dispatches; the dispatches of one group may run at the same time.
type Groups = Vec<Vec<Encoded>>;

struct Job {
    groups: Groups,
    done: Arc<Completion>,
}

#[derive(Default)]
struct Completion {
    state: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

/// The thread that runs submissions in order.
pub(crate) struct Worker {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Worker {
    /// Starts the worker; it holds `memory` while it runs each submission.
    pub(crate) fn start(pool: Arc<rayon::ThreadPool>, memory: Arc<MemoryLock>) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let handle = std::thread::Builder::new()
            .name("onepass-cpu-submit".into())
            .spawn(move || {
                for job in rx {
                    let result = match memory.hold() {
                        Ok(_held) => pool.install(|| run_groups(&job.groups)),
                        Err(e) => Err(e),
                    };
                    drop(job.groups);
                    let mut state = job.done.state.lock().unwrap_or_else(|e| e.into_inner());
                    *state = Some(result);
                    job.done.cv.notify_all();
                }
            })
            .map_err(|e| Error::Backend(format!("cannot start the CPU submit thread: {e}")))?;
        Ok(Worker {
            tx: Mutex::new(Some(tx)),
            handle: Mutex::new(Some(handle)),
        })
    }

    fn send(&self, job: Job) -> Result<()> {
        let tx = self
            .tx
            .lock()
            .map_err(|_| Error::Backend("worker lock poisoned".into()))?;
        tx.as_ref()
            .ok_or_else(|| Error::Backend("CPU worker stopped".into()))?
            .send(job)
            .map_err(|_| Error::Backend("CPU worker stopped".into()))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut h) = self.handle.lock() {
            if let Some(h) = h.take() {
                // A worker that panicked has nothing left to report here.
                let _ = h.join();
            }
        }
    }
}

fn run_one(e: &Encoded) -> Result<()> {
    super::run::call_kernel(e.kernel, e.dispatch.kernel(), e.dispatch.args())
}

fn run_groups(groups: &Groups) -> Result<()> {
    for group in groups {
        if group.len() == 1 {
            run_one(&group[0])?;
            continue;
        }
        // The dispatches of one group have no conflicting ranges (`CpuEncoder::encode` closes
        // the group before every dispatch that conflicts with it), so they may run on several
        // threads at once.
        let results: Vec<Result<()>> = {
            let mut slots: Vec<Option<Result<()>>> = (0..group.len()).map(|_| None).collect();
            rayon::scope(|s| {
                for (slot, e) in slots.iter_mut().zip(group) {
                    s.spawn(move |_| *slot = Some(run_one(e)));
                }
            });
            slots.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
        };
        results.into_iter().collect::<Result<()>>()?;
    }
    Ok(())
}

/// Encodes dispatches into groups for submission.
///
/// The dispatches of one group run on several threads at once, so the encoder itself keeps every
/// group free of conflicts: it closes the current group before a dispatch that conflicts with it
/// (a write overlapping any access of the group, or a read overlapping one of its writes),
/// whatever barriers its caller placed. With [`EncoderOptions::sync_each_dispatch`] every
/// dispatch is submitted alone and waited for before `encode` returns.
pub struct CpuEncoder {
    device: Arc<CpuDevice>,
    options: EncoderOptions,
    groups: Groups,
    /// The byte ranges the current group reads and writes.
    group: RangeSet,
    dispatches: usize,
}

impl CpuEncoder {
    pub(crate) fn new(device: Arc<CpuDevice>, options: EncoderOptions) -> Self {
        CpuEncoder {
            device,
            options,
            groups: vec![Vec::new()],
            group: RangeSet::new(),
            dispatches: 0,
        }
    }

    /// Adds a dispatch to the current group, after closing the group when the dispatch conflicts
    /// with it (so no two dispatches of a group conflict, whether or not the caller placed the
    /// barrier).
    pub(crate) fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()> {
        let kernel = self.device.kernel(dispatch.kernel())?;
        // The ranges come from the arguments themselves: what the kernel will be handed.
        let ranges = |want: fn(Access) -> bool| {
            dispatch.args().iter().filter_map(move |a| match a {
                Arg::Buffer(b, access) if want(*access) => Some(Range::of(b)),
                _ => None,
            })
        };
        if self
            .group
            .conflicts(ranges(Access::reads), ranges(Access::writes))
        {
            self.barrier();
        }
        self.group
            .add(ranges(Access::reads), ranges(Access::writes));
        let group = self
            .groups
            .last_mut()
            .expect("an encoder always has a current group");
        group.push(Encoded {
            kernel,
            dispatch: dispatch.to_dispatch(),
        });
        self.dispatches += 1;
        if self.options.sync_each_dispatch {
            self.submit()?.wait()?;
        }
        Ok(())
    }

    /// Closes the current group.
    pub fn barrier(&mut self) {
        if self.groups.last().is_some_and(|g| !g.is_empty()) {
            self.groups.push(Vec::new());
        }
        self.group.clear();
    }

    /// Dispatches encoded since the last submission.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Hands the work encoded since the last submission to the worker and returns at once; the
    /// encoder starts over, empty.
    pub fn submit(&mut self) -> Result<CpuSubmission> {
        let mut groups = std::mem::replace(&mut self.groups, vec![Vec::new()]);
        groups.retain(|g| !g.is_empty());
        self.group.clear();
        self.dispatches = 0;
        let done = Arc::new(Completion::default());
        self.device.worker().send(Job {
            groups,
            done: done.clone(),
        })?;
        Ok(CpuSubmission { done })
    }
}

impl Encoder for CpuEncoder {
    fn encode(&mut self, dispatch: DispatchRef<'_>) -> Result<()> {
        CpuEncoder::encode(self, dispatch)
    }

    fn barrier(&mut self) {
        CpuEncoder::barrier(self);
    }

    fn encoded(&self) -> usize {
        self.dispatch_count()
    }

    fn submit(&mut self) -> Result<Box<dyn Submission>> {
        Ok(Box::new(CpuEncoder::submit(self)?))
    }
}

/// Work handed to the CPU worker.
pub struct CpuSubmission {
    done: Arc<Completion>,
}

impl CpuSubmission {
    /// Blocks until the work has run; returns the first kernel error, if any.
    pub fn wait(self) -> Result<()> {
        let mut state = self
            .done
            .state
            .lock()
            .map_err(|_| Error::Backend("lock poisoned".into()))?;
        loop {
            if let Some(result) = state.take() {
                return result;
            }
            state = self
                .done
                .cv
                .wait(state)
                .map_err(|_| Error::Backend("lock poisoned".into()))?;
        }
    }
}

impl Submission for CpuSubmission {
    fn wait(self: Box<Self>) -> Result<()> {
        CpuSubmission::wait(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DType, Device, EncoderOptions};
    use crate::graph::Dispatch;

    fn cpu() -> (Device, Arc<CpuDevice>) {
        let dev = Device::cpu(2).unwrap();
        let Device::Cpu(cpu) = &dev else {
            unreachable!("Device::cpu makes a CPU device")
        };
        let cpu = cpu.clone();
        (dev, cpu)
    }

    fn group_sizes(enc: &CpuEncoder) -> Vec<usize> {
        enc.groups.iter().map(Vec::len).filter(|&n| n > 0).collect()
    }

    #[test]
    fn a_conflicting_dispatch_opens_a_group_without_a_barrier() {
        let (dev, cpu) = cpu();
        let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        let y = dev.alloc(DType::F32, &[4]).unwrap();
        let z = dev.alloc(DType::F32, &[4]).unwrap();
        let w = dev.alloc(DType::F32, &[4]).unwrap();
        // y = x + x; z = x + x (independent); w = y + z reads both writes: a new group.
        let first = crate::ops::elementwise::add(&x, &x, &y).unwrap();
        let second = crate::ops::elementwise::add(&x, &x, &z).unwrap();
        let third = crate::ops::elementwise::add(&y, &z, &w).unwrap();
        let mut enc = cpu.encoder();
        for d in [&first, &second, &third] {
            enc.encode(d.as_view()).unwrap();
        }
        assert_eq!(group_sizes(&enc), [2, 1]);
        // Writing what the group reads (write after read) also opens a group.
        let fourth: Dispatch = crate::ops::elementwise::add(&w, &w, &y).unwrap();
        enc.encode(fourth.as_view()).unwrap();
        assert_eq!(group_sizes(&enc), [2, 1, 1]);
        enc.submit().unwrap().wait().unwrap();
        assert_eq!(dev.download::<f32>(&w).unwrap(), [4.0, 8.0, 12.0, 16.0]);
        assert_eq!(dev.download::<f32>(&y).unwrap(), [8.0, 16.0, 24.0, 32.0]);
    }

    #[test]
    fn a_caller_barrier_still_closes_the_group() {
        let (dev, cpu) = cpu();
        let x = dev.upload(&[1.0f32, 2.0], &[2]).unwrap();
        let y = dev.alloc(DType::F32, &[2]).unwrap();
        let z = dev.alloc(DType::F32, &[2]).unwrap();
        let mut enc = cpu.encoder();
        enc.encode(crate::ops::elementwise::add(&x, &x, &y).unwrap().as_view())
            .unwrap();
        enc.barrier();
        enc.encode(crate::ops::elementwise::add(&x, &x, &z).unwrap().as_view())
            .unwrap();
        assert_eq!(group_sizes(&enc), [1, 1]);
        assert_eq!(enc.dispatch_count(), 2);
    }

    #[test]
    fn an_encoder_that_syncs_each_dispatch_has_run_it_when_encode_returns() {
        let (dev, cpu) = cpu();
        let x = dev.upload(&[1.0f32, 2.0], &[2]).unwrap();
        let y = dev.alloc(DType::F32, &[2]).unwrap();
        let z = dev.alloc(DType::F32, &[2]).unwrap();
        let sync_each = EncoderOptions {
            sync_each_dispatch: true,
        };
        let mut synced = cpu.encoder_with(sync_each);
        let mut plain = cpu.encoder();
        plain
            .encode(crate::ops::elementwise::add(&x, &x, &z).unwrap().as_view())
            .unwrap();
        synced
            .encode(crate::ops::elementwise::add(&x, &x, &y).unwrap().as_view())
            .unwrap();
        assert_eq!(synced.dispatch_count(), 0, "submitted with the dispatch");
        assert_eq!(dev.download::<f32>(&y).unwrap(), [2.0, 4.0]);
        assert_eq!(plain.dispatch_count(), 1);
        assert_eq!(dev.download::<f32>(&z).unwrap(), [0.0, 0.0]);
        plain.submit().unwrap().wait().unwrap();
        assert_eq!(plain.dispatch_count(), 0);
        assert_eq!(dev.download::<f32>(&z).unwrap(), [2.0, 4.0]);
        // The encoder stays open after a submission.
        plain
            .encode(crate::ops::elementwise::add(&z, &x, &y).unwrap().as_view())
            .unwrap();
        plain.submit().unwrap().wait().unwrap();
        assert_eq!(dev.download::<f32>(&y).unwrap(), [3.0, 6.0]);
    }
}
