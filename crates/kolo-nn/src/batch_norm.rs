//! Batch normalization, local or synchronized over the ranks of a [`Communicator`], and the
//! names of the buffers it keeps ([`is_buffer_name`]).

use candle_core::{DType, ModuleT, Result, Tensor, Var};
use candle_nn::{Init, VarBuilder};
use kolo::Communicator;

use crate::autograd::all_reduce_sum;
use crate::ops::{self, BatchStats};

/// The name (last component) of a [`BatchNorm`]'s running mean in its `VarMap`.
pub const RUNNING_MEAN: &str = "running_mean";
/// The name (last component) of a [`BatchNorm`]'s running variance in its `VarMap`.
pub const RUNNING_VAR: &str = "running_var";

/// Whether a `VarMap` entry named `name` is a non-trainable buffer rather than a parameter: the
/// running statistics of a [`BatchNorm`] (candle-nn's names too), whose last dot-separated
/// component is [`RUNNING_MEAN`] or [`RUNNING_VAR`] (`layer1.0.bn1.running_var`, or
/// `running_mean` for a layer built at the root). A parameter whose name merely ends so
/// (`head.skip_running_mean`) is a parameter.
pub fn is_buffer_name(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    last == RUNNING_MEAN || last == RUNNING_VAR
}

/// Settings of a [`BatchNorm`]; the default is PyTorch's (`eps` 1e-5, `momentum` 0.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormConfig {
    /// Added to the variance before its square root.
    pub eps: f64,
    /// Weight of the batch statistics in the running statistics' moving average, in `[0, 1]`.
    pub momentum: f64,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        Self {
            eps: 1e-5,
            momentum: 0.1,
        }
    }
}

/// Batch normalization over dimension 1 of `[B, C, …]` inputs (`[B, C]`, `[B, C, H, W]`, …),
/// PyTorch's `BatchNorm1d`/`BatchNorm2d`, or `SyncBatchNorm` once [synchronized].
///
/// The math, parameters and names are those of candle-nn's `BatchNorm` with PyTorch's defaults:
/// `weight` (γ, ones), `bias` (β, zeros), running statistics `running_mean` (zeros) and
/// `running_var` (ones) as candle `Var`s, `eps` 1e-5, `momentum` 0.1. In training mode the
/// batch mean and (biased) variance of each channel normalize the input and the running
/// statistics move towards the batch mean and the *unbiased* batch variance
/// (`running = (1 − momentum)·running + momentum·batch`); in eval mode the running statistics
/// normalize the input.
///
/// A synchronized layer ([`BatchNorm::synchronize`], PyTorch's `SyncBatchNorm`) computes the
/// statistics of the *global* batch: every rank sums, per channel, its element count, `Σx` and
/// `Σx²` (in f64, [`ops::batch_norm_stats`]) and one [`all_reduce_sum`] per layer combines them
/// before they normalize ([`ops::batch_norm_train_with_stats`]); the backward pass of that
/// all-reduce sums the gradients of the statistics over the ranks, so inputs, weights and
/// biases get the gradients of one process holding the whole batch. Running statistics are
/// updated identically on every rank. Eval mode stays local.
///
/// Empty batches are allowed: a rank with no samples contributes zeros to both all-reduces
/// (and gets an empty output), so the other ranks neither hang nor see NaN. If the global batch
/// is empty the running statistics are left alone; a global batch of a single value per
/// channel is an error in training mode (its variance is undefined), as in PyTorch. (In a whole
/// model, the backward pass of an empty rank only reaches the layer if the ops after it keep
/// empty tensors in the graph; candle's `matmul` of an empty batch returns unconnected zeros.)
///
/// [synchronized]: BatchNorm::synchronize
#[derive(Clone, Debug)]
pub struct BatchNorm {
    num_features: usize,
    running_mean: Var,
    running_var: Var,
    weight: Tensor,
    bias: Tensor,
    config: BatchNormConfig,
    comm: Option<Communicator>,
}

impl BatchNorm {
    /// A local layer for `num_features` channels with PyTorch's defaults; creates or loads
    /// `weight`, `bias`, `running_mean` and `running_var` under `vb`'s prefix.
    pub fn new(num_features: usize, vb: VarBuilder) -> Result<Self> {
        Self::with_config(num_features, BatchNormConfig::default(), vb)
    }

