//! [`NcclEngine`]: kolo's [`Engine`] on an NCCL communicator. Host buffers are staged through
//! device memory (upload, NCCL on the engine's stream, download); GPU tensors go straight to NCCL
//! ([`NcclEngine::all_reduce_device`]). Every wait on the GPU has a deadline: a collective that
//! does not complete in the communicator's timeout aborts the NCCL communicator (`ncclCommAbort`,
//! as PyTorch's watchdog does) and returns an error instead of hanging.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kolo_core::{DType, Error, ReduceOp, Result};

use crate::device::{download, ptr, ptr_mut, upload, Gpu, Staging};
use crate::ffi::{self, Comm, Nccl, RawId, Status, Stream, SUCCESS, UNIQUE_ID_BYTES};
use crate::types::{data_type, UINT8};

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

/// What the lock guards: the communicator and the staging buffers.
struct State {
    comm: RawComm,
    a: Staging,
    b: Staging,
    /// Why the communicator was aborted, once it was.
    aborted: Option<String>,
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
    gpu: Arc<Gpu>,
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
    /// Joins the NCCL communicator `id` names as `rank` of `size`, on GPU `device` of this host.
    /// `node_ids` names each rank's host (rank order); `timeout` bounds the join and every
    /// collective; `interrupted` is polled while waiting for the others to join (a peer that
    /// failed: its error is returned). Collective: every rank calls it with the same id.
    pub fn new(
        id: &NcclId,
        (rank, size): (usize, usize),
        device: usize,
        node_ids: Vec<String>,
        timeout: Duration,
        interrupted: &dyn Fn() -> Result<()>,
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
        let gpu = Arc::new(Gpu::open(device, rank)?);
        let (n, r) = (
            int("init", rank, "size", size)?,
            int("init", rank, "rank", rank)?,
        );
        let raw = id.raw();
        // ncclCommInitRank blocks until every rank has joined; a rank that never comes would
        // hold this one forever, so it runs on a thread waited for with the timeout.
        let (tx, rx) = std::sync::mpsc::channel();
        let g = gpu.clone();
        std::thread::spawn(move || {
            let result = g.bind("init", rank).map(|()| {
                let mut comm: Comm = std::ptr::null_mut();
                // SAFETY: `comm` is an out-parameter; the context is current on this thread.
                let rc = unsafe { (nccl.comm_init_rank)(&mut comm, n, raw, r) };
                (rc, RawComm(comm))
            });
            let _ = tx.send(result);
        });
        let deadline = Instant::now() + timeout;
        let (rc, comm) = loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(r) => break r?,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    interrupted()?
                }
                Err(_) => {
                    return Err(Error::Backend {
                        op: "init",
                        rank,
                        backend: "nccl",
                        reason: format!(
                            "ncclCommInitRank did not complete within {timeout:?}: not every one \
                             of the {size} ranks joined (a rank failed before it, or uses another \
                             id)"
                        ),
                    })
                }
            }
        };
        if rc != SUCCESS {
            return Err(Error::Backend {
                op: "init",
                rank,
                backend: "nccl",
                reason: format!("ncclCommInitRank: {}", nccl.describe(rc)),
            });
        }
        Ok(NcclEngine::over(
            nccl,
            comm,
            (rank, size),
            node_ids,
            timeout,
            gpu,
        ))
    }

    fn over(
        nccl: &'static Nccl,
        comm: RawComm,
        (rank, size): (usize, usize),
        node_ids: Vec<String>,
        timeout: Duration,
        gpu: Arc<Gpu>,
    ) -> NcclEngine {
        NcclEngine {
            nccl,
            rank,
            size,
            node_ids,
            timeout,
            gpu,
            state: Mutex::new(State {
                comm,
                a: Staging::default(),
                b: Staging::default(),
                aborted: None,
            }),
        }
    }

    /// The GPU (CUDA device ordinal) this engine's collectives run on.
    pub fn device(&self) -> usize {
        self.gpu.ctx.ordinal()
    }

    /// In-place all-reduce of a buffer in GPU memory (`DType` must match `T`'s size): the path
    /// for GPU tensors, with no host copies; `Avg` is NCCL's `ncclAvg`. Collective.
    pub fn all_reduce_device<T: cudarc::driver::DeviceRepr>(
        &self,
        buf: &mut cudarc::driver::CudaSlice<T>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        const OP: &str = "all_reduce";
        if dtype.size() != std::mem::size_of::<T>() {
            return Err(Error::InvalidArgument {
                op: OP,
                rank: self.rank,
                arg: "dtype",
                reason: format!(
                    "{dtype:?} has {} bytes per element, the buffer's type {}",
                    dtype.size(),
                    std::mem::size_of::<T>()
                ),
            });
        }
        let mut st = self.lock(OP)?;
        self.gpu.bind(OP, self.rank)?;
        let count = buf.len();
        let (p, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(buf, &self.gpu.stream);
        let p = p as usize as *mut c_void;
        let (dt, rop) = (data_type(dtype), crate::types::device_op(op));
        let comm = st.comm.0;
        // SAFETY: `p` addresses `count` elements of `dtype` on this engine's device, alive until
        // the wait below returns (the guard `_sync` orders it on the stream).
        let rc = unsafe { (self.nccl.all_reduce)(p, p, count, dt, rop, comm, self.stream()) };
        self.check(OP, rc)?;
        self.complete(OP, &mut st, Instant::now() + self.timeout, &|| Ok(()))
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

    /// An error for a failed NCCL call.
    fn check(&self, op: &'static str, rc: Status) -> Result<()> {
        if rc == SUCCESS {
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
        let comm = st.comm.0;
        let async_error = || {
            let mut e: Status = SUCCESS;
            // SAFETY: `comm` is this engine's live communicator.
            let rc = unsafe { (self.nccl.comm_get_async_error)(comm, &mut e) };
            self.check(op, rc)?;
            match e {
                SUCCESS | ffi::IN_PROGRESS => Ok(()),
                e => self.check(op, e),
            }
        };
        let started = Instant::now();
        let outcome = self
            .gpu
            .wait(op, self.rank, deadline, interrupted, &async_error);
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
        // SAFETY: `comm` is live; after the abort it is never used again (`aborted` is set).
        unsafe { (self.nccl.comm_abort)(comm) };
        st.comm = RawComm(std::ptr::null_mut());
        st.aborted = Some(error.to_string());
        Err(error)
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
            // SAFETY: the communicator is live and no call is in flight (we own the engine).
            unsafe { (self.nccl.comm_destroy)(st.comm.0) };
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
