//! The dispatch IR: a dispatch is data (kernel name, arguments with their access, launch
//! geometry, op kind), never a closure, so one recorded list can run on any backend.

use super::borrowed::{DispatchRef, Ranges};
use crate::error::{Error, Result};
use crate::kernels::{Access, ArgShape, KernelId, OpKind, Scalar, ScalarKind};
use crate::memory::{AllocId, Buffer};

/// One kernel argument.
#[derive(Debug, Clone)]
pub enum Arg {
    /// A buffer view and how the kernel uses it.
    Buffer(Buffer, Access),
    /// A scalar.
    Scalar(Scalar),
}

impl Arg {
    /// A buffer the kernel reads.
    pub fn read(buf: &Buffer) -> Arg {
        Arg::Buffer(buf.clone(), Access::Read)
    }

    /// A buffer the kernel writes.
    pub fn write(buf: &Buffer) -> Arg {
        Arg::Buffer(buf.clone(), Access::Write)
    }

    /// A buffer the kernel reads and writes in place.
    pub fn read_write(buf: &Buffer) -> Arg {
        Arg::Buffer(buf.clone(), Access::ReadWrite)
    }

    /// An unsigned scalar.
    pub fn u32(v: u32) -> Arg {
        Arg::Scalar(Scalar::U32(v))
    }

    /// A signed scalar.
    pub fn i32(v: i32) -> Arg {
        Arg::Scalar(Scalar::I32(v))
    }

    /// A float scalar.
    pub fn f32(v: f32) -> Arg {
        Arg::Scalar(Scalar::F32(v))
    }

    /// What a kernel signature checks of the argument.
    #[inline]
    pub fn shape(&self) -> ArgShape {
        match self {
            Arg::Buffer(b, access) => ArgShape::Buffer(*access, b.dtype()),
            Arg::Scalar(s) => ArgShape::Scalar(ScalarKind::of(*s)),
        }
    }
}

/// Launch geometry: blocks of threads, as CUDA sees it. The CPU backend ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grid {
    /// Number of blocks in x, y, z.
    pub blocks: [u32; 3],
    /// Threads per block in x, y, z.
    pub threads: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// At most this many blocks on one multiprocessor at a time (0: no cap). The CUDA launch
    /// enforces it by giving each block enough shared memory that no more fit; the kernels use
    /// only what they asked for in `shared_bytes`.
    pub max_blocks_per_sm: u32,
}

impl Grid {
    /// `blocks` blocks of `threads` threads along x.
    pub const fn new(blocks: u32, threads: u32) -> Grid {
        Grid {
            blocks: [blocks, 1, 1],
            threads: [threads, 1, 1],
            shared_bytes: 0,
            max_blocks_per_sm: 0,
        }
    }

    /// Enough blocks of `threads` threads to cover `n` items along x.
    pub fn cover(n: usize, threads: u32) -> Grid {
        let blocks = n.div_ceil(threads as usize).max(1) as u32;
        Grid::new(blocks, threads)
    }

    /// The same grid with `y` blocks along y.
    pub const fn with_y(mut self, y: u32) -> Grid {
        self.blocks[1] = y;
        self
    }

    /// The same grid with dynamic shared memory.
    pub const fn with_shared(mut self, bytes: u32) -> Grid {
        self.shared_bytes = bytes;
        self
    }

    /// The same grid with at most `blocks` blocks on one multiprocessor at a time.
    pub const fn with_max_blocks_per_sm(mut self, blocks: u32) -> Grid {
        self.max_blocks_per_sm = blocks;
        self
    }
}

