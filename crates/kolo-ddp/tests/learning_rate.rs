//! Every rank steps with the same learning rate, or every rank stops before the step with an error
//! naming each rank's: DistributedOptimizer checks its rate (set or scheduled) on every averaged
//! pass, a loop of its own through `Ddp::check_learning_rate`; ranks in join mode shadowing the
//! others' steps check none.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarMap};
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::{DistributedOptimizer, LrDecay, LrSchedule};
use kolo_ddp::optim::{self, OptimizerConfig};
use kolo_ddp::{Result, TrainError};

/// A model of one 4-value weight; `steps` steps of SGD at rank `r`'s rate `lr(r)` (with
/// `passes` backward passes per step), then the weights.
fn train(
    ranks: usize,
    passes: usize,
    schedule: Option<fn(usize) -> LrSchedule>,
    lr: fn(usize) -> f64,
) -> Vec<Result<Vec<f32>>> {
    let res = kolo::run_local(ranks, Config::default(), move |comm| -> Result<_> {
        let vm = VarMap::new();
        vm.get(4, "w", Init::Const(0.0), DType::F32, &Device::Cpu)?;
        let ddp = Ddp::new(&comm, &vm, DdpOptions::default())?;
        let w = ddp.var_builder(DType::F32, &Device::Cpu).get(4, "w")?;
        let sgd = optim::build(ddp.params(), OptimizerConfig::sgd(lr(comm.rank()), 0.0))?;
        let mut opt = DistributedOptimizer::new(ddp, sgd, passes)?;
        if let Some(s) = schedule {
            opt = opt.with_schedule(s(comm.rank()));
        }
        let x = Tensor::new(&[1f32, 2.0, 3.0, 4.0], &Device::Cpu)?;
        for _ in 0..2 * passes {
            opt.backward_step(&(&w * &x)?.sum_all()?)?;
        }
        Ok(w.to_vec1::<f32>()?)
    });
    res.into_iter()
        .map(|r| r.unwrap_or_else(|p| panic!("{p}")))
        .collect()
}

fn rates_of(r: &Result<Vec<f32>>) -> Vec<Option<f64>> {
    match r {
        Err(TrainError::LearningRatesDiffer { rates, .. }) => rates.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rate_scaled_by_the_rank_stops_every_rank_naming_each_rate() {
    for passes in [1, 2] {
        let res = train(3, passes, None, |r| if r == 2 { 0.2 } else { 0.1 });
        for (rank, r) in res.iter().enumerate() {
            assert_eq!(
                rates_of(r),
                [Some(0.1), Some(0.1), Some(0.2)],
                "rank {rank}"
            );
            let text = r
                .as_ref()
                .map_err(ToString::to_string)
                .expect_err("an error");
            assert!(
                text.starts_with(&format!(
                    "rank {rank}: the ranks step with different learning rates: rank 0 0.1, \
                     rank 1 0.1, rank 2 0.2; every rank must use the same one"
                )),
                "{text}"
            );
        }
    }
}

#[test]
fn the_same_rate_trains_and_a_schedule_that_differs_is_caught() {
    let res = train(2, 1, None, |_| 0.1);
    let w: Vec<Vec<f32>> = res.into_iter().map(|r| r.expect("trains")).collect();
    assert_eq!(w[0], w[1]);
    assert!(w[0].iter().all(|&v| v < 0.0), "{w:?}");
    // Same optimizer rate, but a warm-up that reaches a rank-dependent scale.
    let res = train(
        2,
        1,
        Some(|r| LrSchedule {
            base_lr: 0.1,
            scale: 1.0 + r as f64,
            warmup_steps: 1,
            decay: LrDecay::Constant,
        }),
        |_| 0.1,
    );
    for r in &res {
        // Step 0 runs at the base rate on both; step 1 at 0.1 and 0.2.
        assert_eq!(rates_of(r), [Some(0.1), Some(0.2)]);
    }
}

/// A loop with its own candle optimizer checks through Ddp; a rank that checks none is neutral.
#[test]
fn an_own_loop_checks_through_the_ddp() {
    let res = kolo::run_local(3, Config::default(), |comm| -> Result<()> {
        let vm = VarMap::new();
        vm.get(2, "w", Init::Const(0.0), DType::F32, &Device::Cpu)?;
        let ddp = Ddp::new(&comm, &vm, DdpOptions::default())?;
        let w = ddp.var_builder(DType::F32, &Device::Cpu).get(2, "w")?;
        let loss = w.sum_all()?;
        // Rank 1 checks nothing: ranks 0 and 2 agree.
        if comm.rank() != 1 {
            ddp.check_learning_rate(0.01);
        }
        ddp.backward(&loss)?;
        if comm.rank() != 1 {
            ddp.check_learning_rate(if comm.rank() == 0 { 0.01 } else { 0.03 });
        }
        ddp.backward(&loss)?;
        Ok(())
    });
    for r in res {
        match r.unwrap_or_else(|p| panic!("{p}")) {
            Err(TrainError::LearningRatesDiffer { rates, .. }) => {
                assert_eq!(rates, [Some(0.01), None, Some(0.03)]);
            }
            other => panic!("{other:?}"),
        }
    }
}
