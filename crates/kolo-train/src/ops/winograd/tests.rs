//! The Winograd passes end to end against candle's convolution.

use super::*;

/// `forward` and `backward` directly (whatever [`eligible`] would choose) against candle's
/// conv2d in f64: output sizes that are and are not multiples of the tile, paddings 0–2,
/// one and several chunks, a transposed (strided) input, f32 and f64.
#[test]
fn forward_and_gradients_match_candle() -> Result<()> {
    use candle_core::{DType, Device, Tensor, Var};
    // (batch, c_in, h, w, c_out, padding, strided input)
    let cases = [
        (3, 8, 7, 7, 8, 1, false),
        (2, 3, 28, 28, 5, 1, false),
        (2, 8, 5, 9, 12, 0, false),
        (1, 9, 4, 4, 10, 1, false),
        (2, 8, 6, 5, 8, 2, false),
        (2, 12, 9, 6, 8, 1, true),
        (1, 2, 1, 1, 3, 1, false),
        (9, 64, 28, 28, 16, 1, false),
    ];
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
        for &(b, c, h, w, c_out, padding, strided) in &cases {
            let case = format!("{dtype:?} {:?}", (b, c, h, w, c_out, padding, strided));
            let x = if strided {
                Tensor::randn(0f64, 1., (b, c, w, h), &Device::Cpu)?.transpose(2, 3)?
            } else {
                Tensor::randn(0f64, 1., (b, c, h, w), &Device::Cpu)?
            };
            let wt = Tensor::randn(0f64, 1., (c_out, c, 3, 3), &Device::Cpu)?;
            let bias = Tensor::randn(0f64, 1., c_out, &Device::Cpu)?;
            let (oh, ow) = (h + 2 * padding - 2, w + 2 * padding - 2);
            let r = Tensor::randn(0f64, 1., (b, c_out, oh, ow), &Device::Cpu)?;
            let (xv, wv) = (Var::from_tensor(&x)?, Var::from_tensor(&wt)?);
            let y_ref = xv
                .conv2d(&wv, padding, 1, 1, 1)?
                .broadcast_add(&bias.reshape((1, c_out, 1, 1))?)?;
            let grads = (&y_ref * &r)?.sum_all()?.backward()?;
            let (Some(dx_ref), Some(dw_ref)) = (grads.get(&xv).cloned(), grads.get(&wv).cloned())
            else {
                panic!("{case}: no reference gradient");
            };
            let geom = Geom {
                b,
                c,
                h,
                w,
                k: 3,
                stride: 1,
                padding,
                oh,
                ow,
            };
            let x = x.to_dtype(dtype)?;
            let (storage, layout) = x.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                panic!("not a CPU tensor");
            };
            let as_vec = |t: &Tensor| t.to_dtype(dtype)?.flatten_all()?.contiguous();
            let (w_t, b_t, r_t) = (as_vec(&wt)?, as_vec(&bias)?, as_vec(&r)?);
            let (y, dx, dw) = match dtype {
                DType::F32 => {
                    let xs = (cpu.as_slice::<f32>()?, layout);
                    let y = forward(xs, &geom, &w_t.to_vec1()?, Some(&b_t.to_vec1()?))?;
                    let w = w_t.to_vec1::<f32>()?;
                    let (dx, dw) = backward(xs, &geom, &w, &r_t.to_vec1()?, (true, true))?;
                    let t = |v: Option<Vec<f32>>| Tensor::new(v.unwrap_or_default(), &Device::Cpu);
                    (Tensor::new(y, &Device::Cpu)?, t(dx)?, t(dw)?)
                }
                _ => {
                    let xs = (cpu.as_slice::<f64>()?, layout);
                    let y = forward(xs, &geom, &w_t.to_vec1()?, Some(&b_t.to_vec1()?))?;
                    let w = w_t.to_vec1::<f64>()?;
                    let (dx, dw) = backward(xs, &geom, &w, &r_t.to_vec1()?, (true, true))?;
                    let t = |v: Option<Vec<f64>>| Tensor::new(v.unwrap_or_default(), &Device::Cpu);
                    (Tensor::new(y, &Device::Cpu)?, t(dx)?, t(dw)?)
                }
            };
            for (name, ours, reference) in [
                ("output", y, y_ref),
                ("input gradient", dx, dx_ref),
                ("kernel gradient", dw, dw_ref),
            ] {
                let ours = ours.to_dtype(DType::F64)?.reshape(reference.shape())?;
                let scale = reference
                    .abs()?
                    .max_keepdim(0)?
                    .max_all()?
                    .to_scalar::<f64>()?;
                let err = (ours - &reference)?.abs()?.max_all()?.to_scalar::<f64>()?;
                assert!(err <= tol * scale.max(1.), "{case}: {name} off by {err:e}");
            }
        }
    }
    Ok(())
}
