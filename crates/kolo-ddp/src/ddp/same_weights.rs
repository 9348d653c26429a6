//! Whether every replica holds the same parameters: DDP's premise, which averaged gradients keep
//! only where every rank applies the same update to the same weights. Nothing in a step shows a
//! replica that drifted (its loss still falls), so [`Ddp::check_replicas`] compares them where it
//! matters: `DistributedOptimizer::save_checkpoint` before rank 0 writes its copy as the job's,
//! `kolo train` after every epoch, a loop of one's own where it likes.

use super::Ddp;
use crate::error::{Result, TrainError};
use crate::vars_comm;

impl Ddp {
    /// Checks that every rank holds bit for bit the same parameter values, and fails on every
    /// rank with [`TrainError::ReplicasDiffer`] naming the ranks that differ from rank 0 and the
    /// first parameter in which they do. A collective (one all-gather of a 64-bit fingerprint per
    /// parameter, after a pass over the parameters' values): call it on every rank at the same
    /// point, between steps. Buffers (BatchNorm's running statistics) are not compared: they
    /// differ between broadcasts when [`DdpOptions::broadcast_buffers`](super::DdpOptions::broadcast_buffers) is
    /// off, as in PyTorch.
    #[track_caller]
    pub fn check_replicas(&self) -> Result<()> {
        match vars_comm::differing_ranks(self.comm(), self.params())? {
            None => Ok(()),
            Some((ranks, parameter)) => Err(TrainError::ReplicasDiffer {
                rank: self.comm().rank(),
                ranks,
                parameter,
            }),
        }
    }
}
