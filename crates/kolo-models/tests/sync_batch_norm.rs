//! The SyncBatchNorm invariant: N thread-ranks with local batches b_r give the outputs, input
//! gradients, summed weight/bias gradients and running statistics of ONE process running
//! candle-nn's plain BatchNorm on the concatenated batch — for N = 1, 2, 3, uneven batches and
//! empty local batches. Plus model conversion and ResNet-18 under DDP.

use std::time::Duration;

use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{ModuleT, VarBuilder, VarMap};
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_models::{self as models, convert_sync_batchnorm, Model, ModelKind};
use kolo_nn::batch_norm::BatchNorm;
use kolo_nn::vars::{self, sorted_vars};

const C: usize = 3;

/// Deterministic pseudo-random values in about [-1, 1] (a different stream per `seed`).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64, scale: f32, offset: f32) -> Result<Tensor> {
    let n = shape.iter().product();
    let v: Vec<f32> = values(n, seed).iter().map(|x| x * scale + offset).collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// Sets the layer's variables in `varmap` (created under `bn`) to fixed, non-default values.
fn init_bn(varmap: &VarMap) -> Result<()> {
    for (name, var) in sorted_vars(varmap) {
        let (seed, scale, offset) = match name.as_str() {
            "bn.weight" => (11, 0.5, 1.0),
            "bn.bias" => (12, 0.5, 0.0),
            "bn.running_mean" => (13, 0.2, 0.0),
            "bn.running_var" => (14, 0.2, 1.0),
            other => panic!("unexpected variable {other}"),
        };
        var.set(&tensor(var.dims(), seed, scale, offset)?)?;
    }
    Ok(())
}

fn var(varmap: &VarMap, name: &str) -> Var {
    sorted_vars(varmap)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no variable {name}"))
}

/// What one forward/backward pass through a BatchNorm produced.
#[derive(Debug)]
struct Outcome {
    y: Tensor,
    dx: Tensor,
    dweight: Tensor,
    dbias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
}

/// Forward in training mode, loss `Σ y·g`, backward.
fn run(layer: &dyn ModuleT, varmap: &VarMap, x: &Tensor, g: &Tensor) -> Result<Outcome> {
    let x = Var::from_tensor(x)?;
    let y = layer.forward_t(x.as_tensor(), true)?;
    let grads = (&y * g)?.sum_all()?.backward()?;
    let grad = |t: &Tensor| -> Result<Tensor> {
        Ok(match grads.get(t) {
            Some(g) => g.clone(),
            None => t.zeros_like()?,
        })
    };
    Ok(Outcome {
        dx: grad(x.as_tensor())?,
        dweight: grad(var(varmap, "bn.weight").as_tensor())?,
        dbias: grad(var(varmap, "bn.bias").as_tensor())?,
        running_mean: var(varmap, "bn.running_mean").as_tensor().copy()?,
        running_var: var(varmap, "bn.running_var").as_tensor().copy()?,
        y,
    })
}

/// Global input and loss weights for per-rank batch sizes `sizes` and per-sample shape `rest`.
fn global(sizes: &[usize], rest: &[usize]) -> Result<(Tensor, Tensor)> {
    let mut shape = vec![sizes.iter().sum::<usize>(), C];
    shape.extend_from_slice(rest);
    Ok((tensor(&shape, 1, 2.0, 0.7)?, tensor(&shape, 2, 1.0, 0.0)?))
}

/// One process, candle-nn's BatchNorm, the whole batch.
fn reference(sizes: &[usize], rest: &[usize]) -> Result<Outcome> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let bn = candle_nn::batch_norm(C, candle_nn::BatchNormConfig::default(), vb.pp("bn"))?;
    init_bn(&varmap)?;
    let (x, g) = global(sizes, rest)?;
    run(&bn, &varmap, &x, &g)
}

/// Rank `comm.rank()` of `sizes.len()` with a synchronized kolo BatchNorm on its slice.
fn rank(comm: &kolo::Communicator, sizes: &[usize], rest: &[usize]) -> Result<Outcome> {
    rank_with(comm, sizes, rest, false)
}

