//! One algorithm per file, each a plain function of a [`Ctx`](crate::Ctx) and byte buffers.
//!
//! | file | collective | latency | bandwidth (bytes per rank) |
//! |---|---|---|---|
//! | `barrier_dissemination` | barrier | ⌈log₂ n⌉ α | 0 |
//! | `broadcast_binomial` | broadcast | ⌈log₂ n⌉ α | ⌈log₂ n⌉ m |
//! | `broadcast_shm` | broadcast (one host, arena) | 1 step | m in, m out per reader, in parallel |
//! | `reduce_binomial` | reduce | ⌈log₂ n⌉ α | ⌈log₂ n⌉ m |
//! | `ring` | reduce-scatter, all-gather, all-reduce | (n−1) α each phase | (n−1)/n m each phase |
//! | `allreduce_recursive_doubling` | all-reduce | (⌈log₂ n⌉ + 2) α | ⌈log₂ n⌉ m |
//! | `allreduce_halving_doubling` | all-reduce | 2 ⌈log₂ n⌉ α | ≈ 2 m |
//! | `allreduce_adasum` | Adasum all-reduce (power-of-two groups) | log₂ n α | log₂ n m |
//! | `allreduce_adasum_halving` | Adasum all-reduce (power-of-two groups) | O(log² n) α | ≈ 2 m |
//! | `allreduce_hierarchical` | all-reduce (several hosts) | intra-host ring + inter-host all-reduce | ≈ 2 m inside a host, 2 m/l across |
//! | `allreduce_tree` | all-reduce | 2 ⌈log₂ n⌉ α | 2 ⌈log₂ n⌉ m |
//! | `alltoall_pairwise` | all-to-all(v) | (n−1) α | (n−1)/n m |
//! | `linear` | gather(v), scatter(v) | (n−1) α at the root | (n−1)/n m at the root |

pub mod allreduce_adasum;
pub mod allreduce_adasum_halving;
pub mod allreduce_halving_doubling;
pub mod allreduce_hierarchical;
pub mod allreduce_recursive_doubling;
pub mod allreduce_shm;
pub mod allreduce_tree;
pub mod alltoall_pairwise;
pub mod barrier_dissemination;
pub mod barrier_monitored;
pub mod broadcast_binomial;
pub mod broadcast_shm;
pub mod linear;
pub mod reduce_binomial;
pub mod ring;

/// Largest power of two not above `n` (n ≥ 1).
pub(crate) fn pow2_floor(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}
