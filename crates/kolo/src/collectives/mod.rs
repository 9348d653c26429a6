//! Collective operations of a [`Communicator`](crate::Communicator), typed over
//! [`Element`](kolo_core::Element), blocking ([`blocking`]) and asynchronous ([`nonblocking`]).
//!
//! Each operation checks its arguments on this rank ([`check`]), builds the call's fingerprint with
//! the algorithm the cost model chooses (`kolo_collectives::select::choose`) and makes one call on
//! the communicator's [`Backend`](crate::backend::Backend). Argument errors poison the communicator
//! just like communication errors, so that the other ranks of the collective fail too instead of
//! waiting.

mod blocking;
mod check;
pub(crate) mod device;
mod int_avg;
mod nonblocking;

use kolo_collectives::algorithms::barrier_monitored;
use kolo_collectives::select;
use kolo_core::dtype::{as_bytes, as_bytes_mut};
use kolo_core::{Algorithm, Call, DType, Error, OpKind, ReduceOp, Result};

use crate::backend::{Collective, Job};
use crate::communicator::Inner;
use check::{Check, Piece};

/// Which way a rooted collective moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rooted {
    /// Every rank's piece to the root.
    Gather,
    /// The root's pieces to every rank.
    Scatter,
}

impl Inner {
    fn check_args<R>(&self, op: OpKind, f: impl FnOnce(&Check) -> Result<R>) -> Result<R> {
        self.check()?;
        f(&Check { inner: self, op }).map_err(|e| self.poison(e))
    }

    /// The algorithm of `op` on `count` elements of `elem` bytes on this communicator.
    pub(crate) fn choose(&self, op: OpKind, count: usize, elem: usize) -> Algorithm {
        select::choose(
            op,
            count,
            elem,
            self.backend.group(),
            &self.config.overrides,
        )
    }