/// [`rank`], the layer made by kolo (`converted` false) or converted from candle-nn's.
fn rank_with(
    comm: &kolo::Communicator,
    sizes: &[usize],
    rest: &[usize],
    converted: bool,
) -> Result<Outcome> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let mut bn = match converted {
        false => BatchNorm::new(C, vb.pp("bn"))?,
        true => {
            let cfg = candle_nn::BatchNormConfig::default();
            BatchNorm::from_candle(&candle_nn::batch_norm(C, cfg, vb.pp("bn"))?)?
        }
    };
    bn.synchronize(comm);
    init_bn(&varmap)?;
    let (x, g) = global(sizes, rest)?;
    let start = sizes[..comm.rank()].iter().sum();
    let b = sizes[comm.rank()];
    run(
        &bn,
        &varmap,
        &x.narrow(0, start, b)?,
        &g.narrow(0, start, b)?,
    )
}

fn config() -> Config {
    Config::default().with_timeout(Duration::from_secs(30))
}

fn distributed(sizes: &[usize], rest: &[usize]) -> Vec<Outcome> {
    distributed_with(sizes, rest, false)
}

fn distributed_with(sizes: &[usize], rest: &[usize], converted: bool) -> Vec<Outcome> {
    kolo::run_local(sizes.len(), config(), |comm| {
        rank_with(&comm, sizes, rest, converted)
    })
    .into_iter()
    .enumerate()
    .map(|(r, res)| match res {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => panic!("rank {r}: {e}"),
        Err(p) => panic!("rank {r} panicked: {p}"),
    })
    .collect()
}

/// ‖a − b‖ / ‖b‖ (or ‖a − b‖ when b is zero).
fn rel(a: &Tensor, b: &Tensor) -> Result<f64> {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let a = a.to_dtype(DType::F64)?.flatten_all()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?;
    let diff = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt();
    let norm = b.sqr()?.sum_all()?.to_scalar::<f64>()?.sqrt();
    Ok(diff / norm.max(1e-12))
}

fn check(sizes: &[usize], rest: &[usize]) -> Result<()> {
    check_with(sizes, rest, false)
}

fn check_with(sizes: &[usize], rest: &[usize], converted: bool) -> Result<()> {
    let want = reference(sizes, rest)?;
    let got = distributed_with(sizes, rest, converted);
    let ys: Vec<&Tensor> = got.iter().map(|o| &o.y).collect();
    let dxs: Vec<&Tensor> = got.iter().map(|o| &o.dx).collect();
    let dw = got
        .iter()
        .try_fold(Tensor::zeros(C, DType::F32, &Device::Cpu)?, |acc, o| {
            acc + &o.dweight
        })?;
    let db = got
        .iter()
        .try_fold(Tensor::zeros(C, DType::F32, &Device::Cpu)?, |acc, o| {
            acc + &o.dbias
        })?;
    let mut diffs = vec![
        ("y", rel(&Tensor::cat(&ys, 0)?, &want.y)?),
        ("dx", rel(&Tensor::cat(&dxs, 0)?, &want.dx)?),
        ("dweight", rel(&dw, &want.dweight)?),
        ("dbias", rel(&db, &want.dbias)?),
    ];
    for (r, o) in got.iter().enumerate() {
        let rm = rel(&o.running_mean, &want.running_mean)?;
        let rv = rel(&o.running_var, &want.running_var)?;
        diffs.push((
            if r == 0 {
                "running_mean"
            } else {
                "running_mean (rank > 0)"
            },
            rm,
        ));
        diffs.push((
            if r == 0 {
                "running_var"
            } else {
                "running_var (rank > 0)"
            },
            rv,
        ));
        assert_eq!(o.y.dims()[0], sizes[r], "rank {r}'s output batch");
    }
    for (what, d) in diffs {
        assert!(
            d <= 1e-5,
            "sizes {sizes:?}, per-sample {rest:?}: {what} differs by {d:e} (relative)"
        );
    }
    // The comparison has teeth: the gradients are not trivially zero.
    assert!(want.dx.abs()?.max_all()?.to_scalar::<f32>()? > 1e-3);
    assert!(want.dweight.abs()?.max_all()?.to_scalar::<f32>()? > 1e-3);
    Ok(())
}

