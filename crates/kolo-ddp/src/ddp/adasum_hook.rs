//! Adasum as DDP's gradient reduction (Horovod's `op=hvd.Adasum`): each bucket is combined by
//! [`Communicator::all_reduce_adasum`] per parameter (layer) instead of averaged. Identical
//! gradients come back unchanged, orthogonal ones summed, so the effective step adapts between
//! averaging and summing (Maleki et al., MLSys 2021) and, as Horovod advises, the learning rate is not
//! scaled with the number of workers. Power-of-two worlds only (as Horovod); the bucket leaves
//! asynchronously during backward like an average would.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use kolo::Communicator;

use super::comm_hook::{BucketFuture, CommHook, GradBucket, Reduction};
use crate::error::{Result, TrainError};

/// The Adasum hook (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdasumHook;

impl CommHook for AdasumHook {
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> Result<BucketFuture> {
        if bucket.reduction() == Reduction::Sum {
            return Err(TrainError::InvalidArgument {
                arg: "reduce",
                reason:
                    "Adasum cannot be combined with join (uneven inputs): a joined rank's zero \
                         gradient is not neutral under Adasum"
                        .into(),
            });
        }
        let layers = bucket.param_lengths().to_vec();
        Ok(comm
            .all_reduce_adasum_async(bucket.into_data(), layers)
            .into())
    }

    fn name(&self) -> &str {
        "adasum"
    }
}

/// How gradients are combined across ranks (`kolo train --reduce`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum GradientReduce {
    /// The average (DDP's default).
    #[default]
    Average,
    /// Adasum ([`AdasumHook`]).
    Adasum,
}

impl GradientReduce {
    /// The hook, `None` for the average.
    pub fn hook(self) -> Option<Arc<dyn CommHook>> {
        match self {
            GradientReduce::Average => None,
            GradientReduce::Adasum => Some(Arc::new(AdasumHook)),
        }
    }

    /// Whether a world of `size` ranks can reduce this way: Adasum needs a power of two.
    pub fn check_world(self, size: usize) -> Result<()> {
        if self == GradientReduce::Adasum && !size.is_power_of_two() {
            return Err(TrainError::InvalidArgument {
                arg: "reduce",
                reason: format!(
                    "Adasum needs a power-of-two number of ranks (1, 2, 4, 8, …), not {size}"
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for GradientReduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GradientReduce::Average => "average",
            GradientReduce::Adasum => "adasum",
        })
    }
}

impl FromStr for GradientReduce {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "average" | "avg" | "mean" => Ok(GradientReduce::Average),
            "adasum" => Ok(GradientReduce::Adasum),
            other => Err(TrainError::InvalidArgument {
                arg: "reduce",
                reason: format!("unknown reduction \"{other}\" (valid: average, adasum)"),
            }),
        }
    }
}
