//! Join for uneven inputs: ranks with different numbers of batches finish together, and every rank
//! ends with the parameters of one process that applies, step by step, the gradient averaged over
//! the ranks that still had a batch at that step. Without join, the peers' error names the ranks.

mod common;
mod join_common;

use std::time::Duration;

use candle_core::{DType, Device};
use common::{init, max_relative_difference, on_ranks, params, Params};
use join_common::*;
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions, JoinReport};
use kolo_ddp::TrainError;

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
    let (varmap, mut ddp) = mlp_ddp(comm, opts)?;
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
    on_ranks(
        counts.len(),
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm| train_rank(&comm, counts, opts, momentum, end, extra),
    )
}

/// Bucket sizes and overlap: one bucket, and 64-byte buckets (l2.weight alone, the rest split).
const SETTINGS: [(usize, bool); 3] = [(25 << 20, true), (64, true), (64, false)];

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
                ..DdpOptions::default()
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
                ..DdpOptions::default()
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
            ..DdpOptions::default()
        };
        let res = kolo::run_local(3, Config::default(), |comm| {
            let varmap = new_varmap()?;
            init(&varmap, INIT)?;
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
            let varmap = new_varmap()?;
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
        let varmap = new_varmap()?;
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
            let varmap = new_varmap()?;
            let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            ddp.set_join(comm.rank() == 0);
            let net = Mlp::new(ddp.var_builder(DType::F32, &Device::Cpu))?;
            let (x, y) = batch(comm.rank(), 0)?;
            ddp.backward(&net.loss(&x, &y)?).map(|_| ())
        },
    );
    let mut told = 0;
    for (rank, r) in res.into_iter().enumerate() {
        let e = match r {
            Ok(Err(e)) => e,
            other => panic!("rank {rank}: expected an error, got {other:?}"),
        };
        let text = e.to_string();
        // A rank that sees the mismatch itself is told what differs and what to do (the mismatch
        // kept as the source); one the other aborted first gets the mismatch in the abort.
        if let TrainError::JoinModeDiffers {
            rank: r,
            peer,
            here,
            ..
        } = e
        {
            told += 1;
            assert!(
                r == rank && peer == 1 - rank && here == (rank == 0),
                "{text}"
            );
            let (mine, theirs) = if here { ("on", "off") } else { ("off", "on") };
            let said = format!("join mode is {mine} on rank {rank} but {theirs} on rank {peer}");
            assert!(text.contains(&said), "rank {rank}: {text}");
            assert!(
                text.contains("set_join") && text.contains("mismatch"),
                "{text}"
            );
        } else {
            assert!(
                matches!(&e, TrainError::Comm(kolo::Error::Aborted { by, .. }) if *by == 1 - rank)
                    && text.contains("mismatch"),
                "rank {rank}: {text}"
            );
        }
    }
    assert!(told >= 1, "no rank was told that join mode differs");
}

#[test]
fn a_world_of_one_rank_joins_at_once() -> candle_core::Result<()> {
    let want = reference(&[3], 0.9, 0)?;
    let got = run(&[3], DdpOptions::default(), 0.9, End::JoinWith, 0);
    assert!(max_relative_difference(&got[0].0, &want) <= 1e-6);
    assert_eq!(got[0].1.shadowed_steps, 0);
    assert_eq!(got[0].1.last_active_rank, 0);
    Ok(())
}
