//! Host memory blocks: owned aligned allocations and read-only file mappings.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::memory::Location;

/// Alignment of every host allocation, enough for any SIMD load.
pub const HOST_ALIGN: usize = 64;

/// An owned, zero-initialized, 64-byte-aligned block of host memory.
pub struct HostMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `HostMemory` owns its block outright. Concurrent access goes through raw pointers
// handed out by `as_ptr`; the executor only lets dispatches touch overlapping bytes at the same
// time when all of them read (the conflict rule, `graph::conflict`), and host-side reads and
// writes hold the CPU device's memory lock, which running kernels hold too (`backend::cpu::run`).
unsafe impl Send for HostMemory {}
// SAFETY: see `Send` above.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Allocates `size` zeroed bytes; `None` when the allocator refuses.
    pub fn zeroed(size: usize) -> Option<Self> {
        let layout = Layout::from_size_align(size.max(1), HOST_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| HostMemory { ptr, layout })
    }

    /// Start of the block.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this same layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A read-only window of a memory-mapped file (model weights, zero-copy).
///
/// The window always lies inside the mapping: [`MappedMemory::new`] checks it, and the fields are
/// private, so [`MappedMemory::as_ptr`] and the `len` bytes after it are always in the map.
pub struct MappedMemory {
    /// The mapping, shared by every tensor of the file.
    map: Arc<memmap2::Mmap>,
    /// Start of the window in the mapping.
    offset: usize,
    /// Length of the window in bytes.
    len: usize,
}

impl MappedMemory {
    /// The window of `len` bytes at `offset` in `map`; an error when it does not lie inside the
    /// map.
    pub fn new(map: Arc<memmap2::Mmap>, offset: usize, len: usize) -> Result<Self> {
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(Error::View(format!(
                "mapped window {offset}+{len} exceeds the file's {} bytes",
                map.len()
            )));
        }
        Ok(MappedMemory { map, offset, len })
    }

    /// The mapping the window belongs to.
    pub fn map(&self) -> &Arc<memmap2::Mmap> {
        &self.map
    }

    /// Start of the window in the mapping.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the window; the `len()` bytes from here lie in the map.
    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: `offset + len <= map.len()` (checked by `new`, the only constructor; the fields
        // are private), so the result is in bounds of the mapping or one past its end.
        unsafe { self.map.as_ptr().add(self.offset) }
    }
}

impl crate::memory::DeviceMemory for HostMemory {
    fn location(&self) -> Location {
        Location::Host
    }

    fn host_ptr(&self) -> Option<*const u8> {
        Some(self.as_ptr() as *const u8)
    }

    fn host_ptr_mut(&self) -> Option<*mut u8> {
        Some(self.as_ptr())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl crate::memory::DeviceMemory for MappedMemory {
    fn location(&self) -> Location {
        Location::Host
    }

    fn describe(&self) -> String {
        "cpu (mapped file)".into()
    }

    fn host_ptr(&self) -> Option<*const u8> {
        Some(self.as_ptr())
    }

    /// A mapped file is read-only.
    fn host_ptr_mut(&self) -> Option<*mut u8> {
        None
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Memory this process may still take, in bytes: `MemAvailable` of `/proc/meminfo`, lowered to
/// what the cgroup's `memory.max` leaves when that is smaller. `None` where it is not known
/// (another system, or no `/proc`).
pub fn available_host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available = parse_mem_available(&meminfo)?;
    let cgroup = (|| {
        let max = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
        let current = std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok()?;
        let max: u64 = max.trim().parse().ok()?; // `max` (no limit) does not parse
        let current: u64 = current.trim().parse().ok()?;
        Some(max.saturating_sub(current))
    })();
    Some(cgroup.map_or(available, |c| c.min(available)))
}

/// The `MemAvailable` line of a `/proc/meminfo` text, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}
