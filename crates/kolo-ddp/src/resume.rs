//! Checkpoints of a whole data-parallel job, written and read collectively: what
//! `DistributedOptimizer::save_checkpoint` and `DistributedOptimizer::resume` do (PyTorch's
//! `torch.distributed.checkpoint.save`/`load` for DDP and ZeRO alike).
//!
//! Saving gathers the optimizer state first (a [`ShardedOptimizer`](crate::optim::ShardedOptimizer)'s
//! shards onto rank 0; an unsharded optimizer has it all), then rank 0 writes the parameters,
//! buffers, optimizer state and progress ([`checkpoint::save`]). Resuming reads the newest
//! checkpoint on rank 0 and broadcasts it, so the directory need only be on rank 0's host: every
//! rank restores the same values, and each optimizer takes its part of the state.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, TrainState};
use crate::distributed::DistributedOptimizer;
use crate::error::Result;
use crate::optim::DynOptimizer;

impl DistributedOptimizer<Box<dyn DynOptimizer>> {
    /// Writes a checkpoint of the job after `epoch` epochs under `root` (rank 0 writes; the
    /// others return `None`): parameters and buffers, the full optimizer state (gathered from its
    /// shards under ZeRO), the step counts. A collective: call it on every rank.
    pub fn save_checkpoint(&self, root: &Path, epoch: usize) -> Result<Option<PathBuf>> {
        let ddp = self.ddp();
        let snapshot = self.inner().gather_state()?;
        let Some(snapshot) = snapshot.filter(|_| ddp.comm().rank() == 0) else {
            return Ok(None);
        };
        let mut vars = ddp.params().to_vec();
        vars.extend(ddp.buffers().iter().cloned());
        let state = TrainState {
            epoch,
            step: self.steps(),
            optimizer_steps: snapshot.step_count,
            world_size: ddp.comm().size(),
            ..TrainState::default()
        };
        checkpoint::save(root, &vars, &snapshot, &state).map(Some)
    }

    /// Restores the newest checkpoint under `root` (read by rank 0, broadcast to every rank):
    /// parameters, buffers, optimizer state (each rank's shard under ZeRO), step counts; the model
    /// built from the Ddp's builder is refreshed. Returns the checkpoint's progress, or `None`
    /// (nothing changed) when `root` has no checkpoint. A collective: call it on every rank.
    pub fn resume(&mut self, root: &Path) -> Result<Option<TrainState>> {
        let comm = self.ddp().comm().clone();
        let dev = self
            .ddp()
            .params()
            .first()
            .map_or(candle_core::Device::Cpu, |(_, v)| v.device().clone());
        let Some((state, ckpt)) = checkpoint::load_latest_on_rank0(&comm, root, &dev)? else {
            return Ok(None);
        };
        let model = checkpoint::broadcast_tensors(&comm, 0, ckpt.as_ref().map(|c| &c.model), &dev)?;
        let mut vars = self.ddp().params().to_vec();
        vars.extend(self.ddp().buffers().iter().cloned());
        checkpoint::restore_vars(root, &vars, &model)?;
        let opt =
            checkpoint::broadcast_tensors(&comm, 0, ckpt.as_ref().map(|c| &c.optimizer), &dev)?;
        self.inner_mut().load_state(&opt)?;
        self.inner_mut().set_step_count(state.optimizer_steps);
        self.set_steps(state.step);
        self.ddp().refresh()?;
        Ok(Some(state))
    }
}
