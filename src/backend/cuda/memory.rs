//! Device memory: plain allocations (`cuMemAlloc`, never managed memory) and a caching pool for
//! scratch buffers, so that a decode step, once warm, allocates nothing from the driver.
//!
//! A [`CudaMemory`] owns one device block and keeps the context alive. When it came from the
//! [`ScratchPool`], dropping it returns the block to the pool's free list for its size class
//! instead of freeing it. Blocks are handed out again only after the `Buffer`s that used them are
//! gone; a session holds its buffers until its work has finished, so a reused block is never still
//! being read by an earlier launch (and on our single stream, later launches are ordered after
//! earlier ones anyway).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext};

use crate::error::{Error, Result};

/// Converts a driver error into the crate's [`Error::Driver`], with what was being done.
pub(crate) fn driver_err(what: &str) -> impl FnOnce(result::DriverError) -> Error + '_ {
    move |e| Error::driver(what, e)
}

/// Whether a driver error leaves the context unusable (a kernel faulted: every later call in the
/// context fails the same way until the process exits).
pub(crate) fn is_sticky(e: &result::DriverError) -> bool {
    use sys::CUresult as R;
    matches!(
        e.0,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

/// A byte count in words: `1099511627776 bytes (1024.0 GiB)`.
fn bytes_in_words(bytes: usize) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{bytes} bytes ({:.1} GiB)", b / GIB)
    } else {
        format!("{bytes} bytes ({:.1} MiB)", b / MIB)
    }
}

/// `cuMemAlloc` of `bytes` in `ctx` (made current here). When the device is out of memory,
/// `reclaim` is asked to free cached blocks (it returns the bytes it freed) and, if it freed any,
/// the allocation is tried once more. The error names the size, what it was for, and what the
/// device had free.
fn malloc_reclaiming(
    ctx: &CudaContext,
    bytes: usize,
    what: &str,
    reclaim: &dyn Fn() -> usize,
) -> Result<sys::CUdeviceptr> {
    ctx.bind_to_thread()
        .map_err(driver_err("binding the CUDA context"))?;
    // SAFETY: the context is current; callers pass a non-zero size.
    let mut r = unsafe { result::malloc_sync(bytes) };
    if matches!(&r, Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) && reclaim() > 0 {
        ctx.bind_to_thread()
            .map_err(driver_err("binding the CUDA context"))?;
        // SAFETY: as above.
        r = unsafe { result::malloc_sync(bytes) };
    }
    r.map_err(|e| {
        let size = bytes_in_words(bytes);
        if e.0 != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Error::driver(format!("cuMemAlloc of {size} ({what})"), e);
        }
        let free = match result::mem_get_info() {
            Ok((free, total)) => format!(
                "; the device has {} free of {}",
                bytes_in_words(free),
                bytes_in_words(total)
            ),
            Err(_) => String::new(),
        };
        Error::driver(
            format!(
                "out of device memory: cuMemAlloc of {size} ({what}) on cuda:{} failed{free}",
                ctx.ordinal()
            ),
            e,
        )
    })
}

/// One block of device memory.
pub struct CudaMemory {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    block_bytes: usize,
    pool: Option<Arc<ScratchPool>>,
}

// SAFETY: a device pointer is a plain address valid in its context from any thread; the context is
// made current before every driver call that uses it. Access to the bytes is ordered by the
// executor (one stream, sessions wait before the host touches buffers).
unsafe impl Send for CudaMemory {}
// SAFETY: see `Send`; the struct has no interior mutability.
unsafe impl Sync for CudaMemory {}

