//! Gradient clipping by the global norm: on Ddp's averaged gradients inside DistributedOptimizer
//! and on ZeRO's reduce-scattered shards, each step ending where PyTorch's `clip_grad_norm_` plus
//! SGD puts it (computed by hand), on every rank alike; bad settings and non-finite norms are
//! errors.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Init, VarMap};
use kolo::Config;
use kolo_ddp::clip::clip_grad_norm;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::distributed::DistributedOptimizer;
use kolo_ddp::optim::{self, OptimizerConfig, ShardedOptimizer};
use kolo_ddp::{Result, TrainError};

const LR: f64 = 0.5;

/// Rank r's input: the averaged gradient of `sum(w * x)` over 2 ranks is [3, 4, 0, 0] (norm 5).
fn input(rank: usize) -> Vec<f32> {
    if rank == 0 {
        vec![6.0, 0.0, 0.0, 0.0]
    } else {
        vec![0.0, 8.0, 0.0, 0.0]
    }
}

fn varmap(names: &[(&str, usize)]) -> candle_core::Result<VarMap> {
    let vm = VarMap::new();
    for (n, len) in names {
        vm.get(*len, n, Init::Const(0.0), DType::F32, &Device::Cpu)?;
    }
    Ok(vm)
}

fn values(vm: &VarMap, name: &str) -> Vec<f32> {
    let data = vm.data().lock().unwrap_or_else(|p| p.into_inner());
    data[name].as_tensor().to_vec1::<f32>().unwrap_or_default()
}

/// One step of SGD(lr) after clipping to `max` the gradient [3, 4, 0, 0]: the parameters.
fn expected(max: f64) -> Vec<f32> {
    let f = (max / (5.0 + 1e-6)).min(1.0);
    [3.0, 4.0, 0.0, 0.0]
        .iter()
        .map(|g| (-LR * g * f) as f32)
        .collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
}

#[test]
fn distributed_optimizer_clips_the_averaged_gradients() {
    for (max, overlap) in [(1.0, true), (1.0, false), (10.0, true)] {
        let res = kolo::run_local(2, Config::default(), move |comm| -> Result<_> {
            let vm = varmap(&[("w", 4)])?;
            let opts = DdpOptions {
                overlap,
                ..DdpOptions::default()
            };
            let ddp = Ddp::new(&comm, &vm, opts)?;
            let w = ddp.var_builder(DType::F32, &Device::Cpu).get(4, "w")?;
            let sgd = optim::build(ddp.params(), OptimizerConfig::sgd(LR, 0.0))?;
            let mut opt = DistributedOptimizer::new(ddp, sgd, 1)?;
            opt.set_max_grad_norm(Some(max))?;
            let x = Tensor::new(input(comm.rank()), &Device::Cpu)?;
            opt.backward_step(&(&w * &x)?.sum_all()?)?;
            Ok((values(&vm, "w"), opt.last_grad_norm()))
        });
        for (r, out) in res.into_iter().enumerate() {
            let (w, norm) = out
                .map_err(|e| format!("{e:?}"))
                .and_then(|r| r.map_err(|e| e.to_string()))
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            assert!(close(&w, &expected(max)), "max {max} rank {r}: {w:?}");
            assert_eq!(norm, Some(5.0), "max {max} rank {r}");
        }
    }
}

#[test]
fn zero_clips_its_shards_by_the_global_norm() {
    let res = kolo::run_local(2, Config::default(), |comm| -> Result<_> {
        // Two variables, one per rank's shard: [w0, w1] and [w2, w3].
        let vm = varmap(&[("a", 2), ("b", 2)])?;
        let vars = kolo_nn::vars::sorted_vars(&vm);
        let mut opt = ShardedOptimizer::new(&comm, vars.clone(), OptimizerConfig::sgd(LR, 0.0))?;
        opt.set_max_grad_norm(Some(1.0))?;
        let x = input(comm.rank());
        let (a, b) = (vars[0].1.as_tensor(), vars[1].1.as_tensor());
        let xa = Tensor::new(&x[..2], &Device::Cpu)?;
        let xb = Tensor::new(&x[2..], &Device::Cpu)?;
        let loss = ((a * &xa)?.sum_all()? + (b * &xb)?.sum_all()?)?;
        let mut grads = loss.backward()?;
        opt.reduce_scatter_step(&mut grads)?;
        let mut w = values(&vm, "a");
        w.extend(values(&vm, "b"));
        Ok((w, opt.last_grad_norm(), opt.owners().to_vec()))
    });
    for (r, out) in res.into_iter().enumerate() {
        let (w, norm, owners) = out
            .map_err(|e| format!("{e:?}"))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(owners, [0, 1], "one variable per rank");
        assert!(close(&w, &expected(1.0)), "rank {r}: {w:?}");
        assert_eq!(norm, Some(5.0), "rank {r}");
    }
}

#[test]
fn bad_settings_and_non_finite_norms_are_errors() -> Result<()> {
    let w = Var::new(&[0.0f32, 0.0], &Device::Cpu)?;
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let loss = (w.as_tensor() * 2.0)?.sum_all()?;
        let mut grads = loss.backward()?;
        let e = clip_grad_norm(&mut grads, std::slice::from_ref(&w), bad);
        assert!(
            matches!(
                e,
                Err(TrainError::InvalidArgument {
                    arg: "max_grad_norm",
                    ..
                })
            ),
            "{bad}: {e:?}"
        );
    }
    let nan = Tensor::new(&[f32::NAN, 1.0], &Device::Cpu)?;
    let mut grads = (w.as_tensor() * &nan)?.sum_all()?.backward()?;
    let e = clip_grad_norm(&mut grads, std::slice::from_ref(&w), 1.0);
    match e {
        Err(TrainError::InvalidArgument {
            arg: "gradients",
            reason,
        }) => {
            assert!(reason.contains("NaN"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}
