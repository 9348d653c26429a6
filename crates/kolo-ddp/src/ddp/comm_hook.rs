//! Communication hooks: what happens to a bucket of gradients between backward and the optimizer
//! (PyTorch's `DistributedDataParallel.register_comm_hook`).
//!
//! By default every bucket is averaged by an asynchronous all-reduce in f32. A [`CommHook`] replaces
//! that step: [`Ddp`](super::Ddp) hands it each bucket's flat gradients as soon as the bucket is
//! ready (during backward, with overlap on), strictly in bucket order, and the hook returns a
//! [`BucketFuture`] that the synchronizer waits on after backward. A hook that launches an
//! asynchronous collective and returns its handle keeps communication overlapping backward.
//!
//! Built in: [`AllReduceHook`] (today's behaviour, bit-identical to having no hook) and
//! [`CompressHook`] with [`Compression::Fp16`] or [`Compression::Bf16`]: the bucket is divided by
//! the world size, cast to 16 bits, all-reduced (summed) in 16 bits and cast back, halving the bytes
//! sent. [`Ddp::set_compression`](super::Ddp::set_compression) turns them on in one line, and
//! [`Compression`] parses `none`, `fp16` and `bf16`.
//!
//! # The contract
//!
//! - [`CommHook::reduce`] is called once per bucket per synchronizing pass, on every rank, in bucket
//!   order (0, 1, …), from the thread running backward (or [`Ddp::backward`](super::Ddp::backward) /
//!   [`Ddp::sync_gradients`](super::Ddp::sync_gradients) after it). It must issue the same
//!   collectives on every rank, in the same order: kolo matches collectives by their order.
//! - The future's result must hold [`GradBucket::len`] elements: the **average** over all ranks when
//!   [`GradBucket::reduction`] is [`Reduction::Average`], the **sum** when it is [`Reduction::Sum`]
//!   (join mode: the synchronizer then divides by the number of ranks still active, see
//!   [`join`](super::join); a rank that has joined contributes zeros and runs the same hook).
//! - A blocking collective may run inside the future (see [`BucketFuture::deferred`]): it then runs
//!   when the synchronizer waits for that bucket, after backward and after every collective already
//!   issued, so it is ordered the same way on every rank — but it does not overlap backward. A
//!   per-layer reduction such as Adasum is written that way, with [`GradBucket::param_lengths`]
//!   giving the layer boundaries within the bucket.
//! - Hooks see f32 buckets: they can be registered on models with f32 parameters (f64 models keep
//!   the built-in f64 average). In a world of one rank nothing is communicated and hooks are not
//!   called.
//!
//! # Writing a hook
//!
//! A closure `Fn(GradBucket, &Communicator) -> Result<BucketFuture>` is a hook. This one counts the
//! bytes each bucket sends, then averages as usual:
//!
//! ```no_run
//! # use std::sync::atomic::{AtomicUsize, Ordering};
//! # use std::sync::Arc;
//! # use kolo_ddp::ddp::{BucketFuture, Ddp, GradBucket};
//! # fn f(ddp: &mut Ddp) -> kolo_ddp::Result<()> {
//! let sent = Arc::new(AtomicUsize::new(0));
//! let counter = sent.clone();
//! ddp.register_comm_hook(move |bucket: GradBucket, comm: &kolo::Communicator| {
//!     counter.fetch_add(bucket.len() * 4, Ordering::Relaxed);
//!     // The bucket's parameters, in buffer order: names and element counts.
//!     for (name, n) in bucket.param_names().iter().zip(bucket.param_lengths().iter()) {
//!         log_once(name, *n);
//!     }
//!     // Sum or average, as the synchronizer asks; launched now, waited on after backward.
//!     let op = bucket.reduction().op();
//!     Ok(BucketFuture::from(comm.all_reduce_async(bucket.into_data(), op)))
//! })?;
//! # Ok(()) }
//! # fn log_once(_: &str, _: usize) {}
//! ```
//!
//! A per-layer reduction that needs a blocking collective (here a stand-in for an Adasum all-reduce
//! taking the layer lengths) runs it inside a deferred future:
//!
//! ```no_run
//! # use kolo_ddp::ddp::{BucketFuture, Ddp, GradBucket, Reduction};
//! # fn per_layer(_: &kolo::Communicator, _: &mut [f32], _: &[usize]) -> kolo::Result<()> { Ok(()) }
//! # fn f(ddp: &mut Ddp) -> kolo_ddp::Result<()> {
//! ddp.register_comm_hook(|bucket: GradBucket, comm: &kolo::Communicator| {
//!     let lengths = bucket.shared_param_lengths(); // one entry per parameter (layer) in the bucket
//!     let comm = comm.clone();
//!     let mut data = bucket.into_data();
//!     Ok(BucketFuture::deferred(move || {
//!         per_layer(&comm, &mut data, &lengths)?; // e.g. comm.all_reduce_adasum(&mut data, &lengths)
//!         Ok(data)
//!     }))
//! })?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use kolo::{bf16, f16, Communicator, ReduceOp, Work};

