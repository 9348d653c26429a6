//! [`NcclEngine`]: kolo's [`Engine`] on an NCCL communicator. Host buffers are staged through
//! device memory (upload, NCCL on the engine's stream, download); GPU memory goes straight to NCCL
//! ([`kolo_core::DeviceCollectives`], `device_ops.rs`). The communicator is non-blocking (NCCL's
//! `blocking = 0`), so that no call can hold a thread past its deadline: joining, splitting,
//! every collective and the final flush poll NCCL with the communicator's timeout and kolo's
//! heartbeats, and a wait that runs out aborts the NCCL communicator (`ncclCommAbort`, as
//! PyTorch's watchdog does) and returns an error instead of hanging (`lifecycle.rs`).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use kolo_core::{DType, Error, Result};

use crate::device::{download, ptr, ptr_mut, upload, Gpu, Staging};
use crate::ffi::{self, Comm, Nccl, RawId, Status, Stream, SUCCESS, UNIQUE_ID_BYTES};
use crate::types::UINT8;

/// What the engine polls while it waits on NCCL or the GPU: `Err` when kolo's transport learned
/// that a peer failed (its heartbeats), so a wait ends at once instead of at the timeout.
pub type Watch = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// What rank 0 creates (`ncclGetUniqueId`) and every rank needs to join the communicator: 128
/// opaque bytes, passed around through kolo's rendezvous store.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId([u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

impl NcclId {
    /// A new id (NCCL's bootstrap address of this process); on rank 0 only.
    pub fn new() -> Result<NcclId> {
        let n = ffi::nccl()?;
        let mut raw = RawId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: `raw` is a valid out-parameter of the right size.
        let rc = unsafe { (n.get_unique_id)(&mut raw) };
        if rc != SUCCESS {
            return Err(ffi::unavailable(format!(
                "ncclGetUniqueId: {}",
                n.describe(rc)
            )));
        }
        Ok(NcclId(raw.internal.map(|c| c as u8)))
    }

    /// The id's bytes, to publish.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// An id from the bytes another rank published.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId> {
        let b: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            ffi::unavailable(format!(
                "an NCCL unique id has {UNIQUE_ID_BYTES} bytes, the store held {}",
                bytes.len()
            ))
        })?;
        Ok(NcclId(b))
    }

    fn raw(&self) -> RawId {
        RawId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

/// An NCCL communicator handle; used only under the engine's lock.
struct RawComm(Comm);
// SAFETY: NCCL communicators may be used from any thread, one call at a time (the engine's mutex).
unsafe impl Send for RawComm {}

/// What the lock guards: the communicator, the staging buffers and the queued device
/// collectives.
struct State {
    comm: RawComm,
    a: Staging,
    b: Staging,
    /// Why the communicator was aborted, once it was.
    aborted: Option<String>,
    /// Device collectives queued and not yet waited for: each one's completion event.
    inflight: HashMap<u64, CudaEvent>,
    /// The next device collective's ticket.
    next_ticket: u64,
}

/// What a staged operation reads and writes on the host.
enum Io<'a> {
    /// `buf` goes into staging buffer A, the operation runs in place there, and A comes back into
    /// `buf` when `back` (a reduce's other ranks keep theirs).
    InPlace { buf: &'a mut [u8], back: bool },
    /// `send` goes into A, the operation writes staging buffer B, and B comes back into `recv`
    /// (empty where this rank receives nothing).
    Apart { send: &'a [u8], recv: &'a mut [u8] },
}

/// Whole collectives over NCCL, one process per GPU.
pub struct NcclEngine {
    nccl: &'static Nccl,
    rank: usize,
    size: usize,
    node_ids: Vec<String>,
    timeout: Duration,
    pub(crate) gpu: Arc<Gpu>,
    watch: Watch,
    state: Mutex<State>,
}

impl std::fmt::Debug for NcclEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclEngine")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("library", &self.nccl.name)
            .finish()
    }
}

