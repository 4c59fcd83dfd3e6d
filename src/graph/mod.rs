//! The device-independent graph IR and its optimization passes.
//!
//! Nothing here knows about a device: every pass is tested on the CPU with synthetic nodes.

mod dispatch;
pub mod export;
mod footprint;
pub mod passes;
mod ranges;
pub mod synthetic;

pub use dispatch::{Access, Arg, ArgList, Dispatch, Grid, KernelId, Node, OpKind, Range, Scalar};
pub use ranges::RangeSet;

/// A recorded sequence of dispatches and barriers: what recorded mode produces and the passes
/// transform.
#[derive(Debug, Clone, Default)]
pub struct ComputeGraph {
    nodes: Vec<Node>,
}

impl ComputeGraph {
    /// An empty graph.
    pub fn new() -> Self {
        ComputeGraph::default()
    }

    /// An empty graph with room for `nodes` nodes.
    pub fn with_capacity(nodes: usize) -> Self {
        ComputeGraph {
            nodes: Vec::with_capacity(nodes),
        }
    }

    /// A graph from a node list.
    pub fn from_nodes(nodes: Vec<Node>) -> Self {
        ComputeGraph { nodes }
    }

    /// Appends a dispatch.
    pub fn push(&mut self, dispatch: Dispatch) {
        self.nodes.push(Node::Dispatch(dispatch));
    }

    /// Appends a barrier.
    pub fn push_barrier(&mut self) {
        self.nodes.push(Node::Barrier);
    }

    /// The nodes, in order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Takes the node list.
    pub fn into_nodes(self) -> Vec<Node> {
        self.nodes
    }

    pub(crate) fn nodes_mut(&mut self) -> &mut Vec<Node> {
        &mut self.nodes
    }

    /// The dispatches, in order, without barriers.
    pub fn dispatches(&self) -> impl Iterator<Item = &Dispatch> {
        self.nodes.iter().filter_map(Node::as_dispatch)
    }

    /// Number of dispatch nodes.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches().count()
    }

    /// Number of barrier nodes.
    pub fn barrier_count(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| matches!(n, Node::Barrier))
            .count()
    }

    /// Sizes of the concurrent groups (dispatches between barriers), in order.
    pub fn group_sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut current = 0;
        for node in &self.nodes {
            match node {
                Node::Dispatch(_) => current += 1,
                Node::Barrier => {
                    if current > 0 {
                        sizes.push(current);
                    }
                    current = 0;
                }
            }
        }
        if current > 0 {
            sizes.push(current);
        }
        sizes
    }
}
