//! What one launch of a CUDA graph allocates: the graph's memory allocation nodes and
//! those of every child graph nested in it (CUDA 12.9/13 lets a graph with memory nodes
//! become a child graph node when its ownership is moved to the parent), per device.
//!
//! Pure engine over [`GraphView`]; the driver adapter is in `ffi::pools`. Fail closed: a
//! node whose type cannot be read, a type this code does not know, a failing query or
//! nesting deeper than [`MAX_DEPTH`] is an error, and the caller refuses the graph rather
//! than run allocations it has not counted.
//!
//! Conditional nodes' body graphs are not walked: the driver API allows only kernel,
//! empty, memset, memcpy, child graph and conditional nodes in them, recursively
//! (`CUDA_CONDITIONAL_NODE_PARAMS::phGraph_out`), so they hold no allocation nodes.

/// Child graphs nested deeper than this below the launched graph are refused.
pub const MAX_DEPTH: usize = 16;

/// `CUgraphNodeType` values the walk distinguishes.
const TYPE_GRAPH: i32 = 4;
const TYPE_MEM_ALLOC: i32 = 10;
/// The highest node type known (`CU_GRAPH_NODE_TYPE_CONDITIONAL`, CUDA 12.3–13).
const TYPE_LAST_KNOWN: i32 = 13;

/// Why a graph's allocation nodes could not be collected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    #[error("cuGraphGetNodes failed (graph at depth {depth})")]
    Nodes { depth: usize },
    #[error("cuGraphNodeGetType failed (graph at depth {depth})")]
    NodeType { depth: usize },
    #[error("node type {kind} is unknown to the shim (graph at depth {depth})")]
    UnknownType { kind: i32, depth: usize },
    #[error("cuGraphChildGraphNodeGetGraph failed (graph at depth {depth})")]
    ChildGraph { depth: usize },
    #[error("cuGraphMemAllocNodeGetParams failed (graph at depth {depth})")]
    AllocParams { depth: usize },
    #[error("child graphs nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// Read access to a graph's nodes (the driver, or a table in tests).
pub trait GraphView {
    type Graph: Copy;
    type Node: Copy;
    /// The graph's nodes.
    fn nodes(&self, graph: Self::Graph) -> Option<Vec<Self::Node>>;
    /// The node's `CUgraphNodeType`.
    fn kind(&self, node: Self::Node) -> Option<i32>;
    /// The graph embedded in a child graph node.
    fn child(&self, node: Self::Node) -> Option<Self::Graph>;
    /// An allocation node's (device, bytes): `Some(None)` when it allocates no device
    /// memory (pinned host), `None` when it cannot be read.
    fn alloc(&self, node: Self::Node) -> Option<Option<(usize, u64)>>;
}

/// Bytes one launch of `graph` allocates per device, child graphs included.
pub fn launch_needs<V: GraphView>(
    view: &V,
    graph: V::Graph,
) -> Result<Vec<(usize, u64)>, WalkError> {
    let mut needs = Vec::new();
    walk(view, graph, 0, &mut needs)?;
    Ok(needs)
}

