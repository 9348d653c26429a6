//! A model built once from [`Ddp::var_builder`] trains exactly like one rebuilt every step — bit
//! for bit, on 1, 2 and 3 ranks, overlap on and off, with compression, bf16 and ZeRO; tied weights
//! (one parameter used twice) under overlap equal a one-process reference; and a model that missed
//! a refresh is an error, not a silently frozen run.

mod common;

use std::time::Duration;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
use common::*;
use kolo::{Communicator, Config};
use kolo_ddp::ddp::{Compression, Ddp, DdpOptions};
use kolo_ddp::distributed::DistributedOptimizer;
use kolo_ddp::optim::{DynOptimizer, OptimizerConfig, SgdConfig, ShardedOptimizer};
use kolo_ddp::TrainError;
use kolo_models::ModelKind;

const STEPS: usize = 4;
const LR: f64 = 0.1;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Build {
    Once,
    EveryStep,
}

#[derive(Clone, Copy, Debug)]
struct Setting {
    overlap: bool,
    compression: Compression,
    compute: Option<DType>,
    zero: bool,
    /// Uneven inputs: rank r takes `STEPS - r` steps, joins, then every rank takes one more.
    join: bool,
}

const PLAIN: Setting = Setting {
    overlap: true,
    compression: Compression::None,
    compute: None,
    zero: false,
    join: false,
};

fn config() -> Config {
    Config::default().with_timeout(Duration::from_secs(60))
}

/// One rank's [`ConvNet`] after [`STEPS`] steps of a [`DistributedOptimizer`] (SGD with momentum,
/// or ZeRO's sharded SGD), the model built once or every step.
/// The model of a setting: kolo's LeNet for bf16 (its kernels compute in bf16; candle's CPU
/// matmul does not), the small conv net otherwise.
enum Net {
    Conv(ConvNet),
    Lenet(Box<dyn kolo_models::Model>),
}

impl Net {
    fn new(vb: VarBuilder, s: Setting) -> candle_core::Result<Net> {
        Ok(match s.compute {
            Some(_) => Net::Lenet(kolo_models::build(ModelKind::Lenet, vb, [1, 28, 28], 10)?),
            None => Net::Conv(ConvNet::new(vb, false)?),
        })
    }

    fn logits(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Net::Conv(n) => n.forward(x, false),
            Net::Lenet(m) => m.forward(x, true),
        }
    }
}

/// Rank `rank`'s inputs and labels at `step`, for the model of `s`.
fn batch(s: Setting, step: usize, n: usize, rank: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let dev = Device::Cpu;
    if s.compute.is_none() {
        return rank_share(&conv_batch(step, n, &dev)?, rank);
    }
    let k = 2 * 28 * 28;
    let x: Vec<f32> = (0..k)
        .map(|i| (((i + 131 * (step * n + rank)) * 37 % 101) as f32) / 101.0)
        .collect();
    let y: Vec<u32> = (0..2)
        .map(|i| ((i + 3 * step + rank) % 10) as u32)
        .collect();
    Ok((
        Tensor::from_vec(x, (2, 1, 28, 28), &dev)?,
        Tensor::from_vec(y, 2, &dev)?,
    ))
}

