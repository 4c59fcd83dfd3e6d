//! Export of a graph for people: Graphviz DOT, and an SVG drawn here without Graphviz.
//!
//! Both show the concurrency groups (the dispatches between two barriers), each dispatch labelled
//! with its op kind and kernel, and the read-after-write dependencies: an edge from the latest
//! earlier dispatch that wrote bytes a dispatch reads.
//!
//! The SVG is a layered layout that stays readable at 600 nodes: one column per group (its
//! dispatches stacked), columns wrapped into rows, a red line for every barrier between columns,
//! boxes coloured by op kind with a legend, and dependency lines between boxes of one row (a
//! dependency that crosses rows is marked by a small notch on the box instead). Hovering a box
//! shows its index, kind, kernel and group.

use std::fmt::Write;

use super::{ComputeGraph, DispatchRef, Node, OpKind};

/// A dispatch of the graph with its group.
struct Item<'a> {
    dispatch: DispatchRef<'a>,
    group: usize,
}

fn items(graph: &ComputeGraph) -> Vec<Item<'_>> {
    let mut group = 0;
    let mut out = Vec::with_capacity(graph.nodes().len());
    for node in graph.nodes() {
        match node {
            Node::Barrier => {
                if out.last().is_some_and(|i: &Item<'_>| i.group == group) {
                    group += 1;
                }
            }
            Node::Dispatch(d) => out.push(Item { dispatch: d, group }),
        }
    }
    out
}

/// Read-after-write edges `(writer, reader)` by dispatch index: for each read range, the latest
/// earlier dispatch whose writes overlap it.
fn raw_edges(items: &[Item<'_>]) -> Vec<(usize, usize)> {
    let mut edges = Vec::new();
    for j in 0..items.len() {
        for r in items[j].dispatch.reads() {
            let writer = (0..j).rev().find(|&i| {
                let writes = items[i].dispatch.writes();
                writes.iter().any(|w| w.overlaps(&r))
            });
            if let Some(i) = writer {
                if edges.last() != Some(&(i, j)) && !edges.contains(&(i, j)) {
                    edges.push((i, j));
                }
            }
        }
    }
    edges
}

/// Fill colour of an op kind.
fn colour(op: OpKind) -> &'static str {
    match op {
        OpKind::MatMul | OpKind::MatMulId => "#7aa6e0",
        OpKind::RmsNorm | OpKind::RmsNormMul | OpKind::RmsNormAdd => "#f2c14e",
        OpKind::Rope | OpKind::RmsNormRope => "#b58bd6",
        OpKind::Add | OpKind::Mul | OpKind::Elementwise => "#8fd18f",
        OpKind::Copy | OpKind::Gather => "#c8c8c8",
        OpKind::KvWrite => "#f29e6d",
        OpKind::Attention | OpKind::Softmax => "#e06c75",
        OpKind::Argmax => "#6fc7c7",
        OpKind::Custom { .. } => "#f5f5a0",
    }
}

/// Kinds in legend order, with the label shown.
const LEGEND: [(OpKind, &str); 9] = [
    (OpKind::MatMul, "matmul"),
    (OpKind::RmsNorm, "rms_norm (+mul, +add)"),
    (OpKind::Rope, "rope (+rms_norm)"),
    (OpKind::Elementwise, "add / mul / elementwise"),
    (OpKind::KvWrite, "kv_write"),
    (OpKind::Attention, "attention / softmax"),
    (OpKind::Gather, "gather / copy"),
    (OpKind::Argmax, "argmax"),
    (OpKind::Custom { reorderable: true }, "custom"),
];

