//! Single-process data parallel with threads as replicas: R replicas with batch b each, gradients
//! averaged, equal one replica with batch R·b, step by step (plain SGD, and Ddp + SGD momentum as
//! `kolo train --replicas` runs it).

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
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
    sorted_vars(vm)
        .into_iter()
        .map(|(n, v)| Ok((n, v.as_tensor().flatten_all()?.to_vec1::<f32>()?)))
        .collect()
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
        let (x, y) = batch(s, len)?;
        let loss = candle_nn::loss::cross_entropy(&m.forward(&x, true)?, &y)?;
        let grads = loss.backward()?;
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
                let (x, y) = batch(s, replicas * b)?;
                let shards = split_batch(&x, &y, replicas)?;
                let (x, y) = &shards[comm.rank()];
                let loss = candle_nn::loss::cross_entropy(&m.forward(x, true)?, y)?;
                let grads = loss.backward()?;
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
        let (x, y) = batch(s, replicas * b)?;
        let loss = candle_nn::loss::cross_entropy(&m.forward(&x, true)?, &y)?;
        let grads = loss.backward()?;
        opt.step(&grads)?;
    }
    let want = values(&vm)?;
    let got = joined(kolo::run_local(replicas, kolo::Config::default(), |comm| {
        let own = replicate(&init)?;
        let ddp = Ddp::new(&comm, &own, DdpOptions::default())?;
        let mut opt = Sgd::new(ddp.params().to_vec(), sgd)?;
        for s in 0..5 {
            let (x, y) = batch(s, replicas * b)?;
            let shards = split_batch(&x, &y, replicas)?;
            let (x, y) = &shards[comm.rank()];
            let m = Mlp::new(
                ddp.var_builder(DType::F32, &Device::Cpu),
                SHAPE,
                CLASSES,
                HIDDEN,
            )?;
            let loss = candle_nn::loss::cross_entropy(&m.forward(x, true)?, y)?;
            let grads = ddp.backward(&loss)?;
            opt.step(&grads)?;
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
    let e = split_batch(&x, &y, 4)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("3 samples") && e.contains("4 replicas"), "{e}");
    let e = split_batch(&x, &y, 0)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("replicas"), "{e}");
    let shares: Vec<usize> = split_batch(&x, &y, 2)?
        .iter()
        .map(|(x, _)| x.dim(0))
        .collect::<candle_core::Result<_>>()?;
    assert_eq!(shares, vec![2, 1]);
    Ok(())
}