impl NcclEngine {
    /// Joins the NCCL communicator `id` names as `rank` of `size`, on the GPU of local rank
    /// `local_rank` (GPU `local_rank`, or `KOLO_CUDA_DEVICE`: [`kolo_core::gpu::device_ordinal`]).
    /// `node_ids` names each rank's host (rank order); `timeout` bounds the join and every
    /// collective; `watch` is polled by every wait (a peer that failed: its error is returned at
    /// once). Collective: every rank calls it with the same id.
    pub fn new(
        id: &NcclId,
        (rank, size): (usize, usize),
        local_rank: usize,
        node_ids: Vec<String>,
        timeout: Duration,
        watch: Watch,
    ) -> Result<NcclEngine> {
        if rank >= size {
            return Err(Error::RankOutOfRange {
                op: "init",
                rank,
                arg: "rank",
                value: rank,
                size,
            });
        }
        if node_ids.len() != size {
            return Err(Error::InvalidArgument {
                op: "init",
                rank,
                arg: "node_ids",
                reason: format!("{} node ids for {size} ranks", node_ids.len()),
            });
        }
        let nccl = ffi::nccl().map_err(|e| at_rank(e, rank))?;
        crate::driver_present().map_err(|e| at_rank(e, rank))?;
        let gpu = Arc::new(Gpu::open(local_rank, rank)?);
        let comm = lifecycle::join(nccl, &gpu, id, (rank, size), timeout, &*watch)?;
        Ok(NcclEngine::over(
            nccl,
            comm,
            (rank, size),
            node_ids,
            (timeout, watch),
            gpu,
        ))
    }

    fn over(
        nccl: &'static Nccl,
        comm: RawComm,
        (rank, size): (usize, usize),
        node_ids: Vec<String>,
        (timeout, watch): (Duration, Watch),
        gpu: Arc<Gpu>,
    ) -> NcclEngine {
        NcclEngine {
            nccl,
            rank,
            size,
            node_ids,
            timeout,
            gpu,
            watch,
            state: Mutex::new(State {
                comm,
                a: Staging::default(),
                b: Staging::default(),
                aborted: None,
                inflight: HashMap::new(),
                next_ticket: 0,
            }),
        }
    }

    /// The GPU (CUDA device ordinal) this engine's collectives run on.
    pub fn device(&self) -> usize {
        self.gpu.ctx.ordinal()
    }

    fn stream(&self) -> Stream {
        self.gpu.stream.cu_stream() as Stream
    }

