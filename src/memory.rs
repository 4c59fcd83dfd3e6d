//! Allocations and buffer views: what both the graph IR and the backends need, below both.
//!
//! An [`Allocation`] is one block of memory of some backend, held as a [`DeviceMemory`] trait
//! object: this module knows no device. A [`Buffer`] is a typed view of a byte range of one
//! allocation: several buffers may view (and alias) the same allocation, and the graph passes
//! reason about exactly these byte ranges.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Where an allocation's bytes live: the host, or one GPU. Two buffers can meet in one kernel
/// only when their locations are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory (the CPU backend, mapped files included).
    Host,
    /// Memory of CUDA device `ordinal`.
    Cuda(usize),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Host => f.write_str("cpu"),
            Location::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// The bytes behind an [`Allocation`], implemented by each backend's memory type. A backend gets
/// its own type back with [`DeviceMemory::as_any`] and a downcast.
pub trait DeviceMemory: Any + Send + Sync {
    /// Where the bytes live.
    fn location(&self) -> Location;

    /// Where the bytes live, in words ("cpu", "cpu (mapped file)", "cuda:0").
    fn describe(&self) -> String {
        self.location().to_string()
    }

    /// The first byte, for reading, when the host can read the memory. The pointer is valid for
    /// the allocation's size for as long as the memory lives.
    fn host_ptr(&self) -> Option<*const u8>;

    /// The first byte, for writing, when the host can write the memory. Valid as
    /// [`DeviceMemory::host_ptr`].
    fn host_ptr_mut(&self) -> Option<*mut u8>;

    /// The memory as `Any`, for a backend to downcast to its own type.
    fn as_any(&self) -> &dyn Any;
}

/// Identifies one allocation, unique across all devices for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocId(pub u64);

impl AllocId {
    /// A fresh id.
    pub fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        AllocId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A row-major shape of rank 0 to 4 (the last dimension is contiguous).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: [usize; 4],
    rank: u8,
}

impl Shape {
    /// Builds a shape from its dimensions (at most 4).
    pub fn new(dims: &[usize]) -> Result<Self> {
        if dims.len() > 4 {
            return Err(Error::View(format!(
                "shape {dims:?} has rank {} > 4",
                dims.len()
            )));
        }
        let mut d = [1usize; 4];
        d[..dims.len()].copy_from_slice(dims);
        let shape = Shape {
            dims: d,
            rank: dims.len() as u8,
        };
        shape
            .checked_elems()
            .ok_or_else(|| Error::View(format!("shape {dims:?} overflows")))?;
        Ok(shape)
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Number of elements (1 for rank 0).
    pub fn elems(&self) -> usize {
        self.dims().iter().product()
    }

    fn checked_elems(&self) -> Option<usize> {
        self.dims()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// The last (contiguous) dimension, 1 for rank 0.
    pub fn last(&self) -> usize {
        self.dims().last().copied().unwrap_or(1)
    }

    /// Number of rows: the product of all dimensions but the last.
    pub fn rows(&self) -> usize {
        let d = self.dims();
        if d.is_empty() {
            1
        } else {
            d[..d.len() - 1].iter().product()
        }
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape::new(d).expect("shape of rank <= 4 without overflow")
    }
}

/// One block of device memory.
pub struct Allocation {
    id: AllocId,
    size: usize,
    memory: Box<dyn DeviceMemory>,
}

impl Allocation {
    /// An allocation of `size` bytes over `memory`, which must hold at least `size` bytes.
    pub(crate) fn new(size: usize, memory: impl DeviceMemory) -> Arc<Self> {
        Arc::new(Allocation {
            id: AllocId::fresh(),
            size,
            memory: Box::new(memory),
        })
    }

    /// The memory behind the allocation.
    pub fn memory(&self) -> &dyn DeviceMemory {
        &*self.memory
    }

    /// Where the bytes live.
    pub fn home(&self) -> Location {
        self.memory.location()
    }

    /// The allocation's id.
    pub fn id(&self) -> AllocId {
        self.id
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Where the memory lives, in words ("cpu", "cuda:0").
    pub fn location(&self) -> String {
        self.memory.describe()
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Allocation({}, {} bytes, {})",
            self.id.0,
            self.size,
            self.location()
        )
    }
}

/// A typed view of a byte range of one allocation. Cheap to clone: one pointer to the view's
/// description, shared by every clone (a dispatch argument is a clone, so recording one is one
/// reference-count increment and a pointer copy).
#[derive(Clone)]
pub struct Buffer {
    view: Arc<View>,
}

/// What a [`Buffer`] points at.
///
/// The fields a recorder reads (the stamp, then the byte range) come first, in one cache line.
#[repr(C)]
struct View {
    /// The last graph that took this view in, and the view's index in that graph (see
    /// [`Buffer::graph_stamp`]).
    stamp: AtomicU64,
    /// The allocation's id, kept beside the offset so a byte range needs one pointer hop.
    id: AllocId,
    offset: usize,
    len: usize,
    alloc: Arc<Allocation>,
    dtype: DType,
    shape: Shape,
}

impl Buffer {
    /// A view of a whole allocation.
    pub(crate) fn whole(alloc: Arc<Allocation>, dtype: DType, shape: Shape) -> Result<Self> {
        let len = alloc.size();
        Buffer::new(alloc, 0, len, dtype, shape)
    }

    /// A view of `len` bytes at `offset`; checks that it fits and that the shape matches its length.
    pub(crate) fn new(
        alloc: Arc<Allocation>,
        offset: usize,
        len: usize,
        dtype: DType,
        shape: Shape,
    ) -> Result<Self> {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| Error::View(format!("offset {offset} + length {len} overflows")))?;
        if end > alloc.size() {
            return Err(Error::View(format!(
                "bytes {offset}..{end} do not fit in allocation of {} bytes",
                alloc.size()
            )));
        }
        let need = bytes_of(dtype, shape)?;
        if need != len {
            return Err(Error::View(format!(
                "shape {shape:?} of {dtype} needs {need} bytes, the view has {len}"
            )));
        }
        Ok(Buffer {
            view: Arc::new(View {
                id: alloc.id(),
                alloc,
                offset,
                len,
                dtype,
                shape,
                stamp: AtomicU64::new(0),
            }),
        })
    }

    /// A sub-view starting `byte_offset` bytes into this view, with its own dtype and shape.
    pub fn view(&self, byte_offset: usize, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let shape = Shape::new(dims)?;
        let len = bytes_of(dtype, shape)?;
        if byte_offset
            .checked_add(len)
            .is_none_or(|end| end > self.view.len)
        {
            return Err(Error::View(format!(
                "sub-view of {len} bytes at {byte_offset} exceeds the parent view of {} bytes",
                self.view.len
            )));
        }
        Buffer::new(
            self.view.alloc.clone(),
            self.view.offset + byte_offset,
            len,
            dtype,
            shape,
        )
    }

    /// Rows `start..start + count` of this view (rows are the leading dimension).
    pub fn rows(&self, start: usize, count: usize) -> Result<Buffer> {
        let dims = self.view.shape.dims();
        if dims.is_empty() || start.checked_add(count).is_none_or(|end| end > dims[0]) {
            return Err(Error::View(format!(
                "rows {start}..{} out of range for shape {:?}",
                start.saturating_add(count),
                self.view.shape
            )));
        }
        let mut new_dims = dims.to_vec();
        let row_bytes = self.view.len / dims[0].max(1);
        new_dims[0] = count;
        self.view(start * row_bytes, self.view.dtype, &new_dims)
    }

    /// The same bytes with another shape of the same element count.
    pub fn reshape(&self, dims: &[usize]) -> Result<Buffer> {
        let shape = Shape::new(dims)?;
        let v = &self.view;
        if shape.elems() != v.shape.elems() {
            return Err(Error::View(format!(
                "cannot reshape {:?} into {:?}",
                v.shape, shape
            )));
        }
        Ok(Buffer {
            view: Arc::new(View {
                alloc: v.alloc.clone(),
                id: v.id,
                offset: v.offset,
                len: v.len,
                dtype: v.dtype,
                shape,
                stamp: AtomicU64::new(0),
            }),
        })
    }

    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.view.dtype
    }

