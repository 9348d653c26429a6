//! Join for uneven inputs: ranks with different numbers of batches finish together, and every rank
//! ends with the parameters of one process that applies, step by step, the gradient averaged over
//! the ranks that still had a batch at that step.

use std::time::Duration;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use kolo::Config;
use kolo_train::ddp::{sorted_vars, Ddp, DdpOptions, JoinReport};
use kolo_train::distributed::{check_loss_active, DistributedOptimizer};
use kolo_train::optim::{Sgd, SgdConfig};
use kolo_train::TrainError;

const LR: f64 = 0.1;

/// A small MLP: 4 → 8 → relu → 2.
struct Mlp {
    l1: candle_nn::Linear,
    l2: candle_nn::Linear,
}

impl Mlp {
    fn new(vb: VarBuilder) -> candle_core::Result<Mlp> {
        Ok(Mlp {
            l1: candle_nn::linear(4, 8, vb.pp("l1"))?,
            l2: candle_nn::linear(8, 2, vb.pp("l2"))?,
        })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let out = self.l2.forward(&self.l1.forward(x)?.relu()?)?;
        candle_nn::loss::mse(&out, y)
    }
}

/// Rank `rank`'s batch number `step` (3 samples), different for every rank and step.
fn batch(rank: usize, step: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..12)
        .map(|i| (((i + 13 * step + 101 * rank) as f32) * 0.37).sin())
        .collect();
    let y: Vec<f32> = (0..6)
        .map(|i| (((i + 5 * step + 7 * rank) as f32) * 0.23).cos())
        .collect();
    Ok((
        Tensor::from_vec(x, (3, 4), &Device::Cpu)?,
        Tensor::from_vec(y, (3, 2), &Device::Cpu)?,
    ))
}

/// Deterministic starting values.
fn init(varmap: &VarMap) -> candle_core::Result<()> {
    for (k, (_, v)) in sorted_vars(varmap).into_iter().enumerate() {
        let vals: Vec<f32> = (0..v.elem_count())
            .map(|i| (((i * 31 + k * 17) as f32) * 0.11).cos() * 0.4)
            .collect();
        v.set(&Tensor::from_vec(vals, v.shape(), &Device::Cpu)?)?;
    }
    Ok(())
}

type Params = Vec<(String, Vec<f32>)>;

fn params(varmap: &VarMap) -> candle_core::Result<Params> {
    sorted_vars(varmap)
        .into_iter()
        .map(|(k, v)| Ok((k, v.flatten_all()?.to_vec1::<f32>()?)))
        .collect()
}

fn sgd(vars: &[(String, candle_core::Var)], momentum: f64) -> candle_core::Result<Sgd> {
    Sgd::new(
        vars.to_vec(),
        SgdConfig {
            lr: LR,
            momentum,
            ..SgdConfig::default()
        },
    )
}

/// One process: at each step, the gradient of every rank that still has a batch, averaged over
/// those ranks, then an optimizer step. `extra` more steps follow with every rank active.
fn reference(counts: &[usize], momentum: f64, extra: usize) -> candle_core::Result<Params> {
    let varmap = VarMap::new();
    let net = Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    init(&varmap)?;
    let vars = sorted_vars(&varmap);
    let mut opt = sgd(&vars, momentum)?;
    let steps = counts.iter().copied().max().unwrap_or(0);
    for step in 0..steps + extra {
        let active: Vec<usize> = (0..counts.len())
            .filter(|&r| step < counts[r] || step >= steps)
            .collect();
        let mut sum: Vec<Option<Tensor>> = vec![None; vars.len()];
        let mut last: Option<GradStore> = None;
        for &r in &active {
            let (x, y) = batch(r, step)?;
            let g = net.loss(&x, &y)?.backward()?;
            for (i, (_, v)) in vars.iter().enumerate() {
                let gi = g.get(v.as_tensor()).cloned();
                sum[i] = match (sum[i].take(), gi) {
                    (Some(a), Some(b)) => Some((a + b)?),
                    (a, b) => a.or(b),
                };
            }
            last = Some(g);
        }
        let mut grads = last.ok_or_else(|| candle_core::Error::Msg("no rank active".into()))?;
        for (i, (_, v)) in vars.iter().enumerate() {
            if let Some(s) = sum[i].take() {
                grads.insert(v.as_tensor(), (s / active.len() as f64)?);
            }
        }
        opt.step(&grads)?;
    }
    params(&varmap)
}

