//! Narrowing: where every reader of a producer's output can take it in a narrower dtype that it
//! would round it to anyway, the producer writes that dtype into the first bytes of the same
//! buffer and the readers read it there. The rules today (`ops::narrow`): an f32 `rms_norm` or
//! SwiGLU whose every reader is a tensor-core product (which rounds its activations to f16)
//! writes f16, and the products read f16: half the activation bytes, no conversion per output
//! tile, the same bits.
//!
//! Dispatches keep their places; what the pass proves before it rewrites a producer and its
//! readers:
//! - the producer reads no byte of its output (its narrow writes land on bytes of other rows);
//! - the readers are every dispatch that reads a byte of the producer's output before a later
//!   dispatch overwrites all of it (the whole order is walked, not a window);
//! - where nothing overwrites it, the output is marked as scratch (the caller does not read it);
//! - every reader has a narrowed form (the rule says so, checking its kernel, format and sizes).
//!
//! The narrowed producer writes a prefix of the bytes the old one wrote; the rest of them is
//! never read again (no reader is left that reads the wide value), so leaving it stale changes
//! nothing a dispatch or the caller sees.

use crate::graph::compute_graph::Resolved;
use crate::graph::{ComputeGraph, DispatchRef, DispatchSpec, Range};
use crate::memory::Buffer;

/// One narrowing: how to find a producer's output, and the narrowed forms.
#[derive(Clone, Copy)]
pub struct NarrowRule {
    /// A short name for reports.
    pub name: &'static str,
    /// The output a producer would narrow (`None`: not a producer of this rule), and its narrow
    /// view of the same first bytes.
    pub output: fn(DispatchRef<'_>) -> Option<(Buffer, Buffer)>,
    /// The producer writing the narrow view.
    pub producer: for<'a> fn(DispatchRef<'a>, &'a Buffer) -> Option<DispatchSpec<'a>>,
    /// A reader of the wide output (the first buffer) reading the narrow view (the second)
    /// instead; `None` where it cannot.
    pub reader: for<'a> fn(DispatchRef<'a>, &'a Buffer, &'a Buffer) -> Option<DispatchSpec<'a>>,
}

/// Applies `rules` over the graph's order (no barriers in it); returns the producers narrowed.
pub fn narrow(graph: &mut ComputeGraph, rules: &[NarrowRule]) -> usize {
    if rules.is_empty() {
        return 0;
    }
    graph.refresh_overlaps();
    let mut done = 0;
    for i in 0..graph.order().len() {
        for rule in rules {
            let Some(new) = rewrite(graph, rule, i) else {
                continue;
            };
            for (at, handle) in new {
                graph.order_mut()[at] = handle;
            }
            done += 1;
            break;
        }
    }
    done
}

/// The order positions and new handles of one narrowing at position `i`, recorded; `None` where
/// the rule does not apply there.
fn rewrite(graph: &mut ComputeGraph, rule: &NarrowRule, i: usize) -> Option<Vec<(usize, u32)>> {
    let order = graph.order().to_vec();
    let producer = graph.dispatch_at(order[i]);
    let (wide, narrow) = (rule.output)(producer)?;
    let range = Range::of(&wide);
    let table = graph.view_ranges();
    // A producer reading its own output's bytes would read values the narrow writes clobber.
    let (own_reads, _) = graph.ids_at(order[i]);
    if own_reads
        .iter()
        .any(|&k| table[k as usize].overlaps(&range))
    {
        return None;
    }
    let mut readers = Vec::new();
    let mut overwritten = false;
    for (j, &h) in order.iter().enumerate().skip(i + 1) {
        let (reads, writes) = graph.ids_at(h);
        if reads.iter().any(|&k| table[k as usize].overlaps(&range)) {
            readers.push(j);
        }
        if writes.iter().any(|&k| table[k as usize].covers(&range)) {
            overwritten = true;
            break;
        }
    }
    if readers.is_empty() || (!overwritten && !graph.is_scratch(&range)) {
        return None;
    }
    let mut specs = Vec::with_capacity(readers.len() + 1);
    specs.push((i, (rule.producer)(producer, &narrow)?));
    for &j in &readers {
        let d = graph.dispatch_at(order[j]);
        specs.push((j, (rule.reader)(d, &wide, &narrow)?));
    }
    // Resolve every spec while the graph is borrowed, then record them.
    let mut all = Vec::with_capacity(specs.len());
    for (at, spec) in &specs {
        let mut r = Resolved::new();
        graph.resolve_into(spec, &mut r);
        all.push((*at, r));
    }
    drop(specs);
    let mut new = Vec::with_capacity(all.len());
    for (at, r) in all {
        new.push((at, graph.add_detached(&r).ok()?));
    }
    Some(new)
}