    /// [`BatchNorm::new`] with other settings; errors on a negative `eps` or a `momentum`
    /// outside `[0, 1]`.
    pub fn with_config(
        num_features: usize,
        config: BatchNormConfig,
        vb: VarBuilder,
    ) -> Result<Self> {
        if config.eps.is_nan() || config.eps < 0.0 {
            candle_core::bail!("batch norm: eps must be non-negative, got {}", config.eps);
        }
        if !(0.0..=1.0).contains(&config.momentum) {
            candle_core::bail!(
                "batch norm: momentum must be in [0, 1], got {}",
                config.momentum
            );
        }
        if num_features == 0 {
            candle_core::bail!("batch norm: the number of channels must be positive");
        }
        let running_mean = vb.get_with_hints(num_features, RUNNING_MEAN, Init::Const(0.))?;
        let running_var = vb.get_with_hints(num_features, RUNNING_VAR, Init::Const(1.))?;
        let weight = vb.get_with_hints(num_features, "weight", Init::Const(1.))?;
        let bias = vb.get_with_hints(num_features, "bias", Init::Const(0.))?;
        Ok(Self {
            num_features,
            // A tensor that already is a `Var` (as a `VarMap`'s are) is shared, not copied: the
            // updates reach the map.
            running_mean: Var::from_tensor(&running_mean)?,
            running_var: Var::from_tensor(&running_var)?,
            weight,
            bias,
            config,
            comm: None,
        })
    }

    /// kolo's layer in place of candle-nn's `bn` (PyTorch's `SyncBatchNorm.convert_sync_batchnorm`
    /// for one layer): the same running statistics (shared when they are a `VarMap`'s variables,
    /// so updates reach the map), weight and bias (ones and zeros, not trained, where `bn` has
    /// none), `eps` and `momentum`. Then [`BatchNorm::synchronize`] makes it a `SyncBatchNorm`.
    ///
    /// ```
    /// # use candle_core::{DType, Device, Tensor};
    /// # use candle_nn::{VarBuilder, VarMap};
    /// # fn main() -> candle_core::Result<()> {
    /// let varmap = VarMap::new();
    /// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    /// let theirs = candle_nn::batch_norm(4, candle_nn::BatchNormConfig::default(), vb.pp("bn"))?;
    /// let mine = kolo_nn::batch_norm::BatchNorm::from_candle(&theirs)?;
    /// // mine.synchronize(&comm); // SyncBatchNorm over the ranks of a kolo Communicator
    /// let x = Tensor::arange(0f32, 16., &Device::Cpu)?.reshape((4, 4))?;
    /// let (a, b) = (theirs.forward_train(&x)?, mine.forward_train(&x)?);
    /// assert!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
    /// # Ok(()) }
    /// ```
    pub fn from_candle(bn: &candle_nn::BatchNorm) -> Result<Self> {
        let num_features = bn.running_mean().dims1()?;
        let config = BatchNormConfig {
            eps: bn.eps(),
            momentum: bn.momentum(),
        };
        let (weight, bias) = match bn.weight_and_bias() {
            Some((w, b)) => (w.clone(), b.clone()),
            None => {
                let like = bn.running_mean();
                (like.ones_like()?, like.zeros_like()?)
            }
        };
        Ok(Self {
            num_features,
            running_mean: Var::from_tensor(bn.running_mean())?,
            running_var: Var::from_tensor(bn.running_var())?,
            weight,
            bias,
            config,
            comm: None,
        })
    }

    /// Makes this a synchronized (`SyncBatchNorm`) layer: training-mode statistics are those
    /// of the batches of all ranks of `comm` together. Every rank must synchronize the same
    /// layers.
    pub fn synchronize(&mut self, comm: &Communicator) {
        self.comm = Some(comm.clone());
    }

    /// Makes this a local layer again.
    pub fn desynchronize(&mut self) {
        self.comm = None;
    }

    /// The communicator the statistics are synchronized over, if any.
    pub fn communicator(&self) -> Option<&Communicator> {
        self.comm.as_ref()
    }

    /// Number of channels.
    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// The settings.
    pub fn config(&self) -> BatchNormConfig {
        self.config
    }

    /// The running mean (`[C]`).
    pub fn running_mean(&self) -> &Tensor {
        self.running_mean.as_tensor()
    }

