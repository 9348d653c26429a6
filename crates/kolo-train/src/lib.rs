//! # kolo-train
//!
//! Data-parallel training on [candle](https://github.com/huggingface/candle): models, optimizers with
//! checkpointable state, distributed data parallel ([`ddp`]), and the training loop behind
//! `kolo train`.

pub mod autograd;
pub mod checkpoint;
pub mod ddp;
pub mod device;
pub mod distributed;
mod error;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod models;
mod ops;
pub mod optim;
pub mod precision;
pub mod replicas;
pub mod simulate;
pub mod timeline;
pub mod trainer;

pub use error::{Result, TrainError};
