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
use crate::graph::{ComputeGraph, Node};

/// The seeds' lookahead window.
pub const DEFAULT_LOOKAHEAD: usize = 64;

/// Reorders the dispatches of `graph` (dropping its barriers; place them again afterwards).
/// Returns how many dispatches ended at a different index.
pub fn reorder(graph: &mut ComputeGraph, lookahead: usize) -> usize {
    let nodes = graph.nodes_mut();
    nodes.retain(|n| n.as_dispatch().is_some());
    if nodes.len() < 2 || lookahead == 0 {
        return 0;
    }
    let fp = Footprint::new(nodes.iter().filter_map(Node::as_dispatch));
    let mut walk = greedy(&fp, lookahead);
    apply_order(nodes, &mut walk.order)
}

/// The outcome of the greedy walk.
pub(super) struct Walk {
    /// The new order, as indices into the old one.
    pub(super) order: Vec<u32>,
    /// Positions in the new order that a barrier must precede, ascending.
    pub(super) cuts: Vec<u32>,
}

/// Puts the dispatches in `order` and returns how many moved. `order` is consumed (left as the
/// identity).
pub(super) fn apply_order(nodes: &mut [Node], order: &mut [u32]) -> usize {
    let moved = order
        .iter()
        .enumerate()
        .filter(|(pos, &i)| *pos != i as usize)
        .count();
    if moved > 0 {
        permute(nodes, order);
    }
    moved
}

/// Puts `nodes[order[p]]` at position `p` for every `p`, in place: each cycle of the permutation
/// is a chain of swaps. `order` ends as the identity.
fn permute(nodes: &mut [Node], order: &mut [u32]) {
    for start in 0..order.len() {
        let mut cur = start;
        loop {
            let next = order[cur] as usize;
            order[cur] = cur as u32;
            if next == start || next == cur {
                break;
            }
            nodes.swap(cur, next);
            cur = next;
        }
    }
}

/// The greedy walk over the dispatches of `fp` (`lookahead` > 0).
pub(super) fn greedy(fp: &Footprint, lookahead: usize) -> Walk {
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