impl CudaMemory {
    /// Allocates `bytes` (at least 1) of plain device memory, zeroed.
    pub(crate) fn alloc_zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        Self::alloc_zeroed_reclaiming(ctx, bytes, &|| 0)
    }

    /// As [`CudaMemory::alloc_zeroed`]; when the device is out of memory, `reclaim` may free
    /// cached blocks (returning the bytes freed) before one more try.
    pub(crate) fn alloc_zeroed_reclaiming(
        ctx: &Arc<CudaContext>,
        bytes: usize,
        reclaim: &dyn Fn() -> usize,
    ) -> Result<Self> {
        let block_bytes = bytes.max(1);
        let ptr = malloc_reclaiming(ctx, block_bytes, "a buffer", reclaim)?;
        let mem = CudaMemory {
            ctx: ctx.clone(),
            ptr,
            block_bytes,
            pool: None,
        };
        // SAFETY: `ptr` points to `block_bytes` bytes just allocated in this (current) context.
        unsafe { result::memset_d8_sync(ptr, 0, block_bytes) }.map_err(driver_err("cuMemsetD8"))?;
        // On device memory that memset only queues on the legacy default stream, which the
        // device's own (non-blocking) stream does not wait for: without this wait a copy into
        // the new buffer on that stream could run first and be zeroed afterwards (seen as an
        // upload that read back as zeros on a freshly started GPU).
        // SAFETY: the null stream is the context's legacy default stream, always valid.
        unsafe { result::stream::synchronize(std::ptr::null_mut()) }.map_err(driver_err(
            "waiting for the zeroing memset (cuStreamSynchronize)",
        ))?;
        Ok(mem)
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size of the underlying block in bytes (at least the requested size).
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The context the block belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The ordinal of the device the block lives on.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Whether the block came from the scratch pool.
    pub fn is_scratch(&self) -> bool {
        self.pool.is_some()
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(self.block_bytes, self.ptr);
            return;
        }
        free_block(&self.ctx, self.ptr);
    }
}

fn free_block(ctx: &CudaContext, ptr: sys::CUdeviceptr) {
    // Drop has no way to report an error; the context records it for the next checked call.
    if ctx.bind_to_thread().is_ok() {
        // SAFETY: `ptr` was returned by `cuMemAlloc` in this context and is freed exactly once
        // (its owner is being dropped, and pooled blocks are freed only by the pool's drop).
        ctx.record_err(unsafe { result::free_sync(ptr) });
    }
}

/// Counters of the scratch pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Requests served from a free list.
    pub hits: u64,
    /// Requests that had to call `cuMemAlloc`.
    pub misses: u64,
    /// Blocks waiting in free lists now.
    pub cached_blocks: u64,
    /// Bytes waiting in free lists now.
    pub cached_bytes: u64,
}

/// A caching allocator: free lists of device blocks keyed by size class, reused across sessions.
pub struct ScratchPool {
    ctx: Arc<CudaContext>,
    free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

// SAFETY: the free lists hold plain device addresses behind a mutex; see `CudaMemory`.
unsafe impl Send for ScratchPool {}
// SAFETY: as above.
unsafe impl Sync for ScratchPool {}

/// The size class of a request: 256 bytes at least, then powers of two and the points three
/// quarters of the way between them (so a block wastes at most a third of its size).
pub fn size_class(bytes: usize) -> usize {
    if bytes <= 256 {
        return 256;
    }
    let p = bytes.next_power_of_two();
    let three_quarters = p / 4 * 3;
    if bytes <= three_quarters {
        three_quarters
    } else {
        p
    }
}

impl ScratchPool {
    /// An empty pool for `ctx`.
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Arc<Self> {
        Arc::new(ScratchPool {
            ctx,
            free: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// A block of at least `bytes` bytes, from a free list when one has a block of this class.
    /// Its contents are whatever the last user left there.
    pub(crate) fn take(self: &Arc<Self>, bytes: usize) -> Result<CudaMemory> {
        let class = size_class(bytes);
        let reused = {
            let mut free = self
                .free
                .lock()
                .map_err(|_| Error::Backend("scratch pool lock poisoned".into()))?;
            free.get_mut(&class).and_then(Vec::pop)
        };
        let ptr = match reused {
            Some(p) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                p
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                // Out of memory with blocks of other classes cached: free them, try once more.
                malloc_reclaiming(&self.ctx, class, "a scratch block", &|| {
                    self.release_cached()
                })?
            }
        };
        Ok(CudaMemory {
            ctx: self.ctx.clone(),
            ptr,
            block_bytes: class,
            pool: Some(self.clone()),
        })
    }

    fn give_back(&self, class: usize, ptr: sys::CUdeviceptr) {
        match self.free.lock() {
            Ok(mut free) => free.entry(class).or_default().push(ptr),
            Err(_) => free_block(&self.ctx, ptr),
        }
    }

    /// Frees every cached block.
    pub fn trim(&self) {
        self.release_cached();
    }

    /// Frees every cached block; returns the bytes freed.
    pub(crate) fn release_cached(&self) -> usize {
        let blocks: Vec<(usize, sys::CUdeviceptr)> = match self.free.lock() {
            Ok(mut free) => free
                .drain()
                .flat_map(|(class, v)| v.into_iter().map(move |p| (class, p)))
                .collect(),
            Err(_) => return 0,
        };
        let mut freed = 0;
        for (class, p) in blocks {
            free_block(&self.ctx, p);
            freed += class;
        }
        freed
    }

    /// The pool's counters.
    pub fn stats(&self) -> PoolStats {
        let (blocks, bytes) = self
            .free
            .lock()
            .map(|f| {
                f.iter().fold((0u64, 0u64), |(n, b), (class, v)| {
                    (n + v.len() as u64, b + (*class * v.len()) as u64)
                })
            })
            .unwrap_or_default();
        PoolStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            cached_blocks: blocks,
            cached_bytes: bytes,
        }
    }
}

impl Drop for ScratchPool {
    fn drop(&mut self) {
        self.trim();
    }
}

impl crate::memory::DeviceMemory for CudaMemory {
    fn location(&self) -> crate::memory::Location {
        crate::memory::Location::Cuda(self.ordinal())
    }