    /// Collective `seq` as its backend sees it, started now (recorded as started).
    fn job(&self, seq: u64, call: Call) -> Job<'_> {
        let at = self.recorder.start(seq, &call);
        Job {
            comm: self,
            seq,
            call,
            at,
        }
    }

    pub(crate) fn barrier(&self, seq: u64) -> Result<()> {
        let call = Call::new(OpKind::Barrier, self.choose(OpKind::Barrier, 0, 0));
        self.exec(seq, call, Collective::Barrier)
    }

    /// kolo's own barrier over the transport, whatever the backend (engines have no such barrier).
    pub(crate) fn monitored_barrier(&self, seq: u64, timeout: std::time::Duration) -> Result<()> {
        let call = Call::new(OpKind::Barrier, Algorithm::Direct);
        self.exec_own(seq, call, timeout, false, barrier_monitored::barrier)
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
        let c = Collective::Broadcast { buf, dtype, root };
        self.exec(seq, call, c)
    }

    pub(crate) fn all_reduce(
        &self,
        seq: u64,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = buf.len() / dtype.size();
        let call = self.check_args(OpKind::AllReduce, |c| {
            Ok(c.call(dtype, count, Some(op), None))
        })?;
        if int_avg::applies(dtype, op) {
            let mut wide = int_avg::widen(dtype, buf);
            let c = Collective::AllReduce {
                buf: as_bytes_mut(&mut wide),
                dtype: DType::I64,
                op: ReduceOp::Sum,
            };
            self.exec(seq, call, c)?;
            int_avg::narrow(dtype, &wide, self.size(), buf);
            return Ok(());
        }
        let c = Collective::AllReduce { buf, dtype, op };
        self.exec(seq, call, c)
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
        if int_avg::applies(dtype, op) {
            let mut wide = int_avg::widen(dtype, buf);
            let c = Collective::Reduce {
                buf: as_bytes_mut(&mut wide),
                dtype: DType::I64,
                op: ReduceOp::Sum,
                root,
            };
            self.exec(seq, call, c)?;
            if self.rank == root {
                int_avg::narrow(dtype, &wide, self.size(), buf);
            }
            return Ok(());
        }
        let c = Collective::Reduce {
            buf,
            dtype,
            op,
            root,
        };
        self.exec(seq, call, c)
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
            c.len("send", dtype, send.len() / e, count * n)?;
            Ok(c.call(dtype, count, Some(op), None))
        })?;
        if int_avg::applies(dtype, op) {
            let wide_send = int_avg::widen(dtype, send);
            let mut wide = int_avg::widen(dtype, recv);
            let c = Collective::ReduceScatter {
                send: as_bytes(&wide_send),
                recv: as_bytes_mut(&mut wide),
                dtype: DType::I64,
                op: ReduceOp::Sum,
            };
            self.exec(seq, call, c)?;
            int_avg::narrow(dtype, &wide, self.size(), recv);
            return Ok(());
        }
        let c = Collective::ReduceScatter {
            send,
            recv,
            dtype,
            op,
        };
        self.exec(seq, call, c)
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
        let e = dtype.size();
        let (mine, total) = (send.len() / e, recv.len() / e);
        let call = self.all_gather_call(dtype, counts, Some(mine), ("recv", total))?;
        let c = Collective::AllGather {
            send,
            recv,
            dtype,
            counts,
        };
        self.exec(seq, call, c)
    }

    /// The all-gather of `mine` (the same count on every rank) that a group-forming call (`op`:
    /// [`OpKind::Split`] or [`OpKind::NewGroup`]) starts with, under that call's own name.
    pub(crate) fn group_gather(
        &self,
        op: OpKind,
        seq: u64,
        mine: &[i64],
        all: &mut [i64],
    ) -> Result<()> {
        let n = self.size();
        let call = self.check_args(op, |c| {
            c.len("recv", DType::I64, all.len(), mine.len() * n)?;
            Ok(c.call(DType::I64, mine.len(), None, None))
        })?;
        let c = Collective::AllGather {
            send: as_bytes(mine),
            recv: as_bytes_mut(all),
            dtype: DType::I64,
            counts: None,
        };
        self.exec(seq, call, c)
    }

    /// All-gather in place: `buf` holds every rank's block, this rank's filled in; `counts` is
    /// `None` for the equal-count form. Agrees with ranks that call [`Inner::all_gather`].
    pub(crate) fn all_gather_in_place(
        &self,
        seq: u64,
        buf: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<()> {
        let call = self.all_gather_call(dtype, counts, None, ("buf", buf.len() / dtype.size()))?;
        let c = Collective::AllGatherInPlace { buf, dtype, counts };
        self.exec(seq, call, c)
    }

    /// The checked call of an all-gather of `mine` elements a rank (`None`: in place, as many as
    /// a rank's block of the `total` elements holds) into `total` elements of `recv_arg`.
    fn all_gather_call(
        &self,
        dtype: DType,
        counts: Option<&[usize]>,
        mine: Option<usize>,
        (recv_arg, total): (&'static str, usize),
    ) -> Result<Call> {
        let n = self.size();
        let op = if counts.is_some() {
            OpKind::AllGatherV
        } else {
            OpKind::AllGather
        };
        self.check_args(op, |c| match counts {
            None => {
                // In place, a whole block per rank.
                let mine = mine.unwrap_or(total / n.max(1));
                c.len(recv_arg, dtype, total, mine * n)?;
                Ok(c.call(dtype, mine, None, None))
            }
            Some(counts) => {
                let sum = c.counts("counts", counts)?;
                if let Some(mine) = mine {
                    c.len("send", dtype, mine, counts[self.rank])?;
                }
                c.len(recv_arg, dtype, total, sum)?;
                Ok(c.call_v(dtype, counts, None))
            }
        })
    }

    /// Gather to `root` or scatter from it (`way`); `counts` is `None` for the equal-count form.
    pub(crate) fn rooted(
        &self,
        seq: u64,
        (send, recv): (&[u8], &mut [u8]),
        dtype: DType,
        (counts, root): (Option<&[usize]>, usize),
        way: Rooted,
    ) -> Result<()> {
        let scatter = way == Rooted::Scatter;
        let call = self.rooted_call((send.len(), recv.len()), dtype, counts, root, scatter)?;
        let c = Collective::Rooted {
            send,
            recv,
            dtype,
            counts,
            root,
            scatter,
        };
        self.exec(seq, call, c)
    }

    /// The checked fingerprint of a gather (`scatter`: a scatter) with buffers of `(send, recv)`
    /// bytes: one rank's piece and the root's whole buffer.
    fn rooted_call(
        &self,
        (send, recv): (usize, usize),
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
        scatter: bool,
    ) -> Result<Call> {
        let e = dtype.size();
        let (send, recv) = (
            Piece {
                arg: "send",
                len: send / e,
            },
            Piece {
                arg: "recv",
                len: recv / e,
            },
        );
        let (op, piece, whole) = match (scatter, counts.is_some()) {
            (false, false) => (OpKind::Gather, send, recv),
            (false, true) => (OpKind::GatherV, send, recv),
            (true, false) => (OpKind::Scatter, recv, send),
            (true, true) => (OpKind::ScatterV, recv, send),
        };
        self.check_args(op, |c| c.rooted(dtype, counts, root, piece, whole))
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
        let call = self.check_args(op, |c| match counts {
            None => {
                let len = send.len() / e;
                c.len("recv", dtype, recv.len() / e, len)?;
                if !len.is_multiple_of(n) {
                    return Err(Error::InvalidArgument {
                        op: op.name(),
                        rank: self.rank,
                        arg: "send",
                        reason: format!("{len} elements do not split evenly among {n} ranks"),
                    });
                }
                Ok(c.call(dtype, len / n, None, None))
            }
            Some((sc, rc)) => {
                let st = c.counts("send_counts", sc)?;
                let rt = c.counts("recv_counts", rc)?;
                c.len("send", dtype, send.len() / e, st)?;
                c.len("recv", dtype, recv.len() / e, rt)?;
                let me = self.rank;
                if sc[me] != rc[me] {
                    return Err(Error::InvalidArgument {
                        op: op.name(),
                        rank: me,
                        arg: "recv_counts",
                        reason: format!(
                            "rank {me} sends itself {} elements (send_counts[{me}]) but expects \
                             {} from itself (recv_counts[{me}])",
                            sc[me], rc[me]
                        ),
                    });
                }
                // Counts differ per rank by design; message lengths are checked on receipt.
                Ok(c.call(dtype, 0, None, None))
            }
        })?;
        let c = Collective::AllToAll {
            send,
            recv,
            dtype,
            counts,
        };
        self.exec(seq, call, c)
    }
}
