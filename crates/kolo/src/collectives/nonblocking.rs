//! The asynchronous collectives: each takes its buffers by value — any [`CollectiveBuffer`]: a
//! `Vec<T>`, a `Box<[T]>`, or memory the caller keeps alive behind its own type — and returns a
//! [`Work`] whose `wait` gives the result back. They run on the communicator's worker thread, in
//! issue order, and a blocking collective issued after them waits for them first.
//!
//! Every one is the blocking call run on the worker thread, through one of three paths: in place
//! on the buffer passed in ([`Communicator::spawn_in_place`]), from the send buffer into a new one
//! ([`Communicator::spawn_alloc`]), or from the send buffer into the receive buffer passed in (the
//! `*_into_async` forms, [`Communicator::spawn_into`]), both handed back.

use kolo_core::dtype::{as_bytes, as_bytes_mut};
use kolo_core::{Element, OpKind, ReduceOp, Result};

use super::Rooted;
use crate::buffer::CollectiveBuffer;
use crate::communicator::{Communicator, Inner};
use crate::work::Work;

/// `len` zero elements.
fn zeroed<T: Element>(len: usize) -> Vec<T> {
    vec![T::zeroed(); len]
}

/// The blocking call of a two-buffer collective, on bytes.
type Run2 = dyn FnOnce(&Inner, u64, &[u8], &mut [u8]) -> Result<()> + Send;