/// A byte range of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Range {
    /// The allocation.
    pub alloc: AllocId,
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Range {
    /// The range a buffer view covers.
    pub fn of(buf: &Buffer) -> Range {
        let r = buf.byte_range();
        Range {
            alloc: buf.alloc_id(),
            start: r.start,
            end: r.end,
        }
    }

    /// Whether two ranges share at least one byte (an empty range shares none).
    #[inline]
    pub fn overlaps(&self, other: &Range) -> bool {
        self.alloc == other.alloc
            && self.start < other.end
            && other.start < self.end
            && self.start < self.end
            && other.start < other.end
    }

    /// Whether `self` covers every byte of `other`.
    #[inline]
    pub fn covers(&self, other: &Range) -> bool {
        self.alloc == other.alloc && self.start <= other.start && other.end <= self.end
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    /// Whether the range holds no byte.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Arguments a dispatch keeps inline when built from an array.
const INLINE_ARGS: usize = 6;

/// A placeholder for unused inline argument slots (nothing to drop).
const NO_ARG: Arg = Arg::Scalar(Scalar::U32(0));

/// The arguments of a dispatch, in kernel order: from a `Vec<Arg>` (kept as it is) or from an
/// array (up to six arguments are stored inline, so building the dispatch allocates once).
#[derive(Debug, Clone)]
pub struct ArgList(ArgStore);

#[derive(Debug, Clone)]
enum ArgStore {
    Inline { len: u8, items: [Arg; INLINE_ARGS] },
    Heap(Vec<Arg>),
}

impl ArgList {
    /// The arguments.
    #[inline]
    pub fn as_slice(&self) -> &[Arg] {
        match &self.0 {
            ArgStore::Inline { len, items } => &items[..*len as usize],
            ArgStore::Heap(v) => v,
        }
    }
}

impl From<Vec<Arg>> for ArgList {
    fn from(args: Vec<Arg>) -> Self {
        ArgList(ArgStore::Heap(args))
    }
}

impl ArgList {
    /// Clones of `args`, inline when they are few (no allocation).
    fn cloned_from(args: &[Arg]) -> Self {
        if args.len() > INLINE_ARGS {
            return ArgList(ArgStore::Heap(args.to_vec()));
        }
        let mut items = [NO_ARG; INLINE_ARGS];
        items[..args.len()].clone_from_slice(args);
        ArgList(ArgStore::Inline {
            len: args.len() as u8,
            items,
        })
    }
}

impl<const N: usize> From<[Arg; N]> for ArgList {
    #[inline]
    fn from(args: [Arg; N]) -> Self {
        if N > INLINE_ARGS {
            return ArgList(ArgStore::Heap(args.into()));
        }
        let mut given = args.into_iter();
        let items = std::array::from_fn(|_| given.next().unwrap_or(NO_ARG));
        ArgList(ArgStore::Inline {
            len: N as u8,
            items,
        })
    }
}

/// Most read and write ranges one dispatch may have (buffer arguments, read-write ones counted
/// twice).
pub const MAX_RANGES: usize = 256;

/// `IDENTITY[k] == k`: the range indices of a [`Dispatch`]'s view, whose table is its own list.
static IDENTITY: [u32; MAX_RANGES] = {
    let mut ids = [0u32; MAX_RANGES];
    let mut k = 0;
    while k < MAX_RANGES {
        ids[k] = k as u32;
        k += 1;
    }
    ids
};

/// Ranges a dispatch keeps inline; more buffer arguments spill to the heap.
const INLINE_RANGES: usize = 4;

/// A placeholder for unused inline slots.
const NO_RANGE: Range = Range {
    alloc: AllocId(0),
    start: 0,
    end: 0,
};

/// The read ranges, then the write ranges, of one dispatch, stored inline when they are few
/// (recording a decode step then allocates nothing for them).
#[derive(Debug, Clone)]
enum RangeList {
    Inline {
        len: u8,
        items: [Range; INLINE_RANGES],
    },
    Heap(Box<[Range]>),
}

impl RangeList {
    #[inline]
    fn as_slice(&self) -> &[Range] {
        match self {
            RangeList::Inline { len, items } => &items[..*len as usize],
            RangeList::Heap(v) => v,
        }
    }
}

/// One kernel launch: kernel, arguments, geometry, op kind, and the read and write ranges derived
/// from the arguments.
///
/// The fields live behind one pointer, so a graph node is one word and the passes move nodes for
/// free. The blocks behind the pointers are recycled per thread (a small free list kept by this
/// module): recording a step after dropping the previous one allocates nothing.
pub struct Dispatch {
    /// Always set; taken only in `drop` (use [`Dispatch::inner`]).
    block: Option<Box<DispatchInner>>,
}

impl Clone for Dispatch {
    fn clone(&self) -> Self {
        Dispatch::of(DispatchInner::clone(self.inner()))
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            spare::recycle(block);
        }
    }
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner();
        f.debug_struct("Dispatch")
            .field("kernel", &inner.kernel)
            .field("op", &inner.op)
            .field("grid", &inner.grid)
            .field("args", &inner.args)
            .field("reads", &self.reads())
            .field("writes", &self.writes())
            .finish()
    }
}

/// Spare dispatch blocks, per thread: dropping a dispatch keeps its block (emptied of its
/// arguments) for the next one built on the same thread, up to [`spare::KEEP`] blocks.
mod spare {
    // The boxes are the point: each is one block handed out again as it is.
    #![allow(clippy::vec_box)]

    use std::cell::RefCell;

    use super::{ArgList, ArgStore, DispatchInner, RangeList, NO_ARG, NO_RANGE};

    /// Blocks kept per thread (a 300-layer decode step has about 5700 dispatches).
    pub(super) const KEEP: usize = 8192;

    thread_local! {
        static BLOCKS: RefCell<Vec<Box<DispatchInner>>> = const { RefCell::new(Vec::new()) };
    }

