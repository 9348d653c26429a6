//! Optimizer tests: PyTorch reference trajectories, state round trips, skipped variables.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor, Var};
use kolo_ddp::optim::{
    self, AdamW, AdamWConfig, DynOptimizer, OptimizerConfig, OptimizerKind, OptimizerState, Sgd,
    SgdConfig,
};

const A: [f64; 3] = [1.0, 2.0, 0.5];
const K: [f64; 3] = [0.1, -0.2, 0.3];
const W0: [f64; 3] = [0.5, -1.5, 2.0];
const U0: [f64; 2] = [1.0, -0.5];

/// The tiny problem: `w` (3), `u` (2) and `frozen` (2, never in the loss).
struct Problem {
    w: Var,
    u: Var,
    frozen: Var,
}

impl Problem {
    fn new(dtype: DType) -> Result<Self> {
        let dev = Device::Cpu;
        Ok(Self {
            w: Var::from_tensor(&Tensor::new(&W0, &dev)?.to_dtype(dtype)?)?,
            u: Var::from_tensor(&Tensor::new(&U0, &dev)?.to_dtype(dtype)?)?,
            frozen: Var::from_tensor(&Tensor::new(&[3.0f64, -4.0], &dev)?.to_dtype(dtype)?)?,
        })
    }

    fn vars(&self) -> Vec<(String, Var)> {
        vec![
            ("frozen".to_string(), self.frozen.clone()),
            ("u".to_string(), self.u.clone()),
            ("w".to_string(), self.w.clone()),
        ]
    }

    /// `sum(a·w² + k·w) + sum(u⁴)/4`: gradients `2·a·w + k` and `u³`; `frozen` gets none.
    fn grads(&self) -> Result<candle_core::backprop::GradStore> {
        let dtype = self.w.dtype();
        let a = Tensor::new(&A, &Device::Cpu)?.to_dtype(dtype)?;
        let k = Tensor::new(&K, &Device::Cpu)?.to_dtype(dtype)?;
        let w = self.w.as_tensor();
        let loss = ((w.sqr()? * a)? + (w * k)?)?.sum_all()?;
        let loss = (loss + (self.u.as_tensor().powf(4.0)?.sum_all()? / 4.0)?)?;
        loss.backward()
    }

    fn values(&self) -> Result<(Vec<f64>, Vec<f64>)> {
        let get = |v: &Var| v.as_tensor().to_dtype(DType::F64)?.to_vec1::<f64>();
        Ok((get(&self.w)?, get(&self.u)?))
    }
}

fn assert_close(actual: &[f64], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol * (1.0 + e.abs()),
            "{what}[{i}]: got {a}, expected {e}"
        );
    }
}

type Trajectory = [([f64; 3], [f64; 2]); 3];

/// Runs 3 steps and compares `w` and `u` after each with the reference; `frozen` never moves.
fn check_trajectory(
    opt: &mut dyn DynOptimizer,
    p: &Problem,
    expected: &Trajectory,
    tol: f64,
) -> Result<()> {
    let frozen = p
        .frozen
        .as_tensor()
        .to_dtype(DType::F64)?
        .to_vec1::<f64>()?;
    for (step, (w, u)) in expected.iter().enumerate() {
        opt.step(&p.grads()?)?;
        let (got_w, got_u) = p.values()?;
        assert_close(&got_w, w, tol, &format!("step {} w", step + 1));
        assert_close(&got_u, u, tol, &format!("step {} u", step + 1));
    }
    let frozen_after = p
        .frozen
        .as_tensor()
        .to_dtype(DType::F64)?
        .to_vec1::<f64>()?;
    assert_eq!(
        frozen_after, frozen,
        "a variable without gradient must not move"
    );
    assert_eq!(opt.step_count(), 3);
    Ok(())
}

