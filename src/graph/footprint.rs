//! The passes' view of a dispatch list: every distinct byte range that can take part in a
//! conflict gets a small index, once per pass run, and every index knows which indices overlap
//! it. A set of dispatches (a concurrent group, the dispatches a lookahead skipped) is then two
//! stamps per index, and asking whether a dispatch conflicts with the set is one load per range
//! of the dispatch. The conflict rule is [`RangeSet`](super::RangeSet)'s, exactly.
//!
//! Reads of an allocation that no dispatch of the list writes can conflict with nothing, so they
//! are left out (the weights of a forward pass, the step buffer). Empty ranges touch no byte and
//! are left out too.

use super::{Dispatch, Range};

/// Bits of the written-allocation filter (allocation ids modulo this; a collision only keeps a
/// read that could have been dropped).
const WRITTEN_FILTER_BITS: usize = 4096;

/// The interned, conflict-relevant ranges of a list of dispatches.
pub(crate) struct Footprint {
    /// Per dispatch, packed: the indices of its kept reads, then of its writes.
    ids: Vec<u32>,
    /// Per dispatch: first read, first write, end (positions in `ids`).
    spans: Vec<[u32; 3]>,
    /// Per dispatch: whether the reorder pass may move it.
    movable: Vec<bool>,
    /// The indices overlapping index `k` (itself included) are
    /// `overlaps[overlap_start[k]..overlap_start[k + 1]]`.
    overlap_start: Vec<u32>,
    overlaps: Vec<u32>,
    /// Whether every range overlaps only itself (then a set marks just the ranges it holds).
    disjoint: bool,
}

impl Footprint {
    /// Interns the ranges of `dispatches`, in order.
    pub(crate) fn new<'a>(dispatches: impl Iterator<Item = &'a Dispatch> + Clone) -> Self {
        let mut written = [0u64; WRITTEN_FILTER_BITS / 64];
        let slot = |r: &Range| (r.alloc.0 as usize) % WRITTEN_FILTER_BITS;
        let (mut count, mut bound) = (0, 0);
        for d in dispatches.clone() {
            for w in d.writes() {
                written[slot(w) / 64] |= 1 << (slot(w) % 64);
            }
            count += 1;
            bound += d.reads().len() + d.writes().len();
        }
        let mut interner = Interner::new();
        let mut ids = Vec::with_capacity(bound);
        let mut spans = Vec::with_capacity(count);
        let mut movable = Vec::with_capacity(count);
        for d in dispatches {
            movable.push(d.op().is_reorderable());
            let start = ids.len() as u32;
            for r in d.reads() {
                if r.start < r.end && written[slot(r) / 64] & (1 << (slot(r) % 64)) != 0 {
                    ids.push(interner.intern(r));
                }
            }
            let mid = ids.len() as u32;
            for w in d.writes() {
                if w.start < w.end {
                    ids.push(interner.intern(w));
                }
            }
            spans.push([start, mid, ids.len() as u32]);
        }
        let (overlap_start, overlaps) = overlap_lists(&interner.ranges);
        Footprint {
            ids,
            spans,
            movable,
            disjoint: overlaps.len() == interner.ranges.len(),
            overlap_start,
            overlaps,
        }
    }

    /// Number of dispatches.
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether dispatch `i` may be reordered.
    #[inline]
    pub(crate) fn movable(&self, i: usize) -> bool {
        self.movable[i]
    }

    /// Number of distinct ranges.
    pub(crate) fn distinct(&self) -> usize {
        self.overlap_start.len() - 1
    }

    /// The indices of dispatch `i`'s kept reads and of its writes.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> (&[u32], &[u32]) {
        let [a, b, c] = self.spans[i];
        (
            &self.ids[a as usize..b as usize],
            &self.ids[b as usize..c as usize],
        )
    }

    /// [`overlapping`](Self::overlapping), without a lookup when every range overlaps only
    /// itself.
    #[inline]
    fn overlapping_or_self<'a>(&'a self, k: &'a u32) -> &'a [u32] {
        if self.disjoint {
            std::slice::from_ref(k)
        } else {
            self.overlapping(*k)
        }
    }

    /// The indices whose ranges overlap range `k`, `k` included.
    #[inline]
    fn overlapping(&self, k: u32) -> &[u32] {
        let a = self.overlap_start[k as usize] as usize;
        let b = self.overlap_start[k as usize + 1] as usize;
        &self.overlaps[a..b]
    }
}

