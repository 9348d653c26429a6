//! The [`Engine`] methods: each collective as NCCL's own where NCCL has it (all-reduce,
//! broadcast, reduce, reduce-scatter, all-gather), as one group of sends and receives otherwise
//! (the variable-size forms, gather, scatter, all-to-all), plus the agreement step and splits.

use std::sync::Arc;
use std::time::Instant;

use kolo_core::call::fnv1a;
use kolo_core::{DType, Engine, Error, Header, ReduceOp, Reducer, Result, HEADER_LEN};

use super::{int, lifecycle, Io, NcclEngine, RawComm};
use crate::ffi::{Comm, Config, SPLIT_NOCOLOR, SUCCESS};
use crate::types::{data_type, host_op, MAX, SUM, UINT64, UINT8};

impl NcclEngine {
    /// Every rank's `mine` (`len` bytes each), in rank order.
    fn all_gather_bytes(&self, op: &'static str, mine: &[u8]) -> Result<Vec<u8>> {
        let mut all = vec![0u8; mine.len() * self.size];
        self.all_gather_into(op, mine, &mut all)?;
        Ok(all)
    }

    /// Every rank's `send` (equal lengths) in rank order into `recv`: NCCL's all-gather on bytes.
    fn all_gather_into(&self, op: &'static str, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let len = send.len();
        self.staged(op, Io::Apart { send, recv }, |n, comm, s, src, dst| {
            // SAFETY: `src` holds `len` bytes, `dst` `len · size`.
            let rc = unsafe { (n.all_gather)(src, dst, len, UINT8, comm, s) };
            self.check(op, rc)
        })
    }

    /// The mismatch behind a failed agreement: every rank's header, the first differing named.
    fn explain(&self, header: &Header, mine: &[u8; HEADER_LEN]) -> Error {
        match self.all_gather_bytes(header.call.op.name(), mine) {
            Ok(all) => kolo_core::disagreement(header, self.rank, &all),
            Err(e) => e,
        }
    }

    /// A reduction of `dtype` elements: `Avg` finished on the host, like kolo's own algorithms.
    fn reduction(dtype: DType, op: ReduceOp) -> (i32, i32, Reducer) {
        (data_type(dtype), host_op(op), Reducer::new(dtype, op))
    }
}

impl Engine for NcclEngine {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn node_ids(&self) -> Result<Vec<String>> {
        Ok(self.node_ids.clone())
    }

    fn device(&self) -> Option<&dyn kolo_core::DeviceCollectives> {
        Some(self)
    }

    fn agree(
        &self,
        header: &Header,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let op = header.call.op.name();
        let mine = header.encode();
        let h = fnv1a(&[&mine]);
        // max(h) and max(!h) = !min(h): both equal this rank's only if every rank has h.
        let mut buf = [0u8; 16];
        buf[..8].copy_from_slice(&h.to_le_bytes());
        buf[8..].copy_from_slice(&(!h).to_le_bytes());
        let input = buf;
        let io = Io::InPlace {
            buf: &mut buf,
            back: true,
        };
        // The agreement waits as long as the communicator's timeout allows, and gives up early
        // when kolo's transport learns that a peer failed (`interrupted`).
        self.staged_until(op, io, (deadline, interrupted), |n, comm, s, src, dst| {
            // SAFETY: two u64 at `src` (= `dst`).
            let rc = unsafe { (n.all_reduce)(src, dst, 2, UINT64, MAX, comm, s) };
            self.check(op, rc)
        })
        .map_err(|e| match e {
            Error::Backend { .. } if Instant::now() >= deadline => Error::Stalled {
                op,
                rank: self.rank,
                call: header.call,
                waited: self.timeout,
            },
            e => e,
        })?;
        if buf == input {
            return Ok(());
        }
        Err(self.explain(header, &mine))
    }

    fn barrier(&self) -> Result<()> {
        // NCCL has no barrier: a one-byte all-reduce (what PyTorch's NCCL barrier does).
        let io = Io::InPlace {
            buf: &mut [0],
            back: false,
        };
        self.staged("barrier", io, |n, comm, s, src, dst| {
            // SAFETY: one byte at `src` (= `dst`).
            let rc = unsafe { (n.all_reduce)(src, dst, 1, UINT8, SUM, comm, s) };
            self.check("barrier", rc)
        })
    }

