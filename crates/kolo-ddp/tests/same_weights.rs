//! Replicas that drift apart are caught, not written as the job's checkpoint: `Ddp::check_replicas`
//! (and `save_checkpoint`, which calls it) fails on every rank naming the ranks that differ from
//! rank 0 and the first parameter in which they do; replicas in step pass and are written.

use std::path::Path;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder, VarMap};
use kolo::{Communicator, Config};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::DistributedOptimizer;
use kolo_ddp::optim::{self, OptimizerConfig};
use kolo_ddp::TrainError;

/// On `ranks` ranks: a 4 → 3 → 2 MLP (`a.weight`, `a.bias`, `b.weight`, `b.bias`), AdamW with rank
/// `r`'s weight decay `decay(r)`, three steps on one batch, then `tamper` (a rank's own change to
/// its variables), then `save_checkpoint(root)` when given, else `check_replicas`. Each rank's
/// error, or whether it wrote.
fn train(
    ranks: usize,
    decay: fn(usize) -> f64,
    tamper: fn(usize, &Ddp) -> candle_core::Result<()>,
    root: Option<&Path>,
) -> Vec<Result<bool, TrainError>> {
    let config = Config::default().with_timeout(Duration::from_secs(20));
    kolo::run_local(
        ranks,
        config,
        |comm: Communicator| -> Result<bool, TrainError> {
            let dev = Device::Cpu;
            let varmap = VarMap::new();
            let mlp = |vb: VarBuilder| -> candle_core::Result<_> {
                let a = candle_nn::linear(4, 3, vb.pp("a"))?;
                let b = candle_nn::linear(3, 2, vb.pp("b"))?;
                Ok(move |x: &Tensor| b.forward(&a.forward(x)?.relu()?))
            };
            let _creates_the_parameters = mlp(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
            let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            let model = mlp(ddp.var_builder(DType::F32, &dev))?;
            let adamw = optim::build(
                ddp.params(),
                OptimizerConfig::adamw(0.01, decay(comm.rank())),
            )?;
            let mut opt = DistributedOptimizer::new(ddp, adamw, 1)?;
            let x = Tensor::arange(0f32, 8.0, &dev)?.reshape((2, 4))?;
            for _ in 0..3 {
                opt.backward_step(&model(&x)?.sqr()?.sum_all()?)?;
            }
            tamper(comm.rank(), opt.ddp())?;
            match root {
                Some(root) => Ok(opt.save_checkpoint(root, 1)?.is_some()),
                None => opt.ddp().check_replicas().map(|()| false),
            }
        },
    )
    .into_iter()
    .map(|r| r.unwrap_or_else(|p| panic!("a rank panicked: {p}")))
    .collect()
}

fn untouched(_: usize, _: &Ddp) -> candle_core::Result<()> {
    Ok(())
}

fn differing(r: &Result<bool, TrainError>) -> (Vec<usize>, String) {
    match r {
        Err(TrainError::ReplicasDiffer {
            ranks, parameter, ..
        }) => (ranks.clone(), parameter.clone()),
        other => panic!("expected ReplicasDiffer, got {other:?}"),
    }
}

#[test]
fn replicas_in_step_pass_and_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let got: Vec<bool> = train(3, |_| 0.1, untouched, Some(dir.path()))
        .into_iter()
        .map(|r| r.expect("in step"))
        .collect();
    assert_eq!(got, [true, false, false]);
    assert!(dir.path().join("latest").exists());
    for r in train(2, |_| 0.1, untouched, None) {
        r.expect("in step");
    }
}

#[test]
fn a_weight_decay_set_per_rank_stops_the_checkpoint_on_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let got = train(
        3,
        |r| if r == 2 { 0.5 } else { 0.1 },
        untouched,
        Some(dir.path()),
    );
    for (rank, r) in got.iter().enumerate() {
        // Every parameter decays, so the first in the Ddp's order differs.
        assert_eq!(differing(r), (vec![2], "a.bias".to_string()), "rank {rank}");
        let text = r
            .as_ref()
            .map_err(ToString::to_string)
            .expect_err("refused");
        assert!(
            text.starts_with(&format!(
                "rank {rank}: the replicas hold different parameters: rank 2 differs from rank \
                 0's, first `a.bias`;"
            )) && text.contains("Ddp::broadcast_parameters(0)"),
            "{text}"
        );
    }
    assert!(
        !dir.path().join("latest").exists(),
        "nothing written where the replicas differ"
    );
}

#[test]
fn a_parameter_changed_on_some_ranks_is_named_with_them() {
    // Ranks 1 and 3 change the last bit of one value of `b.weight`.
    let got = train(
        4,
        |_| 0.1,
        |rank, ddp| {
            if rank % 2 == 0 {
                return Ok(());
            }
            let (_, w) = ddp
                .params()
                .iter()
                .find(|(name, _)| name == "b.weight")
                .expect("b.weight");
            let mut v = w.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            v[5] = f32::from_bits(v[5].to_bits() ^ 1);
            w.set(&Tensor::from_vec(v, w.shape(), w.device())?)
        },
        None,
    );
    for (rank, r) in got.iter().enumerate() {
        assert_eq!(
            differing(r),
            (vec![1, 3], "b.weight".to_string()),
            "rank {rank}"
        );
        let text = r.as_ref().map_err(ToString::to_string).expect_err("caught");
        assert!(text.contains("ranks 1, 3 differ from rank 0's"), "{text}");
    }
}