    /// The engine's lock; an error once the communicator was aborted.
    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, State>> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.aborted {
            return Err(Error::Backend {
                op,
                rank: self.rank,
                backend: "nccl",
                reason: format!("the NCCL communicator was aborted earlier: {why}"),
            });
        }
        Ok(st)
    }

    /// An error for a failed NCCL call. `ncclInProgress` is no error: the call goes on in the
    /// background, and [`NcclEngine::complete`] (or [`NcclEngine::settle`]) waits for it.
    fn check(&self, op: &'static str, rc: Status) -> Result<()> {
        if rc == SUCCESS || rc == ffi::IN_PROGRESS {
            return Ok(());
        }
        Err(Error::Backend {
            op,
            rank: self.rank,
            backend: "nccl",
            reason: self.nccl.describe(rc),
        })
    }

    /// Waits for the queued work until `deadline`; past it, or on an error NCCL reports, aborts
    /// the communicator (later calls fail at once) and returns the error.
    fn complete(
        &self,
        op: &'static str,
        st: &mut State,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let stream = self.gpu.stream.cu_stream();
        self.wait_until(op, st, (deadline, interrupted), &|| {
            crate::device::query(op, self.rank, "stream", || {
                // SAFETY: the stream is alive (owned by the engine's GPU).
                unsafe { cudarc::driver::sys::cuStreamQuery(stream) }
            })
        })
    }

    /// Waits until `done` says so: first for NCCL to have queued the last call (a non-blocking
    /// communicator's `ncclInProgress`), then for the GPU, polling NCCL's asynchronous error,
    /// `interrupted` and the engine's watch. Past `deadline`, or on an error, the communicator is
    /// aborted and the error returned.
    fn wait_until(
        &self,
        op: &'static str,
        st: &mut State,
        (deadline, interrupted): (Instant, &dyn Fn() -> Result<()>),
        done: &dyn Fn() -> Result<bool>,
    ) -> Result<()> {
        let started = Instant::now();
        let stop = || {
            interrupted()?;
            (self.watch)()
        };
        let outcome = self
            .settle(op, st.comm.0, deadline, &stop)
            .and_then(|settled| {
                if !settled {
                    return Ok(false);
                }
                let async_error = || self.async_error(op, st.comm.0).map(|_| ());
                self.gpu
                    .wait(op, self.rank, deadline, &stop, &async_error, done)
            });
        let error = match outcome {
            Ok(true) => return Ok(()),
            Ok(false) => Error::Backend {
                op,
                rank: self.rank,
                backend: "nccl",
                reason: format!(
                    "the collective did not complete within {:?}: a rank is dead, stalled or \
                     in another call (the NCCL communicator is aborted)",
                    started.elapsed()
                ),
            },
            Err(e) => e,
        };
        Err(self.abort(st, error))
    }

    /// NCCL's asynchronous state of `comm`: `Ok(true)` while a call is still in progress,
    /// `Ok(false)` when idle, the error it reports otherwise.
    fn async_error(&self, op: &'static str, comm: Comm) -> Result<bool> {
        let mut e: Status = SUCCESS;
        // SAFETY: `comm` is this engine's live communicator.
        let rc = unsafe { (self.nccl.comm_get_async_error)(comm, &mut e) };
        self.check(op, rc)?;
        match e {
            SUCCESS => Ok(false),
            ffi::IN_PROGRESS => Ok(true),
            e => self.check(op, e).map(|()| false),
        }
    }

    /// Waits until NCCL has finished queuing the last call on `comm` (`Ok(true)`), or `deadline`
    /// passes (`Ok(false)`), or an error.
    fn settle(
        &self,
        op: &'static str,
        comm: Comm,
        deadline: Instant,
        stop: &dyn Fn() -> Result<()>,
    ) -> Result<bool> {
        lifecycle::poll(deadline, stop, || {
            self.async_error(op, comm).map(|busy| !busy)
        })
    }

    /// Aborts the communicator after `error` (later calls fail at once with it) and returns it.
    fn abort(&self, st: &mut State, error: Error) -> Error {
        if !st.comm.0.is_null() {
            // SAFETY: `comm` is live; after the abort it is never used again (`aborted` is set).
            unsafe { (self.nccl.comm_abort)(st.comm.0) };
        }
        st.comm = RawComm(std::ptr::null_mut());
        st.inflight.clear();
        st.aborted = Some(error.to_string());
        error
    }

    /// Runs one NCCL operation on staged buffers (see [`Io`]) within the communicator's timeout.
    fn staged(
        &self,
        op: &'static str,
        io: Io<'_>,
        enqueue: impl FnOnce(&Nccl, Comm, Stream, *const c_void, *mut c_void) -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        self.staged_until(op, io, (deadline, &|| Ok(())), enqueue)
    }

    /// [`NcclEngine::staged`] until `deadline`, giving up early with `interrupted`'s error.
    /// `enqueue` gets the communicator, the stream and the device addresses of staging buffer A
    /// (the input) and of the output (A itself in place, else B).
    fn staged_until(
        &self,
        op: &'static str,
        io: Io<'_>,
        (deadline, interrupted): (Instant, &dyn Fn() -> Result<()>),
        enqueue: impl FnOnce(&Nccl, Comm, Stream, *const c_void, *mut c_void) -> Result<()>,
    ) -> Result<()> {
        let mut guard = self.lock(op)?;
        self.gpu.bind(op, self.rank)?;
        let st = &mut *guard;
        let gpu = &*self.gpu;
        let input: &[u8] = match &io {
            Io::InPlace { buf, .. } => buf,
            Io::Apart { send, .. } => send,
        };
        let a = st.a.ensure(gpu, input.len(), self.rank)?;
        upload(gpu, input, a, self.rank)?;
        let src = ptr(gpu, a, 0);
        let dst = match &io {
            Io::InPlace { .. } => ptr_mut(gpu, a, 0),
            Io::Apart { recv, .. } => ptr_mut(gpu, st.b.ensure(gpu, recv.len(), self.rank)?, 0),
        };
        enqueue(self.nccl, st.comm.0, self.stream(), src, dst)?;
        self.complete(op, st, deadline, interrupted)?;
        match io {
            Io::InPlace { buf, back: true } => {
                let a = st.a.ensure(gpu, buf.len(), self.rank)?;
                download(gpu, a, buf, self.rank)
            }
            Io::InPlace { back: false, .. } => Ok(()),
            Io::Apart { recv, .. } => {
                let b = st.b.ensure(gpu, recv.len(), self.rank)?;
                download(gpu, b, recv, self.rank)
            }
        }
    }

    /// Byte offsets and lengths of the `size` blocks of a buffer: equal blocks of `total` bytes,
    /// or `counts` elements of `dtype` each.
    fn blocks(
        &self,
        op: &'static str,
        total: usize,
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<Vec<(usize, usize)>> {
        let lens: Vec<usize> = match counts {
            None => vec![total / self.size; self.size],
            Some(c) if c.len() == self.size => c.iter().map(|n| n * dtype.size()).collect(),
            Some(c) => {
                return Err(Error::InvalidArgument {
                    op,
                    rank: self.rank,
                    arg: "counts",
                    reason: format!("{} counts for {} ranks", c.len(), self.size),
                })
            }
        };
        let mut at = 0;
        Ok(lens
            .into_iter()
            .map(|len| {
                let b = (at, len);
                at += len;
                b
            })
            .collect())
    }

    /// Point-to-point transfers as one NCCL group: `sends` (peer, offset in A, bytes) and
    /// `recvs` (peer, offset in B, bytes).
    fn exchange(
        n: &Nccl,
        (comm, stream): (Comm, Stream),
        (src, dst): (*const c_void, *mut c_void),
        sends: &[(usize, usize, usize)],
        recvs: &[(usize, usize, usize)],
    ) -> Status {
        // SAFETY: the offsets and lengths lie inside the staged buffers (the callers derive both
        // from the same blocks); the group is always closed.
        unsafe {
            let rc = (n.group_start)();
            if rc != SUCCESS {
                return rc;
            }
            let mut first_error = SUCCESS;
            for &(peer, off, len) in sends {
                let p = (src as usize + off) as *const c_void;
                let rc = (n.send)(p, len, UINT8, peer as c_int, comm, stream);
                if first_error == SUCCESS {
                    first_error = rc;
                }
            }
            for &(peer, off, len) in recvs {
                let p = (dst as usize + off) as *mut c_void;
                let rc = (n.recv)(p, len, UINT8, peer as c_int, comm, stream);
                if first_error == SUCCESS {
                    first_error = rc;
                }
            }
            let rc = (n.group_end)();
            if first_error == SUCCESS {
                rc
            } else {
                first_error
            }
        }
    }
}

impl Drop for NcclEngine {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if st.aborted.is_none() && !st.comm.0.is_null() {
            let comm = std::mem::replace(&mut st.comm, RawComm(std::ptr::null_mut()));
            lifecycle::close(self.nccl, &self.gpu, comm, self.timeout);
        }
    }
}

/// `v` as a C int, or an error naming `arg`.
fn int(op: &'static str, rank: usize, arg: &'static str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::InvalidArgument {
        op,
        rank,
        arg,
        reason: format!("{v} is outside NCCL's int range"),
    })
}

/// `e` with its rank set to `rank` (errors from the library loader name rank 0).
fn at_rank(e: Error, rank: usize) -> Error {
    match e {
        Error::Backend {
            op,
            backend,
            reason,
            ..
        } => Error::Backend {
            op,
            rank,
            backend,
            reason,
        },
        other => other,
    }
}

mod collectives;
mod device_ops;
mod lifecycle;
