//! Borrowed forms of a dispatch: [`ArgRef`] (an argument that borrows its buffer), [`DispatchRef`]
//! (a view of a recorded or owned dispatch, what encoders and fusion rules read) and
//! [`DispatchSpec`] (a dispatch described over borrowed buffers, what a fusion rule builds).

use super::dispatch::{Arg, Dispatch, Grid, Range};
use crate::error::{Error, Result};
use crate::kernels::{Access, OpKind, Scalar};
use crate::kernels::{ArgShape, KernelId, ScalarKind};
use crate::memory::Buffer;

/// One kernel argument as a recorder takes it: buffers are borrowed, so recording into a
/// [`ComputeGraph`](super::ComputeGraph) takes a reference count only where the graph does not
/// hold the same argument already (none for a step recorded again into the graph of the last).
#[derive(Debug, Clone, Copy)]
pub enum ArgRef<'a> {
    /// A buffer view and how the kernel uses it.
    Buffer(&'a Buffer, Access),
    /// A scalar.
    Scalar(Scalar),
}

impl<'a> ArgRef<'a> {
    /// A buffer the kernel reads.
    pub fn read(buf: &'a Buffer) -> Self {
        ArgRef::Buffer(buf, Access::Read)
    }

    /// A buffer the kernel writes.
    pub fn write(buf: &'a Buffer) -> Self {
        ArgRef::Buffer(buf, Access::Write)
    }

    /// A buffer the kernel reads and writes in place.
    pub fn read_write(buf: &'a Buffer) -> Self {
        ArgRef::Buffer(buf, Access::ReadWrite)
    }

    /// An unsigned scalar.
    pub fn u32(v: u32) -> Self {
        ArgRef::Scalar(Scalar::U32(v))
    }

    /// A signed scalar.
    pub fn i32(v: i32) -> Self {
        ArgRef::Scalar(Scalar::I32(v))
    }

    /// A float scalar.
    pub fn f32(v: f32) -> Self {
        ArgRef::Scalar(Scalar::F32(v))
    }

    /// What a kernel signature checks of the argument.
    #[inline]
    pub fn shape(&self) -> ArgShape {
        match *self {
            ArgRef::Buffer(b, access) => ArgShape::Buffer(access, b.dtype()),
            ArgRef::Scalar(s) => ArgShape::Scalar(ScalarKind::of(s)),
        }
    }
}

impl<'a> From<&'a Arg> for ArgRef<'a> {
    fn from(arg: &'a Arg) -> Self {
        match arg {
            Arg::Buffer(b, a) => ArgRef::Buffer(b, *a),
            Arg::Scalar(s) => ArgRef::Scalar(*s),
        }
    }
}

/// Most arguments a [`DispatchSpec`] holds.
pub const SPEC_ARGS: usize = 20;

/// A dispatch described with borrowed arguments, not recorded yet: what a fusion rule builds.
/// The fusion pass records it into the graph by view index (a reference count only where the
/// graph does not hold the same argument already, as for [`ArgRef`]);
/// [`to_dispatch`](Self::to_dispatch) makes an owned [`Dispatch`] of it.
#[derive(Debug, Clone, Copy)]
pub struct DispatchSpec<'a> {
    kernel: KernelId,
    grid: Grid,
    op: OpKind,
    len: u8,
    args: [ArgRef<'a>; SPEC_ARGS],
}

impl<'a> DispatchSpec<'a> {
    /// A dispatch of `kernel` over `args` (at most [`SPEC_ARGS`]), which must fit the kernel's
    /// declared parameters; its op kind is the kernel's. Its ranges are checked when it is
    /// recorded or made a [`Dispatch`].
    pub fn new(kernel: KernelId, args: &[ArgRef<'a>], grid: Grid) -> Result<Self> {
        kernel.sig().check(args.iter().map(ArgRef::shape))?;
        let op = kernel.op();
        if args.len() > SPEC_ARGS {
            return Err(Error::InvalidArgument(format!(
                "kernel {}: {} arguments, a dispatch spec holds at most {SPEC_ARGS}",
                kernel.name(),
                args.len()
            )));
        }
        let mut items = [ArgRef::Scalar(Scalar::U32(0)); SPEC_ARGS];
        items[..args.len()].copy_from_slice(args);
        Ok(DispatchSpec {
            kernel,
            grid,
            op,
            len: args.len() as u8,
            args: items,
        })
    }

    /// The kernel.
    pub fn kernel(&self) -> KernelId {
        self.kernel
    }

    /// Launch geometry.
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// The op kind.
    pub fn op(&self) -> OpKind {
        self.op
    }

    /// The arguments, in kernel order.
    pub fn args(&self) -> &[ArgRef<'a>] {
        &self.args[..self.len as usize]
    }

    /// The byte ranges the dispatch would write.
    pub fn writes(&self) -> impl Iterator<Item = Range> + '_ {
        self.args().iter().filter_map(|a| match a {
            ArgRef::Buffer(b, access) if access.writes() => Some(Range::of(b)),
            _ => None,
        })
    }

    /// An owned dispatch (one reference per buffer argument), with the checks of
    /// [`Dispatch::new`].
    pub fn to_dispatch(&self) -> Result<Dispatch> {
        let args: Vec<Arg> = self
            .args()
            .iter()
            .map(|a| match a {
                ArgRef::Buffer(b, access) => Arg::Buffer((*b).clone(), *access),
                ArgRef::Scalar(s) => Arg::Scalar(*s),
            })
            .collect();
        Dispatch::new(self.kernel, args, self.grid)
    }
}