use crate::error::{Result, TrainError};

/// What the result of a bucket must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The element-wise average over all ranks (the normal case).
    Average,
    /// The element-wise sum over all ranks (join mode: the synchronizer divides by the number of
    /// active ranks afterwards).
    Sum,
}

impl Reduction {
    /// The kolo operator giving this result ([`ReduceOp::Avg`] or [`ReduceOp::Sum`]).
    pub fn op(self) -> ReduceOp {
        match self {
            Reduction::Average => ReduceOp::Avg,
            Reduction::Sum => ReduceOp::Sum,
        }
    }
}

/// The parameters of one bucket, shared by every pass.
#[derive(Debug)]
pub(crate) struct BucketParams {
    /// Indices into [`Ddp::params`](super::Ddp::params), in buffer order.
    pub indices: Vec<usize>,
    /// Element count of each parameter, in buffer order.
    pub lengths: Arc<[usize]>,
    /// Name of each parameter, in buffer order.
    pub names: Arc<[String]>,
}

/// One bucket of gradients handed to a [`CommHook`]: its flat f32 buffer (this rank's gradients of
/// the bucket's parameters, concatenated in buffer order) and what it holds.
#[derive(Debug)]
pub struct GradBucket {
    pub(crate) index: usize,
    pub(crate) data: Vec<f32>,
    pub(crate) params: Arc<BucketParams>,
    pub(crate) reduction: Reduction,
}

impl GradBucket {
    /// The bucket's index: 0 for the first bucket sent (the last parameters), then 1, 2, …
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of gradient elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the bucket holds no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// This rank's gradients.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// This rank's gradients, to change in place.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The buffer, to send (it may be returned as the result, avoiding an allocation).
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Element count of each parameter in the bucket, in buffer order: parameter `k` occupies the
    /// elements after the first `k` lengths. They add up to [`GradBucket::len`].
    pub fn param_lengths(&self) -> &[usize] {
        &self.params.lengths
    }

    /// [`GradBucket::param_lengths`] as a shared slice, to move into a [`BucketFuture`].
    pub fn shared_param_lengths(&self) -> Arc<[usize]> {
        self.params.lengths.clone()
    }

    /// Name of each parameter in the bucket, in buffer order.
    pub fn param_names(&self) -> &[String] {
        &self.params.names
    }

    /// Index of each parameter in the bucket into [`Ddp::params`](super::Ddp::params), in buffer
    /// order.
    pub fn param_indices(&self) -> &[usize] {
        &self.params.indices
    }

    /// Whether the result must be the average or the sum over ranks.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }
}

enum Inner {
    Work(Work<Vec<f32>>),
    Deferred(Box<dyn FnOnce() -> Result<Vec<f32>> + Send>),
    Ready(Result<Vec<f32>>),
}

/// The pending result of a bucket, returned by a [`CommHook`] and waited on by the synchronizer
/// after backward.
pub struct BucketFuture(Inner);

impl fmt::Debug for BucketFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            Inner::Work(w) => return f.debug_tuple("BucketFuture").field(w).finish(),
            Inner::Deferred(_) => "deferred",
            Inner::Ready(Ok(_)) => "ready",
            Inner::Ready(Err(_)) => "failed",
        };
        f.debug_tuple("BucketFuture").field(&kind).finish()
    }
}

