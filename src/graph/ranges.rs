//! The one range-set type: the memory ranges a group of dispatches reads and writes, and the
//! conflict rule every pass and encoder uses.
//!
//! Two accesses conflict when they touch overlapping bytes of the same allocation and at least one
//! of them writes: read-after-write, write-after-read and write-after-write. Read-read never
//! conflicts, ranges of different allocations never do, and an empty range touches no byte.
//!
//! Speed: a set keeps its reads and its writes apart, plus a 64-bit summary of the allocations
//! each side touches (bit `alloc % 64`). A check only scans a side whose summary has the other
//! range's bit, so the many weight reads of a decode step are never compared with anything unless
//! something writes the weight allocation. Checks never allocate; `clear` keeps the storage.

use std::borrow::Borrow;

use super::Range;

/// The reads and writes of a set of dispatches (a concurrent group, or the nodes a lookahead
/// skipped over).
#[derive(Debug, Clone, Default)]
pub struct RangeSet {
    reads: Vec<Range>,
    writes: Vec<Range>,
    /// Bit `alloc % 64` is set when some range in `reads` lies in that allocation.
    read_allocs: u64,
    /// Bit `alloc % 64` is set when some range in `writes` lies in that allocation.
    write_allocs: u64,
}

/// The summary bit of a range's allocation.
#[inline]
fn alloc_bit(r: &Range) -> u64 {
    1u64 << (r.alloc.0 & 63)
}

