//! The CPU kernels behind the layers (`kolo_nn::ops`: `conv2d`, `max_pool2x2`, `avg_pool2x2`,
//! …) against candle's reference ops: forward and gradients, odd sizes,
//! strides, padding, strided inputs; pooling with PyTorch's floor semantics.

use candle_core::{DType, Device, Result, Tensor};
use kolo_nn::ops;

mod common;
use common::{max_abs_diff, rel_diff, var};

#[test]
fn gemm_conv2d_matches_candle_conv2d_forward_and_backward() -> Result<()> {
    // (batch, c_in, h, w, c_out, k, stride, padding)
    let cases = [
        (2, 3, 7, 6, 4, 3, 1, 1),
        (2, 3, 9, 8, 5, 3, 2, 1),
        (2, 3, 9, 9, 5, 3, 2, 1),
        (2, 3, 8, 8, 5, 3, 2, 1),
        (3, 1, 12, 12, 6, 5, 1, 2),
        (2, 6, 14, 14, 16, 5, 1, 0),
        (2, 4, 7, 7, 8, 1, 2, 0),
        (1, 2, 5, 5, 3, 1, 1, 0),
        (1, 2, 4, 5, 3, 3, 1, 2),
        (2, 2, 6, 7, 3, 3, 3, 1),
        (2, 2, 8, 8, 3, 2, 2, 0),
        // Wide rows: the patch rows' copies of 33-64 and of more than 64 elements.
        (2, 2, 4, 40, 3, 5, 1, 2),
        (1, 2, 5, 70, 3, 3, 1, 1),
    ];
    for dtype in [DType::F64, DType::F32] {
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
        for &(b, c, h, w, c_out, k, stride, padding) in &cases {
            let case = format!("{dtype:?} {:?}", (b, c, h, w, c_out, k, stride, padding));
            let x = candle_core::Var::from_tensor(
                &Tensor::randn(0f64, 1., (b, c, h, w), &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let wt = candle_core::Var::from_tensor(
                &Tensor::randn(0f64, 1., (c_out, c, k, k), &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let bias = candle_core::Var::from_tensor(
                &Tensor::randn(0f64, 1., c_out, &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let ours = ops::conv2d(&x, &wt, Some(&bias), stride, padding)?;
            let reference = x
                .conv2d(&wt, padding, stride, 1, 1)?
                .broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?;
            assert_eq!(ours.dims(), reference.dims(), "{case}");
            assert!(max_abs_diff(&ours, &reference)? < tol, "{case}: forward");
            // Inference path (nothing tracked) gives the same result.
            let detached = ops::conv2d(
                &x.as_detached_tensor(),
                &wt.as_detached_tensor(),
                Some(&bias.as_detached_tensor()),
                stride,
                padding,
            )?;
            assert!(
                max_abs_diff(&detached, &reference)? < tol,
                "{case}: inference forward"
            );

            // A non-trivial upstream gradient r: the gradients of <conv(x, w), r>.
            let r = Tensor::randn(0f64, 1., reference.shape(), &Device::Cpu)?.to_dtype(dtype)?;
            let g_ours = (&ours * &r)?.sum_all()?.backward()?;
            let (Some(gx), Some(gw), Some(gb)) =
                (g_ours.get(&x), g_ours.get(&wt), g_ours.get(&bias))
            else {
                panic!("{case}: missing gradient");
            };
            // <conv(x, w), r> is linear in x and in w, so for any direction d:
            // <grad_x, d> = <conv(d, w), r> and <grad_w, d> = <conv(x, d), r>.
            let dot = |a: &Tensor, b: &Tensor| -> Result<f64> {
                (a * b)?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()
            };
            let dx = Tensor::randn(0f64, 1., x.shape(), &Device::Cpu)?.to_dtype(dtype)?;
            let dw = Tensor::randn(0f64, 1., wt.shape(), &Device::Cpu)?.to_dtype(dtype)?;
            let lhs_x = dot(gx, &dx)?;
            let rhs_x = dot(&dx.conv2d(&wt, padding, stride, 1, 1)?, &r)?;
            assert!(
                (lhs_x - rhs_x).abs() < tol * 100.0 * (1.0 + rhs_x.abs()),
                "{case}: input gradient {lhs_x} vs {rhs_x}"
            );
            let lhs_w = dot(gw, &dw)?;
            let rhs_w = dot(&x.conv2d(&dw, padding, stride, 1, 1)?, &r)?;
            assert!(
                (lhs_w - rhs_w).abs() < tol * 100.0 * (1.0 + rhs_w.abs()),
                "{case}: kernel gradient {lhs_w} vs {rhs_w}"
            );
            // The bias gradient is r summed over batch and pixels.
            let expected_gb = r.sum((0, 2, 3))?;
            assert!(
                max_abs_diff(gb, &expected_gb)? < tol * 10.0,
                "{case}: bias gradient"
            );
            // And against candle's own backward pass where that one works (candle 0.11 derives
            // the transposed-convolution output padding from the height only, so it fails for
            // strided convolutions of non-square inputs such as 9x8).
            if h == w {
                let g_ref = (reference * &r)?.sum_all()?.backward()?;
                for (name, var) in [("input", &x), ("kernel", &wt), ("bias", &bias)] {
                    let (Some(a), Some(e)) = (g_ours.get(var), g_ref.get(var)) else {
                        panic!("{case}: missing {name} gradient");
                    };
                    assert!(max_abs_diff(a, e)? < tol * 10.0, "{case}: {name} gradient");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn gemm_conv2d_handles_strided_inputs_and_constant_inputs() -> Result<()> {
    // A transposed (non-contiguous) input, and an input that needs no gradient.
    let base = Tensor::randn(0f32, 1., (5, 2, 4, 6), &Device::Cpu)?;
    let x = base.transpose(2, 3)?; // [5, 2, 6, 4], strided
    assert!(!x.is_contiguous());
    let wt = candle_core::Var::from_tensor(&Tensor::randn(0f32, 1., (3, 2, 3, 3), &Device::Cpu)?)?;
    let ours = ops::conv2d(&x, &wt, None, 1, 1)?;
    let reference = x.contiguous()?.conv2d(&wt, 1, 1, 1, 1)?;
    assert!(max_abs_diff(&ours, &reference)? < 1e-4);
    let grads = ours.sum_all()?.backward()?;
    assert!(grads.get(&x).is_none());
    let (Some(a), Some(e)) = (
        grads.get(&wt),
        reference.sum_all()?.backward()?.get(&wt).cloned(),
    ) else {
        panic!("missing kernel gradient");
    };
    assert!(max_abs_diff(a, &e)? < 1e-3);
    // Shape errors are reported, not panics.
    assert!(ops::conv2d(&x, &wt.as_detached_tensor().narrow(1, 0, 1)?, None, 1, 1).is_err());
    let bad_bias = Tensor::zeros(4, DType::F32, &Device::Cpu)?;
    assert!(ops::conv2d(&x, &wt, Some(&bad_bias), 1, 1).is_err());
    assert!(ops::conv2d(
        &x,
        &Tensor::zeros((3, 2, 9, 9), DType::F32, &Device::Cpu)?,
        None,
        1,
        1
    )
    .is_err());
    Ok(())
}

#[test]
fn pooling_matches_candle_and_pytorch_semantics() -> Result<()> {
    for (h, w) in [(6, 8), (7, 5), (2, 3)] {
        for dtype in [DType::F32, DType::F64] {
            let x = candle_core::Var::from_tensor(
                &Tensor::randn(0f64, 1., (2, 3, h, w), &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            // Reference: candle's ops on the even crop (PyTorch's floor mode).
            let cropped = x.narrow(2, 0, h / 2 * 2)?.narrow(3, 0, w / 2 * 2)?;
            let (h2, w2) = (h / 2 * 2, w / 2 * 2);
            for (name, ours, reference) in [
                ("max", ops::max_pool2x2(&x)?, cropped.max_pool2d(2)?),
                ("avg", ops::avg_pool2x2(&x)?, cropped.avg_pool2d(2)?),
            ] {
                let case = format!("{name} {dtype:?} {h}x{w}");
                assert_eq!(ours.dims(), [2, 3, h / 2, w / 2], "{case}");
                assert!(max_abs_diff(&ours, &reference)? < 1e-6, "{case}: forward");
                let r = Tensor::randn(0f64, 1., ours.shape(), &Device::Cpu)?.to_dtype(dtype)?;
                let g = (&ours * &r)?.sum_all()?.backward()?;
                let Some(got) = g.get(&x) else {
                    panic!("{case}: missing gradient");
                };
                // Expected: r spread over each window (avg: r/4 everywhere; max: r at the
                // maximum, no ties with random inputs), zero on a dropped odd row / column.
                let up = r.upsample_nearest2d(h2, w2)?;
                let expected = if name == "max" {
                    let mask = cropped
                        .eq(&ours.upsample_nearest2d(h2, w2)?)?
                        .to_dtype(dtype)?;
                    (up * mask)?
                } else {
                    (up * 0.25)?
                };
                let expected = expected
                    .pad_with_zeros(2, 0, h % 2)?
                    .pad_with_zeros(3, 0, w % 2)?;
                assert!(max_abs_diff(got, &expected)? < 1e-6, "{case}: gradient");
                // candle's own backward agrees for average pooling only: its max_pool2d
                // gradient is scaled by 1/4 (candle 0.11 multiplies by the window's mask mean
                // instead of dividing by the tie count).
                if name == "avg" {
                    let g_ref = (reference * &r)?.sum_all()?.backward()?;
                    let Some(e) = g_ref.get(&x) else {
                        panic!("{case}: missing reference gradient");
                    };
                    assert!(max_abs_diff(got, e)? < 1e-6, "{case}: candle gradient");
                }
            }
        }
    }
    // Ties: PyTorch sends the whole gradient to the first maximum of the window.
    let x = candle_core::Var::from_tensor(&Tensor::ones((1, 1, 2, 2), DType::F32, &Device::Cpu)?)?;
    let g = ops::max_pool2x2(&x)?.sum_all()?.backward()?;
    let grad = g.get(&x).map(|t| t.flatten_all()?.to_vec1::<f32>());
    match grad {
        Some(v) => assert_eq!(v?, [1.0, 0.0, 0.0, 0.0]),
        None => panic!("missing gradient"),
    }
    // NaN is the maximum (as in PyTorch) and gets the gradient.
    let x = candle_core::Var::from_tensor(&Tensor::new(
        &[[[[1f32, f32::NAN], [3.0, 2.0]]]],
        &Device::Cpu,
    )?)?;
    let y = ops::max_pool2x2(&x)?;
    assert!(y.flatten_all()?.to_vec1::<f32>()?[0].is_nan());
    let g = y.sum_all()?.backward()?;
    let grad = g.get(&x).map(|t| t.flatten_all()?.to_vec1::<f32>());
    match grad {
        Some(v) => assert_eq!(v?, [0.0, 1.0, 0.0, 0.0]),
        None => panic!("missing gradient"),
    }
    // Strided input and too-small input.
    let base = Tensor::randn(0f32, 1., (1, 2, 4, 6), &Device::Cpu)?;
    let t = base.transpose(2, 3)?;
    assert!(max_abs_diff(&ops::max_pool2x2(&t)?, &t.contiguous()?.max_pool2d(2)?)? < 1e-6);
    assert!(max_abs_diff(&ops::avg_pool2x2(&t)?, &t.contiguous()?.avg_pool2d(2)?)? < 1e-6);
    // A strided output gradient (through a transpose after the pooling): the general path.
    let x = candle_core::Var::from_tensor(&base)?;
    let r = Tensor::randn(0f32, 1., (1, 2, 3, 2), &Device::Cpu)?;
    let y = ops::avg_pool2x2(&x)?.transpose(2, 3)?;
    let g = (y * &r)?.sum_all()?.backward()?;
    let expected = (r.transpose(2, 3)?.upsample_nearest2d(4, 6)? * 0.25)?;
    match g.get(&x) {
        Some(got) => assert!(max_abs_diff(got, &expected)? < 1e-6, "strided gradient"),
        None => panic!("missing gradient"),
    }
    assert!(ops::avg_pool2x2(&Tensor::zeros((1, 1, 1, 4), DType::F32, &Device::Cpu)?).is_err());
    Ok(())
}

#[test]
fn relu_matches_candle_forward_and_backward_and_keeps_nan() -> Result<()> {
    for dtype in [DType::F32, DType::F64] {
        for shape in [&[7][..], &[3, 5, 2], &[2, 3, 9, 11]] {
            let x = var(shape, dtype)?;
            let ours = ops::relu(&x)?;
            let reference = x.relu()?;
            assert_eq!(max_abs_diff(&ours, &reference)?, 0.0, "{dtype:?} {shape:?}");
            let r = Tensor::randn(0f64, 1., shape, &Device::Cpu)?.to_dtype(dtype)?;
            let (g_ours, g_ref) = (
                (&ours * &r)?.sum_all()?.backward()?,
                (&reference * &r)?.sum_all()?.backward()?,
            );
            let (Some(a), Some(e)) = (g_ours.get(&x), g_ref.get(&x)) else {
                panic!("missing gradient");
            };
            // Random inputs are never exactly 0, where the conventions differ.
            assert_eq!(max_abs_diff(a, e)?, 0.0, "{dtype:?} {shape:?}: gradient");
        }
    }
    // NaN propagates (as in PyTorch); a strided input works; 0 gets no gradient (PyTorch).
    let x =
        candle_core::Var::from_tensor(&Tensor::new(&[f32::NAN, -1.0, 0.0, 2.0], &Device::Cpu)?)?;
    let y = ops::relu(&x)?.to_vec1::<f32>()?;
    assert!(y[0].is_nan());
    assert_eq!(&y[1..], &[0.0, 0.0, 2.0]);
    let g = ops::relu(&x)?.sum_all()?.backward()?;
    match g.get(&x) {
        Some(g) => assert_eq!(g.to_vec1::<f32>()?, [0.0, 0.0, 0.0, 1.0]),
        None => panic!("missing gradient"),
    }
    let t = Tensor::randn(0f32, 1., (3, 4), &Device::Cpu)?.t()?;
    assert_eq!(max_abs_diff(&ops::relu(&t)?, &t.relu()?)?, 0.0);
    Ok(())
}

#[test]
fn gemm_conv2d_works_chunk_by_chunk() -> Result<()> {
    // 64 input channels on 24x24 outputs: one sample's patch matrix fills a chunk, so forward
    // and backward run chunk by chunk (three chunks), for stride 1 (input gradient as a
    // convolution) and stride 2 (GEMM + col2im); a 1x1 convolution with two samples per chunk.
    let cases = [
        (3, 64, 24, 4, 3, 1, 1),
        (3, 64, 47, 4, 3, 2, 1),
        (3, 64, 24, 3, 1, 1, 0),
    ];
    for &(b, c, h, c_out, k, stride, padding) in &cases {
        let case = format!("{:?}", (b, c, h, c_out, k, stride, padding));
        let x = var(&[b, c, h, h], DType::F32)?;
        let wt = var(&[c_out, c, k, k], DType::F32)?;
        let bias = var(&[c_out], DType::F32)?;
        let ours = ops::conv2d(&x, &wt, Some(&bias), stride, padding)?;
        let reference = x
            .conv2d(&wt, padding, stride, 1, 1)?
            .broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?;
        assert!(rel_diff(&ours, &reference)? < 1e-5, "{case}: forward");
        let r = Tensor::randn(0f32, 1., reference.shape(), &Device::Cpu)?;
        let g_ours = (&ours * &r)?.sum_all()?.backward()?;
        let g_ref = (&reference * &r)?.sum_all()?.backward()?;
        for (name, v) in [("input", &x), ("kernel", &wt), ("bias", &bias)] {
            let (Some(a), Some(e)) = (g_ours.get(v), g_ref.get(v)) else {
                panic!("{case}: missing {name} gradient");
            };
            assert!(rel_diff(a, e)? < 1e-4, "{case}: {name} gradient");
        }
    }
    Ok(())
}

#[test]
fn winograd_conv2d_matches_an_f64_reference_forward_and_backward() -> Result<()> {
    // 3x3 stride-1 convolutions through the public conv2d, forward and all gradients: the
    // larger ones take the Winograd F(4x4, 3x3) path (`ops::winograd::eligible`; their input
    // gradients, convolutions with padding 2 - p, too), the small ones im2col + GEMM. Output
    // sizes that are and are not multiples of the 4x4 tile, paddings 0-2, one and several
    // chunks, a transposed (strided) input; f32 and f64 against candle's conv2d in f64.
    // (batch, c_in, h, w, c_out, padding, strided input)
    let cases = [
        (3, 8, 7, 7, 8, 1, false),
        (2, 16, 28, 28, 8, 1, false),
        (4, 16, 20, 18, 16, 0, false),
        (4, 16, 16, 15, 16, 2, false),
        (4, 16, 18, 17, 16, 1, true),
        (2, 8, 5, 9, 12, 0, false),
        (5, 64, 28, 28, 64, 1, false),
    ];
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
        for &(b, c, h, w, c_out, padding, strided) in &cases {
            let case = format!("{dtype:?} {:?}", (b, c, h, w, c_out, padding, strided));
            let x64 = if strided {
                Tensor::randn(0f64, 1., (b, c, w, h), &Device::Cpu)?.transpose(2, 3)?
            } else {
                Tensor::randn(0f64, 1., (b, c, h, w), &Device::Cpu)?
            };
            let w64 = Tensor::randn(0f64, 1., (c_out, c, 3, 3), &Device::Cpu)?;
            let b64 = Tensor::randn(0f64, 1., c_out, &Device::Cpu)?;
            let r64 = Tensor::randn(
                0f64,
                1.,
                (b, c_out, h + 2 * padding - 2, w + 2 * padding - 2),
                &Device::Cpu,
            )?;
            let grads = |dt: DType| -> Result<Vec<Tensor>> {
                let x = candle_core::Var::from_tensor(&x64.to_dtype(dt)?)?;
                let wt = candle_core::Var::from_tensor(&w64.to_dtype(dt)?)?;
                let bias = candle_core::Var::from_tensor(&b64.to_dtype(dt)?)?;
                let y = if dt == dtype {
                    ops::conv2d(&x, &wt, Some(&bias), 1, padding)?
                } else {
                    x.conv2d(&wt, padding, 1, 1, 1)?
                        .broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?
                };
                let g = (&y * &r64.to_dtype(dt)?)?.sum_all()?.backward()?;
                let mut out = vec![y.to_dtype(DType::F64)?];
                for v in [&x, &wt, &bias] {
                    let Some(gv) = g.get(v) else {
                        panic!("{case}: missing gradient");
                    };
                    out.push(gv.to_dtype(DType::F64)?);
                }
                Ok(out)
            };
            // The reference in f64 through candle's ops (a different dtype than `dtype` when
            // `dtype` is f64 is not available, so f64 cases compare against candle's f64 ops
            // by running the reference with the same dtype but candle's conv2d).
            let ours = grads(dtype)?;
            let reference = if dtype == DType::F64 {
                reference_grads(&x64, &w64, &b64, &r64, padding)?
            } else {
                grads(DType::F64)?
            };
            for (name, (a, e)) in ["output", "input", "kernel", "bias"]
                .iter()
                .zip(ours.iter().zip(&reference))
            {
                let d = rel_diff(a, e)?;
                assert!(d < tol, "{case}: {name} off by {d:e}");
            }
        }
    }
    Ok(())
}

/// `(y, dx, dw, db)` of `conv2d(x, w) + b` against the upstream gradient `r`, all through
/// candle's own f64 ops.
fn reference_grads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    r: &Tensor,
    padding: usize,
) -> Result<Vec<Tensor>> {
    let (xv, wv, bv) = (
        candle_core::Var::from_tensor(x)?,
        candle_core::Var::from_tensor(w)?,
        candle_core::Var::from_tensor(b)?,
    );
    let c_out = w.dim(0)?;
    let y = xv
        .conv2d(&wv, padding, 1, 1, 1)?
        .broadcast_add(&bv.reshape((1, c_out, 1, 1))?)?;
    let g = (&y * r)?.sum_all()?.backward()?;
    let mut out = vec![y];
    for v in [&xv, &wv, &bv] {
        let Some(gv) = g.get(v) else {
            candle_core::bail!("missing reference gradient");
        };
        out.push(gv.clone());
    }
    Ok(out)
}

#[test]
fn conv2d_relu_matches_conv2d_then_relu_forward_and_backward() -> Result<()> {
    // The fused ReLU on both of the convolution's paths: im2col + GEMM (LeNet's two layers,
    // a strided one) and Winograd (16 channels at 16x16), with and without an input gradient.
    // (batch, c_in, h, c_out, k, stride, padding, input gradient)
    let cases = [
        (3, 1, 12, 6, 5, 1, 2, false),
        (2, 6, 14, 16, 5, 1, 0, true),
        (2, 3, 9, 5, 3, 2, 1, true),
        (4, 16, 16, 16, 3, 1, 1, true),
    ];
    for dtype in [DType::F64, DType::F32] {
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
        for &(b, c, h, c_out, k, stride, padding, dx) in &cases {
            let case = format!("{dtype:?} {:?}", (b, c, h, c_out, k, stride, padding, dx));
            let x = var(&[b, c, h, h], dtype)?;
            let w = var(&[c_out, c, k, k], dtype)?;
            let bias = var(&[c_out], dtype)?;
            let xt = if dx {
                x.as_tensor().clone()
            } else {
                x.as_tensor().detach()
            };
            let ours = ops::conv2d_relu(&xt, &w, Some(&bias), stride, padding)?;
            let reference = ops::conv2d(&xt, &w, Some(&bias), stride, padding)?.relu()?;
            assert!(rel_diff(&ours, &reference)? < tol, "{case}: forward");
            let zeros = ours
                .eq(0.0)?
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
            assert!(zeros > 0.0, "{case}: the ReLU clipped nothing");
            let r = Tensor::randn(0f64, 1., ours.shape(), &Device::Cpu)?.to_dtype(dtype)?;
            let g = (&ours * &r)?.sum_all()?.backward()?;
            let g_ref = (&reference * &r)?.sum_all()?.backward()?;
            for (name, t) in [("x", &x), ("weight", &w), ("bias", &bias)] {
                match (g.get(t), g_ref.get(t)) {
                    (Some(a), Some(e)) => {
                        assert!(rel_diff(a, e)? < tol, "{case}: {name} gradient")
                    }
                    (None, None) if name == "x" && !dx => {}
                    (a, e) => panic!(
                        "{case}: {name} gradient {:?} vs {:?}",
                        a.is_some(),
                        e.is_some()
                    ),
                }
            }
        }
    }
    // NaN stays NaN through the fused ReLU, as through `relu`.
    let x = Tensor::new(&[[[[f32::NAN, 1.0], [2.0, 3.0]]]], &Device::Cpu)?;
    let w = Tensor::ones((1, 1, 1, 1), DType::F32, &Device::Cpu)?;
    let y = ops::conv2d_relu(&x, &w, None, 1, 0)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    assert!(y[0].is_nan() && y[1..] == [1.0, 2.0, 3.0], "{y:?}");
    Ok(())
}

#[test]
fn bf16_conv2d_on_the_bf16_unit_matches_f64_forward_and_backward() -> Result<()> {
    // On a CPU with a bf16 matrix unit (AMX), a bf16 convolution is im2col + the bf16 GEMM, in
    // bf16 throughout (no f32 copies): forward and every gradient against candle's conv2d in f64
    // on the same bf16 values. Shapes that take Winograd in f32, a stride-2 one (the input
    // gradient through col2im), a 5×5 kernel, several chunks.
    // KOLO_BF16_GEMM asks for it (a separate process: the setting is read once per process).
    if std::env::var_os("KOLO_BF16_GEMM").is_none() {
        let bin = std::env::current_exe().map_err(candle_core::Error::wrap)?;
        let unit = ["amx", "avx512bf16"].into_iter().find(|u| match *u {
            "amx" => ops::Bf16Path::Amx.available(),
            _ => ops::Bf16Path::Avx512Bf16.available(),
        });
        let Some(unit) = unit else {
            eprintln!("no bf16 matrix unit on this CPU: bf16 convolutions run in f32");
            return Ok(());
        };
        let out = std::process::Command::new(bin)
            .args([
                "--exact",
                "bf16_conv2d_on_the_bf16_unit_matches_f64_forward_and_backward",
            ])
            .env("KOLO_BF16_GEMM", unit)
            .output()
            .map_err(candle_core::Error::wrap)?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "KOLO_BF16_GEMM={unit}: {text}"
        );
        return Ok(());
    }
    assert_ne!(
        ops::bf16_path_asked()?,
        Some(ops::Bf16Path::F32),
        "a bf16 unit was asked for"
    );
    // (batch, c_in, h, w, c_out, k, stride, padding)
    let cases = [
        (2, 8, 9, 9, 16, 3, 1, 1),
        (2, 3, 9, 9, 5, 3, 2, 1),
        (3, 6, 12, 12, 16, 5, 1, 2),
        (4, 16, 16, 15, 32, 3, 1, 1),
    ];
    let bf = |t: Tensor| t.to_dtype(DType::BF16);
    for &(b, c, h, w, c_out, k, stride, padding) in &cases {
        let case = format!("{:?}", (b, c, h, w, c_out, k, stride, padding));
        let x = bf(Tensor::randn(0f64, 1., (b, c, h, w), &Device::Cpu)?)?;
        let wt = bf(Tensor::randn(0f64, 0.3, (c_out, c, k, k), &Device::Cpu)?)?;
        let bias = bf(Tensor::randn(0f64, 1., c_out, &Device::Cpu)?)?;
        let (oh, ow) = (
            (h + 2 * padding - k) / stride + 1,
            (w + 2 * padding - k) / stride + 1,
        );
        let r = bf(Tensor::randn(0f64, 1., (b, c_out, oh, ow), &Device::Cpu)?)?;
        let run = |dt: DType, ours: bool| -> Result<Vec<Tensor>> {
            let (xv, wv, bv) = (
                candle_core::Var::from_tensor(&x.to_dtype(dt)?)?,
                candle_core::Var::from_tensor(&wt.to_dtype(dt)?)?,
                candle_core::Var::from_tensor(&bias.to_dtype(dt)?)?,
            );
            let y = if ours {
                ops::conv2d(&xv, &wv, Some(&bv), stride, padding)?
            } else {
                xv.conv2d(&wv, padding, stride, 1, 1)?
                    .broadcast_add(&bv.reshape((1, c_out, 1, 1))?)?
            };
            assert_eq!(y.dtype(), dt, "{case}");
            let g = (&y * &r.to_dtype(dt)?)?.sum_all()?.backward()?;
            let mut out = vec![y.to_dtype(DType::F64)?];
            for v in [&xv, &wv, &bv] {
                let Some(gv) = g.get(v) else {
                    panic!("{case}: missing gradient");
                };
                out.push(gv.to_dtype(DType::F64)?);
            }
            Ok(out)
        };
        let (ours, reference) = (run(DType::BF16, true)?, run(DType::F64, false)?);
        for (name, (a, e)) in ["output", "input", "kernel", "bias"]
            .iter()
            .zip(ours.iter().zip(&reference))
        {
            // bf16 keeps 8 bits: each result is rounded once (the bias gradient's sum too).
            let d = rel_diff(a, e)?;
            assert!(d < 1e-2, "{case}: {name} off by {d:e}");
        }
    }
    Ok(())
}