// Reference values: a line-by-line pure-Python transcription of PyTorch 2.x's
// `torch.optim._single_tensor_sgd` / `_single_tensor_adamw` (foreach=False, maximize=False,
// amsgrad=False), in float64:
//
//     a = [1.0, 2.0, 0.5]; k = [0.1, -0.2, 0.3]
//     def grads(w, u): return [2*ai*wi + ki for ai, wi, ki in zip(a, w, k)], [ui**3 for ui in u]
//     def sgd(lr, momentum, dampening, wd, nesterov, steps=3):
//         w = [0.5, -1.5, 2.0]; u = [1.0, -0.5]; bufs = [None, None]; out = []
//         for _ in range(steps):
//             gs = grads(w, u); new = []
//             for j, (p, g) in enumerate(zip((w, u), gs)):
//                 d = [gi + wd*pi for gi, pi in zip(g, p)] if wd else list(g)
//                 if momentum:
//                     if bufs[j] is None: bufs[j] = list(d)
//                     else: bufs[j] = [momentum*bi + (1-dampening)*di for bi, di in zip(bufs[j], d)]
//                     d = [di + momentum*bi for di, bi in zip(d, bufs[j])] if nesterov else list(bufs[j])
//                 new.append([pi - lr*di for pi, di in zip(p, d)])
//             w, u = new; out.append((w, u))
//         return out
//     def adamw(lr, b1, b2, eps, wd, steps=3):
//         w = [0.5, -1.5, 2.0]; u = [1.0, -0.5]; m = [[0.0]*3, [0.0]*2]; v = [[0.0]*3, [0.0]*2]; out = []
//         for t in range(1, steps+1):
//             gs = grads(w, u); new = []
//             for j, (p, g) in enumerate(zip((w, u), gs)):
//                 p = [pi*(1 - lr*wd) for pi in p]
//                 m[j] = [mi + (gi - mi)*(1-b1) for mi, gi in zip(m[j], g)]   # exp_avg.lerp_
//                 v[j] = [b2*vi + (1-b2)*gi*gi for vi, gi in zip(v[j], g)]
//                 bc1 = 1 - b1**t; bc2 = 1 - b2**t; step_size = lr / bc1
//                 denom = [vi**0.5 / bc2**0.5 + eps for vi in v[j]]
//                 new.append([pi - step_size*mi/di for pi, mi, di in zip(p, m[j], denom)])
//             w, u = new; out.append((w, u))
//         return out

/// `sgd(0.1, momentum=0.9, dampening=0.1, wd=0.01, nesterov=False)`.
const SGD_MOMENTUM: Trajectory = [
    ([0.3895, -0.8785, 1.768], [0.899, -0.487]),
    (
        [0.21058945, 0.01590065, 1.3714888],
        [0.74189935709, -0.46446658273],
    ),
    (
        [0.002474323495, 0.833122690415, 0.86296038808],
        [0.563089363899, -0.434750576603],
    ),
];

/// `sgd(0.1, momentum=0.9, dampening=0, wd=0, nesterov=True)`.
const SGD_NESTEROV: Trajectory = [
    ([0.291, -0.322, 1.563], [0.81, -0.47625]),
    ([0.07232, 0.46292, 1.02273], [0.62802621, -0.44560116252]),
    (
        [-0.1095936, 0.7216088, 0.4528383],
        [0.465015697895, -0.410928065313],
    ),
];

/// `sgd(0.1, momentum=0, dampening=0, wd=0, nesterov=False)`.
const SGD_PLAIN: Trajectory = [
    ([0.39, -0.88, 1.77], [0.9, -0.4875]),
    ([0.302, -0.508, 1.563], [0.8271, -0.475914257812]),
    ([0.2316, -0.2848, 1.3767], [0.770518551349, -0.465135067299]),
];

/// `adamw(0.1, 0.9, 0.999, 1e-8, wd=0.1)`.
const ADAMW: Trajectory = [
    (
        [0.395000000909, -1.38500000016, 1.88000000043],
        [0.890000001, -0.395000008],
    ),
    (
        [0.292149376328, -1.27142482909, 1.76137544555],
        [0.783453573539, -0.298037802169],
    ),
    (
        [0.192583399324, -1.15947292157, 1.64424094021],
        [0.681992679467, -0.212492169452],
    ),
];

