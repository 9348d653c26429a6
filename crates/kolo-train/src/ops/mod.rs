//! CPU kernels with their own backward passes, faster than candle's: convolution (Winograd
//! F(4×4, 3×3) or F(2×2, 3×3), or im2col + GEMM), 2×2 pooling, ReLU and training-mode batch normalization with its
//! epilogue (residual add, ReLU); their element loops are compiled for AVX-512 / AVX2 and picked
//! at run time (`ops::simd`). The layers in [`crate::models`] are built on them.

mod batch_norm;
mod bn_loops;
mod conv;
mod gemm;
mod im2col;
mod pool;
mod relu;
mod scratch;
mod simd;
mod slices;
mod winograd;

pub(crate) use batch_norm::{batch_norm_train, BatchStats};
pub(crate) use bn_loops::channel_sums;
pub use conv::{conv2d, conv2d_relu};
pub(crate) use conv::{conv_out, low_precision};
pub use pool::{avg_pool2x2, max_pool2x2};
pub(crate) use pool::{pool2x2, Pool};
pub use relu::relu;
