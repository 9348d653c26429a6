use candle_core::{DType, Device, Result, Tensor, Var};

use super::linear;

/// `(y, dx, dw, db)` of `linear(x, w, b)` against the upstream gradient `r` (`f` the linear
/// product under test), for the variables that are tracked.
fn grads(
    f: impl Fn(&Tensor, &Tensor, Option<&Tensor>) -> Result<Tensor>,
    (x, w, b, r): (&Tensor, &Tensor, Option<&Tensor>, &Tensor),
) -> Result<Vec<Tensor>> {
    let (x, w) = (Var::from_tensor(x)?, Var::from_tensor(w)?);
    let b = b.map(Var::from_tensor).transpose()?;
    let y = f(&x, &w, b.as_ref().map(|v| v.as_tensor()))?;
    let g = (&y * r)?.sum_all()?.backward()?;
    let mut out = vec![y];
    for v in [Some(&x), Some(&w), b.as_ref()].into_iter().flatten() {
        let Some(gv) = g.get(v) else {
            candle_core::bail!("missing gradient");
        };
        out.push(gv.clone());
    }
    Ok(out)
}

/// candle's own `x @ wᵀ + b`.
fn reference(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = match x.rank() {
        1 => x.unsqueeze(0)?.matmul(&w.t()?)?.squeeze(0)?,
        _ => x.broadcast_matmul(&w.t()?)?,
    };
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

fn max_rel(a: &Tensor, e: &Tensor) -> Result<f64> {
    let scale = e
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    let d = (a - e)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    Ok(d / scale.max(1e-12))
}

#[test]
fn output_and_every_gradient_match_candles_matmul() -> Result<()> {
    let dev = Device::Cpu;
    // (input shape, out features, with bias, dtype, tolerance)
    let cases: [(&[usize], usize, bool, DType, f64); 6] = [
        (&[5, 7], 3, true, DType::F64, 1e-12),
        (&[5, 7], 3, false, DType::F64, 1e-12),
        (&[2, 3, 7], 4, true, DType::F64, 1e-12),
        (&[7], 2, true, DType::F64, 1e-12),
        (&[64, 96], 48, true, DType::F32, 1e-5),
        (&[33, 130], 70, false, DType::F32, 1e-5),
    ];
    for (shape, out, bias, dtype, tol) in cases {
        let inp = shape[shape.len() - 1];
        let x = Tensor::randn(0f64, 1., shape, &dev)?.to_dtype(dtype)?;
        let w = Tensor::randn(0f64, 1., (out, inp), &dev)?.to_dtype(dtype)?;
        let b = bias
            .then(|| Tensor::randn(0f64, 1., out, &dev)?.to_dtype(dtype))
            .transpose()?;
        let mut out_shape = shape.to_vec();
        *out_shape.last_mut().unwrap_or(&mut 0) = out;
        let r = Tensor::randn(0f64, 1., out_shape.as_slice(), &dev)?.to_dtype(dtype)?;
        let args = (&x, &w, b.as_ref(), &r);
        let got = grads(linear, args)?;
        let want = grads(reference, args)?;
        assert_eq!(got.len(), want.len());
        for (name, (a, e)) in ["y", "dx", "dw", "db"].iter().zip(got.iter().zip(&want)) {
            assert_eq!(a.dims(), e.dims(), "{shape:?} -> {out}: {name}");
            let d = max_rel(a, e)?;
            assert!(
                d < tol,
                "{shape:?} -> {out} ({dtype:?}): {name} off by {d:e}"
            );
        }
        // Without gradients: the same output, no graph.
        let y = linear(&x, &w, b.as_ref())?;
        assert!(!y.track_op());
        assert!(max_rel(&y, &want[0])? < tol);
    }
    Ok(())
}

#[test]
fn only_the_tracked_operands_get_gradients() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1., (4, 6), &dev)?;
    let w = Var::from_tensor(&Tensor::randn(0f32, 1., (3, 6), &dev)?)?;
    let b = Tensor::randn(0f32, 1., 3, &dev)?;
    let y = linear(&x, &w, Some(&b))?;
    let g = y.sum_all()?.backward()?;
    let Some(dw) = g.get(&w) else {
        candle_core::bail!("no weight gradient");
    };
    // d(sum(x wᵀ))/dw[o, i] = sum over rows of x[:, i].
    let want = x.sum_keepdim(0)?.broadcast_as((3, 6))?;
    assert!(max_rel(dw, &want)? < 1e-6);
    assert!(g.get(&x).is_none() && g.get(&b).is_none());
    Ok(())
}

#[test]
fn mismatched_shapes_are_named() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::zeros((4, 6), DType::F32, &dev)?;
    let w = Tensor::zeros((3, 5), DType::F32, &dev)?;
    let e = linear(&x, &w, None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("[4, 6]") && e.contains("[3, 5]") && e.contains("must be 5"),
        "{e}"
    );
    let w = Tensor::zeros((3, 6), DType::F32, &dev)?;
    let b = Tensor::zeros(4, DType::F32, &dev)?;
    let e = linear(&x, &w, Some(&b))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("bias [4]") && e.contains("expected [3]"), "{e}");
    let w3 = Tensor::zeros((3, 6, 1), DType::F32, &dev)?;
    assert!(linear(&x, &w3, None).is_err());
    Ok(())
}

#[test]
fn bf16_tensors_compute_in_f32_and_come_back_bf16() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1., (4, 6), &dev)?;
    let w = Tensor::randn(0f32, 1., (3, 6), &dev)?;
    let want = reference(&x, &w, None)?;
    let got = linear(&x.to_dtype(DType::BF16)?, &w.to_dtype(DType::BF16)?, None)?;
    assert_eq!(got.dtype(), DType::BF16);
    assert!(max_rel(&got.to_dtype(DType::F32)?, &want)? < 2e-2);
    Ok(())
}

#[test]
fn a_strided_input_reads_as_its_values() -> Result<()> {
    let dev = Device::Cpu;
    // A transposed view: [6, 4] read as [4, 6], not contiguous.
    let x = Tensor::randn(0f32, 1., (6, 4), &dev)?.t()?;
    assert!(!x.is_contiguous());
    let w = Tensor::randn(0f32, 1., (3, 6), &dev)?;
    let b = Tensor::randn(0f32, 1., 3, &dev)?;
    let r = Tensor::randn(0f32, 1., (4, 3), &dev)?;
    let got = grads(linear, (&x, &w, Some(&b), &r))?;
    let want = grads(reference, (&x, &w, Some(&b), &r))?;
    for (a, e) in got.iter().zip(&want) {
        assert!(max_rel(a, e)? < 1e-5);
    }
    Ok(())
}
