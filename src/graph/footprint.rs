//! The passes' view of a graph's dispatch list: every view the graph took in has a small index
//! (given at record time, see [`ComputeGraph`]), and every index knows which indices overlap it.
//! A set of dispatches (a concurrent group, the dispatches a lookahead skipped) is then two
//! stamps per index, and asking whether a dispatch conflicts with the set is one load per range
//! of the dispatch. The conflict rule is [`RangeSet`](super::RangeSet)'s, exactly.
//!
//! The footprint borrows the graph's per-range view indices; it only adds, per dispatch in node
//! order, where its indices lie. Empty views touch no byte: they overlap nothing, not even
//! themselves. Overlaps are only looked for among views of allocations some dispatch writes
//! (a view of any other allocation overlaps only itself, and is never written).

use std::borrow::Cow;

use super::{ComputeGraph, Range};

/// The conflict-relevant ranges of a graph's dispatches, as view indices.
pub(crate) struct Footprint<'g> {
    /// The graph's view index of every range (reads then writes of each dispatch).
    ids: &'g [u32],
    /// Per dispatch: first read, first write, end (positions in `ids`).
    spans: Vec<[u32; 3]>,
    /// Per dispatch: whether the reorder pass may move it.
    movable: Vec<bool>,
    /// Which views overlap which (the graph's, when it has them for its current views).
    overlaps: Cow<'g, Overlaps>,
    /// Number of views.
    views: usize,
    /// Whether every view overlaps only itself and none is empty (then a set marks just the
    /// indices it holds, and the overlap lists are left empty).
    disjoint: bool,
}

/// Which of a graph's views overlap which: for each view, the views it overlaps (itself
/// included unless empty). Only non-empty views of allocations some dispatch writes are compared
/// with each other (a view of any other allocation is never written, so its overlaps never
/// decide a conflict).
#[derive(Clone, Debug, Default)]
pub(crate) struct Overlaps {
    /// Every view overlaps only itself and none is empty; the lists are then left empty.
    disjoint: bool,
    /// The views overlapping view `k` are `list[start[k]..start[k + 1]]`.
    start: Vec<u32>,
    list: Vec<u32>,
}

impl Overlaps {
    /// The overlaps of `ranges` (by view index), comparing only views `written` says yes to.
    pub(crate) fn of(ranges: &[Range], written: impl Fn(&Range) -> bool) -> Overlaps {
        match overlap_lists(ranges, written) {
            None => Overlaps {
                disjoint: true,
                start: Vec::new(),
                list: Vec::new(),
            },
            Some((start, list)) => Overlaps {
                disjoint: false,
                start,
                list,
            },
        }
    }

    /// Whether view `k` is non-empty and overlaps no view but itself.
    #[inline]
    pub(crate) fn alone(&self, k: u32) -> bool {
        self.disjoint || {
            let (a, b) = (self.start[k as usize], self.start[k as usize + 1]);
            b == a + 1 && self.list[a as usize] == k
        }
    }
}

