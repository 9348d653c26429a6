//! Shared by the communication hook tests: parameters whose gradients are chosen random values
//! (loss = Σ sum(p ⊙ g), so the gradient of p is exactly g and the exact average is known),
//! thread-rank runs, the 16-bit rounding bound, and a recording hook. The crate root declares
//! `mod common` (tests/common) too.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder, VarMap};
use kolo::{Communicator, Config};
use kolo_ddp::ddp::{BucketFuture, CommHook, Ddp, DdpOptions, GradBucket, Reduction};
use kolo_ddp::TrainError;

use crate::common::on_ranks;

/// Parameter names and shapes; with 40-byte buckets (10 f32) they fill several buckets.
pub const PARAMS: [(&str, &[usize]); 5] = [
    ("a", &[5]),
    ("b", &[3, 4]),
    ("c", &[7]),
    ("d", &[2, 3]),
    ("e", &[11]),
];
pub const STEPS: usize = 3;

/// Gradients of one rank: `[step][param]`.
pub type Grads = Vec<Vec<Vec<f32>>>;

/// Deterministic "random" values spanning six decades, both signs: `xorshift` of a seed.
pub fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let mantissa = 2.0 * next() - 1.0;
            let decade = 6.0 * next() - 3.0; // 1e-3 .. 1e3
            (mantissa * 10f64.powf(decade)) as f32
        })
        .collect()
}

/// Gradient source: `(rank, step, param) -> values`.
pub type Source = fn(usize, usize, usize, usize) -> Vec<f32>;

pub fn random_grads(rank: usize, step: usize, param: usize, n: usize) -> Vec<f32> {
    random((rank * 1000 + step * 10 + param) as u64 + 1, n)
}

pub fn new_varmap() -> candle_core::Result<VarMap> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    for (name, shape) in PARAMS {
        vb.get_with_hints(shape, name, Init::Const(0.0))?;
    }
    Ok(varmap)
}

/// One step: loss = Σ sum(p ⊙ g), gradients through `ddp.backward`, read back in `PARAMS` order.
pub fn step(
    ddp: &Ddp,
    source: Source,
    rank: usize,
    step: usize,
) -> Result<Vec<Vec<f32>>, TrainError> {
    let vb = ddp.var_builder(DType::F32, &Device::Cpu);
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu)?;
    for (k, (name, shape)) in PARAMS.iter().enumerate() {
        let p = vb.get(*shape, name)?;
        let g = Tensor::from_vec(source(rank, step, k, p.elem_count()), *shape, &Device::Cpu)?;
        loss = (loss + (p * g)?.sum_all()?)?;
    }
    let grads = ddp.backward(&loss)?;
    read(ddp, &grads)
}

/// The gradients of `grads`, in `PARAMS` order.
pub fn read(
    ddp: &Ddp,
    grads: &candle_core::backprop::GradStore,
) -> Result<Vec<Vec<f32>>, TrainError> {
    PARAMS
        .iter()
        .map(|(name, _)| {
            let (_, v) = ddp
                .params()
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| TrainError::Unsupported {
                    what: format!("no parameter {name}"),
                })?;
            let g = grads
                .get(v.as_tensor())
                .ok_or_else(|| TrainError::Unsupported {
                    what: format!("no gradient for {name}"),
                })?;
            Ok(g.flatten_all()?.to_vec1::<f32>()?)
        })
        .collect()
}

/// `n` thread-ranks, each setting up its Ddp with `configure` and taking `STEPS` steps; every
/// rank's gradients and what its `configure` returned.
pub fn run_with<C, X>(n: usize, opts: DdpOptions, source: Source, configure: C) -> Vec<(Grads, X)>
where
    C: Fn(&mut Ddp) -> Result<X, TrainError> + Sync,
    X: Send + std::fmt::Debug,
{
    on_ranks(
        n,
        Config::default().with_timeout(Duration::from_secs(30)),
        |comm: Communicator| -> Result<(Grads, X), TrainError> {
            let varmap = new_varmap()?;
            let mut ddp = Ddp::new(&comm, &varmap, opts)?;
            let x = configure(&mut ddp)?;
            let grads = (0..STEPS)
                .map(|s| step(&ddp, source, comm.rank(), s))
                .collect::<Result<_, _>>()?;
            Ok((grads, x))
        },
    )
}

/// [`run_with`], gradients only.
pub fn run<C>(n: usize, opts: DdpOptions, source: Source, configure: C) -> Vec<Grads>
where
    C: Fn(&mut Ddp) -> Result<(), TrainError> + Sync,
{
    run_with(n, opts, source, configure)
        .into_iter()
        .map(|(g, ())| g)
        .collect()
}

/// Bucket sizes (several buckets, one bucket) and overlap on/off.
pub const SETTINGS: [(usize, bool); 4] =
    [(40, true), (40, false), (1 << 20, true), (1 << 20, false)];

