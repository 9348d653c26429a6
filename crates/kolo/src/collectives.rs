//! Collective operations of a [`Communicator`], typed over [`Element`], blocking and asynchronous.
//!
//! Each operation validates its arguments on this rank, builds the call's fingerprint, picks the
//! algorithm (see `kolo_collectives::select`) and runs it. Argument errors poison the communicator just
//! like communication errors, so that the other ranks of the collective fail too instead of waiting.

use kolo_collectives::algorithms::{
    alltoall_pairwise, barrier_dissemination, barrier_monitored, broadcast_binomial, linear,
    reduce_binomial, ring,
};
use kolo_collectives::ctx::{blocks_from_counts, even_blocks};
use kolo_collectives::select;
use kolo_core::call::counts_hash;
use kolo_core::dtype::{as_bytes, as_bytes_mut};
use kolo_core::{Algorithm, Call, DType, Element, Error, OpKind, ReduceOp, Reducer, Result};

use crate::communicator::{Communicator, Inner};
use crate::work::Work;

/// From this size, all-reduce on a world spread over several hosts goes hierarchical.
pub const HIERARCHICAL_MIN_BYTES: usize = 64 * 1024;

/// All-reduce in three steps: reduce-scatter among the ranks of each host (shared memory), all-reduce
/// of each shard across hosts (TCP, one rank per host and shard), all-gather inside each host. The
/// buffer is padded to a multiple of the ranks per host; `Avg` divides at both levels, which for
/// integers truncates the same as dividing once.
fn hierarchical_all_reduce(
    h: &crate::communicator::Hierarchy,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let e = dtype.size();
    let l = h.local.size();
    let per = (buf.len() / e).div_ceil(l);
    let mut padded = vec![0u8; per * l * e];
    padded[..buf.len()].copy_from_slice(buf);
    let mut shard = vec![0u8; per * e];
    let local = &h.local.inner;
    let cross = &h.cross.inner;
    local.reduce_scatter(local.issue_blocking()?, &padded, &mut shard, dtype, op)?;
    cross.all_reduce(cross.issue_blocking()?, &mut shard, dtype, op)?;
    local.all_gather(local.issue_blocking()?, &shard, &mut padded, dtype, None)?;
    buf.copy_from_slice(&padded[..buf.len()]);
    Ok(())
}

/// The arguments of one typed collective, checked against the group.
struct Check<'a> {
    inner: &'a Inner,
    op: OpKind,
}

impl Check<'_> {
    fn root(&self, root: usize) -> Result<u32> {
        let size = self.inner.size();
        if root >= size {
            return Err(Error::RankOutOfRange {
                op: self.op.name(),
                rank: self.inner.rank,
                arg: "root",
                value: root,
                size,
            });
        }
        Ok(root as u32)
    }

    fn len(&self, arg: &'static str, actual: usize, expected: usize) -> Result<()> {
        if actual != expected {
            return Err(Error::BufferLength {
                op: self.op.name(),
                rank: self.inner.rank,
                arg,
                expected,
                actual,
            });
        }
        Ok(())
    }

    fn counts(&self, arg: &'static str, counts: &[usize]) -> Result<usize> {
        let size = self.inner.size();
        if counts.len() != size {
            return Err(Error::InvalidArgument {
                op: self.op.name(),
                rank: self.inner.rank,
                arg,
                reason: format!(
                    "has {} entries, expected one per rank ({size})",
                    counts.len()
                ),
            });
        }
        Ok(counts.iter().sum())
    }

    fn call(
        &self,
        dtype: DType,
        count: usize,
        reduce: Option<ReduceOp>,
        root: Option<u32>,
    ) -> Call {
        let algo = select::fixed(self.op, self.inner.size());
        Call {
            op: self.op,
            dtype: Some(dtype),
            reduce,
            count: count as u64,
            root,
            algo,
        }
    }
}

/// A buffer argument of a rooted collective: its name and length in elements.
#[derive(Clone, Copy)]
struct Piece {
    arg: &'static str,
    len: usize,
}

