//! Fusion: rules that turn a small subgraph of dispatches, connected by data flow, into one.
//!
//! A rule has an *anchor*, the op kind of its first dispatch, and a [`Pattern`] that finds the
//! rest from there: either the anchor's next reader ([`Pattern::Pair`], what most rules need), or
//! a matcher function that walks the data flow with a [`Matcher`] ([`Pattern::Graph`]: a norm, the
//! products that read it, the RoPE and cache writes after them). The rule checks the shapes,
//! dtypes and parameters of what it found and describes the fused dispatch; the pass then proves
//! that the replacement is sound before it makes it:
//!
//! - the fused dispatch takes the place of the pattern's last dispatch, so every dispatch between
//!   the anchor and that place that is not in the pattern must commute with the pattern's
//!   dispatches before it (no read of what they write, no write of what they read or write);
//! - every byte range a pattern dispatch wrote and the fused one does not write (the
//!   intermediates) is dead: no later dispatch reads a byte of it before a later dispatch
//!   overwrites all of it, and a range still live at the end of the graph counts as read (the
//!   caller may download it) unless the caller marked it as scratch
//!   ([`ComputeGraph::mark_scratch`]).
//!
//! If either cannot be shown, the dispatches stay as they are. A rule may also be limited to
//! passes of at most some rows ([`FusionRule::up_to_rows`]): that is how a backend says that a
//! fused kernel pays for a decode step but not for a prompt. A fused dispatch may fuse again with
//! the dispatches after it (chains like norm, mul).

use crate::error::Result;
use crate::graph::compute_graph::Resolved;
use crate::graph::{ComputeGraph, DispatchRef, DispatchSpec, OpKind, Range};

/// How far after its anchor a pattern may reach, in dispatches.
pub const PATTERN_WINDOW: usize = 24;

/// Most dispatches one pattern may replace.
pub const MAX_PATTERN_NODES: usize = 12;

/// An order entry that a fusion took out.
const GONE: u32 = u32::MAX;

/// The pair form of a rule: the intermediate and the fused dispatch of an anchor and its reader.
pub type PairIntermediate = fn(DispatchRef<'_>, DispatchRef<'_>) -> Option<Range>;

/// Describes the fused dispatch of a pair (its buffers borrowed from the pair). An error means
/// "do not fuse this pair".
pub type PairBuild = for<'a> fn(DispatchRef<'a>, DispatchRef<'a>) -> Result<DispatchSpec<'a>>;

/// Finds a whole pattern from its anchor, or `None`.
pub type GraphFind = for<'g> fn(&Matcher<'g>, At) -> Option<Found<'g>>;

/// What a rule matches after its anchor.
#[derive(Clone, Copy)]
pub enum Pattern {
    /// The anchor and the first later dispatch that reads a byte the anchor writes, which must be
    /// of kind `second`.
    Pair {
        /// The kind of the reader.
        second: OpKind,
        /// The anchor's output as the reader reads it; `None` when the pair does not match.
        intermediate: PairIntermediate,
        /// The fused dispatch.
        build: PairBuild,
    },
    /// A subgraph that a function finds from the anchor.
    Graph {
        /// The subgraph in words, for `graph --rules`.
        shape: &'static str,
        /// The matcher.
        find: GraphFind,
    },
}

/// One fusion rule. The rules live next to the kernels they fuse (in `ops/`); which of them a
/// backend applies, and up to how many rows, is the backend's declaration.
#[derive(Clone, Copy)]
pub struct FusionRule {
    /// A short name for reports (`graph --stats` counts fusions by it).
    pub name: &'static str,
    /// The kind of the pattern's first dispatch.
    pub anchor: OpKind,
    /// What the rule matches from the anchor.
    pub pattern: Pattern,
    /// The most rows (tokens) of a pass the rule fuses; `None`: any.
    pub max_rows: Option<usize>,
    /// Whether the rule matches what the narrowing makes (`graph::passes::narrow`), so the
    /// optimizer applies it after narrowing, not before ([`optimize`](super::optimize)).
    pub after_narrowing: bool,
}