/// How a rank gets through the end of its data.
#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    /// `join_with` stepping the optimizer.
    JoinWith,
    /// `join`: shadow only, then parameters from the last active rank.
    Join,
}

/// One rank training on `counts[rank]` batches with join mode on, then `extra` steps that every
/// rank takes.
fn train_rank(
    comm: &kolo::Communicator,
    counts: &[usize],
    opts: DdpOptions,
    momentum: f64,
    end: End,
    extra: usize,
) -> Result<(Params, JoinReport), TrainError> {
    let varmap = VarMap::new();
    Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    if comm.rank() == 0 {
        init(&varmap)?; // the others start from random values
    }
    let mut ddp = Ddp::new(comm, &varmap, opts)?;
    let mut opt = sgd(ddp.params(), momentum)?;
    ddp.set_join(true);
    let mine = counts[comm.rank()];
    let total = counts.iter().copied().max().unwrap_or(0);
    for step in 0..mine {
        let net = Mlp::new(ddp.var_builder(DType::F32, &Device::Cpu))?;
        let (x, y) = batch(comm.rank(), step)?;
        let grads = ddp.backward(&net.loss(&x, &y)?)?;
        opt.step(&grads)?;
    }
    let report = match end {
        End::JoinWith => ddp.join_with(|g| Ok(opt.step(g)?))?,
        End::Join => ddp.join()?,
    };
    for step in total..total + extra {
        let net = Mlp::new(ddp.var_builder(DType::F32, &Device::Cpu))?;
        let (x, y) = batch(comm.rank(), step)?;
        let grads = ddp.backward(&net.loss(&x, &y)?)?;
        opt.step(&grads)?;
    }
    Ok((params(&varmap)?, report))
}

fn run(
    counts: &[usize],
    opts: DdpOptions,
    momentum: f64,
    end: End,
    extra: usize,
) -> Vec<(Params, JoinReport)> {
    let res = kolo::run_local(
        counts.len(),
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm| train_rank(&comm, counts, opts, momentum, end, extra),
    );
    res.into_iter()
        .enumerate()
        .map(|(r, x)| match x {
            Ok(Ok(v)) => v,
            other => panic!("rank {r}: {other:?}"),
        })
        .collect()
}

fn max_relative_difference(a: &Params, b: &Params) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, va), (nb, vb))| {
            assert_eq!(na, nb);
            let diff: f64 = va
                .iter()
                .zip(vb)
                .map(|(x, y)| f64::from(x - y).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = vb.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
            diff / norm.max(1e-12)
        })
        .fold(0.0, f64::max)
}

/// Bucket sizes and overlap: one bucket, and 64-byte buckets (l2.weight alone, the rest split).
const SETTINGS: [(usize, bool); 3] = [(25 << 20, true), (64, true), (64, false)];

const UNEVEN: [usize; 3] = [3, 5, 7];

#[test]
fn three_five_and_seven_batches_match_the_average_over_active_ranks() -> candle_core::Result<()> {
    for momentum in [0.0, 0.9] {
        let want = reference(&UNEVEN, momentum, 0)?;
        // The uneven steps change the result: a plain average over 3 ranks would be far off.
        let even = reference(&[7, 7, 7], momentum, 0)?;
        assert!(max_relative_difference(&even, &want) > 1e-3);
        for (bucket_bytes, overlap) in SETTINGS {
            let opts = DdpOptions {
                bucket_bytes,
                overlap,
            };
            let got = run(&UNEVEN, opts, momentum, End::JoinWith, 0);
            for (rank, (p, report)) in got.iter().enumerate() {
                let d = max_relative_difference(p, &want);
                assert!(
                    d <= 1e-5,
                    "momentum {momentum} {opts:?} rank {rank}: relative difference {d:e}"
                );
                // join_with keeps replicas bit-identical without a broadcast.
                assert_eq!(p, &got[0].0, "rank {rank} differs from rank 0");
                assert_eq!(report.active_steps, UNEVEN[rank] as u64);
                assert_eq!(report.shadowed_steps, (7 - UNEVEN[rank]) as u64);
                assert_eq!(report.last_active_rank, 2);
            }
        }
    }
    Ok(())
}