impl Check<'_> {
    /// Gather/scatter arguments: this rank's `piece` and, on the root, the `whole` buffer of all
    /// pieces; returns the fingerprint and the block layout of the whole buffer.
    fn rooted(
        &self,
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
        piece: Piece,
        whole: Piece,
    ) -> Result<(Call, Vec<std::ops::Range<usize>>)> {
        let (e, n, me) = (dtype.size(), self.inner.size(), self.inner.rank);
        let root32 = self.root(root)?;
        let (call, blocks, total) = match counts {
            None => (
                self.call(dtype, piece.len, None, Some(root32)),
                even_blocks(piece.len * n, n, e),
                piece.len * n,
            ),
            Some(counts) => {
                let total = self.counts("counts", counts)?;
                self.len(piece.arg, piece.len, counts[me])?;
                let call = self
                    .call(dtype, 0, None, Some(root32))
                    .with_count(counts_hash(counts));
                (call, blocks_from_counts(counts, e), total)
            }
        };
        if me == root {
            self.len(whole.arg, whole.len, total)?;
        }
        Ok((call, blocks))
    }
}

impl Inner {
    fn check_args<R>(&self, op: OpKind, f: impl FnOnce(&Check) -> Result<R>) -> Result<R> {
        self.check()?;
        f(&Check { inner: self, op }).map_err(|e| self.poison(e))
    }