impl Communicator {
    /// Queues `f` as the next collective (on the worker thread); its result completes the returned
    /// [`Work`].
    #[track_caller]
    pub(crate) fn spawn<R: Send + 'static>(
        &self,
        op: OpKind,
        f: impl FnOnce(&Inner, u64) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let (work, completer) = Work::new(op.name());
        let run = move |inner: &std::sync::Arc<Inner>, seq| {
            completer.start();
            // A panic on the worker thread (a bug, or a buffer of the caller's that panics) fails
            // the communicator and tells the peers, instead of leaving them waiting.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(inner, seq)))
                .unwrap_or_else(|panic| {
                    Err(inner.poison(kolo_core::Error::Panicked {
                        op: op.name(),
                        rank: inner.rank,
                        message: crate::communicator::panic_message(&*panic),
                    }))
                });
            (r, completer)
        };
        match self
            .inner
            .submit(run, |(r, completer)| completer.complete(r))
        {
            Ok(()) => work,
            Err(e) => Work::ready(op.name(), Err(e)),
        }
    }

    /// An asynchronous collective in place: `run` is the blocking call on `buf`'s bytes; `wait`
    /// gives `buf` back.
    #[track_caller]
    fn spawn_in_place<B: CollectiveBuffer>(
        &self,
        op: OpKind,
        mut buf: B,
        run: impl FnOnce(&Inner, u64, &mut [u8]) -> Result<()> + Send + 'static,
    ) -> Work<B> {
        self.spawn(op, move |inner, seq| {
            run(inner, seq, as_bytes_mut(buf.elements_mut())).map(|()| buf)
        })
    }

    /// An asynchronous collective from `send` into a new buffer of `recv_len` elements: `run` is the
    /// blocking call on their bytes; `wait` gives the new buffer.
    #[track_caller]
    fn spawn_alloc<S: CollectiveBuffer>(
        &self,
        op: OpKind,
        send: S,
        recv_len: usize,
        run: impl FnOnce(&Inner, u64, &[u8], &mut [u8]) -> Result<()> + Send + 'static,
    ) -> Work<Vec<S::Elem>> {
        self.spawn(op, move |inner, seq| {
            let mut recv = zeroed::<S::Elem>(recv_len);
            run(
                inner,
                seq,
                as_bytes(send.elements()),
                as_bytes_mut(&mut recv),
            )
            .map(|()| recv)
        })
    }

    /// An asynchronous collective from `send` into `recv`: `run` is the blocking call on their
    /// bytes; `wait` gives both back.
    #[track_caller]
    fn spawn_into<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        op: OpKind,
        send: S,
        mut recv: R,
        run: Box<Run2>,
    ) -> Work<(S, R)> {
        self.spawn(op, move |inner, seq| {
            run(
                inner,
                seq,
                as_bytes(send.elements()),
                as_bytes_mut(recv.elements_mut()),
            )
            .map(|()| (send, recv))
        })
    }

    /// Asynchronous [`Communicator::barrier`].
    #[track_caller]
    pub fn barrier_async(&self) -> Work<()> {
        self.spawn(OpKind::Barrier, |inner, seq| inner.barrier(seq))
    }

    /// Asynchronous [`Communicator::broadcast`].
    #[track_caller]
    pub fn broadcast_async<B: CollectiveBuffer>(&self, buf: B, root: usize) -> Work<B> {
        self.spawn_in_place(OpKind::Broadcast, buf, move |inner, seq, b| {
            inner.broadcast(seq, b, B::Elem::DTYPE, root)
        })
    }

    /// Asynchronous [`Communicator::all_reduce`].
    #[track_caller]
    pub fn all_reduce_async<B: CollectiveBuffer>(&self, buf: B, op: ReduceOp) -> Work<B> {
        self.spawn_in_place(OpKind::AllReduce, buf, move |inner, seq, b| {
            inner.all_reduce(seq, b, B::Elem::DTYPE, op)
        })
    }

    /// Asynchronous [`Communicator::reduce`].
    #[track_caller]
    pub fn reduce_async<B: CollectiveBuffer>(&self, buf: B, op: ReduceOp, root: usize) -> Work<B> {
        self.spawn_in_place(OpKind::Reduce, buf, move |inner, seq, b| {
            inner.reduce(seq, b, B::Elem::DTYPE, op, root)
        })
    }

    /// Asynchronous [`Communicator::reduce_scatter`]; the result has `send` / `size()` elements.
    #[track_caller]
    pub fn reduce_scatter_async<S: CollectiveBuffer>(
        &self,
        send: S,
        op: ReduceOp,
    ) -> Work<Vec<S::Elem>> {
        let len = send.elements().len() / self.size().max(1);
        self.spawn_alloc(OpKind::ReduceScatter, send, len, move |inner, seq, s, r| {
            inner.reduce_scatter(seq, s, r, S::Elem::DTYPE, op)
        })
    }

    /// Asynchronous [`Communicator::all_gather`]; the result has `size()` × `send` elements.
    #[track_caller]
    pub fn all_gather_async<S: CollectiveBuffer>(&self, send: S) -> Work<Vec<S::Elem>> {
        let len = send.elements().len() * self.size();
        self.spawn_alloc(OpKind::AllGather, send, len, |inner, seq, s, r| {
            inner.all_gather(seq, s, r, S::Elem::DTYPE, None)
        })
    }

    /// Asynchronous [`Communicator::all_gather_in_place`] (`counts`:
    /// [`Communicator::all_gather_v_in_place`]); `wait` gives `buf` back.
    #[track_caller]
    pub fn all_gather_in_place_async<B: CollectiveBuffer>(
        &self,
        buf: B,
        counts: Option<Vec<usize>>,
    ) -> Work<B> {
        let op = with_counts(OpKind::AllGather, OpKind::AllGatherV, counts.is_some());
        self.spawn_in_place(op, buf, move |inner, seq, b| {
            inner.all_gather_in_place(seq, b, B::Elem::DTYPE, counts.as_deref())
        })
    }

    /// Asynchronous [`Communicator::gather`]; the result is the gathered data on `root`, empty
    /// elsewhere.
    #[track_caller]
    pub fn gather_async<S: CollectiveBuffer>(&self, send: S, root: usize) -> Work<Vec<S::Elem>> {
        let len = if self.rank() == root {
            send.elements().len() * self.size()
        } else {
            0
        };
        self.spawn_alloc(OpKind::Gather, send, len, move |inner, seq, s, r| {
            inner.rooted(seq, (s, r), S::Elem::DTYPE, (None, root), Rooted::Gather)
        })
    }

    /// Asynchronous [`Communicator::scatter`]: every rank passes `count`, the root also `send`.
    #[track_caller]
    pub fn scatter_async<S: CollectiveBuffer>(
        &self,
        send: S,
        count: usize,
        root: usize,
    ) -> Work<Vec<S::Elem>> {
        self.spawn_alloc(OpKind::Scatter, send, count, move |inner, seq, s, r| {
            inner.rooted(seq, (s, r), S::Elem::DTYPE, (None, root), Rooted::Scatter)
        })
    }

    /// Asynchronous [`Communicator::all_to_all`].
    #[track_caller]
    pub fn all_to_all_async<S: CollectiveBuffer>(&self, send: S) -> Work<Vec<S::Elem>> {
        let len = send.elements().len();
        self.spawn_alloc(OpKind::AllToAll, send, len, |inner, seq, s, r| {
            inner.all_to_all(seq, s, r, S::Elem::DTYPE, None)
        })
    }

    /// Asynchronous [`Communicator::all_gather_v`]; the result has `counts.iter().sum()` elements.
    #[track_caller]
    pub fn all_gather_v_async<S: CollectiveBuffer>(
        &self,
        send: S,
        counts: Vec<usize>,
    ) -> Work<Vec<S::Elem>> {
        let len = counts.iter().sum();
        self.spawn_alloc(OpKind::AllGatherV, send, len, move |inner, seq, s, r| {
            inner.all_gather(seq, s, r, S::Elem::DTYPE, Some(&counts))
        })
    }

    /// Asynchronous [`Communicator::gather_v`]; the gathered data on `root`, empty elsewhere.
    #[track_caller]
    pub fn gather_v_async<S: CollectiveBuffer>(
        &self,
        send: S,
        counts: Vec<usize>,
        root: usize,
    ) -> Work<Vec<S::Elem>> {
        let len = if self.rank() == root {
            counts.iter().sum()
        } else {
            0
        };
        self.spawn_alloc(OpKind::GatherV, send, len, move |inner, seq, s, r| {
            inner.rooted(
                seq,
                (s, r),
                S::Elem::DTYPE,
                (Some(&counts), root),
                Rooted::Gather,
            )
        })
    }

    /// Asynchronous [`Communicator::scatter_v`]; this rank's `counts[rank]` elements.
    #[track_caller]
    pub fn scatter_v_async<S: CollectiveBuffer>(
        &self,
        send: S,
        counts: Vec<usize>,
        root: usize,
    ) -> Work<Vec<S::Elem>> {
        let len = counts.get(self.rank()).copied().unwrap_or(0);
        self.spawn_alloc(OpKind::ScatterV, send, len, move |inner, seq, s, r| {
            inner.rooted(
                seq,
                (s, r),
                S::Elem::DTYPE,
                (Some(&counts), root),
                Rooted::Scatter,
            )
        })
    }

    /// Asynchronous [`Communicator::all_to_all_v`].
    #[track_caller]
    pub fn all_to_all_v_async<S: CollectiveBuffer>(
        &self,
        send: S,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Work<Vec<S::Elem>> {
        let len = recv_counts.iter().sum();
        self.spawn_alloc(OpKind::AllToAllV, send, len, move |inner, seq, s, r| {
            inner.all_to_all(
                seq,
                s,
                r,
                S::Elem::DTYPE,
                Some((&send_counts, &recv_counts)),
            )
        })
    }
}

