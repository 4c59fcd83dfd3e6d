//! [`ComputeGraph`]: a recorded list of dispatches and barriers, stored flat so that recording a
//! step and running the passes over it touch a few arrays, and recording a step again into the
//! graph of the previous one takes no reference count.
//!
//! Storage: every dispatch is a header (kernel, grid, op kind, where its arguments and ranges
//! start) over shared argument and range arrays; the node order is a list of header indices
//! with a marker for barriers, so the passes move 4-byte indices, never dispatches.
//!
//! Views: the graph takes in each distinct buffer view once (one reference, kept until the graph
//! is dropped or lets go of its views) and gives it a small index; the index of every read and
//! write range is stored beside the range, so the passes never hash a range. A view remembers the
//! last graph that took it in and its index there (one atomic word in the view, see
//! [`Buffer::graph_stamp`]), so taking in a view seen before is one load.
//!
//! Arguments: every buffer argument in the argument array is a reference of its own (one
//! reference count). [`clear`](ComputeGraph::clear) keeps the arguments of the last recording,
//! and recording writes each argument over the one at its position, keeping that one when it is
//! the same (same view and access, by index): a step recorded again over the same buffers takes
//! no reference count. A new graph takes one per buffer argument.

use crate::kernels::{KernelId, KernelSig};
use std::sync::atomic::Ordering;

use super::borrowed::{ArgRef, DispatchRef, DispatchSpec, SPEC_ARGS};
use super::dispatch::{too_many_ranges, Dispatch, Grid, Range, MAX_RANGES};
mod args;
mod ids;
mod recording;
mod small;
mod spare;

use super::footprint::Overlaps;
use crate::error::Result;
use crate::kernels::{Access, OpKind, Scalar};
use crate::memory::Buffer;
use recording::{
    fresh_stamp, mark_written, overlapping_write, same_view_twice, take_in, written_overlap,
    Writes, WrittenFilter, INDEX_BITS, INDEX_MASK, MARKED,
};

/// The node-order entry of a barrier.
const BARRIER: u32 = u32::MAX;

/// One argument as [`ComputeGraph::record_args`] takes it: a buffer, a view the graph holds
/// already (by index), or a scalar.
#[derive(Clone, Copy)]
enum Slot<'b> {
    Buffer(&'b Buffer, Access),
    View(u32, Access),
    Scalar(Scalar),
}

impl<'b> From<ArgRef<'b>> for Slot<'b> {
    #[inline(always)]
    fn from(arg: ArgRef<'b>) -> Self {
        match arg {
            ArgRef::Buffer(b, access) => Slot::Buffer(b, access),
            ArgRef::Scalar(s) => Slot::Scalar(s),
        }
    }
}

/// A placeholder view index in a [`Resolved`] slot: the next of its foreign buffers.
const NOT_TAKEN_IN: u32 = u32::MAX;

/// An argument of a [`Resolved`] dispatch: a view by index, or a scalar.
#[derive(Clone, Copy)]
enum Fixed {
    View(u32, Access),
    Scalar(Scalar),
}

impl From<Fixed> for Slot<'_> {
    #[inline(always)]
    fn from(f: Fixed) -> Self {
        match f {
            Fixed::View(v, access) => Slot::View(v, access),
            Fixed::Scalar(s) => Slot::Scalar(s),
        }
    }
}

/// The kernel of an empty [`Resolved`].
static NO_KERNEL: KernelSig = KernelSig::untyped("", OpKind::Copy);

/// A [`DispatchSpec`] whose buffers the graph holds are named by view index (others are cloned
/// into `foreign`), so it no longer borrows the graph.
pub(crate) struct Resolved {
    kernel: KernelId,
    grid: Grid,
    op: OpKind,
    len: usize,
    slots: [Fixed; SPEC_ARGS],
    foreign: Vec<Buffer>,
}

impl Resolved {
    /// An empty one, for [`ComputeGraph::resolve_into`] to fill.
    pub(crate) fn new() -> Self {
        Resolved {
            kernel: KernelId::of(&NO_KERNEL),
            grid: Grid::new(1, 1),
            op: OpKind::Copy,
            len: 0,
            slots: [Fixed::Scalar(Scalar::U32(0)); SPEC_ARGS],
            foreign: Vec::new(),
        }
    }
}

/// What the encoders need of one dispatch beyond its ranges: kernel, grid and where its
/// arguments lie in the shared argument array.
#[derive(Debug, Clone, Copy)]
struct Header {
    kernel: KernelId,
    grid: Grid,
    args: u32,
    n_args: u32,
}