    pub(crate) fn barrier(&self, seq: u64) -> Result<()> {
        let call = Call::new(OpKind::Barrier, select::fixed(OpKind::Barrier, self.size()));
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |e| e.barrier());
        }
        self.run(seq, call, barrier_dissemination::barrier)
    }

    pub(crate) fn monitored_barrier(&self, seq: u64, timeout: std::time::Duration) -> Result<()> {
        let call = Call::new(OpKind::Barrier, kolo_core::Algorithm::Direct);
        self.run_timed(seq, call, timeout, false, barrier_monitored::barrier)
    }

    pub(crate) fn broadcast(
        &self,
        seq: u64,
        buf: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        let call = self.check_args(OpKind::Broadcast, |c| {
            Ok(c.call(dtype, buf.len() / dtype.size(), None, Some(c.root(root)?)))
        })?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |e| e.broadcast(buf, dtype, root));
        }
        self.run(seq, call, |ctx| {
            broadcast_binomial::broadcast(ctx, buf, dtype.size(), root)
        })
    }

    pub(crate) fn all_reduce(
        &self,
        seq: u64,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = buf.len() / dtype.size();
        let mut call = self.check_args(OpKind::AllReduce, |c| {
            Ok(c.call(dtype, count, Some(op), None))
        })?;
        call.algo = select::all_reduce(count, dtype.size(), self.size(), &self.config.overrides);
        let auto = self.config.overrides.all_reduce.is_none() && self.size() > 1;
        // A forced algorithm runs kolo's own, over the engine's point-to-point transport.
        if let (Some(engine), None) = (&self.engine, self.config.overrides.all_reduce) {
            return self.run_engine(seq, call, &**engine, |e| e.all_reduce(buf, dtype, op));
        }
        if auto && self.uses_arena() {
            call.algo = Algorithm::Shm;
        }
        let hierarchy = if auto && buf.len() >= HIERARCHICAL_MIN_BYTES {
            self.hierarchy()
        } else {
            None
        };
        if hierarchy.is_some() {
            call.algo = Algorithm::Hierarchical;
        }
        let red = Reducer::new(dtype, op);
        self.run(seq, call, |ctx| match hierarchy {
            Some(h) => hierarchical_all_reduce(h, buf, dtype, op),
            None => kolo_collectives::all_reduce(ctx, buf, dtype.size(), &red),
        })
    }

    pub(crate) fn reduce(
        &self,
        seq: u64,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let call = self.check_args(OpKind::Reduce, |c| {
            Ok(c.call(
                dtype,
                buf.len() / dtype.size(),
                Some(op),
                Some(c.root(root)?),
            ))
        })?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |e| e.reduce(buf, dtype, op, root));
        }
        let red = Reducer::new(dtype, op);
        self.run(seq, call, |ctx| {
            if call.algo == Algorithm::Direct {
                red.finish(buf, 1);
                return Ok(());
            }
            reduce_binomial::reduce(ctx, buf, dtype.size(), &red, root)
        })
    }

    pub(crate) fn reduce_scatter(
        &self,
        seq: u64,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (e, n) = (dtype.size(), self.size());
        let count = recv.len() / e;
        let call = self.check_args(OpKind::ReduceScatter, |c| {
            c.len("send", send.len() / e, count * n)?;
            Ok(c.call(dtype, count, Some(op), None))
        })?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |en| {
                en.reduce_scatter(send, recv, dtype, op)
            });
        }
        let red = Reducer::new(dtype, op);
        let blocks = even_blocks(count * n, n, e);
        self.run(seq, call, |ctx| {
            ring::reduce_scatter(ctx, send, recv, &blocks, e, &red)
        })
    }

    /// All-gather; `counts` is `None` for the equal-count form.
    pub(crate) fn all_gather(
        &self,
        seq: u64,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<()> {
        let (e, n) = (dtype.size(), self.size());
        let op = if counts.is_some() {
            OpKind::AllGatherV
        } else {
            OpKind::AllGather
        };
        let (call, blocks) = self.check_args(op, |c| {
            let mine = send.len() / e;
            match counts {
                None => {
                    c.len("recv", recv.len() / e, mine * n)?;
                    Ok((c.call(dtype, mine, None, None), even_blocks(mine * n, n, e)))
                }
                Some(counts) => {
                    let total = c.counts("counts", counts)?;
                    c.len("send", mine, counts[self.rank])?;
                    c.len("recv", recv.len() / e, total)?;
                    Ok((
                        c.call(dtype, 0, None, None).with_count(counts_hash(counts)),
                        blocks_from_counts(counts, e),
                    ))
                }
            }
        })?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |en| {
                en.all_gather(send, recv, dtype, counts)
            });
        }
        self.run(seq, call, |ctx| {
            ring::all_gather(ctx, send, recv, &blocks, e)
        })
    }

    /// Gather to `root`; `counts` is `None` for the equal-count form.
    pub(crate) fn gather(
        &self,
        seq: u64,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        let op = if counts.is_some() {
            OpKind::GatherV
        } else {
            OpKind::Gather
        };
        let e = dtype.size();
        let piece = Piece {
            arg: "send",
            len: send.len() / e,
        };
        let whole = Piece {
            arg: "recv",
            len: recv.len() / e,
        };
        let (call, blocks) =
            self.check_args(op, |c| c.rooted(dtype, counts, root, piece, whole))?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |en| {
                en.gather(send, recv, dtype, counts, root)
            });
        }
        self.run(seq, call, |ctx| {
            linear::gather(ctx, send, recv, &blocks, e, root)
        })
    }

    /// Scatter from `root`; `counts` is `None` for the equal-count form.
    pub(crate) fn scatter(
        &self,
        seq: u64,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        let op = if counts.is_some() {
            OpKind::ScatterV
        } else {
            OpKind::Scatter
        };
        let e = dtype.size();
        let piece = Piece {
            arg: "recv",
            len: recv.len() / e,
        };
        let whole = Piece {
            arg: "send",
            len: send.len() / e,
        };
        let (call, blocks) =
            self.check_args(op, |c| c.rooted(dtype, counts, root, piece, whole))?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |en| {
                en.scatter(send, recv, dtype, counts, root)
            });
        }
        self.run(seq, call, |ctx| {
            linear::scatter(ctx, send, recv, &blocks, e, root)
        })
    }

    /// All-to-all; `counts` is `None` for the equal-count form, else `(send_counts, recv_counts)`.
    pub(crate) fn all_to_all(
        &self,
        seq: u64,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<(&[usize], &[usize])>,
    ) -> Result<()> {
        let (e, n) = (dtype.size(), self.size());
        let op = if counts.is_some() {
            OpKind::AllToAllV
        } else {
            OpKind::AllToAll
        };
        let (call, sb, rb) = self.check_args(op, |c| match counts {
            None => {
                let len = send.len() / e;
                c.len("recv", recv.len() / e, len)?;
                if len % n != 0 {
                    return Err(Error::InvalidArgument {
                        op: op.name(),
                        rank: self.rank,
                        arg: "send",
                        reason: format!("{len} elements do not split evenly among {n} ranks"),
                    });
                }
                let b = even_blocks(len, n, e);
                Ok((c.call(dtype, len / n, None, None), b.clone(), b))
            }
            Some((sc, rc)) => {
                let st = c.counts("send_counts", sc)?;
                let rt = c.counts("recv_counts", rc)?;
                c.len("send", send.len() / e, st)?;
                c.len("recv", recv.len() / e, rt)?;
                // Counts differ per rank by design; message lengths are checked on receipt.
                Ok((
                    c.call(dtype, 0, None, None),
                    blocks_from_counts(sc, e),
                    blocks_from_counts(rc, e),
                ))
            }
        })?;
        if let Some(engine) = &self.engine {
            return self.run_engine(seq, call, &**engine, |en| {
                en.all_to_all(send, recv, dtype, counts)
            });
        }
        self.run(seq, call, |ctx| {
            alltoall_pairwise::all_to_all(ctx, send, &sb, recv, &rb, e)
        })
    }
}

trait WithCount {
    fn with_count(self, count: u64) -> Self;
}

impl WithCount for Call {
    fn with_count(mut self, count: u64) -> Self {
        self.count = count;
        self
    }
}