#[test]
fn join_with_keeps_momentum_in_step_for_the_next_epoch() -> candle_core::Result<()> {
    // Two more steps with every rank active after the join: they use each rank's momentum buffer,
    // so they match only if the joined ranks kept stepping their optimizer.
    let want = reference(&UNEVEN, 0.9, 2)?;
    let got = run(&UNEVEN, DdpOptions::default(), 0.9, End::JoinWith, 2);
    for (rank, (p, _)) in got.iter().enumerate() {
        let d = max_relative_difference(p, &want);
        assert!(d <= 1e-5, "rank {rank}: relative difference {d:e}");
    }
    Ok(())
}

#[test]
fn join_without_an_optimizer_copies_the_last_active_rank() -> candle_core::Result<()> {
    for momentum in [0.0, 0.9] {
        let want = reference(&UNEVEN, momentum, 0)?;
        for (bucket_bytes, overlap) in SETTINGS {
            let opts = DdpOptions {
                bucket_bytes,
                overlap,
            };
            let got = run(&UNEVEN, opts, momentum, End::Join, 0);
            for (rank, (p, report)) in got.iter().enumerate() {
                let d = max_relative_difference(p, &want);
                assert!(
                    d <= 1e-5,
                    "momentum {momentum} {opts:?} rank {rank}: relative difference {d:e}"
                );
                assert_eq!(p, &got[2].0, "rank {rank} differs from rank 2");
                assert_eq!(report.last_active_rank, 2);
            }
        }
    }
    Ok(())
}

#[test]
fn equal_batches_with_join_equal_without_join() -> candle_core::Result<()> {
    for (bucket_bytes, overlap) in SETTINGS {
        let opts = DdpOptions {
            bucket_bytes,
            overlap,
        };
        let res = kolo::run_local(3, Config::default(), |comm| {
            let varmap = VarMap::new();
            Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
            init(&varmap)?;
            let ddp = Ddp::new(&comm, &varmap, opts)?;
            let mut opt = sgd(ddp.params(), 0.9)?;
            for step in 0..4 {
                let net = Mlp::new(ddp.var_builder(DType::F32, &Device::Cpu))?;
                let (x, y) = batch(comm.rank(), step)?;
                opt.step(&ddp.backward(&net.loss(&x, &y)?)?)?;
            }
            Ok::<_, TrainError>(params(&varmap)?)
        });
        let without: Vec<Params> = res
            .into_iter()
            .map(|r| r.expect("thread").expect("rank"))
            .collect();
        let with = run(&[4, 4, 4], opts, 0.9, End::JoinWith, 0);
        let want = reference(&[4, 4, 4], 0.9, 0)?;
        for (rank, (p, report)) in with.iter().enumerate() {
            // Sum then divide by 3 is the division `Avg` makes: bit-identical.
            assert_eq!(p, &without[rank], "{opts:?} rank {rank}");
            assert!(max_relative_difference(p, &want) <= 1e-5);
            assert_eq!(report.shadowed_steps, 0);
            assert_eq!(report.active_steps, 4);
        }
    }
    Ok(())
}