    /// `inner` in a block, a kept one when there is one.
    #[inline]
    pub(super) fn boxed(inner: DispatchInner) -> Box<DispatchInner> {
        let kept = BLOCKS
            .try_with(|b| b.try_borrow_mut().ok().and_then(|mut b| b.pop()))
            .ok()
            .flatten();
        match kept {
            Some(mut block) => {
                *block = inner;
                block
            }
            None => Box::new(inner),
        }
    }

    /// Drops what `block` holds and keeps the block, or frees it when enough are kept.
    #[inline]
    pub(super) fn recycle(mut block: Box<DispatchInner>) {
        // Inline slots past `len` always hold `NO_ARG`; blank the used ones in place.
        match &mut block.args.0 {
            ArgStore::Inline { len, items } => {
                for a in &mut items[..*len as usize] {
                    *a = NO_ARG;
                }
                *len = 0;
            }
            ArgStore::Heap(_) => {
                block.args = ArgList(ArgStore::Inline {
                    len: 0,
                    items: [NO_ARG; super::INLINE_ARGS],
                });
            }
        }
        if let RangeList::Heap(_) = block.ranges {
            block.ranges = RangeList::Inline {
                len: 0,
                items: [NO_RANGE; super::INLINE_RANGES],
            };
        }
        // A thread being torn down, or a nested borrow, frees the block instead.
        let _ = BLOCKS.try_with(|b| {
            if let Ok(mut b) = b.try_borrow_mut() {
                if b.len() < KEEP {
                    b.push(block);
                }
            }
        });
    }
}

#[derive(Debug, Clone)]
struct DispatchInner {
    kernel: KernelId,
    grid: Grid,
    op: OpKind,
    /// How many of `ranges` are reads (they come first).
    n_reads: u32,
    args: ArgList,
    ranges: RangeList,
}

/// The buffer arguments of `args` with their access, for the ranges.
#[inline]
fn buffers(args: &[Arg]) -> impl Iterator<Item = (&Buffer, Access)> + Clone {
    args.iter().filter_map(|a| match a {
        Arg::Buffer(b, acc) => Some((b, *acc)),
        Arg::Scalar(_) => None,
    })
}

impl Dispatch {
    /// Builds a dispatch of `kernel` and derives its ranges; its op kind is the kernel's. The
    /// arguments must fit the kernel's declared parameters (count, buffer or scalar, access,
    /// dtype), and a written argument may not overlap any other buffer argument of the same
    /// dispatch (an in-place update is one `ReadWrite` argument); otherwise the error names the
    /// kernel and the argument.
    ///
    /// `args` is a `Vec<Arg>` or an array of [`Arg`]s (an array of up to six avoids a second
    /// allocation).
    #[inline]
    pub fn new(kernel: KernelId, args: impl Into<ArgList>, grid: Grid) -> Result<Dispatch> {
        Self::build(kernel, args.into(), grid)
    }

    fn build(kernel: KernelId, args: ArgList, grid: Grid) -> Result<Dispatch> {
        let list = args.as_slice();
        kernel.sig().check(list.iter().map(Arg::shape))?;
        let op = kernel.op();
        let (mut n_reads, mut n_writes) = (0usize, 0usize);
        for (_, access) in buffers(list) {
            n_reads += access.reads() as usize;
            n_writes += access.writes() as usize;
        }
        if n_reads + n_writes > MAX_RANGES {
            return Err(too_many_ranges(kernel, n_reads + n_writes));
        }
        if n_writes > 0 {
            check_writes_alone(kernel, list)?;
        }
        let reads = buffers(list).filter(|(_, a)| a.reads());
        let writes = buffers(list).filter(|(_, a)| a.writes());
        let all = reads.chain(writes).map(|(b, _)| Range::of(b));
        let ranges = if n_reads + n_writes <= INLINE_RANGES {
            let mut items = [NO_RANGE; INLINE_RANGES];
            for (slot, r) in items.iter_mut().zip(all) {
                *slot = r;
            }
            RangeList::Inline {
                len: (n_reads + n_writes) as u8,
                items,
            }
        } else {
            RangeList::Heap(all.collect())
        };
        Ok(Dispatch::of(DispatchInner {
            kernel,
            grid,
            op,
            n_reads: n_reads as u32,
            args,
            ranges,
        }))
    }

    /// A dispatch over `inner`, in a kept block when this thread has one.
    #[inline]
    fn of(inner: DispatchInner) -> Dispatch {
        Dispatch {
            block: Some(spare::boxed(inner)),
        }
    }