pub fn opts(bucket_bytes: usize, overlap: bool) -> DdpOptions {
    DdpOptions {
        bucket_bytes,
        overlap,
        ..DdpOptions::default()
    }
}

pub fn bits(g: &[Grads]) -> Vec<Vec<Vec<Vec<u32>>>> {
    g.iter()
        .map(|r| {
            r.iter()
                .map(|s| {
                    s.iter()
                        .map(|p| p.iter().map(|x| x.to_bits()).collect())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The largest ratio, over ranks, steps and elements, of |got − exact average| to the bound
/// `n_terms · u · Σ|g| / divisor + n_terms · tiny · world / divisor` (plus f32's own roundings),
/// where the exact average is Σ g / divisor over the `n_terms` contributing ranks in f64.
pub fn max_error_ratio(got: &[Grads], world: usize, n_terms: usize, u: f64, tiny: f64) -> f64 {
    let mut worst = 0f64;
    for (rank, r) in got.iter().enumerate() {
        assert_eq!(r, &got[0], "rank {rank} differs from rank 0");
    }
    for (s, params) in got[0].iter().enumerate() {
        for (k, values) in params.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..n_terms)
                .map(|r| random_grads(r, s, k, values.len()))
                .collect();
            worst = worst.max(ratio(values, &inputs, world, n_terms, u, tiny));
        }
    }
    worst
}

/// See [`max_error_ratio`]: one parameter, `inputs[r]` the gradients of the contributing ranks,
/// averaged over `divisor` ranks.
pub fn ratio(
    got: &[f32],
    inputs: &[Vec<f32>],
    world: usize,
    divisor: usize,
    u: f64,
    tiny: f64,
) -> f64 {
    let terms = inputs.len() as f64;
    let f32_eps = f64::powi(2.0, -24);
    let mut worst = 0f64;
    for (i, &y) in got.iter().enumerate() {
        let sum: f64 = inputs.iter().map(|g| f64::from(g[i])).sum();
        let abs: f64 = inputs.iter().map(|g| f64::from(g[i]).abs()).sum();
        let exact = sum / divisor as f64;
        let bound = (terms * u + 8.0 * f32_eps) * abs / divisor as f64
            + terms * tiny * world as f64 / divisor as f64
            + 1e-30;
        worst = worst.max((f64::from(y) - exact).abs() / bound);
    }
    worst
}

/// fp16: unit roundoff 2⁻¹¹, subnormal spacing 2⁻²⁴ (half of it per rounding); bf16: 2⁻⁸, and
/// subnormals far below these gradients.
pub const FP16: (f64, f64) = (1.0 / 2048.0, 1.0 / 33_554_432.0);
pub const BF16: (f64, f64) = (1.0 / 256.0, 0.0);

/// What a recording hook saw of one bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub index: usize,
    pub len: usize,
    pub lengths: Vec<usize>,
    pub names: Vec<String>,
    pub reduction: Reduction,
}

/// Records every bucket, then delegates to `inner` and doubles the result (so the test sees that
/// the hook's result is what backward returns).
pub struct Recorder<H> {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub inner: H,
    pub factor: f32,
}

impl<H: CommHook> CommHook for Recorder<H> {
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> kolo_ddp::Result<BucketFuture> {
        let seen = Seen {
            index: bucket.index(),
            len: bucket.len(),
            lengths: bucket.param_lengths().to_vec(),
            names: bucket.param_names().to_vec(),
            reduction: bucket.reduction(),
        };
        assert_eq!(bucket.param_lengths().iter().sum::<usize>(), bucket.len());
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(seen);
        let inner = self.inner.reduce(bucket, comm)?;
        let factor = self.factor;
        Ok(BucketFuture::deferred(move || {
            let mut v = inner.wait()?;
            v.iter_mut().for_each(|x| *x *= factor);
            Ok(v)
        }))
    }
}

/// The buckets a rank's hook must see at each step: bucket b of the layout, in buffer order.
pub fn expected_buckets(d: &Ddp, reduction: Reduction) -> Vec<Seen> {
    let layout = d.layout();
    (0..layout.count())
        .map(|b| Seen {
            index: b,
            len: layout.len[b],
            lengths: layout.buckets[b]
                .iter()
                .map(|&p| layout.slot[p].1.len())
                .collect(),
            names: layout.buckets[b]
                .iter()
                .map(|&p| d.params()[p].0.clone())
                .collect(),
            reduction,
        })
        .collect()
}

pub type Record = (Arc<Mutex<Vec<Seen>>>, Vec<Seen>);

pub fn take(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Seen> {
    std::mem::take(&mut *seen.lock().unwrap_or_else(|p| p.into_inner()))
}
