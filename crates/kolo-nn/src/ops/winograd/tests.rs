//! The Winograd passes end to end against candle's convolution.

use candle_core::{CpuStorage, Device, Tensor};

use super::*;

/// `forward` and `backward` (with the forward pass's transformed kernel if `keep_u`) on `x` and
/// the kernel, bias and output gradient `[w, b, r]` (contiguous, of dtype `T`): `(y, dx, dw)`.
fn run<T: WithDType>(
    (x, layout): (&CpuStorage, &Layout),
    geom: &Geom,
    [w, b, r]: [&Tensor; 3],
    variant: Variant,
    keep_u: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let xs = (x.as_slice::<T>()?, layout);
    let w = w.to_vec1::<T>()?;
    let (y, kept) = forward(xs, geom, &w, Some(&b.to_vec1()?), variant)?;
    let u = Some(&kept[..]).filter(|_| keep_u);
    let mut grads = Vec::new();
    let r = r.to_vec1()?;
    backward(xs, (&w, u), geom, &r, (true, true), variant, &mut grads)?;
    // Back to the pool, as the convolution op does: the next case's transformed kernel is made in
    // this buffer (or another case's), over its stale values.
    super::super::scratch::keep_vec(kept);
    let dx_len = geom.b * geom.c * geom.h * geom.w;
    if grads.len() != dx_len + w.len() {
        candle_core::bail!("{} gradient values for {dx_len} + {}", grads.len(), w.len());
    }
    let dw = grads.split_off(dx_len);
    let t = |v: Vec<T>| Tensor::new(v, &Device::Cpu);
    Ok((t(y)?, t(grads)?, t(dw)?))
}

/// `forward` and `backward` directly, by both algorithms (whatever [`eligible`] would choose),
/// against candle's conv2d in f64: output sizes that are and are not multiples of the tile,
/// paddings 0–2, one and several chunks, a transposed (strided) input, f32 and f64; the backward
/// pass with the forward pass's transformed kernel (even batches) and without it (odd ones).
#[test]
fn forward_and_gradients_match_candle() -> Result<()> {
    use candle_core::{DType, Var};
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
    for (dtype, variant) in [DType::F32, DType::F64]
        .into_iter()
        .flat_map(|d| [(d, Variant::F4), (d, Variant::F2)])
    {
        let tol = if dtype == DType::F64 { 1e-10 } else { 1e-4 };
        for &(b, c, h, w, c_out, padding, strided) in &cases {
            let case = format!(
                "{dtype:?} {variant:?} {:?}",
                (b, c, h, w, c_out, padding, strided)
            );
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
            let keep_u = b % 2 == 0;
            let (y, dx, dw) = match dtype {
                DType::F32 => {
                    run::<f32>((cpu, layout), &geom, [&w_t, &b_t, &r_t], variant, keep_u)?
                }
                _ => run::<f64>((cpu, layout), &geom, [&w_t, &b_t, &r_t], variant, keep_u)?,
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

/// The cost model's choices on ResNet-18's 3×3 stride-1 convolutions (batch 32, 28×28 input):
/// F(4, 3) down to 7×7 images, F(2, 3) for the 512-channel stage on 4×4 images, and the direct
/// GEMM for few channels or a single small image.
#[test]
fn the_cost_model_picks_per_shape() {
    let geom = |b, c, hw| Geom {
        b,
        c,
        h: hw,
        w: hw,
        k: 3,
        stride: 1,
        padding: 1,
        oh: hw,
        ow: hw,
    };
    assert_eq!(eligible(&geom(32, 64, 28), 64), Some(Variant::F4));
    assert_eq!(eligible(&geom(32, 256, 7), 256), Some(Variant::F4));
    assert_eq!(eligible(&geom(32, 512, 4), 512), Some(Variant::F2));
    assert_eq!(eligible(&geom(32, 4, 28), 64), None);
    assert_eq!(eligible(&geom(1, 512, 2), 512), None);
}