    /// What the dispatch holds (its block is taken only when it is dropped).
    #[inline]
    fn inner(&self) -> &DispatchInner {
        match &self.block {
            Some(block) => block,
            None => unreachable!("a dispatch's block is taken only in drop"),
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> KernelId {
        self.inner().kernel
    }

    /// The arguments, in kernel order.
    pub fn args(&self) -> &[Arg] {
        self.inner().args.as_slice()
    }

    /// Launch geometry.
    pub fn grid(&self) -> Grid {
        self.inner().grid
    }

    /// The op kind.
    pub fn op(&self) -> OpKind {
        self.inner().op
    }

    /// Byte ranges the dispatch reads.
    #[inline]
    pub fn reads(&self) -> &[Range] {
        let inner = self.inner();
        &inner.ranges.as_slice()[..inner.n_reads as usize]
    }

    /// Byte ranges the dispatch writes.
    #[inline]
    pub fn writes(&self) -> &[Range] {
        let inner = self.inner();
        &inner.ranges.as_slice()[inner.n_reads as usize..]
    }

    /// The buffer argument at `index`, if it is one.
    pub fn buffer_arg(&self, index: usize) -> Option<(&Buffer, Access)> {
        match self.inner().args.as_slice().get(index) {
            Some(Arg::Buffer(b, a)) => Some((b, *a)),
            _ => None,
        }
    }

    /// The dispatch as a borrowed view (what encoders and fusion rules take).
    #[inline]
    pub fn as_view(&self) -> DispatchRef<'_> {
        let inner = self.inner();
        let table = inner.ranges.as_slice();
        DispatchRef {
            kernel: inner.kernel,
            grid: inner.grid,
            op: inner.op,
            args: inner.args.as_slice(),
            // `build` keeps the ranges within `MAX_RANGES`.
            ids: &IDENTITY[..table.len()],
            table,
            n_reads: inner.n_reads as usize,
        }
    }
}

/// The error for a dispatch with more than [`MAX_RANGES`] ranges.
pub(crate) fn too_many_ranges(kernel: KernelId, n: usize) -> Error {
    Error::InvalidArgument(format!(
        "kernel {}: {n} read and write ranges, a dispatch may have at most {MAX_RANGES}",
        kernel.name()
    ))
}

/// Fails when a written buffer argument overlaps any other buffer argument
/// ([`write_alias`](super::conflict::write_alias)).
fn check_writes_alone(kernel: KernelId, args: &[Arg]) -> Result<()> {
    match super::conflict::write_alias(args) {
        Some((i, j)) => Err(Error::InvalidArgument(format!(
            "kernel {}: written argument {i} overlaps argument {j}; \
             use one read-write argument for in-place updates",
            kernel.name()
        ))),
        None => Ok(()),
    }
}

impl Dispatch {
    /// A dispatch over clones of `args`, from parts another dispatch already checked (`reads`
    /// and `writes` are derived from the same arguments).
    pub(super) fn from_checked_parts(
        kernel: KernelId,
        grid: Grid,
        op: OpKind,
        args: &[Arg],
        reads: Ranges<'_>,
        writes: Ranges<'_>,
    ) -> Dispatch {
        let n_reads = reads.len();
        let all = reads.iter().chain(writes.iter());
        let n = n_reads + writes.len();
        let ranges = if n <= INLINE_RANGES {
            let mut items = [NO_RANGE; INLINE_RANGES];
            for (slot, r) in items.iter_mut().zip(all) {
                *slot = r;
            }
            RangeList::Inline {
                len: n as u8,
                items,
            }
        } else {
            RangeList::Heap(all.collect())
        };
        Dispatch::of(DispatchInner {
            kernel,
            grid,
            op,
            n_reads: n_reads as u32,
            args: ArgList::cloned_from(args),
            ranges,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::OpKind;

    /// Every op kind has its own code, below `CODES` (the fusion pass keys a table by it).
    #[test]
    fn given_every_op_kind_when_coded_should_give_distinct_codes_below_the_bound() {
        let all = [
            OpKind::MatMul,
            OpKind::MatMulId,
            OpKind::RmsNorm,
            OpKind::RmsNormMul,
            OpKind::RmsNormAdd,
            OpKind::Rope,
            OpKind::RmsNormRope,
            OpKind::Add,
            OpKind::Mul,
            OpKind::Elementwise,
            OpKind::Copy,
            OpKind::KvWrite,
            OpKind::Gather,
            OpKind::Softmax,
            OpKind::Attention,
            OpKind::Argmax,
            OpKind::Custom { reorderable: false },
            OpKind::Custom { reorderable: true },
        ];
        let mut seen = [false; OpKind::CODES];
        for op in all {
            let c = op.code();
            assert!(c < OpKind::CODES, "{op:?}: {c}");
            assert!(!seen[c], "{op:?}: code {c} taken twice");
            seen[c] = true;
        }
        assert!(seen.iter().all(|&s| s), "a code no op kind has");
    }
}
