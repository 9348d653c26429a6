//! # kolo-nn
//!
//! Kernels and layers for [candle](https://github.com/huggingface/candle) models, usable from any
//! candle model, data parallel or not:
//!
//! - [`ops`]: CPU kernels with their own backward passes, faster than candle's — convolution
//!   (Winograd or im2col + GEMM, optionally fused with a ReLU), linear layers, 2×2 pooling, ReLU,
//!   per-channel statistics and training-mode batch normalization with its epilogue (residual
//!   add, ReLU). Other devices and dtypes fall back to candle's ops.
//! - [`layers`]: `Linear` and `Conv2d` with PyTorch's default initialization, on those kernels.
//! - [`batch_norm`]: [`BatchNorm`](batch_norm::BatchNorm), PyTorch's `BatchNorm1d/2d`, which can
//!   be synchronized over the ranks of a kolo [`Communicator`](kolo::Communicator)
//!   (`SyncBatchNorm`), and [`is_buffer_name`](batch_norm::is_buffer_name), the one test of
//!   which `VarMap` entries are its buffers.
//! - [`autograd`]: collectives as differentiable tensor operations
//!   ([`all_reduce_sum`](autograd::all_reduce_sum)).
//! - [`vars`]: a `VarMap`'s variables in one order (by name), split into parameters and buffers.
//! - [`memory`]: [`keep_freed_memory`](memory::keep_freed_memory), the `malloc` settings under
//!   which a training step reuses the pages the last one freed (`kolo train`'s workers have them).
//!
//! The layers stand on the kernels and never the other way round: the kernels know neither the
//! layers nor communication. Synchronized BatchNorm's all-reduce sits in the layer, between the
//! statistics op ([`ops::batch_norm_stats`]) and the normalization op
//! ([`ops::batch_norm_train_with_stats`]), as a differentiable [`autograd::all_reduce_sum`] whose
//! backward pass sums the statistics' gradients over the ranks; the normalization leaves its input
//! gradient to the statistics' backward pass ([`ops::BatchNormStats`]), which writes all of it in
//! one pass. The crate depends on kolo (for the communicator), candle and gemm only.
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//!
//! // A convolution on kolo's kernels, in any candle model; gradients flow as through candle's.
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let conv = kolo_nn::layers::conv2d(1, 4, 3, 1, 1, vb.pp("conv"))?;
//! let x = Tensor::randn(0f32, 1., (2, 1, 8, 8), &Device::Cpu)?;
//! let y = kolo_nn::ops::relu(&conv.forward(&x)?)?;
//! assert_eq!(y.dims(), &[2, 4, 8, 8]);
//! let grads = y.sum_all()?.backward()?;
//! assert!(varmap.all_vars().iter().all(|v| grads.get(v).is_some()));
//! # Ok::<(), candle_core::Error>(())
//! ```
#![warn(missing_docs)]

pub mod autograd;
pub mod batch_norm;
pub mod layers;
pub mod memory;
pub mod ops;
pub mod vars;