impl FusionRule {
    /// A two-dispatch rule: `first`, then its first reader, of kind `second`.
    pub const fn pair(
        name: &'static str,
        first: OpKind,
        second: OpKind,
        intermediate: PairIntermediate,
        build: PairBuild,
    ) -> FusionRule {
        FusionRule {
            name,
            anchor: first,
            pattern: Pattern::Pair {
                second,
                intermediate,
                build,
            },
            max_rows: None,
            after_narrowing: false,
        }
    }

    /// A rule whose pattern `find` matches from a dispatch of kind `anchor`; `shape` says in
    /// words what it matches.
    pub const fn graph(
        name: &'static str,
        anchor: OpKind,
        shape: &'static str,
        find: GraphFind,
    ) -> FusionRule {
        FusionRule {
            name,
            anchor,
            pattern: Pattern::Graph { shape, find },
            max_rows: None,
            after_narrowing: false,
        }
    }

    /// The same rule for passes of at most `max` rows (`None`: any).
    pub const fn up_to_rows(mut self, max: Option<usize>) -> FusionRule {
        self.max_rows = max;
        self
    }

    /// The same rule in the optimizer's late stage, after the narrowing.
    pub const fn after_narrowing(mut self) -> FusionRule {
        self.after_narrowing = true;
        self
    }

    /// The pattern in words, for `graph --rules`.
    pub fn describe(&self) -> String {
        match self.pattern {
            Pattern::Pair { second, .. } => {
                format!("{} -> {}", self.anchor.name(), second.name())
            }
            Pattern::Graph { shape, .. } => shape.to_string(),
        }
    }
}

impl std::fmt::Debug for FusionRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FusionRule({}: {})", self.name, self.describe())
    }
}

/// A position in the dispatch order, as a matcher sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct At(usize);

/// A pattern found by a rule: the dispatches it replaces and the fused dispatch.
#[derive(Debug)]
pub struct Found<'g> {
    nodes: [At; MAX_PATTERN_NODES],
    len: usize,
    fused: DispatchSpec<'g>,
    rows: usize,
}

impl<'g> Found<'g> {
    /// The pattern of `nodes` (the anchor among them, at most [`MAX_PATTERN_NODES`]) replaced by
    /// `fused`, in a pass of `rows` rows. `None` when there are too many nodes.
    pub fn new(nodes: &[At], fused: DispatchSpec<'g>, rows: usize) -> Option<Self> {
        if nodes.is_empty() || nodes.len() > MAX_PATTERN_NODES {
            return None;
        }
        let mut all = [At(0); MAX_PATTERN_NODES];
        all[..nodes.len()].copy_from_slice(nodes);
        all[..nodes.len()].sort_unstable();
        Some(Found {
            nodes: all,
            len: nodes.len(),
            fused,
            rows,
        })
    }

    fn nodes(&self) -> &[At] {
        &self.nodes[..self.len]
    }
}

/// What a [`Pattern::Graph`] function sees: the dispatches in order from its anchor, up to
/// [`PATTERN_WINDOW`] later, and who reads what.
pub struct Matcher<'g> {
    graph: &'g ComputeGraph,
    order: &'g [u32],
    end: usize,
}

impl<'g> Matcher<'g> {
    /// The dispatch at `at`.
    pub fn dispatch(&self, at: At) -> DispatchRef<'g> {
        self.graph.dispatch_at(self.order[at.0])
    }

    /// The dispatches after `from`, in the window, that read a byte of `range`, in order; the
    /// walk ends after the first dispatch that overwrites all of it (later readers see another
    /// value).
    pub fn readers(&self, from: At, range: Range) -> impl Iterator<Item = At> + '_ {
        let table = self.graph.view_ranges();
        let mut done = false;
        (from.0 + 1..self.end).filter_map(move |j| {
            let h = self.order[j];
            if done || h == GONE {
                return None;
            }
            let (reads, writes) = self.graph.ids_at(h);
            let reads_it = reads.iter().any(|&k| table[k as usize].overlaps(&range));
            done = writes.iter().any(|&k| table[k as usize].covers(&range));
            reads_it.then_some(At(j))
        })
    }

    /// The one reader of `range` after `from` ([`readers`](Self::readers)), if there is exactly
    /// one.
    pub fn only_reader(&self, from: At, range: Range) -> Option<At> {
        let mut it = self.readers(from, range);
        let first = it.next()?;
        it.next().is_none().then_some(first)
    }
}

