//! The common case of [`ComputeGraph::record`]: a dispatch of a few arguments, none of them a
//! written view that overlaps another argument. Everything is written once, in place, past the
//! arrays' lengths, and committed only when the dispatch is known to be valid. A dispatch that
//! fails the check (or has many arguments) is left to the general path, which builds the error.

use crate::kernels::KernelId;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;

use super::recording::{
    mark_written, take_in_unseen, WrittenFilter, INDEX_BITS, INDEX_MASK, MARKED,
};
use super::{valid_overlaps, ComputeGraph, Header, Span};
use crate::graph::borrowed::ArgRef;
use crate::graph::dispatch::{Arg, Grid, Range};
use crate::kernels::{Access, OpKind};

/// The most arguments the small path takes.
const SMALL_ARGS: usize = 8;

impl ComputeGraph {
    /// Records `args` if they are few, fit the kernel's declaration and no written one overlaps
    /// another; returns whether it did. Returning `false` leaves the graph as it was, but for
    /// views it took in.
    #[inline]
    pub(super) fn record_small(
        &mut self,
        kernel: KernelId,
        args: &[ArgRef<'_>],
        grid: Grid,
        op: OpKind,
    ) -> bool {
        let n = args.len();
        let stamp = self.stamp;
        // The declaration is checked argument by argument on the way; a misfit leaves the error
        // to the general path.
        let params = kernel.sig().params();
        if n > SMALL_ARGS || stamp == 0 || params.is_some_and(|p| p.len() != n) {
            return false;
        }
        let a = &mut self.a;
        a.args.reserve(n);
        a.range_views.reserve(2 * n);
        let (a0, r0) = (a.args.len(), a.range_views.len());
        let args_out = &mut a.args.spare_capacity_mut()[..n];
        // The reads go here as they come; the writes wait on the stack and follow them.
        let ids_out = &mut a.range_views.spare_capacity_mut()[..2 * n];
        let (views, view_ranges) = (&mut a.views, &mut a.view_ranges);
        let mut writes = [0u32; SMALL_ARGS];
        let mut read_too = [false; SMALL_ARGS];
        let (mut n_reads, mut n_writes) = (0, 0);
        let mut unmarked = false;
        for (i, (slot, arg)) in args_out.iter_mut().zip(args).enumerate() {
            if params.is_some_and(|p| !p[i].kind.accepts(arg.shape())) {
                return false;
            }
            let (b, access) = match *arg {
                ArgRef::Buffer(b, access) => (b, access),
                ArgRef::Scalar(s) => {
                    slot.write(ManuallyDrop::new(Arg::Scalar(s)));
                    continue;
                }
            };
            let mut word = b.graph_stamp().load(Ordering::Relaxed);
            if word >> INDEX_BITS != stamp {
                match take_in_cold(stamp, views, view_ranges, b) {
                    Some(w) => word = w,
                    None => return false,
                }
            }
            let v = word as u32 & INDEX_MASK as u32;
            // SAFETY: a copy that owns nothing: the graph holds a reference to the same view
            // for its life, and the copy is never dropped.
            slot.write(ManuallyDrop::new(Arg::Buffer(
                unsafe { std::ptr::read(b) },
                access,
            )));
            if access != Access::Write {
                ids_out[n_reads].write(v);
                n_reads += 1;
            }
            if access != Access::Read {
                // Whether its allocation is not counted as written yet.
                unmarked |= word as u32 & MARKED == 0;
                writes[n_writes] = v;
                read_too[n_writes] = access == Access::ReadWrite;
                n_writes += 1;
            }
        }
        let writes = &writes[..n_writes];
        if n_writes > 0 {
            // SAFETY: the first `n_reads` slots were written above.
            let reads = unsafe { &*(&ids_out[..n_reads] as *const _ as *const [u32]) };
            if !self_clear(
                &self.overlaps,
                (stamp, views.len(), self.written_version),
                view_ranges,
                reads,
                writes,
                &read_too,
            ) {
                return false;
            }
            for (slot, &w) in ids_out[n_reads..].iter_mut().zip(writes) {
                slot.write(w);
            }
        }
        if unmarked {
            for &v in writes {
                let filter = WrittenFilter {
                    bits: &mut self.written,
                    version: &mut self.written_version,
                };
                mark_written(filter, stamp, views, view_ranges, v);
            }
        }
        let n_ranges = n_reads + n_writes;
        // SAFETY: the `n` argument slots and `n_ranges` range slots past the lengths were written
        // above (every argument position once; reads, then writes, without gaps).
        unsafe {
            a.args.set_len(a0 + n);
            a.range_views.set_len(r0 + n_ranges);
        }
        a.order.push(a.headers.len() as u32);
        a.headers.push(Header {
            kernel,
            grid,
            args: a0 as u32,
            n_args: n as u32,
        });
        a.spans.push(Span {
            start: r0 as u32,
            mid: (r0 + n_reads) as u32,
            end: (r0 + n_ranges) as u32,
            op,
            movable: op.is_reorderable(),
        });
        true
    }
}

/// Takes in view `b`, which the graph (with `stamp`, its views and their ranges) does not hold
/// yet, and returns its stamp word as the graph would have left it: its index, not marked.
/// `None` when the graph holds all the views it can (the general path reports it).
#[cold]
#[inline(never)]
fn take_in_cold(
    stamp: u64,
    views: &mut Vec<crate::memory::Buffer>,
    view_ranges: &mut Vec<Range>,
    b: &crate::memory::Buffer,
) -> Option<u64> {
    let v = take_in_unseen(stamp, views, view_ranges, b).ok()?;
    Some(stamp << INDEX_BITS | u64::from(v))
}

/// Whether no written view overlaps another buffer argument of the dispatch: by index when the
/// kept overlaps (valid for the graph's `(stamp, views, written_version)`) say each written view
/// overlaps no other view, else by byte range. `read_too[i]`: the `i`th write's argument also
/// reads it (its own read is among `reads`).
///
/// The general path's check (`written_overlap`, `same_view_twice`) asks the same question of
/// writes kept with their read's position; one generic check for both paths measured about 1 us
/// slower per decode step. The random-argument test of `compute_graph_tests.rs` holds both
/// against [`Dispatch::new`](crate::graph::Dispatch::new).
#[inline(always)]
fn self_clear(
    kept: &Option<super::KeptOverlaps>,
    (stamp, views, version): (u64, usize, u64),
    ranges: &[Range],
    reads: &[u32],
    writes: &[u32],
    read_too: &[bool; SMALL_ARGS],
) -> bool {
    match valid_overlaps(kept, stamp, views, version) {
        Some(o) if writes.iter().all(|&w| o.alone(w)) => {
            writes.iter().enumerate().all(|(i, &w)| {
                !more_than(read_too[i], reads, |r| r == w)
                    && !writes.iter().enumerate().any(|(j, &x)| j != i && x == w)
            })
        }
        // One write (the common case): its range against each read.
        _ if writes.len() == 1 => {
            let mine = &ranges[writes[0] as usize];
            // An empty view overlaps nothing, its own read included.
            !more_than(read_too[0], reads, |r| mine.overlaps(&ranges[r as usize]))
        }
        _ => writes.iter().enumerate().all(|(i, &w)| {
            let mine = &ranges[w as usize];
            // An empty view overlaps nothing, its own read included.
            !more_than(read_too[i], reads, |r| mine.overlaps(&ranges[r as usize]))
                && !writes
                    .iter()
                    .enumerate()
                    .any(|(j, &x)| j != i && mine.overlaps(&ranges[x as usize]))
        }),
    }
}

/// Whether more of `reads` than one (if `own`: a read-write argument's own read) or none meet
/// `hit`.
#[inline(always)]
fn more_than(own: bool, reads: &[u32], hit: impl Fn(u32) -> bool) -> bool {
    let mut allowed = own;
    for &r in reads {
        if hit(r) {
            if !allowed {
                return true;
            }
            allowed = false;
        }
    }
    false
}
