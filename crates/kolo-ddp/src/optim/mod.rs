//! Optimizers.
//!
//! [`Sgd`] and [`AdamW`] follow PyTorch's `torch.optim.SGD` / `torch.optim.AdamW` update rules
//! exactly, implement [`candle_nn::Optimizer`] (so they can be used wherever a candle optimizer
//! is expected) and expose their state for checkpoints through [`OptimizerState`].
//! [`DynOptimizer`] is an object-safe view of both, built by [`build`] from an
//! [`OptimizerConfig`].
//!
//! Like PyTorch, variables without a gradient in the [`GradStore`] are skipped (neither decayed
//! nor moved, their state untouched). No update builds an autograd graph: SGD writes contiguous
//! f32 / f64 variables and their momentum buffers in place (two passes per variable, as
//! `torch.optim.SGD`), everything else is computed on detached tensors and written with
//! [`Var::set`]. The tensors [`OptimizerState::state`] returns stay as they were when it was
//! called (SGD copies its buffers before the next in-place write).
//!
//! # State layout
//!
//! [`OptimizerState::state`] returns, for every variable `NAME` (stepped or not):
//! - `step.NAME`: number of updates applied to that variable, an `f64` scalar tensor (PyTorch
//!   keeps a per-parameter step too; AdamW's bias correction uses it);
//! - SGD with momentum ≠ 0: `momentum.NAME`, the momentum buffer (zeros until the first step);
//! - AdamW: `exp_avg.NAME` and `exp_avg_sq.NAME` (zeros until the first step).
//!
//! [`OptimizerState::load_state`] requires exactly that set of names.
//!
//! # Sharding
//!
//! [`ShardedOptimizer`] keeps the state of only its share of the variables on each rank (ZeRO
//! stage 1); its checkpoints have the layout above (see [`DynOptimizer::gather_state`]).
//!
//! [`GradStore`]: candle_core::backprop::GradStore
//! [`Var::set`]: candle_core::Var::set

mod adamw;
mod build;
mod config;
mod in_place;
mod sgd;
pub mod sharded;
mod state;

pub use adamw::AdamW;
pub use build::build;
pub use config::{AdamWConfig, OptimizerConfig, OptimizerKind, SgdConfig, UnknownOptimizer};
pub use sgd::Sgd;
pub use sharded::{partition, ShardedOptimizer};
pub use state::{DynOptimizer, OptimizerState, StateSnapshot};