/// What the passes read of one dispatch, kept apart from its [`Header`] so that their scans
/// over many dispatches touch 16 bytes each: its op kind and where its view indices lie in the
/// shared range array (reads in `start..mid`, writes in `mid..end`).
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    mid: u32,
    end: u32,
    op: OpKind,
    /// `op.is_reorderable()`, kept so the passes need not look it up.
    movable: bool,
}

/// One node of a recorded graph, as the graph hands it out.
#[derive(Debug, Clone, Copy)]
pub enum Node<'g> {
    /// A kernel launch.
    Dispatch(DispatchRef<'g>),
    /// Everything before must finish before anything after starts.
    Barrier,
}

impl<'g> Node<'g> {
    /// The dispatch, if this node is one.
    pub fn as_dispatch(&self) -> Option<DispatchRef<'g>> {
        match self {
            Node::Dispatch(d) => Some(*d),
            Node::Barrier => None,
        }
    }
}

/// A recorded sequence of dispatches and barriers: what recorded mode produces and the passes
/// transform.
pub struct ComputeGraph {
    stamp: u64,
    a: Arrays,
    /// The overlaps of the views, as last computed, and what they were computed for.
    overlaps: Option<KeptOverlaps>,
    /// Allocations some dispatch ever wrote, by id modulo [`WRITTEN_BITS`] (a superset once
    /// fusion drops writes or the graph is cleared: it only keeps reads the passes could have
    /// left out).
    written: [u64; WRITTEN_BITS / 64],
    /// Bumped whenever `written` gains a bit.
    written_version: u64,
}

/// [`Overlaps`] of a graph's views, valid while the graph has the same stamp, the same number
/// of views (views are only ever appended, until a reset takes a new stamp) and the same
/// written-allocation filter (which only ever gains bits, until that reset).
struct KeptOverlaps {
    stamp: u64,
    views: usize,
    written_version: u64,
    overlaps: Overlaps,
}

/// The kept overlaps in `kept` if they were computed for a graph with this `stamp`, number of
/// `views` and `written_version`.
#[inline]
fn valid_overlaps(
    kept: &Option<KeptOverlaps>,
    stamp: u64,
    views: usize,
    written_version: u64,
) -> Option<&Overlaps> {
    let k = kept.as_ref()?;
    let same = k.stamp == stamp && k.views == views && k.written_version == written_version;
    same.then_some(&k.overlaps)
}

/// A graph's storage.
#[derive(Default)]
struct Arrays {
    /// One owned reference per view taken in; a view's index is its position here.
    views: Vec<Buffer>,
    /// The byte range of each view.
    view_ranges: Vec<Range>,
    headers: Vec<Header>,
    /// The [`Span`] of every header, by the same index.
    spans: Vec<Span>,
    /// Arguments of every header (and those of the last recording, kept).
    args: args::Args,
    /// The reads, then the writes, of every header, as view indices (with room past them).
    range_views: ids::Ids,
    /// The nodes in order: header indices and [`BARRIER`]s.
    order: Vec<u32>,
    /// Byte ranges whose values nobody reads after the graph ([`ComputeGraph::mark_scratch`]).
    scratch: Vec<Range>,
}

/// Bits of [`ComputeGraph`]'s written-allocation filter.
pub(crate) const WRITTEN_BITS: usize = 4096;

impl Default for ComputeGraph {
    fn default() -> Self {
        ComputeGraph::with_capacity(0)
    }
}

impl Clone for ComputeGraph {
    fn clone(&self) -> Self {
        // The copy keeps its own reference to every view and argument (not those past the
        // recorded ones); it takes a stamp of its own (views still carrying this graph's stamp
        // are taken in again by the copy, under new indices).
        ComputeGraph {
            stamp: fresh_stamp(),
            a: Arrays {
                views: self.a.views.clone(),
                view_ranges: self.a.view_ranges.clone(),
                headers: self.a.headers.clone(),
                spans: self.a.spans.clone(),
                args: self.a.args.clone(),
                range_views: self.a.range_views.clone(),
                order: self.a.order.clone(),
                scratch: self.a.scratch.clone(),
            },
            written: self.written,
            written_version: 0,
            // The copy has a stamp of its own; it computes its overlaps when asked.
            overlaps: None,
        }
    }
}

