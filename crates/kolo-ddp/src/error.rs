//! kolo-ddp's error type.

use std::path::PathBuf;

/// Result with [`TrainError`].
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// What can go wrong while setting up or running data-parallel training.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// Communication failed (a lost peer, a mismatch, a timeout, ...).
    #[error(transparent)]
    Comm(#[from] kolo::Error),

    /// A tensor operation failed.
    #[error("tensor: {0}")]
    Candle(#[from] candle_core::Error),

    /// Ranks hold different models.
    #[error(
        "model mismatch: rank {rank} {what} (rank 0 has {expected}, rank {rank} has {actual})"
    )]
    ModelMismatch {
        /// Rank that differs from rank 0.
        rank: usize,
        /// What differs (e.g. "parameter conv1.weight has another shape").
        what: String,
        /// Rank 0's value.
        expected: String,
        /// The other rank's value.
        actual: String,
    },

    /// Loading or reading a data set failed (`kolo_data`).
    #[error(transparent)]
    Data(#[from] kolo_data::DataError),

    /// The ranks passed different steps to [`crate::distributed::check_loss`]: one skipped a
    /// batch or stepped twice, and their gradients no longer belong to the same step.
    #[error(
        "ranks are at different steps: {}; every rank must run every step (a rank that skips a \
         batch, or steps twice, trains on gradients of another step)",
        describe_steps(.steps)
    )]
    StepsDiffer {
        /// Every rank's step, in rank order.
        steps: Vec<u64>,
    },

    /// The loss became NaN or infinite on some rank; every rank stops with this error.
    #[error("non-finite loss at step {step}: {}", describe_losses(.losses))]
    NonFiniteLoss {
        /// Global step.
        step: u64,
        /// Every rank's loss, in rank order.
        losses: Vec<f64>,
    },

    /// The ranks were about to step with different learning rates (see
    /// [`Ddp::check_learning_rate`](crate::ddp::Ddp::check_learning_rate)); every rank stops
    /// with this error before the step.
    #[error(
        "rank {rank}: the ranks step with different learning rates: {}; every rank must use the \
         same one (a rate scaled by the rank, or a schedule that reads rank-local state, gives \
         each replica other weights)",
        describe_rates(.rates)
    )]
    LearningRatesDiffer {
        /// The rank reporting.
        rank: usize,
        /// Every rank's learning rate, in rank order (`None`: a rank that checked none).
        rates: Vec<Option<f64>>,
    },

    /// The ranks hold different parameter values (see
    /// [`Ddp::check_replicas`](crate::ddp::Ddp::check_replicas)): the replicas train different
    /// models, and a checkpoint would keep only rank 0's. Every rank returns it.
    #[error(
        "rank {rank}: the replicas hold different parameters: {} from rank 0's, first `{parameter}`; \
         every rank must step the same weights with the same update (an optimizer step of one's \
         own on gradients Ddp did not average, a hyper-parameter such as weight decay set per \
         rank, or a parameter changed on some ranks only): Ddp::broadcast_parameters(0) gives \
         every rank rank 0's",
        describe_ranks(.ranks)
    )]
    ReplicasDiffer {
        /// The rank reporting.
        rank: usize,
        /// The ranks whose parameters differ from rank 0's, in rank order.
        ranks: Vec<usize>,
        /// The first parameter (in the Ddp's order) in which the first of them differs.
        parameter: String,
    },

    /// `Ddp::new` was given a `VarMap` without parameters.
    #[error(
        "rank {rank}: Ddp::new was given a VarMap without parameters: build the model once on the \
         VarMap (VarBuilder::from_varmap) before Ddp::new, so that its parameters exist"
    )]
    NoParameters {
        /// The rank that says so (every rank does).
        rank: usize,
    },

    /// A parameter received a gradient after its bucket had been sent.
    #[error("parameter {name} got a second gradient in one backward pass (is it used twice in the forward pass?); build Ddp with overlap disabled")]
    LateGradient {
        /// Parameter name.
        name: String,
    },

    /// Join mode: the all-reduced count of ranks still training is impossible (a rank that is not in
    /// join mode, or a corrupted message).
    #[error("join: rank {rank} counted {count} active ranks in a world of {size} (is join mode on on every rank?)")]
    JoinCount {
        /// Rank that saw the count.
        rank: usize,
        /// The count.
        count: i64,
        /// World size.
        size: usize,
    },

    /// Join mode is on on some ranks and off on others ([`Ddp::set_join`](crate::ddp::Ddp::set_join)
    /// called on some ranks only): their steps' first collectives differ.
    #[error(
        "join: join mode is {} on rank {rank} but {} on rank {peer}: call set_join with the same \
         value on every rank, at the same point before the loop ({source})",
        on_off(*.here),
        on_off(!*.here)
    )]
    JoinModeDiffers {
        /// Rank that noticed.
        rank: usize,
        /// The rank whose call showed the other mode.
        peer: usize,
        /// Whether join mode is on on `rank`.
        here: bool,
        /// The mismatch the two calls made.
        source: kolo::Error,
    },

    /// A communication hook returned a result that cannot be a bucket's gradients.
    #[error("communication hook {hook}: bucket {bucket}: {reason}")]
    CommHook {
        /// The hook's name.
        hook: String,
        /// The bucket.
        bucket: usize,
        /// What is wrong.
        reason: String,
    },

    /// Unsupported parameter type or layout.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported.
        what: String,
    },

    /// A checkpoint could not be written or read.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// File.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },

    /// A checkpoint's tensors could not be encoded or decoded.
    #[error("checkpoint {path}: {source}")]
    CheckpointTensors {
        /// File.
        path: PathBuf,
        /// What safetensors (through candle) reported.
        #[source]
        source: candle_core::Error,
    },

    /// A checkpoint's or a run's JSON could not be encoded or decoded.
    #[error("checkpoint {path}: {source}")]
    CheckpointJson {
        /// File.
        path: PathBuf,
        /// What serde_json reported.
        #[source]
        source: serde_json::Error,
    },

    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },

    /// A setting is invalid.
    #[error("invalid {arg}: {reason}")]
    InvalidArgument {
        /// The setting.
        arg: &'static str,
        /// Why.
        reason: String,
    },
}

fn describe_rates(rates: &[Option<f64>]) -> String {
    let each: Vec<String> = rates
        .iter()
        .enumerate()
        .map(|(r, x)| match x {
            Some(x) => format!("rank {r} {x}"),
            None => format!("rank {r} none"),
        })
        .collect();
    each.join(", ")
}

fn describe_ranks(ranks: &[usize]) -> String {
    let each: Vec<String> = ranks.iter().map(ToString::to_string).collect();
    match ranks {
        [_] => format!("rank {} differs", each.join("")),
        _ => format!("ranks {} differ", each.join(", ")),
    }
}

fn describe_losses(losses: &[f64]) -> String {
    let bad: Vec<String> = losses
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_finite())
        .map(|(r, l)| format!("rank {r} has {l}"))
        .collect();
    bad.join(", ")
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// "rank 0 at step 10, rank 1 at step 11" for the ranks whose step is not rank 0's (and rank 0).
fn describe_steps(steps: &[u64]) -> String {
    let first = steps.first().copied().unwrap_or(0);
    steps
        .iter()
        .enumerate()
        .filter(|&(r, &s)| r == 0 || s != first)
        .map(|(r, s)| format!("rank {r} at step {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The message, as `Display` writes it, not the fields: a `main` returning this error prints it so,
/// and the message is what names the rank, the call and what to do.
impl std::fmt::Debug for TrainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
