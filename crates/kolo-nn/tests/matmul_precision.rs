//! `set_matmul_precision(Bf16)`: kolo's f32 convolutions (Winograd and im2col; on AMX, those
//! with channels in 32s as implicit GEMMs) and linear layers, forward and every gradient,
//! multiply on the CPU's bf16 unit, close to f32 and not equal to it;
//! back to `Highest`, exactly f32 again. The setting is the process's, so this binary holds one test.

use candle_core::{DType, Device, Result, Tensor, Var};
use kolo_nn::ops::{self, MatmulPrecision};

mod common;
use common::rel_diff;

/// `(y, dx, dw, db)` of case `c` against its upstream gradient `r`, in f32 through kolo's ops: a
/// convolution `conv2d(x, w) + b` of stride `Some(s)` (padding 1), or `linear(x, w, b)`.
fn run(c: &Case, stride: Option<usize>) -> Result<Vec<Tensor>> {
    let (x, w, b) = (
        Var::from_tensor(&c.x)?,
        Var::from_tensor(&c.w)?,
        Var::from_tensor(&c.b)?,
    );
    let (y, r) = match stride {
        Some(s) => {
            let y = ops::conv2d(&x, &w, Some(&b), s, 1)?;
            let r = c.r.narrow(2, 0, y.dim(2)?)?.narrow(3, 0, y.dim(3)?)?;
            (y, r)
        }
        None => (ops::linear(&x, &w, Some(&b))?, c.r.clone()),
    };
    let g = (&y * &r)?.sum_all()?.backward()?;
    let mut out = vec![y];
    for v in [&x, &w, &b] {
        let Some(gv) = g.get(v) else {
            candle_core::bail!("missing gradient");
        };
        out.push(gv.clone());
    }
    Ok(out)
}

/// A linear layer from `inp` to `out` features over `rows` rows, random values.
fn linear_case(rows: usize, inp: usize, out: usize) -> Result<Case> {
    let dev = Device::Cpu;
    Ok(Case {
        x: Tensor::randn(0f32, 1., (rows, inp), &dev)?,
        w: (Tensor::randn(0f32, 1., (out, inp), &dev)? * 0.1)?,
        b: Tensor::randn(0f32, 1., out, &dev)?,
        r: Tensor::randn(0f32, 1., (rows, out), &dev)?,
    })
}

struct Case {
    x: Tensor,
    w: Tensor,
    b: Tensor,
    r: Tensor,
}

/// A convolution of `x_shape` input with as many output channels, random values.
fn case(x_shape: (usize, usize, usize, usize)) -> Result<Case> {
    let dev = Device::Cpu;
    let c = x_shape.1;
    Ok(Case {
        x: Tensor::randn(0f32, 1., x_shape, &dev)?,
        w: (Tensor::randn(0f32, 1., (c, c, 3, 3), &dev)? * 0.1)?,
        b: Tensor::randn(0f32, 1., c, &dev)?,
        r: Tensor::randn(0f32, 1., (x_shape.0, c, x_shape.2, x_shape.3), &dev)?,
    })
}

#[test]
fn bf16_matmul_precision_rounds_the_convolutions_gemm_operands_only() -> Result<()> {
    // (what, input, stride, whether its products stay f32): 32 channels at 16×16 take Winograd
    // F(4×4, 3×3), which keeps f32 products; at 4×4 with batch 32, F(2×2, 3×3); at stride 2,
    // im2col + GEMM. On a bf16 unit (AMX, AVX512-BF16) all three (32 channels) are implicit
    // GEMMs instead (`ops::tile_conv`, the strided one over its input's phases): bf16 products,
    // the F(4×4, 3×3) one too.
    // Linear layers: every side of each product at least 32 (on the unit), or the 10 outputs
    // of a classifier (f32).
    let cases = [
        ("F(4x4, 3x3)", case((4, 32, 16, 16))?, Some(1), true),
        ("F(2x2, 3x3)", case((32, 32, 4, 4))?, Some(1), false),
        ("im2col", case((4, 32, 16, 16))?, Some(2), false),
        ("linear 64x96 -> 48", linear_case(64, 96, 48)?, None, false),
        ("linear 64x96 -> 10", linear_case(64, 96, 10)?, None, true),
    ];
    assert_eq!(ops::matmul_precision(), MatmulPrecision::Highest);
    let f32_runs: Vec<Vec<Tensor>> = cases
        .iter()
        .map(|(_, c, s, _)| run(c, *s))
        .collect::<Result<_>>()?;

    let unit = ops::set_matmul_precision(MatmulPrecision::Bf16)?;
    let Some(unit) = unit else {
        assert_eq!(ops::matmul_precision(), MatmulPrecision::Highest);
        eprintln!("no bf16 unit on this CPU: products stay f32 (checked); nothing else to check");
        return Ok(());
    };
    assert_eq!(ops::matmul_precision(), MatmulPrecision::Bf16);
    eprintln!("f32 products on {unit:?}");
    for ((what, c, stride, stays_f32), want) in cases.iter().zip(&f32_runs) {
        let on_tiles = matches!(unit, ops::Bf16Path::Amx | ops::Bf16Path::Avx512Bf16);
        let stays_f32 = *stays_f32 && !(on_tiles && *stride == Some(1));
        let got = run(c, *stride)?;
        for (name, (a, e)) in ["output", "input", "kernel", "bias"]
            .iter()
            .zip(got.iter().zip(want))
        {
            assert_eq!(a.dtype(), DType::F32, "{name}");
            let d = rel_diff(a, e)?;
            // bf16 operands: 8 bits of mantissa, errors of a few 1e-3 relative to the largest
            // value; the bias gradient has no GEMM.
            let exact = stays_f32 || *name == "bias";
            assert!(d < 1e-2, "{what}: {name} off by {d:e}");
            assert_eq!(
                d == 0.0,
                exact,
                "{what}: {name} off by {d:e}: f32 exactly where no bf16 product is"
            );
        }
    }

    ops::set_matmul_precision(MatmulPrecision::Highest)?;
    assert_eq!(ops::matmul_precision(), MatmulPrecision::Highest);
    for ((what, c, stride, _), want) in cases.iter().zip(&f32_runs) {
        let got = run(c, *stride)?;
        for (a, e) in got.iter().zip(want) {
            assert_eq!(rel_diff(a, e)?, 0.0, "{what}: f32 again");
        }
    }
    Ok(())
}