    fn broadcast(&self, buf: &mut [u8], dtype: DType, root: usize) -> Result<()> {
        let count = buf.len() / dtype.size();
        let r = int("broadcast", self.rank, "root", root)?;
        let io = Io::InPlace { buf, back: true };
        self.staged("broadcast", io, |n, comm, s, src, dst| {
            // SAFETY: `count` elements at `src` (= `dst`).
            let rc = unsafe { (n.broadcast)(src, dst, count, data_type(dtype), r, comm, s) };
            self.check("broadcast", rc)
        })
    }

    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let count = buf.len() / dtype.size();
        let (dt, rop, reducer) = Self::reduction(dtype, op);
        let io = Io::InPlace {
            buf: &mut *buf,
            back: true,
        };
        self.staged("all_reduce", io, |n, comm, s, src, dst| {
            // SAFETY: `count` elements at `src` (= `dst`).
            let rc = unsafe { (n.all_reduce)(src, dst, count, dt, rop, comm, s) };
            self.check("all_reduce", rc)
        })?;
        reducer.finish(buf, self.size);
        Ok(())
    }

    fn reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        let count = buf.len() / dtype.size();
        let (dt, rop, reducer) = Self::reduction(dtype, op);
        let r = int("reduce", self.rank, "root", root)?;
        // Only the root's buffer changes.
        let io = Io::InPlace {
            buf: &mut *buf,
            back: self.rank == root,
        };
        self.staged("reduce", io, |n, comm, s, src, dst| {
            // SAFETY: `count` elements at `src` (= `dst`).
            let rc = unsafe { (n.reduce)(src, dst, count, dt, rop, r, comm, s) };
            self.check("reduce", rc)
        })?;
        if self.rank == root {
            reducer.finish(buf, self.size);
        }
        Ok(())
    }

    fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = recv.len() / dtype.size();
        let (dt, rop, reducer) = Self::reduction(dtype, op);
        let io = Io::Apart {
            send,
            recv: &mut *recv,
        };
        self.staged("reduce_scatter", io, |n, comm, s, src, dst| {
            // SAFETY: `size · count` elements at `src`, `count` at `dst`.
            let rc = unsafe { (n.reduce_scatter)(src, dst, count, dt, rop, comm, s) };
            self.check("reduce_scatter", rc)
        })?;
        reducer.finish(recv, self.size);
        Ok(())
    }

    fn all_gather(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<()> {
        const OP: &str = "all_gather";
        let Some(counts) = counts else {
            return self.all_gather_into(OP, send, recv);
        };
        // Variable blocks: one broadcast per rank into its block, in one group.
        let blocks = self.blocks(OP, recv.len(), dtype, Some(counts))?;
        self.staged(OP, Io::Apart { send, recv }, |n, comm, s, src, dst| {
            // SAFETY: each block lies inside `dst`; `src` holds this rank's block.
            let rc = unsafe {
                let rc = (n.group_start)();
                if rc != SUCCESS {
                    return self.check(OP, rc);
                }
                let mut first = SUCCESS;
                for (root, &(off, len)) in blocks.iter().enumerate() {
                    let d = (dst as usize + off) as *mut std::ffi::c_void;
                    let rc = (n.broadcast)(src, d, len, UINT8, root as i32, comm, s);
                    if first == SUCCESS {
                        first = rc;
                    }
                }
                let end = (n.group_end)();
                if first == SUCCESS {
                    end
                } else {
                    first
                }
            };
            self.check(OP, rc)
        })
    }

    fn gather(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        const OP: &str = "gather";
        let total = if self.rank == root {
            recv.len()
        } else {
            send.len() * self.size
        };
        let blocks = self.blocks(OP, total, dtype, counts)?;
        let me = self.rank;
        if me != root {
            let io = Io::Apart {
                send,
                recv: &mut [],
            };
            return self.staged(OP, io, |n, comm, s, src, dst| {
                let rc = Self::exchange(n, (comm, s), (src, dst), &[(root, 0, send.len())], &[]);
                self.check(OP, rc)
            });
        }
        let recvs: Vec<_> = (0..self.size)
            .filter(|&r| r != me)
            .map(|r| (r, blocks[r].0, blocks[r].1))
            .collect();
        let io = Io::Apart {
            send: &[],
            recv: &mut *recv,
        };
        self.staged(OP, io, |n, comm, s, src, dst| {
            let rc = Self::exchange(n, (comm, s), (src, dst), &[], &recvs);
            self.check(OP, rc)
        })?;
        let (off, len) = blocks[me];
        recv[off..off + len].copy_from_slice(&send[..len]);
        Ok(())
    }

    fn scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()> {
        const OP: &str = "scatter";
        let me = self.rank;
        if me != root {
            let len = recv.len();
            let io = Io::Apart { send: &[], recv };
            return self.staged(OP, io, |n, comm, s, src, dst| {
                let rc = Self::exchange(n, (comm, s), (src, dst), &[], &[(root, 0, len)]);
                self.check(OP, rc)
            });
        }
        let blocks = self.blocks(OP, send.len(), dtype, counts)?;
        let sends: Vec<_> = (0..self.size)
            .filter(|&r| r != me)
            .map(|r| (r, blocks[r].0, blocks[r].1))
            .collect();
        let io = Io::Apart {
            send,
            recv: &mut [],
        };
        self.staged(OP, io, |n, comm, s, src, dst| {
            let rc = Self::exchange(n, (comm, s), (src, dst), &sends, &[]);
            self.check(OP, rc)
        })?;
        let (off, len) = blocks[me];
        recv[..len].copy_from_slice(&send[off..off + len]);
        Ok(())
    }

    fn all_to_all(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<(&[usize], &[usize])>,
    ) -> Result<()> {
        const OP: &str = "all_to_all";
        let me = self.rank;
        let sb = self.blocks(OP, send.len(), dtype, counts.map(|c| c.0))?;
        let rb = self.blocks(OP, recv.len(), dtype, counts.map(|c| c.1))?;
        if sb[me].1 != rb[me].1 {
            return Err(Error::InvalidArgument {
                op: OP,
                rank: me,
                arg: "counts",
                reason: format!(
                    "this rank sends itself {} bytes but expects {}",
                    sb[me].1, rb[me].1
                ),
            });
        }
        let peers = || (0..self.size).filter(move |&r| r != me);
        let sends: Vec<_> = peers().map(|r| (r, sb[r].0, sb[r].1)).collect();
        let recvs: Vec<_> = peers().map(|r| (r, rb[r].0, rb[r].1)).collect();
        let io = Io::Apart {
            send,
            recv: &mut *recv,
        };
        self.staged(OP, io, |n, comm, s, src, dst| {
            let rc = Self::exchange(n, (comm, s), (src, dst), &sends, &recvs);
            self.check(OP, rc)
        })?;
        let ((so, len), (ro, _)) = (sb[me], rb[me]);
        recv[ro..ro + len].copy_from_slice(&send[so..so + len]);
        Ok(())
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Arc<dyn Engine>>> {
        const OP: &str = "split";
        let c = match color {
            None => SPLIT_NOCOLOR,
            Some(c) => int(OP, self.rank, "color", c as usize)?,
        };
        let k = i32::try_from(key).map_err(|_| Error::InvalidArgument {
            op: OP,
            rank: self.rank,
            arg: "key",
            reason: format!("{key} is outside NCCL's int range"),
        })?;
        // Every rank's (color, key) first: the new group's members, in NCCL's order (key, then
        // rank), give each member's node.
        let mut mine = [0u8; 8];
        mine[..4].copy_from_slice(&c.to_le_bytes());
        mine[4..].copy_from_slice(&k.to_le_bytes());
        let all = self.all_gather_bytes(OP, &mine)?;
        let mut members: Vec<(i32, usize)> = all
            .chunks_exact(8)
            .enumerate()
            .filter_map(|(r, b)| {
                let rc = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let rk = i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                (rc == c && c != SPLIT_NOCOLOR).then_some((rk, r))
            })
            .collect();
        members.sort();
        let mut guard = self.lock(OP)?;
        self.gpu.bind(OP, self.rank)?;
        let mut out: Comm = std::ptr::null_mut();
        let mut config = Config::non_blocking();
        // SAFETY: live communicator; `out` is written by NCCL; the config outlives the call.
        let rc = unsafe { (self.nccl.comm_split)(guard.comm.0, c, k, &mut out, &mut config) };
        self.check(OP, rc)?;
        // The split is a call on this communicator, then the new one joins: both within the
        // timeout, or both are aborted (a rank that never splits).
        let deadline = Instant::now() + self.timeout;
        let joined = self
            .settle(OP, guard.comm.0, deadline, &*self.watch)
            .and_then(|settled| match settled && !out.is_null() {
                true => lifecycle::poll(deadline, &*self.watch, || {
                    self.async_error(OP, out).map(|busy| !busy)
                }),
                false => Ok(settled),
            });
        let failure = match joined {
            Ok(true) => None,
            Ok(false) => Some(Error::Backend {
                op: OP,
                rank: self.rank,
                backend: "nccl",
                reason: format!(
                    "ncclCommSplit did not complete within {:?}: not every rank split (the NCCL \
                     communicator is aborted)",
                    self.timeout
                ),
            }),
            Err(e) => Some(e),
        };
        if let Some(e) = failure {
            if !out.is_null() {
                // SAFETY: the half-made communicator is never used again.
                unsafe { (self.nccl.comm_abort)(out) };
            }
            return Err(self.abort(&mut guard, e));
        }
        drop(guard);
        if out.is_null() {
            return Ok(None);
        }
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .ok_or_else(|| Error::Protocol {
                rank: self.rank,
                peer: self.rank,
                reason: "NCCL made a communicator this rank is not in".into(),
            })?;
        let node_ids = members
            .iter()
            .map(|&(_, r)| self.node_ids[r].clone())
            .collect();
        Ok(Some(Arc::new(NcclEngine::over(
            self.nccl,
            RawComm(out),
            (rank, members.len()),
            node_ids,
            (self.timeout, self.watch.clone()),
            self.gpu.clone(),
        ))))
    }
}
