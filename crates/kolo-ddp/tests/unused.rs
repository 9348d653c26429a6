//! Parameters that get no gradient are named (PyTorch's `find_unused_parameters` diagnostics):
//! a layer the forward pass skips, and the layers before an operation without a backward pass
//! (candle_nn's fused LayerNorm), with overlap on and off; a pass that uses everything names none.

mod common;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{layer_norm, linear, LayerNormConfig, VarBuilder, VarMap};
use kolo::Config;
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::Result;

/// The model's layers: `a` (4 → 4), `skip` (4 → 4), `ln` (LayerNorm of 4), `head` (4 → 2).
fn layers(vb: &VarBuilder) -> candle_core::Result<[Box<dyn Module>; 4]> {
    Ok([
        Box::new(linear(4, 4, vb.pp("a"))?),
        Box::new(linear(4, 4, vb.pp("skip"))?),
        Box::new(layer_norm(4, LayerNormConfig::default(), vb.pp("ln"))?),
        Box::new(linear(4, 2, vb.pp("head"))?),
    ])
}

fn unused_after(overlap: bool) -> Vec<Vec<Vec<String>>> {
    common::on_ranks(
        2,
        Config::default(),
        move |comm| -> Result<Vec<Vec<String>>> {
            let vm = VarMap::new();
            layers(&VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
            let opts = DdpOptions {
                overlap,
                ..DdpOptions::default()
            };
            let ddp = Ddp::new(&comm, &vm, opts)?;
            let [a, skip, ln, head] = layers(&ddp.var_builder(DType::F32, &Device::Cpu))?;
            let x = Tensor::new(&[[1.0f32, -2.0, 0.5, 3.0]], &Device::Cpu)?;
            let mut seen = Vec::new();
            // 1. `skip` unused; 2. through the fused LayerNorm (no backward): only `head` learns;
            // 3. everything used.
            let losses = [
                head.forward(&a.forward(&x)?)?,
                head.forward(&ln.forward(&a.forward(&x)?)?)?,
                head.forward(&skip.forward(&a.forward(&x)?)?)?,
            ];
            for out in losses {
                ddp.backward(&out.sqr()?.sum_all()?)?;
                let mut names = ddp.unused_parameters();
                names.sort();
                seen.push(names);
            }
            Ok(seen)
        },
    )
}

#[test]
fn parameters_without_gradients_are_named() {
    for overlap in [true, false] {
        for (r, seen) in unused_after(overlap).into_iter().enumerate() {
            let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            assert_eq!(
                seen,
                [
                    names(&["ln.bias", "ln.weight", "skip.bias", "skip.weight"]),
                    names(&[
                        "a.bias",
                        "a.weight",
                        "ln.bias",
                        "ln.weight",
                        "skip.bias",
                        "skip.weight"
                    ]),
                    names(&["ln.bias", "ln.weight"]),
                ],
                "overlap {overlap}, rank {r}"
            );
        }
    }
}
