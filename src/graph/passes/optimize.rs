//! The passes in one call: fusion, reordering and barrier placement share one footprint of the
//! fused dispatch list, and the nodes move once. The result is the same as running
//! [`fuse`](super::fuse), [`reorder`](super::reorder) and
//! [`place_barriers`](super::place_barriers) one after the other.

use super::barriers::{conflict_cuts, insert_barriers};
use super::fuse::fuse_dispatches;
use super::narrow::{narrow, NarrowRule};
use super::reorder::{apply_order, greedy};
use super::FusionRule;
use crate::graph::footprint::Footprint;
use crate::graph::ComputeGraph;

/// What [`optimize`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Optimized {
    /// Patterns of dispatches fused into one.
    pub fusions: usize,
    /// Fusions per rule name.
    pub fusions_by_rule: Vec<(&'static str, usize)>,
    /// Producers narrowed (with their readers).
    pub narrowed: usize,
    /// Dispatches that ended at a different index (after fusion).
    pub reordered: usize,
    /// Barriers placed.
    pub barriers: usize,
}

/// Fuses with `rules` (none: no fusion), narrows with `narrowings` (`narrow`), fuses again with
/// the rules that match what narrowing makes ([`FusionRule::after_narrowing`]), reorders with a
/// `lookahead` window (0: no reordering) and places barriers, dropping the graph's old barriers.
pub fn optimize(
    graph: &mut ComputeGraph,
    rules: &[FusionRule],
    narrowings: &[NarrowRule],
    lookahead: usize,
) -> Optimized {
    graph.drop_barriers();
    let (late, early): (Vec<FusionRule>, Vec<FusionRule>) =
        rules.iter().partition(|r| r.after_narrowing);
    let mut fused = fuse_dispatches(graph, &early);
    let narrowed = narrow(graph, narrowings);
    fused.merge(fuse_dispatches(graph, &late));
    graph.refresh_overlaps();
    let fp = Footprint::new(graph);
    let (reordered, cuts) = if lookahead > 0 && fp.len() >= 2 {
        let mut walk = greedy(&fp, lookahead);
        drop(fp);
        (apply_order(graph.order_mut(), &mut walk.order), walk.cuts)
    } else {
        (0, conflict_cuts(&fp))
    };
    insert_barriers(graph.order_mut(), &cuts);
    Optimized {
        fusions: fused.total,
        fusions_by_rule: fused.by_rule,
        narrowed,
        reordered,
        barriers: cuts.len(),
    }
}
