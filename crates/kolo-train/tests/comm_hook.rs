//! Communication hooks: the default hook is bit-identical to no hook; fp16/bf16 compression stays
//! within the 16-bit types' rounding bound of the exact average (and fp16 does not overflow on
//! large gradients); a custom hook is called once per bucket per step, in bucket order, and its
//! result is what the optimizer gets; join mode works with compression.
//!
//! The "model" is a set of parameters p whose loss is Σ sum(p ⊙ g): the gradient of p is exactly g,
//! random values chosen per rank, step and parameter, so the exact average is known.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder, VarMap};
use kolo::{Communicator, Config, ReduceOp};
use kolo_train::ddp::{
    AllReduceHook, BucketFuture, CommHook, CompressHook, Compression, Ddp, DdpOptions, GradBucket,
    Reduction,
};
use kolo_train::TrainError;

/// Parameter names and shapes; with 40-byte buckets (10 f32) they fill several buckets.
const PARAMS: [(&str, &[usize]); 5] = [
    ("a", &[5]),
    ("b", &[3, 4]),
    ("c", &[7]),
    ("d", &[2, 3]),
    ("e", &[11]),
];
const STEPS: usize = 3;

/// Gradients of one rank: `[step][param]`.
type Grads = Vec<Vec<Vec<f32>>>;

/// Deterministic "random" values spanning six decades, both signs: `xorshift` of a seed.
fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let mantissa = 2.0 * next() - 1.0;
            let decade = 6.0 * next() - 3.0; // 1e-3 .. 1e3
            (mantissa * 10f64.powf(decade)) as f32
        })
        .collect()
}

/// Gradient source: `(rank, step, param) -> values`.
type Source = fn(usize, usize, usize, usize) -> Vec<f32>;

fn random_grads(rank: usize, step: usize, param: usize, n: usize) -> Vec<f32> {
    random((rank * 1000 + step * 10 + param) as u64 + 1, n)
}

fn new_varmap() -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    for (name, shape) in PARAMS {
        vb.get_with_hints(shape, name, Init::Const(0.0))?;
    }
    Ok(varmap)
}

/// One step: loss = Σ sum(p ⊙ g), gradients through `ddp.backward`, read back in `PARAMS` order.
fn step(ddp: &Ddp, source: Source, rank: usize, step: usize) -> Result<Vec<Vec<f32>>, TrainError> {
    let vb = ddp.var_builder(DType::F32, &Device::Cpu);
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu)?;
    for (k, (name, shape)) in PARAMS.iter().enumerate() {
        let p = vb.get(*shape, name)?;
        let g = Tensor::from_vec(source(rank, step, k, p.elem_count()), *shape, &Device::Cpu)?;
        loss = (loss + (p * g)?.sum_all()?)?;
    }
    let grads = ddp.backward(&loss)?;
    read(ddp, &grads)
}

/// The gradients of `grads`, in `PARAMS` order.
fn read(ddp: &Ddp, grads: &candle_core::backprop::GradStore) -> Result<Vec<Vec<f32>>, TrainError> {
    PARAMS
        .iter()
        .map(|(name, _)| {
            let (_, v) = ddp
                .params()
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| TrainError::Unsupported {
                    what: format!("no parameter {name}"),
                })?;
            let g = grads
                .get(v.as_tensor())
                .ok_or_else(|| TrainError::Unsupported {
                    what: format!("no gradient for {name}"),
                })?;
            Ok(g.flatten_all()?.to_vec1::<f32>()?)
        })
        .collect()
}

/// `n` thread-ranks, each setting up its Ddp with `configure` and taking `STEPS` steps; every
/// rank's gradients and what its `configure` returned.
fn run_with<C, X>(n: usize, opts: DdpOptions, source: Source, configure: C) -> Vec<(Grads, X)>
where
    C: Fn(&mut Ddp) -> Result<X, TrainError> + Sync,
    X: Send + std::fmt::Debug,
{
    let res = kolo::run_local(
        n,
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm: Communicator| -> Result<(Grads, X), TrainError> {
            let varmap = new_varmap()?;
            let mut ddp = Ddp::new(&comm, &varmap, opts)?;
            let x = configure(&mut ddp)?;
            let grads = (0..STEPS)
                .map(|s| step(&ddp, source, comm.rank(), s))
                .collect::<Result<_, _>>()?;
            Ok((grads, x))
        },
    );
    res.into_iter()
        .enumerate()
        .map(|(r, x)| match x {
            Ok(Ok(v)) => v,
            other => panic!("rank {r}: {other:?}"),
        })
        .collect()
}

/// [`run_with`], gradients only.
fn run<C>(n: usize, opts: DdpOptions, source: Source, configure: C) -> Vec<Grads>
where
    C: Fn(&mut Ddp) -> Result<(), TrainError> + Sync,
{
    run_with(n, opts, source, configure)
        .into_iter()
        .map(|(g, ())| g)
        .collect()
}

