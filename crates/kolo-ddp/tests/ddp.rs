//! The DDP invariant: N workers with per-worker batch b end, after 5 SGD steps, with the same
//! parameters as one process with batch N·b — for N = 1, 2, 3, several bucket sizes, with and without
//! overlapping communication with backward. Plus gradient accumulation, unused parameters and model
//! mismatches.

mod common;

use std::time::Duration;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
use common::*;
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::TrainError;

const STEPS: usize = 5;
const LR: f64 = 0.1;

/// The variables of a [`ConvNet`] (with `fc3` if `with_extra`), random.
fn new_varmap(with_extra: bool) -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    ConvNet::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        with_extra,
    )?;
    Ok(varmap)
}

/// Deterministic inputs and labels for the global batch of `n` workers at `step`.
fn batch(step: usize, n: usize) -> (Tensor, Tensor) {
    conv_batch(step, n, &Device::Cpu).expect("batch")
}

/// One process, batch n·b, plain candle.
fn reference(n: usize) -> Params {
    let varmap = VarMap::new();
    let net = ConvNet::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        false,
    )
    .expect("net");
    init(&varmap, 0.3).expect("init");
    let mut opt = SGD::new(varmap.all_vars(), LR).expect("sgd");
    for step in 0..STEPS {
        let (x, y) = batch(step, n);
        opt.backward_step(&net.loss(&x, &y).expect("loss"))
            .expect("step");
    }
    params(&varmap).expect("values")
}

/// One rank of `comm` trained with Ddp on its b-sample share of the same global batch.
fn train_rank(comm: &kolo::Communicator, opts: DdpOptions) -> Result<Params, TrainError> {
    let n = comm.size();
    let varmap = new_varmap(false)?;
    if comm.rank() == 0 {
        init(&varmap, 0.3)?; // the others start from random values: Ddp must copy rank 0's
    }
    let ddp = Ddp::new(comm, &varmap, opts)?;
    assert!(
        !ddp.buckets_on_gpu(),
        "parameters on the CPU: buckets in host memory"
    );
    let mut opt = SGD::new(ddp.params().iter().map(|(_, v)| v.clone()).collect(), LR)?;
    for step in 0..STEPS {
        let net = ConvNet::new(ddp.var_builder(DType::F32, &Device::Cpu), false)?;
        let (x, y) = rank_share(&batch(step, n), comm.rank())?;
        let grads = ddp.backward(&net.loss(&x, &y)?)?;
        opt.step(&grads)?;
    }
    Ok(params(&varmap)?)
}

/// n workers with Ddp as threads of this process.
fn distributed(n: usize, opts: DdpOptions) -> Vec<Params> {
    on_ranks(
        n,
        Config::default().with_timeout(Duration::from_secs(60)),
        |comm| train_rank(&comm, opts),
    )
}

/// The bucket sizes and overlap settings the invariant is checked under.
const SETTINGS: [(usize, bool); 4] = [(25 << 20, true), (256, true), (256, false), (1000, false)];

#[test]
fn n_workers_with_batch_b_equal_one_process_with_batch_nb() {
    for n in [1, 2, 3] {
        let want = reference(n);
        for (bucket_bytes, overlap) in SETTINGS {
            let opts = DdpOptions {
                bucket_bytes,
                overlap,
                ..DdpOptions::default()
            };
            for (rank, got) in distributed(n, opts).iter().enumerate() {
                let d = max_relative_difference(got, &want);
                assert!(
                    d <= 1e-5,
                    "n={n} {opts:?} rank {rank}: relative difference {d:e}"
                );
            }
        }
    }
}

#[test]
fn small_buckets_split_the_model() {
    let res = kolo::run_local(2, Config::default(), |comm| {
        let varmap = new_varmap(false)?;
        let ddp = Ddp::new(
            &comm,
            &varmap,
            DdpOptions {
                bucket_bytes: 256,
                overlap: true,
                ..DdpOptions::default()
            },
        )?;
        Ok::<_, TrainError>(ddp.layout())
    });
    let layout = res[0].as_ref().expect("thread").as_ref().expect("ddp");
    // conv.bias (4 floats), conv.weight (36), fc1.bias (16), fc1.weight (1024), fc2.bias (3),
    // fc2.weight (48): 256-byte buckets hold at most 64 floats, filled from the last parameter:
    // [fc2.weight, fc2.bias], [fc1.weight] (alone, larger than a bucket), [fc1.bias, conv.weight, conv.bias].
    assert_eq!(
        layout.buckets,
        vec![vec![5, 4], vec![3], vec![2, 1, 0]],
        "{layout:?}"
    );
    assert_eq!(
        layout.buckets[0][0], 5,
        "fc2.weight (last by name) fills the first bucket"
    );
}

