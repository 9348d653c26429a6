//! CPU kernels with their own backward passes, faster than candle's: convolution (Winograd
//! F(4×4, 3×3) or F(2×2, 3×3), or im2col + GEMM), linear layers, 2×2 pooling, ReLU, per-channel
//! statistics and training-mode batch normalization with its epilogue (residual add, ReLU); their
//! element loops
//! are compiled for AVX-512 / AVX2 and picked at run time (`ops::simd`). Each is a function over
//! candle tensors, usable in any candle model; other devices and dtypes fall back to candle's
//! ops. The layers of this crate ([`crate::layers`], [`crate::batch_norm`]) are built on them;
//! nothing here knows the layers or communication.

mod aligned;
mod avx512_transpose;
mod batch_norm;
mod bf16_gemm;
mod bn_loops;
mod channel_stats;
mod conv;
mod gemm;
mod im2col;
mod linear;
mod low_precision;
mod matmul_precision;
mod pool;
mod relu;
mod scratch;
mod simd;
mod slices;
pub(crate) mod storage;
mod threads;
mod tile_conv;
mod winograd;

pub use batch_norm::{
    batch_norm_stats, batch_norm_train, batch_norm_train_with_stats, BatchNormStats, BatchStats,
};
pub use bf16_gemm::{
    avx512_bf16_speed, bf16_compute_note, bf16_path, bf16_path_asked, matmul_bf16, matmul_bf16_on,
    peak_gflops, Bf16Path, Unit, UnitSpeed,
};
pub use channel_stats::channel_sums;
pub use conv::{conv2d, conv2d_relu, conv_out};
pub use linear::linear;
pub use low_precision::low_precision;
pub use matmul_precision::{
    bf16_computes_in_f32, bf16_matmul_unit, bf16_slower_than_f32, bf16_without_a_unit,
    matmul_precision, set_matmul_precision, MatmulPrecision,
};
pub use pool::{avg_pool2x2, max_pool2x2};
pub use relu::relu;
