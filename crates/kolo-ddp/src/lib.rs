//! # kolo-ddp
//!
//! Data-parallel training on [candle](https://github.com/huggingface/candle) over a kolo
//! [`Communicator`](kolo::Communicator), for any candle model whose variables live in a
//! `VarMap`:
//!
//! - [`ddp`]: distributed data parallel ([`Ddp`](ddp::Ddp)): gradient buckets all-reduced while
//!   backward runs, communication hooks (fp16/bf16 compression, Adasum), join for uneven inputs;
//! - [`distributed`]: [`DistributedOptimizer`](distributed::DistributedOptimizer), an optimizer
//!   stepped after Ddp's backward, with gradient accumulation, a learning-rate schedule and the
//!   per-step loss check;
//! - [`optim`]: SGD and AdamW as PyTorch has them, and ZeRO stage 1
//!   ([`ShardedOptimizer`](optim::ShardedOptimizer));
//! - [`checkpoint`]: atomic checkpoints of parameters, optimizer state and progress (collectively
//!   for a whole job: `DistributedOptimizer::save_checkpoint` and `resume`, ZeRO's shards included);
//! - [`clip`]: gradient clipping by the global norm (averaged or sharded gradients);
//! - [`timeline`]: a Chrome trace of the job (Horovod's timeline);
//! - [`precision`]: bf16 compute with f32 master weights;
//! - [`replicas`]: single-process data parallel by hand (d2l's building blocks);
//! - [`device`] (and `gpu` with the `cuda` feature: GPU tensors on NCCL): where the tensors live.
//!
//! Everything that is communication of variables goes through one place ([`vars_comm`]): the
//! flat collective over a set of variables and the check that all ranks hold the same ones.
//!
//! The crate knows no model, dataset or run directory: models come from kolo-models or any
//! candle code, the `kolo train` loop (data, metrics, plots, progress) is kolo-train. Its only
//! kolo dependency besides kolo itself is kolo-nn, for which variables are buffers and their
//! order.

pub mod checkpoint;
pub mod clip;
pub mod ddp;
pub mod device;
pub mod distributed;
pub mod elastic;
mod error;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod optim;
pub mod precision;
pub mod replicas;
mod resume;
pub mod timeline;
pub mod vars_comm;

pub use error::{Result, TrainError};