impl<'g> Footprint<'g> {
    /// The footprint of the dispatches of `graph`, in node order (barriers are skipped).
    pub(crate) fn new(graph: &'g ComputeGraph) -> Self {
        let view_ranges = graph.view_ranges();
        let order = graph.order();
        // One entry per dispatch (fewer than the order's entries).
        let mut spans = Vec::with_capacity(order.len());
        let mut movable = Vec::with_capacity(order.len());
        for &h in order {
            if h == ComputeGraph::BARRIER {
                continue;
            }
            let (m, span) = graph.span_at(h);
            spans.push(span);
            movable.push(m);
        }
        let overlaps = match graph.kept_overlaps() {
            Some(o) => Cow::Borrowed(o),
            None => Cow::Owned(Overlaps::of(view_ranges, |r| graph.maybe_written(r.alloc))),
        };
        Footprint {
            ids: graph.all_range_views(),
            spans,
            movable,
            views: view_ranges.len(),
            disjoint: overlaps.disjoint,
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

    /// Number of views (range indices).
    pub(crate) fn distinct(&self) -> usize {
        self.views
    }

    /// The indices of dispatch `i`'s reads and of its writes.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> (&[u32], &[u32]) {
        let [a, b, c] = self.spans[i];
        (
            &self.ids[a as usize..b as usize],
            &self.ids[b as usize..c as usize],
        )
    }

    /// [`overlapping`](Self::overlapping), or the index alone when every range overlaps only
    /// itself.
    #[cfg(test)]
    fn overlapping_or_self<'a>(&'a self, k: &'a u32) -> &'a [u32] {
        if self.disjoint {
            std::slice::from_ref(k)
        } else {
            self.overlapping(*k)
        }
    }

    /// The indices whose ranges overlap range `k`, `k` included unless empty (only when the
    /// views are not disjoint: the lists are left empty then).
    #[inline]
    fn overlapping(&self, k: u32) -> &[u32] {
        let o = &*self.overlaps;
        let a = o.start[k as usize] as usize;
        let b = o.start[k as usize + 1] as usize;
        &o.list[a..b]
    }
}

impl Footprint<'_> {
    /// For each dispatch, the latest earlier dispatch it conflicts with, plus one (0: none).
    ///
    /// Per range index: its last write and its last read. A read of an index meets the last
    /// write of every overlapping index; a write meets that and the last read.
    pub(crate) fn latest_conflicts(&self) -> Vec<u32> {
        if self.disjoint {
            self.latest_conflicts_by(|x| std::slice::from_ref(x))
        } else {
            self.latest_conflicts_by(|x| self.overlapping(*x))
        }
    }

    /// [`latest_conflicts`](Self::latest_conflicts) with `overlapping` listing the indices that
    /// overlap one.
    #[inline(always)]
    fn latest_conflicts_by<'s>(&'s self, overlapping: impl Fn(&'s u32) -> &'s [u32]) -> Vec<u32> {
        let n = self.len();
        let k = self.distinct();
        // Per index: the last dispatch writing it and the last reading it, plus one (0: none).
        let mut last = vec![[0u32; 2]; k];
        let mut latest = Vec::with_capacity(n);
        for (s, &[a, b, c]) in self.spans.iter().enumerate() {
            let reads = &self.ids[a as usize..b as usize];
            let writes = &self.ids[b as usize..c as usize];
            let mut l = 0;
            for x in reads {
                for &y in overlapping(x) {
                    l = l.max(last[y as usize][0]);
                }
            }
            for x in writes {
                for &y in overlapping(x) {
                    let [w, r] = last[y as usize];
                    l = l.max(w).max(r);
                }
            }
            latest.push(l);
            let s1 = s as u32 + 1;
            for &x in reads {
                last[x as usize][1] = s1;
            }
            for &x in writes {
                last[x as usize][0] = s1;
            }
        }
        latest
    }
}