/// What the fusion pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fusions {
    /// Patterns fused.
    pub total: usize,
    /// Patterns fused per rule name, in the order of the rules' first fusion.
    pub by_rule: Vec<(&'static str, usize)>,
}

impl Fusions {
    /// Adds `other`'s counts (a later stage's) to these.
    pub(super) fn merge(&mut self, other: Fusions) {
        for (name, c) in other.by_rule {
            for _ in 0..c {
                self.count(name);
            }
        }
    }

    fn count(&mut self, name: &'static str) {
        self.total += 1;
        match self.by_rule.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => self.by_rule.push((name, 1)),
        }
    }
}

/// Applies the rules over the graph (barriers are dropped; place them again afterwards).
/// Returns the number of fusions made.
pub fn fuse(graph: &mut ComputeGraph, rules: &[FusionRule]) -> usize {
    graph.drop_barriers();
    fuse_dispatches(graph, rules).total
}

/// [`fuse`] on a graph without barriers, with the counts per rule.
pub(super) fn fuse_dispatches(graph: &mut ComputeGraph, rules: &[FusionRule]) -> Fusions {
    let mut done = Fusions::default();
    if rules.is_empty() {
        return done;
    }
    graph.refresh_overlaps();
    // The op kinds (by code) that anchor some rule, one bit each.
    let anchors = rules
        .iter()
        .fold(0u32, |bits, r| bits | 1 << r.anchor.code());
    let mut order = std::mem::take(graph.order_mut());
    let mut fused = Resolved::new();
    for i in 0..order.len() {
        let h = order[i];
        if h == GONE || anchors & (1 << graph.op_at(h).code()) == 0 {
            continue;
        }
        let Some((rule, found, len)) = first_match(rules, graph, &order, i, &mut fused) else {
            continue;
        };
        let nodes = &found[..len];
        let Ok(new) = graph.add_detached(&fused) else {
            continue;
        };
        let (last, rest) = nodes.split_last().expect("a pattern has nodes");
        for at in rest {
            order[at.0] = GONE;
        }
        order[last.0] = new;
        done.count(rule);
    }
    order.retain(|&h| h != GONE);
    *graph.order_mut() = order;
    done
}

/// The first rule that matches at order position `i` and whose replacement is sound: its name
/// and pattern positions (the first `len` of the array, in order), with the fused dispatch left
/// in `out`, resolved against the graph.
fn first_match(
    rules: &[FusionRule],
    graph: &ComputeGraph,
    order: &[u32],
    i: usize,
    out: &mut Resolved,
) -> Option<(&'static str, [At; MAX_PATTERN_NODES], usize)> {
    let op = graph.op_at(order[i]);
    let m = Matcher {
        graph,
        order,
        end: order.len().min(i + 1 + PATTERN_WINDOW),
    };
    for rule in rules.iter().filter(|r| r.anchor == op) {
        let Some(found) = find(rule, &m, At(i)) else {
            continue;
        };
        if found.nodes()[0] != At(i) || rule.max_rows.is_some_and(|max| found.rows > max) {
            continue;
        }
        if sound(graph, order, &found) {
            graph.resolve_into(&found.fused, out);
            return Some((rule.name, found.nodes, found.len));
        }
    }
    None
}

