//! Fusion: a table of rules, each turning two adjacent dispatches into one.
//!
//! A rule matches a dispatch of kind `first` followed directly (barriers aside) by one of kind
//! `second` that reads `first`'s output. Unlike the seeds, the pass also proves that what the
//! fused dispatch no longer writes is dead: for every byte range the first dispatch wrote and the
//! fused one does not (the intermediate), no later dispatch may read any byte of it before a later
//! dispatch overwrites all of it. A range still live at the end of the graph counts as read (the
//! caller may download it). If that cannot be shown, the pair stays as it is.
//!
//! A fused dispatch may fuse again with the dispatch after it (chains like add, norm, mul).

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
        write!(
            f,
            "FusionRule({}: {:?} + {:?})",
            self.name, self.first, self.second
        )
    }
}

/// Applies the rules left to right over the graph (barriers are dropped; place them again
/// afterwards). Returns the number of fusions made.
pub fn fuse(graph: &mut ComputeGraph, rules: &[FusionRule]) -> usize {
    let nodes = graph.nodes_mut();
    nodes.retain(|n| n.as_dispatch().is_some());
    fuse_dispatches(nodes, rules)
}

/// [`fuse`] on a list without barriers.
pub(super) fn fuse_dispatches(nodes: &mut Vec<Node>, rules: &[FusionRule]) -> usize {
    if rules.is_empty() {
        return 0;
    }
    // nodes[..kept] is the output; a fused pair replaces nodes[kept - 1], and the slots between
    // `kept` and `i` hold dispatches fused away, dropped at the end.
    let mut kept: usize = 0;
    let mut fusions = 0;
    for i in 0..nodes.len() {
        let fused = match (kept.checked_sub(1).map(|k| &nodes[k]), &nodes[i]) {
            (Some(Node::Dispatch(a)), Node::Dispatch(b)) => {
                let rest = nodes[i + 1..].iter().filter_map(Node::as_dispatch);
                try_rules(rules, a, b, rest)
            }
            _ => None,
        };
        match fused {
            Some(d) => {
                nodes[kept - 1] = Node::Dispatch(d);
                fusions += 1;
            }
            None => {
                nodes.swap(kept, i);
                kept += 1;
            }
        }
    }
    nodes.truncate(kept);
    fusions
}

fn try_rules<'a>(
    rules: &[FusionRule],
    a: &Dispatch,
    b: &Dispatch,
    rest: impl Iterator<Item = &'a Dispatch> + Clone,
) -> Option<Dispatch> {
    rules
        .iter()
        .filter(|r| r.first == a.op() && r.second == b.op())
        .find_map(|rule| {
            let mid = (rule.intermediate)(a, b)?;
            // The rule's claim must hold: `a` writes the intermediate and `b` reads it.
            if !a.writes().iter().any(|w| w.overlaps(&mid))
                || !b.reads().iter().any(|r| r.overlaps(&mid))
            {
                return None;
            }
            let fused = (rule.build)(a, b).ok()?;
            // The intermediate, then `a`'s other writes (the intermediate is usually one of
            // them: checked once).
            let others = a.writes().iter().filter(|w| **w != mid);
            for w in std::iter::once(&mid).chain(others) {
                let still_written = fused.writes().iter().any(|f| f.covers(w));
                if !still_written && !is_dead_after(w, rest.clone()) {
                    return None;
                }
            }
            Some(fused)
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
