//! The passes in one call: fusion, reordering and barrier placement share one footprint of the
//! fused dispatch list, and the nodes move once. The result is the same as running
//! [`fuse`](super::fuse), [`reorder`](super::reorder) and
//! [`place_barriers`](super::place_barriers) one after the other.

use super::barriers::{conflict_cuts, insert_barriers};
use super::fuse::fuse_dispatches;
use super::reorder::{apply_order, greedy};
use super::FusionRule;
use crate::graph::footprint::Footprint;
use crate::graph::{ComputeGraph, Node};

/// What [`optimize`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Optimized {
    /// Pairs of dispatches fused into one.
    pub fusions: usize,
    /// Dispatches that ended at a different index (after fusion).
    pub reordered: usize,
    /// Barriers placed.
    pub barriers: usize,
}

/// Fuses with `rules` (none: no fusion), reorders with a `lookahead` window (0: no reordering)
/// and places barriers, dropping the graph's old barriers.
pub fn optimize(graph: &mut ComputeGraph, rules: &[FusionRule], lookahead: usize) -> Optimized {
    let nodes = graph.nodes_mut();
    nodes.retain(|n| n.as_dispatch().is_some());
    let fusions = fuse_dispatches(nodes, rules);
    let fp = Footprint::new(nodes.iter().filter_map(Node::as_dispatch));
    let (reordered, cuts) = if lookahead > 0 && nodes.len() >= 2 {
        let mut walk = greedy(&fp, lookahead);
        (apply_order(nodes, &mut walk.order), walk.cuts)
    } else {
        (0, conflict_cuts(&fp))
    };
    insert_barriers(nodes, &cuts);
    Optimized {
        fusions,
        reordered,
        barriers: cuts.len(),
    }
}
