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

/// Converts a driver error into the crate's error, with what was being done.
pub(crate) fn driver_err(what: &str) -> impl FnOnce(result::DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e}"))
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
        let block_bytes = bytes.max(1);
        ctx.bind_to_thread()
            .map_err(driver_err("binding the CUDA context"))?;
        // SAFETY: the context is current; the size is non-zero.
        let ptr = unsafe { result::malloc_sync(block_bytes) }
            .map_err(driver_err(&format!("cuMemAlloc of {block_bytes} bytes")))?;
        let mem = CudaMemory {
            ctx: ctx.clone(),
            ptr,
            block_bytes,
            pool: None,
        };
        // SAFETY: `ptr` points to `block_bytes` bytes just allocated in this (current) context.
        unsafe { result::memset_d8_sync(ptr, 0, block_bytes) }.map_err(driver_err("cuMemsetD8"))?;
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
                .map_err(|_| Error::Cuda("scratch pool lock poisoned".into()))?;
            free.get_mut(&class).and_then(Vec::pop)
        };
        let ptr = match reused {
            Some(p) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                p
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.ctx
                    .bind_to_thread()
                    .map_err(driver_err("binding the CUDA context"))?;
                // SAFETY: the context is current; the class size is non-zero.
                unsafe { result::malloc_sync(class) }.map_err(driver_err(&format!(
                    "cuMemAlloc of {class} bytes (scratch)"
                )))?
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
        let blocks: Vec<sys::CUdeviceptr> = match self.free.lock() {
            Ok(mut free) => free.drain().flat_map(|(_, v)| v).collect(),
            Err(_) => return,
        };
        for p in blocks {
            free_block(&self.ctx, p);
        }
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

#[cfg(test)]
mod tests {
    use super::size_class;

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