fn train(comm: &Communicator, build: Build, s: Setting) -> Result<Params, TrainError> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev), s)?;
    init(&varmap, 0.3)?;
    let opts = DdpOptions {
        bucket_bytes: 256,
        overlap: s.overlap,
        ..DdpOptions::default()
    };
    let mut ddp = Ddp::new(comm, &varmap, opts)?;
    ddp.set_compression(s.compression)?;
    let sgd = SgdConfig {
        lr: LR,
        momentum: 0.9,
        ..SgdConfig::default()
    };
    let opt: Box<dyn DynOptimizer> = if s.zero {
        Box::new(ShardedOptimizer::new(
            comm,
            ddp.params(),
            OptimizerConfig::Sgd(sgd),
        )?)
    } else {
        Box::new(kolo_ddp::optim::Sgd::new(ddp.params(), sgd)?)
    };
    let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
    let builder = |d: &Ddp| match s.compute {
        Some(c) => d.var_builder_in(c, &dev),
        None => d.var_builder(DType::F32, &dev),
    };
    let once = match build {
        Build::Once => Some(Net::new(builder(dopt.ddp()), s)?),
        Build::EveryStep => None,
    };
    dopt.set_join(s.join);
    let mine = if s.join { STEPS - comm.rank() } else { STEPS };
    // With join: this rank's uneven steps, the join, then one step on every rank (the model built
    // once must compute with what the joined rank's optimizer did while it shadowed).
    let rounds = (0..mine).chain(s.join.then_some(STEPS + 1));
    for step in rounds {
        if s.join && step == STEPS + 1 {
            dopt.join()?;
        }
        let fresh;
        let net = match &once {
            Some(n) => n,
            None => {
                fresh = Net::new(builder(dopt.ddp()), s)?;
                &fresh
            }
        };
        let (mut x, y) = batch(s, step, comm.size(), comm.rank())?;
        if let Some(c) = s.compute {
            x = x.to_dtype(c)?;
        }
        let logits = net.logits(&x)?.to_dtype(DType::F32)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        dopt.backward_step(&loss)?;
    }
    Ok(params(&varmap)?)
}

fn both(n: usize, s: Setting) {
    let once = on_ranks(n, config(), |c| train(&c, Build::Once, s));
    let every = on_ranks(n, config(), |c| train(&c, Build::EveryStep, s));
    let start = {
        let varmap = VarMap::new();
        Net::new(
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
            s,
        )
        .and_then(|_| init(&varmap, 0.3))
        .and_then(|_| params(&varmap))
        .expect("the starting values")
    };
    for r in 0..n {
        assert!(
            max_relative_difference(&every[r], &start) > 1e-3,
            "{n} ranks {s:?}: the reference did not train"
        );
        assert!(
            once[r] == every[r],
            "{n} ranks {s:?}, rank {r}: built once ends {} away from rebuilt every step",
            max_relative_difference(&once[r], &every[r])
        );
    }
}

#[test]
fn a_model_built_once_trains_like_one_rebuilt_every_step() {
    for n in [1, 2, 3] {
        for overlap in [true, false] {
            both(n, Setting { overlap, ..PLAIN });
        }
    }
}

#[test]
fn built_once_with_compression_bf16_and_zero() {
    let fp16 = Setting {
        compression: Compression::Fp16,
        ..PLAIN
    };
    let bf16 = Setting {
        compute: Some(DType::BF16),
        ..PLAIN
    };
    let zero = Setting {
        zero: true,
        ..PLAIN
    };
    for s in [fp16, bf16, zero] {
        both(2, s);
    }
    both(1, bf16);
}

#[test]
fn built_once_with_join() {
    let join = Setting {
        join: true,
        ..PLAIN
    };
    for n in [2, 3] {
        both(n, join);
        both(n, Setting { zero: true, ..join });
    }
}

/// A tiny language model whose output layer is its embedding (tied weights): the parameter is used
/// twice in every forward pass.
struct TiedLm {
    emb: Tensor,
    mix: candle_nn::Linear,
}

const VOCAB: usize = 11;
const DIM: usize = 6;

impl TiedLm {
    fn new(vb: VarBuilder) -> candle_core::Result<TiedLm> {
        let emb = vb.get((VOCAB, DIM), "emb.weight")?;
        let mix = candle_nn::linear(DIM, DIM, vb.pp("mix"))?;
        // The output layer asks for the same name again, as a tied model's head does.
        let head = vb.get((VOCAB, DIM), "emb.weight")?;
        assert_eq!(head.id(), emb.id(), "one tensor for one name");
        Ok(TiedLm { emb, mix })
    }

    fn loss(&self, tokens: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.emb.embedding(tokens)?;
        let h = self.mix.forward(&h)?.tanh()?;
        let logits = h.matmul(&self.emb.t()?)?;
        candle_nn::loss::cross_entropy(&logits, targets)
    }
}

