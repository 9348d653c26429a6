//! Join for uneven inputs through `DistributedOptimizer`: gradient accumulation (also an unfinished
//! last step), and a per-step loss check shadowed by the `pre_step` hook.

mod common;
mod join_common;

use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::{max_relative_difference, on_ranks, params, Params};
use join_common::*;
use kolo::Config;
use kolo_ddp::ddp::DdpOptions;
use kolo_ddp::distributed::{check_loss_active, DistributedOptimizer};
use kolo_ddp::optim::Sgd;
use kolo_ddp::TrainError;
use kolo_nn::vars::sorted_vars;

/// An [`Mlp`]'s Ddp (see [`mlp_ddp`]) in a `DistributedOptimizer` in join mode, stepping SGD with
/// momentum 0.9 every `accumulation` backward passes.
fn joining_optimizer(
    comm: &kolo::Communicator,
    accumulation: usize,
) -> Result<(VarMap, DistributedOptimizer<Sgd>), TrainError> {
    let (varmap, ddp) = mlp_ddp(comm, DdpOptions::default())?;
    let opt = sgd(ddp.params(), 0.9)?;
    let mut dopt = DistributedOptimizer::new(ddp, opt, accumulation)?;
    dopt.set_join(true);
    Ok((varmap, dopt))
}

/// `f` on 3 thread-ranks (30 s timeout).
fn three_ranks<T: Send + std::fmt::Debug>(
    f: impl Fn(&kolo::Communicator) -> Result<T, TrainError> + Sync,
) -> Vec<T> {
    on_ranks(
        3,
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm| f(&comm),
    )
}

#[test]
fn distributed_optimizer_joins_with_accumulation() -> candle_core::Result<()> {
    // Two backward passes per step, each on half of the batch with the loss halved: the same
    // gradients as one pass on the whole batch.
    let want = reference(&UNEVEN, 0.9, 0)?;
    let res = three_ranks(|comm| {
        let (varmap, mut dopt) = joining_optimizer(comm, 2)?;
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
        Ok((params(&varmap)?, report))
    });
    for (rank, (p, report)) in res.into_iter().enumerate() {
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
    let (varmap, mut dopt) = joining_optimizer(comm, 1)?;
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
    let got = three_ranks(|comm| train_with_loss_check(comm, None));
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

#[test]
fn distributed_optimizer_join_applies_an_unfinished_accumulation_first() -> candle_core::Result<()>
{
    // Two passes per step, one batch per pass (loss halved); ranks have 3, 5 and 7 passes, so each
    // ends with a step of one pass: it is synchronized as a step of its own before joining.
    let passes = UNEVEN;
    let want = reference_with(3, 4, 0.9, |net, r, step| {
        let mut total: Option<Tensor> = None;
        for p in [2 * step, 2 * step + 1]
            .into_iter()
            .filter(|&p| p < passes[r])
        {
            let (x, y) = batch(r, p)?;
            let l = (net.loss(&x, &y)? * 0.5)?;
            total = Some(match total {
                Some(t) => (t + l)?,
                None => l,
            });
        }
        Ok(total)
    })?;
    let res = three_ranks(|comm| {
        let (varmap, mut dopt) = joining_optimizer(comm, 2)?;
        for p in 0..passes[comm.rank()] {
            let net = Mlp::new(dopt.ddp().var_builder(DType::F32, &Device::Cpu))?;
            let (x, y) = batch(comm.rank(), p)?;
            dopt.backward_step(&(net.loss(&x, &y)? * 0.5)?)?;
        }
        let report = dopt.join()?;
        assert_eq!(dopt.steps(), 4, "rank {}", comm.rank());
        Ok((params(&varmap)?, report))
    });
    for (rank, (p, report)) in res.into_iter().enumerate() {
        let d = max_relative_difference(&p, &want);
        assert!(d <= 1e-5, "rank {rank}: relative difference {d:e}");
        assert_eq!(report.active_steps, passes[rank].div_ceil(2) as u64);
    }
    Ok(())
}
