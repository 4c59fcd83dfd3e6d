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
use crate::graph::compute_graph::Resolved;
use crate::graph::{ComputeGraph, DispatchRef, DispatchSpec, OpKind, Range};

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
    pub intermediate: fn(DispatchRef<'_>, DispatchRef<'_>) -> Option<Range>,
    /// Describes the fused dispatch (its buffers borrowed from the pair). An error means "do
    /// not fuse this pair".
    pub build: for<'a> fn(DispatchRef<'a>, DispatchRef<'a>) -> Result<DispatchSpec<'a>>,
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
    graph.drop_barriers();
    fuse_dispatches(graph, rules)
}

/// [`fuse`] on a graph without barriers.
pub(super) fn fuse_dispatches(graph: &mut ComputeGraph, rules: &[FusionRule]) -> usize {
    if rules.is_empty() {
        return 0;
    }
    graph.refresh_overlaps();
    // Per first op kind (by code): the second kinds some rule pairs it with, one bit each.
    let mut pairs = [0u32; OpKind::CODES];
    for r in rules {
        pairs[r.first.code()] |= 1 << r.second.code();
    }
    let mut order = std::mem::take(graph.order_mut());
    // order[..kept] is the output; a fused pair replaces order[kept - 1].
    let mut kept: usize = 0;
    let mut fusions = 0;
    let mut fused = Resolved::new();
    // What a rule may pair with order[kept - 1], as `pairs` holds it (none before the first).
    let mut follows = 0u32;
    for i in 0..order.len() {
        let cur = order[i];
        let op = graph.op_at(cur).code();
        if follows & (1 << op) != 0 {
            let prev = order[kept - 1];
            let found = try_rules(rules, graph, prev, cur, &order[i + 1..], &mut fused);
            if let Some(Ok(h)) = found.then(|| graph.add_detached(&fused)) {
                order[kept - 1] = h;
                follows = pairs[graph.op_at(h).code()];
                fusions += 1;
                continue;
            }
        }
        order[kept] = cur;
        kept += 1;
        follows = pairs[op];
    }
    order.truncate(kept);
    *graph.order_mut() = order;
    fusions
}

/// Whether a rule fuses headers `a` and `b`: the first rule that matches and whose dropped
/// writes are dead before the dispatches (header indices) of `later` read them. Its fused
/// dispatch is left in `out`, resolved against the graph (so it is copied once, into the graph).
fn try_rules(
    rules: &[FusionRule],
    graph: &ComputeGraph,
    a_h: u32,
    b_h: u32,
    later: &[u32],
    out: &mut Resolved,
) -> bool {
    let (a, b) = (graph.dispatch_at(a_h), graph.dispatch_at(b_h));
    for rule in rules {
        if rule.first != a.op() || rule.second != b.op() {
            continue;
        }
        let Some(mid) = (rule.intermediate)(a, b) else {
            continue;
        };
        // The rule's claim must hold: `a` writes the intermediate and `b` reads it.
        if !a.writes().iter().any(|w| w.overlaps(&mid))
            || !b.reads().iter().any(|r| r.overlaps(&mid))
        {
            continue;
        }
        // Borrowed where the rule built it (a spec is a few hundred bytes).
        let built = (rule.build)(a, b);
        let Ok(fused) = &built else {
            continue;
        };
        if dropped_writes_dead(graph, a_h, mid, fused, later) {
            graph.resolve_into(fused, out);
            return true;
        }
    }
    false
}

/// Whether every write of header `a_h` that `fused` no longer makes (the intermediate `mid`
/// first) is dead before `later` reads it.
fn dropped_writes_dead(
    graph: &ComputeGraph,
    a_h: u32,
    mid: Range,
    fused: &DispatchSpec<'_>,
    later: &[u32],
) -> bool {
    // The intermediate, then `a`'s other writes (the intermediate is usually one of them:
    // checked once), each with its view index when it is exactly a view.
    let (_, a_writes) = graph.ids_at(a_h);
    let table = graph.view_ranges();
    let dead = |w: &Range, view: Option<u32>| {
        fused.writes().any(|f| f.covers(w)) || is_dead_after(w, view, graph, later)
    };
    let mid_view = a_writes.iter().copied().find(|&k| table[k as usize] == mid);
    dead(&mid, mid_view)
        && a_writes.iter().all(|&k| {
            let w = &table[k as usize];
            *w == mid || dead(w, Some(k))
        })
}

/// Whether `range` is overwritten in full before any of the dispatches (header indices) of
/// `later` reads a byte of it. `view` is the view whose range it is, if it is one.
fn is_dead_after(range: &Range, view: Option<u32>, graph: &ComputeGraph, later: &[u32]) -> bool {
    // A view that overlaps no other view is read or overwritten only through itself.
    // Each dispatch's view indices are its reads, then its writes: the first that names the view
    // says which comes first.
    if let Some(k) = view.filter(|&k| graph.kept_overlaps().is_some_and(|o| o.alone(k))) {
        let ids = graph.all_range_views();
        for &h in later {
            let (_, [a, mid, end]) = graph.span_at(h);
            if let Some(p) = ids[a as usize..end as usize].iter().position(|&x| x == k) {
                return a as usize + p >= mid as usize;
            }
        }
        return false;
    }
    let table = graph.view_ranges();
    for &h in later {
        let (reads, writes) = graph.ids_at(h);
        if reads.iter().any(|&k| table[k as usize].overlaps(range)) {
            return false;
        }
        if writes.iter().any(|&k| table[k as usize].covers(range)) {
            return true;
        }
    }
    false
}