fn sgd_config(momentum: f64, dampening: f64, weight_decay: f64, nesterov: bool) -> SgdConfig {
    SgdConfig {
        lr: 0.1,
        momentum,
        dampening,
        weight_decay,
        nesterov,
    }
}

fn adamw_config() -> AdamWConfig {
    AdamWConfig {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    }
}

#[test]
fn sgd_matches_pytorch() -> Result<()> {
    let cases = [
        (sgd_config(0.9, 0.1, 0.01, false), &SGD_MOMENTUM),
        (sgd_config(0.9, 0.0, 0.0, true), &SGD_NESTEROV),
        (sgd_config(0.0, 0.0, 0.0, false), &SGD_PLAIN),
    ];
    for (config, expected) in cases {
        for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 2e-6)] {
            let p = Problem::new(dtype)?;
            let mut opt = Sgd::new(p.vars(), config)?;
            check_trajectory(&mut opt, &p, expected, tol)?;
        }
    }
    Ok(())
}

#[test]
fn adamw_matches_pytorch() -> Result<()> {
    for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 2e-6)] {
        let p = Problem::new(dtype)?;
        let mut opt = AdamW::new(p.vars(), adamw_config())?;
        check_trajectory(&mut opt, &p, &ADAMW, tol)?;
    }
    Ok(())
}

#[test]
fn works_through_the_candle_optimizer_trait() -> Result<()> {
    fn run<O: candle_nn::Optimizer>(config: O::Config, p: &Problem) -> Result<O> {
        let vars = vec![p.frozen.clone(), p.u.clone(), p.w.clone()];
        let mut opt = O::new(vars, config)?;
        for _ in 0..3 {
            opt.step(&p.grads()?)?;
        }
        Ok(opt)
    }
    let p = Problem::new(DType::F64)?;
    let opt: Sgd = run(sgd_config(0.9, 0.1, 0.01, false), &p)?;
    let (w, u) = p.values()?;
    assert_close(&w, &SGD_MOMENTUM[2].0, 1e-10, "w");
    assert_close(&u, &SGD_MOMENTUM[2].1, 1e-10, "u");
    // Unnamed variables are named by position.
    assert_eq!(opt.names(), ["0", "1", "2"]);

    let p = Problem::new(DType::F64)?;
    let _: AdamW = run(adamw_config(), &p)?;
    let (w, u) = p.values()?;
    assert_close(&w, &ADAMW[2].0, 1e-10, "w");
    assert_close(&u, &ADAMW[2].1, 1e-10, "u");

    // backward_step, the trait's convenience method, goes through step().
    let p = Problem::new(DType::F64)?;
    let mut opt =
        <Sgd as candle_nn::Optimizer>::new(vec![p.w.clone()], sgd_config(0.0, 0.0, 0.0, false))?;
    let loss = p.w.as_tensor().sum_all()?;
    candle_nn::Optimizer::backward_step(&mut opt, &loss)?;
    assert_close(
        &p.values()?.0,
        &[0.4, -1.6, 1.9],
        1e-12,
        "w after backward_step",
    );
    Ok(())
}

fn as_map(state: Vec<(String, Tensor)>) -> HashMap<String, Tensor> {
    state.into_iter().collect()
}