#[inline]
fn any_overlap(set: &[Range], r: &Range) -> bool {
    set.iter().any(|x| x.overlaps(r))
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        RangeSet::default()
    }

    /// Whether a dispatch with these reads and writes conflicts with anything in the set:
    /// a new read with a recorded write (read-after-write), a new write with a recorded read
    /// (write-after-read) or a recorded write (write-after-write).
    #[inline]
    pub fn conflicts<R: Borrow<Range>, W: Borrow<Range>>(
        &self,
        reads: impl IntoIterator<Item = R>,
        writes: impl IntoIterator<Item = W>,
    ) -> bool {
        if self.write_allocs != 0 {
            for r in reads {
                let r = r.borrow();
                if self.write_allocs & alloc_bit(r) != 0 && any_overlap(&self.writes, r) {
                    return true;
                }
            }
        }
        let touched = self.read_allocs | self.write_allocs;
        if touched != 0 {
            for w in writes {
                let w = w.borrow();
                let bit = alloc_bit(w);
                if (self.write_allocs & bit != 0 && any_overlap(&self.writes, w))
                    || (self.read_allocs & bit != 0 && any_overlap(&self.reads, w))
                {
                    return true;
                }
            }
        }
        false
    }

    /// Whether the set and `other` conflict (some write of one overlaps an access of the other).
    pub fn conflicts_with_set(&self, other: &RangeSet) -> bool {
        self.conflicts(&other.reads, &other.writes)
    }

    /// Adds a dispatch's reads and writes. Empty ranges touch nothing and are not kept.
    #[inline]
    pub fn add<R: Borrow<Range>, W: Borrow<Range>>(
        &mut self,
        reads: impl IntoIterator<Item = R>,
        writes: impl IntoIterator<Item = W>,
    ) {
        for r in reads {
            let r = *r.borrow();
            if r.start < r.end {
                self.read_allocs |= alloc_bit(&r);
                self.reads.push(r);
            }
        }
        for w in writes {
            let w = *w.borrow();
            if w.start < w.end {
                self.write_allocs |= alloc_bit(&w);
                self.writes.push(w);
            }
        }
    }

    /// Empties the set, keeping its storage.
    #[inline]
    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
        self.read_allocs = 0;
        self.write_allocs = 0;
    }

    /// Whether the set holds no (non-empty) range.
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }

    /// The read ranges added since the last clear.
    pub fn reads(&self) -> &[Range] {
        &self.reads
    }

    /// The write ranges added since the last clear.
    pub fn writes(&self) -> &[Range] {
        &self.writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::AllocId;

    /// No ranges.
    const NONE: [Range; 0] = [];

    fn r(alloc: u64, start: usize, end: usize) -> Range {
        Range {
            alloc: AllocId(alloc),
            start,
            end,
        }
    }

    fn set<const R: usize, const W: usize>(reads: [Range; R], writes: [Range; W]) -> RangeSet {
        let mut s = RangeSet::new();
        s.add(reads, writes);
        s
    }

    #[test]
    fn given_a_write_when_a_read_overlaps_it_should_conflict_read_after_write() {
        let s = set(NONE, [r(1, 0, 100)]);
        assert!(s.conflicts([r(1, 99, 200)], NONE));
        assert!(s.conflicts([r(1, 10, 20)], NONE));
    }

    #[test]
    fn given_a_read_when_a_write_overlaps_it_should_conflict_write_after_read() {
        let s = set([r(1, 0, 100)], NONE);
        assert!(s.conflicts(NONE, [r(1, 50, 60)]));
    }

    #[test]
    fn given_a_write_when_a_write_overlaps_it_should_conflict_write_after_write() {
        let s = set(NONE, [r(1, 0, 100)]);
        assert!(s.conflicts(NONE, [r(1, 0, 1)]));
    }

    #[test]
    fn given_a_read_when_another_read_overlaps_it_should_not_conflict() {
        let s = set([r(1, 0, 100)], NONE);
        assert!(!s.conflicts([r(1, 0, 100)], NONE));
    }

    #[test]
    fn given_touching_ranges_when_checked_should_not_conflict() {
        let s = set([r(1, 0, 100)], [r(1, 100, 200)]);
        assert!(!s.conflicts([r(1, 200, 300)], [r(1, 200, 300)]));
        assert!(!s.conflicts(NONE, [r(1, 200, 201)]));
        // The write [100, 200) against a read ending exactly at 100.
        assert!(!s.conflicts([r(1, 50, 100)], NONE));
        // One byte of overlap is a conflict.
        assert!(s.conflicts([r(1, 199, 300)], NONE));
        assert!(s.conflicts(NONE, [r(1, 99, 100)]));
    }

    #[test]
    fn given_zero_length_ranges_when_checked_should_never_conflict() {
        let s = set([r(1, 0, 100)], [r(1, 100, 200)]);
        assert!(!s.conflicts([r(1, 150, 150)], [r(1, 50, 50)]));
        // Added empty ranges are dropped: the set stays empty.
        let e = set([r(1, 10, 10)], [r(1, 20, 20)]);
        assert!(e.is_empty());
        assert!(!e.conflicts([r(1, 0, 100)], [r(1, 0, 100)]));
    }

    #[test]
    fn given_other_allocation_when_bytes_coincide_should_not_conflict() {
        let s = set([r(1, 0, 100)], [r(2, 0, 100)]);
        assert!(!s.conflicts([r(3, 0, 100)], [r(3, 0, 100)]));
        // Allocation 65 shares allocation 1's summary bit; the exact compare still tells them apart.
        assert!(!s.conflicts([r(66, 0, 100)], [r(65, 0, 100)]));
        assert!(s.conflicts(NONE, [r(1, 0, 100)]));
        assert!(s.conflicts([r(2, 0, 100)], NONE));
    }

    #[test]
    fn given_a_cleared_set_when_checked_should_be_empty_and_conflict_free() {
        let mut s = set([r(1, 0, 100)], [r(1, 100, 200)]);
        assert!(!s.is_empty());
        s.clear();
        assert!(s.is_empty());
        assert!(!s.conflicts([r(1, 0, 300)], [r(1, 0, 300)]));
        s.add(NONE, [r(4, 0, 8)]);
        assert!(s.conflicts([r(4, 4, 5)], NONE));
    }

    #[test]
    fn given_two_sets_when_one_writes_what_the_other_reads_should_conflict_both_ways() {
        let a = set([r(1, 0, 10)], NONE);
        let b = set(NONE, [r(1, 5, 6)]);
        assert!(a.conflicts_with_set(&b));
        assert!(b.conflicts_with_set(&a));
        let c = set([r(1, 5, 6)], NONE);
        assert!(!a.conflicts_with_set(&c));
    }
}
