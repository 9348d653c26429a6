//! The asynchronous collectives: each takes its buffers by value and returns a [`Work`] whose `wait`
//! gives the result buffer back. They run on the communicator's worker thread, in issue order, and
//! a blocking collective issued after them waits for them first.
//!
//! Every one is the blocking call run on the worker thread, through one of two paths: in place on
//! the buffer passed in ([`Communicator::spawn_in_place`]), or from the buffer passed in into a new
//! one ([`Communicator::spawn_into`]).

use kolo_core::dtype::{as_bytes, as_bytes_mut};
use kolo_core::{Element, OpKind, ReduceOp, Result};

use crate::communicator::{Communicator, Inner};
use crate::work::Work;

impl Communicator {
    /// Queues `f` as the next collective (on the worker thread); its result completes the returned
    /// [`Work`].
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

    /// An asynchronous collective in place: `run` is the blocking call on `buf`'s bytes; `wait`
    /// gives `buf` back.
    fn spawn_in_place<T: Element>(
        &self,
        op: OpKind,
        mut buf: Vec<T>,
        run: impl FnOnce(&Inner, u64, &mut [u8]) -> Result<()> + Send + 'static,
    ) -> Work<Vec<T>> {
        self.spawn(op, move |inner, seq| {
            run(inner, seq, as_bytes_mut(&mut buf)).map(|()| buf)
        })
    }

    /// An asynchronous collective from `send` into a new buffer of `recv_len` elements: `run` is the
    /// blocking call on their bytes; `wait` gives the new buffer.
    fn spawn_into<T: Element>(
        &self,
        op: OpKind,
        send: Vec<T>,
        recv_len: usize,
        run: impl FnOnce(&Inner, u64, &[u8], &mut [u8]) -> Result<()> + Send + 'static,
    ) -> Work<Vec<T>> {
        self.spawn(op, move |inner, seq| {
            let mut recv = vec![T::zeroed(); recv_len];
            run(inner, seq, as_bytes(&send), as_bytes_mut(&mut recv)).map(|()| recv)
        })
    }

    /// Asynchronous [`Communicator::barrier`].
    pub fn barrier_async(&self) -> Work<()> {
        self.spawn(OpKind::Barrier, |inner, seq| inner.barrier(seq))
    }

    /// Asynchronous [`Communicator::broadcast`].
    pub fn broadcast_async<T: Element>(&self, buf: Vec<T>, root: usize) -> Work<Vec<T>> {
        self.spawn_in_place(OpKind::Broadcast, buf, move |inner, seq, b| {
            inner.broadcast(seq, b, T::DTYPE, root)
        })
    }

    /// Asynchronous [`Communicator::all_reduce`].
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.spawn_in_place(OpKind::AllReduce, buf, move |inner, seq, b| {
            inner.all_reduce(seq, b, T::DTYPE, op)
        })
    }

    /// Asynchronous [`Communicator::reduce`].
    pub fn reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp, root: usize) -> Work<Vec<T>> {
        self.spawn_in_place(OpKind::Reduce, buf, move |inner, seq, b| {
            inner.reduce(seq, b, T::DTYPE, op, root)
        })
    }

    /// Asynchronous [`Communicator::reduce_scatter`]; the result has `send.len() / size()` elements.
    pub fn reduce_scatter_async<T: Element>(&self, send: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        let len = send.len() / self.size().max(1);
        self.spawn_into(OpKind::ReduceScatter, send, len, move |inner, seq, s, r| {
            inner.reduce_scatter(seq, s, r, T::DTYPE, op)
        })
    }

    /// Asynchronous [`Communicator::all_gather`]; the result has `size() * send.len()` elements.
    pub fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Work<Vec<T>> {
        let len = send.len() * self.size();
        self.spawn_into(OpKind::AllGather, send, len, |inner, seq, s, r| {
            inner.all_gather(seq, s, r, T::DTYPE, None)
        })
    }

    /// Asynchronous [`Communicator::gather`]; the result is the gathered data on `root`, empty elsewhere.
    pub fn gather_async<T: Element>(&self, send: Vec<T>, root: usize) -> Work<Vec<T>> {
        let len = if self.rank() == root {
            send.len() * self.size()
        } else {
            0
        };
        self.spawn_into(OpKind::Gather, send, len, move |inner, seq, s, r| {
            inner.gather(seq, s, r, T::DTYPE, None, root)
        })
    }

    /// Asynchronous [`Communicator::scatter`]: every rank passes `count`, the root also `send`.
    pub fn scatter_async<T: Element>(
        &self,
        send: Vec<T>,
        count: usize,
        root: usize,
    ) -> Work<Vec<T>> {
        self.spawn_into(OpKind::Scatter, send, count, move |inner, seq, s, r| {
            inner.scatter(seq, s, r, T::DTYPE, None, root)
        })
    }

    /// Asynchronous [`Communicator::all_to_all`].
    pub fn all_to_all_async<T: Element>(&self, send: Vec<T>) -> Work<Vec<T>> {
        let len = send.len();
        self.spawn_into(OpKind::AllToAll, send, len, |inner, seq, s, r| {
            inner.all_to_all(seq, s, r, T::DTYPE, None)
        })
    }

    /// Asynchronous [`Communicator::all_gather_v`]; the result has `counts.iter().sum()` elements.
    pub fn all_gather_v_async<T: Element>(&self, send: Vec<T>, counts: Vec<usize>) -> Work<Vec<T>> {
        let len = counts.iter().sum();
        self.spawn_into(OpKind::AllGatherV, send, len, move |inner, seq, s, r| {
            inner.all_gather(seq, s, r, T::DTYPE, Some(&counts))
        })
    }

    /// Asynchronous [`Communicator::gather_v`]; the gathered data on `root`, empty elsewhere.
    pub fn gather_v_async<T: Element>(
        &self,
        send: Vec<T>,
        counts: Vec<usize>,
        root: usize,
    ) -> Work<Vec<T>> {
        let len = if self.rank() == root {
            counts.iter().sum()
        } else {
            0
        };
        self.spawn_into(OpKind::GatherV, send, len, move |inner, seq, s, r| {
            inner.gather(seq, s, r, T::DTYPE, Some(&counts), root)
        })
    }

    /// Asynchronous [`Communicator::scatter_v`]; this rank's `counts[rank]` elements.
    pub fn scatter_v_async<T: Element>(
        &self,
        send: Vec<T>,
        counts: Vec<usize>,
        root: usize,
    ) -> Work<Vec<T>> {
        let len = counts.get(self.rank()).copied().unwrap_or(0);
        self.spawn_into(OpKind::ScatterV, send, len, move |inner, seq, s, r| {
            inner.scatter(seq, s, r, T::DTYPE, Some(&counts), root)
        })
    }

    /// Asynchronous [`Communicator::all_to_all_v`].
    pub fn all_to_all_v_async<T: Element>(
        &self,
        send: Vec<T>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Work<Vec<T>> {
        let len = recv_counts.iter().sum();
        self.spawn_into(OpKind::AllToAllV, send, len, move |inner, seq, s, r| {
            inner.all_to_all(seq, s, r, T::DTYPE, Some((&send_counts, &recv_counts)))
        })
    }
}
