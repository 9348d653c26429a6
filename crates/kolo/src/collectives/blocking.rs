//! The blocking collectives: each takes the next sequence number (after any queued asynchronous
//! collective) and runs on the calling thread.

use kolo_core::dtype::{as_bytes, as_bytes_mut};
use kolo_core::{Element, ReduceOp, Result};

use super::Rooted;
use crate::communicator::Communicator;

/// Blocking collectives.
impl Communicator {
    /// Blocks until every rank of the group has entered the barrier.
    #[track_caller]
    pub fn barrier(&self) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.barrier(seq)
    }

    /// A barrier that names the ranks that do not arrive within `timeout` instead of waiting for
    /// them (torch.distributed's `monitored_barrier`): rank 0 collects every rank's arrival, and on
    /// timeout rank 0 and every rank that arrived fail with [`Error::BarrierTimeout`](kolo_core::Error::BarrierTimeout) listing the
    /// missing ranks. Like any failed collective it poisons the communicator.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let results = kolo::run_local(3, kolo::Config::default(), |comm| {
    ///     comm.monitored_barrier(Duration::from_secs(10))
    /// });
    /// assert!(results.iter().all(|r| matches!(r, Ok(Ok(())))));
    /// ```
    #[track_caller]
    pub fn monitored_barrier(&self, timeout: std::time::Duration) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.monitored_barrier(seq, timeout)
    }

    /// Copies `buf` of rank `root` into `buf` of every rank. Every rank passes the same length.
    #[track_caller]
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.broadcast(seq, as_bytes_mut(buf), T::DTYPE, root)
    }

    /// Reduces `buf` element-wise over all ranks with `op`; every rank gets the result in `buf`.
    #[track_caller]
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.all_reduce(seq, as_bytes_mut(buf), T::DTYPE, op)
    }

    /// Reduces `buf` over all ranks into `buf` of `root`; other ranks' buffers are unchanged.
    #[track_caller]
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .reduce(seq, as_bytes_mut(buf), T::DTYPE, op, root)
    }

    /// `send` holds `size()` blocks of `recv.len()` elements; rank r receives block r reduced over all
    /// ranks.
    #[track_caller]
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .reduce_scatter(seq, as_bytes(send), as_bytes_mut(recv), T::DTYPE, op)
    }

    /// Every rank's `send` (all the same length) concatenated in rank order into every rank's `recv`
    /// (`size() * send.len()` elements).
    #[track_caller]
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .all_gather(seq, as_bytes(send), as_bytes_mut(recv), T::DTYPE, None)
    }

    /// All-gather in place (MPI's `MPI_IN_PLACE`): `buf` holds `size()` blocks of equal length,
    /// block `rank()` this rank's contribution; on return block r holds rank r's. No copy of
    /// this rank's block is made. Ranks may mix this call with [`Communicator::all_gather`].
    #[track_caller]
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .all_gather_in_place(seq, as_bytes_mut(buf), T::DTYPE, None)
    }

    /// [`Communicator::all_gather_v`] in place: `buf` holds the blocks of `counts` elements in
    /// rank order, this rank's filled in.
    #[track_caller]
    pub fn all_gather_v_in_place<T: Element>(&self, buf: &mut [T], counts: &[usize]) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .all_gather_in_place(seq, as_bytes_mut(buf), T::DTYPE, Some(counts))
    }

    /// All-gather with a count per rank: rank r sends `counts[r]` elements; `recv` holds their sum.
    /// Every rank passes the same `counts`.
    #[track_caller]
    pub fn all_gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.all_gather(
            seq,
            as_bytes(send),
            as_bytes_mut(recv),
            T::DTYPE,
            Some(counts),
        )
    }

    /// Every rank's `send` concatenated in rank order into `recv` of `root` (`size() * send.len()`
    /// elements; `recv` is not used on other ranks and may be empty).
    #[track_caller]
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.rooted((send, recv), (None, root), Rooted::Gather)
    }

    /// Gather with a count per rank (every rank passes the same `counts`).
    #[track_caller]
    pub fn gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<()> {
        self.rooted((send, recv), (Some(counts), root), Rooted::Gather)
    }

    /// Splits `send` of `root` (`size() * recv.len()` elements) into blocks; rank r receives block r in
    /// `recv`. `send` is not used on other ranks and may be empty.
    #[track_caller]
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.rooted((send, recv), (None, root), Rooted::Scatter)
    }

    /// Scatter with a count per rank (every rank passes the same `counts`).
    #[track_caller]
    pub fn scatter_v<T: Element>(
        &self,
        send: &[T],
        counts: &[usize],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        self.rooted((send, recv), (Some(counts), root), Rooted::Scatter)
    }

    /// `send` holds `size()` equal blocks; block d goes to rank d, and the block from rank s lands in
    /// block s of `recv`.
    #[track_caller]
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .all_to_all(seq, as_bytes(send), as_bytes_mut(recv), T::DTYPE, None)
    }

    /// All-to-all with counts: `send_counts[d]` elements go to rank d, `recv_counts[s]` come from rank s
    /// (and must equal what rank s sends here).
    #[track_caller]
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.all_to_all(
            seq,
            as_bytes(send),
            as_bytes_mut(recv),
            T::DTYPE,
            Some((send_counts, recv_counts)),
        )
    }

    /// Gather or scatter (`way`) of `(send, recv)` at `root`, with `counts` per rank or equal parts.
    #[track_caller]
    fn rooted<T: Element>(
        &self,
        (send, recv): (&[T], &mut [T]),
        at: (Option<&[usize]>, usize),
        way: Rooted,
    ) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        let bufs = (as_bytes(send), as_bytes_mut(recv));
        self.inner.rooted(seq, bufs, T::DTYPE, at, way)
    }
}
