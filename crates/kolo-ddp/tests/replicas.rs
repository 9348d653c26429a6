//! Single-process data parallel with threads as replicas: R replicas with batch b each, gradients
//! averaged, equal one replica with batch R·b, step by step (plain SGD, and Ddp + SGD momentum as
//! `kolo train --replicas` runs it).

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::{error_text, params};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::optim::{Sgd, SgdConfig};
use kolo_ddp::replicas::{all_reduce_mean, replicate, split_batch};
use kolo_ddp::{Result, TrainError};
use kolo_models::{Mlp, Model};
use kolo_nn::vars::sorted_vars;

const SHAPE: [usize; 3] = [1, 4, 4];
const CLASSES: usize = 3;
const HIDDEN: &[usize] = &[8];

fn model(vm: &VarMap) -> Result<Mlp> {
    Ok(Mlp::new(
        VarBuilder::from_varmap(vm, DType::F32, &Device::Cpu),
        SHAPE,
        CLASSES,
        HIDDEN,
    )?)
}

/// Batch `step` of `len` samples, deterministic.
fn batch(step: usize, len: usize) -> Result<(Tensor, Tensor)> {
    let n = SHAPE.iter().product::<usize>();
    let x: Vec<f32> = (0..len * n)
        .map(|i| (((i * 7919 + step * 104_729) % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let y: Vec<u32> = (0..len).map(|i| ((i + step) % CLASSES) as u32).collect();
    Ok((
        Tensor::from_vec(x, (len, SHAPE[0], SHAPE[1], SHAPE[2]), &Device::Cpu)?,
        Tensor::from_vec(y, len, &Device::Cpu)?,
    ))
}

fn values(vm: &VarMap) -> Result<Vec<(String, Vec<f32>)>> {
    Ok(params(vm)?)
}

/// The cross-entropy loss of `m` on batch `step` of `len` samples, or on replica `rank`'s share
/// of it among `replicas`.
fn loss(m: &Mlp, step: usize, len: usize, share: Option<(usize, usize)>) -> Result<Tensor> {
    let (x, y) = batch(step, len)?;
    let (x, y) = match share {
        Some((rank, replicas)) => split_batch(&x, &y, replicas)?.swap_remove(rank),
        None => (x, y),
    };
    Ok(candle_nn::loss::cross_entropy(&m.forward(&x, true)?, &y)?)
}

fn assert_close(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) {
    assert_eq!(a.len(), b.len());
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            let tol = 1e-5 * x.abs().max(y.abs()).max(1e-2);
            assert!((x - y).abs() <= tol, "{na}: {x} vs {y}");
        }
    }
}

/// One replica, batches of `len`, `steps` plain SGD steps.
fn single(init: &VarMap, len: usize, steps: usize, lr: f64) -> Result<VarMap> {
    let vm = replicate(init)?;
    let m = model(&vm)?;
    for s in 0..steps {
        let grads = loss(&m, s, len, None)?.backward()?;
        for (_, v) in sorted_vars(&vm) {
            if let Some(g) = grads.get(&v) {
                v.set(&(v.as_tensor() - (g * lr)?)?)?;
            }
        }
    }
    Ok(vm)
}

fn init() -> Result<VarMap> {
    let vm = VarMap::new();
    model(&vm)?;
    kolo_models::seeded_init(&vm, 7)?;
    Ok(vm)
}

fn joined<T>(results: Vec<std::result::Result<Result<T>, String>>) -> Result<Vec<T>> {
    results
        .into_iter()
        .map(|r| r.map_err(|what| TrainError::Unsupported { what })?)
        .collect()
}

#[test]
fn replicas_by_hand_equal_one_replica_with_the_whole_batch() -> Result<()> {
    let init = init()?;
    for replicas in [2usize, 3] {
        let b = 4;
        let want = values(&single(&init, replicas * b, 5, 0.1)?)?;
        let got = joined(kolo::run_local(replicas, kolo::Config::default(), |comm| {
            let own = replicate(&init)?;
            let m = model(&own)?;
            for s in 0..5 {
                let grads = loss(&m, s, replicas * b, Some((comm.rank(), replicas)))?.backward()?;
                let vars = sorted_vars(&own);
                let g = vars
                    .iter()
                    .map(|(_, v)| grads.get(v).cloned().map_or_else(|| v.zeros_like(), Ok))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                let g = all_reduce_mean(&comm, &g)?;
                for ((_, v), g) in vars.iter().zip(g) {
                    v.set(&(v.as_tensor() - (g * 0.1)?)?)?;
                }
            }
            values(&own)
        }))?;
        for g in &got {
            assert_close(g, &want);
        }
    }
    Ok(())
}

#[test]
fn replicas_with_ddp_equal_one_replica_with_the_whole_batch() -> Result<()> {
    let init = init()?;
    let (replicas, b, lr, momentum) = (2usize, 3, 0.05, 0.9);
    let sgd = SgdConfig {
        lr,
        momentum,
        ..SgdConfig::default()
    };
    // One replica with the whole batch, SGD with momentum.
    let vm = replicate(&init)?;
    let m = model(&vm)?;
    let mut opt = Sgd::new(sorted_vars(&vm), sgd)?;
    for s in 0..5 {
        opt.step(&loss(&m, s, replicas * b, None)?.backward()?)?;
    }
    let want = values(&vm)?;
    let got = joined(kolo::run_local(replicas, kolo::Config::default(), |comm| {
        let own = replicate(&init)?;
        let ddp = Ddp::new(&comm, &own, DdpOptions::default())?;
        let mut opt = Sgd::new(ddp.params().to_vec(), sgd)?;
        for s in 0..5 {
            let m = Mlp::new(
                ddp.var_builder(DType::F32, &Device::Cpu),
                SHAPE,
                CLASSES,
                HIDDEN,
            )?;
            let share = Some((comm.rank(), replicas));
            opt.step(&ddp.backward(&loss(&m, s, replicas * b, share)?)?)?;
        }
        values(&own)
    }))?;
    for g in &got {
        assert_close(g, &want);
    }
    Ok(())
}

#[test]
fn bad_splits_are_named() -> Result<()> {
    let (x, y) = batch(0, 3)?;
    let e = error_text(split_batch(&x, &y, 4));
    assert!(e.contains("3 samples") && e.contains("4 replicas"), "{e}");
    let e = error_text(split_batch(&x, &y, 0));
    assert!(e.contains("replicas"), "{e}");
    let shares: Vec<usize> = split_batch(&x, &y, 2)?
        .iter()
        .map(|(x, _)| x.dim(0))
        .collect::<candle_core::Result<_>>()?;
    assert_eq!(shares, vec![2, 1]);
    Ok(())
}

/// The gradient of every parameter of `vm` for `loss`, flattened, in name order.
fn gradients(vm: &VarMap, loss: &Tensor) -> Result<Vec<Vec<f32>>> {
    let grads = loss.backward()?;
    let mut out = Vec::new();
    for (name, v) in sorted_vars(vm) {
        let g = grads
            .get(v.as_tensor())
            .ok_or_else(|| TrainError::InvalidArgument {
                arg: "gradients",
                reason: format!("no gradient for {name}"),
            })?;
        out.push(g.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

#[test]
fn weighted_replica_losses_average_to_the_whole_batch_when_shares_differ() -> Result<()> {
    // A batch of 2k + 1 = 7 over 2 replicas: shares of 4 and 3.
    let (len, replicas) = (7, 2);
    let vm = init()?;
    let m = model(&vm)?;
    let whole = gradients(&vm, &loss(&m, 0, len, None)?)?;
    let mut mean: Option<Vec<Vec<f32>>> = None;
    for replica in 0..replicas {
        let place = kolo_ddp::replicas::Placement::new(replica, replicas, replicas)?;
        let weight = place.loss_weight(len)?;
        let g = gradients(
            &vm,
            &(loss(&m, 0, len, Some((replica, replicas)))? * weight)?,
        )?;
        let acc = mean.get_or_insert_with(|| g.iter().map(|v| vec![0.0; v.len()]).collect());
        for (a, v) in acc.iter_mut().zip(&g) {
            a.iter_mut()
                .zip(v)
                .for_each(|(a, x)| *a += x / replicas as f32);
        }
    }
    let mean = mean.unwrap_or_default();
    for (w, m) in whole.iter().zip(&mean) {
        for (a, b) in w.iter().zip(m) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
        }
    }
    // Unweighted, the shares of 4 and 3 would give another gradient: the test has teeth.
    assert!(kolo_ddp::replicas::Placement::new(0, 2, 2)?.loss_weight(len)? != 1.0);
    Ok(())
}
