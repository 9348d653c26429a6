//! # kolo-train
//!
//! Data-parallel training on [candle](https://github.com/huggingface/candle): models, optimizers with
//! checkpointable state, distributed data parallel ([`ddp`]), and the training loop behind
//! `kolo train`.

pub mod ddp;
mod error;
pub mod models;
pub mod optim;

pub use error::{Result, TrainError};
