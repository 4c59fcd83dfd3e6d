//! The common case of [`ComputeGraph::record`]: a dispatch of a few arguments, none of them a
//! written view that overlaps another argument. The view indices and the arguments' keys are
//! gathered on the stack, and written to the graph only when the dispatch is known to be valid. A
//! dispatch that fails the check (or has many arguments) is left to the general path, which
//! builds the error.

use crate::kernels::KernelId;
use std::sync::atomic::Ordering;

use super::args::{buffer_key, scalar_key};
use super::ids::ROOM;
use super::recording::{
    mark_written, take_in_unseen, WrittenFilter, INDEX_BITS, INDEX_MASK, MARKED,
};
use super::{valid_overlaps, ComputeGraph, Header, Span};
use crate::graph::borrowed::ArgRef;
use crate::graph::dispatch::{Grid, Range};
use crate::kernels::{Access, OpKind};

/// The most arguments the small path takes.
const SMALL_ARGS: usize = 8;

// A dispatch's reads, then its writes, fit one chunk of view indices.
const _: () = assert!(ROOM >= 2 * SMALL_ARGS);

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
        let a0 = a.args.len();
        let (views, view_ranges) = (&mut a.views, &mut a.view_ranges);
        // The view indices of the reads go past the recorded ones as they come; those of the
        // writes wait here and follow them.
        let ids = a.range_views.room();
        let mut write_ids = [0u32; SMALL_ARGS];
        let mut keys = [0u64; SMALL_ARGS];
        let mut read_too = [false; SMALL_ARGS];
        let (mut n_reads, mut n_writes) = (0, 0);
        let mut unmarked = false;
        for (i, arg) in args.iter().enumerate() {
            if params.is_some_and(|p| !p[i].kind.accepts(arg.shape())) {
                return false;
            }
            let (b, access) = match *arg {
                ArgRef::Buffer(b, access) => (b, access),
                ArgRef::Scalar(s) => {
                    keys[i] = scalar_key(s);
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
            keys[i] = buffer_key(v, access);
            if access != Access::Write {
                ids[n_reads] = v;
                n_reads += 1;
            }
            if access != Access::Read {
                // Whether its allocation is not counted as written yet.
                unmarked |= word as u32 & MARKED == 0;
                write_ids[n_writes] = v;
                read_too[n_writes] = access == Access::ReadWrite;
                n_writes += 1;
            }
        }
        let writes = &write_ids[..n_writes];
        if n_writes > 0
            && !self_clear(
                &self.overlaps,
                (stamp, views.len(), self.written_version),
                view_ranges,
                &ids[..n_reads],
                writes,
                &read_too,
            )
        {
            return false;
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
        a.args.put_all(args, &keys[..n]);
        a.args.commit(n);
        for (slot, &w) in ids[n_reads..].iter_mut().zip(writes) {
            *slot = w;
        }
        let n_ranges = n_reads + n_writes;
        let r0 = a.range_views.len();
        a.range_views.commit(n_ranges);
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