impl BucketFuture {
    /// A result computed when the synchronizer waits for it, after backward and in bucket order:
    /// typically waits on asynchronous collectives launched by the hook and post-processes their
    /// results, or runs a blocking collective.
    pub fn deferred(f: impl FnOnce() -> Result<Vec<f32>> + Send + 'static) -> Self {
        BucketFuture(Inner::Deferred(Box::new(f)))
    }

    /// A result already known (or an error to report for this bucket).
    pub fn ready(result: Result<Vec<f32>>) -> Self {
        BucketFuture(Inner::Ready(result))
    }

    /// Waits for the result.
    pub fn wait(self) -> Result<Vec<f32>> {
        match self.0 {
            Inner::Work(w) => Ok(w.wait()?),
            Inner::Deferred(f) => f(),
            Inner::Ready(r) => r,
        }
    }
}

impl BucketFuture {
    /// [`BucketFuture::wait`]; with `timed`, also when the collective ran (known for a future made
    /// from a [`Work`]).
    pub(crate) fn wait_timed(self, timed: bool) -> (Result<Vec<f32>>, Option<kolo::WorkTimes>) {
        match self.0 {
            Inner::Work(w) if timed => {
                let (r, t) = w.wait_timed();
                (r.map_err(Into::into), Some(t))
            }
            other => (BucketFuture(other).wait(), None),
        }
    }
}

impl From<Work<Vec<f32>>> for BucketFuture {
    fn from(w: Work<Vec<f32>>) -> Self {
        BucketFuture(Inner::Work(w))
    }
}

/// What happens to each bucket of gradients between backward and the optimizer; see the
/// [module documentation](self) for the contract.
pub trait CommHook: Send + Sync {
    /// Starts reducing `bucket` over the ranks of `comm`; the returned future gives the average (or,
    /// if [`GradBucket::reduction`] says so, the sum), [`GradBucket::len`] elements.
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> Result<BucketFuture>;

    /// A short name, for error messages.
    fn name(&self) -> &str {
        "custom"
    }

    /// Bytes each rank puts into the collective for a bucket of `elements` f32 gradients, where
    /// the hook knows it (the timeline records it beside the bucket's f32 bytes); `None` for a
    /// hook that does not say.
    fn wire_bytes(&self, elements: usize) -> Option<usize> {
        let _ = elements;
        None
    }
}

impl<F> CommHook for F
where
    F: Fn(GradBucket, &Communicator) -> Result<BucketFuture> + Send + Sync,
{
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> Result<BucketFuture> {
        self(bucket, comm)
    }
}

/// The default: an asynchronous f32 all-reduce of the bucket (average, or sum in join mode).
/// Registering it gives bit-identical results to registering nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllReduceHook;

impl CommHook for AllReduceHook {
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> Result<BucketFuture> {
        let op = bucket.reduction.op();
        Ok(comm.all_reduce_async(bucket.into_data(), op).into())
    }

    fn name(&self) -> &str {
        "allreduce"
    }

    fn wire_bytes(&self, elements: usize) -> Option<usize> {
        Some(4 * elements)
    }
}

/// Gradient compression for the bucket all-reduces.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// None: f32 all-reduce ([`AllReduceHook`]'s behaviour).
    #[default]
    None,
    /// IEEE half precision (5 exponent bits, 10 mantissa bits): relative rounding error 2⁻¹¹ per
    /// operation, values up to 65504 after division by the world size.
    Fp16,
    /// bfloat16 (8 exponent bits, 7 mantissa bits): f32's range, relative rounding error 2⁻⁸ per
    /// operation.
    Bf16,
}

impl Compression {
    /// The valid names, as [`FromStr`] accepts them.
    pub const NAMES: [&'static str; 3] = ["none", "fp16", "bf16"];

    /// The name (`none`, `fp16` or `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Fp16 => "fp16",
            Compression::Bf16 => "bf16",
        }
    }

    /// The hook doing this compression (`None` for no compression: the built-in f32 average).
    pub fn hook(self) -> Option<Arc<dyn CommHook>> {
        match self {
            Compression::None => None,
            c => Some(Arc::new(CompressHook(c))),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = TrainError;

    /// Parses `none`, `fp16` or `bf16` (case-insensitive); anything else is
    /// [`TrainError::InvalidArgument`] listing the valid names.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Compression::None),
            "fp16" => Ok(Compression::Fp16),
            "bf16" => Ok(Compression::Bf16),
            _ => Err(TrainError::InvalidArgument {
                arg: "compression",
                reason: format!(
                    "unknown compression {s:?} (valid: {})",
                    Compression::NAMES.join(", ")
                ),
            }),
        }
    }
}

