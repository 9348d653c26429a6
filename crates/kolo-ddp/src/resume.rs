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
use crate::error::{Result, TrainError};
use crate::optim::DynOptimizer;

impl DistributedOptimizer<Box<dyn DynOptimizer>> {
    /// Writes a checkpoint of the job after `epoch` epochs under `root` (rank 0 writes; the
    /// others return `None`): parameters and buffers, the full optimizer state (gathered from its
    /// shards under ZeRO), the step counts. A collective: call it on every rank, at the same
    /// point. The ranks first agree on `epoch` and their step count (a call on rank 0 alone, as a
    /// PyTorch habit has it, fails there as a collective that no peer made; ranks at different
    /// points fail with [`TrainError::Checkpoint`] naming them) and check that every rank holds
    /// the same parameters ([`Ddp::check_replicas`](crate::ddp::Ddp::check_replicas): replicas
    /// that drifted apart fail with [`TrainError::ReplicasDiffer`] and nothing is written), and
    /// every rank learns whether rank 0's write succeeded: if it did not, every rank returns an
    /// error.
    #[track_caller]
    pub fn save_checkpoint(&self, root: &Path, epoch: usize) -> Result<Option<PathBuf>> {
        let ddp = self.ddp();
        let comm = ddp.comm();
        let (me, size) = (comm.rank(), comm.size());
        let steps = self.steps();
        let mine = [epoch as i64, steps as i64];
        let mut all = vec![0i64; 2 * size];
        comm.all_gather(&mine, &mut all)?;
        if let Some(r) = (0..size).find(|&r| all[2 * r..2 * r + 2] != mine) {
            return Err(TrainError::Checkpoint {
                path: root.to_path_buf(),
                reason: format!(
                    "rank {r} saves epoch {} after step {}, rank {me} epoch {epoch} after step \
                     {steps}: call save_checkpoint on every rank at the same point of the loop",
                    all[2 * r],
                    all[2 * r + 1],
                ),
            });
        }
        // Rank 0's copy is written as the job's: only where every replica holds it.
        ddp.check_replicas()?;
        let snapshot = self.inner().gather_state()?;
        let written = snapshot.filter(|_| me == 0).map(|snapshot| {
            let mut vars = ddp.params().to_vec();
            vars.extend(ddp.buffers().iter().cloned());
            let state = TrainState {
                epoch,
                step: steps,
                optimizer_steps: snapshot.step_count,
                world_size: size,
                ..TrainState::default()
            };
            checkpoint::save(root, &vars, &snapshot, &state)
        });
        // Rank 0 tells every rank whether the checkpoint exists now.
        let mut ok = [u8::from(matches!(written, Some(Ok(_))))];
        comm.broadcast(&mut ok, 0)?;
        match written {
            Some(w) => w.map(Some),
            None if ok[0] == 1 => Ok(None),
            None => Err(TrainError::Checkpoint {
                path: root.to_path_buf(),
                reason: "rank 0 could not write the checkpoint (its error says why)".into(),
            }),
        }
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
