//! Allocations and buffer views.
//!
//! An [`Allocation`] is one block of device memory. A [`Buffer`] is a typed view of a byte range of
//! one allocation: several buffers may view (and alias) the same allocation, and the graph passes
//! reason about exactly these byte ranges.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{DType, Memory};
use crate::error::{Error, Result};

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
    pub(crate) memory: Memory,
}

impl Allocation {
    pub(crate) fn new(size: usize, memory: Memory) -> Arc<Self> {
        Arc::new(Allocation {
            id: AllocId::fresh(),
            size,
            memory,
        })
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
        self.memory.location()
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

/// A typed view of a byte range of one allocation. Cheap to clone.
#[derive(Clone)]
pub struct Buffer {
    alloc: Arc<Allocation>,
    offset: usize,
    len: usize,
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
            alloc,
            offset,
            len,
            dtype,
            shape,
        })
    }

    /// A sub-view starting `byte_offset` bytes into this view, with its own dtype and shape.
    pub fn view(&self, byte_offset: usize, dtype: DType, dims: &[usize]) -> Result<Buffer> {
        let shape = Shape::new(dims)?;
        let len = bytes_of(dtype, shape)?;
        if byte_offset
            .checked_add(len)
            .is_none_or(|end| end > self.len)
        {
            return Err(Error::View(format!(
                "sub-view of {len} bytes at {byte_offset} exceeds the parent view of {} bytes",
                self.len
            )));
        }
        Buffer::new(
            self.alloc.clone(),
            self.offset + byte_offset,
            len,
            dtype,
            shape,
        )
    }

    /// Rows `start..start + count` of this view (rows are the leading dimension).
    pub fn rows(&self, start: usize, count: usize) -> Result<Buffer> {
        let dims = self.shape.dims();
        if dims.is_empty() || start.checked_add(count).is_none_or(|end| end > dims[0]) {
            return Err(Error::View(format!(
                "rows {start}..{} out of range for shape {:?}",
                start.saturating_add(count),
                self.shape
            )));
        }
        let mut new_dims = dims.to_vec();
        let row_bytes = self.len / dims[0].max(1);
        new_dims[0] = count;
        self.view(start * row_bytes, self.dtype, &new_dims)
    }

    /// The same bytes with another shape of the same element count.
    pub fn reshape(&self, dims: &[usize]) -> Result<Buffer> {
        let shape = Shape::new(dims)?;
        if shape.elems() != self.shape.elems() {
            return Err(Error::View(format!(
                "cannot reshape {:?} into {:?}",
                self.shape, shape
            )));
        }
        Ok(Buffer {
            shape,
            ..self.clone()
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        // Safety of the borrow: `shape` is stored inline in `self`.
        let s: &Shape = &self.shape;
        s.dims()
    }

    /// Number of elements.
    pub fn elems(&self) -> usize {
        self.shape.elems()
    }

    /// Byte offset of the view in its allocation.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length of the view in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len
    }

    /// The allocation's id.
    pub fn alloc_id(&self) -> AllocId {
        self.alloc.id()
    }

    /// The allocation this view belongs to.
    pub fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }

    /// The byte range of the view inside its allocation.
    pub fn byte_range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }

    /// Whether two views share at least one byte.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        self.alloc_id() == other.alloc_id()
            && self.offset < other.offset + other.len
            && other.offset < self.offset + self.len
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer(alloc {}, bytes {}..{}, {} {:?})",
            self.alloc.id().0,
            self.offset,
            self.offset + self.len,
            self.dtype,
            self.shape
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
