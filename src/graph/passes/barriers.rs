//! Barrier placement from read/write ranges, and the split point of a split submission.

use crate::graph::footprint::Footprint;
use crate::graph::ComputeGraph;

/// Drops every barrier and inserts one exactly before each dispatch that conflicts with the
/// current concurrent group. Returns the number of barriers placed.
pub fn place_barriers(graph: &mut ComputeGraph) -> usize {
    graph.drop_barriers();
    graph.refresh_overlaps();
    let fp = Footprint::new(graph);
    let cuts = conflict_cuts(&fp);
    insert_barriers(graph.order_mut(), &cuts);
    cuts.len()
}

/// How many barriers the dispatches of `graph` need in their recorded order, with no pass
/// applied (barriers already in the graph are ignored and left in place). The graph keeps the
/// view overlaps this computes, so passes run afterwards do not compute them again.
pub fn program_order_barriers(graph: &mut ComputeGraph) -> usize {
    graph.refresh_overlaps();
    conflict_cuts(&Footprint::new(graph)).len()
}

/// The indices of the dispatches of `fp` that conflict with the concurrent group before them.
///
/// The group is every dispatch since the last cut, so a dispatch conflicts with it exactly when
/// its latest earlier conflicting dispatch lies at or after that cut.
pub(super) fn conflict_cuts(fp: &Footprint) -> Vec<u32> {
    let mut cuts = Vec::new();
    let mut first = 0;
    for (i, &latest1) in fp.latest_conflicts().iter().enumerate() {
        if latest1 as usize > first {
            cuts.push(i as u32);
            first = i;
        }
    }
    cuts
}

/// Inserts a barrier before each dispatch index of `before` (ascending) in a barrier-free list.
pub(super) fn insert_barriers(nodes: &mut Vec<u32>, before: &[u32]) {
    // Grow by one barrier per cut, then walk back from the end, moving each dispatch to its final
    // slot: the slots between `src` and `dst` always hold barriers.
    let n = nodes.len();
    nodes.resize(n + before.len(), ComputeGraph::BARRIER);
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
    for (i, &entry) in graph.order().iter().enumerate() {
        if entry != ComputeGraph::BARRIER {
            seen += 1;
            if seen == first {
                return i + 1;
            }
        }
    }
    graph.len()
}
