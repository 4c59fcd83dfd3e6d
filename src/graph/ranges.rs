//! The one range-set type: the memory ranges a group of dispatches reads and writes, and the
//! conflict rule every pass and encoder uses.
//!
//! Two accesses conflict when they touch overlapping bytes of the same allocation and at least one
//! of them writes: read-after-write, write-after-read and write-after-write. Read-read never
//! conflicts, and ranges of different allocations never do.

use super::Range;

/// The reads and writes of a set of dispatches (a concurrent group, or the nodes a lookahead
/// skipped over).
#[derive(Debug, Clone, Default)]
pub struct RangeSet {
    reads: Vec<Range>,
    writes: Vec<Range>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        RangeSet::default()
    }

    /// Whether a dispatch with these reads and writes conflicts with anything in the set.
    pub fn conflicts(&self, reads: &[Range], writes: &[Range]) -> bool {
        // A new read conflicts with a recorded write; a new write with any recorded access.
        reads.iter().any(|r| self.writes.iter().any(|w| w.overlaps(r)))
            || writes.iter().any(|w| {
                self.writes.iter().any(|x| x.overlaps(w)) || self.reads.iter().any(|x| x.overlaps(w))
            })
    }

    /// Adds a dispatch's reads and writes.
    pub fn add(&mut self, reads: &[Range], writes: &[Range]) {
        self.reads.extend_from_slice(reads);
        self.writes.extend_from_slice(writes);
    }

    /// Empties the set, keeping its storage.
    pub fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
    }

    /// Whether nothing has been added since the last clear.
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }
}
