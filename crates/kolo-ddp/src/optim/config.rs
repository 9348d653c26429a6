//! What to build: the optimizers by name ([`OptimizerKind`]) and their hyper-parameters
//! ([`SgdConfig`], [`AdamWConfig`], [`OptimizerConfig`]).

use std::fmt;
use std::str::FromStr;

use candle_core::Result;

/// The name SGD's errors start with.
const SGD: &str = "sgd";
/// The name AdamW's errors start with.
const ADAMW: &str = "adamw";

/// The optimizers [`build`](super::build) knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// [`Sgd`](super::Sgd) (`sgd`).
    Sgd,
    /// [`AdamW`](super::AdamW) (`adamw`).
    AdamW,
}

impl OptimizerKind {
    /// The canonical name (`sgd`, `adamw`).
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::AdamW => "adamw",
        }
    }

    /// PyTorch's default configuration for this kind, with learning rate `lr`.
    pub fn default_config(self, lr: f64) -> OptimizerConfig {
        match self {
            OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
                lr,
                ..SgdConfig::default()
            }),
            OptimizerKind::AdamW => OptimizerConfig::AdamW(AdamWConfig {
                lr,
                ..AdamWConfig::default()
            }),
        }
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown optimizer name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown optimizer `{0}` (expected one of: sgd, adamw)")]
pub struct UnknownOptimizer(pub String);

impl FromStr for OptimizerKind {
    type Err = UnknownOptimizer;

    /// Parses `sgd` or `adamw` (case-insensitive).
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sgd" => Ok(OptimizerKind::Sgd),
            "adamw" => Ok(OptimizerKind::AdamW),
            _ => Err(UnknownOptimizer(s.to_string())),
        }
    }
}

/// An error naming `optimizer` and the hyper-parameter `what` unless `value` is finite and
/// non-negative.
fn finite_non_negative(optimizer: &str, what: &str, value: f64) -> Result<()> {
    if !(value.is_finite() && value >= 0.0) {
        candle_core::bail!("{optimizer}: invalid {what} {value}");
    }
    Ok(())
}

/// Hyper-parameters of [`Sgd`](super::Sgd) (PyTorch's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SgdConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Momentum factor (default 0: plain SGD).
    pub momentum: f64,
    /// Dampening for momentum (default 0).
    pub dampening: f64,
    /// L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Nesterov momentum (default false; needs momentum > 0 and dampening = 0).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl SgdConfig {
    pub(super) fn validate(&self) -> Result<()> {
        finite_non_negative(SGD, "learning rate", self.lr)?;
        finite_non_negative(SGD, "momentum", self.momentum)?;
        if !self.dampening.is_finite() {
            candle_core::bail!("{SGD}: invalid dampening {}", self.dampening);
        }
        finite_non_negative(SGD, "weight decay", self.weight_decay)?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            candle_core::bail!("{SGD}: nesterov momentum requires a momentum and zero dampening");
        }
        Ok(())
    }
}

/// Hyper-parameters of [`AdamW`](super::AdamW) (PyTorch's defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AdamWConfig {
    /// Learning rate (default 1e-3).
    pub lr: f64,
    /// Decay of the first moment (default 0.9).
    pub beta1: f64,
    /// Decay of the second moment (default 0.999).
    pub beta2: f64,
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 0.01).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    pub(super) fn validate(&self) -> Result<()> {
        finite_non_negative(ADAMW, "learning rate", self.lr)?;
        finite_non_negative(ADAMW, "eps", self.eps)?;
        if !(0.0..1.0).contains(&self.beta1) {
            candle_core::bail!("{ADAMW}: invalid beta1 {} (must be in [0, 1))", self.beta1);
        }
        if !(0.0..1.0).contains(&self.beta2) {
            candle_core::bail!("{ADAMW}: invalid beta2 {} (must be in [0, 1))", self.beta2);
        }
        finite_non_negative(ADAMW, "weight decay", self.weight_decay)
    }
}

/// Configuration of any optimizer [`build`](super::build) knows.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OptimizerConfig {
    /// [`Sgd`](super::Sgd).
    Sgd(SgdConfig),
    /// [`AdamW`](super::AdamW).
    AdamW(AdamWConfig),
}

impl OptimizerConfig {
    /// SGD with learning rate `lr` and `momentum` (PyTorch's `SGD(params, lr, momentum)`; the
    /// other settings at their defaults).
    pub fn sgd(lr: f64, momentum: f64) -> OptimizerConfig {
        OptimizerConfig::Sgd(SgdConfig {
            lr,
            momentum,
            ..SgdConfig::default()
        })
    }

    /// AdamW with learning rate `lr` and `weight_decay` (PyTorch's `AdamW(params, lr,
    /// weight_decay=...)`; betas and eps at their defaults).
    pub fn adamw(lr: f64, weight_decay: f64) -> OptimizerConfig {
        OptimizerConfig::AdamW(AdamWConfig {
            lr,
            weight_decay,
            ..AdamWConfig::default()
        })
    }

    /// The optimizer kind.
    pub fn kind(&self) -> OptimizerKind {
        match self {
            OptimizerConfig::Sgd(_) => OptimizerKind::Sgd,
            OptimizerConfig::AdamW(_) => OptimizerKind::AdamW,
        }
    }

    /// The configured learning rate.
    pub fn learning_rate(&self) -> f64 {
        match self {
            OptimizerConfig::Sgd(c) => c.lr,
            OptimizerConfig::AdamW(c) => c.lr,
        }
    }
}