/// Blocking collectives.
impl Communicator {
    /// Blocks until every rank of the group has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.barrier(seq)
    }

    /// A barrier that names the ranks that do not arrive within `timeout` instead of waiting for
    /// them (torch.distributed's `monitored_barrier`): rank 0 collects every rank's arrival, and on
    /// timeout rank 0 and every rank that arrived fail with [`Error::BarrierTimeout`] listing the
    /// missing ranks. Like any failed collective it poisons the communicator.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let results = kolo::run_local(3, kolo::Config::default(), |comm| {
    ///     comm.monitored_barrier(Duration::from_secs(10))
    /// });
    /// assert!(results.iter().all(|r| matches!(r, Ok(Ok(())))));
    /// ```
    pub fn monitored_barrier(&self, timeout: std::time::Duration) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.monitored_barrier(seq, timeout)
    }

    /// Copies `buf` of rank `root` into `buf` of every rank. Every rank passes the same length.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.broadcast(seq, as_bytes_mut(buf), T::DTYPE, root)
    }

    /// Reduces `buf` element-wise over all ranks with `op`; every rank gets the result in `buf`.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.all_reduce(seq, as_bytes_mut(buf), T::DTYPE, op)
    }

    /// Reduces `buf` over all ranks into `buf` of `root`; other ranks' buffers are unchanged.
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .reduce(seq, as_bytes_mut(buf), T::DTYPE, op, root)
    }

    /// `send` holds `size()` blocks of `recv.len()` elements; rank r receives block r reduced over all
    /// ranks.
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
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .all_gather(seq, as_bytes(send), as_bytes_mut(recv), T::DTYPE, None)
    }

    /// All-gather with a count per rank: rank r sends `counts[r]` elements; `recv` holds their sum.
    /// Every rank passes the same `counts`.
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
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.gather(
            seq,
            as_bytes(send),
            as_bytes_mut(recv),
            T::DTYPE,
            None,
            root,
        )
    }

    /// Gather with a count per rank (every rank passes the same `counts`).
    pub fn gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.gather(
            seq,
            as_bytes(send),
            as_bytes_mut(recv),
            T::DTYPE,
            Some(counts),
            root,
        )
    }

    /// Splits `send` of `root` (`size() * recv.len()` elements) into blocks; rank r receives block r in
    /// `recv`. `send` is not used on other ranks and may be empty.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.scatter(
            seq,
            as_bytes(send),
            as_bytes_mut(recv),
            T::DTYPE,
            None,
            root,
        )
    }

    /// Scatter with a count per rank (every rank passes the same `counts`).
    pub fn scatter_v<T: Element>(
        &self,
        send: &[T],
        counts: &[usize],
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner.scatter(
            seq,
            as_bytes(send),
            as_bytes_mut(recv),
            T::DTYPE,
            Some(counts),
            root,
        )
    }

    /// `send` holds `size()` equal blocks; block d goes to rank d, and the block from rank s lands in
    /// block s of `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let seq = self.inner.issue_blocking()?;
        self.inner
            .all_to_all(seq, as_bytes(send), as_bytes_mut(recv), T::DTYPE, None)
    }

    /// All-to-all with counts: `send_counts[d]` elements go to rank d, `recv_counts[s]` come from rank s
    /// (and must equal what rank s sends here).
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
}

