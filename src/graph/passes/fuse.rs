//! Fusion: a table of rules, each turning two adjacent dispatches into one.
//!
//! A rule matches a dispatch of kind `first` followed directly (barriers aside) by one of kind
//! `second` that reads `first`'s output. Unlike the seeds, the pass also proves that the
//! intermediate is dead: no later dispatch may read any byte of it before a later dispatch
//! overwrites all of it. If that cannot be shown, the pair stays as it is.

use crate::error::Result;
use crate::graph::{ComputeGraph, Dispatch, Node, OpKind, Range};

/// One fusion rule. The rule functions live next to the kernels they fuse (in `ops/`).
#[derive(Clone, Copy)]
pub struct FusionRule {
    /// A short name for reports.
    pub name: &'static str,
    /// The kind of the first dispatch.
    pub first: OpKind,
    /// The kind of the second dispatch.
    pub second: OpKind,
    /// The intermediate the pair would no longer materialize: `first`'s output as `second`
    /// reads it. `None` when the pair does not match the rule.
    pub intermediate: fn(&Dispatch, &Dispatch) -> Option<Range>,
    /// Builds the fused dispatch. An error means "do not fuse this pair".
    pub build: fn(&Dispatch, &Dispatch) -> Result<Dispatch>,
}

impl std::fmt::Debug for FusionRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FusionRule({}: {:?} + {:?})", self.name, self.first, self.second)
    }
}

/// Applies the rules left to right over the graph (barriers are dropped; place them again
/// afterwards). Returns the number of fusions made.
pub fn fuse(graph: &mut ComputeGraph, rules: &[FusionRule]) -> usize {
    let mut dispatches: Vec<Option<Dispatch>> = std::mem::take(graph.nodes_mut())
        .into_iter()
        .filter_map(|n| match n {
            Node::Dispatch(d) => Some(Some(d)),
            Node::Barrier => None,
        })
        .collect();
    let mut fusions = 0;
    let mut i = 0;
    while i + 1 < dispatches.len() {
        let fused = match (&dispatches[i], &dispatches[i + 1]) {
            (Some(a), Some(b)) => try_rules(rules, a, b, &dispatches[i + 2..]),
            _ => None,
        };
        if let Some(d) = fused {
            dispatches[i] = Some(d);
            dispatches[i + 1] = None;
            dispatches.remove(i + 1);
            fusions += 1;
        }
        i += 1;
    }
    *graph.nodes_mut() = dispatches.into_iter().flatten().map(Node::Dispatch).collect();
    fusions
}

fn try_rules(
    rules: &[FusionRule],
    a: &Dispatch,
    b: &Dispatch,
    rest: &[Option<Dispatch>],
) -> Option<Dispatch> {
    rules
        .iter()
        .filter(|r| r.first == a.op() && r.second == b.op())
        .find_map(|rule| {
            let mid = (rule.intermediate)(a, b)?;
            if !is_dead_after(&mid, rest.iter().flatten()) {
                return None;
            }
            (rule.build)(a, b).ok()
        })
}

/// Whether `range` is overwritten in full before any of `later` reads a byte of it.
fn is_dead_after<'a>(range: &Range, later: impl Iterator<Item = &'a Dispatch>) -> bool {
    for d in later {
        if d.reads().iter().any(|r| r.overlaps(range)) {
            return false;
        }
        if d.writes().iter().any(|w| w.covers(range)) {
            return true;
        }
    }
    false
}
