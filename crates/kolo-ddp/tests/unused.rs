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

/// The variable named `name` in `vm`.
fn var(vm: &VarMap, name: &str) -> candle_core::Var {
    vm.data().lock().expect("the VarMap")[name].clone()
}

/// A parameter one rank left unused is averaged with zeros there; one that no rank used (a
/// frozen, detached weight) keeps no gradient on every rank, as with one worker.
#[test]
fn a_parameter_no_rank_uses_keeps_no_gradient() {
    for overlap in [true, false] {
        let seen = common::on_ranks(2, Config::default(), move |comm| -> Result<_> {
            let vm = VarMap::new();
            let build = |vb: &VarBuilder| -> candle_core::Result<_> {
                Ok((
                    linear(4, 4, vb.pp("a"))?,
                    linear(4, 4, vb.pp("skip"))?,
                    vb.pp("frozen").get((4, 4), "weight")?.detach(),
                ))
            };
            build(&VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
            common::init(&vm, 0.5)?;
            let opts = DdpOptions {
                overlap,
                ..DdpOptions::default()
            };
            let ddp = Ddp::new(&comm, &vm, opts)?;
            let (a, skip, frozen) = build(&ddp.var_builder(DType::F32, &Device::Cpu))?;
            let x = Tensor::new(&[[1.0f32, -2.0, 0.5, 3.0]], &Device::Cpu)?;
            let h = a.forward(&x)?.matmul(&frozen)?;
            // Only rank 0 goes through `skip`.
            let h = if comm.rank() == 0 {
                skip.forward(&h)?
            } else {
                h
            };
            let grads = ddp.backward(&h.sqr()?.sum_all()?)?;
            let grad = |name: &str| -> candle_core::Result<Option<Vec<f32>>> {
                grads
                    .get(var(&vm, name).as_tensor())
                    .map(|g| g.flatten_all()?.to_vec1())
                    .transpose()
            };
            Ok((grad("skip.bias")?, grad("frozen.weight")?))
        });
        let (skip0, frozen0) = &seen[0];
        let (skip1, frozen1) = &seen[1];
        assert_eq!((frozen0, frozen1), (&None, &None), "overlap {overlap}");
        let skip = skip0.as_ref().expect("skip.bias has a gradient on rank 0");
        assert_eq!(skip0, skip1, "overlap {overlap}");
        assert!(
            skip.iter().any(|&g| g != 0.0),
            "overlap {overlap}: {skip:?}"
        );
    }
}

/// A frozen weight keeps its values under an optimizer with weight decay and momentum on two
/// workers, as on one: no rank used it, so no optimizer steps it.
#[test]
fn a_frozen_weight_stays_put_under_weight_decay() {
    use kolo_ddp::distributed::DistributedOptimizer;
    use kolo_ddp::optim::{self, OptimizerConfig};
    for (n, config) in [
        (1, OptimizerConfig::adamw(0.01, 0.1)),
        (2, OptimizerConfig::adamw(0.01, 0.1)),
        (2, OptimizerConfig::sgd(0.1, 0.9)),
    ] {
        let config = match config {
            OptimizerConfig::Sgd(c) => OptimizerConfig::Sgd(optim::SgdConfig {
                weight_decay: 0.1,
                ..c
            }),
            c => c,
        };
        let moved = common::on_ranks(n, Config::default(), move |comm| -> Result<_> {
            let vm = VarMap::new();
            let build = |vb: &VarBuilder| -> candle_core::Result<_> {
                Ok((
                    linear(4, 4, vb.pp("a"))?,
                    vb.pp("frozen").get((4, 4), "weight")?.detach(),
                ))
            };
            build(&VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
            common::init(&vm, 0.5)?;
            let ddp = Ddp::new(&comm, &vm, DdpOptions::default())?;
            let (a, frozen) = build(&ddp.var_builder(DType::F32, &Device::Cpu))?;
            let values = |name: &str| var(&vm, name).flatten_all()?.to_vec1::<f32>();
            let (before, a_before) = (values("frozen.weight")?, values("a.weight")?);
            let opt = optim::build(ddp.params(), config)?;
            let mut opt = DistributedOptimizer::new(ddp, opt, 1)?;
            let x = Tensor::new(&[[1.0f32, -2.0, 0.5, 3.0]], &Device::Cpu)?;
            for _ in 0..3 {
                opt.backward_step(&a.forward(&x)?.matmul(&frozen)?.sqr()?.sum_all()?)?;
            }
            Ok((
                before == values("frozen.weight")?,
                a_before != values("a.weight")?,
            ))
        });
        for (r, (kept, trained)) in moved.iter().enumerate() {
            assert!(
                kept,
                "{n} workers, {config:?}: rank {r} moved the frozen weight"
            );
            assert!(
                trained,
                "{n} workers, {config:?}: rank {r} did not train `a`"
            );
        }
    }
}

/// `Ddp::var_builder` refuses a name its `VarMap` did not hold (a layer added after `Ddp::new`
/// would be neither synchronized nor trained), with one worker and two; `Ddp::new` refuses a
/// `VarMap` without parameters.
#[test]
fn a_parameter_unknown_to_ddp_is_an_error() {
    for n in [1, 2] {
        let errors = common::on_ranks(n, Config::default(), move |comm| -> Result<_> {
            let empty = Ddp::new(&comm, &VarMap::new(), DdpOptions::default())
                .err()
                .map(|e| e.to_string());
            let vm = VarMap::new();
            linear(
                4,
                4,
                VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu).pp("a"),
            )?;
            let ddp = Ddp::new(&comm, &vm, DdpOptions::default())?;
            let vb = ddp.var_builder(DType::F32, &Device::Cpu);
            linear(4, 4, vb.pp("a"))?;
            let added = linear(4, 4, vb.pp("added")).err().map(|e| e.to_string());
            Ok((empty, added, vm.all_vars().len()))
        });
        for (r, (empty, added, vars)) in errors.into_iter().enumerate() {
            let empty = empty.unwrap_or_else(|| panic!("{n} workers, rank {r}: empty VarMap"));
            assert!(empty.contains("without parameters"), "{empty}");
            let added = added.unwrap_or_else(|| panic!("{n} workers, rank {r}: no error"));
            assert!(
                added.contains("`added.weight`") && added.contains("Ddp::new"),
                "{added}"
            );
            assert_eq!(vars, 2, "{n} workers, rank {r}: the VarMap grew");
        }
    }
}