fn walk<V: GraphView>(
    view: &V,
    graph: V::Graph,
    depth: usize,
    needs: &mut Vec<(usize, u64)>,
) -> Result<(), WalkError> {
    if depth > MAX_DEPTH {
        return Err(WalkError::TooDeep);
    }
    let nodes = view.nodes(graph).ok_or(WalkError::Nodes { depth })?;
    for node in nodes {
        match view.kind(node).ok_or(WalkError::NodeType { depth })? {
            TYPE_MEM_ALLOC => {
                let need = view.alloc(node).ok_or(WalkError::AllocParams { depth })?;
                if let Some((dev, bytes)) = need {
                    match needs.iter_mut().find(|(d, _)| *d == dev) {
                        Some(e) => e.1 = e.1.saturating_add(bytes),
                        None => needs.push((dev, bytes)),
                    }
                }
            }
            TYPE_GRAPH => {
                let child = view.child(node).ok_or(WalkError::ChildGraph { depth })?;
                walk(view, child, depth + 1, needs)?;
            }
            k if (0..=TYPE_LAST_KNOWN).contains(&k) => {}
            kind => return Err(WalkError::UnknownType { kind, depth }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of the table graph: (type, alloc need, child graph index); `None` fields
    /// stand for a failing query.
    #[derive(Clone, Copy)]
    struct N {
        kind: Option<i32>,
        alloc: Option<Option<(usize, u64)>>,
        child: Option<usize>,
    }

    /// Graphs by index; `None` is a graph whose node list cannot be read.
    struct Table(Vec<Option<Vec<N>>>);

    impl GraphView for Table {
        type Graph = usize;
        type Node = N;
        fn nodes(&self, g: usize) -> Option<Vec<N>> {
            self.0.get(g).cloned().flatten()
        }
        fn kind(&self, n: N) -> Option<i32> {
            n.kind
        }
        fn child(&self, n: N) -> Option<usize> {
            n.child
        }
        fn alloc(&self, n: N) -> Option<Option<(usize, u64)>> {
            n.alloc
        }
    }

    fn alloc(dev: usize, bytes: u64) -> N {
        N {
            kind: Some(TYPE_MEM_ALLOC),
            alloc: Some(Some((dev, bytes))),
            child: None,
        }
    }
    fn child(g: usize) -> N {
        N {
            kind: Some(TYPE_GRAPH),
            alloc: None,
            child: Some(g),
        }
    }
    fn plain(kind: i32) -> N {
        N {
            kind: Some(kind),
            alloc: None,
            child: None,
        }
    }

    /// Graph 0 wraps graph 1 wraps … graph `levels`, which holds one 1-byte allocation.
    fn chain(levels: usize) -> Table {
        let mut t: Vec<Option<Vec<N>>> = (1..=levels).map(|g| Some(vec![child(g)])).collect();
        t.push(Some(vec![alloc(0, 1)]));
        Table(t)
    }

    #[test]
    fn collects_allocations_through_child_graphs() {
        let host = N {
            alloc: Some(None),
            ..alloc(0, 0)
        };
        type Want = Result<Vec<(usize, u64)>, WalkError>;
        let cases: Vec<(&str, Table, Want)> = vec![
            (
                "flat",
                Table(vec![Some(vec![alloc(0, 5), plain(11), alloc(1, 7)])]),
                Ok(vec![(0, 5), (1, 7)]),
            ),
            (
                "child and grandchild add up per device",
                Table(vec![
                    Some(vec![alloc(0, 1), child(1)]),
                    Some(vec![alloc(0, 10), child(2), plain(0)]),
                    Some(vec![alloc(0, 100), alloc(1, 3), host]),
                ]),
                Ok(vec![(0, 111), (1, 3)]),
            ),
            (
                "conditional and other known types allocate nothing",
                Table(vec![Some(
                    (0..=13)
                        .filter(|k| *k != 4 && *k != 10)
                        .map(plain)
                        .collect(),
                )]),
                Ok(vec![]),
            ),
            ("nesting at the bound", chain(MAX_DEPTH), Ok(vec![(0, 1)])),
            (
                "nesting past the bound",
                chain(MAX_DEPTH + 1),
                Err(WalkError::TooDeep),
            ),
            (
                "unknown node type",
                Table(vec![Some(vec![child(1)]), Some(vec![plain(14)])]),
                Err(WalkError::UnknownType { kind: 14, depth: 1 }),
            ),
            (
                "unreadable node type",
                Table(vec![Some(vec![N {
                    kind: None,
                    ..plain(0)
                }])]),
                Err(WalkError::NodeType { depth: 0 }),
            ),
            (
                "unreadable child graph",
                Table(vec![Some(vec![N {
                    child: None,
                    ..child(0)
                }])]),
                Err(WalkError::ChildGraph { depth: 0 }),
            ),
            (
                "unreadable nested node list",
                Table(vec![Some(vec![child(1)]), None]),
                Err(WalkError::Nodes { depth: 1 }),
            ),
            (
                "unreadable allocation node",
                Table(vec![Some(vec![N {
                    alloc: None,
                    ..alloc(0, 1)
                }])]),
                Err(WalkError::AllocParams { depth: 0 }),
            ),
        ];
        for (what, table, want) in cases {
            assert_eq!(launch_needs(&table, 0), want, "{what}");
        }
    }
}
