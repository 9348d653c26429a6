//! Communication hooks in join mode (compressed sums divided by the active ranks), deferred
//! blocking collectives (the plug point of per-layer reductions such as Adasum), typed errors,
//! f64 models, and overlap with backward kept under compression.

mod comm_hook_common;
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder, VarMap};
use comm_hook_common::*;
use kolo::{Communicator, Config, ReduceOp};
use kolo_ddp::ddp::{
    BucketFuture, CommHook, CompressHook, Compression, Ddp, DdpOptions, GradBucket, Reduction,
};
use kolo_ddp::TrainError;

/// Steps each rank has data for in the join test.
const COUNTS: [usize; 3] = [1, 2, 3];

/// One rank of the join test: `COUNTS[rank]` steps with data, then `join_with`; the gradients of
/// every step (own or shadowed) and what the hook saw.
fn join_rank(comm: &Communicator, compression: Compression, o: DdpOptions) -> JoinResult {
    let varmap = new_varmap()?;
    let mut ddp = Ddp::new(comm, &varmap, o)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    ddp.register_comm_hook(Recorder {
        seen: seen.clone(),
        inner: CompressHook(compression),
        factor: 1.0,
    })?;
    ddp.set_join(true);
    let want = expected_buckets(&ddp, Reduction::Sum);
    let mut grads = Vec::new();
    for s in 0..COUNTS[comm.rank()] {
        grads.push(step(&ddp, random_grads, comm.rank(), s)?);
    }
    let report = ddp.join_with(|g| {
        grads.push(read(&ddp, g)?);
        Ok(())
    })?;
    assert_eq!(report.shadowed_steps as usize, STEPS - COUNTS[comm.rank()]);
    let seen = take(&seen);
    Ok((grads, (seen, want)))
}

type JoinResult = Result<(Grads, (Vec<Seen>, Vec<Seen>)), TrainError>;

#[test]
fn join_mode_sums_compressed_buckets_then_divides_by_the_active_ranks() {
    let n = COUNTS.len();
    for (bucket_bytes, overlap) in SETTINGS {
        let o = opts(bucket_bytes, overlap);
        for (c, (u, tiny)) in [(Compression::Fp16, FP16), (Compression::Bf16, BF16)] {
            let got: Vec<_> = kolo::run_local(
                n,
                Config::default().with_timeout(Duration::from_secs(30)),
                |comm| join_rank(&comm, c, o),
            )
            .into_iter()
            .enumerate()
            .map(|(r, x)| match x {
                Ok(Ok(v)) => v,
                other => panic!("{c} {o:?} rank {r}: {other:?}"),
            })
            .collect();
            for (rank, (grads, (seen, want))) in got.iter().enumerate() {
                assert_eq!(
                    grads, &got[0].0,
                    "{c} {o:?}: rank {rank} differs from rank 0"
                );
                // Every rank, joined or not, reduced every bucket of every step, asking for sums.
                let expected: Vec<Seen> = (0..STEPS).flat_map(|_| want.clone()).collect();
                assert_eq!(seen, &expected, "{c} {o:?} rank {rank}");
            }
            for (s, params) in got[0].0.iter().enumerate() {
                let active: Vec<usize> = (0..n).filter(|&r| COUNTS[r] > s).collect();
                for (k, values) in params.iter().enumerate() {
                    let inputs: Vec<Vec<f32>> = active
                        .iter()
                        .map(|&r| random_grads(r, s, k, values.len()))
                        .collect();
                    let r = ratio(values, &inputs, n, active.len(), u, tiny);
                    assert!(
                        r <= 1.0,
                        "{c} {o:?} step {s} param {k}: {r} times the bound"
                    );
                }
            }
        }
    }
}

#[test]
fn a_blocking_collective_inside_a_deferred_future_works() {
    // The plug point of per-layer reductions such as Adasum: a blocking collective run when the
    // bucket is waited on, with the parameter lengths moved in.
    for (bucket_bytes, overlap) in SETTINGS {
        let o = opts(bucket_bytes, overlap);
        let deferred = run(3, o, random_grads, |d| {
            d.register_comm_hook(|bucket: GradBucket, comm: &Communicator| {
                let lengths = bucket.shared_param_lengths();
                let op = bucket.reduction().op();
                let comm = comm.clone();
                let mut data = bucket.into_data();
                Ok(BucketFuture::deferred(move || {
                    let mut at = 0;
                    for n in lengths.iter() {
                        // One all-reduce per layer.
                        comm.all_reduce(&mut data[at..at + n], op)?;
                        at += n;
                    }
                    Ok(data)
                }))
            })
        });
        let d = max_error_ratio(&deferred, 3, 3, 1e-6, 0.0);
        assert!(d <= 1.0, "{o:?}: {d}");
    }
}