/// For each dispatch of one [`Footprint`], the earlier dispatches (at most `window` back) that
/// must be placed before it, thinned for a walk that never places a dispatch before an earlier
/// one it conflicts with (the reorder walk): among the writes of one range index only the last
/// is listed, and among the reads only those after that last write. The ones left out conflict
/// with a listed one that comes after them, so in such a walk they are placed whenever the
/// listed one is: "some listed one is not placed yet" equals "some conflicting one is not".
pub(crate) struct Blockers {
    /// Per dispatch `p`: the first entry of its list of dispatches that list it (0: none).
    head: Vec<u32>,
    /// Entries, numbered from 1: (a dispatch that lists `p`, the next entry of `p`'s list). A
    /// dispatch listing `p` twice (through two ranges) is entered twice and counted twice.
    entries: Vec<(u32, u32)>,
    /// Per dispatch: how many entries list it.
    pub(crate) count: Vec<u32>,
}

impl Blockers {
    /// The dispatches that list `p`, as often as they list it.
    #[inline]
    pub(crate) fn after(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        let mut e = self.head[p];
        std::iter::from_fn(move || {
            let (s, next) = *self.entries.get(e.checked_sub(1)? as usize)?;
            e = next;
            Some(s as usize)
        })
    }
}

impl Footprint {
    /// The [`Blockers`] of every dispatch within `window`.
    ///
    /// Per range index: its last write, and the chain of reads since (latest first). A read of
    /// an index meets the last write of every overlapping index; a write meets that and the reads
    /// since. A chain walk stops at the window's start.
    pub(crate) fn blockers(&self, window: usize) -> Blockers {
        let n = self.len();
        let k = self.distinct();
        // Dispatch numbers plus one (0: none), so "listed and within the window" is one compare.
        let mut last_write = vec![0u32; k];
        // Read-chain entries, numbered from 1: (dispatch plus one, previous entry).
        let mut head_read = vec![0u32; k];
        let mut reads_log: Vec<(u32, u32)> = Vec::with_capacity(self.ids.len());
        let mut head = vec![0u32; n];
        let mut entries: Vec<(u32, u32)> = Vec::with_capacity(2 * n);
        let mut count = Vec::with_capacity(n);
        for s in 0..n {
            // `p + 1 > low` for every dispatch `p` in the window.
            let low = s.saturating_sub(window) as u32;
            let (reads, writes) = self.get(s);
            let mut listed = 0;
            let mut list = |p1: u32| {
                if p1 > low {
                    let p = p1 as usize - 1;
                    entries.push((s as u32, head[p]));
                    head[p] = entries.len() as u32;
                    listed += 1;
                }
            };
            for &x in reads {
                for &y in self.overlapping_or_self(&x) {
                    list(last_write[y as usize]);
                }
            }
            for &x in writes {
                for &y in self.overlapping_or_self(&x) {
                    list(last_write[y as usize]);
                    let mut e = head_read[y as usize];
                    while let Some(&(p1, prev)) = reads_log.get((e as usize).wrapping_sub(1)) {
                        if p1 <= low {
                            break;
                        }
                        list(p1);
                        e = prev;
                    }
                }
            }
            count.push(listed);
            for &x in reads {
                reads_log.push((s as u32 + 1, head_read[x as usize]));
                head_read[x as usize] = reads_log.len() as u32;
            }
            for &x in writes {
                last_write[x as usize] = s as u32 + 1;
                head_read[x as usize] = 0;
            }
        }
        Blockers {
            head,
            entries,
            count,
        }
    }
}

