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

/// bf16 activations (mixed precision) go through the layer as autocast takes them: normalized in
/// f32 and handed back in bf16 — exactly the f32 layer's output on the same values, rounded to
/// bf16 — with the same running statistics, and gradients reaching the bf16 input and the bf16 γ
/// and β (the casts of f32 master weights) through the casts; evaluation mode too.
#[test]
fn bf16_activations_are_normalized_in_f32_as_autocast_does() -> Result<()> {
    use candle_core::ModuleT;
    let (shape, c) = (&[4, 3, 5, 7][..], 3);
    let x = var(shape, DType::BF16)?;
    let r = Tensor::randn(0f32, 1., shape, &Device::Cpu)?.to_dtype(DType::BF16)?;
    // γ and β as bf16 copies of f32 masters, the running statistics f32: as
    // `Ddp::var_builder_in(BF16)` hands them out.
    let (w, b) = (var(&[c], DType::F32)?, var(&[c], DType::F32)?);
    let (w16, b16) = (w.to_dtype(DType::BF16)?, b.to_dtype(DType::BF16)?);
    let layer = batch_norm::BatchNorm::new(c, Given::builder(&w16, &b16))?;
    let (w32, b32) = (w16.to_dtype(DType::F32)?, b16.to_dtype(DType::F32)?);
    let reference = batch_norm::BatchNorm::new(c, Given::builder(&w32, &b32))?;
    for (residual, relu) in [(false, false), (true, true)] {
        let res = residual.then_some(&r);
        let got = layer.forward_fused(&x, res, relu, true)?;
        assert_eq!(got.dtype(), DType::BF16);
        let res32 = res.map(|r| r.to_dtype(DType::F32)).transpose()?;
        let want = reference.forward_fused(&x.to_dtype(DType::F32)?, res32.as_ref(), relu, true)?;
        let want = want.to_dtype(DType::BF16)?.to_dtype(DType::F32)?;
        assert_eq!(
            rel_diff(&got.to_dtype(DType::F32)?, &want)?,
            0.0,
            "residual {residual} relu {relu}: the f32 layer's output, rounded once"
        );
        for (a, e) in [
            (layer.running_mean(), reference.running_mean()),
            (layer.running_var(), reference.running_var()),
        ] {
            assert_eq!(a.dtype(), DType::F32);
            assert_eq!(rel_diff(a, e)?, 0.0, "running statistics");
        }
        let g = Tensor::randn(0f32, 1., shape, &Device::Cpu)?;
        let grads = (got.to_dtype(DType::F32)? * &g)?.sum_all()?.backward()?;
        let dtype_of = |t: &Tensor| grads.get(t).map(|g| g.dtype());
        assert_eq!(dtype_of(&x), Some(DType::BF16), "the bf16 input's gradient");
        assert_eq!(dtype_of(&w), Some(DType::F32), "γ's f32 master's gradient");
        assert_eq!(dtype_of(&b), Some(DType::F32), "β's f32 master's gradient");
    }
    let eval = layer.forward_t(&x, false)?;
    let want = reference.forward_t(&x.to_dtype(DType::F32)?, false)?;
    assert_eq!(eval.dtype(), DType::BF16);
    assert!(
        rel_diff(&eval.to_dtype(DType::F32)?, &want)? < 1e-2,
        "evaluation"
    );
    Ok(())
}

/// A builder that hands out the given γ and β as they are (any dtype) and f32 running statistics.
struct Given {
    weight: Tensor,
    bias: Tensor,
}

impl Given {
    fn builder(weight: &Tensor, bias: &Tensor) -> candle_nn::VarBuilder<'static> {
        let given = Given {
            weight: weight.clone(),
            bias: bias.clone(),
        };
        candle_nn::VarBuilder::from_backend(Box::new(given), DType::F32, Device::Cpu)
    }
}

impl candle_nn::var_builder::SimpleBackend for Given {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        h: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor> {
        match name {
            "weight" => Ok(self.weight.clone()),
            "bias" => Ok(self.bias.clone()),
            _ => h.var(s, dtype, dev).map(|v| v.as_tensor().clone()),
        }
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        candle_core::bail!("no tensor {name}")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        matches!(name, "weight" | "bias")
    }
}