    /// Device memory is not host-visible.
    fn host_ptr(&self) -> Option<*const u8> {
        None
    }

    /// Device memory is not host-visible.
    fn host_ptr_mut(&self) -> Option<*mut u8> {
        None
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::{
        bytes_in_words, driver_err, is_sticky, result::DriverError, size_class, sys::CUresult,
    };
    use crate::error::Error;

    /// A failed driver call becomes [`Error::Driver`]: the message names the call, and the
    /// driver's status is the typed source (nothing here calls the driver: the status's own text
    /// needs libcuda, and this machine may have none).
    #[test]
    fn driver_failures_keep_the_status_as_a_typed_source() {
        let status = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let err = driver_err("cuMemAlloc of 64 bytes (scratch)")(status);
        assert!(matches!(&err, Error::Driver { what, .. } if what.contains("cuMemAlloc")));
        assert_eq!(
            err.to_string(),
            "CUDA driver: cuMemAlloc of 64 bytes (scratch)"
        );
        let source = std::error::Error::source(&err).expect("a source");
        assert_eq!(source.downcast_ref::<DriverError>(), Some(&status));
        let chained = anyhow::Error::from(err);
        assert_eq!(chained.chain().count(), 2);
        assert_eq!(
            chained.root_cause().downcast_ref::<DriverError>(),
            Some(&status)
        );
    }

    #[test]
    fn sizes_in_words_and_sticky_errors() {
        assert_eq!(bytes_in_words(1 << 40), "1099511627776 bytes (1024.0 GiB)");
        assert_eq!(bytes_in_words(3 << 19), "1572864 bytes (1.5 MiB)");
        assert!(is_sticky(&DriverError(
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        )));
        assert!(is_sticky(&DriverError(CUresult::CUDA_ERROR_LAUNCH_FAILED)));
        assert!(!is_sticky(&DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)));
        assert!(!is_sticky(&DriverError(CUresult::CUDA_ERROR_INVALID_VALUE)));
    }

    #[test]
    fn size_classes_cover_requests_with_bounded_waste() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 384);
        assert_eq!(size_class(384), 384);
        assert_eq!(size_class(385), 512);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 3 << 19);
        for n in (1..200_000).step_by(97) {
            let c = size_class(n);
            assert!(c >= n, "{n} -> {c}");
            assert!(
                c <= 256 || c * 2 <= n * 3 + 512,
                "class {c} wastes too much for {n}"
            );
        }
    }
}
