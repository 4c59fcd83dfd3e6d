//! Greedy reordering for concurrency, after the seeds and llama.cpp's Metal graph optimizer.
//!
//! Walking the dispatches in order, the pass keeps the ranges of the current concurrent group.
//! When the next dispatch conflicts with the group (so a barrier would go before it), it first
//! looks ahead up to `lookahead` dispatches for ones that conflict neither with the group nor with
//! any dispatch skipped over, and pulls them into the group. A dispatch that may not move stops the
//! lookahead, and a dispatch that may not move never starts one, so such a dispatch keeps its place
//! relative to every other dispatch (the seeds let a pinned dispatch pull later ones before it).
//!
//! The walk's group is exactly the group barrier placement keeps over the new order, so the walk
//! also yields the barrier positions: one before each dispatch that conflicted with the group.

use crate::graph::footprint::{Footprint, Marks};
use crate::graph::ComputeGraph;

/// The seeds' lookahead window.
pub const DEFAULT_LOOKAHEAD: usize = 64;

/// Reorders the dispatches of `graph` (dropping its barriers; place them again afterwards).
/// Returns how many dispatches ended at a different index.
pub fn reorder(graph: &mut ComputeGraph, lookahead: usize) -> usize {
    graph.drop_barriers();
    if graph.len() < 2 || lookahead == 0 {
        return 0;
    }
    graph.refresh_overlaps();
    let fp = Footprint::new(graph);
    let mut walk = greedy(&fp, lookahead);
    apply_order(graph.order_mut(), &mut walk.order)
}

/// The outcome of the greedy walk.
pub(super) struct Walk {
    /// The new order, as indices into the old one.
    pub(super) order: Vec<u32>,
    /// Positions in the new order that a barrier must precede, ascending.
    pub(super) cuts: Vec<u32>,
}

/// Puts the node entries in `order` (indices into `nodes`) and returns how many moved. `order`
/// is overwritten.
pub(super) fn apply_order(nodes: &mut [u32], order: &mut [u32]) -> usize {
    let mut moved = 0;
    for (pos, o) in order.iter_mut().enumerate() {
        moved += (*o as usize != pos) as usize;
        *o = nodes[*o as usize];
    }
    nodes.copy_from_slice(order);
    moved
}

/// The greedy walk over the dispatches of `fp` (`lookahead` > 0).
///
/// A candidate must conflict neither with the group nor with a dispatch the lookahead skipped.
/// Everything not yet placed lies at or after the walk's position, and a candidate lies at most
/// `lookahead` after it, so the skipped dispatches a candidate could conflict with are exactly
/// its earlier conflicting dispatches (at most `lookahead` back) not placed yet. Each movable
/// dispatch that has some watches one of them (at first its latest), and every such dispatch
/// after the watched one is placed; when the watched one is placed, the watcher looks for the
/// next one below it, or becomes ready. In a graph that is mostly a chain the watched one is
/// placed in order, and the look is empty.
pub(super) fn greedy(fp: &Footprint, lookahead: usize) -> Walk {
    let n = fp.len();
    let latest = fp.latest_conflicts();
    let mut state = WalkState {
        group_of: vec![UNPLACED; n],
        group: 0,
        first: 0,
        members: Vec::new(),
        ready: Bits::new(n),
        pinned: Bits::new(n),
        order: Vec::with_capacity(n),
        watchers: vec![0; n],
        next_watcher: vec![0; n],
        probe: Marks::new(fp),
        lookahead,
    };
    for (i, &p1) in latest.iter().enumerate() {
        if !fp.movable(i) {
            state.pinned.set(i);
        } else if p1 > 0 && i - (p1 as usize - 1) <= lookahead {
            state.watch(p1 as usize - 1, i);
        } else {
            state.ready.set(i);
        }
    }
    let mut cuts = Vec::new();
    for i0 in 0..n {
        if state.group_of[i0] != UNPLACED {
            continue;
        }
        if state.conflicts_with_group(i0, latest[i0], fp) {
            if fp.movable(i0) {
                // The window ends at the first pinned dispatch not placed yet. Only ready
                // dispatches can join; placing one may make a later one ready.
                let end = (i0 + 1).saturating_add(lookahead).min(n);
                let end = state.pinned.next(i0 + 1, end).unwrap_or(end);
                let mut at = i0 + 1;
                while let Some(i1) = state.ready.next(at, end) {
                    if !state.conflicts_with_group(i1, latest[i1], fp) {
                        state.place(i1, i0, fp);
                    }
                    at = i1 + 1;
                }
            }
            state.group += 1;
            state.first = i0;
            state.members.clear();
            cuts.push(state.order.len() as u32);
        }
        state.place(i0, i0, fp);
    }
    Walk {
        order: state.order,
        cuts,
    }
}

/// `group_of` of a dispatch not placed yet.
const UNPLACED: u32 = u32::MAX;