/// For each view, the views it overlaps (itself included unless empty), as offsets and a packed
/// list. Only non-empty views of allocations `written` says yes to are compared with each other;
/// sorted by allocation and start, each overlaps exactly the following ones of its allocation
/// that start before it ends.
fn overlap_lists(
    ranges: &[Range],
    written: impl Fn(&Range) -> bool,
) -> Option<(Vec<u32>, Vec<u32>)> {
    let k = ranges.len();
    // Sorted by (allocation, start), the keys beside the indices; room for all, allocated once.
    let mut order: Vec<(u128, u32)> = Vec::with_capacity(k);
    let mut any_empty = false;
    for (i, r) in ranges.iter().enumerate() {
        if r.start >= r.end {
            any_empty = true;
        } else if written(r) {
            order.push(((r.alloc.0 as u128) << 64 | r.start as u128, i as u32));
        }
    }
    if !order.is_sorted_by_key(|&(key, _)| key) {
        order.sort_unstable_by_key(|&(key, _)| key);
    }
    let mut pairs = Vec::new();
    for (a, &(_, i)) in order.iter().enumerate() {
        let ri = &ranges[i as usize];
        for &(_, j) in &order[a + 1..] {
            let rj = &ranges[j as usize];
            if rj.alloc != ri.alloc || rj.start >= ri.end {
                break;
            }
            pairs.push((i, j));
        }
    }
    if pairs.is_empty() && !any_empty {
        return None;
    }
    let mut start = vec![0u32; k + 1];
    for (x, r) in ranges.iter().enumerate() {
        start[x + 1] = (r.start < r.end) as u32;
    }
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
    for (x, r) in ranges.iter().enumerate() {
        if r.start < r.end {
            put(x as u32, x as u32);
        }
    }
    for &(i, j) in &pairs {
        put(i, j);
        put(j, i);
    }
    Some((start, list))
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
    pub(crate) fn new(fp: &Footprint<'_>) -> Self {
        Marks {
            stamps: vec![[0; 2]; fp.distinct()],
            generation: 1,
        }
    }

    /// Whether dispatch `i` of `fp` conflicts with the set: one of its reads overlaps a write of
    /// the set, or one of its writes overlaps a read or a write of the set.
    #[inline]
    pub(crate) fn conflicts(&self, fp: &Footprint<'_>, i: usize) -> bool {
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
    pub(crate) fn add(&mut self, fp: &Footprint<'_>, i: usize) {
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
    use crate::graph::synthetic::untyped_kernel;
    use crate::graph::{Arg, Dispatch, Grid, OpKind, RangeSet};
    use rand::RngExt;

    /// Random dispatches over aliased views of three allocations, one never written: views
    /// reused from a pool (the same view in several dispatches, as a model records them) and
    /// fresh ones (new views of possibly the same bytes).
    fn random_dispatches(seed: u64, n: usize) -> Vec<Dispatch> {
        let dev = Device::cpu(1).expect("cpu");
        let allocs: Vec<_> = (0..3)
            .map(|_| dev.alloc(DType::U8, &[256]).expect("alloc"))
            .collect();
        let mut rng = crate::testutil::rng(seed);
        let fresh = |rng: &mut rand_chacha::ChaCha8Rng| {
            let a = rng.random_range(0..3usize);
            let start = rng.random_range(0..256usize);
            let len = rng.random_range(0..=(256 - start).min(64));
            (a, allocs[a].view(start, DType::U8, &[len]).expect("view"))
        };
        let pool: Vec<_> = (0..12).map(|_| fresh(&mut rng)).collect();
        let mut out = Vec::new();
        while out.len() < n {
            let mut args = Vec::new();
            for _ in 0..rng.random_range(1..5) {
                let (a, view) = if rng.random_range(0..3) == 0 {
                    fresh(&mut rng)
                } else {
                    pool[rng.random_range(0..pool.len())].clone()
                };
                let access = if a == 2 { 0 } else { rng.random_range(0..3) };
                args.push(match access {
                    0 => Arg::read(&view),
                    1 => Arg::write(&view),
                    _ => Arg::read_write(&view),
                });
            }
            let op = OpKind::Copy;
            if let Ok(d) = Dispatch::new(untyped_kernel(op), args, Grid::new(1, 1)) {
                out.push(d);
            }
        }
        out
    }

    fn graph_of(ds: &[Dispatch]) -> ComputeGraph {
        let mut g = ComputeGraph::new();
        for d in ds {
            g.push_ref(d.as_view());
        }
        g
    }

    #[test]
    fn given_random_sets_when_checked_should_agree_with_the_range_set() {
        for seed in 0..20 {
            let ds = random_dispatches(seed, 40);
            let g = graph_of(&ds);
            let fp = Footprint::new(&g);
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
    fn given_unwritten_and_empty_views_when_listed_should_overlap_only_themselves_or_nothing() {
        let ds = random_dispatches(7, 30);
        let g = graph_of(&ds);
        let fp = Footprint::new(&g);
        let (mut empty, mut unwritten, mut overlapping) = (0, 0, 0);
        for (k, r) in g.view_ranges().iter().enumerate() {
            let k32 = k as u32;
            let list = fp.overlapping_or_self(&k32);
            if r.start == r.end {
                assert!(list.is_empty(), "empty view {k} overlaps {list:?}");
                empty += 1;
            } else if !g.maybe_written(r.alloc) {
                assert_eq!(list, &[k as u32], "view {k} of an unwritten allocation");
                unwritten += 1;
            } else {
                for &j in list {
                    assert!(r.overlaps(&g.view_ranges()[j as usize]), "{k} and {j}");
                }
                overlapping += (list.len() > 1) as usize;
            }
        }
        assert!(
            empty > 0 && unwritten > 0 && overlapping > 0,
            "the graph should have all three"
        );
    }
}