#[test]
fn uneven_batches_without_join_fail_naming_the_ranks() {
    // Rank 0 has 2 batches, rank 1 has 3. After its loop rank 0 goes on to the end-of-epoch
    // collective (copying rank 0's parameters) while rank 1 still sends gradients.
    let res = kolo::run_local(
        2,
        Config::default().with_timeout(Duration::from_secs(3)),
        |comm| {
            let varmap = VarMap::new();
            Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
            let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            let mut opt = sgd(ddp.params(), 0.0)?;
            for step in 0..2 + comm.rank() {
                let net = Mlp::new(ddp.var_builder(DType::F32, &Device::Cpu))?;
                let (x, y) = batch(comm.rank(), step)?;
                opt.step(&ddp.backward(&net.loss(&x, &y)?)?)?;
            }
            ddp.broadcast_parameters(0)
        },
    );
    let errors: Vec<String> = res
        .into_iter()
        .map(|r| match r {
            Ok(Err(e)) => e.to_string(),
            other => panic!("expected an error, got {other:?}"),
        })
        .collect();
    for (rank, e) in errors.iter().enumerate() {
        assert!(
            e.contains("rank 0") && e.contains("rank 1"),
            "rank {rank}: {e}"
        );
    }
    assert!(errors.iter().any(|e| e.contains("mismatch")), "{errors:?}");
}

