//! Greedy reordering for concurrency, after the seeds and llama.cpp's Metal graph optimizer.
//!
//! Walking the dispatches in order, the pass keeps the ranges of the current concurrent group.
//! When the next dispatch conflicts with the group (so a barrier would go before it), it first
//! looks ahead up to `lookahead` dispatches for ones that conflict neither with the group nor with
//! any dispatch skipped over, and pulls them into the group. A dispatch that may not move stops the
//! lookahead, and a group closed by one that may not move is not filled from beyond it, so such a
//! dispatch keeps its place relative to every other dispatch.

use crate::graph::{ComputeGraph, Node, RangeSet};

/// The seeds' lookahead window.
pub const DEFAULT_LOOKAHEAD: usize = 64;

/// Reorders the dispatches of `graph` (dropping its barriers; place them again afterwards).
/// Returns how many dispatches ended at a different index.
pub fn reorder(graph: &mut ComputeGraph, lookahead: usize) -> usize {
    let nodes: Vec<_> = std::mem::take(graph.nodes_mut())
        .into_iter()
        .filter(|n| n.as_dispatch().is_some())
        .collect();
    let n = nodes.len();
    let mut order = Vec::with_capacity(n);
    let mut used = vec![false; n];
    let mut group = RangeSet::new();
    let mut skipped = RangeSet::new();
    for i0 in 0..n {
        if used[i0] {
            continue;
        }
        let Some(d0) = nodes[i0].as_dispatch() else {
            continue;
        };
        if group.conflicts(d0.reads(), d0.writes()) {
            if d0.op().is_reorderable() {
                skipped.clear();
                skipped.add(d0.reads(), d0.writes());
                let end = (i0 + 1 + lookahead).min(n);
                for i1 in i0 + 1..end {
                    if used[i1] {
                        continue;
                    }
                    let Some(d1) = nodes[i1].as_dispatch() else {
                        continue;
                    };
                    if !d1.op().is_reorderable() {
                        break;
                    }
                    if !group.conflicts(d1.reads(), d1.writes())
                        && !skipped.conflicts(d1.reads(), d1.writes())
                    {
                        group.add(d1.reads(), d1.writes());
                        order.push(i1);
                        used[i1] = true;
                    } else {
                        skipped.add(d1.reads(), d1.writes());
                    }
                }
            }
            group.clear();
        }
        group.add(d0.reads(), d0.writes());
        order.push(i0);
        used[i0] = true;
    }
    let moved = order
        .iter()
        .enumerate()
        .filter(|(pos, &i)| *pos != i)
        .count();
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    *graph.nodes_mut() = order.iter().filter_map(|&i| slots[i].take()).collect();
    moved
}
