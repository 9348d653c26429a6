//! The compute profile of one rank's training step: forward, backward (with the time each
//! parameter's gradient becomes ready), optimizer step, and the other per-step work.
//!
//! # How a profile is measured ([`measure`])
//!
//! A short single-process run of the real training step, as `kolo train` runs it (model rebuilt from
//! a `VarBuilder`, forward, cross-entropy, backward, SGD with momentum), on random inputs. Every
//! trainable parameter is wrapped in DDP's gradient hook ([`kolo_ddp::ddp::gradient_hooks`]), here
//! recording the instant the parameter's complete gradient arrives — where DDP launches bucket
//! all-reduces — so gradient-ready times are measured per parameter, not apportioned by FLOPs. The
//! wrapping copies each parameter, as in DDP. Each phase is timed for `steps` steps after one
//! warm-up; the profile keeps the median of each phase and of each ready time. The reduction cost γ is
//! the median time per byte of summing two 4 MiB f32 buffers. The standard deviation of the step's
//! compute time is kept too: ranks wait for the slowest at every step, which costs jitter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};

use super::error::SimError;
use kolo_ddp::ddp::{gradient_hooks, OnGradient};
use kolo_ddp::optim::{Sgd, SgdConfig};
use kolo_models::{self as models, ModelKind};

/// One trainable parameter (a gradient DDP all-reduces).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamProfile {
    /// Parameter name (DDP orders parameters by name).
    pub name: String,
    /// Elements.
    pub numel: usize,
    /// Seconds from the start of backward until its gradient is complete.
    pub ready_s: f64,
}

/// The measured (or published) compute profile of one rank's step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// What was profiled (e.g. `lenet`, `vgg16`).
    pub model: String,
    /// Samples per rank and step.
    pub batch: usize,
    /// Compute threads the profile ran with.
    pub threads: usize,
    /// Forward pass and loss, seconds.
    pub forward_s: f64,
    /// Backward pass, seconds.
    pub backward_s: f64,
    /// Optimizer step, seconds.
    pub optimizer_s: f64,
    /// Other per-step work (batch assembly, model rebuild), seconds.
    pub other_s: f64,
    /// Bytes per gradient element.
    pub elem_bytes: usize,
    /// Reduction cost, seconds per byte reduced (γ).
    pub gamma_s_per_byte: f64,
    /// Standard deviation of one step's compute time, seconds (step-to-step jitter; 0 if unknown).
    #[serde(default)]
    pub step_sd_s: f64,
    /// Trainable parameters in DDP's order (sorted by name).
    pub params: Vec<ParamProfile>,
    /// How the numbers were obtained.
    pub method: String,
}

impl Profile {
    /// Compute seconds of one step without communication.
    pub fn compute_s(&self) -> f64 {
        self.other_s + self.forward_s + self.backward_s + self.optimizer_s
    }

    /// Gradient bytes per step.
    pub fn gradient_bytes(&self) -> usize {
        self.params.iter().map(|p| p.numel * self.elem_bytes).sum()
    }

