//! The passes' view of a graph's dispatch list: every view the graph took in has a small index
//! (given at record time, see [`ComputeGraph`]), and every index knows which indices overlap it.
//! A set of dispatches (a concurrent group, the dispatches a lookahead skipped) is then two
//! stamps per index, and asking whether a dispatch conflicts with the set is one load per range
//! of the dispatch. The conflict rule is [`RangeSet`](super::RangeSet)'s, exactly.
//!
//! Reads of an allocation that no dispatch of the list writes can conflict with nothing, so they
//! are left out (the weights of a forward pass, the step buffer). Empty ranges touch no byte and
//! are left out too.

use super::{ComputeGraph, Range};

/// The conflict-relevant ranges of a graph's dispatches, as view indices.
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
    /// The footprint of the dispatches of `graph`, in node order (barriers are skipped).
    pub(crate) fn new(graph: &ComputeGraph) -> Self {
        let view_ranges = graph.view_ranges();
        let order = graph.order();
        // Per view: 1 if a read of it can conflict (a non-empty view of a written allocation),
        // 2 if a write of it can (non-empty).
        let keep: Vec<u8> = view_ranges
            .iter()
            .map(|r| {
                let nonempty = r.start < r.end;
                (nonempty && graph.maybe_written(r.alloc)) as u8 | (nonempty as u8) << 1
            })
            .collect();
        let bound = graph.range_count();
        let count = order.len();
        let mut ids = Vec::with_capacity(bound);
        let mut spans = Vec::with_capacity(count);
        let mut movable = Vec::with_capacity(count);
        for &h in order {
            if h == ComputeGraph::BARRIER {
                continue;
            }
            movable.push(graph.op_at(h).is_reorderable());
            let (reads, writes) = graph.range_views_at(h);
            let start = ids.len() as u32;
            ids.extend(reads.iter().filter(|&&v| keep[v as usize] & 1 != 0));
            let mid = ids.len() as u32;
            ids.extend(writes.iter().filter(|&&v| keep[v as usize] & 2 != 0));
            spans.push([start, mid, ids.len() as u32]);
        }
        let (overlap_start, overlaps) = overlap_lists(view_ranges, &keep);
        Footprint {
            ids,
            spans,
            movable,
            disjoint: overlaps.len() == view_ranges.len(),
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

impl Footprint {
    /// For each dispatch, the latest earlier dispatch it conflicts with, plus one (0: none).
    ///
    /// Per range index: its last write and its last read. A read of an index meets the last
    /// write of every overlapping index; a write meets that and the last read.
    pub(crate) fn latest_conflicts(&self) -> Vec<u32> {
        let n = self.len();
        let k = self.distinct();
        // Dispatch numbers plus one (0: none).
        let mut last_write = vec![0u32; k];
        let mut last_read = vec![0u32; k];
        let mut latest = Vec::with_capacity(n);
        for s in 0..n {
            let (reads, writes) = self.get(s);
            let mut l = 0;
            for &x in reads {
                for &y in self.overlapping_or_self(&x) {
                    l = l.max(last_write[y as usize]);
                }
            }
            for &x in writes {
                for &y in self.overlapping_or_self(&x) {
                    l = l.max(last_write[y as usize]).max(last_read[y as usize]);
                }
            }
            latest.push(l);
            let s1 = s as u32 + 1;
            for &x in reads {
                last_read[x as usize] = s1;
            }
            for &x in writes {
                last_write[x as usize] = s1;
            }
        }
        latest
    }
}

/// For each view, the views it overlaps (itself included), as offsets and a packed list. Only
/// non-empty views of written allocations (`keep & 1`; every kept write is one) are compared; sorted by allocation and start, each overlaps
/// exactly the following ones of its allocation that start before it ends.
fn overlap_lists(ranges: &[Range], keep: &[u8]) -> (Vec<u32>, Vec<u32>) {
    let k = ranges.len();
    // Sorted by (allocation, start), the keys beside the indices.
    let mut order: Vec<(u128, u32)> = (0..k as u32)
        .filter(|&i| keep[i as usize] & 1 != 0)
        .map(|i| {
            let r = &ranges[i as usize];
            ((r.alloc.0 as u128) << 64 | r.start as u128, i)
        })
        .collect();
    order.sort_unstable_by_key(|&(key, _)| key);
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
    use crate::graph::{Arg, Dispatch, Grid, KernelId, OpKind, RangeSet};
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
            if let Ok(d) = Dispatch::new(KernelId("t"), args, Grid::new(1, 1), op) {
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
            let fp = Footprint::new(&graph_of(&ds));
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
        let fp = Footprint::new(&graph_of(&ds));
        let kept: usize = (0..ds.len()).map(|i| fp.get(i).0.len()).sum();
        let all: usize = ds.iter().map(|d| d.reads().len()).sum();
        assert!(
            kept < all,
            "the never-written allocation's reads should be dropped"
        );
    }
}