    /// The running variance (`[C]`).
    pub fn running_var(&self) -> &Tensor {
        self.running_var.as_tensor()
    }

    /// γ (`[C]`).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// β (`[C]`).
    pub fn bias(&self) -> &Tensor {
        &self.bias
    }

    /// `[1, C, 1, …]` for broadcasting a per-channel vector over `x`.
    fn channel_shape(x: &Tensor) -> Vec<usize> {
        x.dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if i == 1 { d } else { 1 })
            .collect()
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        if x.rank() < 2 || x.dim(1)? != self.num_features {
            candle_core::bail!(
                "batch norm: expected input of shape [B, {}, …], got {:?}",
                self.num_features,
                x.shape()
            );
        }
        if !matches!(x.dtype(), DType::F32 | DType::F64) {
            candle_core::bail!(
                "batch norm: input must be f32, f64, bf16 or f16, not {:?}",
                x.dtype()
            );
        }
        Ok(())
    }

    /// `x·scale + shift` with per-channel `scale` and `shift` (`[C]`).
    fn affine(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
        let shape = Self::channel_shape(x);
        x.broadcast_mul(&scale.reshape(shape.as_slice())?)?
            .broadcast_add(&shift.reshape(shape.as_slice())?)
    }

    /// Normalizes with the batch statistics (global ones if synchronized) and updates the
    /// running statistics.
    pub fn forward_train(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_fused(x, None, false, true)
    }

    /// `act(bn(x) + residual)`: this layer (training or evaluation mode per `train`), then the
    /// optional `residual` (`x`'s shape) added and ReLU applied when `relu` — a ResNet block's
    /// tail in one op on CPU f32 / f64 ([`ops::batch_norm_train`]), the same as
    /// `relu(bn.forward_t(x, train)? + residual)` but without the intermediate tensors.
    pub fn forward_fused(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        relu: bool,
        train: bool,
    ) -> Result<Tensor> {
        if let Some(y) = self.in_f32(x, residual, relu, train)? {
            return Ok(y);
        }
        let y = if train {
            self.check_input(x)?;
            let (w, b, eps) = (&self.weight, &self.bias, self.config.eps);
            if self.comm.is_none() {
                if let Some((y, stats)) = ops::batch_norm_train(x, w, b, residual, relu, eps)? {
                    self.update_from(&stats, x)?;
                    return Ok(y);
                }
            }
            // The statistics of the batch — of the global batch, all-reduced, when synchronized.
            let stats = ops::batch_norm_stats(x)?;
            let stats = match &self.comm {
                Some(comm) => stats.map(|s| all_reduce_sum(s, comm))?,
                None => stats,
            };
            if let Some((y, batch)) =
                ops::batch_norm_train_with_stats(x, w, b, residual, relu, eps, &stats)?
            {
                self.update_from(&batch, x)?;
                return Ok(y);
            }
            self.forward_train_composed(x, stats.tensor())?
        } else {
            self.forward_eval(x)?
        };
        let y = match residual {
            Some(r) => (y + r)?,
            None => y,
        };
        if relu {
            ops::relu(&y)
        } else {
            Ok(y)
        }
    }

    /// An error for a training batch of a single value per channel (over all ranks when
    /// synchronized), whose variance is undefined.
    fn check_count(&self, n: f64, x: &Tensor) -> Result<()> {
        if n == 1.0 {
            candle_core::bail!(
                "batch norm: expected more than 1 value per channel when training, got input {:?}{}",
                x.dims(),
                if self.comm.is_some() { " (over all ranks)" } else { "" }
            );
        }
        Ok(())
    }

    /// The running statistics updated from a batch's.
    fn update_from(&self, stats: &BatchStats, x: &Tensor) -> Result<()> {
        let n = stats.count;
        self.check_count(n, x)?;
        if n > 1.0 {
            let (c, device) = (self.num_features, x.device());
            let mean = Tensor::from_vec(stats.mean.clone(), c, device)?;
            let unbiased: Vec<f64> = stats.var.iter().map(|v| v * n / (n - 1.0)).collect();
            self.update_running_stats(&mean, &Tensor::from_vec(unbiased, c, device)?)?;
        }
        Ok(())
    }

    /// Training mode composed from candle ops (devices and dtypes the fused op does not take),
    /// normalizing with `stats` (`[count, Σx…, Σx²…]`, [`ops::batch_norm_stats`]).
    fn forward_train_composed(&self, x: &Tensor, stats: &Tensor) -> Result<Tensor> {
        let c = self.num_features;
        let n = stats.get(0)?.to_scalar::<f64>()?;
        self.check_count(n, x)?;
        // An empty global batch gives an empty output; dividing by 1 keeps NaN out of the graph.
        let divisor = n.max(1.0);
        let mean = (stats.narrow(0, 1, c)? / divisor)?;
        let mean_sq = (stats.narrow(0, 1 + c, c)? / divisor)?;
        // Biased variance; rounding can make E[x²] − E[x]² slightly negative.
        let var = (mean_sq - mean.sqr()?)?.relu()?;

        if n > 1.0 {
            self.update_running_stats(&mean.detach(), &(var.detach() * (n / (n - 1.0)))?)?;
        }

        let dtype = x.dtype();
        let inv_std = (var + self.config.eps)?.sqrt()?.recip()?.to_dtype(dtype)?;
        let mean = mean.to_dtype(dtype)?;
        let scale = (self.weight.to_dtype(dtype)? * inv_std)?;
        let shift = (self.bias.to_dtype(dtype)? - (mean * &scale)?)?;
        if x.elem_count() == 0 {
            return Self::empty_output(x, &scale, &shift);
        }
        Self::affine(x, &scale, &shift)
    }

    /// The (empty) output for an empty input, still depending on the statistics.
    ///
    /// candle's arithmetic on an empty tensor returns its left operand unchanged, so
    /// [`Self::affine`] would cut `scale` and `shift` — and with them the all-reduce of the
    /// statistics — out of this rank's graph: its backward pass would skip the all-reduce the
    /// other ranks wait in. A concatenation keeps every argument in the graph.
    fn empty_output(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
        let parts = [
            x.flatten_all()?,
            scale.narrow(0, 0, 0)?,
            shift.narrow(0, 0, 0)?,
        ];
        Tensor::cat(&parts, 0)?.reshape(x.shape())
    }

    fn update_running_stats(&self, mean: &Tensor, unbiased_var: &Tensor) -> Result<()> {
        let m = self.config.momentum;
        for (running, batch) in [
            (&self.running_mean, mean),
            (&self.running_var, unbiased_var),
        ] {
            let old = running.as_detached_tensor();
            let new = ((&old * (1.0 - m))? + (batch.to_dtype(old.dtype())? * m)?)?;
            running.set(&new)?;
        }
        Ok(())
    }

    /// Half-precision input (bf16, f16): as autocast does, the layer runs in f32 — a batch's
    /// statistics and their normalization lose too much to bf16's 8-bit mantissa — on the input,
    /// residual, γ and β cast to f32 (casts that backward passes through), and hands its output
    /// back in the input's dtype. The running statistics are f32 either way. `None` for f32 / f64.
    fn in_f32(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        relu: bool,
        train: bool,
    ) -> Result<Option<Tensor>> {
        let dtype = x.dtype();
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Ok(None);
        }
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        let layer = BatchNorm {
            weight: f32(&self.weight)?,
            bias: f32(&self.bias)?,
            ..self.clone()
        };
        let residual = residual.map(f32).transpose()?;
        let y = layer.forward_fused(&f32(x)?, residual.as_ref(), relu, train)?;
        y.to_dtype(dtype).map(Some)
    }

    /// Normalizes with the running statistics (always local).
    pub fn forward_eval(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.in_f32(x, None, false, false)? {
            return Ok(y);
        }
        self.check_input(x)?;
        let dtype = x.dtype();
        let mean = self.running_mean.as_detached_tensor().to_dtype(dtype)?;
        let var = self.running_var.as_detached_tensor().to_dtype(dtype)?;
        let scale = (self.weight.to_dtype(dtype)? * (var + self.config.eps)?.sqrt()?.recip()?)?;
        let shift = (self.bias.to_dtype(dtype)? - (mean * &scale)?)?;
        Self::affine(x, &scale, &shift)
    }
}

impl ModuleT for BatchNorm {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if train {
            self.forward_train(x)
        } else {
            self.forward_eval(x)
        }
    }
}