/// 16-bit gradient compression (PyTorch's `fp16_compress_hook` / `bf16_compress_hook`): each
/// element is divided by the world size W in f32, cast to 16 bits, the bucket is summed over ranks
/// by an asynchronous all-reduce in 16 bits, and the result is cast back to f32 (and multiplied by
/// W again when the synchronizer asks for the sum, in join mode).
///
/// Dividing before the cast (PyTorch divides right after it) means the 16-bit sum is an average:
/// it overflows fp16's 65504 only if the average itself does, and a rank's value may reach
/// W · 65504 before its cast overflows (beyond that it becomes ±infinity, as in PyTorch). Error:
/// with N ranks, each element of the result is within about N · u · mean(|g|) of the exact average
/// (u = 2⁻¹¹ for fp16, 2⁻⁸ for bf16; plus about N · 2⁻²⁵ absolute for fp16's subnormals, below
/// 6.1e-5). The bytes sent are halved.
///
/// Built with [`Compression::hook`]; a `CompressHook(Compression::None)` is [`AllReduceHook`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressHook(pub Compression);

/// Casts `data` / `w` to 16 bits, sums it over ranks asynchronously, and casts back into `data`.
fn compressed<H: kolo::Element>(
    bucket: GradBucket,
    comm: &Communicator,
    to: fn(f32) -> H,
    from: fn(H) -> f32,
) -> BucketFuture {
    let w = comm.size().max(1) as f32;
    let scale_back = match bucket.reduction {
        Reduction::Average => None,
        Reduction::Sum => Some(w),
    };
    let mut data = bucket.into_data();
    let half: Vec<H> = data.iter().map(|&x| to(x / w)).collect();
    let work = comm.all_reduce_async(half, ReduceOp::Sum);
    BucketFuture::deferred(move || {
        let reduced = work.wait()?;
        for (d, h) in data.iter_mut().zip(reduced) {
            *d = from(h);
        }
        if let Some(w) = scale_back {
            data.iter_mut().for_each(|d| *d *= w);
        }
        Ok(data)
    })
}

impl CommHook for CompressHook {
    fn reduce(&self, bucket: GradBucket, comm: &Communicator) -> Result<BucketFuture> {
        Ok(match self.0 {
            Compression::None => return AllReduceHook.reduce(bucket, comm),
            Compression::Fp16 => compressed(bucket, comm, f16::from_f32, f16::to_f32),
            Compression::Bf16 => compressed(bucket, comm, bf16::from_f32, bf16::to_f32),
        })
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    /// 2 bytes an element compressed (fp16, bf16), 4 uncompressed.
    fn wire_bytes(&self, elements: usize) -> Option<usize> {
        Some(match self.0 {
            Compression::None => 4 * elements,
            Compression::Fp16 | Compression::Bf16 => 2 * elements,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_names_round_trip_and_unknown_names_list_the_valid_ones() {
        for c in [Compression::None, Compression::Fp16, Compression::Bf16] {
            assert_eq!(c.name().parse::<Compression>().ok(), Some(c));
            assert_eq!(c.to_string(), c.name());
        }
        assert_eq!("BF16".parse::<Compression>().ok(), Some(Compression::Bf16));
        let e = "fp8".parse::<Compression>().err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(
            e.contains("\"fp8\"") && e.contains("none, fp16, bf16"),
            "{e}"
        );
        assert!(Compression::None.hook().is_none());
        assert_eq!(
            Compression::Fp16.hook().map(|h| h.name().to_owned()),
            Some("fp16".into())
        );
    }

    #[test]
    fn reduction_ops() {
        assert_eq!(Reduction::Average.op(), ReduceOp::Avg);
        assert_eq!(Reduction::Sum.op(), ReduceOp::Sum);
    }
}
