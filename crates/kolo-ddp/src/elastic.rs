//! The training state a fault-tolerant world hands over after a reconfiguration
//! ([`kolo::elastic::ElasticWorld::reconfigure`]): the member that got furthest — a step's
//! all-reduce may have completed on some members and not on others, and a worker that just joined
//! has nothing — sends its parameters, optimizer state and position to every member.
//!
//! Everything is received before anything is written, so a handover that fails half-way (another
//! loss) leaves each member as it was, ready to hand over again in the next generation.
//!
//! A loop keeps, for each member, a `progress` count it raises on every commit (an optimizer step,
//! a finished epoch), the optimizer state as of its last step, and its position (where it is in
//! the epoch, what it has measured): see the `ddp_fault_tolerant` example.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use kolo::{Communicator, ReduceOp};
use kolo_nn::vars::sorted_vars;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{checkpoint, vars_comm, Result};

/// What a member keeps of its training, to hand over.
#[derive(Clone, Debug, Default)]
pub struct Kept<P> {
    /// Commits so far: the member with the most hands over.
    pub progress: u64,
    /// Where the loop is (epoch, samples of the epoch done, metrics, ...).
    pub position: P,
    /// The optimizer's state as of the last step (`OptimizerState::state`).
    pub optimizer_state: Vec<(String, Tensor)>,
    /// The optimizer's step count (`OptimizerState::step_count`).
    pub optimizer_steps: u64,
}

/// What every member got from the furthest one.
#[derive(Clone, Debug)]
pub struct Received<P> {
    /// The rank (of the new generation) that handed over.
    pub from: usize,
    /// Its progress.
    pub progress: u64,
    /// Its position.
    pub position: P,
    /// Its optimizer state (empty before the first step): load it into a new optimizer.
    pub optimizer_state: HashMap<String, Tensor>,
    /// Its optimizer step count.
    pub optimizer_steps: u64,
}

/// Collective over `comm` (the new generation): every member's `varmap` takes the parameters of
/// the member with the highest `kept.progress` (the lowest rank among equals), and every member
/// returns that member's position and optimizer state.
pub fn handover<P>(comm: &Communicator, varmap: &VarMap, kept: &Kept<P>) -> Result<Received<P>>
where
    P: Serialize + DeserializeOwned + Clone,
{
    let mut furthest = [i64::try_from(kept.progress).unwrap_or(i64::MAX)];
    comm.all_reduce(&mut furthest, ReduceOp::Max)?;
    let mine = i64::try_from(kept.progress).unwrap_or(i64::MAX) == furthest[0];
    let mut root = [if mine { comm.rank() as i64 } else { i64::MAX }];
    comm.all_reduce(&mut root, ReduceOp::Min)?;
    let from = usize::try_from(root[0]).unwrap_or(0);
    let lead = comm.rank() == from;
    let position: P = comm.broadcast_object(lead.then(|| kept.position.clone()), from)?;
    let vars = sorted_vars(varmap);
    let device = vars
        .first()
        .map_or(Device::Cpu, |(_, v)| v.device().clone());
    let state: HashMap<String, Tensor> = kept.optimizer_state.iter().cloned().collect();
    let optimizer_state =
        checkpoint::broadcast_tensors(comm, from, lead.then_some(&state), &device)?;
    let mut steps = [i64::try_from(kept.optimizer_steps).unwrap_or(i64::MAX)];
    comm.broadcast(&mut steps, from)?;
    // The parameters last: written only once they all arrived.
    let refs: Vec<_> = vars.iter().map(|(_, v)| v).collect();
    vars_comm::broadcast_vars::<f32>(comm, &refs, from)?;
    Ok(Received {
        from,
        progress: u64::try_from(furthest[0]).unwrap_or(0),
        position,
        optimizer_state,
        optimizer_steps: u64::try_from(steps[0]).unwrap_or(0),
    })
}
