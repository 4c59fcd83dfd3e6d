//! Barrier placement from read/write ranges, and the split point of a split submission.

use crate::graph::footprint::{Footprint, Marks};
use crate::graph::{ComputeGraph, Node};

/// Drops every barrier and inserts one exactly before each dispatch that conflicts with the
/// current concurrent group. Returns the number of barriers placed.
pub fn place_barriers(graph: &mut ComputeGraph) -> usize {
    let nodes = graph.nodes_mut();
    nodes.retain(|n| n.as_dispatch().is_some());
    let fp = Footprint::new(nodes.iter().filter_map(Node::as_dispatch));
    let cuts = conflict_cuts(&fp);
    insert_barriers(nodes, &cuts);
    cuts.len()
}

/// The indices of the dispatches of `fp` that conflict with the concurrent group before them.
pub(super) fn conflict_cuts(fp: &Footprint) -> Vec<u32> {
    let mut cuts = Vec::new();
    let mut group = Marks::new(fp);
    for i in 0..fp.len() {
        if group.conflicts(fp, i) {
            cuts.push(i as u32);
            group.clear();
        }
        group.add(fp, i);
    }
    cuts
}

/// Inserts a barrier before each dispatch index of `before` (ascending) in a barrier-free list.
pub(super) fn insert_barriers(nodes: &mut Vec<Node>, before: &[u32]) {
    // Grow by one barrier per cut, then walk back from the end, moving each dispatch to its final
    // slot: the slots between `src` and `dst` always hold barriers.
    let n = nodes.len();
    nodes.resize_with(n + before.len(), || Node::Barrier);
    let (mut src, mut dst) = (n, n + before.len());
    for &at in before.iter().rev() {
        while src > at as usize {
            src -= 1;
            dst -= 1;
            nodes.swap(src, dst);
        }
        dst -= 1;
    }
}

/// Where a split submission cuts the node list: just after the `max(64, n / 10)`-th dispatch
/// (`n` dispatches in all), or at the end when there are fewer.
pub fn split_index(graph: &ComputeGraph) -> usize {
    let total = graph.dispatch_count();
    let first = (total / 10).max(64);
    let mut seen = 0;
    for (i, node) in graph.nodes().iter().enumerate() {
        if node.as_dispatch().is_some() {
            seen += 1;
            if seen == first {
                return i + 1;
            }
        }
    }
    graph.nodes().len()
}