/// For each range, the ranges it overlaps (itself included), as offsets and a packed list.
/// Ranges are non-empty and distinct; sorted by allocation and start, each range overlaps exactly
/// the following ranges of its allocation that start before it ends.
fn overlap_lists(ranges: &[Range]) -> (Vec<u32>, Vec<u32>) {
    let k = ranges.len();
    let mut order: Vec<u32> = (0..k as u32).collect();
    order.sort_unstable_by_key(|&i| (ranges[i as usize].alloc, ranges[i as usize].start));
    let mut pairs = Vec::new();
    for (a, &i) in order.iter().enumerate() {
        let ri = &ranges[i as usize];
        for &j in &order[a + 1..] {
            let rj = &ranges[j as usize];
            if rj.alloc != ri.alloc || rj.start >= ri.end {
                break;
            }
            pairs.push((i, j));
        }
    }
    let mut start = vec![1u32; k + 1];
    start[0] = 0;
    for &(i, j) in &pairs {
        start[i as usize + 1] += 1;
        start[j as usize + 1] += 1;
    }
    for x in 1..=k {
        start[x] += start[x - 1];
    }
    let mut fill: Vec<u32> = start[..k].to_vec();
    let mut list = vec![0u32; start[k] as usize];
    let mut put = |at: u32, v: u32| {
        list[fill[at as usize] as usize] = v;
        fill[at as usize] += 1;
    };
    for x in 0..k as u32 {
        put(x, x);
    }
    for &(i, j) in &pairs {
        put(i, j);
        put(j, i);
    }
    (start, list)
}

/// Gives each distinct range an index: an open-addressing table of indices plus one.
struct Interner {
    slots: Vec<u32>,
    shift: u32,
    ranges: Vec<Range>,
}

impl Interner {
    /// An empty table (it doubles whenever it would be more than half full).
    fn new() -> Self {
        let bits = 8;
        Interner {
            slots: vec![0; 1 << bits],
            shift: 64 - bits,
            ranges: Vec::new(),
        }
    }

    #[inline]
    fn slot_of(&self, r: &Range) -> usize {
        let h = (r.alloc.0 ^ (r.start as u64).rotate_left(21) ^ (r.end as u64).rotate_left(42))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> self.shift) as usize
    }

    #[inline]
    fn intern(&mut self, r: &Range) -> u32 {
        let mask = self.slots.len() - 1;
        let mut at = self.slot_of(r);
        loop {
            let s = self.slots[at];
            if s == 0 {
                break;
            }
            if self.ranges[s as usize - 1] == *r {
                return s - 1;
            }
            at = (at + 1) & mask;
        }
        self.ranges.push(*r);
        let id = self.ranges.len() as u32;
        if 2 * self.ranges.len() > self.slots.len() {
            self.grow();
        } else {
            self.slots[at] = id;
        }
        id - 1
    }

    /// Doubles the table and places every range again (the last one included).
    #[cold]
    fn grow(&mut self) {
        self.shift -= 1;
        self.slots = vec![0; self.slots.len() * 2];
        let mask = self.slots.len() - 1;
        for (i, r) in self.ranges.iter().enumerate() {
            let mut at = self.slot_of(r);
            while self.slots[at] != 0 {
                at = (at + 1) & mask;
            }
            self.slots[at] = i as u32 + 1;
        }
    }
}

/// A set of dispatches of one [`Footprint`]: for every range index, whether some read of the set
/// overlaps it and whether some write does (stamped with the set's generation, so clearing the
/// set is one increment).
pub(crate) struct Marks {
    /// Per index: [read stamp, write stamp].
    stamps: Vec<[u32; 2]>,
    generation: u32,
}

impl Marks {
    /// An empty set over `fp`'s ranges.
    pub(crate) fn new(fp: &Footprint) -> Self {
        Marks {
            stamps: vec![[0; 2]; fp.distinct()],
            generation: 1,
        }
    }