/// Runs a rule's pattern from `at`.
fn find<'g>(rule: &FusionRule, m: &Matcher<'g>, at: At) -> Option<Found<'g>> {
    match rule.pattern {
        Pattern::Graph { find, .. } => find(m, at),
        Pattern::Pair {
            second,
            intermediate,
            build,
        } => {
            let a = m.dispatch(at);
            let written = a.writes();
            let next = (at.0 + 1..m.end).find(|&j| {
                let h = m.order[j];
                h != GONE
                    && m.graph
                        .dispatch_at(h)
                        .reads()
                        .iter()
                        .any(|r| written.iter().any(|w| w.overlaps(&r)))
            })?;
            let b = m.dispatch(At(next));
            if b.op() != second {
                return None;
            }
            let mid = intermediate(a, b)?;
            // The rule's claim must hold: `a` writes the intermediate and `b` reads it.
            if !a.writes().iter().any(|w| w.overlaps(&mid))
                || !b.reads().iter().any(|r| r.overlaps(&mid))
            {
                return None;
            }
            let spec = build(a, b).ok()?;
            Found::new(&[at, At(next)], spec, written_rows(a))
        }
    }
}

/// The rows of a dispatch's first written buffer (1 when it writes none).
fn written_rows(d: DispatchRef<'_>) -> usize {
    (0..d.args().len())
        .filter_map(|i| d.buffer_arg(i))
        .find(|(_, access)| access.writes())
        .map_or(1, |(b, _)| b.shape().rows())
}

/// Whether replacing the pattern by its fused dispatch, at the place of its last dispatch,
/// keeps the graph's meaning (see the module documentation).
fn sound(graph: &ComputeGraph, order: &[u32], found: &Found<'_>) -> bool {
    let nodes = found.nodes();
    let (first, last) = (nodes[0].0, nodes[nodes.len() - 1].0);
    if nodes.windows(2).any(|w| w[0] == w[1]) || nodes.iter().any(|a| order[a.0] == GONE) {
        return false;
    }
    let table = graph.view_ranges();
    let hits = |a: &[u32], b: &[u32]| {
        a.iter().any(|&x| {
            b.iter()
                .any(|&y| table[x as usize].overlaps(&table[y as usize]))
        })
    };
    // Every other dispatch in between commutes with the pattern's dispatches before it.
    let mut next = 0;
    for (j, &h) in order.iter().enumerate().take(last).skip(first + 1) {
        while nodes[next].0 < j {
            next += 1;
        }
        if h == GONE || nodes[next].0 == j {
            continue;
        }
        let (r, w) = graph.ids_at(h);
        for p in &nodes[..next] {
            let (pr, pw) = graph.ids_at(order[p.0]);
            if hits(w, pr) || hits(w, pw) || hits(r, pw) {
                return false;
            }
        }
    }
    // Every write the fused dispatch does not make is dead after the pattern.
    let later = &order[last + 1..];
    nodes.iter().all(|p| {
        let (_, writes) = graph.ids_at(order[p.0]);
        writes.iter().all(|&k| {
            let w = &table[k as usize];
            found.fused.writes().any(|f| f.covers(w)) || is_dead_after(w, k, graph, later)
        })
    })
}

/// Whether `range` (the range of view `view`) is overwritten in full before any of the
/// dispatches (header indices, [`GONE`] skipped) of `later` reads a byte of it.
fn is_dead_after(range: &Range, view: u32, graph: &ComputeGraph, later: &[u32]) -> bool {
    let later = later.iter().copied().filter(|&h| h != GONE);
    // A view that overlaps no other view is read or overwritten only through itself.
    // Each dispatch's view indices are its reads, then its writes: the first that names the view
    // says which comes first.
    if graph.kept_overlaps().is_some_and(|o| o.alone(view)) {
        let ids = graph.all_range_views();
        for h in later {
            let (_, [a, mid, end]) = graph.span_at(h);
            if let Some(p) = ids[a as usize..end as usize]
                .iter()
                .position(|&x| x == view)
            {
                return a as usize + p >= mid as usize;
            }
        }
        return graph.is_scratch(range);
    }
    let table = graph.view_ranges();
    for h in later {
        let (reads, writes) = graph.ids_at(h);
        if reads.iter().any(|&k| table[k as usize].overlaps(range)) {
            return false;
        }
        if writes.iter().any(|&k| table[k as usize].covers(range)) {
            return true;
        }
    }
    graph.is_scratch(range)
}
