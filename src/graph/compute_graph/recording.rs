//! What [`ComputeGraph::record_args`](super::ComputeGraph) does per argument: taking a view in
//! by the stamp word it carries, collecting the written views of one dispatch, and checking that
//! no written argument overlaps another argument of the same dispatch.

use crate::kernels::KernelId;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::graph::dispatch::{Arg, Range};
use crate::kernels::Access;
use crate::memory::Buffer;

/// Bits of a view's stamp word that hold what the graph knows of the view; the rest is the
/// graph's stamp. They are [`MARKED`] and the view's index in the graph.
pub(super) const INDEX_BITS: u32 = 20;
/// Set in a view's stamp word once the graph has counted the view's allocation as written (in
/// its written-allocation filter), so later writes of the view skip that work.
pub(super) const MARKED: u32 = 1 << (INDEX_BITS - 1);
/// The index bits of a view's stamp word.
pub(super) const INDEX_MASK: u64 = MARKED as u64 - 1;

/// The written views of one dispatch being recorded (index and [`MARKED`] bit), each with the
/// position of the same argument's read among the dispatch's reads (`u32::MAX`: write only); a
/// few on the stack.
pub(super) struct Writes {
    len: usize,
    local: [(u32, u32); Writes::LOCAL],
    spilled: Vec<(u32, u32)>,
}

impl Writes {
    const LOCAL: usize = 4;

    #[inline(always)]
    pub(super) fn new() -> Self {
        Writes {
            len: 0,
            local: [(0, 0); Writes::LOCAL],
            spilled: Vec::new(),
        }
    }

    #[inline(always)]
    pub(super) fn push(&mut self, view: u32, read_at: u32) {
        if self.len < Writes::LOCAL {
            self.local[self.len] = (view, read_at);
        } else {
            if self.len == Writes::LOCAL {
                self.spilled.extend_from_slice(&self.local);
            }
            self.spilled.push((view, read_at));
        }
        self.len += 1;
    }

    #[inline(always)]
    pub(super) fn as_slice(&self) -> &[(u32, u32)] {
        if self.len <= Writes::LOCAL {
            &self.local[..self.len]
        } else {
            &self.spilled
        }
    }
}

/// The first written view (as an index into `writes`, whose views carry their [`MARKED`] bit)
/// that overlaps another buffer argument of the same dispatch: a read of another argument, or
/// another write.
#[inline]
pub(super) fn written_overlap(
    view_ranges: &[Range],
    reads: &[u32],
    writes: &[(u32, u32)],
) -> Option<usize> {
    for (i, &(w, own_read)) in writes.iter().enumerate() {
        let mine = &view_ranges[(w & INDEX_MASK as u32) as usize];
        let hit_read = reads
            .iter()
            .enumerate()
            .any(|(j, &r)| j as u32 != own_read && mine.overlaps(&view_ranges[r as usize]));
        let hit_write = writes.iter().enumerate().any(|(j, &(x, _))| {
            j != i && mine.overlaps(&view_ranges[(x & INDEX_MASK as u32) as usize])
        });
        if hit_read || hit_write {
            return Some(i);
        }
    }
    None
}

/// [`written_overlap`] for written views that overlap no view but themselves: the first that
/// another buffer argument names too.
#[inline]
pub(super) fn same_view_twice(reads: &[u32], writes: &[(u32, u32)]) -> Option<usize> {
    writes.iter().enumerate().position(|(i, &(w, own_read))| {
        let w = w & INDEX_MASK as u32;
        reads
            .iter()
            .enumerate()
            .any(|(j, &r)| j as u32 != own_read && r == w)
            || writes
                .iter()
                .enumerate()
                .any(|(j, &(x, _))| j != i && x & INDEX_MASK as u32 == w)
    })
}

/// The error for the `nth` written buffer argument of `args` overlapping another one.
#[cold]
pub(super) fn overlapping_write(kernel: KernelId, args: &[Arg], nth: usize) -> Error {
    let bufs: Vec<(usize, Range, Access)> = args
        .iter()
        .enumerate()
        .filter_map(|(p, a)| match a {
            Arg::Buffer(b, access) => Some((p, Range::of(b), *access)),
            Arg::Scalar(_) => None,
        })
        .collect();
    let mine = bufs.iter().filter(|(_, _, a)| a.writes()).nth(nth);
    let other = mine.and_then(|&(p, mine, _)| {
        let hit = bufs.iter().find(|(q, r, _)| *q != p && mine.overlaps(r))?;
        Some((p, hit.0))
    });
    let which = match other {
        Some((p, q)) => format!("written argument {p} overlaps argument {q}"),
        None => "a written argument overlaps another".to_string(),
    };
    Error::InvalidArgument(format!(
        "kernel {}: {which}; use one read-write argument for in-place updates",
        kernel.name()
    ))
}