/// Tokens and next tokens of the global batch at `step`: 4 per rank of `n`.
fn tokens(step: usize, n: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let x: Vec<u32> = (0..4 * n)
        .map(|i| ((i * 7 + step * 3) % VOCAB) as u32)
        .collect();
    let y: Vec<u32> = (0..4 * n)
        .map(|i| ((i * 5 + step + 1) % VOCAB) as u32)
        .collect();
    Ok((Tensor::new(x, &Device::Cpu)?, Tensor::new(y, &Device::Cpu)?))
}

fn tied_varmap() -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    TiedLm::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    init(&varmap, 0.5)?;
    Ok(varmap)
}

#[test]
fn tied_weights_under_overlap_equal_one_process() {
    let reference = {
        let varmap = tied_varmap().expect("vars");
        let lm =
            TiedLm::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).expect("lm");
        let mut opt = SGD::new(varmap.all_vars(), LR).expect("sgd");
        for step in 0..STEPS {
            let (x, y) = tokens(step, 2).expect("tokens");
            opt.backward_step(&lm.loss(&x, &y).expect("loss"))
                .expect("step");
        }
        params(&varmap).expect("values")
    };
    for build in [Build::Once, Build::EveryStep] {
        let got = on_ranks(2, config(), |comm| -> Result<Params, TrainError> {
            let varmap = tied_varmap()?;
            let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
            let opt = SGD::new(ddp.vars(), LR)?;
            let mut dopt = DistributedOptimizer::new(ddp, opt, 1)?;
            let once = match build {
                Build::Once => Some(TiedLm::new(
                    dopt.ddp().var_builder(DType::F32, &Device::Cpu),
                )?),
                Build::EveryStep => None,
            };
            for step in 0..STEPS {
                let fresh;
                let lm = match &once {
                    Some(lm) => lm,
                    None => {
                        fresh = TiedLm::new(dopt.ddp().var_builder(DType::F32, &Device::Cpu))?;
                        &fresh
                    }
                };
                let (x, y) = tokens(step, 2)?;
                let (x, y) = (
                    x.narrow(0, comm.rank() * 4, 4)?,
                    y.narrow(0, comm.rank() * 4, 4)?,
                );
                dopt.backward_step(&lm.loss(&x, &y)?)?;
            }
            Ok(params(&varmap)?)
        });
        for (r, p) in got.iter().enumerate() {
            let d = max_relative_difference(p, &reference);
            assert!(
                d < 1e-5,
                "{build:?}, rank {r}: {d} from the one-process reference"
            );
        }
    }
}

#[test]
fn a_model_that_missed_a_refresh_is_an_error_naming_what_to_do() {
    let errors = kolo::run_local(2, config(), |comm| -> Result<(), TrainError> {
        let varmap = VarMap::new();
        ConvNet::new(
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
            false,
        )?;
        init(&varmap, 0.3)?;
        let ddp = Ddp::new(&comm, &varmap, DdpOptions::default())?;
        let net = ConvNet::new(ddp.var_builder(DType::F32, &Device::Cpu), false)?;
        // candle's own optimizer on the Ddp's variables: kolo never sees the step.
        let mut opt = SGD::new(ddp.vars(), LR)?;
        for step in 0..STEPS {
            let (x, y) = rank_share(&conv_batch(step, 2, &Device::Cpu)?, comm.rank())?;
            let grads = ddp.backward(&net.loss(&x, &y)?)?;
            opt.step(&grads)?;
        }
        Ok(())
    });
    for (r, e) in errors.into_iter().enumerate() {
        let text = match e {
            Ok(Err(e)) => e.to_string(),
            other => panic!("rank {r}: {other:?}"),
        };
        assert!(text.contains("ddp.refresh()"), "rank {r}: {text}");
        assert!(text.contains("DistributedOptimizer"), "rank {r}: {text}");
        // The parameter by its name, not by an index.
        let named = ["conv.", "fc1.", "fc2."]
            .iter()
            .any(|p| text.contains(&format!("parameter {p}")));
        assert!(named, "rank {r}: {text}");
    }
}