/// Short label drawn inside a box.
fn short(op: OpKind) -> &'static str {
    match op {
        OpKind::MatMul => "mm",
        OpKind::MatMulId => "mmid",
        OpKind::RmsNorm => "norm",
        OpKind::RmsNormMul => "n*w",
        OpKind::RmsNormAdd => "n+r",
        OpKind::Rope => "rope",
        OpKind::RmsNormRope => "n+rope",
        OpKind::Add => "add",
        OpKind::Mul => "mul",
        OpKind::Elementwise => "ew",
        OpKind::Copy => "cpy",
        OpKind::KvWrite => "kv",
        OpKind::Gather => "emb",
        OpKind::Softmax => "smax",
        OpKind::Attention => "attn",
        OpKind::Argmax => "amax",
        OpKind::Custom { .. } => "usr",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The graph in Graphviz DOT: one cluster per concurrency group, nodes labelled with op kind and
/// kernel, edges for read-after-write dependencies.
pub fn to_dot(graph: &ComputeGraph) -> String {
    let items = items(graph);
    let mut out = String::new();
    out.push_str("digraph onepass {\n  rankdir=LR;\n  compound=true;\n");
    out.push_str(
        "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n",
    );
    let mut start = 0;
    while start < items.len() {
        let g = items[start].group;
        let end = items[start..]
            .iter()
            .position(|i| i.group != g)
            .map_or(items.len(), |p| start + p);
        let _ = writeln!(
            out,
            "  subgraph cluster_{g} {{\n    label=\"group {g} ({} dispatches)\";\n    style=dashed;",
            end - start
        );
        for (k, item) in items[start..end].iter().enumerate() {
            let d = item.dispatch;
            let _ = writeln!(
                out,
                "    n{} [label=\"{}\\n{}\", fillcolor=\"{}\"];",
                start + k,
                d.op().name(),
                escape(d.kernel().name()),
                colour(d.op())
            );
        }
        out.push_str("  }\n");
        start = end;
    }
    for (i, j) in raw_edges(&items) {
        let _ = writeln!(out, "  n{i} -> n{j};");
    }
    out.push_str("}\n");
    out
}

const BOX_W: usize = 30;
const BOX_H: usize = 16;
const COL_W: usize = 36;
const ROW_GAP: usize = 34;
const MARGIN: usize = 20;
const COLS_PER_ROW: usize = 40;
const HEADER_H: usize = 70;

/// The graph as a standalone SVG (see the module documentation for the layout).
pub fn to_svg(graph: &ComputeGraph) -> String {
    let items = items(graph);
    let groups = items.last().map_or(0, |i| i.group + 1);
    let mut group_size = vec![0usize; groups];
    for i in &items {
        group_size[i.group] += 1;
    }
    // Place: column = group (wrapped), slot = position inside the group.
    let rows = groups.div_ceil(COLS_PER_ROW).max(1);
    let row_slots: Vec<usize> = (0..rows)
        .map(|r| {
            let lo = r * COLS_PER_ROW;
            group_size[lo.min(groups)..((r + 1) * COLS_PER_ROW).min(groups)]
                .iter()
                .copied()
                .max()
                .unwrap_or(1)
        })
        .collect();
    let mut row_y = Vec::with_capacity(rows);
    let mut y = HEADER_H;
    for slots in &row_slots {
        row_y.push(y);
        y += slots * (BOX_H + 4) + ROW_GAP;
    }
    let width = 2 * MARGIN + COLS_PER_ROW.min(groups.max(1)) * COL_W;
    let height = y + MARGIN;
    let mut pos = Vec::with_capacity(items.len());
    let mut slot = vec![0usize; groups];
    for item in &items {
        let (row, col) = (item.group / COLS_PER_ROW, item.group % COLS_PER_ROW);
        let x = MARGIN + col * COL_W + (COL_W - BOX_W) / 2;
        let y = row_y[row] + slot[item.group] * (BOX_H + 4);
        slot[item.group] += 1;
        pos.push((row, x, y));
    }

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"Helvetica, Arial, sans-serif\">"
    );
    let _ = writeln!(s, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let barriers = graph.barrier_count();
    let _ = writeln!(
        s,
        "<text x=\"{MARGIN}\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{} dispatches in {} \
         concurrent groups, {} barriers (red lines); columns are groups, read left to right, \
         row by row</text>",
        items.len(),
        groups,
        barriers
    );
    // Legend.
    let mut lx = MARGIN;
    for (op, label) in LEGEND {
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"34\" width=\"14\" height=\"12\" rx=\"2\" fill=\"{}\" \
             stroke=\"#555\" stroke-width=\"0.5\"/><text x=\"{}\" y=\"44\" font-size=\"11\">{}</text>",
            colour(op),
            lx + 18,
            escape(label)
        );
        lx += 26 + label.len() * 6;
    }
    let _ = writeln!(
        s,
        "<line x1=\"{lx}\" y1=\"40\" x2=\"{}\" y2=\"40\" stroke=\"#999\" stroke-width=\"0.8\"/>\
         <text x=\"{}\" y=\"44\" font-size=\"11\">read-after-write</text>",
        lx + 18,
        lx + 22
    );
    // Row bands and barrier lines between consecutive groups.
    for (r, &top) in row_y.iter().enumerate() {
        let h = row_slots[r] * (BOX_H + 4);
        let first = r * COLS_PER_ROW;
        let last = ((r + 1) * COLS_PER_ROW).min(groups);
        let _ = writeln!(
            s,
            "<text x=\"4\" y=\"{}\" font-size=\"9\" fill=\"#888\" transform=\"rotate(-90 4 {})\">g{first}</text>",
            top + h / 2,
            top + h / 2
        );
        for g in first.max(1)..last {
            let x = MARGIN + (g % COLS_PER_ROW) * COL_W;
            let _ = writeln!(
                s,
                "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#d33\" stroke-width=\"1\"/>",
                top - 4,
                top + h
            );
        }
    }
    // Dependency lines inside a row; notches for dependencies from an earlier row.
    let mut notched = vec![false; items.len()];
    for (i, j) in raw_edges(&items) {
        let ((ri, xi, yi), (rj, xj, yj)) = (pos[i], pos[j]);
        if ri == rj {
            let _ = writeln!(
                s,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{xj}\" y2=\"{}\" stroke=\"#999\" stroke-width=\"0.6\"/>",
                xi + BOX_W,
                yi + BOX_H / 2,
                yj + BOX_H / 2
            );
        } else {
            notched[j] = true;
        }
    }
    for (k, item) in items.iter().enumerate() {
        let (_, x, y) = pos[k];
        let d = item.dispatch;
        let pinned = if d.op().is_reorderable() {
            ""
        } else {
            ", not reorderable"
        };
        let _ = writeln!(
            s,
            "<g><title>#{k} {} {} (group {}{pinned})</title><rect x=\"{x}\" y=\"{y}\" \
             width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"3\" fill=\"{}\" stroke=\"{}\" \
             stroke-width=\"{}\"/><text x=\"{}\" y=\"{}\" font-size=\"8\" \
             text-anchor=\"middle\">{}</text></g>",
            d.op().name(),
            escape(d.kernel().name()),
            item.group,
            colour(d.op()),
            if pinned.is_empty() { "#555" } else { "#000" },
            if pinned.is_empty() { "0.5" } else { "1.5" },
            x + BOX_W / 2,
            y + BOX_H - 4,
            short(d.op())
        );
        if notched[k] {
            let _ = writeln!(
                s,
                "<path d=\"M{} {} l4 4 l-4 4 z\" fill=\"#666\"/>",
                x.saturating_sub(1),
                y + BOX_H / 2 - 4
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;
    use crate::graph::passes;
    use crate::graph::synthetic::{norm_mul_rule, DecodeGraph, DecodeShape};

    fn optimized(layers: usize) -> ComputeGraph {
        let dev = Device::cpu(1).expect("cpu");
        let dg = DecodeGraph::new(
            |t, d| dev.alloc(t, d),
            DecodeShape::SMOLLM2_135M.with_layers(layers),
        )
        .expect("dg");
        let mut g = dg.record().expect("record");
        passes::fuse(&mut g, &[norm_mul_rule()]);
        passes::reorder(&mut g, passes::DEFAULT_LOOKAHEAD);
        passes::place_barriers(&mut g);
        g
    }

    #[test]
    fn given_a_decode_graph_when_exported_to_dot_should_have_a_cluster_per_group_and_raw_edges() {
        let g = optimized(2);
        let dot = to_dot(&g);
        let groups = g.group_sizes().len();
        assert_eq!(dot.matches("subgraph cluster_").count(), groups);
        assert_eq!(dot.matches(" [label=").count(), g.dispatch_count());
        assert!(dot.contains("attention\\nsynthetic_attention_decode_f32"));
        // The first dispatch (embedding) writes x, which the first norm reads.
        assert!(dot.contains("n0 -> n1;"), "{dot}");
        assert!(dot.trim_end().ends_with('}'));
    }

    #[test]
    fn given_a_600_node_graph_when_drawn_should_write_a_well_formed_svg() {
        let g = optimized(30);
        let svg = to_svg(&g);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<title>").count(), g.dispatch_count());
        let barrier_lines = svg.matches("stroke=\"#d33\"").count();
        assert_eq!(barrier_lines, g.barrier_count());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&dir).expect("target dir");
        std::fs::write(dir.join("decode_graph.svg"), &svg).expect("write svg");
        std::fs::write(dir.join("decode_graph.dot"), to_dot(&g)).expect("write dot");
    }
}
