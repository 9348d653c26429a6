//! The two levels of a world spread evenly over several hosts, for the hierarchical all-reduce
//! (`kolo_collectives::algorithms::allreduce_hierarchical`): this rank's host, and its peers of the
//! same local index on the other hosts, each a communicator of its own.

use kolo_collectives::algorithms::allreduce_hierarchical::{Level, Levels};
use kolo_collectives::select::Hosts;
use kolo_collectives::Ctx;
use kolo_core::{Call, Result};

use std::sync::Arc;

use super::{Members, Runner, ARENA_GROUP};

/// Which ranks form the two levels; derived from the topology without communication, the same on
/// every rank.
pub(crate) struct Plan {
    /// The ranks of this rank's host.
    local: Vec<usize>,
    /// The ranks of the same local index on every host.
    cross: Vec<usize>,
    /// This rank's host.
    node: usize,
    /// This rank's index on its host.
    local_index: usize,
}

impl Plan {
    /// The levels of a world communicator on several hosts with the same number (at least two) of
    /// ranks on each; `None` otherwise.
    pub fn new(at: &Members) -> Option<Plan> {
        let n = at.members.len();
        if at.group != ARENA_GROUP || !at.members.iter().copied().eq(0..n) {
            return None;
        }
        let node_of = &at.topology.node_of;
        let nodes = node_of.iter().max().map_or(1, |m| m + 1);
        let per_node: Vec<Vec<usize>> = (0..nodes)
            .map(|k| (0..n).filter(|&r| node_of.get(r) == Some(&k)).collect())
            .collect();
        let l = per_node[0].len();
        if nodes < 2 || l < 2 || per_node.iter().any(|p| p.len() != l) {
            return None;
        }
        let me = at.rank;
        let node = *node_of.get(me)?;
        let local_index = per_node[node].iter().position(|&r| r == me)?;
        Some(Plan {
            local: per_node[node].clone(),
            cross: per_node.iter().map(|p| p[local_index]).collect(),
            node,
            local_index,
        })
    }

    /// Ranks per host and hosts, for the cost model.
    pub fn hosts(&self) -> Hosts {
        Hosts {
            local: self.local.len(),
            count: self.cross.len(),
        }
    }

    /// The two levels' communicators, sub-groups of `inner`.
    pub fn build(&self, comm: &dyn Runner) -> Hierarchy {
        let child = |members: Vec<usize>, rank: usize, what: &[u8], which: usize| {
            let id = kolo_core::call::fnv1a(&[
                &comm.group().to_le_bytes(),
                what,
                &(which as u64).to_le_bytes(),
            ]);
            comm.child(members, rank, id)
        };
        Hierarchy {
            local: child(
                self.local.clone(),
                self.local_index,
                b"hier-local",
                self.node,
            ),
            cross: child(
                self.cross.clone(),
                self.node,
                b"hier-cross",
                self.local_index,
            ),
        }
    }
}

/// A world's two levels: this rank's host, and its peers of the same local index on other hosts.
pub(crate) struct Hierarchy {
    local: Arc<dyn Runner>,
    cross: Arc<dyn Runner>,
}

impl Hierarchy {
    fn level(&self, level: Level) -> &Arc<dyn Runner> {
        match level {
            Level::Local => &self.local,
            Level::Cross => &self.cross,
        }
    }
}

impl Levels for Hierarchy {
    fn size(&self, level: Level) -> usize {
        self.level(level).size()
    }

    fn run(
        &self,
        level: Level,
        call: Call,
        step: &mut dyn FnMut(&Ctx) -> Result<()>,
    ) -> Result<()> {
        let comm = self.level(level);
        let seq = comm.issue_blocking()?;
        comm.run_recorded(seq, call, step)
    }
}