#[test]
fn join_needs_join_mode() {
    let res = kolo::run_local(2, Config::default(), |comm| {
        let varmap = VarMap::new();
        Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
        let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
        ddp.join().map(|_| ())
    });
    for r in res {
        match r {
            Ok(Err(TrainError::InvalidArgument { arg: "join", .. })) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_rank_without_join_mode_is_reported() {
    // Rank 1 forgot set_join: its gradient all-reduce meets rank 0's count of active ranks.
    let res = kolo::run_local(
        2,
        Config::default().with_timeout(Duration::from_secs(3)),
        |comm| {
            let varmap = VarMap::new();
            Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
            let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            ddp.set_join(comm.rank() == 0);
            let net = Mlp::new(ddp.var_builder(DType::F32, &Device::Cpu))?;
            let (x, y) = batch(comm.rank(), 0)?;
            ddp.backward(&net.loss(&x, &y)?).map(|_| ())
        },
    );
    let errors: Vec<String> = res
        .into_iter()
        .map(|r| match r {
            Ok(Err(e)) => e.to_string(),
            other => panic!("expected an error, got {other:?}"),
        })
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("mismatch") && e.contains("rank 0") && e.contains("rank 1")),
        "{errors:?}"
    );
}

#[test]
fn distributed_optimizer_joins_with_accumulation() -> candle_core::Result<()> {
    // Two backward passes per step, each on half of the batch with the loss halved: the same
    // gradients as one pass on the whole batch.
    let want = reference(&UNEVEN, 0.9, 0)?;
    let res = kolo::run_local(
        3,
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm| {
            let varmap = VarMap::new();
            Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
            if comm.rank() == 0 {
                init(&varmap)?;
            }
            let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            let opt = sgd(ddp.params(), 0.9)?;
            let mut dopt = DistributedOptimizer::new(ddp, opt, 2)?;
            dopt.set_join(true);
            for step in 0..UNEVEN[comm.rank()] {
                let (x, y) = batch(comm.rank(), step)?;
                for half in [0..2, 2..3] {
                    let net = Mlp::new(dopt.ddp().var_builder(DType::F32, &Device::Cpu))?;
                    let n = half.len();
                    let (xs, ys) = (x.narrow(0, half.start, n)?, y.narrow(0, half.start, n)?);
                    // mse is a mean over elements: weight each part by its share of the batch.
                    let l = (net.loss(&xs, &ys)? * (n as f64 / 3.0))?;
                    dopt.backward_step(&l)?;
                }
            }
            let report = dopt.join()?;
            assert_eq!(dopt.steps(), 7, "rank {}", comm.rank());
            Ok::<_, TrainError>((params(&varmap)?, report))
        },
    );
    for (rank, r) in res.into_iter().enumerate() {
        let (p, report) = r.expect("thread").expect("rank");
        let d = max_relative_difference(&p, &want);
        assert!(d <= 1e-5, "rank {rank}: relative difference {d:e}");
        assert_eq!(report.shadowed_steps, (7 - UNEVEN[rank]) as u64);
    }
    Ok(())
}

/// One rank of the 3/5/7 run with a per-step loss check: `nan_at` makes rank 2's loss NaN at that
/// step. Returns the means the check gave (active steps, then shadowed ones) and the parameters.
fn train_with_loss_check(
    comm: &kolo::Communicator,
    nan_at: Option<usize>,
) -> Result<(Vec<Option<f64>>, Params), TrainError> {
    let varmap = VarMap::new();
    Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    if comm.rank() == 0 {
        init(&varmap)?;
    }
    let ddp = Ddp::new(comm, &varmap, DdpOptions::default())?;
    let opt = sgd(ddp.params(), 0.9)?;
    let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
    dopt.set_join(true);
    let mut means = Vec::new();
    let mut step = 0u64;
    for s in 0..UNEVEN[comm.rank()] {
        let net = Mlp::new(dopt.ddp().var_builder(DType::F32, &Device::Cpu))?;
        let (x, y) = batch(comm.rank(), s)?;
        let loss = net.loss(&x, &y)?;
        let mut value = f64::from(loss.to_scalar::<f32>()?);
        if comm.rank() == 2 && nan_at == Some(s) {
            value = f64::NAN;
        }
        means.push(check_loss_active(comm, step, Some(value))?);
        dopt.backward_step(&loss)?;
        step += 1;
    }
    dopt.join_with_pre_step(|| {
        means.push(check_loss_active(comm, step, None)?);
        step += 1;
        Ok(())
    })?;
    Ok((means, params(&varmap)?))
}

#[test]
fn a_per_step_loss_check_is_shadowed_by_the_pre_step_hook() -> candle_core::Result<()> {
    let want = reference(&UNEVEN, 0.9, 0)?;
    let res = kolo::run_local(
        3,
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm| train_with_loss_check(&comm, None),
    );
    let got: Vec<(Vec<Option<f64>>, Params)> = res
        .into_iter()
        .map(|r| r.expect("thread").expect("rank"))
        .collect();
    for (rank, (means, p)) in got.iter().enumerate() {
        // 7 steps, then the final round where every rank has joined.
        assert_eq!(means.len(), 8, "rank {rank}");
        assert_eq!(means, &got[2].0, "rank {rank} saw other means than rank 2");
        assert!(means[..7].iter().all(Option::is_some));
        assert_eq!(means[7], None);
        let d = max_relative_difference(p, &want);
        assert!(d <= 1e-5, "rank {rank}: relative difference {d:e}");
    }
    // At step 5 only rank 2 is active: the mean is its loss alone, not a third of it.
    let (x, y) = batch(2, 5)?;
    let varmap = VarMap::new();
    let net = Mlp::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    for ((_, v), (_, vals)) in sorted_vars(&varmap).iter().zip(reference_after(5)?) {
        v.set(&Tensor::from_vec(vals, v.shape(), &Device::Cpu)?)?;
    }
    let alone = f64::from(net.loss(&x, &y)?.to_scalar::<f32>()?);
    let seen = got[0].0[5].unwrap_or(f64::NAN);
    assert!(
        (seen - alone).abs() <= 1e-5 * alone.abs(),
        "{seen} vs {alone}"
    );
    Ok(())
}

/// The reference parameters after the first `steps` steps of the 3/5/7 run (momentum 0.9).
fn reference_after(steps: usize) -> candle_core::Result<Params> {
    // The first `steps` steps of the 3/5/7 run are the whole run of counts capped at `steps`.
    let counts: Vec<usize> = UNEVEN.iter().map(|&c| c.min(steps)).collect();
    reference(&counts, 0.9, 0)
}

#[test]
fn a_non_finite_loss_on_the_last_active_rank_stops_the_joined_ranks_too() {
    let res = kolo::run_local(
        3,
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm| train_with_loss_check(&comm, Some(6)),
    );
    for (rank, r) in res.into_iter().enumerate() {
        match r {
            Ok(Err(TrainError::NonFiniteLoss { step: 6, losses })) => {
                assert!(losses[2].is_nan(), "rank {rank}: {losses:?}");
                assert_eq!(&losses[..2], &[0.0, 0.0], "joined ranks count as 0");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}