#[test]
fn n_ranks_equal_one_process_with_the_concatenated_batch() -> Result<()> {
    for sizes in [&[4][..], &[4, 4], &[3, 3, 3]] {
        check(sizes, &[4, 5])?;
    }
    Ok(())
}

#[test]
fn candle_nn_batch_norm_converted_synchronizes_the_same() -> Result<()> {
    // candle-nn's layer, converted (its VarMap variables shared), then synchronized.
    for sizes in [&[4, 4][..], &[2, 5, 3]] {
        check_with(sizes, &[4, 5], true)?;
    }
    Ok(())
}

#[test]
fn uneven_local_batches() -> Result<()> {
    check(&[2, 3, 5], &[4, 4])?;
    check(&[1, 6], &[3, 2])?;
    Ok(())
}

#[test]
fn a_rank_with_an_empty_batch_contributes_nothing() -> Result<()> {
    check(&[0, 3, 2], &[4, 4])?;
    check(&[3, 0], &[2, 2])?;
    check(&[2, 0, 0], &[2, 2])?;
    Ok(())
}

#[test]
fn two_dimensional_inputs() -> Result<()> {
    check(&[5], &[])?;
    check(&[2, 3, 5], &[])?;
    check(&[4, 0, 3], &[])?;
    Ok(())
}

#[test]
fn local_layer_equals_candle_nn_batch_norm() -> Result<()> {
    let sizes = [6];
    let want = reference(&sizes, &[3, 3])?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let bn = BatchNorm::new(C, vb.pp("bn"))?;
    assert!(bn.communicator().is_none());
    init_bn(&varmap)?;
    let (x, g) = global(&sizes, &[3, 3])?;
    let got = run(&bn, &varmap, &x, &g)?;
    for (what, a, b) in [
        ("y", &got.y, &want.y),
        ("dx", &got.dx, &want.dx),
        ("dweight", &got.dweight, &want.dweight),
        ("dbias", &got.dbias, &want.dbias),
        ("running_mean", &got.running_mean, &want.running_mean),
        ("running_var", &got.running_var, &want.running_var),
    ] {
        let d = rel(a, b)?;
        assert!(d <= 1e-5, "{what} differs by {d:e}");
    }
    // Eval mode uses the running statistics, as candle-nn's.
    let cvm = VarMap::new();
    let cbn = candle_nn::batch_norm(
        C,
        candle_nn::BatchNormConfig::default(),
        VarBuilder::from_varmap(&cvm, DType::F32, &Device::Cpu).pp("bn"),
    )?;
    init_bn(&cvm)?;
    let varmap2 = VarMap::new();
    let bn2 = BatchNorm::new(
        C,
        VarBuilder::from_varmap(&varmap2, DType::F32, &Device::Cpu).pp("bn"),
    )?;
    init_bn(&varmap2)?;
    let d = rel(&bn2.forward_t(&x, false)?, &cbn.forward_t(&x, false)?)?;
    assert!(d <= 1e-6, "eval output differs by {d:e}");
    Ok(())
}

#[test]
fn all_ranks_empty_gives_empty_outputs_and_keeps_the_running_statistics() -> Result<()> {
    let got = distributed(&[0, 0], &[2, 2]);
    for o in &got {
        assert_eq!(o.y.dims(), &[0, C, 2, 2]);
        assert_eq!(
            o.running_mean.to_vec1::<f32>()?,
            tensor(&[C], 13, 0.2, 0.0)?.to_vec1::<f32>()?
        );
        assert_eq!(
            o.running_var.to_vec1::<f32>()?,
            tensor(&[C], 14, 0.2, 1.0)?.to_vec1::<f32>()?
        );
        assert_eq!(o.dweight.to_vec1::<f32>()?, vec![0.0; C]);
    }
    Ok(())
}

#[test]
fn one_value_per_channel_is_an_error_on_every_rank() {
    let res = kolo::run_local(2, config(), |comm| rank(&comm, &[1, 0], &[]).map(|_| ()));
    for (r, res) in res.into_iter().enumerate() {
        let e = match res {
            Ok(Err(e)) => e.to_string(),
            other => panic!("rank {r}: expected an error, got {other:?}"),
        };
        assert!(e.contains("more than 1 value per channel"), "rank {r}: {e}");
    }
}

