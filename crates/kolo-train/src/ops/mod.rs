//! CPU kernels with their own backward passes, faster than candle's: convolution (im2col + GEMM)
//! and 2×2 pooling. The layers in [`crate::models`] are built on them.

mod conv;
mod pool;

pub use conv::conv2d;
pub(crate) use conv::{conv_out, low_precision};
pub use pool::{avg_pool2x2, max_pool2x2};
pub(crate) use pool::{pool2x2, Pool};
