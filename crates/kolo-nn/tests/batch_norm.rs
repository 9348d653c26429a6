//! Training-mode batch normalization (`kolo_nn::ops::batch_norm_train`, through the
//! `BatchNorm` layer) against candle's reference ops, forward and gradients; and the same op fed
//! statistics from outside (`batch_norm_train_with_stats`, SyncBatchNorm's path) against it.

use candle_core::{DType, Device, Result, Tensor};
use kolo_nn::{batch_norm, ops};

mod common;
use common::{rel_diff, var};

/// Training-mode batch norm + residual + ReLU from candle ops, in f64.
fn batch_norm_reference(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    residual: Option<&Tensor>,
    relu: bool,
) -> Result<Tensor> {
    let c = x.dim(1)?;
    let mut shape = vec![1; x.rank()];
    shape[1] = c;
    let dims: Vec<usize> = (0..x.rank()).filter(|&d| d != 1).collect();
    let mut mean = x.clone();
    for &d in dims.iter().rev() {
        mean = mean.mean_keepdim(d)?;
    }
    let centered = x.broadcast_sub(&mean)?;
    let mut var = centered.sqr()?;
    for &d in dims.iter().rev() {
        var = var.mean_keepdim(d)?;
    }
    let y = centered
        .broadcast_div(&(var + 1e-5)?.sqrt()?)?
        .broadcast_mul(&w.reshape(shape.as_slice())?)?
        .broadcast_add(&b.reshape(shape.as_slice())?)?;
    let y = match residual {
        Some(r) => (y + r)?,
        None => y,
    };
    if relu {
        y.relu()
    } else {
        Ok(y)
    }
}

#[test]
fn fused_batch_norm_matches_candle_ops_forward_and_backward() -> Result<()> {
    use candle_nn::{VarBuilder, VarMap};
    // Shapes with odd sizes, 2-D inputs and a batch of one (several values per channel).
    let shapes: [&[usize]; 5] = [
        &[4, 3, 5, 7],
        &[2, 5, 3, 3],
        &[1, 2, 9, 1],
        &[6, 4],
        &[3, 1, 2, 3],
    ];
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-9 } else { 1e-4 };
        for shape in shapes {
            for (residual, relu) in [(false, false), (false, true), (true, false), (true, true)] {
                let case = format!("{dtype:?} {shape:?} residual {residual} relu {relu}");
                let c = shape[1];
                let varmap = VarMap::new();
                let bn = batch_norm::BatchNorm::new(
                    c,
                    VarBuilder::from_varmap(&varmap, dtype, &Device::Cpu),
                )?;
                // Non-trivial affine parameters.
                let (w, b) = (var(&[c], dtype)?, var(&[c], dtype)?);
                for (name, v) in varmap
                    .data()
                    .lock()
                    .map_err(|_| candle_core::Error::Msg("lock".into()))?
                    .iter()
                {
                    if name == "weight" {
                        v.set(w.as_tensor())?;
                    } else if name == "bias" {
                        v.set(b.as_tensor())?;
                    }
                }
                let x = var(shape, dtype)?;
                let r = var(shape, dtype)?;
                let ours = bn.forward_fused(&x, residual.then_some(r.as_tensor()), relu, true)?;
                let f64_of = |t: &Tensor| t.to_dtype(DType::F64);
                let want = batch_norm_reference(
                    &f64_of(&x)?,
                    &f64_of(&w)?,
                    &f64_of(&b)?,
                    residual.then_some(&f64_of(&r)?),
                    relu,
                )?;
                assert!(rel_diff(&f64_of(&ours)?, &want)? < tol, "{case}: forward");
                // Gradients of <y, g> for x, weight, bias (the layer's, via its VarMap) and the
                // residual against the reference's (on the f64 copies, as variables).
                let g = Tensor::randn(0f64, 1., shape, &Device::Cpu)?;
                let grads = (f64_of(&ours)? * &g)?.sum_all()?.backward()?;
                let (xr, wr, br, rr) = (
                    candle_core::Var::from_tensor(&f64_of(&x)?)?,
                    candle_core::Var::from_tensor(&f64_of(&w)?)?,
                    candle_core::Var::from_tensor(&f64_of(&b)?)?,
                    candle_core::Var::from_tensor(&f64_of(&r)?)?,
                );
                let want =
                    batch_norm_reference(&xr, &wr, &br, residual.then_some(rr.as_tensor()), relu)?;
                let want_grads = (want * &g)?.sum_all()?.backward()?;
                let layer_var = |name: &str| -> Result<candle_core::Var> {
                    varmap
                        .data()
                        .lock()
                        .map_err(|_| candle_core::Error::Msg("lock".into()))?
                        .get(name)
                        .cloned()
                        .ok_or_else(|| candle_core::Error::Msg(format!("no {name}")))
                };
                let mut pairs = vec![
                    ("x", grads.get(&x).cloned(), want_grads.get(&xr).cloned()),
                    (
                        "weight",
                        grads.get(layer_var("weight")?.as_tensor()).cloned(),
                        want_grads.get(&wr).cloned(),
                    ),
                    (
                        "bias",
                        grads.get(layer_var("bias")?.as_tensor()).cloned(),
                        want_grads.get(&br).cloned(),
                    ),
                ];
                if residual {
                    pairs.push((
                        "residual",
                        grads.get(&r).cloned(),
                        want_grads.get(&rr).cloned(),
                    ));
                }
                for (name, a, e) in pairs {
                    let (Some(a), Some(e)) = (a, e) else {
                        panic!("{case}: missing {name} gradient");
                    };
                    assert!(rel_diff(&f64_of(&a)?, &e)? < tol, "{case}: {name} gradient");
                }
            }
        }
    }
    Ok(())
}