impl Drop for ComputeGraph {
    fn drop(&mut self) {
        spare::keep(self);
    }
}

impl std::fmt::Debug for ComputeGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.nodes()).finish()
    }
}

impl ComputeGraph {
    /// An empty graph.
    pub fn new() -> Self {
        ComputeGraph::default()
    }

    /// An empty graph with room for `dispatches` dispatches of a few arguments each. The arrays
    /// of the last graph dropped on this thread are used again when there are any.
    pub fn with_capacity(dispatches: usize) -> Self {
        let mut g = ComputeGraph {
            stamp: fresh_stamp(),
            a: spare::take(),
            written: [0; WRITTEN_BITS / 64],
            written_version: 0,
            overlaps: None,
        };
        // Room for a tenth more: fused dispatches are appended after the recorded ones.
        let with_fused = dispatches + dispatches / 10;
        g.a.headers.reserve(with_fused);
        g.a.spans.reserve(with_fused);
        g.a.args.reserve(4 * with_fused);
        g.a.range_views.reserve(4 * with_fused);
        // A barrier may follow every dispatch.
        g.a.order.reserve(2 * dispatches);
        g
    }

    /// Appends a dispatch of `kernel` over `args`, deriving its read and write ranges. The
    /// arguments must fit the kernel's declared parameters, and a written argument may not
    /// overlap any other buffer argument of the same dispatch (an in-place update is one
    /// `ReadWrite` argument); otherwise nothing is appended and the error says why.
    #[inline]
    pub fn record(&mut self, kernel: KernelId, args: &[ArgRef<'_>], grid: Grid) -> Result<()> {
        let op = kernel.op();
        if self.record_small(kernel, args, grid, op) {
            return Ok(());
        }
        kernel.sig().check(args.iter().map(ArgRef::shape))?;
        self.record_args(kernel, args.iter().map(|&a| Slot::from(a)), grid, op)
    }

    /// Appends a dispatch (its checks already ran when it was built).
    pub fn push(&mut self, dispatch: Dispatch) {
        self.push_ref(dispatch.as_view());
    }

    /// Appends a copy of a dispatch viewed elsewhere (in another graph, or a [`Dispatch`]).
    pub fn push_ref(&mut self, dispatch: DispatchRef<'_>) {
        let args = dispatch.args().iter().map(|a| Slot::from(ArgRef::from(a)));
        // A dispatch view has passed the same checks, so this cannot fail; if it did, the
        // dispatch is left out rather than half-recorded.
        let _ = self.record_args(dispatch.kernel(), args, dispatch.grid(), dispatch.op());
    }

    /// Appends a barrier.
    pub fn push_barrier(&mut self) {
        self.a.order.push(BARRIER);
    }

    #[inline]
    fn record_args<'b>(
        &mut self,
        kernel: KernelId,
        args: impl ExactSizeIterator<Item = Slot<'b>>,
        grid: Grid,
        op: OpKind,
    ) -> Result<()> {
        let n = args.len();
        let r0 = self.a.range_views.len();
        self.a.args.reserve(n);
        self.a.range_views.reserve(2 * n);
        match self.fill_args(kernel, args) {
            Ok((count, n_reads, n_ranges)) => {
                let a0 = self.a.args.len();
                self.a.args.commit(count);
                self.a.order.push(self.a.headers.len() as u32);
                self.a.headers.push(Header {
                    kernel,
                    grid,
                    args: a0 as u32,
                    n_args: count as u32,
                });
                self.a.spans.push(Span {
                    start: r0 as u32,
                    mid: (r0 + n_reads) as u32,
                    end: (r0 + n_ranges) as u32,
                    op,
                    movable: op.is_reorderable(),
                });
                Ok(())
            }
            Err(e) => {
                // The view indices appended go; the arguments written stay past the recorded
                // ones, kept like any others.
                self.a.range_views.truncate(r0);
                Err(e)
            }
        }
    }