    /// Checks that the numbers make sense (finite, non-negative, ready times within backward).
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |field: &str, value: f64| SimError::Profile {
            field: field.to_string(),
            reason: format!("must be finite and non-negative, got {value}"),
        };
        for (field, v) in [
            ("forward_s", self.forward_s),
            ("backward_s", self.backward_s),
            ("optimizer_s", self.optimizer_s),
            ("other_s", self.other_s),
            ("gamma_s_per_byte", self.gamma_s_per_byte),
            ("step_sd_s", self.step_sd_s),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(bad(field, v));
            }
        }
        if self.batch == 0 || self.threads == 0 || self.elem_bytes == 0 {
            return Err(SimError::Profile {
                field: "batch/threads/elem_bytes".into(),
                reason: "must be at least 1".into(),
            });
        }
        for p in &self.params {
            if !p.ready_s.is_finite() || p.ready_s < 0.0 || p.ready_s > self.backward_s * 1.0001 {
                return Err(SimError::Profile {
                    field: format!("params[{}].ready_s", p.name),
                    reason: format!(
                        "must lie within backward (0..={} s), got {}",
                        self.backward_s, p.ready_s
                    ),
                });
            }
        }
        Ok(())
    }

    /// The average of profiles of the same model (e.g. taken at the same time by every rank that
    /// will share a node, so that they include the contention for memory and caches): every time
    /// is averaged, parameter by parameter.
    pub fn average(profiles: &[Profile]) -> Result<Profile, SimError> {
        let Some(first) = profiles.first() else {
            return Err(SimError::Profile {
                field: "profiles".into(),
                reason: "no profile to average".into(),
            });
        };
        let k = profiles.len() as f64;
        let mut avg = first.clone();
        for (i, p) in profiles.iter().enumerate().skip(1) {
            let same = p.params.len() == first.params.len()
                && p.params
                    .iter()
                    .zip(&first.params)
                    .all(|(a, b)| a.name == b.name && a.numel == b.numel);
            if !same || p.batch != first.batch || p.elem_bytes != first.elem_bytes {
                return Err(SimError::Profile {
                    field: format!("profiles[{i}]"),
                    reason: format!(
                        "another model or batch than profiles[0] ({} batch {})",
                        first.model, first.batch
                    ),
                });
            }
        }
        let mean = |f: &dyn Fn(&Profile) -> f64| profiles.iter().map(f).sum::<f64>() / k;
        avg.forward_s = mean(&|p| p.forward_s);
        avg.backward_s = mean(&|p| p.backward_s);
        avg.optimizer_s = mean(&|p| p.optimizer_s);
        avg.other_s = mean(&|p| p.other_s);
        avg.gamma_s_per_byte = mean(&|p| p.gamma_s_per_byte);
        avg.step_sd_s = mean(&|p| p.step_sd_s);
        for (j, param) in avg.params.iter_mut().enumerate() {
            param.ready_s = mean(&|p| p.params.get(j).map_or(0.0, |q| q.ready_s));
        }
        if profiles.len() > 1 {
            avg.method = format!("average of {} profiles: {}", profiles.len(), first.method);
        }
        Ok(avg)
    }

    /// Reads a profile saved as JSON.
    pub fn load(path: &std::path::Path) -> Result<Profile, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        let p: Profile = serde_json::from_str(&text).map_err(|e| SimError::Parse {
            path: path.display().to_string(),
            source: e,
        })?;
        p.validate()?;
        Ok(p)
    }

    /// Saves the profile as pretty JSON.
    pub fn save(&self, path: &std::path::Path) -> Result<(), SimError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| SimError::Parse {
            path: path.display().to_string(),
            source: e,
        })?;
        std::fs::write(path, text).map_err(|e| SimError::Io {
            path: path.display().to_string(),
            source: e,
        })
    }
}

/// Median of a non-empty list (0 for an empty one).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Seconds per byte of an element-wise f32 sum (what a reduction step does), median of 5.
pub fn measure_gamma() -> f64 {
    let n = 1 << 20;
    let mut a = vec![1.0f32; n];
    let b = vec![0.5f32; n];
    let mut t = Vec::new();
    for _ in 0..5 {
        let s = Instant::now();
        for (x, y) in a.iter_mut().zip(&b) {
            *x += *y;
        }
        std::hint::black_box(&a);
        t.push(s.elapsed().as_secs_f64() / (n * 4) as f64);
    }
    median(&mut t)
}