/// The `*_v` form of `plain` (`v`) where counts are given.
fn with_counts(plain: OpKind, v: OpKind, counts: bool) -> OpKind {
    if counts {
        v
    } else {
        plain
    }
}

/// The asynchronous collectives into a receive buffer of the caller's: the blocking call's
/// arguments, both buffers owned by the collective while it runs and given back by `wait` as
/// `(send, recv)`. Arguments are checked as in the blocking call, when the collective runs.
impl Communicator {
    /// Asynchronous [`Communicator::reduce_scatter`] into `recv`.
    #[track_caller]
    pub fn reduce_scatter_into_async<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        send: S,
        recv: R,
        op: ReduceOp,
    ) -> Work<(S, R)> {
        let run = move |inner: &Inner, seq, s: &[u8], r: &mut [u8]| {
            inner.reduce_scatter(seq, s, r, S::Elem::DTYPE, op)
        };
        self.spawn_into(OpKind::ReduceScatter, send, recv, Box::new(run))
    }

    /// Asynchronous [`Communicator::all_gather`] (`counts`: [`Communicator::all_gather_v`]) into
    /// `recv`.
    #[track_caller]
    pub fn all_gather_into_async<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        send: S,
        recv: R,
        counts: Option<Vec<usize>>,
    ) -> Work<(S, R)> {
        let op = with_counts(OpKind::AllGather, OpKind::AllGatherV, counts.is_some());
        let run = move |inner: &Inner, seq, s: &[u8], r: &mut [u8]| {
            inner.all_gather(seq, s, r, S::Elem::DTYPE, counts.as_deref())
        };
        self.spawn_into(op, send, recv, Box::new(run))
    }

    /// Asynchronous [`Communicator::gather`] (`counts`: [`Communicator::gather_v`]) into `recv`
    /// (used on `root` only); [`Communicator::scatter`] with `scatter`.
    #[track_caller]
    fn rooted_into_async<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        (send, recv): (S, R),
        counts: Option<Vec<usize>>,
        root: usize,
        scatter: bool,
    ) -> Work<(S, R)> {
        let op = match scatter {
            false => with_counts(OpKind::Gather, OpKind::GatherV, counts.is_some()),
            true => with_counts(OpKind::Scatter, OpKind::ScatterV, counts.is_some()),
        };
        let run = move |inner: &Inner, seq, s: &[u8], r: &mut [u8]| {
            let way = if scatter {
                Rooted::Scatter
            } else {
                Rooted::Gather
            };
            inner.rooted(seq, (s, r), S::Elem::DTYPE, (counts.as_deref(), root), way)
        };
        self.spawn_into(op, send, recv, Box::new(run))
    }

    /// Asynchronous [`Communicator::gather`] (`counts`: [`Communicator::gather_v`]) into `recv`
    /// (used on `root` only).
    #[track_caller]
    pub fn gather_into_async<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        send: S,
        recv: R,
        counts: Option<Vec<usize>>,
        root: usize,
    ) -> Work<(S, R)> {
        self.rooted_into_async((send, recv), counts, root, false)
    }

    /// Asynchronous [`Communicator::scatter`] (`counts`: [`Communicator::scatter_v`]) into `recv`
    /// (`send` used on `root` only).
    #[track_caller]
    pub fn scatter_into_async<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        send: S,
        recv: R,
        counts: Option<Vec<usize>>,
        root: usize,
    ) -> Work<(S, R)> {
        self.rooted_into_async((send, recv), counts, root, true)
    }

    /// Asynchronous [`Communicator::all_to_all`] (`counts` = `(send_counts, recv_counts)`:
    /// [`Communicator::all_to_all_v`]) into `recv`.
    #[track_caller]
    pub fn all_to_all_into_async<S: CollectiveBuffer, R: CollectiveBuffer<Elem = S::Elem>>(
        &self,
        send: S,
        recv: R,
        counts: Option<(Vec<usize>, Vec<usize>)>,
    ) -> Work<(S, R)> {
        let op = with_counts(OpKind::AllToAll, OpKind::AllToAllV, counts.is_some());
        let run = move |inner: &Inner, seq, s: &[u8], r: &mut [u8]| {
            let c = counts.as_ref().map(|(a, b)| (a.as_slice(), b.as_slice()));
            inner.all_to_all(seq, s, r, S::Elem::DTYPE, c)
        };
        self.spawn_into(op, send, recv, Box::new(run))
    }
}