    /// Writes `args` past the recorded arguments and their view indices (reads, then writes)
    /// after the recorded ones, and checks them; returns the number of arguments, of reads and
    /// of ranges. The caller commits them, or on an error drops the view indices appended.
    #[inline(always)]
    fn fill_args<'b>(
        &mut self,
        kernel: KernelId,
        args: impl ExactSizeIterator<Item = Slot<'b>>,
    ) -> Result<(usize, usize, usize)> {
        let Arrays {
            views,
            view_ranges,
            args: all_args,
            range_views,
            ..
        } = &mut self.a;
        let a0 = all_args.len();
        let r0 = range_views.len();
        // The reads are appended to `range_views` as they come; the writes (view, and the
        // position of the same argument's read, or `u32::MAX`) wait here, a few on the stack.
        let mut writes = Writes::new();
        let mut n_reads = 0;
        let mut count = 0;
        for (pos, arg) in args.enumerate() {
            count = pos + 1;
            let (v, access) = match arg {
                Slot::Buffer(b, access) => {
                    // The index, with the view's mark (kept with its write, below).
                    let v = take_in(self.stamp, views, view_ranges, b)?;
                    all_args.put_buffer(a0 + pos, v & INDEX_MASK as u32, b, access);
                    (v, access)
                }
                Slot::View(v, access) => {
                    let index = v & INDEX_MASK as u32;
                    all_args.put_buffer(a0 + pos, index, &views[index as usize], access);
                    (v, access)
                }
                Slot::Scalar(s) => {
                    all_args.put_scalar(a0 + pos, s);
                    continue;
                }
            };
            let mut read_at = u32::MAX;
            if access.reads() {
                range_views.push(v & INDEX_MASK as u32);
                read_at = n_reads as u32;
                n_reads += 1;
            }
            if access.writes() {
                writes.push(v, read_at);
            }
        }
        let writes = writes.as_slice();
        let n_ranges = n_reads + writes.len();
        if n_ranges > MAX_RANGES {
            return Err(too_many_ranges(kernel, n_ranges));
        }
        if !writes.is_empty() {
            let reads = range_views.get(r0..range_views.len());
            // With the overlaps kept from an earlier recording over these same views (none
            // taken in since), a written view that overlaps no other view can only meet itself.
            let kept = valid_overlaps(
                &self.overlaps,
                self.stamp,
                views.len(),
                self.written_version,
            );
            let hit = match kept {
                Some(o) if writes.iter().all(|&(w, _)| o.alone(w & INDEX_MASK as u32)) => {
                    same_view_twice(reads, writes)
                }
                _ => written_overlap(view_ranges, reads, writes),
            };
            if let Some(hit) = hit {
                return Err(overlapping_write(kernel, all_args.get(a0..a0 + count), hit));
            }
            for &(marked, _) in writes {
                let v = marked & INDEX_MASK as u32;
                range_views.push(v);
                if marked & MARKED != 0 {
                    continue;
                }
                let filter = WrittenFilter {
                    bits: &mut self.written,
                    version: &mut self.written_version,
                };
                mark_written(filter, self.stamp, views, view_ranges, v);
            }
        }
        Ok((count, n_reads, n_ranges))
    }

    /// The dispatch of header `h`.
    #[inline]
    pub(crate) fn dispatch_at(&self, h: u32) -> DispatchRef<'_> {
        let hd = &self.a.headers[h as usize];
        let sp = &self.a.spans[h as usize];
        let args = self
            .a
            .args
            .get(hd.args as usize..(hd.args + hd.n_args) as usize);
        DispatchRef {
            kernel: hd.kernel,
            grid: hd.grid,
            op: sp.op,
            args,
            ids: self.a.range_views.get(sp.start as usize..sp.end as usize),
            table: &self.a.view_ranges,
            n_reads: (sp.mid - sp.start) as usize,
        }
    }

    /// The view indices of header `h`'s reads and of its writes.
    #[inline]
    pub(crate) fn ids_at(&self, h: u32) -> (&[u32], &[u32]) {
        let sp = &self.a.spans[h as usize];
        let all = self.a.range_views.get(sp.start as usize..sp.end as usize);
        all.split_at((sp.mid - sp.start) as usize)
    }

    /// The op kind of header `h`.
    #[inline]
    pub(crate) fn op_at(&self, h: u32) -> OpKind {
        self.a.spans[h as usize].op
    }

    /// Whether the reorder pass may move header `h`, and where its read and write view indices
    /// lie in [`all_range_views`](Self::all_range_views): first read, first write, end.
    #[inline]
    pub(crate) fn span_at(&self, h: u32) -> (bool, [u32; 3]) {
        let sp = &self.a.spans[h as usize];
        (sp.movable, [sp.start, sp.mid, sp.end])
    }

    /// The view index of every recorded range.
    #[inline]
    pub(crate) fn all_range_views(&self) -> &[u32] {
        self.a.range_views.as_slice()
    }

    /// Whether some dispatch ever recorded wrote allocation `alloc` (may say yes for one that
    /// was not written).
    #[inline]
    pub(crate) fn maybe_written(&self, alloc: crate::memory::AllocId) -> bool {
        let bit = alloc.0 as usize % WRITTEN_BITS;
        self.written[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// Computes the overlaps of the views unless the graph kept them for its current views (a
    /// step recorded again after [`clear`](Self::clear) over the same views keeps them).
    pub(crate) fn refresh_overlaps(&mut self) {
        if self.kept_overlaps().is_some() {
            return;
        }
        let overlaps = Overlaps::of(&self.a.view_ranges, |r| self.maybe_written(r.alloc));
        self.overlaps = Some(KeptOverlaps {
            stamp: self.stamp,
            views: self.a.views.len(),
            written_version: self.written_version,
            overlaps,
        });
    }

    /// The overlaps of the views, if the graph has them for its current views.
    #[inline]
    pub(crate) fn kept_overlaps(&self) -> Option<&Overlaps> {
        valid_overlaps(
            &self.overlaps,
            self.stamp,
            self.a.views.len(),
            self.written_version,
        )
    }

    /// The byte range of every view, by index.
    #[inline]
    pub(crate) fn view_ranges(&self) -> &[Range] {
        &self.a.view_ranges
    }

    /// The node order (header indices, barriers as `u32::MAX`), for the passes.
    pub(crate) fn order_mut(&mut self) -> &mut Vec<u32> {
        &mut self.a.order
    }

    /// The node order.
    #[inline]
    pub(crate) fn order(&self) -> &[u32] {
        &self.a.order
    }

    /// The order entry of a barrier.
    pub(crate) const BARRIER: u32 = BARRIER;

    /// Drops the barriers from the node order.
    pub(crate) fn drop_barriers(&mut self) {
        self.a.order.retain(|&e| e != BARRIER);
    }

    /// The index of `b`'s view if the graph holds it.
    #[inline]
    fn view_of(&self, b: &Buffer) -> Option<u32> {
        let word = b.graph_stamp().load(Ordering::Relaxed);
        (self.stamp != 0 && word >> INDEX_BITS == self.stamp).then_some((word & INDEX_MASK) as u32)
    }

    /// Fills `r` with `spec`, its buffers named by view index where the graph holds them, so
    /// that it can be recorded ([`add_detached`](Self::add_detached)) once the borrows of the
    /// graph end. One `r` serves a whole pass.
    pub(crate) fn resolve_into(&self, spec: &DispatchSpec<'_>, r: &mut Resolved) {
        r.kernel = spec.kernel();
        r.grid = spec.grid();
        r.op = spec.op();
        r.len = spec.args().len();
        r.foreign.clear();
        for (slot, arg) in r.slots.iter_mut().zip(spec.args()) {
            *slot = match *arg {
                ArgRef::Buffer(b, access) => match self.view_of(b) {
                    Some(v) => Fixed::View(v, access),
                    None => {
                        // Rare: a rule names a buffer no recorded dispatch uses.
                        r.foreign.push(b.clone());
                        Fixed::View(NOT_TAKEN_IN, access)
                    }
                },
                ArgRef::Scalar(s) => Fixed::Scalar(s),
            };
        }
    }

    /// Records a resolved dispatch as a header outside the node order and returns its index;
    /// an error (a written argument overlapping another) records nothing.
    pub(crate) fn add_detached(&mut self, r: &Resolved) -> Result<u32> {
        let before = self.a.order.len();
        if r.foreign.is_empty() {
            let slots = r.slots[..r.len].iter().map(|&f| Slot::from(f));
            self.record_args(r.kernel, slots, r.grid, r.op)?;
        } else {
            let mut slots = r.slots;
            let mut foreign = r.foreign.iter();
            for slot in &mut slots[..r.len] {
                if let Fixed::View(v @ NOT_TAKEN_IN, _) = slot {
                    if let Some(b) = foreign.next() {
                        *v = take_in(self.stamp, &mut self.a.views, &mut self.a.view_ranges, b)?;
                    }
                }
            }
            let slots = slots[..r.len].iter().map(|&f| Slot::from(f));
            self.record_args(r.kernel, slots, r.grid, r.op)?;
        }
        // Recording placed it at the end of the order; take it out again.
        self.a.order.truncate(before);
        Ok((self.a.headers.len() - 1) as u32)
    }

    /// Empties the graph for recording again, keeping the buffer views it holds (and their
    /// indices) and the arguments it recorded, so that a step recorded again over the same
    /// buffers takes no reference count.
    ///
    /// The kept views stay alive until the graph is dropped. So that a caller recording new
    /// views at every step does not pile them up, the graph lets go of all of them (and of the
    /// kept arguments) instead when it holds more than twice as many as its last recording named
    /// ranges (plus 64).
    pub fn clear(&mut self) {
        let named = self.a.range_views.len();
        self.a.args.clear();
        self.a.headers.clear();
        self.a.spans.clear();
        self.a.range_views.clear();
        self.a.order.clear();
        self.a.scratch.clear();
        if self.a.views.len() > 2 * named + 64 {
            self.a.args.reset();
            self.a.views.clear();
            self.a.view_ranges.clear();
            self.written = [0; WRITTEN_BITS / 64];
            // The views that carry the old stamp must not be taken for the new ones.
            self.stamp = fresh_stamp();
        }
    }

    /// Declares that nobody reads the bytes of `buf` after the graph has run (an activation, not
    /// an output): a value the graph leaves there is dead, so fusion may drop the write of an
    /// intermediate that nothing in the graph reads again. Without it, whatever the graph leaves
    /// in a buffer counts as read by the caller.
    pub fn mark_scratch(&mut self, buf: &Buffer) {
        let r = Range::of(buf);
        if !self.a.scratch.iter().any(|s| s.covers(&r)) {
            self.a.scratch.push(r);
        }
    }

    /// Whether every byte of `range` lies in one range marked as scratch.
    pub(crate) fn is_scratch(&self, range: &Range) -> bool {
        self.a.scratch.iter().any(|s| s.covers(range))
    }

    /// Number of nodes (dispatches and barriers).
    pub fn len(&self) -> usize {
        self.a.order.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.a.order.is_empty()
    }

    /// The nodes, in order.
    pub fn nodes(&self) -> Nodes<'_> {
        Nodes {
            graph: self,
            order: self.a.order.iter(),
        }
    }

    /// The nodes at positions `range`, in order.
    pub fn nodes_in(&self, range: std::ops::Range<usize>) -> Nodes<'_> {
        Nodes {
            graph: self,
            order: self.a.order[range].iter(),
        }
    }

    /// The dispatches, in order, without barriers.
    pub fn dispatches(&self) -> impl DoubleEndedIterator<Item = DispatchRef<'_>> + Clone + '_ {
        self.a
            .order
            .iter()
            .filter(|&&e| e != BARRIER)
            .map(|&e| self.dispatch_at(e))
    }

    /// Number of dispatch nodes.
    pub fn dispatch_count(&self) -> usize {
        self.a.order.len() - self.barrier_count()
    }

    /// Number of barrier nodes.
    pub fn barrier_count(&self) -> usize {
        self.a.order.iter().filter(|&&e| e == BARRIER).count()
    }

    /// Number of distinct buffer views the graph keeps.
    pub fn view_count(&self) -> usize {
        self.a.views.len()
    }

    /// Sizes of the concurrent groups (dispatches between barriers), in order.
    pub fn group_sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut current = 0;
        for &e in &self.a.order {
            if e == BARRIER {
                if current > 0 {
                    sizes.push(current);
                }
                current = 0;
            } else {
                current += 1;
            }
        }
        if current > 0 {
            sizes.push(current);
        }
        sizes
    }
}

/// The nodes of a [`ComputeGraph`], in order.
#[derive(Clone)]
pub struct Nodes<'g> {
    graph: &'g ComputeGraph,
    order: std::slice::Iter<'g, u32>,
}

impl<'g> Iterator for Nodes<'g> {
    type Item = Node<'g>;

    #[inline]
    fn next(&mut self) -> Option<Node<'g>> {
        let &e = self.order.next()?;
        Some(node_of(self.graph, e))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.order.size_hint()
    }
}

impl DoubleEndedIterator for Nodes<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let &e = self.order.next_back()?;
        Some(node_of(self.graph, e))
    }
}

impl ExactSizeIterator for Nodes<'_> {}

#[inline]
fn node_of(graph: &ComputeGraph, entry: u32) -> Node<'_> {
    if entry == BARRIER {
        Node::Barrier
    } else {
        Node::Dispatch(graph.dispatch_at(entry))
    }
}

#[cfg(test)]
#[path = "compute_graph_tests.rs"]
mod tests;