/// The index of `b`'s view in a graph with `stamp`, its views and their ranges, taking the view
/// in (one reference) the first time; [`MARKED`] is set in the result when the graph has counted
/// the view as written. A graph holds at most [`MAX_VIEWS`] views.
#[inline(always)]
pub(super) fn take_in(
    stamp: u64,
    views: &mut Vec<Buffer>,
    view_ranges: &mut Vec<Range>,
    b: &Buffer,
) -> Result<u32> {
    let word = b.graph_stamp().load(Ordering::Relaxed);
    if stamp != 0 && word >> INDEX_BITS == stamp {
        return Ok((word & (INDEX_MASK | MARKED as u64)) as u32);
    }
    take_in_new(stamp, views, view_ranges, b)
}

/// The most distinct buffer views one graph holds: their indices must fit the index bits of a
/// view's stamp word.
pub(crate) const MAX_VIEWS: usize = INDEX_MASK as usize + 1;

/// [`take_in_unseen`] out of line, for [`take_in`]'s rare path.
#[inline(never)]
fn take_in_new(
    stamp: u64,
    views: &mut Vec<Buffer>,
    view_ranges: &mut Vec<Range>,
    b: &Buffer,
) -> Result<u32> {
    take_in_unseen(stamp, views, view_ranges, b)
}

/// Takes in `b`'s view, which the graph (with `stamp`, its views and their ranges) does not
/// hold, and returns its index.
#[inline(always)]
pub(super) fn take_in_unseen(
    stamp: u64,
    views: &mut Vec<Buffer>,
    view_ranges: &mut Vec<Range>,
    b: &Buffer,
) -> Result<u32> {
    let v = views.len();
    if v >= MAX_VIEWS {
        return Err(Error::InvalidArgument(format!(
            "a graph holds at most {MAX_VIEWS} distinct buffer views; record fewer, or record \
             into a new or cleared graph"
        )));
    }
    views.push(b.clone());
    view_ranges.push(Range::of(b));
    if stamp != 0 {
        // Only this graph writes words with its stamp, and it writes the right index.
        b.graph_stamp()
            .store(stamp << INDEX_BITS | v as u64, Ordering::Relaxed);
    }
    Ok(v as u32)
}

/// A stamp no other graph of this process has (0 once they run out: such a graph then takes in
/// a view at every use, which is correct and only slower).
pub(super) fn fresh_stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let s = NEXT.fetch_add(1, Ordering::Relaxed);
    if s < 1 << (64 - INDEX_BITS) {
        s
    } else {
        0
    }
}

/// What the graph keeps about which allocations were ever written: a filter of
/// [`WRITTEN_BITS`](super::WRITTEN_BITS) bits and a version bumped whenever it gains one.
pub(super) struct WrittenFilter<'a> {
    pub(super) bits: &'a mut [u64; super::WRITTEN_BITS / 64],
    pub(super) version: &'a mut u64,
}

/// Counts the allocation of view `v` (of a graph with `stamp`, its views and their ranges) as
/// written in `filter`, and marks the view so that its later writes skip this.
#[inline(never)]
pub(super) fn mark_written(
    filter: WrittenFilter<'_>,
    stamp: u64,
    views: &[Buffer],
    view_ranges: &[Range],
    v: u32,
) {
    let bit = view_ranges[v as usize].alloc.0 as usize % super::WRITTEN_BITS;
    let (word, mask) = (&mut filter.bits[bit / 64], 1 << (bit % 64));
    if *word & mask == 0 {
        *word |= mask;
        *filter.version += 1;
    }
    if stamp != 0 {
        // The filter has the allocation now (and keeps it until a reset, which takes a new
        // stamp): the view's next writes need not look.
        let word = stamp << INDEX_BITS | (MARKED | v) as u64;
        views[v as usize]
            .graph_stamp()
            .store(word, Ordering::Relaxed);
    }
}