    /// Whether dispatch `i` of `fp` conflicts with the set: one of its reads overlaps a write of
    /// the set, or one of its writes overlaps a read or a write of the set.
    #[inline]
    pub(crate) fn conflicts(&self, fp: &Footprint, i: usize) -> bool {
        let (reads, writes) = fp.get(i);
        let g = self.generation;
        reads.iter().any(|&x| self.stamps[x as usize][1] == g)
            || writes.iter().any(|&x| {
                let [r, w] = self.stamps[x as usize];
                r == g || w == g
            })
    }

    /// Adds dispatch `i` of `fp` to the set.
    #[inline]
    pub(crate) fn add(&mut self, fp: &Footprint, i: usize) {
        let (reads, writes) = fp.get(i);
        let g = self.generation;
        if fp.disjoint {
            for &x in reads {
                self.stamps[x as usize][0] = g;
            }
            for &x in writes {
                self.stamps[x as usize][1] = g;
            }
            return;
        }
        for &x in reads {
            for &y in fp.overlapping(x) {
                self.stamps[y as usize][0] = g;
            }
        }
        for &x in writes {
            for &y in fp.overlapping(x) {
                self.stamps[y as usize][1] = g;
            }
        }
    }

    /// Empties the set.
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamps.fill([0; 2]);
            self.generation = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DType, Device};
    use crate::graph::{Arg, Grid, KernelId, OpKind, RangeSet};
    use rand::RngExt;

    /// Random dispatches over a few aliased views of three allocations, one never written.
    fn random_dispatches(seed: u64, n: usize) -> Vec<Dispatch> {
        let dev = Device::cpu(1).expect("cpu");
        let allocs: Vec<_> = (0..3)
            .map(|_| dev.alloc(DType::U8, &[256]).expect("alloc"))
            .collect();
        let mut rng = crate::testutil::rng(seed);
        let mut out = Vec::new();
        while out.len() < n {
            let mut args = Vec::new();
            for _ in 0..rng.random_range(1..5) {
                let a = rng.random_range(0..3usize);
                let start = rng.random_range(0..256usize);
                let len = rng.random_range(0..=(256 - start).min(64));
                let view = allocs[a].view(start, DType::U8, &[len]).expect("view");
                let access = if a == 2 { 0 } else { rng.random_range(0..3) };
                args.push(match access {
                    0 => Arg::read(&view),
                    1 => Arg::write(&view),
                    _ => Arg::read_write(&view),
                });
            }
            let op = OpKind::Copy;
            if let Ok(d) = Dispatch::new(KernelId("t"), args, Grid::new(1, 1), op) {
                out.push(d);
            }
        }
        out
    }

    #[test]
    fn given_random_sets_when_checked_should_agree_with_the_range_set() {
        for seed in 0..20 {
            let ds = random_dispatches(seed, 40);
            let fp = Footprint::new(ds.iter());
            let mut marks = Marks::new(&fp);
            let mut set = RangeSet::new();
            let mut rng = crate::testutil::rng(seed + 100);
            for (i, d) in ds.iter().enumerate() {
                assert_eq!(
                    marks.conflicts(&fp, i),
                    set.conflicts(d.reads(), d.writes()),
                    "seed {seed}, dispatch {i}"
                );
                if rng.random_range(0..4) == 0 {
                    marks.clear();
                    set.clear();
                }
                marks.add(&fp, i);
                set.add(d.reads(), d.writes());
            }
        }
    }

    #[test]
    fn given_reads_of_an_unwritten_allocation_when_interned_should_be_left_out() {
        let ds = random_dispatches(7, 30);
        let fp = Footprint::new(ds.iter());
        let kept: usize = (0..ds.len()).map(|i| fp.get(i).0.len()).sum();
        let all: usize = ds.iter().map(|d| d.reads().len()).sum();
        assert!(
            kept < all,
            "the never-written allocation's reads should be dropped"
        );
    }
}
