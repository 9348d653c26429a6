//! Adasum all-reduce on a [`Communicator`]: adaptive summation of gradients (Maleki et al., MLSys
//! 2021; Horovod's `hvd.Adasum`), per layer, over a binary tree of pairwise combinations.
//!
//! The algorithms are `kolo_collectives::algorithms::allreduce_adasum` (recursive doubling, small
//! buffers) and `allreduce_adasum_halving` (vector halving, distance doubling, large buffers), chosen
//! by `kolo_collectives::select::adasum`.

use kolo_collectives::algorithms::{allreduce_adasum, allreduce_adasum_halving};
use kolo_collectives::select;
use kolo_core::call::counts_hash;
use kolo_core::{Algorithm, Call, Error, OpKind, Result};

pub use allreduce_adasum::AdasumFloat;

use crate::communicator::{Communicator, Inner};
use crate::work::Work;

const OP: OpKind = OpKind::AllReduceAdasum;

impl Inner {
    /// [`Error::Unsupported`] unless the group size is a power of two. Every rank of the group sees
    /// the same size and fails alike, before any message: no rank waits, and the communicator stays
    /// usable (a caller may fall back to an averaging all-reduce).
    fn adasum_supported(&self) -> Result<()> {
        let n = self.size();
        if allreduce_adasum::is_supported(n) {
            return Ok(());
        }
        Err(Error::Unsupported {
            what: format!(
                "{} on a group of {n} ranks: Adasum needs a power-of-two number of ranks \
                 (1, 2, 4, 8, ...)",
                OP.name()
            ),
        })
    }

    /// Checks the group size and the layer lengths, builds the fingerprint and runs the algorithm.
    fn all_reduce_adasum<T: AdasumFloat>(
        &self,
        seq: u64,
        buf: &mut [T],
        layers: &[usize],
    ) -> Result<()> {
        self.check()?;
        self.adasum_supported()?;
        let total = layers.iter().try_fold(0usize, |acc, &l| acc.checked_add(l));
        if total != Some(buf.len()) {
            let sum = total.map_or_else(|| "overflows usize".to_string(), |t| t.to_string());
            let e = Error::InvalidArgument {
                op: OP.name(),
                rank: self.rank,
                arg: "layers",
                reason: format!(
                    "{} segment lengths sum to {sum}, but the buffer has {} elements",
                    layers.len(),
                    buf.len()
                ),
            };
            // Other ranks may have passed good lengths: fail them too instead of letting them wait.
            return Err(self.poison(e));
        }
        // The layer lengths are in the fingerprint: ranks that cut the buffer differently would
        // compute different coefficients, so they get a mismatch instead.
        let call = Call {
            op: OP,
            dtype: Some(T::DTYPE),
            reduce: None,
            count: counts_hash(layers),
            root: None,
            algo: select::adasum(buf.len(), std::mem::size_of::<T>(), self.size()),
        };
        self.exec_own(seq, call, self.config.timeout, true, |ctx| {
            match call.algo {
                Algorithm::HalvingDoubling => {
                    allreduce_adasum_halving::all_reduce(ctx, buf, layers)
                }
                _ => allreduce_adasum::all_reduce(ctx, buf, layers),
            }
        })
    }
}

/// Adasum.
impl Communicator {
    /// Combines `buf` over all ranks by adaptive summation (Adasum) instead of a sum or average;
    /// every rank gets the same result, bit for bit.
    ///
    /// `buf` is cut into consecutive segments of `layers[0]`, `layers[1]`, … elements (typically one
    /// per parameter tensor; the lengths must sum to `buf.len()`, and every rank passes the same
    /// ones). Per segment, two ranks' vectors a and b combine as
    /// `(1 − a·b / (2|a|²)) a + (1 − a·b / (2|b|²)) b` (a zero vector leaves the other one), with dot
    /// products and norms in f64: identical gradients come back unchanged (not multiplied by the
    /// number of ranks), orthogonal ones are added. Ranks combine pairwise up a binary tree — (0,1),
    /// (2,3), …, then {0,1} with {2,3}, … — the lower ranks' vector as `a`. Small buffers go by
    /// recursive doubling (whole vectors exchanged, log₂ n rounds), large ones by Horovod's vector
    /// halving with distance doubling (about twice the buffer sent per rank, whatever n).
    ///
    /// Like Horovod, Adasum runs only on groups whose size is a power of two: on other groups every
    /// rank returns [`Error::Unsupported`] naming the size, without communicating and without failing
    /// the communicator. Segment lengths that do not sum to `buf.len()` are
    /// [`Error::InvalidArgument`] for `layers`, which fails the communicator like other argument
    /// errors. Under the MPI backend it runs kolo's own algorithm over the point-to-point transport.
    ///
    /// ```
    /// let results = kolo::run_local(2, kolo::Config::default(), |comm| -> kolo::Result<Vec<f64>> {
    ///     // Orthogonal gradients add up; identical ones would come back unchanged.
    ///     let mut grad = if comm.rank() == 0 { vec![1.0, 0.0] } else { vec![0.0, 2.0] };
    ///     comm.all_reduce_adasum(&mut grad, &[2])?;
    ///     Ok(grad)
    /// });
    /// for r in results {
    ///     assert_eq!(r.unwrap().unwrap(), vec![1.0, 2.0]);
    /// }
    /// ```
    #[track_caller]
    pub fn all_reduce_adasum<T: AdasumFloat>(&self, buf: &mut [T], layers: &[usize]) -> Result<()> {
        self.inner.check()?;
        self.inner.adasum_supported()?;
        let seq = self.inner.issue_blocking()?;
        self.inner.all_reduce_adasum(seq, buf, layers)
    }

    /// [`Communicator::all_reduce_adasum`] with the whole buffer as one segment.
    #[track_caller]
    pub fn all_reduce_adasum_whole<T: AdasumFloat>(&self, buf: &mut [T]) -> Result<()> {
        let len = buf.len();
        self.all_reduce_adasum(buf, &[len])
    }

    /// Asynchronous [`Communicator::all_reduce_adasum`]: runs on the communicator's worker thread in
    /// issue order; `wait` gives the combined buffer back.
    #[track_caller]
    pub fn all_reduce_adasum_async<T: AdasumFloat>(
        &self,
        mut buf: Vec<T>,
        layers: Vec<usize>,
    ) -> Work<Vec<T>> {
        self.spawn(OP, move |inner, seq| {
            inner
                .all_reduce_adasum(seq, &mut buf, &layers)
                .map(|()| buf)
        })
    }
}
