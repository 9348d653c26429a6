//! Mixed precision: LeNet computing in bf16 from f32 master weights gives gradients close to f32's
//! (within bf16's precision), in f32, on the f32 master weights, with and without gradient hooks.

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use common::error_text;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::precision::Precision;
use kolo_ddp::{Result, TrainError};
use kolo_models::{self as models, ModelKind};
use kolo_nn::vars::sorted_vars;

fn grads(ranks: usize, precision: Precision) -> Result<Vec<Vec<f32>>> {
    let out = kolo::run_local(
        ranks,
        kolo::Config::default(),
        |comm| -> Result<Vec<Vec<f32>>> {
            let dev = Device::Cpu;
            let varmap = VarMap::new();
            models::build(
                ModelKind::Lenet,
                candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev),
                [1, 28, 28],
                10,
            )?;
            kolo_models::seeded_init(&varmap, 3)?;
            let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            let n = 8 * 28 * 28;
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32) / 101.0).collect();
            let mut x = Tensor::from_vec(x, (8, 1, 28, 28), &dev)?;
            let y = Tensor::from_vec((0..8u32).map(|i| i % 10).collect::<Vec<_>>(), 8, &dev)?;
            let vb = match precision.compute_dtype() {
                Some(d) => {
                    x = x.to_dtype(d)?;
                    ddp.var_builder_in(d, &dev)
                }
                None => ddp.var_builder(DType::F32, &dev),
            };
            let model = models::build(ModelKind::Lenet, vb, [1, 28, 28], 10)?;
            let logits = model.forward(&x, true)?;
            if precision == Precision::Bf16 {
                assert_eq!(logits.dtype(), DType::BF16, "the model computes in bf16");
            }
            let loss = candle_nn::loss::cross_entropy(&logits.to_dtype(DType::F32)?, &y)?;
            let g = ddp.backward(&loss)?;
            let mut all = Vec::new();
            for (name, v) in sorted_vars(&varmap) {
                assert_eq!(v.dtype(), DType::F32, "{name}: master weights stay f32");
                let gv = g.get(&v).ok_or_else(|| TrainError::Unsupported {
                    what: format!("no gradient for {name}"),
                })?;
                assert_eq!(
                    gv.dtype(),
                    DType::F32,
                    "{name}: gradients reach the master weights in f32"
                );
                all.push(gv.flatten_all()?.to_vec1::<f32>()?);
            }
            Ok(all)
        },
    );
    out.into_iter()
        .next()
        .ok_or_else(|| TrainError::Unsupported {
            what: "no rank".into(),
        })?
        .map_err(|what| TrainError::Unsupported { what })?
}

#[test]
fn bf16_gradients_are_close_to_f32_and_land_in_f32() -> Result<()> {
    for ranks in [1, 2] {
        let f32g = grads(ranks, Precision::F32)?;
        let bf16g = grads(ranks, Precision::Bf16)?;
        for (a, b) in f32g.iter().zip(&bf16g) {
            let norm = a.iter().map(|v| v * v).sum::<f32>().sqrt();
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                .sqrt();
            // bf16 keeps 8 bits of mantissa (relative 2^-8 per value); errors compound over a few
            // layers but stay well below 10 % of the gradient's norm.
            assert!(
                diff <= 0.1 * norm + 1e-6,
                "{ranks} ranks: |diff| {diff} vs |grad| {norm}"
            );
            assert!(diff > 0.0, "bf16 compute must differ from f32 somewhere");
        }
    }
    Ok(())
}

#[test]
fn precision_names() {
    assert_eq!("bf16".parse::<Precision>().ok(), Some(Precision::Bf16));
    assert_eq!("f32".parse::<Precision>().ok(), Some(Precision::F32));
    let e = error_text("fp16".parse::<Precision>());
    assert!(e.contains("bf16"), "{e}");
    let e = error_text("int8".parse::<Precision>());
    assert!(e.contains("int8") && e.contains("f32 or bf16"), "{e}");
}