/// A borrowed view of one dispatch: of a [`Dispatch`] ([`Dispatch::as_view`]) or of a dispatch
/// inside a [`ComputeGraph`](super::ComputeGraph). Backends encode from it; fusion rules read it.
#[derive(Clone, Copy)]
pub struct DispatchRef<'a> {
    pub(super) kernel: KernelId,
    pub(super) grid: Grid,
    pub(super) op: OpKind,
    pub(super) args: &'a [Arg],
    /// The read ranges, then the write ranges, as indices into `table`.
    pub(super) ids: &'a [u32],
    /// The byte ranges `ids` name.
    pub(super) table: &'a [Range],
    /// How many of `ids` are reads.
    pub(super) n_reads: usize,
}

/// Some byte ranges of a dispatch (its reads, or its writes), named by index into a table of
/// ranges so that a graph stores each range once, however many dispatches touch it.
#[derive(Clone, Copy)]
pub struct Ranges<'a> {
    ids: &'a [u32],
    table: &'a [Range],
}

impl<'a> Ranges<'a> {
    /// The ranges `table[ids[0]]`, `table[ids[1]]`, ... (every id must index `table`).
    #[inline]
    pub(crate) fn new(ids: &'a [u32], table: &'a [Range]) -> Self {
        Ranges { ids, table }
    }

    /// Number of ranges.
    #[inline]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there is none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The range at `index`.
    #[inline]
    pub fn get(&self, index: usize) -> Option<Range> {
        self.ids.get(index).map(|&k| self.table[k as usize])
    }

    /// The first range.
    #[inline]
    pub fn first(&self) -> Option<Range> {
        self.get(0)
    }

    /// The ranges in order.
    #[inline]
    pub fn iter(&self) -> RangesIter<'a> {
        RangesIter {
            ids: self.ids.iter(),
            table: self.table,
        }
    }

    /// Whether `range` is one of them (equal, not merely overlapping).
    pub fn contains(&self, range: &Range) -> bool {
        self.iter().any(|r| r == *range)
    }

    /// The ranges, collected.
    pub fn to_vec(&self) -> Vec<Range> {
        self.iter().collect()
    }
}

impl<'a> IntoIterator for Ranges<'a> {
    type Item = Range;
    type IntoIter = RangesIter<'a>;

    #[inline]
    fn into_iter(self) -> RangesIter<'a> {
        self.iter()
    }
}

impl PartialEq for Ranges<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<[Range]> for Ranges<'_> {
    fn eq(&self, other: &[Range]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

impl<const N: usize> PartialEq<&[Range; N]> for Ranges<'_> {
    fn eq(&self, other: &&[Range; N]) -> bool {
        *self == other[..]
    }
}

impl std::fmt::Debug for Ranges<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The ranges of a [`Ranges`], in order.
#[derive(Clone)]
pub struct RangesIter<'a> {
    ids: std::slice::Iter<'a, u32>,
    table: &'a [Range],
}

impl Iterator for RangesIter<'_> {
    type Item = Range;

    #[inline]
    fn next(&mut self) -> Option<Range> {
        self.ids.next().map(|&k| self.table[k as usize])
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.ids.size_hint()
    }
}

impl DoubleEndedIterator for RangesIter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Range> {
        self.ids.next_back().map(|&k| self.table[k as usize])
    }
}

impl ExactSizeIterator for RangesIter<'_> {}

impl<'a> DispatchRef<'a> {
    /// The kernel.
    #[inline]
    pub fn kernel(&self) -> KernelId {
        self.kernel
    }

    /// The arguments, in kernel order.
    #[inline]
    pub fn args(&self) -> &'a [Arg] {
        self.args
    }

    /// Launch geometry.
    #[inline]
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// The op kind.
    #[inline]
    pub fn op(&self) -> OpKind {
        self.op
    }

    /// Byte ranges the dispatch reads.
    #[inline]
    pub fn reads(&self) -> Ranges<'a> {
        Ranges::new(&self.ids[..self.n_reads], self.table)
    }

    /// Byte ranges the dispatch writes.
    #[inline]
    pub fn writes(&self) -> Ranges<'a> {
        Ranges::new(&self.ids[self.n_reads..], self.table)
    }

    /// The buffer argument at `index`, if it is one.
    pub fn buffer_arg(&self, index: usize) -> Option<(&'a Buffer, Access)> {
        match self.args.get(index) {
            Some(Arg::Buffer(b, a)) => Some((b, *a)),
            _ => None,
        }
    }

    /// The buffer argument the kernel's declaration calls `name` (none for an untyped kernel).
    #[inline]
    pub fn buffer(&self, name: &str) -> Option<&'a Buffer> {
        self.buffer_arg(self.kernel.sig().index_of(name)?)
            .map(|(b, _)| b)
    }

    /// The scalar argument the kernel's declaration calls `name`.
    #[inline]
    pub fn scalar(&self, name: &str) -> Option<Scalar> {
        match self.args.get(self.kernel.sig().index_of(name)?) {
            Some(Arg::Scalar(s)) => Some(*s),
            _ => None,
        }
    }

    /// An owned copy (one reference per buffer argument).
    pub fn to_dispatch(&self) -> Dispatch {
        Dispatch::from_checked_parts(
            self.kernel,
            self.grid,
            self.op,
            self.args,
            self.reads(),
            self.writes(),
        )
    }
}

impl std::fmt::Debug for DispatchRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch")
            .field("kernel", &self.kernel)
            .field("op", &self.op)
            .field("grid", &self.grid)
            .field("args", &self.args)
            .field("reads", &self.reads())
            .field("writes", &self.writes())
            .finish()
    }
}