#[test]
fn hook_errors_are_typed_and_reported_on_every_rank() {
    let o = opts(40, true);
    let res = kolo::run_local(2, Config::default(), |comm| {
        let varmap = new_varmap()?;
        let mut ddp = Ddp::new(&comm, &varmap, o)?;
        // A result one element short, after a real collective (so no rank is left waiting).
        ddp.register_comm_hook(|bucket: GradBucket, comm: &Communicator| {
            let work = comm.all_reduce_async(bucket.into_data(), ReduceOp::Avg);
            Ok(BucketFuture::deferred(move || {
                let mut v = work.wait()?;
                v.pop();
                Ok(v)
            }))
        })?;
        step(&ddp, random_grads, comm.rank(), 0).map(|_| ())
    });
    for r in res {
        match r {
            Ok(Err(TrainError::CommHook {
                bucket: 0, reason, ..
            })) => {
                assert!(reason.contains("elements"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    // An error returned by the hook itself comes back as is.
    let res = kolo::run_local(2, Config::default(), |comm| {
        let varmap = new_varmap()?;
        let mut ddp = Ddp::new(&comm, &varmap, o)?;
        ddp.register_comm_hook(
            |_: GradBucket, _: &Communicator| -> kolo_ddp::Result<BucketFuture> {
                Err(TrainError::InvalidArgument {
                    arg: "hook",
                    reason: "refused".into(),
                })
            },
        )?;
        step(&ddp, random_grads, comm.rank(), 0).map(|_| ())
    });
    for r in res {
        assert!(
            matches!(r, Ok(Err(TrainError::InvalidArgument { arg: "hook", .. }))),
            "{r:?}"
        );
    }
}

#[test]
fn hooks_on_f64_parameters_are_refused() -> Result<(), TrainError> {
    let res = kolo::run_local(1, Config::default(), |comm| -> Result<(), TrainError> {
        let varmap = VarMap::new();
        VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu).get_with_hints(
            3,
            "w",
            Init::Const(0.0),
        )?;
        let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
        match ddp.set_compression(Compression::Bf16) {
            Err(TrainError::Unsupported { what }) => assert!(what.contains("F64"), "{what}"),
            other => panic!("{other:?}"),
        }
        // No compression stays allowed.
        ddp.set_compression(Compression::None)
    });
    for r in res {
        assert!(matches!(r, Ok(Ok(()))), "{r:?}");
    }
    Ok(())
}

/// Identity whose backward writes "backward reached a" to a log: it marks the moment backward
/// gets to parameter `a`, the first parameter, whose gradient candle computes last (the loss adds
/// the parameters' terms in `PARAMS` order, so backward meets them in reverse).
struct Marker(Arc<Mutex<Vec<String>>>);

impl candle_core::CustomOp1 for Marker {
    fn name(&self) -> &'static str {
        "marker"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        match (s, l.contiguous_offsets()) {
            (candle_core::CpuStorage::F32(v), Some((a, b))) => Ok((
                candle_core::CpuStorage::F32(v[a..b].to_vec()),
                l.shape().clone(),
            )),
            _ => candle_core::bail!("marker: contiguous f32 only"),
        }
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push("backward reached a".into());
        Ok(Some(grad.clone()))
    }
}

#[test]
fn compressed_buckets_still_leave_during_backward_with_overlap() {
    for overlap in [true, false] {
        let res = kolo::run_local(2, Config::default(), |comm| -> Result<_, TrainError> {
            let varmap = new_varmap()?;
            let mut ddp = Ddp::new(&comm, &varmap, opts(40, overlap))?;
            let log = Arc::new(Mutex::new(Vec::<String>::new()));
            let hook_log = log.clone();
            let fp16 = CompressHook(Compression::Fp16);
            ddp.register_comm_hook(move |bucket: GradBucket, comm: &Communicator| {
                hook_log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("bucket {}", bucket.index()));
                fp16.reduce(bucket, comm)
            })?;
            let vb = ddp.var_builder(DType::F32, &Device::Cpu);
            let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu)?;
            for (k, (name, shape)) in PARAMS.iter().enumerate() {
                let mut p = vb.get(*shape, name)?;
                if k == 0 {
                    p = p.apply_op1(Marker(log.clone()))?;
                }
                let g =
                    Tensor::from_vec(random_grads(0, 0, k, p.elem_count()), *shape, &Device::Cpu)?;
                loss = (loss + (p * g)?.sum_all()?)?;
            }
            ddp.backward(&loss)?;
            let count = ddp.layout().count();
            let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
            Ok((log, count))
        });
        for r in res {
            let (log, count) = match r {
                Ok(Ok(v)) => v,
                other => panic!("{other:?}"),
            };
            let at = log.iter().position(|e| e == "backward reached a");
            let buckets: Vec<&String> = log.iter().filter(|e| e.starts_with("bucket")).collect();
            assert_eq!(buckets.len(), count, "{log:?}");
            assert!(count >= 3, "{log:?}");
            if overlap {
                // Every bucket but the last one (which holds `a`) left before backward got to `a`.
                assert_eq!(at, Some(count - 1), "overlap on: {log:?}");
            } else {
                assert_eq!(at, Some(0), "overlap off: {log:?}");
            }
        }
    }
}