/// What the walk knows about every dispatch.
struct WalkState {
    /// Per dispatch: the group it was placed in, or [`UNPLACED`].
    group_of: Vec<u32>,
    /// The current group's number.
    group: u32,
    /// The dispatch that opened the current group: every member is at or after it (members
    /// join in order, or from the window after the walk's position).
    first: usize,
    /// The current group's dispatches.
    members: Vec<u32>,
    /// Movable, not placed, no earlier conflicting dispatch (within the window) left.
    ready: Bits,
    /// Not movable, not placed.
    pinned: Bits,
    order: Vec<u32>,
    /// Per dispatch: the first dispatch watching it, plus one (0: none).
    watchers: Vec<u32>,
    /// Per watching dispatch: the next one watching the same dispatch, plus one.
    next_watcher: Vec<u32>,
    /// A set holding one dispatch, to test it against others.
    probe: Marks,
    lookahead: usize,
}

impl WalkState {
    /// Whether dispatch `i` (not placed; every member of the group is before it) conflicts
    /// with a member of the current group; `latest1` is its latest earlier conflicting dispatch,
    /// plus one. When that one is a member, or before the group's first, the answer is known;
    /// otherwise (it was placed in an earlier group) the members are tested one by one.
    #[inline]
    fn conflicts_with_group(&mut self, i: usize, latest1: u32, fp: &Footprint) -> bool {
        if latest1 == 0 || (latest1 as usize - 1) < self.first {
            return false;
        }
        if self.group_of[latest1 as usize - 1] == self.group {
            return true;
        }
        self.probe.clear();
        self.probe.add(fp, i);
        let probe = &self.probe;
        self.members
            .iter()
            .any(|&m| probe.conflicts(fp, m as usize))
    }

    /// Makes `d` wait for `p` (an earlier dispatch it conflicts with, not placed).
    #[inline]
    fn watch(&mut self, p: usize, d: usize) {
        self.next_watcher[d] = self.watchers[p];
        self.watchers[p] = d as u32 + 1;
    }

    /// Places `i` in the current group; every dispatch before `lowest` is placed already.
    #[inline]
    fn place(&mut self, i: usize, lowest: usize, fp: &Footprint) {
        self.order.push(i as u32);
        self.members.push(i as u32);
        self.group_of[i] = self.group;
        self.ready.clear(i);
        self.pinned.clear(i);
        let mut w = std::mem::take(&mut self.watchers[i]);
        while w != 0 {
            let d = w as usize - 1;
            w = self.next_watcher[d];
            match self.next_blocker(i, lowest, d, fp) {
                Some(q) => self.watch(q, d),
                None => self.ready.set(d),
            }
        }
    }

    /// The latest dispatch before `i` (and at most the window before `d`) that is not placed
    /// and conflicts with `d`.
    fn next_blocker(&mut self, i: usize, lowest: usize, d: usize, fp: &Footprint) -> Option<usize> {
        let low = lowest.max(d.saturating_sub(self.lookahead));
        if low >= i {
            return None;
        }
        self.probe.clear();
        self.probe.add(fp, d);
        (low..i)
            .rev()
            .find(|&q| self.group_of[q] == UNPLACED && self.probe.conflicts(fp, q))
    }
}

/// A fixed-size bit set.
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }

    #[inline]
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    #[inline]
    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }

    /// The first set bit in `from..end`.
    #[inline]
    fn next(&self, from: usize, end: usize) -> Option<usize> {
        if from >= end {
            return None;
        }
        let mut w = from / 64;
        let mut word = self.0[w] & (!0u64 << (from % 64));
        loop {
            if word != 0 {
                let i = w * 64 + word.trailing_zeros() as usize;
                return (i < end).then_some(i);
            }
            w += 1;
            if w * 64 >= end {
                return None;
            }
            word = self.0[w];
        }
    }
}

/// The walk as the seeds write it: the skipped dispatches kept as a second set of ranges. The
/// reference for [`greedy`].
#[cfg(test)]
#[allow(clippy::needless_range_loop)] // kept in the seeds' form, the point of a reference
pub(super) fn greedy_reference(fp: &Footprint, lookahead: usize) -> Walk {
    let n = fp.len();
    let mut order = Vec::with_capacity(n);
    let mut cuts = Vec::new();
    let mut used = vec![false; n];
    let mut group = Marks::new(fp);
    let mut skipped = Marks::new(fp);
    for i0 in 0..n {
        if used[i0] {
            continue;
        }
        if group.conflicts(fp, i0) {
            if fp.movable(i0) {
                skipped.clear();
                skipped.add(fp, i0);
                let end = (i0 + 1).saturating_add(lookahead).min(n);
                for i1 in i0 + 1..end {
                    if used[i1] {
                        continue;
                    }
                    if !fp.movable(i1) {
                        break;
                    }
                    if !group.conflicts(fp, i1) && !skipped.conflicts(fp, i1) {
                        group.add(fp, i1);
                        order.push(i1 as u32);
                        used[i1] = true;
                    } else {
                        skipped.add(fp, i1);
                    }
                }
            }
            group.clear();
            cuts.push(order.len() as u32);
        }
        group.add(fp, i0);
        order.push(i0 as u32);
        used[i0] = true;
    }
    Walk { order, cuts }
}
