//! Communication hooks: the default hook is bit-identical to no hook; fp16/bf16 compression stays
//! within the 16-bit types' rounding bound of the exact average (and fp16 does not overflow on
//! large gradients); a custom hook is called once per bucket per step, in bucket order, and its
//! result is what the optimizer gets. Join mode, errors and overlap: `comm_hook_modes.rs`.

mod comm_hook_common;
mod common;

use std::sync::{Arc, Mutex};

use comm_hook_common::*;
use kolo::{Communicator, ReduceOp};
use kolo_ddp::ddp::{
    AllReduceHook, BucketFuture, CompressHook, Compression, GradBucket, Reduction,
};
use kolo_ddp::TrainError;

#[test]
fn the_default_hook_is_bit_identical_to_no_hook() {
    for n in [2, 3] {
        for (bucket_bytes, overlap) in SETTINGS {
            let o = opts(bucket_bytes, overlap);
            let none = run(n, o, random_grads, |_| Ok(()));
            let explicit = run(n, o, random_grads, |d| d.register_comm_hook(AllReduceHook));
            let compression_none = run(n, o, random_grads, |d| {
                d.set_compression(Compression::None)?;
                assert_eq!(d.comm_hook_name(), None);
                Ok(())
            });
            let as_compress = run(n, o, random_grads, |d| {
                d.register_comm_hook(CompressHook(Compression::None))
            });
            assert_eq!(bits(&explicit), bits(&none), "n={n} {o:?}");
            assert_eq!(bits(&compression_none), bits(&none), "n={n} {o:?}");
            assert_eq!(bits(&as_compress), bits(&none), "n={n} {o:?}");
            // And it is the average.
            let d = max_error_ratio(&none, n, n, 1e-6, 0.0);
            assert!(d <= 1.0, "n={n} {o:?}: {d}");
        }
    }
}

#[test]
fn compressed_averages_are_within_the_16_bit_rounding_bound() {
    for n in [2, 3] {
        for (bucket_bytes, overlap) in SETTINGS {
            let o = opts(bucket_bytes, overlap);
            let exact = run(n, o, random_grads, |_| Ok(()));
            let mut errors = Vec::new();
            for (c, (u, tiny)) in [(Compression::Fp16, FP16), (Compression::Bf16, BF16)] {
                let got = run(n, o, random_grads, |d| {
                    d.set_compression(c)?;
                    assert_eq!(d.comm_hook_name().as_deref(), Some(c.name()));
                    Ok(())
                });
                let r = max_error_ratio(&got, n, n, u, tiny);
                assert!(r <= 1.0, "{c} n={n} {o:?}: error {r} times the bound");
                // Compression did happen: the results differ from the f32 average.
                assert_ne!(bits(&got), bits(&exact), "{c} n={n} {o:?}");
                // How far from f32, relative to each element's magnitude, for comparing the two.
                errors.push(max_error_ratio(&got, n, n, 1.0 / 2048.0, 0.0));
            }
            // bf16 (7 mantissa bits) is coarser than fp16 (10): its error, measured on fp16's
            // scale, goes beyond fp16's bound while fp16's does not.
            assert!(errors[1] > 1.0 && errors[0] <= 1.0, "{errors:?}");
        }
    }
}

fn large_grads(rank: usize, _step: usize, param: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = 6.0e4 + 500.0 * ((rank + i + param) % 3) as f32;
            if (i + param) % 4 == 3 {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// A naive fp16 hook: cast first, sum in fp16, divide after (what the built-in hook avoids).
fn naive_fp16(bucket: GradBucket, comm: &Communicator) -> kolo_ddp::Result<BucketFuture> {
    let w = comm.size() as f32;
    let half: Vec<kolo::f16> = bucket
        .data()
        .iter()
        .map(|&x| kolo::f16::from_f32(x))
        .collect();
    let work = comm.all_reduce_async(half, ReduceOp::Sum);
    Ok(BucketFuture::deferred(move || {
        Ok(work.wait()?.iter().map(|h| h.to_f32() / w).collect())
    }))
}

#[test]
fn fp16_compression_does_not_overflow_on_large_gradients() {
    let n = 3;
    for (bucket_bytes, overlap) in SETTINGS {
        let o = opts(bucket_bytes, overlap);
        let got = run(n, o, large_grads, |d| d.set_compression(Compression::Fp16));
        for (s, params) in got[0].iter().enumerate() {
            for (k, values) in params.iter().enumerate() {
                let inputs: Vec<Vec<f32>> =
                    (0..n).map(|r| large_grads(r, s, k, values.len())).collect();
                assert!(values.iter().all(|v| v.is_finite() && v.abs() > 5e4));
                let r = ratio(values, &inputs, n, n, FP16.0, FP16.1);
                assert!(r <= 1.0, "{o:?} step {s} param {k}: {r}");
            }
        }
        // The data does overflow fp16 when summed before dividing.
        let naive = run(n, o, large_grads, |d| d.register_comm_hook(naive_fp16));
        assert!(
            naive[0].iter().flatten().flatten().any(|v| !v.is_finite()),
            "{o:?}: the naive hook did not overflow"
        );
    }
}

#[test]
fn a_custom_hook_is_called_once_per_bucket_per_step_in_order() {
    for n in [2, 3] {
        for (bucket_bytes, overlap) in SETTINGS {
            let o = opts(bucket_bytes, overlap);
            let got = run_with(n, o, random_grads, |d| -> Result<Record, TrainError> {
                let seen = Arc::new(Mutex::new(Vec::new()));
                d.register_comm_hook(Recorder {
                    seen: seen.clone(),
                    inner: AllReduceHook,
                    factor: 2.0,
                })?;
                Ok((seen, expected_buckets(d, Reduction::Average)))
            });
            for (rank, (_, (seen, want))) in got.iter().enumerate() {
                assert!(bucket_bytes > 1000 || want.len() >= 3, "{want:?}");
                let expected: Vec<Seen> = (0..STEPS).flat_map(|_| want.clone()).collect();
                assert_eq!(take(seen), expected, "n={n} {o:?} rank {rank}");
            }
            // The hook's result (2 × the average) is what backward returned.
            let halved: Vec<Grads> = got
                .iter()
                .map(|(r, _)| {
                    r.iter()
                        .map(|s| {
                            s.iter()
                                .map(|p| p.iter().map(|x| x / 2.0).collect())
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let d = max_error_ratio(&halved, n, n, 1e-6, 0.0);
            assert!(d <= 1.0, "n={n} {o:?}: {d}");
        }
    }
}