/// Runs 2 steps, saves the state, continues 1 step; then loads the saved state into a fresh
/// optimizer over fresh variables holding the same 2-step values, runs 1 step: identical.
fn round_trip(config: OptimizerConfig) -> Result<()> {
    let p = Problem::new(DType::F32)?;
    let mut opt = optim::build(p.vars(), config)?;
    opt.step(&p.grads()?)?;
    opt.step(&p.grads()?)?;
    let saved = as_map(opt.state());
    let saved_count = opt.step_count();
    let (w2, u2) = p.values()?;
    opt.step(&p.grads()?)?;
    let expected = p.values()?;

    let q = Problem::new(DType::F32)?;
    q.w.set(&Tensor::new(w2.as_slice(), &Device::Cpu)?.to_dtype(DType::F32)?)?;
    q.u.set(&Tensor::new(u2.as_slice(), &Device::Cpu)?.to_dtype(DType::F32)?)?;
    let mut fresh = optim::build(q.vars(), config)?;
    fresh.load_state(&saved)?;
    fresh.set_step_count(saved_count);
    fresh.step(&q.grads()?)?;
    assert_eq!(
        q.values()?,
        expected,
        "{:?}: resumed run differs",
        config.kind()
    );
    assert_eq!(fresh.step_count(), 3);

    // Without the state, the resumed step is different (the state matters).
    let r = Problem::new(DType::F32)?;
    r.w.set(&Tensor::new(w2.as_slice(), &Device::Cpu)?.to_dtype(DType::F32)?)?;
    r.u.set(&Tensor::new(u2.as_slice(), &Device::Cpu)?.to_dtype(DType::F32)?)?;
    let mut stateless = optim::build(r.vars(), config)?;
    stateless.step(&r.grads()?)?;
    assert_ne!(
        r.values()?,
        expected,
        "{:?}: state made no difference",
        config.kind()
    );
    Ok(())
}

#[test]
fn state_round_trip_resumes_exactly() -> Result<()> {
    round_trip(OptimizerConfig::Sgd(sgd_config(0.9, 0.1, 0.01, false)))?;
    round_trip(OptimizerConfig::Sgd(sgd_config(0.9, 0.0, 0.0, true)))?;
    round_trip(OptimizerConfig::AdamW(adamw_config()))?;
    Ok(())
}

#[test]
fn state_names_and_values() -> Result<()> {
    let p = Problem::new(DType::F64)?;
    let mut opt = Sgd::new(p.vars(), sgd_config(0.9, 0.0, 0.0, false))?;
    let names = |s: Vec<(String, Tensor)>| -> Vec<String> {
        let mut n: Vec<String> = s.into_iter().map(|(n, _)| n).collect();
        n.sort();
        n
    };
    let expected = [
        "momentum.frozen",
        "momentum.u",
        "momentum.w",
        "step.frozen",
        "step.u",
        "step.w",
    ];
    assert_eq!(names(opt.state()), expected);
    opt.step(&p.grads()?)?;
    let state = as_map(opt.state());
    let step = |name: &str| -> Result<f64> {
        match state.get(name) {
            Some(t) => t.to_scalar::<f64>(),
            None => panic!("no {name}"),
        }
    };
    assert_eq!(step("step.w")?, 1.0);
    assert_eq!(step("step.frozen")?, 0.0);
    // The first momentum buffer is the gradient itself: 2·a·w + k.
    let buf = state.get("momentum.w").map(|t| t.to_vec1::<f64>());
    let expected_grad: Vec<f64> = (0..3).map(|i| 2.0 * A[i] * W0[i] + K[i]).collect();
    match buf {
        Some(b) => assert_close(&b?, &expected_grad, 1e-12, "momentum.w"),
        None => panic!("no momentum.w"),
    }

    // Plain SGD keeps only step counts.
    let plain = Sgd::new(p.vars(), sgd_config(0.0, 0.0, 0.0, false))?;
    assert_eq!(names(plain.state()), ["step.frozen", "step.u", "step.w"]);

    let adamw = AdamW::new(p.vars(), adamw_config())?;
    assert_eq!(
        names(adamw.state()),
        [
            "exp_avg.frozen",
            "exp_avg.u",
            "exp_avg.w",
            "exp_avg_sq.frozen",
            "exp_avg_sq.u",
            "exp_avg_sq.w",
            "step.frozen",
            "step.u",
            "step.w"
        ]
    );
    Ok(())
}