#[test]
fn a_failed_all_reduce_is_an_error_not_a_panic() {
    let res = kolo::run_local(2, config(), |comm| -> std::result::Result<(), String> {
        if comm.rank() == 1 {
            comm.abort("rank 1 gives up");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
        match rank(&comm, &[2, 2], &[2, 2]) {
            Ok(_) => Err("rank 0's forward succeeded".into()),
            Err(e) => {
                let e = e.to_string();
                if e.contains("all_reduce_sum") {
                    Ok(())
                } else {
                    Err(format!("unexpected error: {e}"))
                }
            }
        }
    });
    for (r, res) in res.into_iter().enumerate() {
        assert_eq!(res, Ok(Ok(())), "rank {r}");
    }
}

fn new_model(kind: ModelKind, vb: VarBuilder) -> Result<Box<dyn Model>> {
    models::build(kind, vb, [1, 12, 12], 4)
}

#[test]
fn convert_sync_batchnorm_counts_the_batch_norm_layers() -> Result<()> {
    let res = kolo::run_local(1, config(), |comm| -> Result<Vec<(ModelKind, usize)>> {
        let mut counts = Vec::new();
        for kind in ModelKind::ALL {
            let varmap = VarMap::new();
            let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let mut model = new_model(kind, vb)?;
            counts.push((kind, convert_sync_batchnorm(model.as_mut(), &comm)));
            let mut synchronized = 0;
            model.visit_batch_norms(&mut |bn| {
                if bn.communicator().is_some() {
                    synchronized += 1;
                }
            });
            assert_eq!(synchronized, counts[counts.len() - 1].1, "{kind}");
        }
        Ok(counts)
    });
    let counts = match res.into_iter().next() {
        Some(Ok(Ok(c))) => c,
        other => panic!("{other:?}"),
    };
    for (kind, n) in counts {
        let want = match kind {
            // The stem's BN and two per residual block, 8 blocks; the shortcuts have none.
            ModelKind::Resnet18 => 17,
            ModelKind::Lenet | ModelKind::SimpleCnn | ModelKind::Mlp => 0,
        };
        assert_eq!(n, want, "{kind}");
        assert_eq!(kind.has_batch_norm(), want > 0, "{kind}");
    }
    Ok(())
}

const DIGITS: [usize; 3] = [1, 8, 8];
const CLASSES: usize = 4;
const GLOBAL_BATCH: usize = 8;

/// Sets every trainable parameter of `varmap` to deterministic values (buffers keep 0 and 1).
fn init_params(varmap: &VarMap) -> Result<()> {
    for (k, (_, v)) in vars::named_parameters(varmap).into_iter().enumerate() {
        v.set(&tensor(v.dims(), 100 + k as u64, 0.1, 0.0)?)?;
    }
    Ok(())
}

/// Every parameter's gradient and every buffer, by name.
type Named = Vec<(String, Tensor)>;

fn resnet_batch() -> Result<(Tensor, Tensor)> {
    let x = tensor(
        &[GLOBAL_BATCH, DIGITS[0], DIGITS[1], DIGITS[2]],
        7,
        1.0,
        0.2,
    )?;
    let y: Vec<u32> = (0..GLOBAL_BATCH as u32)
        .map(|i| (i * 3 + 1) % CLASSES as u32)
        .collect();
    Ok((x, Tensor::new(y, &Device::Cpu)?))
}

fn buffers(varmap: &VarMap) -> Result<Named> {
    vars::named_buffers(varmap)
        .into_iter()
        .map(|(n, v)| Ok((n, v.as_tensor().copy()?)))
        .collect()
}

/// One process, plain BatchNorm, the whole batch: gradients of the mean cross-entropy.
fn resnet_reference() -> Result<(Named, Named)> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = models::build(ModelKind::Resnet18, vb, DIGITS, CLASSES)?;
    init_params(&varmap)?;
    let (x, y) = resnet_batch()?;
    let loss = candle_nn::loss::cross_entropy(&model.forward(&x, true)?, &y)?;
    let grads = loss.backward()?;
    let mut named = Vec::new();
    for (name, var) in vars::named_parameters(&varmap) {
        let g = grads.get(var.as_tensor()).cloned();
        named.push((name, g.unwrap_or(var.as_tensor().zeros_like()?)));
    }
    Ok((named, buffers(&varmap)?))
}

