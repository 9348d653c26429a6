//! How many threads a kernel spreads its work over: candle's count (`RAYON_NUM_THREADS`, else
//! the cores), or one inside the tasks of [`for_each_block`], which already run side by side.
//!
//! A kernel that runs many small independent products (Winograd's 36 GEMMs per chunk) gains
//! nothing from splitting each one over the threads — every split GEMM packs and synchronizes
//! for a few microseconds of work, and two threads ran ResNet-18's 64-channel layers 1.6× *slower*
//! than one. It hands the products out whole instead, one thread each. And work too small to
//! pay for waking threads stays on the caller's ([`for_work`]): LeNet's step, thousands of small
//! copies and products, ran 3.9× slower on two threads than on one.

use std::cell::Cell;

use candle_core::Result;
use rayon::prelude::*;

thread_local! {
    /// Whether this thread runs a task of [`for_each_block`].
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// The threads a kernel called here may use: 1 inside a [`for_each_block`] task, else candle's
/// thread count.
pub(super) fn count() -> usize {
    if IN_TASK.with(Cell::get) {
        1
    } else {
        candle_core::utils::get_num_threads()
    }
}

/// The threads worth using for `work` units (multiply-adds of a GEMM, values a copy moves) of
/// which a thread should get at least `per_thread`: at most [`count`], at least 1. Waking
/// threads costs microseconds a call: small work runs on the caller's thread.
pub(super) fn for_work(work: usize, per_thread: usize) -> usize {
    count().min(work / per_thread.max(1)).max(1)
}

/// Runs `f(i, block)` for each block of `block_len` values of `data` (the last may be shorter):
/// spread over the threads, each task on one thread (the kernels it calls see [`count`] 1), where
/// there are several threads and blocks; else in order on this thread, each call free to use
/// every thread. Returns the first error.
pub(super) fn for_each_block<T: Send>(
    data: &mut [T],
    block_len: usize,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let block_len = block_len.max(1);
    if count() == 1 || data.len() <= block_len {
        return data
            .chunks_mut(block_len)
            .enumerate()
            .try_for_each(|(i, b)| f(i, b));
    }
    data.par_chunks_mut(block_len)
        .enumerate()
        .try_for_each(|(i, b)| {
            let was = IN_TASK.with(|t| t.replace(true));
            let result = f(i, b);
            IN_TASK.with(|t| t.set(was));
            result
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_once_and_one_thread_inside() -> Result<()> {
        let mut data: Vec<usize> = vec![0; 1000];
        for_each_block(&mut data, 64, |i, b| {
            assert!(
                b.len() == 64 || (i == 15 && b.len() == 40),
                "block {i}: {}",
                b.len()
            );
            if candle_core::utils::get_num_threads() > 1 {
                assert_eq!(count(), 1, "inside a task of several");
            }
            b.iter_mut().for_each(|v| *v += i + 1);
            Ok(())
        })?;
        assert!(data.iter().enumerate().all(|(j, &v)| v == j / 64 + 1));
        assert_eq!(count(), candle_core::utils::get_num_threads(), "restored");
        assert_eq!(for_work(10, 100), 1, "too little for a second thread");
        assert_eq!(for_work(usize::MAX, 1), count());
        let failed = for_each_block(&mut data, 10, |i, _| {
            if i == 7 {
                candle_core::bail!("block {i}")
            }
            Ok(())
        });
        assert!(failed.is_err_and(|e| e.to_string().contains("block 7")));
        Ok(())
    }
}
