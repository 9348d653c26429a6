//! Names of the environment variables the launcher sets for every worker.
//!
//! They follow torchrun's conventions, so programs written for
//! `torch.distributed` find what they expect.

/// Global rank of the worker, `0..WORLD_SIZE`.
pub const RANK: &str = "RANK";
/// Total number of workers in the job.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// Rank of the worker on its node.
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// Number of workers on the worker's node.
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// Rank of the worker's node (always 0 for a local launch).
pub const GROUP_RANK: &str = "GROUP_RANK";
/// Rank of the worker's node (always 0 for a local launch).
pub const NODE_RANK: &str = "NODE_RANK";
/// Host of the rendezvous store.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// Port of the rendezvous store.
pub const MASTER_PORT: &str = "MASTER_PORT";
/// `1` when the launcher hosts the rendezvous store, so rank 0 must connect
/// to it rather than start its own.
pub const KOLO_AGENT_STORE: &str = "KOLO_AGENT_STORE";
/// A random hexadecimal id, the same for all workers of one launch.
pub const KOLO_JOB_ID: &str = "KOLO_JOB_ID";
/// The job secret every connection of the job proves (see `kolo_store::auth`); generated per job
/// unless the launcher's own environment sets it.
pub const KOLO_JOB_SECRET: &str = "KOLO_JOB_SECRET";
/// How many times `kolo run` has restarted the worker group after a failure (0 on the first run);
/// a program resumes from its checkpoint when it is above 0.
pub const KOLO_RESTART_COUNT: &str = "KOLO_RESTART_COUNT";
/// How many workers the launcher had restarted alone when it started this one (fault-tolerant
/// workers, `--restart-workers`); absent for a worker of the first start.
pub const KOLO_WORKER_RESTART: &str = "KOLO_WORKER_RESTART";
/// The CPUs the worker is bound to (`0-3` style), set only when the launcher binds workers.
pub const KOLO_CPUS: &str = "KOLO_CPUS";