    /// The shape.
    #[inline]
    pub fn shape(&self) -> Shape {
        self.view.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.view.shape.dims()
    }

    /// Number of elements.
    #[inline]
    pub fn elems(&self) -> usize {
        self.view.shape.elems()
    }

    /// Byte offset of the view in its allocation.
    #[inline]
    pub fn offset(&self) -> usize {
        self.view.offset
    }

    /// Length of the view in bytes.
    #[inline]
    pub fn len_bytes(&self) -> usize {
        self.view.len
    }

    /// The allocation's id.
    #[inline]
    pub fn alloc_id(&self) -> AllocId {
        self.view.id
    }

    /// The allocation this view belongs to.
    pub fn allocation(&self) -> &Arc<Allocation> {
        &self.view.alloc
    }

    /// The byte range of the view inside its allocation.
    #[inline]
    pub fn byte_range(&self) -> std::ops::Range<usize> {
        self.view.offset..self.view.offset + self.view.len
    }

    /// A word the graph recorder keeps in the view, shared by every clone of this buffer: which
    /// graph last took the view in and at which index. Only
    /// [`ComputeGraph`](crate::graph::ComputeGraph) reads or writes it.
    #[inline]
    pub(crate) fn graph_stamp(&self) -> &AtomicU64 {
        &self.view.stamp
    }

    /// Whether two clones point at the same view (not merely the same bytes).
    #[inline]
    pub fn same_view(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.view, &other.view)
    }

    /// Whether two views share at least one byte.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        let (a, b) = (&self.view, &other.view);
        a.id == b.id && a.offset < b.offset + b.len && b.offset < a.offset + a.len
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = &self.view;
        write!(
            f,
            "Buffer(alloc {}, bytes {}..{}, {} {:?})",
            v.id.0,
            v.offset,
            v.offset + v.len,
            v.dtype,
            v.shape
        )
    }
}

/// Bytes needed for `shape` elements of `dtype`; an error when the last dimension is not a whole
/// number of blocks.
pub fn bytes_of(dtype: DType, shape: Shape) -> Result<usize> {
    if !shape.last().is_multiple_of(dtype.block_elems()) {
        return Err(Error::View(format!(
            "last dimension {} of {shape:?} is not a multiple of the {dtype} block size {}",
            shape.last(),
            dtype.block_elems()
        )));
    }
    dtype
        .bytes_for(shape.elems())
        .ok_or_else(|| Error::View(format!("{shape:?} of {dtype} overflows")))
}