/// `batch_norm_train_with_stats` fed this batch's own statistics (`batch_norm_stats`, in the
/// graph) gives `batch_norm_train`'s output and gradients: its direct input gradient plus the
/// one through the statistics is the fused op's.
#[test]
fn given_statistics_give_the_fused_ops_output_and_gradients() -> Result<()> {
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-9 } else { 1e-4 };
        for shape in [&[4, 3, 5, 7][..], &[6, 4], &[1, 2, 9, 1]] {
            for (residual, relu) in [(false, false), (true, true)] {
                let case = format!("{dtype:?} {shape:?} residual {residual} relu {relu}");
                let c = shape[1];
                let (x, r) = (var(shape, dtype)?, var(shape, dtype)?);
                let (w, b) = (var(&[c], dtype)?, var(&[c], dtype)?);
                let res = residual.then_some(r.as_tensor());
                let Some((local, local_stats)) =
                    ops::batch_norm_train(&x, &w, &b, res, relu, 1e-5)?
                else {
                    panic!("{case}: the fused op applies on CPU");
                };
                let stats = ops::batch_norm_stats(&x)?;
                let Some((given, given_stats)) =
                    ops::batch_norm_train_with_stats(&x, &w, &b, res, relu, 1e-5, &stats)?
                else {
                    panic!("{case}: the fused op applies on CPU");
                };
                assert_eq!(local_stats.count, given_stats.count, "{case}");
                assert!(rel_diff(&given, &local)? < tol, "{case}: forward");
                let g = Tensor::randn(0f64, 1., shape, &Device::Cpu)?.to_dtype(dtype)?;
                let want = (local * &g)?.sum_all()?.backward()?;
                let got = (given * &g)?.sum_all()?.backward()?;
                let mut vars = vec![("x", &x), ("weight", &w), ("bias", &b)];
                if residual {
                    vars.push(("residual", &r));
                }
                for (name, v) in vars {
                    let (Some(a), Some(e)) = (got.get(v), want.get(v)) else {
                        panic!("{case}: missing {name} gradient");
                    };
                    assert!(rel_diff(a, e)? < tol, "{case}: {name} gradient");
                }
            }
        }
    }
    Ok(())
}
