//! Where the ranks of a world run: which node (host) each transport rank is on.

/// Where the ranks of a world run: a node index per transport rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    /// Node index of each transport rank (nodes numbered by first appearance).
    pub node_of: Vec<usize>,
}

impl Topology {
    /// Every rank on one node.
    pub fn single_node(size: usize) -> Self {
        Topology {
            node_of: vec![0; size],
        }
    }

    /// Numbers nodes by first appearance of their identifiers.
    pub fn from_ids(ids: &[String]) -> Self {
        let mut seen: Vec<&String> = Vec::new();
        let node_of = ids
            .iter()
            .map(|id| match seen.iter().position(|s| *s == id) {
                Some(i) => i,
                None => {
                    seen.push(id);
                    seen.len() - 1
                }
            })
            .collect();
        Topology { node_of }
    }
}
