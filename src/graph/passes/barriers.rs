//! Barrier placement from read/write ranges, and the split point of a split submission.

use crate::graph::ranges::Footprints;
use crate::graph::{ComputeGraph, Node, RangeSet};

/// Drops every barrier and inserts one exactly before each dispatch that conflicts with the
/// current concurrent group. Returns the number of barriers placed.
pub fn place_barriers(graph: &mut ComputeGraph) -> usize {
    let nodes = graph.nodes_mut();
    nodes.retain(|n| n.as_dispatch().is_some());
    let fp = Footprints::new(nodes.iter().filter_map(Node::as_dispatch));
    let mut before = Vec::new();
    let mut group = RangeSet::new();
    for i in 0..nodes.len() {
        let (reads, writes) = fp.get(i);
        if group.conflicts(reads, writes) {
            before.push(i);
            group.clear();
        }
        group.add(reads, writes);
    }
    if !before.is_empty() {
        let old = std::mem::take(nodes);
        nodes.reserve(old.len() + before.len());
        let mut next = before.iter().copied().peekable();
        for (i, node) in old.into_iter().enumerate() {
            if next.next_if_eq(&i).is_some() {
                nodes.push(Node::Barrier);
            }
            nodes.push(node);
        }
    }
    before.len()
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
