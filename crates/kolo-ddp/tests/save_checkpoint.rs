//! `DistributedOptimizer::save_checkpoint` is a collective that every rank must make at the same
//! point: ranks at different epochs or steps are refused on every rank, and a write that fails on
//! rank 0 is an error on every rank (not a silent `None` on the others).

use std::path::Path;
use std::time::Duration;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use kolo::{Communicator, Config};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::DistributedOptimizer;
use kolo_ddp::optim::{self, OptimizerConfig};
use kolo_ddp::TrainError;

/// Each rank's `save_checkpoint(root, epoch(rank))` on a small linear model, as text.
fn save_on_ranks(root: &Path, epoch: impl Fn(usize) -> usize + Sync) -> Vec<Result<bool, String>> {
    let config = Config::default().with_timeout(Duration::from_secs(20));
    kolo::run_local(2, config, |comm: Communicator| -> Result<bool, String> {
        let run = || -> Result<bool, TrainError> {
            let varmap = VarMap::new();
            candle_nn::linear(
                4,
                2,
                VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
            )?;
            let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            let opt = optim::build(ddp.params(), OptimizerConfig::sgd(0.1, 0.9))?;
            let dopt = DistributedOptimizer::new(ddp, opt, 1)?;
            Ok(dopt.save_checkpoint(root, epoch(comm.rank()))?.is_some())
        };
        run().map_err(|e| e.to_string())
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|e| Err(format!("rank panicked or failed: {e:?}"))))
    .collect()
}

#[test]
fn every_rank_saving_the_same_epoch_writes_once_on_rank_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let got = save_on_ranks(dir.path(), |_| 3);
    assert_eq!(got, vec![Ok(true), Ok(false)]);
    assert!(dir.path().join("latest").exists());
}

#[test]
fn ranks_saving_different_epochs_are_refused_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let got = save_on_ranks(dir.path(), |rank| 1 + rank);
    for (rank, r) in got.iter().enumerate() {
        let e = r.as_ref().expect_err("refused");
        let (other, mine) = (1 - rank, 1 + rank);
        assert!(
            e.contains(&format!("rank {other} saves epoch {}", 1 + other))
                && e.contains(&format!("rank {rank} epoch {mine}"))
                && e.contains("on every rank at the same point"),
            "rank {rank}: {e}"
        );
    }
    assert!(!dir.path().join("latest").exists(), "nothing is written");
}

#[test]
fn a_write_that_fails_on_rank_0_is_an_error_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A file where the checkpoint directory should be: rank 0 cannot write under it.
    let root = dir.path().join("a-file");
    std::fs::write(&root, b"").expect("a file");
    let got = save_on_ranks(&root, |_| 1);
    assert!(got[0].is_err(), "{:?}", got[0]);
    let e = got[1].as_ref().expect_err("rank 1 learns of it");
    assert!(e.contains("rank 0 could not write the checkpoint"), "{e}");
}