/// Asynchronous collectives: each takes its buffers by value and returns a [`Work`] whose `wait`
/// gives the result buffer back. They run on the communicator's worker thread, in issue order, and a
/// blocking collective issued after them waits for them first.
impl Communicator {
    pub(crate) fn spawn<R: Send + 'static>(
        &self,
        op: OpKind,
        f: impl FnOnce(&Inner, u64) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (work, completer) = Work::new(op.name());
        match self.inner.submit(move |inner, seq| {
            completer.start();
            completer.complete(f(inner, seq))
        }) {
            Ok(()) => work,
            Err(e) => Work::ready(op.name(), Err(e)),
        }
    }

    /// Asynchronous [`Communicator::barrier`].
    pub fn barrier_async(&self) -> Work<()> {
        self.spawn(OpKind::Barrier, |inner, seq| inner.barrier(seq))
    }

    /// Asynchronous [`Communicator::broadcast`].
    pub fn broadcast_async<T: Element>(&self, mut buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        self.spawn(OpKind::Broadcast, move |inner, seq| {
            inner
                .broadcast(seq, as_bytes_mut(&mut buf), T::DTYPE, root)
                .map(|_| buf)
        })
    }

    /// Asynchronous [`Communicator::all_reduce`].
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.spawn(OpKind::AllReduce, move |inner, seq| {
            inner
                .all_reduce(seq, as_bytes_mut(&mut buf), T::DTYPE, op)
                .map(|_| buf)
        })
    }

    /// Asynchronous [`Communicator::reduce`].
    pub fn reduce_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Work<Vec<T>> {
        self.spawn(OpKind::Reduce, move |inner, seq| {
            inner
                .reduce(seq, as_bytes_mut(&mut buf), T::DTYPE, op, root)
                .map(|_| buf)
        })
    }

    /// Asynchronous [`Communicator::reduce_scatter`]; the result has `send.len() / size()` elements.
    pub fn reduce_scatter_async<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        let n = self.size();
        self.spawn(OpKind::ReduceScatter, move |inner, seq| {
            let mut recv = vec![T::zeroed(); send.len() / n.max(1)];
            inner
                .reduce_scatter(seq, as_bytes(&send), as_bytes_mut(&mut recv), T::DTYPE, op)
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::all_gather`]; the result has `size() * send.len()` elements.
    pub fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Work<Vec<T>> {
        let n = self.size();
        self.spawn(OpKind::AllGather, move |inner, seq| {
            let mut recv = vec![T::zeroed(); send.len() * n];
            inner
                .all_gather(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    None,
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::gather`]; the result is the gathered data on `root`, empty elsewhere.
    pub fn gather_async<T: Element>(&self, send: Vec<T>, root: usize) -> Work<Vec<T>> {
        let (n, me) = (self.size(), self.rank());
        self.spawn(OpKind::Gather, move |inner, seq| {
            let mut recv = vec![T::zeroed(); if me == root { send.len() * n } else { 0 }];
            inner
                .gather(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    None,
                    root,
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::scatter`]: every rank passes `count`, the root also `send`.
    pub fn scatter_async<T: Element>(
        &self,
        send: Vec<T>,
        count: usize,
        root: usize,
    ) -> Work<Vec<T>> {
        self.spawn(OpKind::Scatter, move |inner, seq| {
            let mut recv = vec![T::zeroed(); count];
            inner
                .scatter(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    None,
                    root,
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::all_to_all`].
    pub fn all_to_all_async<T: Element>(&self, send: Vec<T>) -> Work<Vec<T>> {
        self.spawn(OpKind::AllToAll, move |inner, seq| {
            let mut recv = vec![T::zeroed(); send.len()];
            inner
                .all_to_all(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    None,
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::all_gather_v`]; the result has `counts.iter().sum()` elements.
    pub fn all_gather_v_async<T: Element>(&self, send: Vec<T>, counts: Vec<usize>) -> Work<Vec<T>> {
        self.spawn(OpKind::AllGatherV, move |inner, seq| {
            let mut recv = vec![T::zeroed(); counts.iter().sum()];
            inner
                .all_gather(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    Some(&counts),
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::gather_v`]; the gathered data on `root`, empty elsewhere.
    pub fn gather_v_async<T: Element>(
        &self,
        send: Vec<T>,
        counts: Vec<usize>,
        root: usize,
    ) -> Work<Vec<T>> {
        let me = self.rank();
        self.spawn(OpKind::GatherV, move |inner, seq| {
            let mut recv = vec![T::zeroed(); if me == root { counts.iter().sum() } else { 0 }];
            inner
                .gather(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    Some(&counts),
                    root,
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::scatter_v`]; this rank's `counts[rank]` elements.
    pub fn scatter_v_async<T: Element>(
        &self,
        send: Vec<T>,
        counts: Vec<usize>,
        root: usize,
    ) -> Work<Vec<T>> {
        let me = self.rank();
        self.spawn(OpKind::ScatterV, move |inner, seq| {
            let mut recv = vec![T::zeroed(); counts.get(me).copied().unwrap_or(0)];
            inner
                .scatter(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    Some(&counts),
                    root,
                )
                .map(|_| recv)
        })
    }

    /// Asynchronous [`Communicator::all_to_all_v`].
    pub fn all_to_all_v_async<T: Element>(
        &self,
        send: Vec<T>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Work<Vec<T>> {
        self.spawn(OpKind::AllToAllV, move |inner, seq| {
            let mut recv = vec![T::zeroed(); recv_counts.iter().sum()];
            inner
                .all_to_all(
                    seq,
                    as_bytes(&send),
                    as_bytes_mut(&mut recv),
                    T::DTYPE,
                    Some((&send_counts, &recv_counts)),
                )
                .map(|_| recv)
        })
    }
}
