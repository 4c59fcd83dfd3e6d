//! Barrier placement from read/write ranges, and the split point of a split submission.

use crate::graph::{ComputeGraph, Node, RangeSet};

/// Drops every barrier and inserts one exactly before each dispatch that conflicts with the
/// current concurrent group. Returns the number of barriers placed.
pub fn place_barriers(graph: &mut ComputeGraph) -> usize {
    let old = std::mem::take(graph.nodes_mut());
    let mut nodes = Vec::with_capacity(old.len() + old.len() / 2);
    let mut group = RangeSet::new();
    let mut barriers = 0;
    for node in old {
        let Node::Dispatch(d) = node else { continue };
        if group.conflicts(d.reads(), d.writes()) {
            nodes.push(Node::Barrier);
            barriers += 1;
            group.clear();
        }
        group.add(d.reads(), d.writes());
        nodes.push(Node::Dispatch(d));
    }
    *graph.nodes_mut() = nodes;
    barriers
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