/// Rank `comm.rank()` of 2 under DDP with its half of the batch, BatchNorm synchronized or not.
fn resnet_rank(comm: &kolo::Communicator, sync: bool) -> kolo_ddp::Result<(Named, Named)> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    models::build(ModelKind::Resnet18, vb, DIGITS, CLASSES)?;
    init_params(&varmap)?;
    let ddp = Ddp::new(comm, &varmap, DdpOptions::default())?;
    let vb = ddp.var_builder(DType::F32, &Device::Cpu);
    let mut model = models::build(ModelKind::Resnet18, vb, DIGITS, CLASSES)?;
    if sync {
        assert_eq!(convert_sync_batchnorm(model.as_mut(), comm), 17);
    }
    let b = GLOBAL_BATCH / comm.size();
    let (x, y) = resnet_batch()?;
    let x = x.narrow(0, comm.rank() * b, b)?;
    let y = y.narrow(0, comm.rank() * b, b)?;
    let loss = candle_nn::loss::cross_entropy(&model.forward(&x, true)?, &y)?;
    let grads = ddp.backward(&loss)?;
    let mut named = Vec::new();
    for (name, var) in ddp.params() {
        let g = grads.get(var.as_tensor()).cloned();
        named.push((name.clone(), g.unwrap_or(var.as_tensor().zeros_like()?)));
    }
    Ok((named, buffers(&varmap)?))
}

/// Whether `name` is the bias of a convolution followed by BatchNorm: its gradient is zero up
/// to rounding (BatchNorm removes any per-channel constant), so only its smallness is checked.
fn bias_before_batch_norm(name: &str) -> bool {
    name == "conv1.bias" || name.ends_with(".conv1.bias") || name.ends_with(".conv2.bias")
}

/// The largest relative difference over all named tensors (and the tensor's name); for the
/// biases of [`bias_before_batch_norm`], their norm relative to the largest tensor's.
fn max_rel(got: &Named, want: &Named) -> Result<(f64, String)> {
    assert_eq!(got.len(), want.len());
    let norm = |t: &Tensor| -> Result<f64> {
        Ok(t.to_dtype(DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?
            .sqrt())
    };
    let mut largest = 0f64;
    for (_, b) in want {
        largest = largest.max(norm(b)?);
    }
    let mut worst = (0.0, String::new());
    for ((n, a), (m, b)) in got.iter().zip(want) {
        assert_eq!(n, m);
        let d = if bias_before_batch_norm(n) {
            norm(a)?.max(norm(b)?) / largest
        } else {
            rel(a, b)?
        };
        if d > worst.0 {
            worst = (d, n.clone());
        }
    }
    Ok(worst)
}

#[test]
fn resnet18_with_sync_bn_under_ddp_equals_one_process() -> Result<()> {
    let (want_grads, want_buffers) = resnet_reference()?;
    for sync in [true, false] {
        let res = kolo::run_local(2, config(), |comm| resnet_rank(&comm, sync));
        for (r, res) in res.into_iter().enumerate() {
            let (grads, bufs) = match res {
                Ok(Ok(v)) => v,
                other => panic!("rank {r}: {other:?}"),
            };
            let (dg, gname) = max_rel(&grads, &want_grads)?;
            let (db, bname) = max_rel(&bufs, &want_buffers)?;
            eprintln!(
                "sync {sync}, rank {r}: gradients {dg:e} ({gname}), buffers {db:e} ({bname})"
            );
            if sync {
                assert!(
                    dg <= 1e-5,
                    "rank {r}: gradient of {gname} differs by {dg:e}"
                );
                assert!(db <= 1e-5, "rank {r}: buffer {bname} differs by {db:e}");
            } else {
                // Local statistics differ: the comparison above is not vacuous.
                assert!(dg > 1e-2, "rank {r}: plain BN gradients too close ({dg:e})");
                assert!(db > 1e-2, "rank {r}: plain BN buffers too close ({db:e})");
            }
        }
    }
    Ok(())
}