/// Profiles `steps` training steps (after one warm-up) of `kind` at `batch` samples of shape
/// `input_shape` and `classes` classes, on the CPU with the current compute threads (`threads` is
/// recorded in the profile; set `RAYON_NUM_THREADS` before the first tensor operation to change it).
pub fn measure(
    kind: ModelKind,
    batch: usize,
    input_shape: [usize; 3],
    classes: usize,
    steps: usize,
    threads: usize,
) -> Result<Profile, SimError> {
    if batch == 0 || steps == 0 || classes == 0 {
        return Err(SimError::Profile {
            field: "batch/steps/classes".into(),
            reason: "must be at least 1".into(),
        });
    }
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    models::build(
        kind,
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
        input_shape,
        classes,
    )?;
    let params = kolo_nn::vars::named_parameters(&varmap);
    let index: HashMap<String, usize> = params
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.clone(), i))
        .collect();
    // The instant each parameter's gradient arrives in backward, from DDP's gradient hook.
    let ready: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; params.len()]));
    let on_gradient: OnGradient = {
        let ready = ready.clone();
        Arc::new(move |index: usize, _: &Tensor| {
            let mut r = ready.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = r.get_mut(index) {
                *slot = Some(Instant::now());
            }
            Ok(())
        })
    };
    let mut opt = Sgd::new(
        params.clone(),
        SgdConfig {
            lr: 0.01,
            momentum: 0.9,
            ..SgdConfig::default()
        },
    )?;
    let [c, h, w] = input_shape;
    let (mut fwd, mut bwd, mut optim, mut other) = (vec![], vec![], vec![], vec![]);
    let mut readies: Vec<Vec<f64>> = vec![Vec::new(); params.len()];
    for step in 0..=steps {
        let t0 = Instant::now();
        let x = Tensor::randn(0f32, 1.0, (batch, c, h, w), &dev)?;
        let y: Vec<u32> = (0..batch).map(|i| (i % classes) as u32).collect();
        let y = Tensor::from_vec(y, batch, &dev)?;
        ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .for_each(|r| *r = None);
        let vb = gradient_hooks(
            &varmap,
            index.clone(),
            on_gradient.clone(),
            DType::F32,
            &dev,
        );
        let model = models::build(kind, vb, input_shape, classes)?;
        let t1 = Instant::now();
        let logits = model.forward(&x, true)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let _ = loss.to_scalar::<f32>()?;
        let t2 = Instant::now();
        let grads = loss.backward()?;
        let t3 = Instant::now();
        opt.step(&grads)?;
        let t4 = Instant::now();
        if step == 0 {
            continue;
        }
        other.push((t1 - t0).as_secs_f64());
        fwd.push((t2 - t1).as_secs_f64());
        bwd.push((t3 - t2).as_secs_f64());
        optim.push((t4 - t3).as_secs_f64());
        let r = ready.lock().unwrap_or_else(|p| p.into_inner());
        for (i, at) in r.iter().enumerate() {
            // A parameter without a gradient is ready at the end (DDP sends zeros for it then).
            let at = at.map_or(t3 - t2, |a| a.saturating_duration_since(t2));
            readies[i].push(at.as_secs_f64());
        }
    }
    let totals: Vec<f64> = (0..fwd.len())
        .map(|i| other[i] + fwd[i] + bwd[i] + optim[i])
        .collect();
    let mean = totals.iter().sum::<f64>() / totals.len() as f64;
    let var = totals.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / totals.len() as f64;
    let backward_s = median(&mut bwd);
    Ok(Profile {
        model: kind.to_string(),
        batch,
        threads,
        forward_s: median(&mut fwd),
        backward_s,
        optimizer_s: median(&mut optim),
        other_s: median(&mut other),
        elem_bytes: 4,
        gamma_s_per_byte: measure_gamma(),
        step_sd_s: var.sqrt(),
        params: params
            .iter()
            .zip(readies.iter_mut())
            .map(|((name, var), r)| ParamProfile {
                name: name.clone(),
                numel: var.elem_count(),
                ready_s: median(r).min(backward_s),
            })
            .collect(),
        method: format!(
            "measured: {steps} steps after one warm-up, medians; per-parameter gradient-ready \
             times from a backward hook; input {c}x{h}x{w}, {classes} classes, random data"
        ),
    })
}
