//! Adasum as DDP's gradient reduction: each parameter's gradient is combined across 2 ranks by
//! Adasum's formula, (1 − a·b/2|a|²) a + (1 − a·b/2|b|²) b, per parameter, not averaged.

mod common;

use std::sync::Arc;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarMap;
use common::error_text;
use kolo_ddp::ddp::{AdasumHook, Ddp, DdpOptions, GradientReduce};
use kolo_ddp::{Result, TrainError};
use kolo_nn::vars::sorted_vars;

fn adasum(a: &[f32], b: &[f32]) -> Vec<f32> {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum();
    let ca = if na == 0.0 {
        0.0
    } else {
        1.0 - dot / (2.0 * na)
    };
    let cb = if nb == 0.0 {
        0.0
    } else {
        1.0 - dot / (2.0 * nb)
    };
    a.iter()
        .zip(b)
        .map(|(x, y)| (ca * f64::from(*x) + cb * f64::from(*y)) as f32)
        .collect()
}

/// Each rank's local gradients (rank-dependent data) and its gradients after Ddp with `hook`.
/// Per-parameter gradients, flattened.
type Grads = Vec<Vec<f32>>;

fn run(hook: bool) -> Result<Vec<(Grads, Grads)>> {
    let out = kolo::run_local(2, kolo::Config::default(), |comm| -> Result<_> {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let build = |vb| candle_nn::linear(4, 3, vb);
        build(candle_nn::VarBuilder::from_varmap(
            &varmap,
            DType::F32,
            &dev,
        ))?;
        let mut ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
        if hook {
            ddp.set_comm_hook(Some(Arc::new(AdasumHook)))?;
        }
        let r = comm.rank() as f32;
        let x = Tensor::new(
            &[[1.0f32 + r, -2.0, 0.5 * r, 3.0], [0.0, 1.0, r, -1.0]],
            &dev,
        )?;
        let target = Tensor::new(&[[r, 1.0, -1.0], [2.0, -r, 0.5]], &dev)?;
        // Local gradients, without communication.
        let local_model = build(candle_nn::VarBuilder::from_varmap(
            &varmap,
            DType::F32,
            &dev,
        ))?;
        let local = candle_nn::loss::mse(&local_model.forward(&x)?, &target)?.backward()?;
        // The same through Ddp.
        let model = build(ddp.var_builder(DType::F32, &dev))?;
        let grads = ddp.backward(&candle_nn::loss::mse(&model.forward(&x)?, &target)?)?;
        let mut l = Vec::new();
        let mut g = Vec::new();
        for (name, v) in sorted_vars(&varmap) {
            let missing = || TrainError::Unsupported {
                what: format!("no gradient for {name}"),
            };
            l.push(
                local
                    .get(&v)
                    .ok_or_else(missing)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
            g.push(
                grads
                    .get(&v)
                    .ok_or_else(missing)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
        }
        Ok((l, g))
    });
    out.into_iter()
        .map(|r| r.map_err(|what| TrainError::Unsupported { what })?)
        .collect()
}

#[test]
fn ddp_with_adasum_combines_each_parameter_by_the_formula() -> Result<()> {
    let ranks = run(true)?;
    let (l0, g0) = &ranks[0];
    let (l1, g1) = &ranks[1];
    assert_eq!(g0, g1, "both ranks get the same result");
    for ((a, b), got) in l0.iter().zip(l1).zip(g0) {
        let want = adasum(a, b);
        let avg: Vec<f32> = a.iter().zip(b).map(|(x, y)| (x + y) / 2.0).collect();
        for (w, v) in want.iter().zip(got) {
            assert!(
                (w - v).abs() <= 1e-5 * w.abs().max(1e-3),
                "{want:?} vs {got:?}"
            );
        }
        assert_ne!(want, avg, "the test data must tell Adasum from the average");
    }
    // Without the hook: the average.
    let plain = run(false)?;
    for ((a, b), got) in plain[0].0.iter().zip(&plain[1].0).zip(&plain[0].1) {
        for ((x, y), v) in a.iter().zip(b).zip(got) {
            assert!(((x + y) / 2.0 - v).abs() <= 1e-6);
        }
    }
    Ok(())
}

#[test]
fn adasum_names_and_worlds() {
    assert_eq!(
        "adasum".parse::<GradientReduce>().ok(),
        Some(GradientReduce::Adasum)
    );
    let e = error_text("sum".parse::<GradientReduce>());
    assert!(e.contains("average, adasum"), "{e}");
    assert!(GradientReduce::Adasum.check_world(4).is_ok());
    let e = error_text(GradientReduce::Adasum.check_world(3));
    assert!(e.contains("not 3"), "{e}");
    assert!(GradientReduce::Average.check_world(3).is_ok());
}