#[test]
fn gradient_accumulation_equals_the_larger_batch() {
    // 2 workers × 2 passes of b/2 samples, averaged only on the second pass = 1 process, batch 2b.
    let want = reference(2);
    let res = kolo::run_local(2, Config::default(), |comm| {
        let varmap = new_varmap(false)?;
        if comm.rank() == 0 {
            init(&varmap, 0.3)?;
        }
        let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
        let mut opt = SGD::new(ddp.params().iter().map(|(_, v)| v.clone()).collect(), LR)?;
        for step in 0..STEPS {
            let (x, y) = batch(step, 2);
            let mut acc: Option<candle_core::backprop::GradStore> = None;
            for pass in 0..2 {
                let off = comm.rank() * B + pass * (B / 2);
                let (xs, ys) = (x.narrow(0, off, B / 2)?, y.narrow(0, off, B / 2)?);
                // Each pass's loss is half of the mean over the rank's b samples.
                let net = ConvNet::new(ddp.var_builder(DType::F32, &Device::Cpu), false)?;
                let l = (net.loss(&xs, &ys)? * 0.5)?;
                let g = ddp.no_sync(|d| d.backward(&l))?;
                acc = Some(match acc {
                    None => g,
                    Some(mut a) => {
                        for (_, v) in ddp.params() {
                            if let (Some(x1), Some(x2)) =
                                (a.get(v.as_tensor()), g.get(v.as_tensor()))
                            {
                                let s = (x1 + x2)?;
                                a.insert(v.as_tensor(), s);
                            }
                        }
                        a
                    }
                });
            }
            let mut grads = acc.expect("two passes");
            ddp.sync_gradients(&mut grads)?;
            opt.step(&grads)?;
        }
        Ok::<_, TrainError>(params(&varmap)?)
    });
    for r in res {
        let got = r.expect("thread").expect("rank");
        let d = max_relative_difference(&got, &want);
        assert!(d <= 1e-5, "relative difference {d:e}");
    }
}

#[test]
fn a_parameter_unused_on_one_rank_counts_as_zero_and_never_hangs() {
    for overlap in [true, false] {
        let res = kolo::run_local(
            3,
            Config::default().with_timeout(Duration::from_secs(20)),
            |comm| {
                let varmap = new_varmap(true)?;
                let ddp = Ddp::new(
                    &comm,
                    &varmap,
                    DdpOptions {
                        bucket_bytes: 256,
                        overlap,
                        ..DdpOptions::default()
                    },
                )?;
                let net = ConvNet::new(ddp.var_builder(DType::F32, &Device::Cpu), true)?;
                let (x, y) = rank_share(&batch(0, 3), comm.rank())?;
                // Only rank 0 uses fc3.
                let logits = net.forward(&x, comm.rank() == 0)?;
                let grads = ddp.backward(&candle_nn::loss::cross_entropy(&logits, &y)?)?;
                let fc3 = ddp
                    .params()
                    .iter()
                    .find(|(n, _)| n == "fc3.weight")
                    .map(|(_, v)| v.clone());
                let g = grads.get(fc3.expect("fc3.weight").as_tensor()).cloned();
                Ok::<_, TrainError>(
                    g.map(|t| t.flatten_all().and_then(|t| t.to_vec1::<f32>()))
                        .transpose()?,
                )
            },
        );
        let grads: Vec<Vec<f32>> = res
            .into_iter()
            .map(|r| {
                r.expect("thread")
                    .expect("rank")
                    .expect("every rank has the averaged gradient")
            })
            .collect();
        // Every rank holds the same average: rank 0's gradient / 3.
        assert!(grads.iter().all(|g| g == &grads[0]), "overlap={overlap}");
        assert!(grads[0].iter().any(|v| *v != 0.0));
    }
}

#[test]
fn different_models_are_an_error_naming_the_parameter() {
    let res = kolo::run_local(2, Config::default(), |comm| {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        candle_nn::linear(4, if comm.rank() == 1 { 3 } else { 2 }, vb.pp("head"))?;
        Ddp::new(&comm, &varmap, DdpOptions::default()).map(|_| ())
    });
    for r in res {
        let e = r.expect("thread").expect_err("mismatch");
        let text = e.to_string();
        assert!(
            text.contains("head.bias") && text.contains("rank 1"),
            "{text}"
        );
    }
}

#[test]
fn logits_dimension_sanity() {
    // The test net itself: 3 classes.
    let varmap = VarMap::new();
    let net = ConvNet::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        false,
    )
    .expect("net");
    let (x, _) = batch(0, 1);
    assert_eq!(
        net.forward(&x, false).and_then(|t| t.dim(D::Minus1)).ok(),
        Some(3)
    );
}

/// The invariant with the workers as MPI processes (`mpirun -n 2`) on the MPI backend.
#[cfg(feature = "mpi")]
#[path = "../../kolo/tests/common/mpirun.rs"]
mod mpirun;

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;

    #[test]
    #[ignore = "entry point of the ranks `mpirun` starts"]
    fn ddp_rank() {
        if !kolo::launched_by_mpi(|k| std::env::var(k).ok()) {
            return;
        }
        let comm = kolo::init().expect("MPI world");
        assert_eq!(comm.backend(), "mpi");
        let want = reference(comm.size());
        for (bucket_bytes, overlap) in SETTINGS {
            let opts = DdpOptions {
                bucket_bytes,
                overlap,
                ..DdpOptions::default()
            };
            let got = train_rank(&comm, opts).expect("training");
            let d = max_relative_difference(&got, &want);
            assert!(
                d <= 1e-5,
                "{opts:?} rank {}: relative difference {d:e}",
                comm.rank()
            );
        }
    }

    #[test]
    fn n_workers_with_batch_b_equal_one_process_under_mpirun() {
        mpirun::mpirun(2, "mpi::ddp_rank");
    }
}