fn load_error(opt: &mut dyn DynOptimizer, state: &HashMap<String, Tensor>) -> String {
    match opt.load_state(state) {
        Ok(()) => panic!("loading a bad state must fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_state_is_rejected_with_the_offending_name() -> Result<()> {
    for config in [
        OptimizerConfig::Sgd(sgd_config(0.9, 0.0, 0.0, false)),
        OptimizerConfig::AdamW(adamw_config()),
    ] {
        let p = Problem::new(DType::F32)?;
        let mut opt = optim::build(p.vars(), config)?;
        opt.step(&p.grads()?)?;
        let good = as_map(opt.state());
        let state_key = match config.kind() {
            OptimizerKind::Sgd => "momentum.u",
            OptimizerKind::AdamW => "exp_avg_sq.u",
        };

        let mut fresh = optim::build(Problem::new(DType::F32)?.vars(), config)?;
        // Missing name.
        let mut missing = good.clone();
        missing.remove(state_key);
        let err = load_error(fresh.as_mut(), &missing);
        assert!(err.contains(state_key) && err.contains("missing"), "{err}");
        let mut missing_step = good.clone();
        missing_step.remove("step.w");
        let err = load_error(fresh.as_mut(), &missing_step);
        assert!(err.contains("step.w"), "{err}");
        // Unknown name.
        let mut unknown = good.clone();
        unknown.insert(
            "momentum.nope".to_string(),
            Tensor::zeros(2, DType::F32, &Device::Cpu)?,
        );
        let err = load_error(fresh.as_mut(), &unknown);
        assert!(
            err.contains("momentum.nope") && err.contains("unknown"),
            "{err}"
        );
        // Shape mismatch.
        let mut wrong = good.clone();
        wrong.insert(
            state_key.to_string(),
            Tensor::zeros(3, DType::F32, &Device::Cpu)?,
        );
        let err = load_error(fresh.as_mut(), &wrong);
        assert!(err.contains(state_key) && err.contains("shape"), "{err}");
        // Invalid step count.
        let mut bad_step = good.clone();
        bad_step.insert("step.u".to_string(), Tensor::new(1.5f64, &Device::Cpu)?);
        let err = load_error(fresh.as_mut(), &bad_step);
        assert!(err.contains("step.u"), "{err}");

        // A failed load leaves the optimizer untouched: it still behaves like a fresh one.
        let q = Problem::new(DType::F32)?;
        let mut reference = optim::build(q.vars(), config)?;
        let r = Problem::new(DType::F32)?;
        let mut after_failures = optim::build(r.vars(), config)?;
        let _ = load_error(after_failures.as_mut(), &missing);
        reference.step(&q.grads()?)?;
        after_failures.step(&r.grads()?)?;
        assert_eq!(q.values()?, r.values()?);
        // And the good state loads.
        fresh.load_state(&good)?;
    }
    Ok(())
}

#[test]
fn learning_rate_can_be_changed() -> Result<()> {
    for config in [
        OptimizerConfig::Sgd(sgd_config(0.9, 0.0, 0.01, false)),
        OptimizerConfig::AdamW(adamw_config()),
    ] {
        let p = Problem::new(DType::F64)?;
        let mut opt = optim::build(p.vars(), config)?;
        assert_eq!(opt.learning_rate(), 0.1);
        opt.set_learning_rate(0.0);
        assert_eq!(opt.learning_rate(), 0.0);
        let before = p.values()?;
        opt.step(&p.grads()?)?;
        assert_eq!(
            p.values()?,
            before,
            "{:?}: lr 0 must not move anything",
            config.kind()
        );
        opt.set_learning_rate(0.1);
        opt.step(&p.grads()?)?;
        assert_ne!(p.values()?, before);
    }
    Ok(())
}

#[test]
fn steps_build_no_autograd_graph() -> Result<()> {
    let p = Problem::new(DType::F32)?;
    let mut opt = AdamW::new(p.vars(), adamw_config())?;
    opt.step(&p.grads()?)?;
    let mut sgd = Sgd::new(p.vars(), sgd_config(0.9, 0.0, 0.01, true))?;
    sgd.step(&p.grads()?)?;
    for (name, t) in opt.state().into_iter().chain(sgd.state()) {
        assert!(!t.track_op(), "state {name} carries an autograd graph");
    }
    Ok(())
}

#[test]
fn kinds_and_configs() -> Result<()> {
    assert_eq!("sgd".parse::<OptimizerKind>(), Ok(OptimizerKind::Sgd));
    assert_eq!("AdamW".parse::<OptimizerKind>(), Ok(OptimizerKind::AdamW));
    let err = "adam"
        .parse::<OptimizerKind>()
        .expect_err("adam is not supported");
    assert!(err.to_string().contains("adam"));
    for kind in [OptimizerKind::Sgd, OptimizerKind::AdamW] {
        assert_eq!(kind.to_string().parse::<OptimizerKind>(), Ok(kind));
        let config = kind.default_config(0.05);
        assert_eq!(config.kind(), kind);
        assert_eq!(config.learning_rate(), 0.05);
        let opt = optim::build(Problem::new(DType::F32)?.vars(), config)?;
        assert_eq!(opt.kind(), kind);
        // Configs survive JSON (the training-state file).
        let json = serde_json::to_string(&config).map_err(candle_core::Error::wrap)?;
        let back: OptimizerConfig =
            serde_json::from_str(&json).map_err(candle_core::Error::wrap)?;
        assert_eq!(back, config);
    }
    // PyTorch's defaults.
    assert_eq!(
        AdamWConfig::default(),
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01
        }
    );
    Ok(())
}

#[test]
fn invalid_configs_and_variables_are_rejected() -> Result<()> {
    let vars = Problem::new(DType::F32)?.vars();
    let bad_sgd = [
        sgd_config(0.0, 0.0, 0.0, true), // nesterov without momentum
        sgd_config(0.9, 0.1, 0.0, true), // nesterov with dampening
        sgd_config(-0.1, 0.0, 0.0, false),
        sgd_config(0.9, 0.0, -1.0, false),
        SgdConfig {
            lr: f64::NAN,
            ..SgdConfig::default()
        },
    ];
    for config in bad_sgd {
        assert!(Sgd::new(vars.clone(), config).is_err(), "{config:?}");
    }
    for config in [
        AdamWConfig {
            beta1: 1.0,
            ..AdamWConfig::default()
        },
        AdamWConfig {
            beta2: -0.1,
            ..AdamWConfig::default()
        },
        AdamWConfig {
            eps: -1.0,
            ..AdamWConfig::default()
        },
        AdamWConfig {
            lr: -1.0,
            ..AdamWConfig::default()
        },
    ] {
        assert!(AdamW::new(vars.clone(), config).is_err(), "{config:?}");
    }
    // Duplicate names and integer variables.
    let mut dup = vars.clone();
    dup.push(dup[0].clone());
    let err = Sgd::new(dup, SgdConfig::default()).expect_err("duplicate names");
    assert!(err.to_string().contains("frozen"), "{err}");
    let int_var = Var::from_tensor(&Tensor::new(&[1u32, 2], &Device::Cpu)?)?;
    let err = AdamW::new(vec![("ids".into(), int_var)], AdamWConfig::default())
        .expect_err("integer variable");
    assert!(err.to_string().contains("ids"), "{err}");
    Ok(())
}

#[test]
fn model_training_state_round_trip_through_safetensors() -> Result<()> {
    // What a checkpoint does: save state tensors to a file, load them back into a fresh
    // optimizer.
    let p = Problem::new(DType::F32)?;
    let mut opt = optim::build(p.vars(), OptimizerConfig::AdamW(adamw_config()))?;
    opt.step(&p.grads()?)?;
    let dir = tempfile::tempdir().map_err(candle_core::Error::wrap)?;
    let path = dir.path().join("optim.safetensors");
    candle_core::safetensors::save(&as_map(opt.state()), &path)?;
    let loaded = candle_core::safetensors::load(&path, &Device::Cpu)?;
    let mut fresh = optim::build(p.vars(), OptimizerConfig::AdamW(adamw_config()))?;
    fresh.load_state(&loaded)?;
    let a = as_map(opt.state());
    for (name, t) in fresh.state() {
        let expected = a
            .get(&name)
            .map(|e| e.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>());
        let got = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        match expected {
            Some(e) => assert_eq!(got, e?, "{name}"),
            None => panic!("unexpected {name}"),
        }
    }
    Ok(())
}