/// Bucket sizes (several buckets, one bucket) and overlap on/off.
const SETTINGS: [(usize, bool); 4] = [(40, true), (40, false), (1 << 20, true), (1 << 20, false)];

fn opts(bucket_bytes: usize, overlap: bool) -> DdpOptions {
    DdpOptions {
        bucket_bytes,
        overlap,
    }
}

fn bits(g: &[Grads]) -> Vec<Vec<Vec<Vec<u32>>>> {
    g.iter()
        .map(|r| {
            r.iter()
                .map(|s| {
                    s.iter()
                        .map(|p| p.iter().map(|x| x.to_bits()).collect())
                        .collect()
                })
                .collect()
        })
        .collect()
}

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

/// The largest ratio, over ranks, steps and elements, of |got − exact average| to the bound
/// `n_terms · u · Σ|g| / divisor + n_terms · tiny · world / divisor` (plus f32's own roundings),
/// where the exact average is Σ g / divisor over the `n_terms` contributing ranks in f64.
fn max_error_ratio(got: &[Grads], world: usize, n_terms: usize, u: f64, tiny: f64) -> f64 {
    let mut worst = 0f64;
    for (rank, r) in got.iter().enumerate() {
        assert_eq!(r, &got[0], "rank {rank} differs from rank 0");
    }
    for (s, params) in got[0].iter().enumerate() {
        for (k, values) in params.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..n_terms)
                .map(|r| random_grads(r, s, k, values.len()))
                .collect();
            worst = worst.max(ratio(values, &inputs, world, n_terms, u, tiny));
        }
    }
    worst
}

/// See [`max_error_ratio`]: one parameter, `inputs[r]` the gradients of the contributing ranks,
/// averaged over `divisor` ranks.
fn ratio(got: &[f32], inputs: &[Vec<f32>], world: usize, divisor: usize, u: f64, tiny: f64) -> f64 {
    let terms = inputs.len() as f64;
    let f32_eps = f64::powi(2.0, -24);
    let mut worst = 0f64;
    for (i, &y) in got.iter().enumerate() {
        let sum: f64 = inputs.iter().map(|g| f64::from(g[i])).sum();
        let abs: f64 = inputs.iter().map(|g| f64::from(g[i]).abs()).sum();
        let exact = sum / divisor as f64;
        let bound = (terms * u + 8.0 * f32_eps) * abs / divisor as f64
            + terms * tiny * world as f64 / divisor as f64
            + 1e-30;
        worst = worst.max((f64::from(y) - exact).abs() / bound);
    }
    worst
}

/// fp16: unit roundoff 2⁻¹¹, subnormal spacing 2⁻²⁴ (half of it per rounding); bf16: 2⁻⁸, and
/// subnormals far below these gradients.
const FP16: (f64, f64) = (1.0 / 2048.0, 1.0 / 33_554_432.0);
const BF16: (f64, f64) = (1.0 / 256.0, 0.0);

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
fn naive_fp16(bucket: GradBucket, comm: &Communicator) -> kolo_train::Result<BucketFuture> {
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

/// What a recording hook saw of one bucket.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    index: usize,
    len: usize,
    lengths: Vec<usize>,
    names: Vec<String>,
    reduction: Reduction,
}

/// Records every bucket, then delegates to `inner` and doubles the result (so the test sees that
/// the hook's result is what backward returns).
struct Recorder<H> {
    seen: Arc<Mutex<Vec<Seen>>>,
    inner: H,
    factor: f32,
}

impl<H: CommHook> CommHook for Recorder<H> {
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> kolo_train::Result<BucketFuture> {
        let seen = Seen {
            index: bucket.index(),
            len: bucket.len(),
            lengths: bucket.param_lengths().to_vec(),
            names: bucket.param_names().to_vec(),
            reduction: bucket.reduction(),
        };
        assert_eq!(bucket.param_lengths().iter().sum::<usize>(), bucket.len());
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(seen);
        let inner = self.inner.reduce(bucket, comm)?;
        let factor = self.factor;
        Ok(BucketFuture::deferred(move || {
            let mut v = inner.wait()?;
            v.iter_mut().for_each(|x| *x *= factor);
            Ok(v)
        }))
    }
}

/// The buckets a rank's hook must see at each step: bucket b of the layout, in buffer order.
fn expected_buckets(d: &Ddp, reduction: Reduction) -> Vec<Seen> {
    let layout = d.layout();
    (0..layout.count())
        .map(|b| Seen {
            index: b,
            len: layout.len[b],
            lengths: layout.buckets[b]
                .iter()
                .map(|&p| layout.slot[p].1.len())
                .collect(),
            names: layout.buckets[b]
                .iter()
                .map(|&p| d.params()[p].0.clone())
                .collect(),
            reduction,
        })
        .collect()
}

type Record = (Arc<Mutex<Vec<Seen>>>, Vec<Seen>);

fn take(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()))
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
            |_: GradBucket, _: &Communicator| -> kolo_train::Result<BucketFuture> {
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
